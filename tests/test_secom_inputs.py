"""What SeCom's stages read: SuperDialseg's released files as they are, and reflection guidance
that must exist when it is configured (no silent zero-shot run)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import stages
from pipeline.corpus import load_corpus
from pipeline.errors import ConfigError, InputError, PipelineError
from pipeline.engine.runner import Runner
from stages.methods.secom.stages.guidance import GUIDANCE_FILE
from stages.methods.secom.stages.segment import load_guidance, stored_guidance
from stages.methods.secom.stages.segment_settings import SegmentConfig
from stages.dialogue import sessions_of
from stages.scoring.score import segmentation_rows

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def turn(text: str, role: str, label: int) -> dict:
    return {"turn_id": 0, "role": role, "utterance": text, "segmentation_label": label, "topic_id": 0}


RELEASED = {"dial_data": {"tiage": [
    {"dial_id": "", "turns": [turn("I love hiking.", "user", 0), turn("Me too, mountains?", "agent", 1),
                              turn("Did you see the match?", "user", 0), turn("Yes, great goal.", "agent", 0)]},
    {"dial_id": "", "turns": [turn("Any book tips?", "user", 0), turn("Try Dune.", "agent", 0),
                              turn("Thanks!", "user", 0)]},
]}}


def test_superdialsegs_released_file_loads_as_is(tmp_path: Path) -> None:
    """{"dial_data": {name: [dialogue, ...]}}: one episode, one session per dialogue, in file order;
    label 1 ends a segment, so the next utterance starts one."""
    path = tmp_path / "tiage_test.json"
    path.write_text(json.dumps(RELEASED))
    c = load_corpus("dialseg", path)
    assert [e["episode_id"] for e in c.episodes] == ["dialseg-tiage"] and c.episodes[0]["n_sessions"] == 2
    by_session = sessions_of(c.turns)
    assert [t["gold_topic_boundary"] for t in by_session[1]] == [True, False, True, False]
    assert [t["gold_topic_boundary"] for t in by_session[2]] == [True, False, False]
    assert [t["speaker"] for t in by_session[2]] == ["user", "agent", "user"]
    assert by_session[1][2]["text"] == "Did you see the match?"

    # Every dialogue is scored on its own, as a session (a one-segment prediction for each).
    segments = [{"session_idx": s, "segment_idx": 0, "turn_start": 0, "turn_end": len(ts) - 1, "fallback": False}
                for s, ts in by_session.items()]
    rows = segmentation_rows("dialseg-tiage", "dialseg", by_session, segments)
    assert [(r["session_idx"], r["n_turns"]) for r in rows] == [(1, 4), (2, 3)]
    assert rows[1]["window_diff"] == 0.0 and rows[0]["window_diff"] > 0


def test_a_bad_label_in_a_released_file_names_the_dialogue_and_turn(tmp_path: Path) -> None:
    bad = json.loads(json.dumps(RELEASED))
    bad["dial_data"]["tiage"][1]["turns"][2]["segmentation_label"] = 2
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError) as err:
        load_corpus("dialseg", path)
    assert err.value.field == "dial_data.tiage[1].turns[2].segmentation_label" and "0 or 1" in str(err.value)
    two = {"dial_data": {"a": [], "b": []}}
    (tmp_path / "two.json").write_text(json.dumps(two))
    with pytest.raises(InputError, match="one dataset name"):
        load_corpus("dialseg", tmp_path / "two.json")


def test_a_guidance_path_that_does_not_exist_stops_the_run_when_it_is_planned(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "guidance.json"
    cfg = stages.load_config(CONFIGS / "secom_dialseg.yaml",
                             ["segment.mode=reflection", f"segment.guidance_path={missing}"])
    with pytest.raises(ConfigError, match="segment.guidance_path: .*does not exist"):
        Runner(cfg, stages.registry(cfg)).fingerprints()
    # In zero-shot mode the path is not used, so it is not checked.
    assert stored_guidance(SegmentConfig(mode="zero_shot", guidance_path=str(missing))) is None


def test_reflection_without_its_guidance_file_is_an_error_not_a_zero_shot_run(tmp_path: Path) -> None:
    ctx = SimpleNamespace(settings=SegmentConfig(mode="reflection"), upstream_dirs={"guidance": tmp_path})
    with pytest.raises(PipelineError, match="left no guidance.json"):
        load_guidance(ctx)  # type: ignore[arg-type]
    (tmp_path / GUIDANCE_FILE).write_text(json.dumps({"rubric": "1. split at topic changes"}))
    assert load_guidance(ctx).rubric == "1. split at topic changes"  # type: ignore[arg-type, union-attr]
    stored = tmp_path / "stored.json"
    stored.write_text(json.dumps({"rubric": "1. stored"}))
    ctx.settings = SegmentConfig(mode="reflection", guidance_path=str(stored))
    assert load_guidance(ctx).rubric == "1. stored"  # type: ignore[arg-type, union-attr]
    ctx.settings = SegmentConfig(mode="zero_shot")
    assert load_guidance(ctx) is None  # type: ignore[arg-type]
