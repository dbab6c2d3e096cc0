"""LD-Agent's "ChatGPT" row (seed 003, Table 1; App. D.3 Prompt 3): the same generator frame as
LD-Agent with no memory and no personas, given only the current session (the last
`short_term_turns` utterances) and the same length cap.

The response frame lives here so that LD-Agent (`stages/methods/ld_agent/`, App. D.3 Prompt 4)
builds on it: an edit to the frame re-runs both methods, an edit to LD-Agent's own prompts re-runs
only LD-Agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from pipeline.llm.types import Messages
from stages.methods.shared import response
from stages.methods.base import Answer, Method, MethodContext, MethodSettings, ProbeInput
from stages.dialogue import format_unit

# App. D.3 (Prompts 3 and 4), in our words. Every instruction is kept: the respondent's role and
# habits, the recent conversation to draw on, continue the dialogue in role, what the user just
# said, the English and word-count limits, and the "RESPONSE:" format.
ROLE = ("You are an expert communicator whose conversational habits are excellent. Throughout the dialogue "
        "below you play the part of {agent}.")
CONTEXT = "<CONTEXT>\nYour recent conversation with {user}, to draw on:\n{context}"
CLOSING = ("Now, in the role of {agent}, carry on the dialogue between {agent} and {user}.\n"
           "{user} has just said: {request}\n"
           "Reply to {user}'s statement in English and in {words} words at most, in this format:\n"
           "RESPONSE: <your reply>")
NO_CONTEXT = "(nothing said yet)"
PROMPTS = {"response_role": ROLE, "response_context": CONTEXT, "response_closing": CLOSING}


class LDAgentBaseSettings(MethodSettings):
    short_term_turns: int = Field(default=30, ge=1)  # utterances of context (the reference code's 30)
    response_words: int = Field(default=30, ge=5)  # App. D.3: "maximum 30 words"


def frame_messages(agent: str, user: str, context: Sequence[dict], request: str, words: int,
                   system_extra: str = "", blocks: Sequence[str] = ()) -> Messages:
    """The generator's messages: the role (plus `system_extra`, LD-Agent's own traits) as system;
    the context block, then `blocks` (LD-Agent's memory and user traits), then the closing request.

    context: the turns shown, oldest first (the request is normally the last of them, as the reference
    code shows it twice). Returns [system, user] messages."""
    system = ROLE.format(agent=agent) + system_extra
    parts = [CONTEXT.format(user=user, context=format_unit(context) or NO_CONTEXT), *blocks,
             CLOSING.format(agent=agent, user=user, request=request, words=words)]
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def partner(probe: ProbeInput) -> str:
    """Who the respondent talks to: the episode's other speaker."""
    respondent = probe.probe["respondent"]
    return next((s for s in probe.episode.get("speakers") or [] if s != respondent), "the other person")


def reply_text(text: str, speakers: Sequence[str]) -> str:
    """The reply without the "RESPONSE:" label the prompt asks for, or a speaker tag."""
    return response.one_turn(text, [*speakers, "RESPONSE", "Response"])


def raw_reply_details(raw: str, reply: str) -> dict[str, str]:
    """{"raw_reply": the generator's text} when `reply_text` changed more than its outer spaces,
    else {}: LD-Agent's reference code scored the reply with its frame, and response_metrics scores
    nlg-eval on it."""
    return {"raw_reply": raw} if raw.strip() != reply else {}


class LDAgentBase(Method[LDAgentBaseSettings]):
    name = "ld_agent_base"
    prompts = PROMPTS

    async def answer(self, ctx: MethodContext[LDAgentBaseSettings], probe: ProbeInput, memory: dict[str, Any]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        context = probe.current[-settings.short_term_turns:]
        result = await llm.chat(frame_messages(probe.probe["respondent"], partner(probe), context, probe.request,
                                               settings.response_words))
        reply = reply_text(result.text, probe.episode.get("speakers") or [])
        return Answer(text=reply, model=result.model,
                      details={"context_turns": len(context), **raw_reply_details(result.text, reply)})
