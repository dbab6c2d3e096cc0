"""SeCom (Pan et al.) Sec. 2.2 and App. A.1: segmentation guidance learned by reflection.

`learn_guidance` segments annotated sessions, picks the hard ones by WindowDiff (the paper: the
100 worst), splits them into mini-batches (the paper: 10) and asks the LLM, batch by batch, to
rewrite a rubric (at most 10 items) and pick the batch's most representative example; the final
prompt holds the rubric and one example per mini-batch with its gold segmentation, the prediction
and the reflection. Pure; the chat model is injected.
"""

from __future__ import annotations

import asyncio
import math
from functools import partial
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from pipeline.llm.types import ChatLLM, LLMError, Messages
from stages.methods.secom.segmentation import Numbered, SegmentationGuidance, Unit, segment_session
from stages.metrics.segmentation import (
    Convention,
    boundaries_to_spans,
    gold_boundaries,
    spans_to_boundaries,
    window_diff,
)

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
    """batch items: {"text": numbered session, "gold": spans, "pred": spans (1-based units), "wd"}."""
    blocks = []
    for j, item in enumerate(batch):
        blocks.append(
            f"Example {j}:\n{item['text']}\n"
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


def unit_spans(numbered: Numbered, turn_spans: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Turn spans made of whole units -> 1-based unit spans, as the model numbers them."""
    first = {s: k for k, (s, _) in enumerate(numbered.units, start=1)}
    last = {e: k for k, (_, e) in enumerate(numbered.units, start=1)}
    return [[first[s], last[e]] for s, e in turn_spans]


def hard_sessions(wds: Sequence[float], hard_k: int) -> list[int]:
    """The indexes of the hard_k sessions with the highest WindowDiff (ties: input order; WD 0 is never hard)."""
    order = sorted((i for i in range(len(wds)) if wds[i] > 0), key=lambda i: (-wds[i], i))
    return order[:hard_k]


def reflection_item(numbered: Numbered, gold: Any, wd: float, predicted: Sequence[tuple[int, int]]) -> dict:
    """One session as a reflection batch shows it: its numbered text, WindowDiff, and its gold and
    predicted segments as 1-based unit spans."""
    gold_units = numbered.unit_boundaries(gold)
    return {"text": numbered.text(), "wd": wd,
            "gold": [[s + 1, e + 1] for s, e in boundaries_to_spans(gold_units)],
            "pred": unit_spans(numbered, predicted)}


async def _reflect(llm: ChatLLM, g: SegmentationGuidance, batches: list[list[dict]], max_rubric_items: int,
                   entry: dict[str, Any]) -> list[dict]:
    """One reflection call per batch, in turn, each rewriting `g.rubric` for the next; the worked
    example each picks. A failed call (LLMError) changes nothing and is counted in `entry`."""
    examples: list[dict] = []
    for batch in batches:
        try:
            res = await llm.chat(
                build_reflection_messages(g.rubric, batch, max_rubric_items),
                schema=ReflectionOutput,
                validate=partial(_check_reflection, batch_len=len(batch), max_items=max_rubric_items),
            )
        except LLMError:
            entry["reflection_failures"] += 1
            continue
        out: ReflectionOutput = res.parsed
        g.rubric = _rubric_text(out.rubric)
        item = batch[out.representative]
        examples.append({"conversation": item["text"], "segments": item["gold"], "prediction": item["pred"],
                         "reflection": out.reflection.strip()})
    return examples


async def learn_guidance(
    llm: ChatLLM,
    annotated: list[list[dict]],
    *,
    rounds: int = 1,
    hard_k: int = 100,
    mini_batches: int = 10,
    max_rubric_items: int = 10,
    initial: SegmentationGuidance | None = None,
    unit: Unit = "exchange",
    segment_options: dict[str, Any] | None = None,
    convention: Convention = "superdialseg",
) -> SegmentationGuidance:
    """Learn segmentation guidance by reflection on annotated sessions (SeCom Sec. 2.2, App. A.1).

    Each round: segment every annotated session with the current guidance (`segment_options` go to
    `segment_session`), score it by WindowDiff against its gold boundaries (`gold_topic_boundary`,
    null = no boundary) in the scoring `convention` (`score.segmentation_convention`: the one the
    results are reported in), take the hard_k sessions with the highest WD (ties: input order; WD 0 is
    never "hard") and split them into `mini_batches` batches. Each batch's call sees the current
    rubric and, per session, the gold vs predicted segments; it returns the full updated rubric
    (<= max_rubric_items), which the next batch builds on, like successive SGD steps, and the most
    representative session, which becomes that batch's worked example (gold + prediction +
    reflection); the guidance keeps one example per mini-batch of the last round. A failed
    reflection call (LLMError) leaves the guidance unchanged and is counted in history. Rounds stop
    early when no session has any error.
    """
    g = SegmentationGuidance.from_dict(initial.to_dict()) if initial else SegmentationGuidance()
    options = {**(segment_options or {}), "unit": unit}
    sessions = [s for s in annotated if s]
    numbered = [Numbered.of(s, unit) for s in sessions]
    golds = [gold_boundaries([t.get("gold_topic_boundary") for t in s]) for s in sessions]
    start_round = len(g.history)
    for r in range(start_round + 1, start_round + rounds + 1):
        preds = await asyncio.gather(*(segment_session(llm, s, guidance=g, **options) for s in sessions))
        # Hard examples by WindowDiff as the results are scored (Table 4: SuperDialseg's convention).
        wds = [window_diff(gold, spans_to_boundaries(p.segments, len(gold)), convention=convention)
               for gold, p in zip(golds, preds)]
        hard = hard_sessions(wds, hard_k)
        entry: dict[str, Any] = {"round": r, "mean_wd": sum(wds) / len(wds) if wds else 0.0,
                                 "n_hard": len(hard), "hard_wd": [wds[i] for i in hard],
                                 "fallbacks": sum(p.fallback for p in preds), "reflection_failures": 0}
        g.history.append(entry)
        if not hard:
            break
        size = math.ceil(len(hard) / max(1, mini_batches))
        batches = [[reflection_item(numbered[i], golds[i], wds[i], preds[i].segments) for i in hard[b : b + size]]
                   for b in range(0, len(hard), size)]
        examples = await _reflect(llm, g, batches, max_rubric_items, entry)
        g.examples = examples or g.examples
    return g
