"""The TeaBag export (round-2 review): nothing of the sessions after N leaves the run, no local path,
rejects only of the exported questions, and the `datasets` library loads the export as written (a
`test` split per non-empty table, `questions` the default config, a named licence). Hermetic: the
run's stage folders are stand-ins, and `datasets` reads only the local files."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import stages
from conftest import ROOT
from pipeline.reproduction import deviations
from pipeline.schemas import EPISODES, TURNS
from stages.teabag import QUESTIONS, REJECTS, SESSION_REJECTS, SESSIONS, SUMMARIES
from stages.teabag.export import dataset_card, past_episodes, teabag_tables, write_dataset

STAMP = {"model": "gen", "prompt_fingerprint": "fp", "seed": 7}


class StandIn:
    """A finished stage's tables, read as StageDir reads them (optionally only some episodes)."""

    def __init__(self, tables: dict[str, pa.Table]) -> None:
        self.tables = tables

    def read_table(self, name: str, episodes=None) -> pa.Table:
        t = self.tables[name]
        return t if episodes is None else t.filter(pc.is_in(t["episode_id"], pa.array(list(episodes), pa.string())))


def episode(eid: str, n_sessions: int, source: str) -> dict:
    return {"episode_id": eid, "dataset": "msc", "speakers": ["Ann", "Bob"], "personas": [["likes tea"], ["runs"]],
            "relationship": None, "n_sessions": n_sessions, "source_file": source,
            "notes": [{"session_idx": s, "kind": "persona", "speaker": "Ann", "text": f"note {s}"}
                      for s in (2, 5, 6, None)]}


def question(eid: str, k: int, error: str | None = None) -> dict:
    return {"episode_id": eid, "dataset": "msc", "question_id": f"{eid}:tb{k}", "question_idx": k,
            "asker": "Ann" if k == 0 else "Bob", "answerer": "Bob" if k == 0 else "Ann",
            "question": None if error else f"Still in Oslo, {k}?", "false_premise": "p", "answer": "No, Rome.",
            "evidence_sessions": [2], "memory_sessions": 5, "attempts": 1, "checked": None, "check_reason": None,
            "session_attempts": 1, "leak_checked": None, "leak_reason": None, **STAMP, "error": error}


def reject(qid: str) -> dict:
    return {"episode_id": qid.split(":")[0], "question_id": qid, "attempt": 0, "asker": "Ann", "question": "q",
            "false_premise": "p", "answer": "a", "evidence_sessions": [1], "reason": "matches the notes", **STAMP}


def run_tables(session_rejects: bool = True) -> tuple[StandIn, StandIn]:
    """Episode e1 (6 sessions in the corpus, N = 5) with one usable question and one failed one; e2
    only failed; rejects of both, and of e2's."""
    turns = [{"episode_id": e, "session_idx": s, "turn_idx": i, "speaker": "Ann" if i % 2 == 0 else "Bob",
              "text": f"{e} {s}.{i}"} for e in ("e1", "e2") for s in range(1, 7) for i in range(2)]
    ingest = StandIn({"episodes": pa.Table.from_pylist([episode("e1", 6, "/home/me/data/msc/session_6/test.jsonl"),
                                                          episode("e2", 6, "s3://bucket/msc/test.jsonl")], EPISODES),
                      "turns": pa.Table.from_pylist(turns, TURNS)})
    q = [question("e1", 0), question("e1", 1, "session 6 gave the truth away"), question("e2", 0, "no question")]
    sessions = [{"episode_id": "e1", "question_id": "e1:tb0", "session_idx": 6, "turn_idx": i, "speaker": sp,
                 "text": t, "is_question": i == 2, **STAMP} for i, (sp, t) in enumerate(
                     [("Ann", "hi"), ("Bob", "hello"), ("Ann", "Still in Oslo, 0?")])]
    summaries = [{"episode_id": e, "session_idx": s, "session_time": None, "memories": [f"m{s}"], **STAMP,
                  "error": None} for e in ("e1", "e2") for s in range(1, 6)]
    leaking = [{"episode_id": "e1", "question_id": qid, "attempt": 0, "asker": "Ann",
                "turns": [{"speaker": "Ann", "text": "back from Rome"}], "reason": "says Rome", **STAMP}
               for qid in ("e1:tb0", "e1:tb1")] if session_rejects else []
    teabag = StandIn({"questions": pa.Table.from_pylist(q, QUESTIONS), "sessions": pa.Table.from_pylist(sessions, SESSIONS),
                      "summaries": pa.Table.from_pylist(summaries, SUMMARIES),
                      "rejects": pa.Table.from_pylist([reject("e1:tb0"), reject("e1:tb1"), reject("e2:tb0")], REJECTS),
                      "session_rejects": pa.Table.from_pylist(leaking, SESSION_REJECTS)})
    return ingest, teabag


def test_the_exported_episodes_keep_nothing_of_the_sessions_after_n_and_no_local_path():
    cut = past_episodes(pa.Table.from_pylist([episode("long", 6, "/home/me/data/msc/test.jsonl"),
                                              episode("whole", 5, "C:\\data\\cc\\test.json")], EPISODES),
                        {"long": 5, "whole": 5}, {"long": 6, "whole": 5})
    long, whole = cut.to_pylist()
    assert long["n_sessions"] == whole["n_sessions"] == 5
    # notes of sessions 1..N only (a note with no session could be any session's: dropped)
    assert [n["session_idx"] for n in long["notes"]] == [2, 5] == [n["session_idx"] for n in whole["notes"]]
    # a corpus's personas describe its last session: kept only when the episode ends at N
    assert long["personas"] is None and whole["personas"] == [["likes tea"], ["runs"]]
    assert (long["source_file"], whole["source_file"]) == ("test.jsonl", "test.json")
    assert cut.schema == EPISODES


def test_the_tables_hold_only_the_exported_questions_and_their_rejects():
    tables = teabag_tables(*run_tables())
    assert tables["questions"]["question_id"].to_pylist() == ["e1:tb0"]
    assert tables["rejects"]["question_id"].to_pylist() == ["e1:tb0"]  # not e1:tb1's nor e2's
    assert tables["session_rejects"]["question_id"].to_pylist() == ["e1:tb0"]
    assert tables["episodes"]["episode_id"].to_pylist() == ["e1"] and tables["episodes"]["personas"][0].as_py() is None
    assert max(tables["sessions"]["session_idx"].to_pylist()) == 5
    assert set(tables["summaries"]["episode_id"].to_pylist()) == {"e1"}


RECORDED = {"teabag": {"sessions": 5, "max_memories": 10, "questions_per_episode": 2, "counterfactual_check": False,
                       "max_attempts": 3, "session_turns": 8, "leak_check": False, "session_attempts": 3},
            "generator": {"role": "teabag", "model": "gen", "temperature": 0.75},
            "summariser": {"role": "teabag", "model": "gen", "temperature": 0.75}}
MANIFEST = SimpleNamespace(fingerprint="abc123", code_version="0.0")


def test_the_card_lists_one_test_split_per_non_empty_table_with_questions_the_default_and_a_named_licence():
    tables = teabag_tables(*run_tables(session_rejects=False))
    card = dataset_card(tables, MANIFEST, RECORDED)
    front = card.split("---\n")[1]
    assert "license: other\n" in front and "license_name: " in front
    assert "- config_name: questions\n  data_files:\n  - split: test\n    path: questions.parquet\n  default: true\n" \
        in front
    assert front.count("default: true") == 1 and "- split: train" not in front
    assert "config_name: session_rejects" not in front  # no rows: written, not listed
    listed = {line.split(": ")[1] for line in front.splitlines() if line.startswith("- config_name: ")}
    assert listed == {n for n, t in tables.items() if t.num_rows} == set(tables) - {"session_rejects"}


def test_the_datasets_library_loads_the_export_from_its_card(tmp_path, monkeypatch):
    for name, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("HF_HOME", str(tmp_path / "hf"))):
        monkeypatch.setenv(name, value)  # read when `datasets` is first imported: no network, no home cache
    import datasets  # the `test` extra's

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    tables = teabag_tables(*run_tables(session_rejects=False))
    out = write_dataset(tmp_path / "teabag", tables, MANIFEST, RECORDED)
    assert (out / "session_rejects.parquet").is_file()  # every table is written, the empty one too
    cache = str(tmp_path / "cache")
    default = datasets.load_dataset(str(out), cache_dir=cache)
    assert list(default) == ["test"] and default["test"]["question_id"] == ["e1:tb0"]
    for name, table in tables.items():
        if table.num_rows:
            loaded = datasets.load_dataset(str(out), name, split="test", cache_dir=cache)
            assert loaded.num_rows == table.num_rows and loaded.column_names == table.column_names, name
    with pytest.raises(ValueError):  # not a config: a 0-row Parquet file cannot be loaded
        datasets.load_dataset(str(out), "session_rejects", split="test", cache_dir=cache)


def test_the_paper_config_runs_without_our_leak_check_and_its_sheet_says_so():
    cfg = stages.load_config(ROOT / "configs" / "teafarm_msc_cc.yaml")
    assert cfg.teabag.leak_check is False and cfg.teabag.counterfactual_check is False
    setting = cfg.paper.protocol["teabag.leak_check"]
    assert setting.value is False and "inferred" in setting.source
    assert not [d for d in deviations(cfg) if d.path.startswith("teabag.")]
    on = stages.load_config(ROOT / "configs" / "teafarm_msc_cc.yaml", ["teabag.leak_check=true"])
    assert [d.path for d in deviations(on)] == ["teabag.leak_check"]
