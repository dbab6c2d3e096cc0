"""A config run from another folder still finds its inputs: a relative input path missing from the
working directory is looked up beside the config and in its project; found nowhere, the error names
every place looked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import project_dirs, resolve_paths
import stages as app

ROOT = Path(__file__).resolve().parent.parent


def test_relative_inputs_are_found_in_the_configs_project_from_another_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = ROOT / "configs" / "default.yaml"
    cfg = resolve_paths(app.load_config(config, ["report.compare_with=[configs/secom_locomo.yaml]"]),
                        search=project_dirs(config))
    assert cfg.corpus.path == str(ROOT / "data" / "sample")  # not tmp_path/data/sample
    assert cfg.report.compare_with == [str(ROOT / "configs" / "secom_locomo.yaml")]
    # Outputs stay where the user runs: the artifacts and the caches are made in the working directory.
    assert cfg.artifacts_dir == str(tmp_path / "artifacts") and cfg.llm.cache_dir == str(tmp_path / ".cache/llm")


def test_the_working_directory_wins_and_a_missing_input_names_every_place_looked(tmp_path, monkeypatch) -> None:
    (tmp_path / "data" / "sample").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    config = ROOT / "configs" / "default.yaml"
    cfg = resolve_paths(app.load_config(config, ["corpus.extra=[{format: sample, path: data/nowhere.jsonl}]"]),
                        search=project_dirs(config))
    assert cfg.corpus.path == str(tmp_path / "data" / "sample")
    missing = cfg.corpus.extra[0]
    assert missing.path == str(tmp_path / "data" / "nowhere.jsonl")
    where = missing.looked_in(missing.path)
    for place in (tmp_path / "data/nowhere.jsonl", ROOT / "configs/data/nowhere.jsonl", ROOT / "data/nowhere.jsonl"):
        assert str(place) in where
    assert project_dirs(None) == [] and project_dirs(config) == [ROOT / "configs", ROOT]


def test_mempipe_names_the_places_it_looked_for_a_missing_corpus_and_the_fetch_command(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "stages.cli", "run", "-c", str(ROOT / "configs" / "default.yaml"),
                          "--set", "corpus.format=locomo", "--set", "corpus.path=data/locomo10.json", "--only", "ingest",
                          "--set", f"artifacts_dir={tmp_path / 'artifacts'}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "no such file or directory (looked in:" in out.stderr and str(ROOT / "data" / "locomo10.json") in out.stderr
    assert "run `mempipe data fetch locomo`" in out.stderr
    # Said before the run starts its backend: no stage began, no Ray was started.
    assert "ingest: started" not in out.stderr and "Ray" not in out.stderr


def test_a_missing_reflection_corpus_is_named_before_any_stage_runs(tmp_path) -> None:
    from pipeline.errors import InputError
    from pipeline.engine.runner import Runner

    missing = tmp_path / "annotated.json"
    cfg = resolve_paths(app.load_config(ROOT / "configs" / "default.yaml", [
        f"artifacts_dir={tmp_path / 'a'}", "ray.executor=inline", "segment.mode=reflection",
        f"segment.reflection.corpus_path={missing}"]))
    with pytest.raises(InputError, match="no such file or directory") as err:
        Runner(cfg, app.registry(cfg)).run(until="guidance")
    assert err.value.file == str(missing)
    assert not (tmp_path / "a").exists()  # not even ingest ran
