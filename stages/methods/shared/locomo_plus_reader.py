"""LoCoMo-Plus's reader (xjtuleeyf/Locomo-Plus at 059f4e3: evaluation_framework/task_eval/utils.py and
evaluate_qa.py, the prompts data/unified_input.py builds; `qa_prompt: locomo_plus`), in our words with
every element:

- one user message: an opening naming the two people and saying the conversation spans several days
  with each conversation's date at its start; then the task instruction; then the dialogue;
- the instruction by category: a LoCoMo question (its five categories) is to be answered from the
  conversation above; a cognitive item is a memory-aware dialogue: the model continues or reflects on
  an earlier conversation and should show, in a reply that connects to it naturally, that it is aware
  of the relevant memory or context;
- a LoCoMo question: the conversation oldest first, each session under `DATE:` and `CONVERSATION:`
  lines, each utterance `Speaker said, "text"` (a shared photo: `... and shared <caption>.`), then a
  `Question:` line; no answer length, no date hint, no options for adversarial questions;
- a cognitive item: the stitched dialogue as `Speaker said, "text"` lines with no dates, the cue turns
  in their place by time, and the trigger's turns last, as the dialogue's latest lines: no question
  line (the trigger is what the model replies to);
- temperature 0.3 and 1,024 tokens (scripts/evaluate.sh, evaluate_qa.py); the reply kept as written,
  stripped, "(empty)" for an empty completion, never cut to one turn.
Ours: the opening names the conversation's two speakers, where utils.py fills in its default names "A"
and "B"; a method's retrieved units are shown in time order in the same layout.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.llm.types import Messages, Sampling
from stages.dialogue import in_time_order, unit_turns
from stages.methods.shared.mem0_rag import locomo_date

LOCOMO_PLUS_SAMPLING = Sampling(temperature=0.3, max_tokens=1024)
COGNITIVE = "cognitive"  # pipeline.corpus.locomo_plus.CATEGORY
EMPTY_REPLY = "(empty)"  # what utils.call_llm keeps for an empty completion
OPENING = ("What follows is a conversation between two people, {speakers}. It took place over several days, "
           "and the date of each conversation is written at its beginning.")
QA_INSTRUCTION = "Using the conversation above, answer the question that follows it."
COGNITIVE_INSTRUCTION = ("You are in a dialogue where memory matters: you are picking up, or looking back on, an "
                         "earlier conversation. When you reply, make it clear that you remember the memory or "
                         "context from it that bears on the moment, and let your answer tie into that context "
                         "naturally or acknowledge it.")
_CAPTION = re.compile(r"^(.*) \[shares (.*)\]$", re.DOTALL)  # pipeline.corpus.locomo: a photo's caption


def utterance(speaker: str, text: str) -> str:
    """One utterance as the release writes it: `Speaker said, "text"`, a shared photo's caption after it."""
    m = _CAPTION.match(text.strip())
    if m:
        return f'{speaker} said, "{m[1].strip()}" and shared {m[2].strip()}.'
    return f'{speaker} said, "{text.strip()}"'


def _spoken_lines(text: str, speakers: Sequence[str]) -> list[str]:
    """`Speaker: text` lines (a unit's text, a trigger) as utterances; a line naming no speaker is kept."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        who = next((s for s in speakers if s and line.startswith(f"{s}: ")), None)
        out.append(utterance(who, line[len(who) + 2:]) if who else line.strip())
    return out


def _unit_utterances(unit: dict, history: dict[int, list[dict]] | None, speakers: Sequence[str]) -> list[str]:
    turns = unit_turns(unit, history)
    if turns:
        return [utterance(t["speaker"], t["text"]) for t in turns]
    return _spoken_lines(str(unit["text"]), speakers)


def conversation_text(units: Sequence[dict], history: dict[int, list[dict]] | None, speakers: Sequence[str]) -> str:
    """A LoCoMo question's dialogue: oldest first, each session under its DATE and CONVERSATION lines."""
    blocks = []
    for u in in_time_order(units):
        date = locomo_date(u.get("session_time")) or f"unknown (session {u['session_idx']})"
        lines = "\n".join(_unit_utterances(u, history, speakers))
        blocks.append(f"DATE: {date}\nCONVERSATION:\n{lines}")
    return "\n\n".join(blocks)


def build_messages(units: Sequence[dict], question: str, category: object, speakers: Sequence[str],
                   history: dict[int, list[dict]] | None) -> Messages:
    """One user message as LoCoMo-Plus asks: opening, the category's instruction, the dialogue (and, for a
    LoCoMo question, the question)."""
    names = " and ".join(s for s in speakers if s) or "two speakers"
    opening = OPENING.format(speakers=names)
    if str(category) == COGNITIVE:
        lines = [line for u in in_time_order(units) for line in _unit_utterances(u, history, speakers)]
        body = "\n".join([*lines, *_spoken_lines(question, speakers)])
        return [{"role": "user", "content": f"{opening}\n\n{COGNITIVE_INSTRUCTION}\n\n{body}"}]
    context = conversation_text(units, history, speakers) or "(no conversation shown)"
    return [{"role": "user", "content": f"{opening}\n\n{QA_INSTRUCTION}\n\n{context}\n\nQuestion: {question}"}]


def reply_text(completion: str) -> str:
    """The reply as the release keeps it: stripped, "(empty)" when nothing was written."""
    return completion.strip() or EMPTY_REPLY

