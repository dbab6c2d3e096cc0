"""BEAM's reader (Tavakoli et al., ICLR 2026; mohammadtavakoli78/BEAM at commit b2a3ee8:
src/answer_probing_questions/answer_generation.py, long_term_memory_methods.py, answer_generation.sh,
src/prompts.py, src/llm.py; `qa_prompt: beam`): how its long-context and RAG baselines ask a probing
question, in our words with every element:

- the long-context baseline (`probing_question_evaluation`, evaluation_type "long-context"; our
  full_history): the chat history as real chat turns, every message of every batch in order, each a
  `user` or `assistant` message whose content is the message's text alone (no batch header, no time
  anchor beyond what the text itself says, no system message); then one more user message: a note to
  give only the answer with no explanation, then a `Question:` line;
- its cut (`prune_from_tail`): the history's size is 2 + (4 + its tokens) for every message, in
  cl100k_base (`get_encoder`: every model not named gemini counts in cl100k, GPT ones too); a history
  over the window less 10,000 keeps its newest messages: walking back from the last, each message
  counted as 6 + its tokens, up to and including the first that takes the count past the window less
  2,000; an odd number kept loses its oldest, so the history starts on a user turn. Should the count
  never pass that mark, the official keeps no message at all (reproduced: `cut_history`). The window
  is `model_config["max_tokens"]` (answer_generation.sh leaves MAX_TOKENS blank; the script's default
  is 1,000,000: `CONTEXT_WINDOW`); it is never sent as a generation limit;
- the RAG baseline (evaluation_type "rag", RETRIEVAL_METHOD pair_chunk, RETRIEVER dense: README;
  our turn / session methods with `retrieved`): one user message (the prompt string handed to the
  model), no system message: the model is an assistant that must answer from the context below and
  nothing else; strict rules: (1) answer only from that context, (2) leave its own knowledge out; a
  CONTEXT header and the retrieved chunks; a QUESTION header and the question; the answer's
  requirements: direct and brief, the answer alone with no explanation; a closing RESPONSE cue;
- its chunks: a pair_chunk is one user message and the assistant's reply, each as its role in
  capitals, a colon and the text ("USER: ...", "ASSISTANT: ..."), no time anchor; the retrieved chunks
  in the retriever's order (best first), a chunk taken only while the context's characters / 3.5 stay
  under 29,000 (`handling_context`: a chunk that would pass it is skipped, later ones still tried);
  the retriever searches with the bare question;
- sampling: temperature 0 (the reader is `BuildLLm(..., temperature=0)` in answer_generation.py's
  main), no max_tokens sent (langchain's ChatOpenAI default: the endpoint's own limit), no other
  parameter;
- the answer stored as `model.invoke(...).content`, no post-processing (the judge reads it whole).

Ours: each probe is asked on its own. The official long-context loop keeps one message list per chat
and appends every question to it, so from a chat's third question on the earlier questions (from the
second on) stay in the history as unanswered user turns; that depends on the order the questions were
asked and is not reproduced. The official pair_chunk loop adds each pair once per message of its turn
(a two-message turn: twice), so its top-k holds duplicates; ours indexes each exchange once. Chunks in
the context are separated by a blank line, the two messages of a chunk by a blank line (the official
f-string's indentation is left out). A unit whose session is not in the history is read from its
"Speaker: text" lines. A date prefix on the request ("[Current date: ...]") is dropped by the caller:
BEAM's questions carry none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal, TypedDict

from pipeline.llm.types import ChatLLM, LLMResult, Messages
from pipeline.retrieval import count_tokens
from stages.dialogue import unit_turns

QA_PROMPT = "beam"
Frame = Literal["long_context", "rag"]
ROLES = ("user", "assistant")  # BEAM's two speakers, each a chat role in the long-context frame


class BeamSampling(TypedDict):
    """The reader's sampling: a temperature and no generation limit (None: max_tokens is not sent)."""

    temperature: float
    max_tokens: None


# answer_generation.py's main builds the reader with temperature 0 and no max_tokens.
BEAM_SAMPLING = BeamSampling(temperature=0.0, max_tokens=None)
# model_config_default["max_tokens"] (answer_generation.py): the long-context window the cut works to.
CONTEXT_WINDOW = 1_000_000
PRUNE_MARGIN = 10_000   # the history is cut only when it passes the window less this
KEEP_MARGIN = 2_000     # what is kept: newest messages up to the window less this
RAG_CONTEXT_LIMIT = 29_000  # handling_context's reader_max_tokens, estimated as characters / 3.5
CHARS_PER_TOKEN = 3.5

ANSWER_NOTE = "NOTE: Reply with the answer alone, giving no explanation."
RAG_RULES = ("You are an assistant who has to answer the question using nothing but the information in the "
             "context below.\n\n"
             "STRICT RULES:\n"
             "1. Base your answer solely on the context provided.\n"
             "2. Leave your own background knowledge out.")
RAG_REQUIREMENTS = ("WHAT THE ANSWER MUST BE:\n"
                    "- Direct and brief.\n"
                    "- The answer to the question alone, with no explanation.")
RAG_CUE = "RESPONSE:"


def _text_messages(text: str) -> list[tuple[str, str]]:
    """(speaker, text) of a unit's "Speaker: text" lines; a line naming neither speaker continues the
    message before it (a reply runs over several lines); text before any speaker is the user's."""
    out: list[tuple[str, str]] = []
    for line in text.split("\n"):
        who = next((r for r in ROLES if line.startswith(f"{r}: ")), None)
        if who is not None:
            out.append((who, line[len(who) + 2:]))
        elif out:
            out[-1] = (out[-1][0], f"{out[-1][1]}\n{line}")
        elif line.strip():
            out.append((ROLES[0], line))
    return out


def unit_messages(unit: Mapping[str, object], history: dict[int, list[dict]] | None) -> list[tuple[str, str]]:
    """(speaker, text) of each message a unit spans: its turns from the history, else its text's lines."""
    turns = unit_turns(dict(unit), history)
    if turns:
        return [(str(t["speaker"]), str(t["text"])) for t in turns]
    return _text_messages(str(unit["text"]))


def history_messages(units: Sequence[Mapping[str, object]], history: dict[int, list[dict]] | None) -> Messages:
    """The long-context history: every message of the units in the order given, as chat turns.
    ValueError for a speaker that is neither "user" nor "assistant"."""
    messages = []
    for u in units:
        for speaker, text in unit_messages(u, history):
            role = speaker.lower()
            if role not in ROLES:
                raise ValueError(f"BEAM's reader shows a history of user and assistant turns; speaker {speaker!r} "
                                 "is neither")
            messages.append({"role": role, "content": text})
    return messages


def cut_history(messages: Messages, window: int = CONTEXT_WINDOW,
                count: Callable[[str], int] = count_tokens) -> Messages:
    """The history as prune_from_tail leaves it: whole when its size (2 + 4 + tokens per message, cl100k)
    is within the window less 10,000; else the newest messages up to and including the one that takes
    their count (6 + tokens each) past the window less 2,000, less the oldest of them when their number
    is odd; none when the count never gets there (the official's own outcome)."""
    sizes = [count(m["content"]) for m in messages]
    if 2 + sum(4 + s for s in sizes) <= window - PRUNE_MARGIN:
        return list(messages)
    used = 0
    for i in range(len(messages) - 1, -1, -1):
        used += 6 + sizes[i]  # each message counted as a conversation of its own
        if used > window - KEEP_MARGIN:
            kept = list(messages[i:])
            return kept[1:] if len(kept) % 2 else kept
    return []


def question_message(question: str) -> dict[str, str]:
    """The long-context baseline's last user message: the note, then the question."""
    return {"role": "user", "content": f"{ANSWER_NOTE}\nQuestion: {question}"}


def chunk_text(unit: Mapping[str, object], history: dict[int, list[dict]] | None) -> str:
    """A retrieved unit as a pair_chunk shows it: each message as "ROLE: text", a blank line between."""
    return "\n\n".join(f"{speaker.upper()}: {text}" for speaker, text in unit_messages(unit, history))


def rag_context(units: Sequence[Mapping[str, object]], history: dict[int, list[dict]] | None) -> tuple[str, int]:
    """(the RAG context, chunks left out): the chunks in the order given (rank order), each taken while
    the context's characters / 3.5 stay under 29,000, a blank line between them."""
    context, skipped = "", 0
    for u in units:
        chunk = chunk_text(u, history)
        grown = f"{context}\n\n{chunk}" if context else chunk
        if len(grown) // CHARS_PER_TOKEN < RAG_CONTEXT_LIMIT:
            context = grown
        else:
            skipped += 1
    return context, skipped


def _messages(units: Sequence[Mapping[str, object]], question: str, history: dict[int, list[dict]] | None,
              retrieved: bool, window: int) -> tuple[Messages, dict[str, object]]:
    if retrieved:
        context, skipped = rag_context(units, history)
        user = f"{RAG_RULES}\n\nCONTEXT:\n{context}\n\nQUESTION:\n{question}\n\n{RAG_REQUIREMENTS}\n\n{RAG_CUE}"
        return [{"role": "user", "content": user}], {"frame": "rag", "chunks_shown": len(units) - skipped,
                                                     "chunks_skipped": skipped}
    full = history_messages(units, history)
    kept = cut_history(full, window)
    return [*kept, question_message(question)], {"frame": "long_context", "window": window,
                                                 "messages_kept": len(kept), "messages_dropped": len(full) - len(kept)}


def build_messages(units: Sequence[Mapping[str, object]], question: str, history: dict[int, list[dict]] | None,
                   retrieved: bool, window: int = CONTEXT_WINDOW) -> Messages:
    """The request as BEAM's baselines send it. units: dicts with session_idx, turn_start, turn_end and
    text ("Speaker: text" lines); history: the probe's turns by session. retrieved: the RAG baseline's one
    user message over the units in rank order; else the long-context baseline's chat turns of the units
    in time order, cut to `window` (cl100k tokens), then the question as a user message."""
    return _messages(units, question, history, retrieved, window)[0]


async def answer(llm: ChatLLM, units: Sequence[Mapping[str, object]], question: str,
                 history: dict[int, list[dict]] | None, retrieved: bool) -> tuple[LLMResult, dict[str, object]]:
    """Ask a BEAM probing question as the official baseline of the frame asks it: (the reply, details:
    qa_prompt, frame, sampling, and the long-context cut or the RAG chunks shown)."""
    messages, extra = _messages(units, question, history, retrieved, CONTEXT_WINDOW)
    result = await llm.chat(messages, **BEAM_SAMPLING)
    return result, {"qa_prompt": QA_PROMPT, "sampling": dict(BEAM_SAMPLING), **extra}
