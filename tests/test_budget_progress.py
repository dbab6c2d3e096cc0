"""Paid runs: a hard budget that stops before the next call would pass it, a rerun with a higher
budget that continues without paying twice, and progress lines that say what a stage did,
including which structured-output mode a role ended on and why."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import segmenting_responder, session_ray
from pipeline.llm.ledger import Budget, BudgetExceeded, LedgerBook, StageTally
from pipeline.engine.spend import load_spend
from pipeline.engine.progress import end_text, live_text, planned_calls
from pipeline.llm.usage import Usage
from stages.cli import main

ROOT = Path(__file__).resolve().parent.parent
# $1,000 per 1M tokens both ways: a segmentation call of a few hundred tokens costs tens of cents.
PRICES = "{fake-model: {input: 1000.0, output: 1000.0}}"


def _args(tmp_path: Path, fake_llm, name: str, *sets: str, executor: str = "inline") -> list[str]:
    return ["-c", str(ROOT / "configs" / "default.yaml"),
            "--set", f"artifacts_dir={tmp_path / name}", "--set", "llm.provider=openai",
            "--set", f"llm.base_url={fake_llm.base_url}", "--set", "llm.api_key_env=MEMPIPE_TEST_KEY",
            "--set", f"llm.cache_dir={tmp_path / (name + '-cache')}", "--set", "llm.model=fake-model",
            "--set", f"llm.prices={PRICES}", "--set", "llm.backoff_base_s=0.01",
            "--set", "ray.episodes_per_shard=1", "--set", f"ray.executor={executor}",
            "--set", "corpus.limit=null", "--set", "teabag.enabled=false",
            *[x for s in sets for x in ("--set", s)]]


@pytest.fixture
def paid(fake_llm, monkeypatch):
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    fake_llm.responder = segmenting_responder
    return fake_llm


@pytest.mark.parametrize("executor", ["inline", pytest.param("ray", marks=pytest.mark.session_ray)])
def test_budget_stops_before_the_next_call_and_a_higher_budget_resumes_without_paying_twice(
        tmp_path, paid, capsys, executor, request):
    if executor == "ray":
        session_ray(request)  # workers share the ledger through its actor

    def _args(*a, **k):
        return globals()["_args"](*a, **k, executor=executor)

    # Reference: the same stage uninterrupted, with its own cache.
    assert main(["run", "--until", "segment", *_args(tmp_path, paid, "ref")]) == 0
    reference_calls = paid.count()
    ref_spend = json.loads((tmp_path / "ref" / "default" / "_spend.json").read_text())["total_usd"]
    assert reference_calls >= 4 and ref_spend > 0
    capsys.readouterr()

    budget = ref_spend / 2
    paid.reset()
    code = main(["run", "--until", "segment", *_args(tmp_path, paid, "run", f"llm.max_cost_usd={budget}")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    # One line says it all: the budget, the spend, how to continue (the rest are progress lines).
    stop = [line for line in err if line.startswith("mempipe:")]
    assert stop == [err[-1]] and "budget reached: llm.max_cost_usd" in stop[0] and "run the same command again" in stop[0]
    spent = float(re.search(r"\$(\d+\.\d+) spent on this run directory", stop[0]).group(1))
    first_calls = paid.count()
    assert 0 < first_calls < reference_calls
    run_dir = tmp_path / "run" / "default"
    assert sum(load_spend(run_dir).values()) == pytest.approx(spent, abs=1e-4) and spent <= budget
    assert not (run_dir / "segment" / "_manifest.json").exists()  # the stage is not published half done
    assert (run_dir / "ingest" / "_manifest.json").exists()  # finished work is kept

    # The same budget again: it goes on while the budget has room for a call's worst case (calls
    # that were in flight at the stop held some), and then refuses without sending a request.
    seen = first_calls
    for _ in range(6):
        assert main(["run", "--until", "segment", *_args(tmp_path, paid, "run", f"llm.max_cost_usd={budget}")]) == 3
        if paid.count() == seen:
            break
        seen = paid.count()
    else:
        pytest.fail("the same budget kept sending requests")
    assert sum(load_spend(run_dir).values()) <= budget
    capsys.readouterr()

    assert main(["run", "--until", "segment", *_args(tmp_path, paid, "run", f"llm.max_cost_usd={ref_spend * 2}")]) == 0
    out = capsys.readouterr().out
    assert paid.count() == reference_calls  # every call was made exactly once over the two runs
    assert (run_dir / "segment" / "_manifest.json").exists()
    total = sum(load_spend(run_dir).values())
    assert total == pytest.approx(ref_spend, rel=1e-6)
    assert f"${total:.4f} on this run directory" in out


def test_a_roles_own_budget_stops_only_when_that_role_would_pass_it(tmp_path, paid, capsys):
    args = _args(tmp_path, paid, "roles", "roles.segmenter.max_cost_usd=0.000001")
    assert main(["run", "--until", "segment", *args]) == 3
    assert "roles.segmenter.max_cost_usd" in capsys.readouterr().err
    assert paid.count() == 0
    # Another role's cap does not hold the segmenter back.
    args = _args(tmp_path, paid, "other", "roles.judge.max_cost_usd=0.000001")
    assert main(["run", "--until", "segment", *args]) == 0


def test_the_ledger_refuses_a_reservation_that_would_pass_the_cap_counting_calls_in_flight():
    book = LedgerBook(Budget(total=1.0), spent_before={"llm": 0.25})
    assert book.reserve("llm", 0.5) is None  # 0.25 spent + 0.5 held
    refusal = book.reserve("llm", 0.5)  # would be 1.25 with the call in flight
    message = str(BudgetExceeded(*refusal))
    assert "llm.max_cost_usd = $1.0000" in message and "$0.2500 spent" in message
    book.settle("llm", 0.5, 0.1)  # the call cost less than its worst case
    assert book.reserve("llm", 0.6) is None  # 0.35 + 0.6 fits
    assert book.total_spend() == pytest.approx(0.35)


def test_stage_tallies_reach_the_ledger_in_batches_and_on_flush():
    book = LedgerBook(Budget())
    from pipeline.llm.ledger import RunLedger

    tally = StageTally(RunLedger.local(book), "judge_answers", "judge")
    tally.add(calls=1, prompt_tokens=100, completion_tokens=10, cost_usd=0.01)
    tally.add(calls=1, cached_calls=1, prompt_tokens=100, completion_tokens=10)
    tally.flush()
    counts = book.snapshot()["counts"]["judge_answers"]["judge"]
    assert counts["calls"] == 2 and counts["cached_calls"] == 1 and counts["prompt_tokens"] == 200
    assert counts["cost_usd"] == pytest.approx(0.01)


def test_log_lines_name_start_end_calls_cost_and_the_structured_mode_a_role_stepped_down_to(tmp_path, paid, capsys):
    # An endpoint that rejects json_schema and never answers valid JSON: every segmentation
    # answer is invalid, and the lines and the manifest still say which mode and why.
    paid.reject_formats = {"json_schema"}
    paid.responder = lambda body: "not json at all"
    assert main(["run", "--until", "segment", *_args(tmp_path, paid, "modes")]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert any(re.match(r"segment: started, \d+ of \d+ shards to run", line) for line in lines)
    end = next(line for line in lines if line.startswith("segment: done in"))
    assert re.search(r"\d+ calls \(\d+ fresh, 0 cached, \d+ failed\)", end) and "$" in end
    assert "json_object" in end and "the endpoint rejected json_schema: HTTP 400" in end and "all invalid" in end
    manifest = json.loads((tmp_path / "modes" / "default" / "segment" / "_manifest.json").read_text())
    usage = manifest["llm_usage"]["segmenter"]
    assert usage["structured_modes"] == usage["structured_invalid"] and usage["structured_modes"].get("json_object")
    assert "rejected json_schema" in usage["structured_fallbacks"]["json_object"]
    assert "spent: $" in captured.out


def test_the_live_line_shows_calls_against_the_plan_tokens_spend_and_an_eta(tmp_path):
    counts = {"calls": 10, "failed_calls": 0, "prompt_tokens": 2500, "completion_tokens": 500, "cost_usd": 0.0123}
    text = live_text(counts, 40, (1, 4), elapsed=30.0)
    assert text == "calls 10/40 · 3.0k tok · $0.0123 · ETA 1:30"
    # Without a plan, the expected calls come from the shards done so far, marked as a guess.
    assert live_text(counts, None, (1, 4), elapsed=30.0).startswith("calls 10/~40")
    (tmp_path / "_plan.json").write_text(json.dumps({"stages": {"segment": {"fingerprint": "abc", "calls": 12}}}))
    assert planned_calls(tmp_path, "segment", "abc") == 12
    assert planned_calls(tmp_path, "segment", "other") is None  # a plan of another config is not used


def test_the_end_line_of_a_stage_without_llm_calls_has_rows_and_time_only():
    assert end_text("ingest", 1.25, None, 0, 69) == "ingest: done in 1.2 s, 69 rows"
    u = Usage(calls=3, cached_calls=1, prompt_tokens=900, completion_tokens=100, cost_usd=0.5, cached_cost_usd=0.1)
    assert end_text("judge", 2.0, {"judge": u}, 1, 3).endswith(
        "1 failed; 3 calls (2 fresh, 1 cached, 0 failed), 1.0k tokens, $0.4000 spent")
