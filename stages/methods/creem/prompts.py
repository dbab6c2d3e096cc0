"""CREEM's prompts (App. A.1-A.3), in our own words: the query (A.1), the first session's blend
(A.2) and blend-and-refine (A.3), and the checks their answers pass (re-asked when they fail).
Builders return messages. The response frame (A.4) is `stages/methods/shared/memory_response.py`'s,
shared with CREEM's stand-in baselines."""

from __future__ import annotations

from typing import Any

from pipeline.llm.types import Messages

# App. A.1-A.4 give each prompt's instructions (their shots are not printed); ours carry every one
# of them in our own words, zero-shot, with the JSON answer format appended.


def _json_reply(shape: str) -> str:
    return f"\n\nAnswer in JSON only, shaped like {shape}."


def question_messages(speaker: str, dialogue: str) -> Messages:
    """A.1, the query: the dialogue so far -> one question about `speaker` (`Question`)."""
    system = ("You write search queries for a conversational memory: each query is a question that fits the "
              "conversation you are shown.")
    user = (f"Conversation:\n{dialogue}\n\nThink of the one high-level question about {speaker} that matters most "
            f"here and that this conversation lets us answer. Look above all at the final line of the conversation."
            + _json_reply('{"question": "<the question about ' + speaker + '>"}'))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _statements(memories: list[dict], utterances: list[dict]) -> str:
    past = "\n".join(f"[M{i + 1}] {m['text']}" for i, m in enumerate(memories)) or "(none)"
    now = "\n".join(f"- {u['speaker']}: {u['text']}" for u in utterances) or "(none)"
    return f"Remembered statements:\n{past}\n\nStatements from the ongoing conversation:\n{now}"


def blend_messages(speaker: str, memories: list[dict], utterances: list[dict], n: int, refine: bool) -> Messages:
    """A.3, blend (and refine): the retrieved memories (numbered M1..) and utterances -> n insights
    about `speaker` (`blend_refine_schema(len(memories))` when refining, else `Blended`)."""
    system = (f"You expand a memory about a person. Step one: from a set of statements, infer higher-level "
              f"insights about {speaker}, going beyond what any single statement says.")
    if refine:
        system += (" Step two: use each insight to refine the statements. Decide whether the insight is New "
                   "(information not in the statements at all), Redundant (the statements already say it) or "
                   "Updated (it shows that something the statements say has since changed). For a Redundant or "
                   "Updated insight, list the remembered statements [M#] it makes redundant or out of date: they "
                   "will be deleted. A New insight deletes nothing. Statements from the ongoing conversation are "
                   f"never deleted. Go through both steps {n} times, so that you end with {n} insights that each "
                   "say something worthwhile.")
        shape = ('{"insights": [{"text": "<insight>", "label": "New" | "Redundant" | "Updated", '
                 '"removes": [<M numbers>]}, ...]}')
    else:
        system += (f" Go through this step {n} times, so that you end with {n} insights that each say something "
                   "worthwhile.")
        shape = '{"insights": [{"text": "<insight>"}, ...]}'
    user = (f"{_statements(memories, utterances)}\n\nInsights about {speaker}: give exactly {n}."
            + _json_reply(shape))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def first_session_messages(speaker: str, statements: str, n: int) -> Messages:
    """A.2, the first session's blend: its utterances -> n insights about `speaker` (`Blended`)."""
    system = "You expand a memory about a person: from a set of statements you infer higher-level insights."
    user = (f"Statements:\n{statements}\n\nInsights about {speaker}: give exactly {n} high-level insights about "
            f"{speaker}." + _json_reply('{"insights": [{"text": "<insight>"}, ...]}'))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def check_count(out: Any, n: int) -> None:
    """ValueError unless the blend gave exactly the `n` insights asked for (re-asked, then logged)."""
    if len(out.insights) != n:
        raise ValueError(f"give exactly {n} insights; got {len(out.insights)}")


def check_refined(out: Any, n: int, retrieved: int) -> None:
    """ValueError unless there are exactly `n` insights and removals name only M1..M`retrieved`."""
    check_count(out, n)
    for i, ins in enumerate(out.insights):
        bad = [r for r in getattr(ins, "removes", []) if not 1 <= r <= retrieved]
        if bad:
            raise ValueError(f"insight {i + 1} removes {bad}, but only past memories M1..M{retrieved} were shown")
