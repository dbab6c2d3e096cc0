"""A full disk or a read-only folder: one clear error naming the path, nothing half published,
no corrupt cache entry, and the next run (space freed) resumes without paying twice."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import diskcache
import pyarrow.parquet as pq
import pytest

from conftest import segmenting_responder
from pipeline.llm import cache as cache_module
from stages.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _args(tmp_path: Path, fake_llm, name: str) -> list[str]:
    return ["-c", str(ROOT / "configs" / "default.yaml"),
            "--set", f"artifacts_dir={tmp_path / name}", "--set", "llm.provider=openai",
            "--set", f"llm.base_url={fake_llm.base_url}", "--set", "llm.api_key_env=MEMPIPE_TEST_KEY",
            "--set", f"llm.cache_dir={tmp_path / (name + '-cache')}", "--set", "llm.model=fake-model",
            "--set", "ray.episodes_per_shard=1", "--set", "ray.executor=inline",
            "--set", "corpus.limit=null", "--set", "teabag.enabled=false"]


@pytest.fixture
def endpoint(fake_llm, monkeypatch):
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    fake_llm.responder = segmenting_responder
    return fake_llm


def _reference_calls(tmp_path, endpoint) -> int:
    assert main(["run", "--until", "segment", *_args(tmp_path, endpoint, "ref")]) == 0
    calls = endpoint.count()
    endpoint.reset()
    return calls


def _stop_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    stop = [line for line in err.splitlines() if line.startswith("mempipe:")]
    assert len(stop) == 1, err
    return stop[0]


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "No space left on device"),
                                          (errno.EROFS, "Read-only file system")])
def test_a_refused_artifact_write_names_the_path_publishes_nothing_and_the_next_run_resumes(
        tmp_path, endpoint, capsys, monkeypatch, code, words):
    reference = _reference_calls(tmp_path, endpoint)
    real_write = pq.write_table
    written: list[str] = []

    def full_disk(table, where, **kw):
        if "segment.partial" in str(where) and len(written) >= 2:  # two shards fit, then the disk is full
            raise OSError(code, words)
        written.append(str(where))
        return real_write(table, where, **kw)

    monkeypatch.setattr(pq, "write_table", full_disk)
    assert main(["run", "--until", "segment", *_args(tmp_path, endpoint, "run")]) == 1
    line = _stop_line(capsys)
    assert "cannot write " in line and "segment.partial" in line and words in line and "run the same command again" in line
    run_dir = tmp_path / "run" / "default"
    assert not (run_dir / "segment").exists()  # nothing half published
    assert not list((run_dir / "segment.partial").rglob("*.tmp"))  # no half-written file left behind

    monkeypatch.setattr(pq, "write_table", real_write)  # space freed
    assert main(["run", "--until", "segment", *_args(tmp_path, endpoint, "run")]) == 0
    assert (run_dir / "segment" / "_manifest.json").exists()
    assert endpoint.count() == reference  # every call made once over both runs


def test_a_full_cache_disk_stops_the_run_with_the_cache_path_and_keeps_every_entry_valid(
        tmp_path, endpoint, capsys, monkeypatch):
    reference = _reference_calls(tmp_path, endpoint)
    real_set = diskcache.Cache.set
    stored: list[str] = []

    def full(self, key, value, *a, **k):
        if len(stored) >= 5:
            raise sqlite3.OperationalError("database or disk is full")
        stored.append(key)
        return real_set(self, key, value, *a, **k)

    monkeypatch.setattr(diskcache.Cache, "set", full)
    assert main(["run", "--until", "segment", *_args(tmp_path, endpoint, "run")]) == 1
    line = _stop_line(capsys)
    assert f"LLM cache {tmp_path / 'run-cache'}" in line and "database or disk is full" in line
    assert not (tmp_path / "run" / "default" / "segment").exists()

    monkeypatch.setattr(diskcache.Cache, "set", real_set)
    store = cache_module.DiskCallCache(tmp_path / "run-cache")
    keys = list(store._cache.iterkeys())
    assert all(store.get_many_raw([k])[0] is not None for k in keys)  # every stored entry is whole
    store.close()
    assert main(["run", "--until", "segment", *_args(tmp_path, endpoint, "run")]) == 0
    # Answers that could not be stored were asked again, and nothing else was.
    assert endpoint.count() <= reference + 2 * len(keys) and (tmp_path / "run" / "default" / "segment").exists()


def test_a_read_only_cache_folder_is_one_line_not_a_traceback(tmp_path, endpoint, capsys, monkeypatch):
    def read_only(*a, **k):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(cache_module, "_open", read_only)
    assert main(["run", "--until", "segment", *_args(tmp_path, endpoint, "ro")]) == 1
    line = _stop_line(capsys)
    assert f"LLM cache {tmp_path / 'ro-cache'}" in line and "readonly" in line


def test_a_second_run_on_the_same_run_directory_refuses_while_the_first_holds_it(tmp_path, endpoint, capsys):
    from pipeline.artifacts import run_lock

    run_dir = tmp_path / "busy" / "default"
    with run_lock(run_dir):  # the first run, still going
        assert main(["run", "--until", "segment", *_args(tmp_path, endpoint, "busy")]) == 1
        line = _stop_line(capsys)
        assert f"run directory {run_dir} is in use by `mempipe run` pid" in line and "run_name" in line
        assert endpoint.count() == 0 and not (run_dir / "ingest").exists()  # it touched nothing
    assert main(["run", "--until", "segment", *_args(tmp_path, endpoint, "busy")]) == 0  # free again
