"""The author's one module: `stages.api` exports exactly the agreed names, each resolves, its row
types name the tables' columns; a method from an outside package (the scaffold's, or any installed
`mempipe.methods` entry point) imports nothing of ours but `stages.api`; `mempipe new-method` writes
the package the docs show, whose own test passes as written."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path
from typing import get_type_hints

import pytest

import stages.api
from pipeline.schemas import EPISODES, TURNS
from stages.cli import main
from stages.probes import PROBES
from stages.scaffold import method_files

ROOT = Path(__file__).resolve().parent.parent
OURS = ("pipeline", "stages")

AGREED = [
    "Method", "MethodSettings", "MethodContext", "EpisodeInput", "ProbeInput", "Answer", "Embed",
    "SNAPSHOT_FIELDS", "after_session", "visible_memory", "MemoryItem", "ReportPanel",
    "Rows", "Turn", "Probe", "Episode",
    "ChatLLM", "LLMResult", "Messages", "LLMError", "attempt",
    "EpisodeStage", "GlobalStage", "StageContext", "Section",
    "tokenize", "bm25_scores", "dense_scores", "hybrid_scores", "minmax", "top_k", "within_budget",
    "within_tokens", "count_tokens",
    "sessions_of", "format_unit", "last_turns", "build_exchanges", "in_time_order",
    "answer_from_memory", "memory_messages",
    "run_method", "FakeChat", "FakeOpenAI", "SAMPLE_CORPUS",
]


def test_the_author_api_exports_exactly_the_agreed_names_and_each_resolves():
    assert stages.api.__all__ == AGREED
    for name in AGREED:
        assert getattr(stages.api, name) is not None, name
    from pipeline.llm.types import LLMError
    from stages.methods.base import Method
    from stages.testing import run_method
    assert (stages.api.LLMError, stages.api.Method, stages.api.run_method) == (LLMError, Method, run_method)
    with pytest.raises(AttributeError):
        stages.api.no_such_name  # noqa: B018


def test_the_row_types_name_every_column_of_the_turns_probes_and_episodes_tables():
    assert list(get_type_hints(stages.api.Turn)) == TURNS.names
    assert list(get_type_hints(stages.api.Probe)) == PROBES.names
    assert list(get_type_hints(stages.api.Episode)) == EPISODES.names


# --- a plug-in imports nothing of ours but stages.api -----------------------------------------------

def imports_besides_the_api(path: Path) -> list[str]:
    """`line: module` for each import in a module's source of one of our packages other than
    `stages.api` (relative imports are the plug-in's own)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = ([f"{node.module}.{alias.name}" for alias in node.names] if node.module == "stages"
                     else [node.module])
        else:
            continue
        found += [f"{node.lineno}: {n}" for n in names
                  if n.partition(".")[0] in OURS and n != "stages.api"]
    return found


def package_sources(module: str) -> list[Path]:
    """The .py files of the top-level package (or the lone module) that holds `module`."""
    spec = find_spec(module.partition(".")[0])
    assert spec is not None and spec.origin, module
    if spec.submodule_search_locations:
        return sorted(p for where in spec.submodule_search_locations for p in Path(where).rglob("*.py"))
    return [Path(spec.origin)]


def test_the_scaffolds_package_imports_nothing_of_ours_but_the_api(tmp_path, capsys):
    assert main(["new-method", "recency_k", "--dir", str(tmp_path / "pkg")]) == 0
    sources = sorted((tmp_path / "pkg").rglob("*.py"))
    assert [p.relative_to(tmp_path / "pkg").as_posix() for p in sources] == [
        "src/recency_k/__init__.py", "src/recency_k/method.py", "tests/test_recency_k.py"]
    for path in sources:
        assert imports_besides_the_api(path) == [], path


def test_every_installed_plug_in_method_imports_nothing_of_ours_but_the_api():
    outside = [ep for ep in entry_points(group="mempipe.methods")
               if not all(p.resolve().is_relative_to(ROOT) for p in package_sources(ep.module))]
    for ep in outside:
        for path in package_sources(ep.module):
            assert imports_besides_the_api(path) == [], f"{ep.name} = {ep.value}: {path}"


def test_the_import_check_names_a_module_that_imports_more_than_the_api(tmp_path):
    module = tmp_path / "sneaky.py"
    module.write_text("import numpy\nfrom stages.api import Method\nfrom stages.methods.base import Answer\n"
                      "import pipeline.retrieval\nfrom stages import api, dialogue\nfrom . import helpers\n")
    assert imports_besides_the_api(module) == ["3: stages.methods.base", "4: pipeline.retrieval", "5: stages.dialogue"]


# --- mempipe new-method ---------------------------------------------------------------------------------

def test_new_method_writes_the_package_the_docs_show(tmp_path, capsys):
    out = tmp_path / "recency"
    assert main(["new-method", "recency_k", "--dir", str(out), "--package", "recency_mem"]) == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "README.md", "pyproject.toml", "src/recency_mem/__init__.py", "src/recency_mem/method.py",
        "tests/test_recency_k.py"]
    project = tomllib.loads((out / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["mempipe.methods"] == {"recency_k": "recency_mem.method:RecencyK"}
    assert project["tool"]["setuptools"]["packages"]["find"]["where"] == ["src"]
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    module = (out / "src" / "recency_mem" / "method.py").read_text()
    # named for the method, not an example renamed; its settings have bounds
    assert "class RecencyK(Method[RecencyKSettings])" in module and "digest" not in module.lower()
    assert "k: int = Field(3, ge=1)" in module and "top_n: int = Field(5, ge=1)" in module
    assert "pip install --no-deps --no-build-isolation -e ." in (out / "README.md").read_text()
    assert main(["new-method", "recency_k", "--dir", str(out)]) == 1  # never overwrites
    assert "already exist; nothing written" in capsys.readouterr().out
    with pytest.raises(ValueError, match="lower_snake_case"):
        method_files("RecencyK")
    with pytest.raises(ValueError, match="one of mempipe's own"):
        method_files("recency_k", "stages")


@pytest.mark.heavy(seconds=8)
def test_the_scaffolds_test_passes_as_written_with_its_package_on_the_path(tmp_path):
    out = tmp_path / "my_notes"
    assert main(["new-method", "my_notes", "--dir", str(out)]) == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(out / "src"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "tests"], cwd=out, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout


def test_the_scaffolds_method_rejects_a_setting_out_of_its_bounds(tmp_path, monkeypatch):
    from pipeline.errors import ConfigError
    from stages import load_config
    from stages.methods import METHODS

    out = tmp_path / "bounded"
    assert main(["new-method", "bounded_k", "--dir", str(out)]) == 0
    monkeypatch.syspath_prepend(str(out / "src"))
    methods = {**METHODS, "bounded_k": importlib.import_module("bounded_k.method").BoundedK()}
    assert load_config(None, ["methods=[bounded_k]", "method.bounded_k.k=2"], methods=methods).method.bounded_k.k == 2
    with pytest.raises(ConfigError) as bad:
        load_config(None, ["methods=[bounded_k]", "method.bounded_k.k=0", "method.bounded_k.kk=4"], methods=methods)
    assert "method.bounded_k.k: Input should be greater than or equal to 1" in str(bad.value)
    assert "method.bounded_k.kk: unknown key; valid: k, top_n" in str(bad.value)


# --- what a newcomer meets on the command line ------------------------------------------------------

def test_an_unknown_key_names_the_keys_its_section_takes_in_a_config_and_in_a_paper_sheet(tmp_path):
    import yaml

    from pipeline.errors import ConfigError
    from pipeline.reproduction import load_sheet
    from stages import load_config

    with pytest.raises(ConfigError) as bad:
        load_config(None, ["method.rsum.max_wordz=3", "roles.judge.modle=x", "llm.local.ctx=1"])
    lines = str(bad.value).splitlines()[1:]
    assert ("  method.rsum.max_wordz: unknown key; valid: max_sentences, max_words, one_shot, response_style, "
            "select_relevant, temperature") in lines
    assert next(ln for ln in lines if ln.startswith("  roles.judge.modle: unknown key; valid: ")).count("model") == 1
    assert any(ln.startswith("  llm.local.ctx: unknown key; valid: ") for ln in lines)
    sheet = tmp_path / "sheet.yaml"
    protocol = {"llm.model": {"value": "x", "source": "S", "sorce": "T"}}
    sheet.write_text(yaml.safe_dump({"paper": {"title": "t", "seed": "s", "reproduces": "r", "protocol": protocol}}))
    with pytest.raises(ConfigError, match=r"paper.protocol.llm.model.sorce: unknown key; valid: source, value"):
        load_sheet(sheet)


class NoSheet(stages.api.Method[stages.api.MethodSettings]):
    """A selected method that no paper sheet names."""

    name = "no_sheet"


def test_check_speaks_of_the_selected_methods_only_and_names_one_without_a_sheet(capsys, monkeypatch):
    from stages.methods import METHODS

    monkeypatch.setitem(METHODS, NoSheet.name, NoSheet())
    default = str(ROOT / "configs" / "default.yaml")
    assert main(["check", "-c", default, "--set", "methods=[rsum,no_sheet]"]) == 0
    out = capsys.readouterr().out.split("\n\nstages of this run")[0].splitlines()
    # settings of methods the run does not select, and of stages it does not hold, are not listed
    assert not [ln for ln in out if ln.startswith(("  method.secom.", "  method.turn.", "  method.theanine.",
                                                    "  segment.", "  compress.", "  roles.segmenter."))]
    # a sheet about stages and roles the run does not hold (SeCom's segmentation) is one line too
    assert any("(compared with configs/secom_dialseg.yaml): about roles.segmenter, score, segment, which this run "
               "does not hold" in ln for ln in out)
    assert any(ln.startswith("Recursively Summarizing") and "(compared with configs/rsum_msc.yaml): " in ln
               for ln in out)  # rsum's paper, checked
    # a sheet about none of the selected methods is one line; so is the method no sheet names
    assert any(ln.startswith("CREEM") and ln.endswith("none of which this run selects") for ln in out)
    assert out[-1] == ("no_sheet: no paper sheet names it (a paper: block or a report.compare_with config); "
                       "nothing to compare")
    assert not [ln for ln in out if ln.startswith("rsum:")]


def test_plan_leaves_out_the_per_method_cost_table_when_no_model_has_a_price():
    from pipeline.plan import Plan, StageEstimate, render
    from pipeline.plan.estimates import RoleEstimate

    unpriced = RoleEstimate("generator", "fake-model", calls=3, prompt_tokens=900, cost_usd=None)
    plan = Plan("r", "/tmp/r", [StageEstimate("respond_recency_k", "new", "", "fp", True, [unpriced], "recency_k")],
                {"prices": "", "cache": ""})
    text = render(plan)
    assert "where the money goes" not in text and "per role:" in text and "no price" in text
    priced = RoleEstimate("generator", "gpt-4o", calls=3, prompt_tokens=900, cost_usd=0.01,
                          by_method={"recency_k": 0.01})
    plan.stages[0].roles = [priced]
    assert "where the money goes, per method" in render(plan)
