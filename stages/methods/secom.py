"""SeCom (Pan et al.): segment-level memory built by LLM conversation segmentation.

Pure algorithms; the chat model is injected (`ChatLLM`), no Ray, no I/O. Stages adapt them.

- `segment_session`: zero-shot (or guided) segmentation of one session into topical segments with
  one structured-output call, validated, falling back to fixed chunks when the model fails.
- `learn_guidance`: the reflection loop that learns a segmentation rubric plus few-shot examples
  from sessions with gold topic boundaries (hard examples picked by WindowDiff, mini-batches).
- `build_response_messages` / `respond`, `build_qa_messages` / `answer_question`: generation from
  retrieved memory units (turn, segment or session granularity alike), placed in time order.

Turn numbering: a session is the list of TURNS rows passed in; its turns are shown to the model as
"[i] Speaker: text" with i = 0..n-1 (position in the list / window), and segments are returned as
inclusive {start, end} pairs of those numbers.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from pipeline.llm.types import ChatLLM, LLMError, LLMResult, Messages
from stages.metrics.segmentation import boundaries_to_spans, gold_boundaries, spans_to_boundaries, window_diff

Span = tuple[int, int]


# ---------------------------------------------------------------- unit text


def format_unit(turns: Sequence[dict]) -> str:
    """The text of a memory unit (a turn, a segment or a session): "Speaker: text" lines."""
    return "\n".join(f"{t['speaker']}: {t['text']}" for t in turns)


def number_turns(turns: Sequence[dict]) -> str:
    """Turns with their local numbers, as the segmentation model sees them."""
    return "\n".join(f"[{i}] {t['speaker']}: {t['text']}" for i, t in enumerate(turns))


def fixed_chunks(n_turns: int, size: int) -> list[Span]:
    """Consecutive chunks of `size` turns (the last may be shorter): the fallback segmentation."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1; got {size}")
    return [(s, min(s + size, n_turns) - 1) for s in range(0, n_turns, size)]


def make_units(turns: Sequence[dict], spans: Sequence[Span]) -> list[dict]:
    """Memory units of one session from inclusive spans of positions in `turns`.

    Turn-level units are spans (i, i), session-level one span over all turns, segment-level the
    spans from `segment_session`. Each unit: episode_id, session_idx, session_time, turn_start /
    turn_end (turn_idx of its first / last turn), text (`format_unit`) and source_turn_ids (for
    retrieval metrics; null ids are skipped).
    """
    units = []
    for start, end in spans:
        part = turns[start : end + 1]
        first = part[0]
        units.append({
            "episode_id": first.get("episode_id"),
            "session_idx": first.get("session_idx"),
            "session_time": first.get("session_time"),
            "turn_start": first.get("turn_idx", start),
            "turn_end": part[-1].get("turn_idx", end),
            "text": format_unit(part),
            "source_turn_ids": [t["source_turn_id"] for t in part if t.get("source_turn_id") is not None],
        })
    return units


# ---------------------------------------------------------------- structured output


class Segment(BaseModel):
    start: int = Field(description="number of the first turn of the segment")
    end: int = Field(description="number of the last turn of the segment (inclusive)")


class SegmentationOutput(BaseModel):
    """Answer schema: the segments in order, each an inclusive range of turn numbers."""

    segments: list[Segment]


def check_spans(spans: Sequence[Span], n_turns: int) -> None:
    """Raise ValueError (with a message the model can act on) unless `spans` tile 0..n_turns-1."""
    if not spans:
        raise ValueError("no segments were returned")
    last = n_turns - 1
    for i, (start, end) in enumerate(spans):
        if not (0 <= start <= last and 0 <= end <= last):
            raise ValueError(f"segment {i} ({start}-{end}) is out of range; turn numbers go from 0 to {last}")
        if end < start:
            raise ValueError(f"segment {i} ({start}-{end}) is empty: its end comes before its start")
    for i in range(1, len(spans)):
        if spans[i][0] < spans[i - 1][0]:
            raise ValueError(f"segment {i} ({spans[i][0]}-{spans[i][1]}) is out of order: list segments by turn number")
    prev_end = -1
    for i, (start, end) in enumerate(spans):
        if start <= prev_end:
            raise ValueError(f"segment {i} ({start}-{end}) overlaps the previous segment, which ends at turn {prev_end}")
        if start > prev_end + 1:
            raise ValueError(f"turns {prev_end + 1}-{start - 1} are not in any segment; every turn must be covered")
        prev_end = end
    if prev_end != last:
        raise ValueError(f"turns {prev_end + 1}-{last} are not in any segment; the last segment must end at turn {last}")


def _spans(out: SegmentationOutput) -> list[Span]:
    return [(s.start, s.end) for s in out.segments]


# ---------------------------------------------------------------- guidance


@dataclass
class SegmentationGuidance:
    """What reflection learns: a rubric, a few worked examples, and the learning history.

    examples: dicts {"conversation": numbered turns text, "segments": [[start, end], ...] (gold),
    "prediction": [[start, end], ...], "reflection": str}. history: one dict per round with at least
    {"round", "mean_wd"}. JSON-serialisable through to_dict/from_dict.
    """

    rubric: str = ""
    examples: list[dict] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"rubric": self.rubric, "examples": [dict(e) for e in self.examples],
                "history": [dict(h) for h in self.history]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SegmentationGuidance:
        return cls(rubric=str(d.get("rubric", "")), examples=[dict(e) for e in d.get("examples", [])],
                   history=[dict(h) for h in d.get("history", [])])


# ---------------------------------------------------------------- segmentation prompt

SEGMENT_SYSTEM = (
    "You split conversations into topical segments. A segment is a run of consecutive turns about "
    "one topic; a new segment begins where the speakers move on to a different subject. Keep "
    "greetings, short acknowledgements and follow-up questions with the topic they belong to."
)


def _segment_json(spans: Sequence[Sequence[int]]) -> str:
    return '{"segments": [' + ", ".join(f'{{"start": {s}, "end": {e}}}' for s, e in spans) + "]}"


def build_segmentation_messages(turns: Sequence[dict], guidance: SegmentationGuidance | None = None) -> Messages:
    """Messages asking for the segments of `turns` (numbered locally from 0)."""
    n = len(turns)
    parts: list[str] = []
    if guidance is not None and guidance.rubric.strip():
        parts.append("Segmentation rubric learned from annotated conversations:\n" + guidance.rubric.strip())
    if guidance is not None and guidance.examples:
        shown = []
        for j, ex in enumerate(guidance.examples, start=1):
            block = f"Example {j}:\n{ex['conversation']}\nCorrect answer: {_segment_json(ex['segments'])}"
            if ex.get("reflection"):
                block += f"\nNote: {ex['reflection']}"
            shown.append(block)
        parts.append("Worked examples:\n\n" + "\n\n".join(shown))
    parts.append(f"Conversation ({n} turns, numbered 0 to {n - 1}):\n{number_turns(turns)}")
    parts.append(
        "Return JSON with the key \"segments\": a list of {\"start\", \"end\"} objects (inclusive turn "
        f"numbers). List the segments in order; together they must cover every turn from 0 to {n - 1} "
        "exactly once, with no gaps and no overlaps."
    )
    return [{"role": "system", "content": SEGMENT_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


@dataclass
class SegmentationResult:
    """Segments of one session as inclusive (start, end) positions in the given turn list.

    fallback: True when (part of) the session was chunked with `fixed_chunks` because the model gave
    no valid answer; reason/raw then carry the LLMError reason and the last raw model output.
    """

    segments: list[Span]
    fallback: bool = False
    reason: str | None = None
    raw: str | None = None


def window_bounds(n_turns: int, max_turns: int) -> list[Span]:
    """Split n_turns into the fewest windows of at most max_turns, sized as evenly as possible
    (so no tiny trailing window that the model could only segment blindly)."""
    if max_turns < 1:
        raise ValueError(f"max_turns_per_call must be >= 1; got {max_turns}")
    if n_turns == 0:
        return []
    n_windows = math.ceil(n_turns / max_turns)
    base, extra = divmod(n_turns, n_windows)
    out, start = [], 0
    for w in range(n_windows):
        size = base + (1 if w < extra else 0)
        out.append((start, start + size - 1))
        start += size
    return out


async def _segment_window(
    llm: ChatLLM, turns: Sequence[dict], guidance: SegmentationGuidance | None, fallback_size: int
) -> SegmentationResult:
    n = len(turns)
    if n == 1:
        return SegmentationResult([(0, 0)])  # nothing to decide; save the call
    try:
        result = await llm.chat(
            build_segmentation_messages(turns, guidance),
            schema=SegmentationOutput,
            validate=lambda out: check_spans(_spans(out), n),
        )
    except LLMError as e:
        return SegmentationResult(fixed_chunks(n, fallback_size), True, e.reason, e.raw)
    return SegmentationResult(_spans(result.parsed))


async def segment_session(
    llm: ChatLLM,
    turns: list[dict],
    *,
    guidance: SegmentationGuidance | None = None,
    max_turns_per_call: int = 60,
    fallback_size: int = 4,
) -> SegmentationResult:
    """Segment one session into topical segments (SeCom Sec. 2.2).

    One call per session. A session longer than `max_turns_per_call` is cut into near-equal windows
    (`window_bounds`), each segmented by its own call; the window cuts become segment boundaries and
    the segments are concatenated with their offsets. A window whose call raises LLMError (invalid
    after the client's re-asks, or transport failure) is chunked by `fallback_size` turns; the
    result then has fallback=True and the reasons of the failed windows.
    """
    windows = window_bounds(len(turns), max_turns_per_call)
    results = await asyncio.gather(
        *(_segment_window(llm, turns[s : e + 1], guidance, fallback_size) for s, e in windows)
    )
    segments: list[Span] = []
    reasons: list[str] = []
    raw: str | None = None
    for (offset, _), (w, res) in zip(windows, enumerate(results)):
        segments += [(offset + s, offset + e) for s, e in res.segments]
        if res.fallback:
            reason = res.reason or "unknown error"
            reasons.append(reason if len(windows) == 1 else f"window {w + 1}/{len(windows)}: {reason}")
            raw = res.raw if res.raw is not None else raw
    return SegmentationResult(segments, bool(reasons), "; ".join(reasons) or None, raw)


# ---------------------------------------------------------------- reflection


class ReflectionOutput(BaseModel):
    rubric: list[str] = Field(description="the full updated rubric, one criterion per item")
    representative: int = Field(description="number of the example that best shows the mistakes")
    reflection: str = Field(description="what went wrong on that example and how to avoid it")


REFLECT_SYSTEM = (
    "You improve the instructions of a conversation segmenter. You are shown conversations where "
    "its segmentation disagreed with human annotators, next to the human segmentation. Work out "
    "which systematic habits caused the disagreements and turn them into short, general criteria."
)


def _format_spans(spans: Sequence[Sequence[int]]) -> str:
    return ", ".join(f"{s}-{e}" for s, e in spans)


def build_reflection_messages(
    rubric: str, batch: Sequence[dict], max_rubric_items: int
) -> Messages:
    """batch items: {"turns", "gold": spans, "pred": spans, "wd"}."""
    blocks = []
    for j, item in enumerate(batch):
        blocks.append(
            f"Example {j}:\n{number_turns(item['turns'])}\n"
            f"Human segmentation: {_format_spans(item['gold'])}\n"
            f"Segmenter's output: {_format_spans(item['pred'])}\n"
            f"WindowDiff error: {item['wd']:.3f}"
        )
    current = rubric.strip() or "(no rubric yet)"
    user = (
        f"Current rubric:\n{current}\n\n" + "\n\n".join(blocks) + "\n\n"
        f"Write the updated rubric as a list of at most {max_rubric_items} criteria: keep what still "
        "holds, fix or drop what led to the errors above, add what was missing. Criteria must be general "
        "(no references to these particular conversations). Also give the number of the example that best "
        f"illustrates the errors (0 to {len(batch) - 1}) and a one or two sentence reflection on it. "
        'Answer as JSON with keys "rubric", "representative" and "reflection".'
    )
    return [{"role": "system", "content": REFLECT_SYSTEM}, {"role": "user", "content": user}]


def _check_reflection(out: ReflectionOutput, batch_len: int, max_items: int) -> None:
    items = [r for r in out.rubric if r.strip()]
    if not items:
        raise ValueError("the rubric is empty; give at least one criterion")
    if len(items) > max_items:
        raise ValueError(f"the rubric has {len(items)} criteria; give at most {max_items}")
    if not 0 <= out.representative < batch_len:
        raise ValueError(f"representative must be an example number from 0 to {batch_len - 1}")


def _rubric_text(items: Sequence[str]) -> str:
    return "\n".join(f"{i}. {r.strip()}" for i, r in enumerate((r for r in items if r.strip()), start=1))


async def learn_guidance(
    llm: ChatLLM,
    annotated: list[list[dict]],
    *,
    rounds: int = 2,
    batch_size: int = 4,
    hard_k: int = 8,
    initial: SegmentationGuidance | None = None,
    max_rubric_items: int = 10,
    max_examples: int = 3,
    max_turns_per_call: int = 60,
) -> SegmentationGuidance:
    """Learn segmentation guidance by reflection on annotated sessions (SeCom Sec. 2.2, App. A.1).

    Each round: segment every annotated session with the current guidance, score it by WindowDiff
    against its gold boundaries (`gold_topic_boundary`, null = no boundary), take the hard_k
    sessions with the highest WD (ties: input order; WD 0 is never "hard"), and reflect on them in
    mini-batches of batch_size. Each mini-batch call sees the current rubric and, per session, the
    gold vs predicted segments; it returns the full updated rubric (<= max_rubric_items), which the
    next mini-batch builds on, like successive SGD steps, plus the most representative session, which
    becomes a few-shot example (gold segments + prediction + reflection; the latest max_examples are
    kept, one per session). A failed reflection call (LLMError) leaves the guidance unchanged and is
    counted in history. Rounds stop early when no session has any error.
    """
    g = SegmentationGuidance.from_dict(initial.to_dict()) if initial else SegmentationGuidance()
    sessions = [s for s in annotated if s]
    golds = [gold_boundaries([t.get("gold_topic_boundary") for t in s]) for s in sessions]
    start_round = len(g.history)
    for r in range(start_round + 1, start_round + rounds + 1):
        preds = await asyncio.gather(
            *(segment_session(llm, s, guidance=g, max_turns_per_call=max_turns_per_call) for s in sessions)
        )
        wds = [window_diff(gold, spans_to_boundaries(p.segments, len(gold))) for gold, p in zip(golds, preds)]
        order = sorted((i for i in range(len(sessions)) if wds[i] > 0), key=lambda i: (-wds[i], i))
        hard = order[:hard_k]
        entry: dict[str, Any] = {"round": r, "mean_wd": sum(wds) / len(wds) if wds else 0.0,
                                 "n_hard": len(hard), "hard_wd": [wds[i] for i in hard],
                                 "fallbacks": sum(p.fallback for p in preds), "reflection_failures": 0}
        g.history.append(entry)
        if not hard:
            break
        for b in range(0, len(hard), batch_size):
            idx = hard[b : b + batch_size]
            batch = [{"turns": sessions[i], "gold": boundaries_to_spans(golds[i]), "pred": preds[i].segments,
                      "wd": wds[i]} for i in idx]
            try:
                res = await llm.chat(
                    build_reflection_messages(g.rubric, batch, max_rubric_items),
                    schema=ReflectionOutput,
                    validate=lambda out, n=len(batch): _check_reflection(out, n, max_rubric_items),
                )
            except LLMError:
                entry["reflection_failures"] += 1
                continue
            out: ReflectionOutput = res.parsed
            g.rubric = _rubric_text(out.rubric)
            pick = idx[out.representative]
            example = {"conversation": number_turns(sessions[pick]),
                       "segments": [list(s) for s in boundaries_to_spans(golds[pick])],
                       "prediction": [list(s) for s in preds[pick].segments],
                       "reflection": out.reflection.strip()}
            # One example per session (same text = same session), newest last.
            g.examples = [e for e in g.examples if e["conversation"] != example["conversation"]] + [example]
            g.examples = g.examples[-max_examples:] if max_examples > 0 else []
    return g


# ---------------------------------------------------------------- response generation


def _time_ordered(units: Sequence[dict]) -> list[dict]:
    # Sec. 2.1: retrieved units go into the context in time order, not in rank order.
    return sorted(units, key=lambda u: (int(u["session_idx"]), int(u.get("turn_start", u.get("turn_idx", 0)) or 0)))


def format_memory(units: Sequence[dict]) -> str:
    """Retrieved units in time order, each under a header naming its session (and date if known)."""
    blocks = []
    for u in _time_ordered(units):
        when = u.get("session_time")
        header = f"[Session {u['session_idx']}" + (f", {when}" if when not in (None, "") else "") + "]"
        blocks.append(f"{header}\n{u['text']}")
    return "\n\n".join(blocks)


def build_response_messages(
    retrieved_units: list[dict], current_turns: list[dict], request: str, respondent: str
) -> Messages:
    """Messages for the respondent's next utterance, given retrieved memory and the live session.

    retrieved_units: dicts with session_idx, text, optional session_time and turn_start.
    current_turns: the current session so far. request: the latest message, to be answered; if it is
    also the text of the last current turn it is shown once.
    """
    turns = list(current_turns)
    if turns and turns[-1].get("text") == request:
        turns = turns[:-1]
    memory = format_memory(retrieved_units) or "(no memories retrieved)"
    system = (
        f"You are {respondent}, talking with someone you have had earlier conversations with. Relevant "
        "excerpts of those earlier conversations are provided as memory. Use them when they help you "
        "reply consistently and personally; ignore them when they do not apply."
    )
    user = (
        f"Memory from earlier sessions (oldest first):\n{memory}\n\n"
        f"Current session so far:\n{format_unit(turns) if turns else '(just started)'}\n\n"
        f"Latest message:\n{request}\n\n"
        f"Write {respondent}'s next utterance only: a short, natural reply, without a speaker label."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


async def respond(
    llm: ChatLLM, retrieved_units: list[dict], current_turns: list[dict], request: str, respondent: str,
    **params: Any,
) -> LLMResult:
    """SeCom's retrieval-augmented response (the same for turn, segment and session memory)."""
    return await llm.chat(build_response_messages(retrieved_units, current_turns, request, respondent), **params)


def build_qa_messages(retrieved_units: list[dict], question: str) -> Messages:
    """Messages for a QA probe answered from retrieved memory units (in time order)."""
    memory = format_memory(retrieved_units) or "(no memories retrieved)"
    system = (
        "You answer questions about past conversations using only the excerpts provided. Answer "
        "concisely, with a short phrase where possible. Use the session dates to resolve relative "
        "times. If the excerpts do not contain the answer, say that it is not mentioned."
    )
    user = f"Conversation excerpts (oldest first):\n{memory}\n\nQuestion: {question}\nAnswer:"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


async def answer_question(llm: ChatLLM, retrieved_units: list[dict], question: str, **params: Any) -> LLMResult:
    return await llm.chat(build_qa_messages(retrieved_units, question), **params)
