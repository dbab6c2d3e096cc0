"""The typed manifest and shard marker: their JSON is the layout on disk, older ones still load, usage sums by role."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.artifacts import MANIFEST, StageDir, atomic_write_json
from pipeline.llm.usage import Usage
from pipeline.manifest import Manifest, ShardMarker

# What the runner writes for an LLM stage (segment, two roles).
WRITTEN = {
    "stage": "segment", "fingerprint": "0123456789abcdef", "upstream": {"guidance": "fedcba9876543210"},
    "code_version": "0.1.0", "config_section": "segment", "tables": {"segments": 7}, "rows": 7, "errors": 1,
    "shards": 2, "parts": {"part-00000.parquet": ["sample-01"], "part-00001.parquet": ["sample-02"]},
    "llm_usage": {
        "judge": {"calls": 2, "cached_calls": 0, "failed_calls": 0, "retries": 0, "reasks": 0, "prompt_tokens": 20,
                  "completion_tokens": 4, "cost_usd": 0.1, "cached_cost_usd": 0.0, "structured_modes": {},
                  "structured_invalid": {}, "structured_fallbacks": {}},
        "segmenter": {"calls": 3, "cached_calls": 1, "failed_calls": 1, "retries": 2, "reasks": 1,
                      "prompt_tokens": 300, "completion_tokens": 40, "cost_usd": 0.2, "cached_cost_usd": 0.05,
                      "structured_modes": {"json_object": 3}, "structured_invalid": {"json_object": 1},
                      "structured_fallbacks": {"json_object": "the endpoint rejected json_schema: HTTP 400"}},
    },
    "roles": {"judge": "gpt-4o-mini", "segmenter": "SmolLM2-135M-Instruct"}, "retry_round": 1,
    "timings": {"finished_at": "2025-01-01T00:00:00+00:00", "started_at": "2024-12-31T23:59:58.500+00:00",
                "wall_s": 1.5, "shard_s": 2.25, "resumed_shards": 1, "shards_per_node": {"node-a": 1}},
    "sessions": 3, "fallback_sessions": 1, "llm_per_episode": {"sample-01": {"calls": 3, "cached_calls": 1}},
}


def test_a_written_manifest_reads_into_fields_and_writes_back_unchanged():
    m = Manifest.from_json(WRITTEN)
    assert m.rows == 7 and m.retry_round == 1 and m.timings.shard_s == 2.25
    assert m.llm_usage is not None and m.llm_usage["segmenter"].structured_modes == {"json_object": 3}
    assert m.stats == {"sessions": 3, "fallback_sessions": 1, "llm_per_episode": {"sample-01": {"calls": 3, "cached_calls": 1}}}
    assert m.to_json() == WRITTEN
    assert json.dumps(m.to_json(), sort_keys=True) == json.dumps(WRITTEN, sort_keys=True)


def test_usage_total_sums_the_roles():
    assert Manifest.from_json(WRITTEN).usage_total() == {
        "calls": 5, "cached_calls": 1, "prompt_tokens": 320, "completion_tokens": 44, "cost_usd": pytest.approx(0.3),
        "batch_calls": 0}
    assert Manifest("ingest", "f").usage_total() == dict.fromkeys(
        ("calls", "cached_calls", "prompt_tokens", "completion_tokens", "cost_usd", "batch_calls"), 0)


def test_an_older_manifest_loads_with_defaults_and_keeps_unknown_keys():
    old = {"stage": "probes", "fingerprint": "abc", "tables": {"probes": 4}, "rows": 4, "errors": 0, "shards": 1,
           "timings": {"finished_at": "x", "wall_s": 1.0}, "some_old_key": [1, 2]}
    m = Manifest.from_json(old)
    assert m.parts is None and m.episode_parts() is None and m.llm_usage is None and m.retry_round == 0
    assert m.timings.resumed_shards == 0 and m.stats == {"some_old_key": [1, 2]}
    assert m.to_json()["some_old_key"] == [1, 2]


def test_episode_parts_inverts_the_layout():
    assert Manifest.from_json(WRITTEN).episode_parts() == {"sample-01": "part-00000.parquet",
                                                          "sample-02": "part-00001.parquet"}


def test_a_stat_named_like_a_field_is_refused():
    with pytest.raises(ValueError, match="clash"):
        Manifest("s", "f", stats={"rows": 3})


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"stage": "s"}', '{"stage": "s", "fingerprint": 3}'])
def test_an_unreadable_manifest_means_not_finished(tmp_path: Path, text: str):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / MANIFEST).write_text(text)
    assert StageDir(tmp_path, "s").manifest() is None


def test_publish_writes_the_json_layout(tmp_path: Path):
    sd = StageDir(tmp_path, "segment")
    sd.open_partial("0123456789abcdef")
    sd.publish(Manifest.from_json(WRITTEN))
    assert json.loads((tmp_path / "segment" / MANIFEST).read_text()) == WRITTEN
    assert sd.manifest() == Manifest.from_json(WRITTEN)
    assert isinstance(sd.manifest().llm_usage["judge"], Usage)  # type: ignore[union-attr]


# A shard marker as pipeline/engine/shard.py wrote it before ShardMarker (an interrupted run resumes from it).
MARKER = {
    "rows": {"segments": 3}, "errors": 1, "episodes": 2,
    "parts": {"part-00004.parquet": ["sample-01", "sample-02"]},
    "llm_usage": {"segmenter": WRITTEN["llm_usage"]["segmenter"]},
    "extra": {"sessions": 3, "llm_per_episode": {"sample-01": {"calls": 3}}}, "wall_s": 0.125,
}


def test_a_written_shard_marker_reads_into_fields_and_writes_back_byte_for_byte(tmp_path: Path):
    sd = StageDir(tmp_path, "segment")
    sd.open_partial("f")
    atomic_write_json(sd.shard_marker(4), MARKER)
    before = Path(sd.shard_marker(4)).read_bytes()
    m = ShardMarker.from_json(sd.finished_shards()[4])
    assert m.rows == {"segments": 3} and m.episodes == 2 and m.wall_s == 0.125 and m.node is None
    assert isinstance(m.llm_usage["segmenter"], Usage)  # type: ignore[index]
    atomic_write_json(sd.shard_marker(4), m.to_json())
    assert Path(sd.shard_marker(4)).read_bytes() == before


def test_an_older_shard_marker_loads_with_defaults():
    m = ShardMarker.from_json({"episodes": 1, "rows": {"responses": 2}, "errors": 0})
    assert m.parts is None and m.llm_usage is None and m.extra == {} and m.wall_s == 0.0
    assert ShardMarker.from_json({**MARKER, "node": "n1"}).node == "n1"  # what a Ray worker reports
    with pytest.raises(ValueError, match="not a shard marker"):
        ShardMarker.from_json({"episodes": 1})
