"""The `mempipe` command line: run, status, export, cache, config errors, bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import ray

from stages.cli import main
from stages import load_config
from pipeline.errors import ConfigError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "corpora"
ROOT = Path(__file__).resolve().parent.parent


def test_batch_mode_on_the_embedded_server_is_refused_at_load_naming_the_role():
    with pytest.raises(ConfigError, match=r"roles\.judge: batch: true needs .*Batch API.*provider: local"):
        load_config(None, ["roles.judge.batch=true"])
    with pytest.raises(ConfigError, match=r"\n  llm: batch: true"):
        load_config(None, ["llm.batch=true"])
    cfg = load_config(None, ["roles.judge.batch=true", "roles.judge.provider=openai", "roles.judge.model=gpt-4o"])
    assert cfg.role("judge").batch and not cfg.role("generator").batch


def test_unknown_and_invalid_config_keys_are_named():
    with pytest.raises(ConfigError, match=r"llm\.temprature: unknown key"):
        load_config(None, ["llm.temprature=0.5"])
    with pytest.raises(ConfigError, match=r"probes\.max_per_episode"):
        load_config(None, ["probes.max_per_episode=lots"])
    with pytest.raises(ConfigError, match=r"corpus\.format"):
        load_config(None, ["corpus.format=csv"])
    cfg = load_config(None, ["llm.temperature=0.7", "score.retrieval_k=[2, 4]", "corpus.limit=null"])
    assert cfg.llm.temperature == 0.7 and cfg.score.retrieval_k == [2, 4] and cfg.corpus.limit is None


def test_unknown_key_in_yaml_file(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("run_name: x\nsegment:\n  max_turns_per_cal: 10\n")
    assert main(["status", "-c", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert "segment.max_turns_per_cal: unknown key" in err and str(cfg) in err


def _locomo_args(tmp_path: Path) -> list[str]:
    return ["--set", f"artifacts_dir={tmp_path / 'a'}", "--set", "corpus.format=locomo",
            "--set", f"corpus.path={FIXTURES / 'locomo' / 'locomo_mini.json'}", "--set", "run_name=loc"]


def test_ingest_locomo_status_and_export(tmp_path, capsys, ray_local):
    args = _locomo_args(tmp_path)
    assert main(["run", "--only", "ingest", *args]) == 0
    capsys.readouterr()
    assert main(["status", *args]) == 0
    lines = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()[2:]}
    assert lines["ingest"] == "done" and lines["report"] == "missing" and "segment" not in lines  # no method reads it

    raw = json.loads((FIXTURES / "locomo" / "locomo_mini.json").read_text())
    n_turns = sum(len(v) for s in raw for k, v in s["conversation"].items() if k.startswith("session_") and isinstance(v, list))
    n_qa = sum(len(s["qa"]) for s in raw)
    assert main(["export", "ingest", "--out", str(tmp_path / "out"), *args]) == 0
    turns = pq.read_table(tmp_path / "out" / "turns.parquet")
    qa = pq.read_table(tmp_path / "out" / "qa.parquet")
    assert turns.num_rows == n_turns and qa.num_rows == n_qa
    assert pq.read_table(tmp_path / "out" / "episodes.parquet").num_rows == len(raw)
    evidence = sorted(e for s in raw for q in s["qa"] for e in q.get("evidence", []))
    assert sorted(e for row in qa.column("evidence").to_pylist() for e in (row or [])) == evidence
    assert "turns.parquet" in (tmp_path / "out" / "README.md").read_text()

    # A second identical run does no work.
    capsys.readouterr()
    assert main(["run", "--only", "ingest", *args]) == 0
    assert "ingest       skipped" in capsys.readouterr().out


def test_bad_input_stops_before_publishing(tmp_path, capsys, ray_local):
    bad = tmp_path / "bad.jsonl"
    good = (FIXTURES / "sample" / "episodes.jsonl").read_text().splitlines()[0]
    record = json.loads(good)
    record["sessions"][1]["turns"][0]["speaker"] = "Stranger"
    bad.write_text(good + "\n" + json.dumps({**record, "episode_id": "ep-bad"}) + "\n")
    code = main(["run", "--only", "ingest", "--set", f"artifacts_dir={tmp_path / 'a'}",
                 "--set", "corpus.format=sample", "--set", f"corpus.path={bad}"])
    assert code == 1
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and "ep-bad" in err and "speaker" in err
    assert not (tmp_path / "a" / "default" / "ingest").exists()


@pytest.mark.heavy(seconds=8)
def test_input_error_in_a_ray_task_prints_one_line_naming_file_record_field(tmp_path, capsys, ray_local):
    """A fresh `mempipe` process, so ingest runs as a Ray task exactly as a user runs it, and what
    Ray's workers print reaches its stderr too: a driver on this session's Ray, as `ray job submit`
    starts one on a running cluster (a local Ray of its own would add seconds of start-up, nothing
    to the check)."""
    raw = json.loads((FIXTURES / "locomo" / "locomo_mini.json").read_text())
    del raw[0]["conversation"]["session_2"][1]["speaker"]
    bad = tmp_path / "locomo_bad.json"
    bad.write_text(json.dumps(raw))
    args = ["run", "--only", "ingest", "--set", f"artifacts_dir={tmp_path / 'a'}", "--set", "corpus.format=locomo",
            "--set", f"corpus.path={bad}", "--set", "ray.num_cpus=1"]
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "stages.cli", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stderr
    # The progress line of the stage that started, then one line that says it all.
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[:-1] == ["ingest: started, 1 of 1 shards to run"], proc.stderr
    lines = lines[-1:]
    assert re.fullmatch(r"mempipe: error: file .*locomo_bad\.json, record .+, field '.*speaker': .+", lines[0]), lines[0]
    assert "Traceback" not in proc.stderr and "Unserializable" not in proc.stderr
    assert not (tmp_path / "a" / "default" / "ingest").exists()
    # --debug shows where it came from (on this session's Ray: the driver prints it).
    assert main([*args, "--debug"]) == 1 and "Traceback" in capsys.readouterr().err


def test_project_errors_survive_pickling():
    import pickle

    from pipeline.errors import InputError
    from pipeline.llm.types import LLMError

    err = pickle.loads(pickle.dumps(InputError("f.json", "conv-1", "speaker", "required field is missing")))
    assert (err.file, err.record, err.field) == ("f.json", "conv-1", "speaker")
    assert str(err) == "file f.json, record conv-1, field 'speaker': required field is missing"
    llm_err = pickle.loads(pickle.dumps(LLMError("bad", raw="{")))
    assert (llm_err.reason, llm_err.raw) == ("bad", "{")


def test_missing_corpus_file(tmp_path, capsys):
    code = main(["run", "--only", "ingest", "--set", f"artifacts_dir={tmp_path / 'a'}",
                 "--set", f"corpus.path={tmp_path / 'nope.jsonl'}"])
    assert code == 1
    err = capsys.readouterr().err
    assert "nope.jsonl" in err and "no such file or directory" in err
    assert "ingest: started" not in err  # found before the run started Ray or any stage


def test_cache_stats_export_import_replays_offline(tmp_path, fake_llm, capsys, monkeypatch):
    import asyncio

    from conftest import TEST_KEY_ENV, llm_config
    from pipeline.llm.shared import make_client

    monkeypatch.setenv(TEST_KEY_ENV, "sk-cli-test")
    messages = [{"role": "user", "content": "remember the cello"}]

    async def ask(cache_dir: Path):
        client = make_client(llm_config(fake_llm, cache_dir=str(cache_dir)))
        try:
            return await client.chat(messages)
        finally:
            await client.aclose()

    first = asyncio.run(ask(tmp_path / "c1"))
    assert not first.cached and fake_llm.count() == 1
    c1 = ["--set", f"llm.cache_dir={tmp_path / 'c1'}"]
    assert main(["cache", "stats", *c1]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 1
    assert main(["cache", "export", str(tmp_path / "calls.parquet"), *c1]) == 0
    assert main(["cache", "import", str(tmp_path / "calls.parquet"), "--set", f"llm.cache_dir={tmp_path / 'c2'}"]) == 0
    replay = asyncio.run(ask(tmp_path / "c2"))
    assert replay.cached and replay.text == first.text and fake_llm.count() == 1


def test_every_shipped_config_is_valid():
    configs = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))
    assert len(configs) >= 2
    for path in configs:
        load_config(path)


def test_the_frameworks_cli_alone_says_which_command_to_run() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "run"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "python -m stages.cli" in out.stderr
