"""Repeated judge runs (`runs` on judge_pairwise and judge_memory, `run_requests` on every judge): a
row group per run whose run 0 is the single run's, each run under sample indexes of its own, the
report's items as their majority / mean over runs before any win rate, sign test or mean, the runs
as one request with `n` or one request each, a warm rerun sending nothing, and the plan pricing them."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any, Callable

import polars as pl
import pytest
from pydantic import ValidationError

import stages
from conftest import llm_config
from pipeline.llm import DiskCallCache, LLMClient, LocalRateLimiter
from pipeline.llm.types import InvalidAnswer, LLMResult, Messages
from pipeline.plan import make_plan
from pipeline.engine.stage import StageContext
from pipeline.testing.fake_openai import FakeOpenAI
from stages.judging.calls import RunSamples, ask_runs, run_samples
from stages.judging.judge_memory import JudgeMemoryStage
from stages.judging.judge_pairwise import JudgePairwiseStage
from stages.judging.pairwise import reference_shown_first
from stages.metrics.significance import sign_test
from stages.report.tables import memory_summary, pairwise_summary

EPISODE = {"episode_id": "e1", "dataset": "msc", "speakers": ["Ann", "Bob"], "notes": None}
TURNS = [{"episode_id": "e1", "session_idx": s, "turn_idx": i, "speaker": ("Ann", "Bob")[i % 2], "text": f"s{s} t{i}"}
         for s in (1, 2) for i in range(4)]
PROBE = {"episode_id": "e1", "probe_id": "nr:2:3", "kind": "next_response", "session_idx": 2, "turn_idx": 3,
         "respondent": "Bob", "request": "s2 t2", "gold": "s2 t3", "context": None}


class SampledJudge:
    """A scripted judge that sees each call's sample index: it answers `answer(messages, sample)`
    (parsed into the schema) and records the index, as the real client keys its cache by it."""

    def __init__(self, answer: Callable[[Messages, int], Any]) -> None:
        self.answer = answer
        self.samples: list[int] = []
        self.cfg = SimpleNamespace(model="fake-judge")

    async def chat(self, messages: Messages, *, schema: Any = None, validate: Any = None, sample: int = 0,
                   **params: Any) -> LLMResult:
        self.samples.append(sample)
        raw = json.dumps(self.answer(messages, sample))
        try:
            parsed = schema.model_validate_json(raw) if schema else None
        except ValidationError as e:
            raise InvalidAnswer(f"invalid: {e}", raw) from e  # as the client's, after its re-asks
        return LLMResult(text=raw, parsed=parsed, model="fake")


def pairwise_rows(llm: Any, *sets: str) -> list[dict]:
    cfg = stages.load_config(None, ["methods=[secom,full_history]", *sets])
    stage = JudgePairwiseStage(("secom", "full_history"))
    ctx = StageContext(cfg=cfg, stage=stage, out_dir=None, clients={"judge": llm})  # type: ignore[arg-type]
    inputs = {"ingest.episodes": [EPISODE], "ingest.turns": TURNS, "probes.probes": [PROBE],
              "respond_secom.responses": [{"probe_id": PROBE["probe_id"], "response": "REF", "error": None}],
              "respond_full_history.responses": [{"probe_id": PROBE["probe_id"], "response": "OTHER", "error": None}]}
    return asyncio.run(stage.process_episode(ctx, "e1", inputs))["pairwise_judgments"]


def memory_rows(llm: Any, *sets: str) -> list[dict]:
    cfg = stages.load_config(None, ["methods=[creem]", "judge_memory.episodes=null", "judge_memory.samples=2",
                                    "judge_memory.criteria=[relevance,diversity]", *sets])
    stage = JudgeMemoryStage(("creem",))
    ctx = StageContext(cfg=cfg, stage=stage, out_dir=None, clients={"judge": llm})  # type: ignore[arg-type]
    inputs = {"ingest.episodes": [EPISODE], "ingest.turns": TURNS,
              "memory_creem.memory_view": [{"episode_id": "e1", "method": "creem", "memory": "[Ann] has a dog"}]}
    return asyncio.run(stage.process_episode(ctx, "e1", inputs))["memory_judgments"]


def by_sample(messages: Messages, sample: int) -> dict:
    """A verdict that changes with the sample index: runs differ as a sampled judge's would."""
    return {"better": "AB"[sample % 2]}


# --- rows: one group per run, run 0 the single run -------------------------------------------------


@pytest.mark.parametrize("per_call", ["criterion", "all"])
def test_three_both_orders_runs_give_three_rows_per_judgment_and_run_0_is_the_single_run(per_call: str) -> None:
    def answer(messages: Messages, sample: int) -> dict:
        return {"better": ["AB"[sample % 2]] * 3} if per_call == "all" else by_sample(messages, sample)

    sets = (f"judge_pairwise.per_call={per_call}", "judge_pairwise.explain=false")
    one, three = SampledJudge(answer), SampledJudge(answer)
    single, rows = pairwise_rows(one, *sets), pairwise_rows(three, *sets, "judge_pairwise.runs=3")
    assert len(single) == 3 * 2 and len(rows) == 3 * len(single)  # criteria x orders, x runs
    assert [r for r in rows if r["run"] == 0] == single and {r["run"] for r in single} == {0}
    # Each run its own sample index of each prompt (order, criterion): 0 asks what one run always asked.
    assert sorted(set(one.samples)) == [0] and sorted(set(three.samples)) == [0, 1, 2]
    assert len(three.samples) == 3 * len(one.samples)
    first = "A"  # the verdict of run r is sample r's: A on even samples, B on odd
    for r in rows:
        verdict = "AB"[r["run"] % 2]
        assert r["preferred"] == ("reference" if (verdict == first) == r["reference_first"] else "other"), r
        assert r["sample"] == 0 and r["error"] is None


def test_creem_runs_repeat_every_sample_under_indexes_of_their_own_and_draw_their_own_positions() -> None:
    sets = ("judge_pairwise.protocol=creem", "judge_pairwise.samples=3", "judge_pairwise.criteria=[consistency]")
    one, two = SampledJudge(by_sample), SampledJudge(by_sample)
    single, rows = pairwise_rows(one, *sets), pairwise_rows(two, *sets, "judge_pairwise.runs=2")
    assert len(single) == 3 and len(rows) == 6
    assert [r for r in rows if r["run"] == 0] == single
    assert sorted(one.samples) == [0, 1, 2] and sorted(two.samples) == [0, 1, 2, 3, 4, 5]  # no index shared
    for r in rows:  # the position is drawn per request sample index: run 1 draws afresh
        index = run_samples(r["run"], 3)[r["sample"]]
        assert r["reference_first"] == reference_shown_first(0, "e1", PROBE["probe_id"], "full_history",
                                                             "consistency", index)


@pytest.mark.parametrize("per_call", ["criterion", "all"])
def test_three_memory_runs_give_three_rows_per_rating_and_run_0_is_the_single_run(per_call: str) -> None:
    def answer(messages: Messages, sample: int) -> dict:
        return {"scores": [1 + sample % 5] * 2} if per_call == "all" else {"score": 1 + sample % 5}

    sets = (f"judge_memory.per_call={per_call}", "judge_memory.max_speakers=1")
    one, three = SampledJudge(answer), SampledJudge(answer)
    single, rows = memory_rows(one, *sets), memory_rows(three, *sets, "judge_memory.runs=3")
    assert len(single) == 2 * 2 and len(rows) == 3 * len(single)  # criteria x samples, x runs
    assert [r for r in rows if r["run"] == 0] == single
    # Run r asks samples 2r and 2r + 1 (two per run): six indexes, the first two the single run's.
    assert sorted(set(one.samples)) == [0, 1] and sorted(set(three.samples)) == list(range(6))
    assert all(r["score"] == 1 + run_samples(r["run"], 2)[r["sample"]] % 5 for r in rows)


def test_a_failed_run_fails_only_its_own_rows() -> None:
    def answer(messages: Messages, sample: int) -> Any:
        return {"score": 6} if sample == 1 else {"score": 3}  # sample 1 (run 1) answers out of range

    rows = memory_rows(SampledJudge(answer), "judge_memory.samples=1", "judge_memory.criteria=[relevance]",
                       "judge_memory.max_speakers=1", "judge_memory.runs=3")
    assert [(r["run"], r["score"], r["error"] is not None) for r in rows] == [(0, 3, False), (1, None, True),
                                                                              (2, 3, False)]


# --- the report: each item's majority / mean over its runs ---------------------------------------


def verdict(probe: str, run: int, preferred: str, *, first: bool = True, protocol: str = "creem") -> dict:
    return {"dataset": "msc", "episode_id": f"e-{probe}", "probe_id": probe, "session_idx": 2,
            "criterion": "memorability", "reference": "theanine", "other": "rsum", "protocol": protocol,
            "reference_first": first, "run": run, "sample": 0, "preferred": preferred, "reason": None,
            "past_shown": 1, "past_summarised": 0, "past_truncated": False, "current_shown": 4, "judge_model": "j",
            "prompt_fingerprint": "f", "error": None, "raw": None}


def test_the_sign_test_is_over_each_items_majority_of_runs_not_over_run_rows() -> None:
    # 8 items, each judged in 3 runs: reference, reference, other. Each item's majority is the
    # reference's: 8 wins, 0 losses, p = 2 / 2^8. Taken as 24 independent rows they would be 16 wins
    # and 8 losses, p = 0.15: the runs are not independent items.
    rows = [verdict(f"p{i}", run, v) for i in range(8) for run, v in enumerate(("reference", "reference", "other"))]
    out = pairwise_summary(pl.DataFrame(rows)).filter(pl.col("session_idx").is_null()).to_dicts()
    assert len(out) == 1
    r = out[0]
    assert (r["pairs"], r["wins"], r["ties"], r["losses"]) == (8, 8, 0, 0)
    assert r["sign_p"] == pytest.approx(sign_test(8, 0)) and r["sign_p"] < 0.05 < sign_test(16, 8)
    assert r["episodes"] == 8 and r["p_value"] < 0.05  # the cluster test counts items too
    # The runs' spread: runs 0 and 1 win every pair, run 2 none.
    assert r["runs"] == 3 and r["run_sd"] == pytest.approx(pl.Series([1.0, 1.0, 0.0]).std())


def test_runs_that_split_evenly_are_a_tie_and_a_run_missing_an_order_is_left_out() -> None:
    def both(probe: str, run: int, ref_first: str, ref_second: str | None) -> list[dict]:
        out = [verdict(probe, run, ref_first, protocol="both_orders")]
        return out + ([verdict(probe, run, ref_second, first=False, protocol="both_orders")] if ref_second else [])

    rows = (both("p1", 0, "reference", "reference") + both("p1", 1, "other", "other")  # win, loss: a tie
            + both("p2", 0, "reference", "reference") + both("p2", 1, "reference", None)  # win, (incomplete)
            + both("p3", 0, "other", None))  # no run with both orders: incomplete
    r = pairwise_summary(pl.DataFrame(rows)).filter(pl.col("session_idx").is_null()).to_dicts()[0]
    assert (r["pairs"], r["wins"], r["ties"], r["losses"], r["incomplete"]) == (2, 1, 1, 0, 1)
    # Run 0 decided p1 and p2 (both wins), run 1 only p1 (a loss).
    assert r["runs"] == 2 and r["run_sd"] == pytest.approx(pl.Series([1.0, 0.0]).std())


def test_one_run_summarises_as_before_and_reports_no_spread() -> None:
    rows = [verdict(f"p{i}", 0, v) for i, v in enumerate(("reference", "other", "reference"))]
    without_run = pl.DataFrame(rows).drop("run")  # a table written before `run` existed
    for frame in (pl.DataFrame(rows), without_run):
        r = pairwise_summary(frame).filter(pl.col("session_idx").is_null()).to_dicts()[0]
        assert (r["wins"], r["losses"], r["runs"], r["run_sd"]) == (2, 1, 1, None)


def rating(episode: str, run: int, sample: int, score: int | None) -> dict:
    return {"episode_id": episode, "dataset": "msc", "method": "creem", "speaker": "Ann", "criterion": "diversity",
            "group": "fundamental", "run": run, "sample": sample, "score": score, "memory_lines": 3,
            "memory_lines_shown": 3, "memory_truncated": False, "dialogue_sessions_shown": 2,
            "dialogue_truncated": False, "judge_model": "j", "prompt_fingerprint": "f",
            "error": None if score is not None else "bad", "raw": None}


def test_memory_ratings_average_samples_within_a_run_then_runs_and_the_intervals_count_ratings() -> None:
    rows = [rating("e1", 0, 0, 5), rating("e1", 0, 1, None),  # run 0: 5 (its failed sample left out)
            rating("e1", 1, 0, 1), rating("e1", 1, 1, 1),  # run 1: 1  -> e1's rating: 3 (rows alone: 7/3)
            rating("e2", 0, 0, 4), rating("e2", 0, 1, 4),  # run 0: 4
            rating("e2", 1, 0, 2), rating("e2", 1, 1, 2)]  # run 1: 2  -> e2's rating: 3
    r = memory_summary(pl.DataFrame(rows)).to_dicts()[0]
    assert (r["ratings"], r["episodes"]) == (2, 2) and r["score"] == pytest.approx(3.0)
    assert (r["score_iid_low"], r["score_iid_high"]) == pytest.approx((3.0, 3.0))  # over 2 ratings of 3, not 8 rows
    # Each run alone: run 0 scores (5 + 4) / 2, run 1 (1 + 2) / 2.
    assert r["runs"] == 2 and r["run_sd"] == pytest.approx(pl.Series([4.5, 1.5]).std())
    one = memory_summary(pl.DataFrame([x for x in rows if x["run"] == 0]).drop("run")).to_dicts()[0]
    assert (one["runs"], one["run_sd"], one["score"]) == (1, None, pytest.approx(4.5))


# --- requests: one request with n, or one per run; warm reruns send nothing -----------------------


def client_for(server: FakeOpenAI, cache_dir: Any) -> LLMClient:
    cfg = llm_config(server, cache_dir=str(cache_dir), structured_mode="json_schema")
    return LLMClient(cfg, cache=DiskCallCache(cfg.cache_dir), limiter=LocalRateLimiter(cfg.rpm, cfg.tpm))


def chats(server: FakeOpenAI) -> list[dict[str, Any]]:
    return [r["body"] for r in server.requests if r["path"].endswith("/chat/completions")]


def seeded(body: dict[str, Any]) -> str:
    """A judge whose answer follows the request's seed, as a sampled model's does; it answers
    whichever of the memory and head-to-head schemas the request asks for."""
    seed = int(body.get("seed") or 0)
    schema = json.dumps(body.get("response_format") or {})
    if '"scores"' in schema:
        return json.dumps({"scores": [1 + seed % 5] * 2})
    if '"score"' in schema:
        return json.dumps({"score": 1 + seed % 5})
    return json.dumps({"better": "AB"[seed % 2]})


MEMORY = ("judge_memory.samples=1", "judge_memory.criteria=[relevance]", "judge_memory.max_speakers=1",
          "judge_memory.temperature=1.0")


def test_samples_mode_sends_the_runs_as_one_request_with_n_and_requests_mode_one_request_each(
        fake_llm: FakeOpenAI, tmp_path) -> None:
    fake_llm.responder = seeded
    together = memory_rows(client_for(fake_llm, tmp_path / "n"), *MEMORY, "judge_memory.runs=3")
    assert [b.get("n") for b in chats(fake_llm)] == [3]
    fake_llm.reset()
    fake_llm.responder = seeded
    apart = memory_rows(client_for(fake_llm, tmp_path / "each"), *MEMORY, "judge_memory.runs=3",
                        "judge_memory.run_requests=requests")
    sent = chats(fake_llm)
    assert [b.get("n") for b in sent] == [None] * 3 and sorted(b["seed"] for b in sent) == [0, 1, 2]
    # The same runs either way: each run is its own sample index, cached under its own key.
    assert [(r["run"], r["score"]) for r in apart] == [(r["run"], r["score"]) for r in together]
    assert len({r["score"] for r in apart}) == 3


def test_requests_mode_keeps_a_runs_own_samples_together_one_request_per_run(fake_llm: FakeOpenAI, tmp_path) -> None:
    fake_llm.responder = seeded
    sets = ("judge_pairwise.criteria=[memorability]", "judge_pairwise.samples=2", "judge_pairwise.explain=false",
            "judge_pairwise.runs=3", "judge_pairwise.temperature=1.0")
    rows = pairwise_rows(client_for(fake_llm, tmp_path / "each"), *sets, "judge_pairwise.run_requests=requests")
    assert len(rows) == 3 * 2 * 2 and sorted(b.get("n") for b in chats(fake_llm)) == [2] * 6  # runs x orders
    fake_llm.reset()
    fake_llm.responder = seeded
    together = pairwise_rows(client_for(fake_llm, tmp_path / "n"), *sets)
    assert [b.get("n") for b in chats(fake_llm)] == [6, 6]  # one request per order: 3 runs x 2 samples
    assert [r["preferred"] for r in together] == [r["preferred"] for r in rows]


def test_a_warm_rerun_sends_nothing_and_more_runs_ask_only_the_new_ones(fake_llm: FakeOpenAI, tmp_path) -> None:
    fake_llm.responder = seeded
    single = memory_rows(client_for(fake_llm, tmp_path), *MEMORY)
    assert len(chats(fake_llm)) == 1
    # Run 0 is the single run's call: three runs over its cache ask runs 1 and 2 only.
    rows = memory_rows(client_for(fake_llm, tmp_path), *MEMORY, "judge_memory.runs=3")
    assert [b.get("n") for b in chats(fake_llm)] == [None, 2] and [r for r in rows if r["run"] == 0] == single
    for mode in ("samples", "requests"):
        again = memory_rows(client_for(fake_llm, tmp_path), *MEMORY, "judge_memory.runs=3",
                            f"judge_memory.run_requests={mode}")
        assert again == rows and len(chats(fake_llm)) == 2, mode  # warm: nothing sent


def test_a_judge_calls_runs_go_as_one_request_each_in_requests_mode(fake_llm: FakeOpenAI, tmp_path) -> None:
    """judge_answers' runs (JudgeCall.runs) take the mode too."""
    from stages.judging import answers

    fake_llm.responder = lambda body: json.dumps({"reason": "r", "label": "CORRECT" if int(body.get("seed") or 0) % 3
                                                  else "WRONG"})
    call = answers.locomo_j_call("When did Ann adopt Rex?", "May 2023", "In May 2023")
    runs = asyncio.run(call.runs(client_for(fake_llm, tmp_path / "each"), 4, "requests", temperature=0.0))
    assert [b.get("n") for b in chats(fake_llm)] == [None] * 4
    assert [score for score, _reason, _model in runs] == [0.0, 1.0, 1.0, 0.0]
    fake_llm.reset()
    together = asyncio.run(call.runs(client_for(fake_llm, tmp_path / "n"), 4, temperature=0.0))
    assert [b.get("n") for b in chats(fake_llm)] == [4] and together == runs


def test_ask_runs_returns_every_runs_samples_in_order_in_either_mode() -> None:
    judge = SampledJudge(lambda m, s: {"better": "A"})
    for mode in ("samples", "requests"):
        asked = RunSamples.of(3, 2, mode)  # type: ignore[arg-type]
        assert asked.groups == ((0, 1), (2, 3), (4, 5))
        out = asyncio.run(ask_runs(judge, [{"role": "user", "content": "x"}], asked))
        assert len(out) == 6
    assert sorted(judge.samples) == sorted(list(range(6)) * 2)


# --- the plan prices the runs --------------------------------------------------------------------


def test_the_plan_counts_every_run_and_prices_samples_mode_prompts_once_per_request(run_cfg, fake_llm) -> None:
    from stages import registry

    base = ("corpus.limit=2", "methods=[rsum]", "stages=[ingest,probes,memory_rsum,judge_memory]",
            "judge_memory.episodes=null")

    def judged(*sets: str) -> dict[str, float]:
        plan = make_plan(run_cfg(*base, *sets), registry)
        return next(s for s in plan.stages if s.name == "judge_memory").total()

    one, together = judged(), judged("judge_memory.runs=3")
    apart = judged("judge_memory.runs=3", "judge_memory.run_requests=requests")
    assert one["calls"] > 0 and together["calls"] == apart["calls"] == 3 * one["calls"]
    # every run's completion is billed, one request or three (a choice of `n` may word its answer otherwise)
    assert together["completion_tokens"] == pytest.approx(3 * one["completion_tokens"], rel=0.05)
    assert apart["completion_tokens"] == pytest.approx(3 * one["completion_tokens"], rel=0.05)
    # One request per run sends the prompt three times; the runs as `n` send it (about) once.
    assert apart["prompt_tokens"] == pytest.approx(3 * one["prompt_tokens"])
    assert together["prompt_tokens"] < apart["prompt_tokens"]
    assert fake_llm.total == 0
