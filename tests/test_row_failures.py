"""An exception on one row is that row's failure: a method's `answer` raising for one probe fails
that probe's row only; a `build` raising at one session keeps the memory before it and fails only
the probes that would need it; `--fail-fast` stops instead; the run exits 6 when rows failed;
`status` shows the latest attempt, and a report older than a failed attempt says so."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from pipeline.errors import RunStopped
from pipeline.engine.stage import Rows
from stages.cli import main
from stages.methods import METHODS
from stages.methods.base import SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, MethodSettings, ProbeInput
from stages.testing import run_method

NOTES = pa.schema([*SNAPSHOT_FIELDS, pa.field("note", pa.string())])
PROBES = ["probes.from_session=2", "probes.max_per_episode=null"]


class FlakyAnswer(Method[MethodSettings]):
    """Answers every probe but the one named in `bad`, for which its own code raises."""

    name = "flaky_answer"
    bad = ""

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict[str, Rows]) -> Answer:
        if probe.probe["probe_id"] == self.bad:
            raise RuntimeError(f"deliberate failure on {self.bad}")
        return Answer(text=(await ctx.llm.chat([{"role": "user", "content": probe.request}])).text)


class BreaksAtSession(Method[MethodSettings]):
    """One note per session, written at the session's end; its code raises when it reaches `fail_at`."""

    name = "breaks_at_session"
    memory = {"notes": NOTES}
    memory_kind = "log"
    fail_at = 10**6
    builds: list[int] = []

    async def build(self, ctx: MethodContext[MethodSettings], episode: EpisodeInput) -> dict[str, Rows]:
        type(self).builds.append(len(episode.sessions))
        rows = []
        for s in sorted(episode.sessions):
            if s >= self.fail_at:
                raise KeyError(f"no note for session {s}")
            rows.append({"episode_id": episode.episode["episode_id"], "snapshot_session": s, "snapshot_turn": None,
                         "note": f"session {s}"})
        return {"notes": rows}

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict[str, Rows]) -> Answer:
        notes = [r["note"] for r in memory["notes"]]
        return Answer(text=" | ".join(notes) or "(none)", used_ids=notes)


class StopsTheRun(FlakyAnswer):
    name = "stops_the_run"

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict[str, Rows]) -> Answer:
        raise RunStopped("budget reached (test)")


def test_an_exception_in_answer_fails_that_probes_row_and_keeps_every_other(fake_llm, tmp_path):
    method = FlakyAnswer()
    probes = run_method(method, fake_llm.base_url, tmp_path / "a", sets=PROBES)["probes.probes"].to_pylist()
    assert len(probes) > 3
    method.bad = probes[2]["probe_id"]
    rows = run_method(method, fake_llm.base_url, tmp_path / "b", sets=PROBES)["respond_flaky_answer.responses"].to_pylist()
    assert [r["probe_id"] for r in rows] == [p["probe_id"] for p in probes]
    failed = [r for r in rows if r["error"]]
    assert [r["probe_id"] for r in failed] == [method.bad]
    assert failed[0]["response"] is None
    assert failed[0]["error"] == f"RuntimeError: deliberate failure on {method.bad}"
    assert all(r["response"] for r in rows if not r["error"])


def test_a_build_exception_keeps_the_memory_before_it_and_fails_only_the_probes_that_need_it(fake_llm, tmp_path):
    method = BreaksAtSession()
    sessions = 6  # the sample corpus's first episode: sessions 1-6, its QA probes after session 6
    BreaksAtSession.fail_at = 4
    BreaksAtSession.builds = []
    tables = run_method(method, fake_llm.base_url, tmp_path, sets=PROBES)
    failures = tables["memory_breaks_at_session.build_failures"].to_pylist()
    assert len(failures) == 1 and failures[0]["session_idx"] == 4 and failures[0]["within_session"] is False
    assert failures[0]["error"].endswith("KeyError: 'no note for session 4'")
    # The memory kept is exactly the sessions that built, found in a few rebuilds, not one per session.
    notes = tables["memory_breaks_at_session.notes"].to_pylist()
    assert sorted(r["snapshot_session"] for r in notes) == [1, 2, 3]
    assert BreaksAtSession.builds[0] == sessions and len(BreaksAtSession.builds) <= 1 + 3
    rows = {r["probe_id"]: r for r in tables["respond_breaks_at_session.responses"].to_pylist()}
    probes = tables["probes.probes"].to_pylist()
    assert {p["session_idx"] for p in probes} >= {3, 4, 5, 7}
    for p in probes:
        row = rows[p["probe_id"]]
        if p["session_idx"] <= 4:  # its memory ends before session 4's: whole, and answered
            assert row["error"] is None and "session 4" not in row["response"]
            assert row["response"].count("session") == min(p["session_idx"] - 1, 3)
        else:  # it would need session 4's memory, which is missing
            assert row["response"] is None and row["error"].startswith("memory build failed: ")
    # A memory with a missing session is not the episode's memory for the memory judge.
    assert tables["memory_breaks_at_session.memory_view"].num_rows == 0


def _cli_args(tmp_path, fake_llm, method: str) -> list[str]:
    sets = [f"artifacts_dir={tmp_path / 'artifacts'}", "run_name=flaky", f"methods=[{method}]",
            "corpus.format=sample", "corpus.limit=1", "llm.provider=openai", f"llm.base_url={fake_llm.base_url}",
            "llm.api_key_env=MEMPIPE_TESTING_KEY", f"llm.cache_dir={tmp_path / 'cache'}", "ray.executor=inline",
            "teabag.enabled=false", *PROBES]
    return [arg for s in sets for arg in ("--set", s)]


def test_the_run_goes_on_past_a_failed_row_and_exits_6_and_fail_fast_stops_it(fake_llm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEMPIPE_TESTING_KEY", "sk-fake-for-tests")
    method = FlakyAnswer()
    monkeypatch.setitem(METHODS, method.name, method)
    args = _cli_args(tmp_path, fake_llm, method.name)
    assert main(["run", *args, "--only", "ingest", "--only", "probes"]) == 0
    method.bad = "qa:sample-01-q2"
    assert main(["run", *args]) == 6  # every stage ran; one row failed
    out = capsys.readouterr()
    assert "report: " in out.out and re.search(r"\d+ row\(s\) failed \(respond_flaky_answer 1,", out.err)
    assert main(["status", *args]) == 0
    status = capsys.readouterr().out
    line = next(ln for ln in status.splitlines() if ln.startswith("respond_flaky_answer"))
    assert line.split()[1] == "done" and line.split()[3] == "1"  # state, rows, errors
    # --fail-fast: the same row, asked again, stops the run, the stage is not published, and status says so.
    html = tmp_path / "artifacts" / "flaky" / "report" / "report.html"
    assert html.exists()
    with pytest.raises(RuntimeError, match="deliberate failure"):
        main(["run", *args, "--fail-fast", "--force", "respond_flaky_answer"])
    status_after = (main(["status", *args]), capsys.readouterr().out)[1]
    line = next(ln for ln in status_after.splitlines() if ln.startswith("respond_flaky_answer"))
    assert "failed at" in line and "RuntimeError: deliberate failure on qa:sample-01-q2" in line
    assert "Outdated." in html.read_text() and "respond_flaky_answer" in html.read_text()


def test_a_run_stop_raised_in_answer_is_never_a_failed_row(fake_llm, tmp_path):
    with pytest.raises(RunStopped, match="budget reached"):
        run_method(StopsTheRun(), fake_llm.base_url, tmp_path, sets=PROBES)
