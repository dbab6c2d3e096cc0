"""`mempipe data fetch`: corpora downloaded from a local HTTP mirror (nothing here reaches the network),
sha256-checked, pinned when unverified, not downloaded twice; the registry matches the configs."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import socket
import tarfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.corpus import load_corpus, sources
from pipeline.corpus.fetch import (
    PINS_FILE,
    DataFetchError,
    UnknownCorpusError,
    add_data_command,
    cmd_data,
    fetch,
    missing_corpus_hint,
)
from pipeline.corpus.sources import CorpusSource, RemoteFile

ROOT = Path(__file__).resolve().parent.parent
LOCOMO = ROOT / "tests" / "fixtures" / "corpora" / "locomo" / "locomo_mini.json"


def sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def add_source(monkeypatch: pytest.MonkeyPatch, *files: RemoteFile, name: str = "toy",
               fmt: str | None = None, path: str | None = None) -> None:
    monkeypatch.setitem(sources.REGISTRY, name, CorpusSource(name, "a test corpus", "http://example.invalid",
                                                             fmt, path, files=files))


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="mempipe")
    add_data_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    assert args.func is cmd_data and args.debug is False  # stages.cli's main reads args.debug
    return args.func(args)


def test_locomo_from_a_mirror_is_written_checked_and_not_sent_twice(mirror, tmp_path, capsys):
    body = LOCOMO.read_bytes()
    mirror.serve(sources.REGISTRY["locomo"].files[0].url, body)
    data = tmp_path / "data"
    assert run_cli("data", "fetch", "locomo", "--dir", str(data), "--mirror", mirror.url, "--no-progress") == 0
    out = capsys.readouterr().out
    assert (data / "locomo10.json").read_bytes() == body
    # LoCoMo's hash is not recorded: the first fetch pins it, every later one checks it.
    pins = json.loads((data / PINS_FILE).read_text())
    assert pins["locomo10.json"]["sha256"] == sha(body) and "downloaded" in out and "pinned" in out
    assert f"corpus.path={data / 'locomo10.json'}" in out
    assert sum(mirror.requests.values()) == 1

    assert run_cli("data", "fetch", "locomo", "--dir", str(data), "--mirror", mirror.url, "--no-progress") == 0
    assert sum(mirror.requests.values()) == 1  # the second call sent nothing
    assert "present, not downloaded; sha256" in capsys.readouterr().out
    assert load_corpus("locomo", data / "locomo10.json").episodes  # the loader reads what was fetched


def test_a_recorded_checksum_is_checked_and_a_match_is_not_downloaded_again(mirror, tmp_path, monkeypatch):
    body = b'{"dialogue": 1}\n'
    url = "https://files.example.org/corpus/toy.json"
    add_source(monkeypatch, RemoteFile(url, "toy/toy.json", sha(body), sha256_source="the test"))
    mirror.serve(url, body)
    [got] = fetch("toy", tmp_path, progress=False, base_url_override=mirror.url)
    assert got.path.read_bytes() == body and got.downloaded and got.check == "recorded"
    assert not (tmp_path / PINS_FILE).exists()  # a recorded hash needs no pin
    [again] = fetch("toy", tmp_path, progress=False, base_url_override=mirror.url)
    assert not again.downloaded and mirror.requests["/corpus/toy.json"] == 1


def test_a_wrong_checksum_fails_naming_both_hashes_and_leaves_no_file(mirror, tmp_path, monkeypatch):
    body, recorded = b"tampered", sha(b"original")
    url = "https://files.example.org/corpus/toy.json"
    add_source(monkeypatch, RemoteFile(url, "toy.json", recorded, sha256_source="the test"))
    mirror.serve(url, body)
    with pytest.raises(DataFetchError) as e:
        fetch("toy", tmp_path, progress=False, base_url_override=mirror.url)
    message = str(e.value)
    assert "toy.json" in message and sha(body) in message and recorded in message and "discarded" in message
    assert [p.name for p in tmp_path.iterdir()] == []  # neither the file nor pooch's temporary one


def test_an_unverified_file_is_pinned_and_a_changed_one_refused(mirror, tmp_path, monkeypatch, capsys):
    url = "https://files.example.org/corpus/toy.json"
    add_source(monkeypatch, RemoteFile(url, "toy.json", None))
    mirror.serve(url, b"first release")
    [got] = fetch("toy", tmp_path, progress=False, base_url_override=mirror.url)
    assert got.check == "pinned now"
    pinned = json.loads((tmp_path / PINS_FILE).read_text())["toy.json"]["sha256"]
    assert pinned == sha(b"first release")

    # The publisher changes the file; a fetch without the local copy must refuse the new one.
    mirror.serve(url, b"silently changed")
    (tmp_path / "toy.json").unlink()
    assert run_cli("data", "fetch", "toy", "--dir", str(tmp_path), "--mirror", mirror.url, "--no-progress") == 1
    err = capsys.readouterr().err
    assert "toy.json" in err and pinned in err and sha(b"silently changed") in err and "pinned" in err
    assert not (tmp_path / "toy.json").exists()

    # A local copy edited after its pin is downloaded again (pooch's update) and checked against the pin.
    mirror.serve(url, b"first release")
    (tmp_path / "toy.json").write_bytes(b"edited locally")
    [again] = fetch("toy", tmp_path, progress=False, base_url_override=mirror.url)
    assert again.downloaded and again.check == "pinned" and (tmp_path / "toy.json").read_bytes() == b"first release"


def test_the_mirror_comes_from_the_environment(mirror, tmp_path, monkeypatch):
    url = "https://files.example.org/corpus/toy.json"
    add_source(monkeypatch, RemoteFile(url, "toy.json", sha(b"x"), sha256_source="the test"))
    mirror.serve(url, b"x")
    monkeypatch.setenv("MEMPIPE_DATA_MIRROR", mirror.url + "/")
    assert fetch("toy", tmp_path, progress=False)[0].downloaded


def test_msc_is_extracted_from_its_archive_and_read_by_the_loader(mirror, tmp_path, monkeypatch):
    record = {"dialog": [{"id": "Speaker 1", "text": "hi"}, {"id": "Speaker 2", "text": "hello"}],
              "previous_dialogs": [{"dialog": [{"text": "a"}, {"text": "b"}], "time_num": 3, "time_unit": "days"}],
              "metadata": {"initial_data_id": "train_1"}}
    member = sources.REGISTRY["msc"].files[0].member
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        payload = (json.dumps(record) + "\n").encode()
        info = tarfile.TarInfo(member)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    archive = buf.getvalue()
    real = sources.REGISTRY["msc"].files[0]
    # The fixture archive is not ParlAI's: the same entry with the fixture's hash.
    monkeypatch.setitem(sources.REGISTRY, "msc", CorpusSource(
        "msc", "", "", "msc", "msc/session_5_test.jsonl",
        files=(RemoteFile(real.url, real.fname, sha(archive), "the test", "untar", real.member, real.output),)))
    mirror.serve(real.url, archive)
    [got] = fetch("msc", tmp_path, progress=False, base_url_override=mirror.url)
    assert got.path == tmp_path / "msc" / "session_5_test.jsonl"
    assert {p.name for p in (tmp_path / "msc").iterdir()} == {"msc_v0.1.tar.gz", "session_5_test.jsonl"}
    assert load_corpus("msc", got.path).episodes[0]["episode_id"] == "msc-train_1"
    got.path.unlink()  # the archive is kept: the member is extracted again without a request
    fetch("msc", tmp_path, progress=False, base_url_override=mirror.url)
    assert got.path.is_file() and sum(mirror.requests.values()) == 1


def test_long_mt_bench_parquet_becomes_json_lines_the_loader_reads(mirror, tmp_path, monkeypatch):
    rows = [{"conversation_id": "c1", "sessions": [["[human]: hi\n[bot]: hello"]],
             "questions": ["what did I say?"], "answers": ["hi"], "turns": [["[human]: hi\n[bot]: hello"]]}]
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    real = sources.REGISTRY["longmtbench"].files[0]
    monkeypatch.setitem(sources.REGISTRY, "longmtbench", CorpusSource(
        "longmtbench", "", "", "longmtbench", real.target, files=(RemoteFile(
            real.url, real.fname, sha(buf.getvalue()), "the test", real.unpack, None, real.output),)))
    mirror.serve(real.url, buf.getvalue())
    [got] = fetch("longmtbench", tmp_path, progress=False, base_url_override=mirror.url)
    assert [json.loads(line) for line in got.path.read_text().splitlines()] == rows
    corpus = load_corpus("longmtbench", got.path)
    assert corpus.episodes[0]["episode_id"] == "longmtbench-c1" and len(corpus.qa) == 1


def test_unknown_names_and_empty_calls_list_the_known_ones(tmp_path, capsys):
    assert run_cli("data", "fetch", "lcomo", "--dir", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "unknown corpus 'lcomo'" in err and "locomo" in err and "longmemeval-s" in err
    assert run_cli("data", "fetch", "--dir", str(tmp_path)) == 2
    with pytest.raises(UnknownCorpusError):
        fetch("nope", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_teabag_names_where_to_get_it_instead_of_downloading(tmp_path, capsys):
    assert run_cli("data", "fetch", "teabag", "--dir", str(tmp_path)) == 1
    assert "LangAGI-Lab/teafarm" in capsys.readouterr().err


def test_an_unreachable_host_fails_at_once_in_one_line(no_network, tmp_path, monkeypatch, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    start = time.monotonic()
    assert run_cli("data", "fetch", "locomo", "--dir", str(tmp_path), "--mirror", dead, "--no-progress") == 1
    err = capsys.readouterr().err.strip()
    assert time.monotonic() - start < 10
    assert len(err.splitlines()) == 1 and f"{dead}/snap-research/locomo/main/data/locomo10.json" in err
    assert "offline" in err and not (tmp_path / "locomo10.json").exists()


def test_a_missing_file_on_the_mirror_is_named_with_its_http_status(mirror, tmp_path, capsys):
    assert run_cli("data", "fetch", "dialseg711", "--dir", str(tmp_path), "--mirror", mirror.url, "--no-progress") == 1
    assert "HTTP 404" in capsys.readouterr().err


def test_list_prints_every_corpus_with_its_files_checksums_and_configs(capsys):
    assert run_cli("data", "list") == 0
    out = capsys.readouterr().out
    for name in ("locomo", "msc", "cc", "longmemeval-s", "longmemeval-m", "longmemeval-oracle", "dialseg711",
                 "tiage", "superdialseg", "longmtbench", "teabag"):
        assert f"\n{name}  [" in "\n" + out
    assert "msc  [verified]" in out and "e640e37cf431" in out and "locomo  [unverified]" in out
    assert "secom_locomo.yaml" in out
    # a corpus of many files (BEAM: two a conversation) lists a few and counts the rest
    beam = out.split("\nbeam  [", 1)[1].split("\nbeam-10m  [", 1)[0]
    assert beam.count("https://") == 3 and "... and 177 more files (151 with a recorded sha256, 26 pinned" in beam
    assert run_cli("data", "fetch", "--list") == 0 and capsys.readouterr().out == out


def _config_corpora() -> list[tuple[str, str, str]]:
    """(config file, corpus.format, corpus.path) of every config and each of its corpus.extra."""
    found = []
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        corpus = (yaml.safe_load(path.read_text()) or {}).get("corpus") or {}
        for c in [corpus, *(corpus.get("extra") or [])]:
            if c.get("format") and c.get("format") != "sample":
                found.append((path.name, c["format"], c["path"]))
    return found


def test_every_config_corpus_is_fetched_to_the_path_it_names():
    corpora = _config_corpora()
    assert corpora
    for config, fmt, path in corpora:
        hint = missing_corpus_hint(fmt, path)
        assert hint is not None and hint.startswith("run `mempipe data fetch "), (config, fmt)
        name = hint.split("fetch ", 1)[1].rstrip("`").split()[0]
        source = sources.REGISTRY[name]
        assert source.corpus_format == fmt and f"data/{source.corpus_path}" == path, (config, path)
        assert config in source.configs, (config, name)
    for source in sources.REGISTRY.values():
        for config in source.configs:
            assert (ROOT / "configs" / config).is_file(), (source.name, config)
        for f in source.files:
            assert f.sha256 is None or (len(f.sha256) == 64 and f.sha256_source), (source.name, f.fname)


def test_missing_corpus_hints():
    assert missing_corpus_hint("locomo") == "run `mempipe data fetch locomo`"
    assert missing_corpus_hint("msc", "/data/msc/session_5_test.jsonl") == "run `mempipe data fetch msc --dir /data`"
    assert missing_corpus_hint("dialseg", "data/tiage/test.json") == "run `mempipe data fetch tiage`"
    assert missing_corpus_hint("dialseg") == "run `mempipe data fetch dialseg711` (or tiage, superdialseg)"
    assert missing_corpus_hint("sample") is None


# -- resume ---------------------------------------------------------------------------------------------

def _big_body() -> bytes:
    return b"".join(b"line %06d of a corpus file that is long enough to take several chunks\n" % i
                    for i in range(12_000))  # ~850 KB: many of the downloader's 64 KiB chunks


def test_a_cut_download_keeps_its_bytes_and_the_next_fetch_asks_only_for_the_rest(mirror, tmp_path, monkeypatch,
                                                                                   capsys):
    body = _big_body()
    url = "https://files.example.org/corpus/big.json"
    add_source(monkeypatch, RemoteFile(url, "big/big.json", sha(body), sha256_source="the test"))
    mirror.serve(url, body)
    mirror.cut["/corpus/big.json"] = len(body) // 2
    assert run_cli("data", "fetch", "toy", "--dir", str(tmp_path), "--mirror", mirror.url, "--no-progress") == 1
    err = capsys.readouterr().err.strip()
    part = tmp_path / "big" / "big.json.part"
    assert len(err.splitlines()) == 1 and "was cut after" in err and f"of {len(body):,} bytes" in err
    assert str(part) in err and "run the same command again" in err
    kept = part.stat().st_size
    assert 0 < kept <= len(body) // 2 and part.read_bytes() == body[:kept]
    assert not (tmp_path / "big" / "big.json").exists()  # only the part: nothing unchecked is in place

    [got] = fetch("toy", tmp_path, progress=False, base_url_override=mirror.url)
    assert mirror.log == [("/corpus/big.json", None, len(body) // 2),
                          ("/corpus/big.json", f"bytes={kept}-", len(body) - kept)]  # only the rest was sent
    assert got.downloaded and got.check == "recorded" and got.sha256 == sha(body)
    assert got.path.read_bytes() == body
    assert sorted(p.name for p in (tmp_path / "big").iterdir()) == ["big.json"]  # the part is gone


def test_a_resumed_download_is_checked_and_a_bad_one_discarded(mirror, tmp_path, monkeypatch):
    body = _big_body()
    url = "https://files.example.org/corpus/big.json"
    add_source(monkeypatch, RemoteFile(url, "big.json", sha(body), sha256_source="the test"))
    (tmp_path / "big.json.part").write_bytes(b"X" * 1000)  # a part from another file: the rest cannot fix it
    mirror.serve(url, body)
    with pytest.raises(DataFetchError, match="sha256 mismatch"):
        fetch("toy", tmp_path, progress=False, base_url_override=mirror.url)
    assert mirror.log == [("/corpus/big.json", "bytes=1000-", len(body) - 1000)]
    assert list(tmp_path.iterdir()) == []  # discarded, part included: the next fetch starts from zero
    assert fetch("toy", tmp_path, progress=False, base_url_override=mirror.url)[0].path.read_bytes() == body
    assert mirror.log[-1] == ("/corpus/big.json", None, len(body))


def test_a_server_without_ranges_sends_the_whole_file_again(mirror, tmp_path, monkeypatch):
    body = _big_body()
    url = "https://files.example.org/corpus/big.json"
    add_source(monkeypatch, RemoteFile(url, "big.json", None))
    (tmp_path / "big.json.part").write_bytes(body[:5000])
    mirror.serve(url, body)
    mirror.ranges = False  # answers 200 to a range request
    [got] = fetch("toy", tmp_path, progress=False, base_url_override=mirror.url)
    assert mirror.log == [("/corpus/big.json", "bytes=5000-", len(body))]
    assert got.path.read_bytes() == body and got.check == "pinned now" and got.sha256 == sha(body)


def test_a_part_that_is_already_whole_is_used_after_a_416(mirror, tmp_path, monkeypatch):
    body = _big_body()
    url = "https://files.example.org/corpus/big.json"
    add_source(monkeypatch, RemoteFile(url, "big.json", sha(body), sha256_source="the test"))
    (tmp_path / "big.json.part").write_bytes(body)  # cut after the last byte, before the move
    mirror.serve(url, body)
    [got] = fetch("toy", tmp_path, progress=False, base_url_override=mirror.url)
    assert mirror.log == [("/corpus/big.json", f"bytes={len(body)}-", 0)]
    assert got.path.read_bytes() == body and not (tmp_path / "big.json.part").exists()


def test_a_part_longer_than_the_file_is_dropped_and_fetched_from_zero(mirror, tmp_path, monkeypatch):
    body = b"short file"
    url = "https://files.example.org/corpus/toy.json"
    add_source(monkeypatch, RemoteFile(url, "toy.json", sha(body), sha256_source="the test"))
    stale = b"a longer stale part of something else"
    (tmp_path / "toy.json.part").write_bytes(stale)
    mirror.serve(url, body)
    [got] = fetch("toy", tmp_path, progress=False, base_url_override=mirror.url)
    assert [r for _, r, _ in mirror.log] == [f"bytes={len(stale)}-", None] and got.path.read_bytes() == body


def test_the_progress_bar_starts_at_the_bytes_already_there(mirror, tmp_path, monkeypatch, capsys):
    body = _big_body()
    url = "https://files.example.org/corpus/big.json"
    add_source(monkeypatch, RemoteFile(url, "big.json", sha(body), sha256_source="the test"))
    (tmp_path / "big.json.part").write_bytes(body[: len(body) // 2])
    mirror.serve(url, body)
    fetch("toy", tmp_path, progress=True, base_url_override=mirror.url)
    bar = capsys.readouterr().err
    first = bar.replace("\r", "\n").strip().splitlines()[0]
    assert first.startswith("big.json:  50%"), first  # tqdm's first draw: already half there
    assert "100%" in bar


def test_memoryagentbench_fetches_its_splits_and_entity2id_beside_the_directory_the_loader_reads(mirror, tmp_path):
    source = sources.REGISTRY["memoryagentbench"]
    fixture = ROOT / "tests" / "fixtures" / "corpora" / "memoryagentbench"
    entities = json.dumps({"http://dbpedia.org/resource/Inception": 7001}).encode()
    for f in source.files:
        if f.unpack == "parquet_to_jsonl":
            rows = [json.loads(line) for line in (fixture / f"{Path(f.fname).stem}.jsonl").read_text().splitlines()]
            buf = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(rows), buf)
            mirror.serve(f.url, buf.getvalue())
        else:
            mirror.serve(f.url, entities)
    got = fetch("memoryagentbench", tmp_path, progress=False, base_url_override=mirror.url)
    [entity_file] = [g for g in got if g.path.name == "entity2id.json"]
    assert entity_file.path == tmp_path / "memoryagentbench_entities" / "entity2id.json"
    assert entity_file.path.read_bytes() == entities  # as published
    assert entity_file.check == "pinned now" and entity_file.remote.url.endswith(
        "/MemoryAgentBench/resolve/main/entity2id.json")
    pins = json.loads((tmp_path / PINS_FILE).read_text())
    assert pins["memoryagentbench_entities/entity2id.json"]["sha256"] == sha(entities)
    # the corpus directory holds only the splits: every episode of the fixture loads
    corpus = load_corpus("memoryagentbench", tmp_path / source.corpus_path)
    assert len(corpus.episodes) == 6
    assert fetch("memoryagentbench", tmp_path, progress=False, base_url_override=mirror.url)
    assert sum(mirror.requests.values()) == 5  # nothing asked twice
