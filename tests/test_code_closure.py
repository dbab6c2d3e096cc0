"""A stage's fingerprint covers the code it runs, found from its imports (never a hand list), and
the method folder is sealed: a method imports `pipeline/`, `stages/methods/` and the floors below it
(`stages.dialogue`, `stages.metrics`) only."""

from __future__ import annotations

import json
import pkgutil
from pathlib import Path
from typing import Iterator

import pytest

from pipeline.engine import code_closure
from pipeline.engine.fingerprint import compute_fingerprint
from stages import load_config, registry
from stages.methods import METHODS

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def every_stage() -> dict:
    """Every stage of a run that selects every method (TeaFarm on), with no upstream."""
    cfg = load_config(ROOT / "configs/default.yaml", [f"methods={json.dumps(list(METHODS))}"])
    return {"cfg": cfg, "stages": registry(cfg)}


@pytest.fixture
def edit_source(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """`edit(module, old, new)`: the module's source as the fingerprint reads it, with one edit."""
    original = code_closure.read_source
    edits: dict[str, tuple[str, str]] = {}

    def read(module: str) -> str:
        text = original(module)
        if module in edits:
            old, new = edits[module]
            assert old in text, f"{old!r} is not in {module}"
            text = text.replace(old, new)
        return text

    def edit(module: str, old: str, new: str) -> None:
        edits[module] = (old, new)
        code_closure.forget(module)

    monkeypatch.setattr(code_closure, "read_source", read)
    yield edit
    code_closure.forget(*edits)  # what this process parsed of the other modules still holds


def fingerprints(run: dict) -> dict[str, str]:
    return {name: compute_fingerprint(stage, run["cfg"], {}) for name, stage in run["stages"].items()}


def changed_by(run: dict, edit_source, module: str, old: str, new: str) -> set[str]:
    before = fingerprints(run)
    edit_source(module, old, new)
    after = fingerprints(run)
    return {name for name in before if before[name] != after[name]}


def method_stages(run: dict) -> set[str]:
    return {n for n in run["stages"] if n.startswith(("memory_", "respond_"))}


def test_editing_format_unit_reruns_every_method_that_shows_dialogue(every_stage, edit_source):
    changed = changed_by(every_stage, edit_source, "stages.dialogue",
                         "f\"{t['speaker']}: {t['text']}\"", "f\"{t['speaker']} said: {t['text']}\"")
    # Every method formats dialogue (its prompts, its units, or its gold memory's turns); so does the
    # pairwise judge, which used to have a copy of its own.
    assert method_stages(every_stage) <= changed
    assert {"judge_pairwise", "compress", "segment"} <= changed
    assert "ingest" not in changed


def test_editing_a_helper_two_imports_deep_reruns_the_method_that_uses_it(every_stage, edit_source):
    """RSum's prompt dates its sessions with `session_memories.when`, which its module imports."""
    changed = changed_by(every_stage, edit_source, "stages.methods.shared.session_memories",
                         "def when(", "def when(  # edited\n")
    assert {"memory_rsum", "respond_rsum", "memory_theanine", "respond_theanine"} <= changed
    assert not {"memory_creem", "respond_creem", "respond_secom", "memory_ld_agent"} & changed


def test_editing_a_module_no_method_imports_changes_no_method_stage(every_stage, edit_source):
    changed = changed_by(every_stage, edit_source, "stages.report.plots", "def win_rates(", "def win_rates(  # x\n")
    assert changed == {"report"}


def test_editing_one_method_reruns_only_that_method_and_the_report(every_stage, edit_source):
    changed = changed_by(every_stage, edit_source, "stages.methods.ld_agent.method",
                         "class LDAgent(Method[LDAgentSettings]):",
                         "class LDAgent(Method[LDAgentSettings]):  # edited")
    # diagnose and memory_ops read every method's memory_items (the judge's calls replay from the cache)
    assert changed == {"memory_ld_agent", "respond_ld_agent", "diagnose", "memory_ops", "report"}


def test_the_framework_modules_that_only_run_stages_never_enter_a_fingerprint(every_stage):
    modules = {m for stage in every_stage["stages"].values() for m in code_closure.code_closure(*stage.code_roots())}
    assert not [m for m in modules if code_closure.runs_not_shapes(m)]
    assert "pipeline.retrieval" in modules  # services that shape rows do


def project_modules(package: str) -> list[str]:
    root = __import__(package, fromlist=["_"])
    return [package] + [m.name for m in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")]


def imports_of(module: str) -> set[str]:
    return {m for m in code_closure.imports_of(module) if m.partition(".")[0] in ("stages", "pipeline")}


def test_methods_import_only_the_framework_other_methods_and_pure_metrics():
    """STYLE.md: `stages/methods/` is sealed; what methods share lives below them. Every method and judge
    sees dialogue through `stages.dialogue`; SeCom's reflection scores its segmentations with WindowDiff
    from `stages.metrics`; both are leaves that import no stage (checked below)."""
    leaks = {module: sorted(m for m in imports_of(module)
                            if m.startswith("stages") and m != "stages.dialogue"
                            and not m.startswith(("stages.methods", "stages.metrics")))
             for module in project_modules("stages.methods")}
    assert {m: bad for m, bad in leaks.items() if bad} == {}


def test_metrics_import_no_stage_and_the_framework_never_imports_stages():
    metrics = {m: sorted(i for i in imports_of(m) if i.startswith("stages") and not i.startswith("stages.metrics"))
               for m in [*project_modules("stages.metrics"), "stages.dialogue"]}
    framework = {m: sorted(i for i in imports_of(m) if i.startswith("stages"))
                 for m in project_modules("pipeline")}
    assert {m: bad for m, bad in {**metrics, **framework}.items() if bad} == {}


def test_the_layer_check_sees_a_method_that_imports_a_stage(monkeypatch):
    """The check above can fail: a module under stages.methods that imports a stage is caught."""
    monkeypatch.setattr(code_closure, "read_source",
                        lambda module: "from stages.probes import sample\nfrom stages.methods import base\n")
    code_closure.forget()
    try:
        assert imports_of("stages.methods.rsum") == {"stages.probes", "stages.methods.base"}
    finally:
        code_closure.forget()
