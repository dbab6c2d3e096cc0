"""SeCom (Pan et al.) Sec. 2.2: LLM segmentation of a session into topical segments.

Pure algorithms; the chat model is injected (`ChatLLM`), no Ray, no I/O. `segment_session` asks
for the segments of one session with one structured-output call, validates them and falls back
to fixed chunks when the model fails.

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

from pipeline.llm.types import ChatLLM, LLMError, Messages

Span = tuple[int, int]


def number_turns(turns: Sequence[dict]) -> str:
    """Turns with their local numbers, as the segmentation model sees them."""
    return "\n".join(f"[{i}] {t['speaker']}: {t['text']}" for i, t in enumerate(turns))


def fixed_chunks(n_turns: int, size: int) -> list[Span]:
    """Consecutive chunks of `size` turns (the last may be shorter): the fallback segmentation."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1; got {size}")
    return [(s, min(s + size, n_turns) - 1) for s in range(0, n_turns, size)]

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
