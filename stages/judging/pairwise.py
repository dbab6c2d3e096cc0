"""Head-to-head judge (ours, after Theanine's G-Eval, App. D; and CREEM App. B.1): which of two
responses is better on one criterion.

The judge sees the earlier sessions (when the stage shows the past), the current session, the
speaker who responds and the two responses as A and B. Two wordings, one per protocol:
- `both_orders`: Theanine's criteria (App. D, Table 1): specificity, memorability, consistency; a
  tie may be answered. Theanine prints its prompts only as images (Figs. 20-22), so the
  definitions are ours from the criteria's names and Sec. 4's reading of them;
- `creem`: CREEM App. B.1: consistency and memorability carrying every element of B.1's
  definitions and instructions (a conversation between two people, two options for the next turn,
  choose the better one on one metric with a brief explanation, read the instructions carefully and
  refer back to them, choose given the past and the current session); no tie.
Under `both_orders` one call may also weigh every criterion at once (`build_all_messages`: ours, a
third of the calls; each criterion keeps its definition and gets its own verdict).
`reason_first` (both_orders): G-Eval's form as Theanine App. D names it ("chain-of-thoughts and a
form-filling paradigm"): the criterion's evaluation steps (`EVALUATION_STEPS`, ours) and an answer
whose reasoning comes before the verdict (schema order: reason, then better). Off: the verdict first
and a one-sentence reason (the earlier judge).
All wording is ours.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from pydantic import BaseModel, Field, create_model

from pipeline.llm.types import ChatLLM, LLMError, Messages
from pipeline.retrieval import count_tokens, within_tokens
from pipeline.engine.stage import Rows
from stages.judging.calls import RunSamples, ask_runs
from stages.dialogue import format_unit

CRITERIA = {
    "specificity": "Specificity: the response is concrete and particular to this conversation and this "
                   "person, rather than generic small talk that would fit any chat.",
    "memorability": "Memorability: the response shows that the speaker remembers what was shared in "
                    "earlier conversations (events, plans, preferences) and uses it where it fits.",
    "consistency": "Consistency: the response agrees with everything known from the earlier "
                   "conversations and the current one; it invents nothing that contradicts them.",
}

# G-Eval's evaluation steps per criterion (`reason_first`), ours: Theanine's G-Eval prompts (Figs. 20-22)
# are images, so the steps are written from the criteria's definitions above.
EVALUATION_STEPS = {
    "specificity": ("1. Read the session under way and note what is particular to these two people and this "
                    "moment: names, events, plans, feelings they have mentioned.\n"
                    "2. For each reply, find the details it takes from that, and ask whether it could be said "
                    "unchanged in any other chat.\n"
                    "3. The reply tied more closely to this conversation and this person is the more specific."),
    "memorability": ("1. Note what the earlier sessions established: events, plans, preferences and news the "
                     "two people shared.\n"
                     "2. For each reply, find what it brings back from those sessions, and check that it is "
                     "recalled correctly and fits the moment.\n"
                     "3. The reply that makes better, correct use of what was shared before is the more "
                     "memorable."),
    "consistency": ("1. Note the facts known about the speaker and the other person from the earlier sessions "
                    "and the session under way.\n"
                    "2. For each reply, look for anything that contradicts those facts or invents something "
                    "at odds with them.\n"
                    "3. The reply with fewer and smaller contradictions is the more consistent."),
}

# Ours, switchable (`judge_pairwise.length_rule`): Theanine's G-Eval prompts state no such rule, and
# Sec. 4 credits RSum-LLM's long answers for its specificity wins, so its configs turn it off.
LENGTH_RULE = "; length alone is not a merit"

SYSTEM = ("You compare two candidate replies in a long-term conversation between the same people. You are "
          "shown their earlier sessions (when there were any) and the session under way. Judge only the "
          f"criterion you are given{LENGTH_RULE}. Answer with the better reply, or tie when "
          "neither is better on this criterion.")

# CREEM App. B.1, every element of each definition, reworded.
CREEM_CRITERIA = {
    "consistency": "Consistency: the reply must stay consistent with the earlier sessions and contradict "
                   "nothing in them. It should fit smoothly with what the two people already talked about "
                   "there, and keep to the person's own character and to where things currently stand for them.",
    "memorability": "Memorability: the reply must bring back past events correctly, holding on to what was "
                    "shared in the earlier sessions. It should make active use of what it remembers from the "
                    "past dialogue to carry the conversation on.",
}

CREEM_SYSTEM = ("You will read a conversation between two people, split into their earlier sessions and the "
                "session under way, and then two candidate replies for the next turn of it. Your job is to "
                "pick the better of the two replies on one criterion only. Go through this brief with care "
                "before you start, and return to it as often as you need during the review.")

ALL_SYSTEM = ("You compare two candidate replies in a long-term conversation between the same people. You are "
              "shown their earlier sessions (when there were any) and the session under way. Judge each "
              f"criterion you are given on its own, as if it were the only one{LENGTH_RULE}. "
              "For each, answer with the better reply, or tie when neither is better on that criterion.")


def system_prompt(system: str, length_rule: bool) -> str:
    """`system` (SYSTEM or ALL_SYSTEM) with the length rule, or without it."""
    return system if length_rule else system.replace(LENGTH_RULE, "")

PROMPTS = {"system": SYSTEM, "all_system": ALL_SYSTEM, **{f"criterion.{k}": v for k, v in CRITERIA.items()},
           **{f"steps.{k}": v for k, v in EVALUATION_STEPS.items()},
           "creem.system": CREEM_SYSTEM, **{f"creem.criterion.{k}": v for k, v in CREEM_CRITERIA.items()}}
PROTOCOLS = ("both_orders", "creem")
NO_PAST = "(none: this is the first session)"


@dataclass(frozen=True)
class PairShown:
    """What the judge is shown of one pair: the dialogue so far, the speaker whose next turn the
    replies are, the earlier sessions as text (`past`: "" when there were none; None leaves them out)
    and the two replies, the reference's as A when `reference_first`, else as B."""

    dialogue: str
    speaker: str
    reference: str
    other: str
    reference_first: bool = True
    past: str | None = None

    @property
    def a(self) -> str:
        return self.reference if self.reference_first else self.other

    @property
    def b(self) -> str:
        return self.other if self.reference_first else self.reference


@dataclass(frozen=True)
class PairProtocol:
    """How the judge is asked: `protocol` (PROTOCOLS), `explain` (a reason beside the verdict),
    `length_rule` (both_orders: length alone is no merit), `reason_first` (both_orders: each
    criterion's evaluation steps, and the reasoning before the verdict)."""

    protocol: str = "both_orders"
    explain: bool = True
    length_rule: bool = True
    reason_first: bool = False

    @property
    def reasoned(self) -> bool:
        """Whether the reasoning comes first: `reason_first`, which CREEM's protocol does not take."""
        return self.reason_first and self.protocol != "creem"


class PairChoice(BaseModel):
    better: Literal["A", "B", "tie"]


class PairVerdict(PairChoice):
    reason: str = Field(default="", max_length=400)


class ReasonedVerdict(BaseModel):
    """G-Eval's order (`reason_first`): the assessment along the steps, then the verdict."""

    reason: str = Field(max_length=2000)
    better: Literal["A", "B", "tie"]


class ForcedChoice(BaseModel):
    """CREEM B.1 asks for the better response: no tie."""

    better: Literal["A", "B"]


class ForcedVerdict(ForcedChoice):
    reason: str = Field(default="", max_length=400)


def answer_schema(protocol: str, explain: bool, reason_first: bool = False) -> type[BaseModel]:
    if protocol == "creem":
        return ForcedVerdict if explain else ForcedChoice
    if reason_first:
        return ReasonedVerdict
    return PairVerdict if explain else PairChoice


def build_messages(criterion: str, shown: PairShown, how: PairProtocol = PairProtocol()) -> Messages:
    """Messages asking which of A and B (`shown`) is better on `criterion` for the speaker's next turn,
    worded as `how` says (its `reason_first` is read as `how.reasoned`).

    Order: `creem` keeps App. B.1's (criterion and instruction, then past and current sessions, then
    the options), whose prefix the pairs of one probe and criterion share; `both_orders` (ours)
    puts the long shared parts (past, current session) first and the criterion last, so every call
    on the same probe shares a prompt prefix."""
    creem = how.protocol == "creem"
    explain, reason_first = how.explain, how.reasoned
    past = "" if shown.past is None else f"Earlier sessions:\n{shown.past or NO_PAST}\n\n"
    definition = (CREEM_CRITERIA if creem else CRITERIA)[criterion]
    options = '"A" | "B"' if creem else '"A" | "B" | "tie"'
    if creem:
        ask = (f"Now pick the reply with the better {criterion}, given both the earlier sessions and the "
               "current session.")
        why = ', "reason": a brief explanation of your choice, one sentence}.'
    else:
        ask = ""
        why = ', "reason": one short sentence}.'
    shared = f"{past}Current session:\n{shown.dialogue}\n\n"
    candidates = f"Two candidate next replies by {shown.speaker}:\n[A] {shown.a}\n[B] {shown.b}\n\n"
    answer = 'Reply in JSON: {"better": ' + options + (why if explain else "}.")
    if creem:
        user = f"Criterion. {definition}\n\n{ask}\n\n{shared}{candidates}{answer}"
    elif reason_first:
        answer = ('Reply in JSON: {"reason": your assessment of both replies along the steps, in a few sentences, '
                  '"better": ' + options + "}, the reason first.")
        user = (f"{shared}{candidates}Criterion. {definition}\n\nEvaluation steps:\n{EVALUATION_STEPS[criterion]}"
                f"\n\n{answer}")
    else:
        user = f"{shared}{candidates}Criterion. {definition}\n\n{answer}"
    return [{"role": "system", "content": CREEM_SYSTEM if creem else system_prompt(SYSTEM, how.length_rule)},
            {"role": "user", "content": user}]


Verdict = Literal["A", "B", "tie"]


def all_verdicts_schema(n: int, explain: bool, reason_first: bool = False) -> type[BaseModel]:
    """Exactly `n` verdicts (A, B or tie), one per criterion in order; a reason with `explain`
    (`reason_first`: the reasoning first, then the verdicts)."""
    fields: dict[str, Any] = {}
    if reason_first:
        fields["reason"] = (str, Field(max_length=2000 * n))
    fields["better"] = (list[Verdict], Field(min_length=n, max_length=n))
    if explain and not reason_first:
        fields["reason"] = (str, Field(default="", max_length=400))
    return create_model("PairVerdicts", **fields)


def build_all_messages(criteria: list[str], shown: PairShown, how: PairProtocol = PairProtocol()) -> Messages:
    """Messages asking which of A and B (`shown`) is better on each of `criteria` (Theanine's, numbered),
    in one call (`both_orders` only: `how.protocol` is not read). The shared parts come first, as in
    `build_messages`; the verdicts come back as a list in the criteria's order (`how.reason_first`:
    each criterion's evaluation steps, the reasoning first)."""
    past = "" if shown.past is None else f"Earlier sessions:\n{shown.past or NO_PAST}\n\n"
    if how.reason_first:
        blocks = "\n".join(f"{i}. {CRITERIA[c]}\nEvaluation steps:\n{EVALUATION_STEPS[c]}"
                           for i, c in enumerate(criteria, 1))
        form = ('Reply in JSON: {"reason": your assessment along each criterion\'s steps, in a few sentences '
                'each, "better": [...]}, the reason first')
    else:
        blocks = "\n".join(f"{i}. {CRITERIA[c]}" for i, c in enumerate(criteria, 1))
        why = ', "reason": one short sentence}' if how.explain else "}"
        form = f'Reply in JSON: {{"better": [...]{why}'
    user = (f"{past}Current session:\n{shown.dialogue}\n\n"
            f"Two candidate next replies by {shown.speaker}:\n[A] {shown.a}\n[B] {shown.b}\n\n"
            f"Criteria:\n{blocks}\n\n"
            f'{form}, {len(criteria)} verdicts ("A", "B" or "tie"), one per '
            f"criterion in the order above ({', '.join(criteria)}).")
    return [{"role": "system", "content": system_prompt(ALL_SYSTEM, how.length_rule)},
            {"role": "user", "content": user}]


def preferred_side(verdict: str, reference_first: bool) -> str:
    """"reference" | "other" | "tie" for a verdict on (A, B) shown in the given order."""
    if verdict == "tie":
        return "tie"
    return "reference" if (verdict == "A") == reference_first else "other"


Judgment = tuple[Any, str | None, str]  # (preferred side or {criterion: side}, reason, judge model)


async def judge_pair_all(llm: ChatLLM, criteria: list[str], shown: PairShown, how: PairProtocol = PairProtocol(),
                         *, samples: int | Sequence[int] | RunSamples = 1, **params: Any) -> list[Judgment | LLMError]:
    """Each sample's judgment of (reference, other) on every criterion at once: ({criterion:
    preferred side}, the judge's reason (None unless `how.explain`), the judge model), or the sample's
    LLMError. `samples`: a count, indexes, or every judge run's indexes (`calls.RunSamples`)."""
    results = await ask_runs(llm, build_all_messages(criteria, shown, how), samples,
                             schema=all_verdicts_schema(len(criteria), how.explain, how.reason_first), **params)
    return [r if isinstance(r, LLMError) else
            ({c: preferred_side(v, shown.reference_first) for c, v in zip(criteria, r.parsed.better)},
             getattr(r.parsed, "reason", None), r.model) for r in results]


async def judge_pair(llm: ChatLLM, criterion: str, shown: PairShown, how: PairProtocol = PairProtocol(),
                     *, samples: int | Sequence[int] | RunSamples = 1, **params: Any) -> list[Judgment | LLMError]:
    """Each sample's judgment of (reference, other) in the order `shown` gives: the preferred side
    ("reference" | "other" | "tie"; never "tie" under `creem`), the judge's reason (None unless
    `how.explain`) and the judge model; or the sample's LLMError. The samples share one prompt, so they
    go as one request with `n` where the endpoint takes it (a RunSamples of judge runs in `requests`
    mode: one request per run)."""
    results = await ask_runs(llm, build_messages(criterion, shown, how), samples,
                             schema=answer_schema(how.protocol, how.explain, how.reasoned), **params)
    return [r if isinstance(r, LLMError) else
            (preferred_side(r.parsed.better, shown.reference_first), getattr(r.parsed, "reason", None), r.model)
            for r in results]


# ------------------------------------------------------------------ what the judge is shown

def transcript(turns: list[dict]) -> str:
    return format_unit(turns) or "(nothing yet)"


@dataclass
class Past:
    """The earlier sessions as the judge sees them."""

    text: str
    shown: int  # sessions shown in full
    summarised: int  # sessions shown as the corpus's summary instead
    truncated: bool  # some earlier session is not shown in full


def past_within(sessions: dict[int, Rows], before: int, budget: int | None,
                summaries: dict[int, str] | None = None) -> Past:
    """The sessions before `before`, oldest first. With a budget (cl100k), the most recent whole
    sessions that fit; the older ones are replaced by their `summaries` (newest first, within what
    is left of the budget) where there are any, else dropped."""
    past = [s for s, turns in sessions.items() if s < before and turns]
    blocks = [f"[Session {s}]\n{transcript(sessions[s])}" for s in past]
    full = within_tokens(blocks, budget)
    older = past[:len(past) - len(full)]
    summarised: list[str] = []
    if older and summaries and budget is not None:
        left = budget - sum(count_tokens(b) for b in full)
        notes = [f"[Session {s}, summary]\n{summaries[s]}" for s in older if summaries.get(s)]
        summarised = within_tokens(notes, left) if left > 0 else []
    return Past("\n\n".join(summarised + full), len(full), len(summarised), bool(older))


def reference_shown_first(seed: int, episode_id: str, probe_id: str, other: str, criterion: str, sample: int) -> bool:
    """CREEM protocol: the reference's position for one sample, drawn from a seeded RNG (the same
    config always shows the same order; different samples of an item are drawn independently)."""
    return random.Random(f"{seed}:{episode_id}:{probe_id}:{other}:{criterion}:{sample}").random() < 0.5


def session_summaries(episode: dict[str, Any]) -> dict[int, str]:
    """The corpus's own summary of each session (LoCoMo's), when the episode carries them."""
    return {n["session_idx"]: n["text"] for n in episode.get("notes") or [] if n["kind"] == "summary" and n["text"]}
