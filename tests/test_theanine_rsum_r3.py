"""Theanine and RSum after the round-3 review (shared/audits/round3/theanine_rsum.md; issue 59): RSum's four
methods answer in one frame, RSum's, with no length limit (F1, F9); a failed RSum update keeps the memory
before it (F4); Theanine's judge reasons before its verdict along per-criterion evaluation steps, and is
labelled as ours after Theanine's G-Eval (F2, I5); RSum's config runs no head-to-head (F5); the sheets
list the settings that shape the numbers (F3, #5), the paper's title (F6), Sec. 4's response lengths (F7),
the timeline draw order (F8), MemoChat's own loop (TeaFarm review F5) and why the episode ids are null
(N6); truncated outputs are recorded (F3); p-values carry a multiplicity note (o4)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest


import stages
from pipeline.llm.accounting import Accounting
from pipeline.llm.cache import Reply
from pipeline.llm.answers import read_chat
from pipeline.llm.types import LLMError, LLMResult
from pipeline.llm.usage import Usage
from pipeline.reproduction import deviations
from pipeline.engine.stage import StageContext
from pipeline.testing.fake_chat import FakeChat
from stages.judging import pairwise
from stages.judging.judge_pairwise import JudgePairwiseSettings, JudgePairwiseStage
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput, visible_memory
from stages.methods.baselines.gold_memory import GoldMemory, GoldMemorySettings
from stages.methods.baselines.history import AllContext, AllContextSettings, PartContext, PartContextSettings
from stages.methods.rsum import RSum, RSumSettings
from stages.methods.shared import memory_response
from stages.methods.shared.response import SHORT_REPLY
from stages.methods.theanine import Theanine, TheanineSettings
from stages.report import pairwise as pairwise_report
from stages.report.memory_accuracy import memory_at
from stages.report.scorers import scorer

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
THEANINE_JUDGED = ["theanine_msc", "theanine_cc", "theanine_msc_cc"]
THEANINE_SIDE = [*THEANINE_JUDGED, "teafarm_msc_cc"]


def config(name: str, *sets: str):
    return stages.load_config(CONFIGS / f"{name}.yaml", list(sets))


def turn(session: int, i: int, text: str) -> dict:
    return {"speaker": ("Ann", "Bob")[i % 2], "text": text, "turn_idx": i, "session_idx": session,
            "source_turn_id": f"D{session}:{i}"}


PAST = {1: [turn(1, 0, "I adopted a puppy called Rex."), turn(1, 1, "I play the cello on weekends.")]}
CURRENT = [turn(2, 0, "Rex chewed my shoes today!")]


def probe() -> ProbeInput:
    episode = {"episode_id": "e1", "speakers": ["Ann", "Bob"],
               "notes": [{"kind": "persona", "session_idx": 1, "speaker": "Ann", "text": "I have a puppy."}]}
    return ProbeInput(probe={"probe_id": "p", "kind": "next_response", "session_idx": 2, "turn_idx": 1,
                             "respondent": "Bob", "request": CURRENT[0]["text"]},
                      episode=episode, history=PAST, current=CURRENT)


# ------------------------------------------------------------------------- F1 / F9: RSum's one frame

def test_rsums_frame_carries_its_released_prompts_elements_and_no_length():
    system, user = (m["content"] for m in memory_response.rsum_messages("Ann has a puppy.", None, CURRENT,
                                                                          CURRENT[0]["text"], "Bob", False))
    assert "personalities" in system  # personality-based conversations
    for element in ("conversational", "fluent", "consistent with what the memory", "conversation keeps going",
                    "no emoticons"):
        assert element in user, element
    text = (system + user).lower()
    assert SHORT_REPLY not in text and "short" not in text and "words" not in text  # no length limit
    assert "Ann has a puppy." in user and "Earlier sessions" not in user


def test_the_four_rsum_methods_answer_in_one_frame_differing_only_in_what_they_remember():
    runs = {"rsum": (RSum(), RSumSettings(response_style="rsum"),
                     {"summary": [{"episode_id": "e1", "snapshot_session": 1, "snapshot_turn": None,
                                   "memory": "Ann has a puppy named Rex.", "tokens": 6, "error": None}]}),
            "gold_memory": (GoldMemory(), GoldMemorySettings(response_style="rsum"), {}),
            "all_context": (AllContext(), AllContextSettings(response_style="rsum"), {}),
            "part_context": (PartContext(), PartContextSettings(response_style="rsum"), {})}
    prompts: dict[str, tuple[str, str]] = {}
    for name, (method, settings, memory) in runs.items():
        llm = FakeChat(["Oh no, poor shoes! How is Rex settling in otherwise?"])
        answer = asyncio.run(method.answer(MethodContext(settings=settings, llm=llm), probe(), memory))
        assert answer.text.startswith("Oh no")
        system, user = (m["content"] for m in llm.calls[0]["messages"])
        prompts[name] = (system, user)
    assert len({system for system, _ in prompts.values()}) == 1  # one frame
    tails = {name: user[user.index("Current session so far"):] for name, (_, user) in prompts.items()}
    assert len(set(tails.values())) == 1  # the same session, request and instructions
    assert SHORT_REPLY not in "".join(tails.values())
    assert "Memory of both speakers:\nAnn has a puppy named Rex." in prompts["rsum"][1]
    assert "I have a puppy." in prompts["gold_memory"][1]
    all_ctx, part_ctx = prompts["all_context"][1], prompts["part_context"][1]
    assert "Earlier sessions" in all_ctx and "I play the cello on weekends." in all_ctx and "Memory" not in all_ctx
    assert "cello" not in part_ctx and "Memory" not in part_ctx and "Earlier sessions" not in part_ctx


def test_the_context_baselines_keep_secoms_short_frame_by_default():
    llm = FakeChat(["ok"])
    asyncio.run(AllContext().answer(MethodContext(settings=AllContextSettings(), llm=llm), probe(), {}))
    assert SHORT_REPLY in llm.calls[0]["messages"][1]["content"]


def test_the_rsum_config_sets_rsums_frame_on_the_sheet_citing_its_released_prompt():
    cfg = config("rsum_msc")
    protocol = cfg.paper.protocol
    for method in ("rsum", "gold_memory", "all_context", "part_context"):
        row = protocol[f"method.{method}.response_style"]
        assert row.value == "rsum" == getattr(cfg.method, method).response_style
    assert "gpt_recu.py:11" in protocol["method.rsum.response_style"].source
    assert deviations(cfg) == []


# ------------------------------------------------------------------------- F4: a failed update

def test_a_failed_rsum_update_keeps_the_previous_memory_for_the_next_sessions_probes():
    sessions = {s: [turn(s, 0, f"s{s} news"), turn(s, 1, f"s{s} reply")] for s in (1, 2, 3)}
    llm = FakeChat(["M1: Ann has a puppy.", LLMError("down", "garbled"), "M3"])
    episode = EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, sessions=sessions)
    rows = asyncio.run(RSum().build(MethodContext(settings=RSumSettings(), llm=llm), episode))["summary"]
    assert [(r["snapshot_session"], r["memory"], r["error"]) for r in rows] == [
        (1, "M1: Ann has a puppy.", None), (2, "M1: Ann has a puppy.", "down"), (3, "M3", None)]
    assert "M1: Ann has a puppy." in llm.calls[2]["messages"][1]["content"]  # session 3 updates M1
    assert RSum().build_stats({"summary": rows})["carried_sessions"] == 1
    # A probe of session 3 sees the memory after session 2: the carried M1, not an empty memory.
    seen = visible_memory(rows, 3, 1, RSum.memory_kind)
    answer_llm = FakeChat(["Hi"])
    p = ProbeInput(probe={"probe_id": "p", "kind": "next_response", "session_idx": 3, "turn_idx": 1,
                          "respondent": "Bob", "request": "s3 news"},
                   episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, history={}, current=sessions[3][:1])
    asyncio.run(RSum().answer(MethodContext(settings=RSumSettings(), llm=answer_llm), p, {"summary": seen}))
    assert "M1: Ann has a puppy." in answer_llm.calls[0]["messages"][1]["content"]
    assert "(empty)" not in answer_llm.calls[0]["messages"][1]["content"]
    # Table 2 scores that point too, with the memory in force after session 2 (it was skipped before).
    assert memory_at(RSum(), {"episode_id": "e1"}, {"summary": rows}, 2, RSumSettings()) == "M1: Ann has a puppy."


def test_a_failed_first_update_has_no_memory_to_keep():
    llm = FakeChat([LLMError("down")])
    episode = EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]},
                           sessions={1: [turn(1, 0, "a"), turn(1, 1, "b")]})
    rows = asyncio.run(RSum().build(MethodContext(settings=RSumSettings(), llm=llm), episode))["summary"]
    assert rows[0]["memory"] is None and rows[0]["error"] == "down"


# ------------------------------------------------------------------------- F2: the reasoned judge

def test_reason_first_gives_evaluation_steps_and_the_reasoning_before_the_verdict():
    shown, reasoned = pairwise.PairShown("Ann: hi", "Bob", "a", "b", past=""), pairwise.PairProtocol(reason_first=True)
    for criterion in ("specificity", "memorability", "consistency"):
        user = pairwise.build_messages(criterion, shown, reasoned)[1]["content"]
        assert "Evaluation steps:\n1. " in user and pairwise.EVALUATION_STEPS[criterion] in user
        assert user.index('"reason"') < user.index('"better"')
        plain = pairwise.build_messages(criterion, shown)[1]["content"]
        assert "Evaluation steps" not in plain and plain.index('"better"') < plain.index('"reason"')
    assert list(pairwise.answer_schema("both_orders", True, True).model_fields) == ["reason", "better"]
    assert list(pairwise.answer_schema("both_orders", True).model_fields) == ["better", "reason"]
    assert list(pairwise.all_verdicts_schema(3, True, True).model_fields) == ["reason", "better"]
    every = pairwise.build_all_messages(["specificity", "consistency"], pairwise.PairShown("d", "Bob", "a", "b"),
                                        reasoned)
    assert every[1]["content"].count("Evaluation steps:") == 2
    with pytest.raises(ValueError):
        JudgePairwiseSettings(protocol="creem", reason_first=True)


def test_the_stage_asks_the_reasoned_schema_and_reads_its_verdict():
    turns = [{"episode_id": "e1", "session_idx": 3, "turn_idx": i, "speaker": ("Ann", "Bob")[i % 2],
              "text": f"now {i}"} for i in range(3)]
    p = {"episode_id": "e1", "probe_id": "nr:3:2", "kind": "next_response", "session_idx": 3, "turn_idx": 2,
         "respondent": "Ann", "request": "now 1", "gold": "now 2", "context": None}
    cfg = stages.load_config(None, ["methods=[theanine,rsum]", "judge_pairwise.reason_first=true",
                                    "judge_pairwise.criteria=[specificity]"])
    llm = FakeChat(responder=lambda m, s: {"reason": "A names the dog; B is generic.",
                                           "better": "A" if "[A] R" in m[-1]["content"] else "B"})
    llm.cfg = SimpleNamespace(model="fake-judge")  # type: ignore[attr-defined]
    stage = JudgePairwiseStage(("theanine", "rsum"))
    ctx = StageContext(cfg=cfg, stage=stage, out_dir=None, clients={"judge": llm})  # type: ignore[arg-type]
    inputs = {"ingest.episodes": [{"episode_id": "e1", "dataset": "msc", "speakers": ["Ann", "Bob"], "notes": None}],
              "ingest.turns": turns, "probes.probes": [p],
              "respond_theanine.responses": [{"probe_id": p["probe_id"], "response": "R", "error": None}],
              "respond_rsum.responses": [{"probe_id": p["probe_id"], "response": "O", "error": None}]}
    rows = asyncio.run(stage.process_episode(ctx, "e1", inputs))["pairwise_judgments"]
    assert [r["preferred"] for r in rows] == ["reference", "reference"]  # both orders: the reference
    assert {r["reason"] for r in rows} == {"A names the dog; B is generic."}
    assert all(list(c["schema"].model_fields) == ["reason", "better"] for c in llm.calls)


@pytest.mark.parametrize("name", THEANINE_JUDGED)
def test_theanine_configs_judge_reason_first_with_sampling_on_the_sheet(name):
    cfg = config(name)
    judge, protocol = cfg.judge_pairwise, cfg.paper.protocol
    assert judge.reason_first is True and protocol["judge_pairwise.reason_first"].value is True
    assert "chain-of-thoughts" in protocol["judge_pairwise.reason_first"].source
    assert protocol["roles.judge.temperature"].value == cfg.role("judge").temperature == 0.0
    assert protocol["judge_pairwise.samples"].value == judge.samples == 1
    assert protocol["roles.judge.temperature"].source.startswith("ours")
    assert deviations(cfg) == []
    rows = [r for r in cfg.paper.results if r.table == "pairwise_summary"]
    named = scorer(cfg, rows[0])
    assert named.startswith("ours, after Theanine's G-Eval (App. D)") and "reasoning before the verdict" in named
    assert "verdict first" in scorer(config(name, "judge_pairwise.reason_first=false"), rows[0])


def test_rsums_config_runs_no_head_to_head_judge():
    cfg = config("rsum_msc")
    assert "judge_pairwise" not in stages.registry(cfg) and not cfg.judge_pairwise.enabled
    assert all(r.table != "pairwise_summary" for r in cfg.paper.results)


# ------------------------------------------------------------------------- F3, #5, F6, F8, N6, TeaFarm F5

@pytest.mark.parametrize("name", THEANINE_SIDE)
def test_the_theanine_sheets_list_the_settings_that_shape_every_number(name):
    cfg = config(name)
    protocol, theanine = cfg.paper.protocol, cfg.method.theanine
    expected = {"method.theanine.origin_tokens": 600, "method.theanine.max_memories": 10,
                "method.theanine.timelines_per": "memory", "method.theanine.draw_order": "similarity",
                "llm.max_tokens": 512}
    for path, value in expected.items():
        assert protocol[path].value == value, path
    assert (theanine.origin_tokens, theanine.max_memories, theanine.timelines_per, theanine.draw_order) == (
        600, 10, "memory", "similarity")
    assert protocol["method.theanine.origin_tokens"].source.startswith("ours")
    assert "src/theanine.py:134" in protocol["method.theanine.draw_order"].source
    # F6: the title of the text the numbers come from, the later one named as such.
    assert cfg.paper.title.startswith("Theanine: Revisiting Memory Management") and "2406.10996v1" in cfg.paper.title
    assert "later version: Towards Lifelong" in cfg.paper.title
    # N6: null, and the sheet says why it cannot be the paper's and what is used instead.
    episodes = protocol["corpus.episode_ids"]
    assert episodes.value is None and cfg.corpus.episode_ids is None
    assert "names no episode ids" in episodes.source and "first 50" in episodes.source
    # TeaFarm review F5: MemoChat runs its own loop, at Sec. 3.3's temperature.
    assert cfg.method.memochat.preset == protocol["method.memochat.preset"].value == "original"
    assert cfg.method.memochat.write_every == 8 and cfg.method.memochat.temperature is None
    # RSum-LLM runs RSum's own frame (App. H: its original prompt).
    assert cfg.method.rsum.response_style == protocol["method.rsum.response_style"].value == "rsum"
    assert deviations(cfg) == []


def test_the_pooled_sheet_compares_sec_4s_response_lengths():
    rows = {r.where["method"]: r for r in config("theanine_msc_cc").paper.results if r.table == "method_summary"}
    assert {m: (r.paper, r.column, r.where["dataset"]) for m, r in rows.items()} == {
        "rsum": (77, "mean_response_words", "all"), "theanine": (32, "mean_response_words", "all")}
    assert "30 words" in rows["rsum"].source  # the other baselines' mean, as a note


def test_recency_draws_the_newest_retrieved_memory_first():
    memories = [{"episode_id": "e1", "memory_id": mid, "session_idx": int(mid[0]), "memory_idx": int(mid[2]),
                 "event": mid, "session_time": None, "session_gap": None, "source_turn_ids": [], "vector": v}
                for mid, v in (("1:0", [1.0, 0.0]), ("2:0", [1.0, 0.1]), ("1:1", [0.0, 1.0]))]
    edges = [{"episode_id": "e1", "source": "1:0", "target": "2:0", "relation": "Cause"}]

    async def embed(texts):
        return np.array([[1.0, -0.1] for _ in texts])

    p = ProbeInput(probe={"probe_id": "p", "kind": "next_response", "session_idx": 3, "turn_idx": 1,
                          "respondent": "Bob", "request": "hi"},
                   episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, history={},
                   current=[{"speaker": "Ann", "text": "hi", "turn_idx": 0}])
    details = {}
    for order in ("similarity", "recency"):
        llm = FakeChat(responder=lambda m, s: {"rationale": "r", "response": "ok"})
        ctx = MethodContext(settings=TheanineSettings(refine=False, draw_order=order), llm=llm, embed=embed)
        details[order] = asyncio.run(Theanine().answer(ctx, p, {"memories": memories, "edges": edges})).details
    assert details["similarity"]["retrieved"] == ["1:0", "2:0", "1:1"]
    assert details["recency"]["retrieved"] == ["2:0", "1:0", "1:1"]
    # The shared path goes to whichever draws first; the union of timelines is the same here.
    assert sorted(map(tuple, details["recency"]["timelines"])) == sorted(map(tuple, details["similarity"]["timelines"]))
    assert TheanineSettings().draw_order == "similarity"


# ------------------------------------------------------------------------- F3: truncated outputs

def test_finish_reason_is_read_kept_in_the_cache_and_truncations_counted():
    choice = lambda i, reason: SimpleNamespace(index=i, finish_reason=reason,  # noqa: E731
                                               message=SimpleNamespace(content=f"c{i}", refusal=None))
    answer = read_chat(SimpleNamespace(choices=[choice(1, "stop"), choice(0, "length")], usage=None, model="m"))
    assert answer.texts == ["c0", "c1"] and answer.finish_reasons == ["length", "stop"]
    reply = Reply("c0", 1, 1, "m", cached=False, finish_reason="length")
    assert Reply.from_cache(reply.value(), "m").finish_reason == "length"
    assert "finish_reason" not in Reply("x", 1, 1, "m", cached=False).value()  # older entries stay as they were
    usage = Usage()
    accounts = Accounting({}, usage, None)
    for reason in ("length", "stop", None, "length"):
        accounts.count_call(LLMResult(text="t", finish_reason=reason))
    assert usage.calls == 4 and usage.truncated_calls == 2
    assert Usage.from_dict(usage.to_dict()).truncated_calls == 2
    assert "truncated_calls" not in Usage().to_dict()  # an older manifest layout writes back unchanged


# ------------------------------------------------------------------------- o4: p-values

def test_the_report_says_its_p_values_are_per_cell_and_uncorrected():
    from stages.report.sections import pairwise_intro

    frame = pl.DataFrame({"protocol": ["both_orders"]})
    assert pairwise_report.MULTIPLICITY_NOTE in pairwise_intro(frame)
    assert "uncorrected" in pairwise_report.MULTIPLICITY_NOTE
