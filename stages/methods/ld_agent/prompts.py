"""LD-Agent's prompts (App. D.1-D.3), in our words: the event summariser (D.1), the persona
extractor (D.2) and the generator (D.3 Prompt 4), built on the ChatGPT baseline's Prompt 3 frame
(`stages/methods/baselines/chatgpt.py`). Builders return messages."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.llm.types import Messages
from stages.methods.baselines.chatgpt import PROMPTS as FRAME_PROMPTS
from stages.methods.baselines.chatgpt import frame_messages
from stages.dialogue import format_unit

NO_TRAIT = "NO_TRAIT"
NO_MEMORY = "No relevant memory."

# App. D.1, in our words: the summariser's skill, who talks, the conversation, its main points in
# brief English sentences within the word limit, and the "SUMMARY:" cue.
SUMMARY_SYSTEM = ("Your skill is picking out the events of a conversation and putting them in a few short "
                  "sentences. The conversation you will read is between {first} and {second}.")
SUMMARY_USER = ("Conversation:\n{conversation}\n\nFrom this conversation, write its main points as short "
                "sentences in English, {words} words at most.\nSUMMARY:")

# App. D.2, in our words: the extractor's expertise, NO_TRAIT when nothing can be drawn out, two
# format examples of the same kind as the paper's (one with traits, one without; our own sentences),
# then the sentence, within the word limit. The speaker is not named (D.2 and the reference code's
# Module/Personas.py send the bare sentence).
PERSONA_SYSTEM = ("You are an expert on communication, well known in your community, with a talent for drawing "
                  "people's personal traits out of the things they say.")
PERSONA_USER = ("If the sentence reveals no personal trait, reply {no_trait}. Two examples of the format:\n"
                "1. Not anymore. I left nursing after ten years on the wards, and these days I teach first-aid "
                "classes at the community centre.\n"
                "Extracted Traits: I teach first-aid classes now. I used to work as a nurse.\n"
                "2. Sounds like quite a project. It is good when people deal with repairs around the house before "
                "they turn into bigger trouble later on.\n"
                "{no_trait}\n\n"
                "Now extract the personal traits of the person who said the sentence below, in no more than {words} "
                "words:\n{sentence}")

# App. D.3 Prompt 4 on top of the Prompt 3 frame (baselines/chatgpt.py, method ld_agent_base): the agent's own traits, the memories
# linked to the conversation, the traits noticed in the user.
AGENT_TRAITS = " Personal traits that make you distinct from others:\n{traits}"
MEMORY = "<MEMORY>\nPast events that bear on what the two of you are discussing now:\n{memories}"
USER_TRAITS = ("<USER TRAITS>\nPersonal traits of {user} that have come out over your recent chats with them:\n"
               "{traits}")
NO_TRAITS = "(none noted yet)"
PROMPTS = {**FRAME_PROMPTS, "summary_system": SUMMARY_SYSTEM, "summary_user": SUMMARY_USER,
           "persona_system": PERSONA_SYSTEM, "persona_user": PERSONA_USER, "agent_traits": AGENT_TRAITS,
           "memory": MEMORY, "user_traits": USER_TRAITS}


def summary_messages(turns: list[dict], speakers: Sequence[str], words: int) -> Messages:
    """App. D.1: the cached conversation to sum up as an event. speakers: the episode's, user first."""
    first, second = (list(speakers) + ["one speaker", "the other"])[:2]
    return [{"role": "system", "content": SUMMARY_SYSTEM.format(first=first, second=second)},
            {"role": "user", "content": SUMMARY_USER.format(conversation=format_unit(turns), words=words)}]


def persona_messages(utterance: str, words: int) -> Messages:
    """App. D.2: the traits of whoever said one utterance (not named), or NO_TRAIT."""
    return [{"role": "system", "content": PERSONA_SYSTEM},
            {"role": "user", "content": PERSONA_USER.format(no_trait=NO_TRAIT, words=words, sentence=utterance)}]


def _listed(traits: Sequence[str]) -> str:
    return "\n".join(f"- {t}" for t in traits) or NO_TRAITS


def reply_messages(agent: str, user: str, agent_traits: list[str] | None, user_traits: list[str] | None,
                   memories: list[str] | None, context: list[dict], request: str, words: int) -> Messages:
    """App. D.3 Prompt 4. None for traits or memories: that part is switched off (an ablation) and its
    section left out; an empty list: the part is on but has nothing (memories: "No relevant memory.")."""
    system_extra = "" if agent_traits is None else AGENT_TRAITS.format(traits=_listed(agent_traits))
    blocks = []
    if memories is not None:
        blocks.append(MEMORY.format(memories="\n".join(memories) or NO_MEMORY))
    if user_traits is not None:
        blocks.append(USER_TRAITS.format(user=user, traits=_listed(user_traits)))
    return frame_messages(agent, user, context, request, words, system_extra, blocks)
