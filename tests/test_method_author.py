"""The method author's house: the docs' complete example runs as printed, `mempipe new-method`
writes files that pass as written, and a method from another installed package (an entry point of
the `mempipe.methods` group; a dist-info on sys.path) runs beside rsum in the default job's shape,
with its own stages, fingerprints reaching into its package, a paper sheet row and its report panel."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.engine import code_closure
from pipeline.artifacts import StageDir
from pipeline.engine.runner import Runner
from stages import registry
from stages.methods import BUILT_IN, METHODS, installed_methods
from stages.scaffold import method_files
from stages.testing import run_method

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "adding-a-method.md"


def test_the_docs_complete_method_is_the_scaffold_and_runs_as_printed(fake_llm, tmp_path, monkeypatch):
    printed = re.search(r"## A complete method.*?```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    assert printed == method_files("recency_k")["src/recency_k/method.py"]
    assert len(printed.splitlines()) <= 50
    (tmp_path / "docs_example_recency.py").write_text(printed)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("docs_example_recency")
    fake_llm.responder = lambda body: "Want a game tonight?"
    tables = run_method(module.RecencyK(), fake_llm.base_url, tmp_path, settings={"k": 1, "top_n": 2})
    notes = tables["memory_recency_k.notes"].to_pylist()
    responses = tables["respond_recency_k.responses"].to_pylist()
    sessions = {p["probe_id"]: p["session_idx"] for p in tables["probes.probes"].to_pylist()}
    # `k: 1`: one row per session, its last turn
    assert len(notes) >= 2 and len(notes) == len({n["snapshot_session"] for n in notes})
    assert responses and all(r["error"] is None and r["response"] == "Want a game tonight?" for r in responses)
    # `top_n: 2`: at most two rows, each from a session before the probe's
    assert all(len(r["memory_ids"]) == min(2, sessions[r["probe_id"]] - 1) for r in responses)
    assert all(int(i.split(":")[0]) < sessions[r["probe_id"]] for r in responses for i in r["memory_ids"])


# --- a method from another package ------------------------------------------------------------

PANEL = '''

    def report_panel(self, memory, responses):
        from stages.api import ReportPanel
        return ReportPanel(title="Acme notes", text=f"{len(memory['notes'])} notes kept.")
'''


def install_fake_package(site: Path, entry: str = "acme_digest = acme_memory.method:AcmeDigest") -> None:
    """`acme_memory` as pip would leave it: the package beside its dist-info, whose entry_points.txt
    registers the method. Its prompt lives in a module of its own, which the method imports."""
    pkg = site / "acme_memory"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "prompts.py").write_text('DIGEST = "Summarise in two sentences what this conversation says."\n')
    module = method_files("acme_digest", "acme_memory")["src/acme_memory/method.py"].replace(
        '    memory_kind = "log"', '    prompts = {"digest": prompts.DIGEST}\n    memory_kind = "log"').replace(
        "import pyarrow as pa\n", "import pyarrow as pa\n\nfrom acme_memory import prompts\n")
    assert "prompts.DIGEST" in module and "from acme_memory import prompts" in module
    (pkg / "method.py").write_text(module + PANEL)
    info = site / "acme_memory-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-memory\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[mempipe.methods]\n{entry}\n")


@pytest.fixture
def acme(toy_dir, monkeypatch):
    """The package installed where this session's Ray workers look too (conftest's ray_local)."""
    site = toy_dir / "site"
    install_fake_package(site)
    monkeypatch.syspath_prepend(str(site))
    found, broken = installed_methods(BUILT_IN)
    assert broken == {} and list(found) == ["acme_digest"]
    return {**METHODS, **found}


@pytest.mark.heavy(seconds=10)
@pytest.mark.session_ray
def test_a_method_from_another_package_runs_beside_rsum_in_the_default_jobs_shape(acme, run_cfg, tmp_path):
    sheet = tmp_path / "acme_paper.yaml"
    sheet.write_text(
        "paper:\n  title: 'Acme digests'\n  seed: 'acme'\n  reproduces: 'a row of ours'\n  results:\n"
        "  - {name: 'Acme, GPT4Score', paper: 50.0, source: 'our paper, Table 1', table: answer_summary, "
        "where: {dataset: all, category: null, method: acme_digest, judge: gpt4score}, column: score, scale: 1}\n")
    cfg = run_cfg("corpus.limit=1", "methods=[rsum,acme_digest]", f"report.compare_with=[{sheet}]", methods=acme,
                  executor="ray")  # the workers import the package too
    stages = registry(cfg, acme)
    assert {"memory_acme_digest", "respond_acme_digest"} <= set(stages)
    runner = Runner(cfg, stages)
    assert set(runner.run().values()) == {"ran"}
    responses = StageDir(cfg.run_dir, "respond_acme_digest").read_table("responses").to_pylist()
    assert responses and all(r["error"] is None for r in responses)
    judged = StageDir(cfg.run_dir, "judge_answers").read_table("answer_judgments").to_pylist()
    assert {r["method"] for r in judged} == {"rsum", "acme_digest"}
    # its fingerprint follows its package's imports, and the shared helpers it uses
    closure = code_closure.code_closure(*stages["respond_acme_digest"].code_roots())
    assert {"acme_memory.method", "acme_memory.prompts", "stages.api", "stages.methods.shared.memory_response"} <= set(closure)
    assert not any(m.startswith("stages.methods.rsum") for m in closure)
    # the sheet's row and the method's own report panel
    repro = StageDir(cfg.run_dir, "report").read_table("reproduction_summary").to_pylist()
    row = next(r for r in repro if r["name"] == "Acme, GPT4Score")
    assert row["produced"] and row["run"] is not None and row["origin"].endswith("acme_paper.yaml")
    assert "Acme notes" in (Path(cfg.run_dir) / "report" / "report.md").read_text()
    # an edit to the package's prompt module reruns its two stages and what reads them, not rsum's
    before = runner.fingerprints()
    Path(sys.modules["acme_memory.prompts"].__file__).write_text('DIGEST = "Summarise in one sentence."\n')
    code_closure.forget("acme_memory.prompts")
    after = Runner(cfg, registry(cfg, acme)).fingerprints()
    changed = {s for s in before if before[s] != after[s]}
    assert {"memory_acme_digest", "respond_acme_digest"} <= changed and "memory_rsum" not in changed


def test_a_broken_plug_in_is_named_when_a_config_selects_it_and_stops_nothing_else(tmp_path):
    install_fake_package(tmp_path, entry="ghost = acme_missing.method:Ghost")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    check = [sys.executable, "-m", "stages.cli", "check", "-c", str(ROOT / "configs" / "default.yaml")]
    ok = subprocess.run(check, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    bad = subprocess.run([*check, "--set", "methods=[ghost]"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 1
    assert "'ghost' could not be loaded" in bad.stderr and "acme_missing.method:Ghost" in bad.stderr
    assert "ModuleNotFoundError" in bad.stderr
