"""SeCom (Pan et al.) Sec. 2.2 and App. A.1: LLM segmentation of a session into topical segments.

Pure algorithms; the chat model is injected (`ChatLLM`), no Ray, no I/O.

The model segments *exchanges*, as the paper and its official prompt do: consecutive turns are
grouped so that a new exchange starts at each turn of the session's first speaker (a question and
its answer stay together; a lone trailing turn is an exchange of its own). Exchanges are shown as
"Exchange k" (k from 1) with "[speaker]: text" lines, and the answer is mapped back to turn spans.
With `unit="turn"` every utterance is its own unit ("Turn k"), for utterance-labelled
segmentation benchmarks.

Two answer formats:
- `spans`: the segments as inclusive {start, end} exchange ranges with a short summary each,
  validated (in range, in order, no gap, no overlap); an invalid answer is re-asked, then the
  session falls back to fixed chunks of `fallback_size` exchanges (recorded).
- `counted`: the official answer's shape: exchanges numbered from 0, each segment with its id (from
  0), first and last exchange, the count of its exchanges (end - start + 1; the counts add up to the
  session's) and a summary of at most 100 words that keeps every key detail and states it directly;
  validated as `spans`, counts and ids included.
- `starts`: the exchange numbers where a new segment starts. The JSON schema only allows numbers
  in range, and any list of integers is normalised deterministically (out-of-range dropped, sorted,
  deduplicated, the first exchange implied), so a small model's answer is valid by construction;
  `normalised` records whether normalisation changed it.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from pipeline.llm.types import ChatLLM, LLMError, Messages
from stages.dialogue import Span, build_exchanges

Unit = Literal["exchange", "turn"]
AnswerFormat = Literal["spans", "starts", "counted"]


# ---------------------------------------------------------------- units the model numbers


@dataclass
class Numbered:
    """A session (or a window of it) cut into the units the model numbers."""

    turns: list[dict]
    units: list[Span]  # turn positions of each unit
    label: str  # "Exchange" or "Turn"

    @classmethod
    def of(cls, turns: Sequence[dict], unit: Unit = "exchange") -> Numbered:
        turns = list(turns)
        if unit == "turn":
            return cls(turns, [(i, i) for i in range(len(turns))], "Turn")
        return cls(turns, build_exchanges(turns), "Exchange")

    def __len__(self) -> int:
        return len(self.units)

    def text(self, first: int = 1) -> str:
        """The units as numbered blocks, "Exchange k:" from `first` on, each turn a "[speaker]: text" line."""
        blocks = []
        for k, (s, e) in enumerate(self.units, start=first):
            lines = "\n".join(f"[{t['speaker']}]: {t['text']}" for t in self.turns[s : e + 1])
            blocks.append(f"{self.label} {k}:\n{lines}")
        return "\n\n".join(blocks)

    def window(self, first: int, last: int) -> Numbered:
        """Units first..last (positions) as a numbered session of their own."""
        offset = self.units[first][0]
        units = [(s - offset, e - offset) for s, e in self.units[first : last + 1]]
        return Numbered(self.turns[offset : self.units[last][1] + 1], units, self.label)

    def turn_spans(self, unit_spans: Sequence[Span]) -> list[Span]:
        """Unit spans (positions) -> the turn spans they cover."""
        return [(self.units[a][0], self.units[b][1]) for a, b in unit_spans]

    def unit_boundaries(self, turn_boundaries: Sequence[bool]) -> list[bool]:
        """Per-turn gold boundaries -> per-unit: a unit starts a segment when any of its turns does."""
        out = [any(turn_boundaries[s : e + 1]) for s, e in self.units]
        if out:
            out[0] = True
        return out


def fixed_chunks(n_units: int, size: int) -> list[Span]:
    """Consecutive chunks of `size` units (the last may be shorter): the fallback segmentation."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1; got {size}")
    return [(s, min(s + size, n_units) - 1) for s in range(0, n_units, size)]


# ---------------------------------------------------------------- answer formats


class SegmentSpan(BaseModel):
    start: int = Field(description="number of the first exchange of the segment")
    end: int = Field(description="number of the last exchange of the segment (inclusive)")
    summary: str = Field(description="a one-sentence summary of what the segment is about")


class SpansAnswer(BaseModel):
    """`spans` format: the segments in order, each an inclusive range of exchange numbers."""

    segments: list[SegmentSpan]


# The official summary spec, in our words: short, every key detail kept, told directly.
SUMMARY_SPEC = ("what the segment covers in at most 100 words, keeping every key detail, stated directly "
                "without narrating the conversation's course (no openers such as 'first they talk about' "
                "or 'then the subject moves to')")


class CountedSegment(BaseModel):
    segment_id: int = Field(description="the segment's index: 0 for the first segment, then 1, 2, ...")
    start: int = Field(description="number of the first exchange of the segment")
    end: int = Field(description="number of the last exchange of the segment (inclusive)")
    count: int = Field(description="how many exchanges the segment holds: end - start + 1")
    summary: str = Field(description=SUMMARY_SPEC)


class CountedAnswer(BaseModel):
    """`counted` format: the segments in order, numbered from 0, each with its id and count."""

    segments: list[CountedSegment]


def check_counted(segments: Sequence[CountedSegment], n: int, label: str = "exchange") -> None:
    """Raise ValueError unless 0-based segments tile 0..n-1 with ids 0, 1, ... and true counts."""
    check_spans([(g.start, g.end) for g in segments], n, label, first=0)
    for i, g in enumerate(segments):
        if g.segment_id != i:
            raise ValueError(f"segment {i} has segment_id {g.segment_id}; number the segments 0, 1, 2, ... in order")
        if g.count != g.end - g.start + 1:
            raise ValueError(f"segment {i} ({g.start}-{g.end}) gives count {g.count}, but it holds "
                             f"{g.end - g.start + 1} {label}s")


@lru_cache(maxsize=512)
def starts_answer_model(n_units: int) -> type[BaseModel]:
    """`starts` format for n units: numbers from 1 to n (an enum in the JSON schema, which
    grammar-constrained servers such as llama.cpp enforce; parsing accepts any integers, which
    `normalise_starts` then cleans)."""

    def constrain(schema: dict[str, Any]) -> None:
        prop = schema["properties"]["starts"]
        prop["items"] = {"type": "integer", "enum": list(range(1, n_units + 1))}
        prop["maxItems"] = n_units

    return create_model(
        "SegmentStarts", __config__=ConfigDict(json_schema_extra=constrain),
        starts=(list[int], Field(description="numbers of the exchanges where a new segment starts, ascending")))


def check_spans(spans: Sequence[Span], n: int, label: str = "exchange", first: int = 1) -> None:
    """Raise ValueError (a message the model can act on) unless `spans` tile first..first+n-1
    (1-based by default; segments are named by their position from 1 in the messages)."""
    if not spans:
        raise ValueError("no segments were returned")
    last = first + n - 1
    for i, (start, end) in enumerate(spans, start=1):
        if not (first <= start <= last and first <= end <= last):
            raise ValueError(f"segment {i} ({start}-{end}) is out of range; {label}s are numbered {first} to {last}")
        if end < start:
            raise ValueError(f"segment {i} ({start}-{end}) is empty: its end comes before its start")
    for i in range(1, len(spans)):
        if spans[i][0] < spans[i - 1][0]:
            raise ValueError(f"segment {i + 1} ({spans[i][0]}-{spans[i][1]}) is out of order: "
                             f"list segments by {label} number")
    prev_end = first - 1
    for i, (start, end) in enumerate(spans, start=1):
        if start <= prev_end:
            raise ValueError(f"segment {i} ({start}-{end}) overlaps the previous segment, which ends at {label} {prev_end}")
        if start > prev_end + 1:
            raise ValueError(f"{label}s {prev_end + 1}-{start - 1} are in no segment; every {label} must be in one")
        prev_end = end
    if prev_end != last:
        raise ValueError(f"{label}s {prev_end + 1}-{last} are in no segment; the last segment must end at {label} {last}")


def normalise_starts(starts: Sequence[int], n: int) -> tuple[list[Span], bool]:
    """Any integers -> a valid segmentation of units 1..n as 0-based unit spans, and whether the
    list had to change (out-of-range numbers dropped, sorted, deduplicated, 1 added)."""
    kept = sorted({s for s in starts if 1 <= s <= n} | {1})
    changed = kept != list(starts)
    spans = [(s - 1, e - 2) for s, e in zip(kept, [*kept[1:], n + 1])]
    return spans, changed


# ---------------------------------------------------------------- guidance


@dataclass
class SegmentationGuidance:
    """What reflection learns: a rubric, worked examples, and the learning history.

    examples: dicts {"conversation": numbered session text, "segments": [[start, end], ...] (gold,
    1-based unit numbers), "prediction": [[start, end], ...], "reflection": str}. history: one dict
    per round with at least {"round", "mean_wd"}. JSON-serialisable through to_dict/from_dict.
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


# ---------------------------------------------------------------- prompt

# The task as the official prompts state it (a segment: consecutive units on one topic; a new one
# where the topic shifts), and nothing more: no rule of ours on where greetings or follow-ups go.
SEGMENT_SYSTEM = (
    "You divide conversations into topical segments. A segment is a run of consecutive {units} "
    "about one subject; a new segment begins where the speakers move on to something else."
)


def answer_json(spans: Sequence[Sequence[int]], answer_format: AnswerFormat) -> str:
    """A correct answer in the requested format, from 1-based inclusive spans (for examples)."""
    if answer_format == "starts":
        return json.dumps({"starts": [s for s, _ in spans]})
    if answer_format == "counted":
        return json.dumps({"segments": [{"segment_id": i, "start": s - 1, "end": e - 1, "count": e - s + 1,
                                         "summary": "..."} for i, (s, e) in enumerate(spans)]})
    return json.dumps({"segments": [{"start": s, "end": e, "summary": "..."} for s, e in spans]})


def first_number(answer_format: AnswerFormat) -> int:
    """The number of a session's first unit in the prompt: 0 in the official (`counted`) shape, else 1."""
    return 0 if answer_format == "counted" else 1


_UNIT_NUMBER = re.compile(r"^(Exchange|Turn) (\d+):", re.MULTILINE)


def renumbered(conversation: str, first: int) -> str:
    """A stored example conversation (numbered from 1, as reflection writes it) numbered from `first`."""
    return _UNIT_NUMBER.sub(lambda m: f"{m[1]} {int(m[2]) - 1 + first}:", conversation) if first != 1 else conversation


def _instructions(n: int, label: str, answer_format: AnswerFormat) -> str:
    unit = label.lower()
    if answer_format == "counted":
        return (
            f"Answer with JSON {{\"segments\": [...]}}, one object per segment, in order, with \"segment_id\" (0 "
            f"for the first segment, then 1, 2, ...), \"start\" and \"end\" (the first and last {unit} numbers "
            f"of the segment, inclusive), \"count\" (how many {unit}s the segment holds: end - start + 1) and "
            f"\"summary\" ({SUMMARY_SPEC}). Requirements: every {unit} from 0 to {n - 1} is in a segment, none "
            f"left out: the first segment starts at 0, each next one starts right after the previous one ends, "
            f"the last ends at {n - 1}; no two segments share a {unit}; the counts add up to {n}, the number of "
            f"{unit}s above; use the numbers exactly as they are written above.")
    if answer_format == "starts":
        return (f"Answer with JSON {{\"starts\": [...]}}: the numbers of the {unit}s where a new segment "
                f"begins, in ascending order, each between 1 and {n}. {label} 1 always begins the first "
                "segment. Count carefully: use the numbers exactly as they are written above.")
    return (
        f"Answer with JSON {{\"segments\": [...]}}, one object per segment with \"start\" and \"end\" (the "
        f"first and last {unit} numbers, inclusive) and \"summary\" (one short sentence on its subject). "
        f"Requirements: every {unit} from 1 to {n} belongs to exactly one segment, none is left out; "
        "segments do not overlap and are listed in order; count the numbers carefully, exactly as written "
        "above; keep each summary brief."
    )


def build_segmentation_messages(session: Numbered, guidance: SegmentationGuidance | None = None,
                                answer_format: AnswerFormat = "spans") -> Messages:
    """Messages asking for the segments of a numbered session; with guidance, its rubric and worked
    examples (conversation, correct answer, the segmenter's wrong answer, the reflection) come first."""
    n, label = len(session), session.label
    parts: list[str] = []
    if guidance is not None and guidance.rubric.strip():
        parts.append("Segmentation rubric learned from annotated conversations:\n" + guidance.rubric.strip())
    if guidance is not None and guidance.examples:
        shown = []
        for j, ex in enumerate(guidance.examples, start=1):
            block = (f"Example {j}:\n{renumbered(ex['conversation'], first_number(answer_format))}\n"
                     f"Correct answer: {answer_json(ex['segments'], answer_format)}")
            if ex.get("prediction"):  # App. A.1: the example shows the model's own wrong answer too
                block += f"\nA segmenter's wrong answer: {answer_json(ex['prediction'], answer_format)}"
            if ex.get("reflection"):
                block += f"\nWhy it is easy to get wrong: {ex['reflection']}"
            shown.append(block)
        parts.append("Worked examples:\n\n" + "\n\n".join(shown))
    first = first_number(answer_format)
    parts.append(f"Conversation ({n} {label.lower()}s, numbered {first} to {first + n - 1}):\n\n{session.text(first)}")
    parts.append(_instructions(n, label, answer_format))
    system = SEGMENT_SYSTEM.format(units=f"{label.lower()}s")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


# ---------------------------------------------------------------- segmenting a session


@dataclass
class SegmentationResult:
    """Segments of one session as inclusive (start, end) positions in the given turn list.

    summaries: one per segment (None where the format or a fallback gave none). fallback: True when
    (part of) the session was chunked with `fixed_chunks` because the model gave no valid answer;
    reason/raw then carry the error and the last raw model output. normalised: a `starts` answer
    was changed by normalisation.
    """

    segments: list[Span]
    summaries: list[str | None] = field(default_factory=list)
    fallback: bool = False
    normalised: bool = False
    reason: str | None = None
    raw: str | None = None


def window_bounds(n_units: int, max_units: int) -> list[Span]:
    """Split n_units into the fewest windows of at most max_units, sized as evenly as possible
    (so no tiny trailing window that the model could only segment blindly)."""
    if max_units < 1:
        raise ValueError(f"max units per call must be >= 1; got {max_units}")
    if n_units == 0:
        return []
    n_windows = math.ceil(n_units / max_units)
    base, extra = divmod(n_units, n_windows)
    out, start = [], 0
    for w in range(n_windows):
        size = base + (1 if w < extra else 0)
        out.append((start, start + size - 1))
        start += size
    return out


async def _segment_window(llm: ChatLLM, session: Numbered, guidance: SegmentationGuidance | None,
                          answer_format: AnswerFormat, fallback_size: int, params: dict[str, Any]
                          ) -> SegmentationResult:
    """Unit spans (0-based positions in this window) of one call."""
    n = len(session)
    if n == 1:
        return SegmentationResult([(0, 0)], [None])  # nothing to decide; save the call
    messages = build_segmentation_messages(session, guidance, answer_format)
    try:
        if answer_format == "starts":
            result = await llm.chat(messages, schema=starts_answer_model(n), **params)
            spans, changed = normalise_starts(result.parsed.starts, n)
            return SegmentationResult(spans, [None] * len(spans), normalised=changed)
        label = session.label.lower()
        if answer_format == "counted":
            result = await llm.chat(messages, schema=CountedAnswer, **params,
                                    validate=lambda out: check_counted(out.segments, n, label))
            segs = result.parsed.segments
            return SegmentationResult([(g.start, g.end) for g in segs], [g.summary.strip() or None for g in segs])
        result = await llm.chat(messages, schema=SpansAnswer, **params,
                                validate=lambda out: check_spans([(s.start, s.end) for s in out.segments], n, label))
    except LLMError as e:
        chunks = fixed_chunks(n, fallback_size)
        return SegmentationResult(chunks, [None] * len(chunks), True, reason=e.reason, raw=e.raw)
    segs = result.parsed.segments
    return SegmentationResult([(s.start - 1, s.end - 1) for s in segs], [s.summary.strip() or None for s in segs])


async def segment_session(
    llm: ChatLLM,
    turns: list[dict],
    *,
    unit: Unit = "exchange",
    answer_format: AnswerFormat = "spans",
    guidance: SegmentationGuidance | None = None,
    max_units_per_call: int = 30,
    fallback_size: int = 3,
    params: dict[str, Any] | None = None,
) -> SegmentationResult:
    """Segment one session into topical segments (SeCom Sec. 2.2); spans are turn positions.

    One call per session. A session of more than `max_units_per_call` units is cut into near-equal
    windows, each segmented by its own call; window cuts become segment boundaries. A window whose
    call fails (invalid after the client's re-asks, or a transport failure) is chunked into
    `fallback_size` units and the result says so. `params`: sampling settings for the call
    (temperature, top_p, seed).
    """
    numbered = Numbered.of(turns, unit)
    windows = window_bounds(len(numbered), max_units_per_call)
    results = await asyncio.gather(*(
        _segment_window(llm, numbered.window(s, e), guidance, answer_format, fallback_size, params or {})
        for s, e in windows))
    unit_spans: list[Span] = []
    summaries: list[str | None] = []
    reasons: list[str] = []
    raw: str | None = None
    for (offset, _), (w, res) in zip(windows, enumerate(results)):
        unit_spans += [(offset + a, offset + b) for a, b in res.segments]
        summaries += res.summaries
        if res.fallback:
            reason = res.reason or "unknown error"
            reasons.append(reason if len(windows) == 1 else f"window {w + 1}/{len(windows)}: {reason}")
            raw = res.raw if res.raw is not None else raw
    return SegmentationResult(numbered.turn_spans(unit_spans), summaries, bool(reasons),
                              any(r.normalised for r in results), "; ".join(reasons) or None, raw)
