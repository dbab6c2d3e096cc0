"""HaluMem: one user a line of HaluMem-Medium.jsonl / HaluMem-Long.jsonl (IAAR-Shanghai/HaluMem, layout as
the release's scripts/stage6_2_final_result_medium.py and stage6_3_final_result_long.py write it and its
eval/eval_*.py read it): one user = one episode, its sessions and messages the turns, each session's gold
memory points the `memory_points` table, each session's questions asked right after that session;
Halu-Long's generated question-answer sessions are history only; bad input fails naming file, record and
field. The fixture's content is invented."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

import pytest

from pipeline.artifacts import StageDir
from pipeline.config import resolve_paths
from pipeline.corpus import load_corpus, sources
from pipeline.corpus.fetch import PINS_FILE, add_data_command, cmd_data, fetch, missing_corpus_hint
from pipeline.corpus.halumem import parse_session_time, user_name
from pipeline.engine.runner import Runner
from pipeline.errors import InputError
from pipeline.schemas import EPISODES, MEMORY_POINTS, QA, TURNS
from stages import load_config, registry
from stages.methods import METHODS
from stages.probes import qa_probes
from stages.testing import run_method

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "corpora" / "halumem" / "HaluMem-Long.jsonl"
LENA, ORION = "halumem-a1f0c6d2-0001", "halumem-b7c2e9a4-0002"


def _records() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write(tmp_path: Path, records: list[dict]) -> Path:
    path = tmp_path / "HaluMem-Medium.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# --- episodes, turns ------------------------------------------------------------------------------------

def test_one_user_is_one_episode_spoken_by_the_user_named_in_persona_info_and_the_assistant() -> None:
    corpus = load_corpus("halumem", FIXTURE)
    assert [(e["episode_id"], e["dataset"], e["n_sessions"]) for e in corpus.episodes] == [
        (LENA, "halumem", 4), (ORION, "halumem", 3)]
    assert corpus.episodes[0]["speakers"] == ["Lena Ortiz", "assistant"]
    assert corpus.episodes[1]["speakers"] == ["user", "assistant"]  # persona_info names no one
    assert all(e["personas"] is None for e in corpus.episodes)  # the generating profile is not shown


def test_the_name_is_read_as_the_release_reads_it_and_the_date_in_its_one_format() -> None:
    assert user_name("Name: Martin Mark; Gender: Male; Occupation: director") == "Martin Mark"
    assert user_name("a teacher") == user_name(None) == "user"
    assert parse_session_time("Dec 15, 2025, 08:41:23") == datetime(2025, 12, 15, 8, 41, 23)
    assert parse_session_time("2025-12-15T08:41:23") == datetime(2025, 12, 15, 8, 41, 23)
    with pytest.raises(ValueError, match="expected like 'Dec 15, 2025, 08:41:23'"):
        parse_session_time("15/12/2025")


def test_each_message_is_a_turn_with_its_own_id_and_the_session_starts_at_start_time() -> None:
    corpus = load_corpus("halumem", FIXTURE)
    lena = [t for t in corpus.turns if t["episode_id"] == LENA]
    assert [(t["session_idx"], t["turn_idx"], t["speaker"]) for t in lena[:4]] == [
        (1, 0, "Lena Ortiz"), (1, 1, "assistant"), (1, 2, "Lena Ortiz"), (1, 3, "assistant")]
    assert [t["source_turn_id"] for t in lena if t["session_idx"] == 3] == ["D3:1", "D3:2", "D3:3", "D3:4"]
    assert len({t["source_turn_id"] for t in lena}) == len(lena) == 14
    times = {t["session_idx"]: t["session_time"] for t in lena}
    assert times == {1: datetime(2026, 1, 5, 9, 0), 2: datetime(2026, 2, 10, 11, 30), 3: datetime(2026, 1, 28, 18, 5),
                     4: datetime(2026, 2, 20, 7, 10)}


def test_a_generated_qa_session_is_history_with_no_memory_points_or_questions() -> None:
    corpus = load_corpus("halumem", FIXTURE)
    generated = [t["text"] for t in corpus.turns if t["episode_id"] == LENA and t["session_idx"] == 2]
    assert generated[0] == "What is 17 times 23?" and len(generated) == 4
    assert not [p for p in corpus.memory_points if p["episode_id"] == LENA and p["session_idx"] == 2]
    assert not [q for q in corpus.qa if q["episode_id"] == LENA and q["asked_after_session"] == 2]
    # marked, so a memory scorer can leave it out as the official eval does
    assert corpus.episodes[0]["notes"] == [{"session_idx": 2, "kind": "filler", "speaker": None, "text":
                                            "generated question-answer session (Pure_QA_Session): unrelated to the "
                                            "user, outside memory scoring"}]
    assert corpus.episodes[1]["notes"] is None


# --- questions ------------------------------------------------------------------------------------------

def test_a_question_is_asked_at_its_sessions_end_with_its_evidence_for_the_judge_only() -> None:
    corpus = load_corpus("halumem", FIXTURE)
    qa = {q["qa_id"]: q for q in corpus.qa}
    assert list(qa) == [f"{LENA}-s1-q0", f"{LENA}-s3-q0", f"{LENA}-s3-q1", f"{ORION}-s3-q0"]
    update = qa[f"{LENA}-s3-q0"]
    assert (update["question"], update["answer"], update["category"]) == (
        "What is Lena's job now?", "Harbour inspector in Lisbon.", "Dynamic Update")
    assert update["asked_after_session"] == 3 and update["asked_at"] == datetime(2026, 1, 28, 18, 40)
    assert update["evidence"] is None  # memory points, not turns
    assert update["judge_notes"] == ["Lena Ortiz now works as a harbour inspector in Lisbon."]
    assert update["evidence_sessions"] == ["D3"]
    boundary = qa[f"{LENA}-s3-q1"]
    assert boundary["category"] == "Memory Boundary" and boundary["judge_notes"] is None
    assert boundary["evidence_sessions"] is None
    # evidence held by earlier sessions' memory points names those sessions
    assert qa[f"{ORION}-s3-q0"]["evidence_sessions"] == ["D1", "D2"]


def test_the_probe_of_a_question_sits_after_its_session_and_before_the_next() -> None:
    corpus = load_corpus("halumem", FIXTURE)
    lena = corpus.episodes[0]
    probes = {p["qa_id"]: p for p in qa_probes(lena, [q for q in corpus.qa if q["episode_id"] == LENA])}
    # after session 1: at turn 0 of session 2, so the method sees session 1 and its memory only
    assert (probes[f"{LENA}-s1-q0"]["session_idx"], probes[f"{LENA}-s1-q0"]["turn_idx"]) == (2, 0)
    assert (probes[f"{LENA}-s3-q0"]["session_idx"], probes[f"{LENA}-s3-q0"]["turn_idx"]) == (4, 0)
    assert probes[f"{LENA}-s3-q0"]["request"].startswith("[Current date: 2026/01/28 (Wed) 18:40] ")
    # a question of the last session, and one with no session, sit after the whole history
    orion = corpus.episodes[1]
    last = qa_probes(orion, [q for q in corpus.qa if q["episode_id"] == ORION])[0]
    assert (last["session_idx"], last["turn_idx"]) == (4, None)
    plain = qa_probes(lena, [{**corpus.qa[0], "asked_after_session": None}])[0]
    assert (plain["session_idx"], plain["turn_idx"]) == (5, None)


def test_a_method_answers_a_question_from_its_session_and_the_ones_before_never_the_next(fake_llm, tmp_path) -> None:
    fake_llm.responder = lambda body: "An answer."
    tables = run_method(METHODS["full_history"], fake_llm.base_url, tmp_path, corpus=FIXTURE, episodes=1,
                        sets=["corpus.format=halumem", "probes.next_response=false", "probes.max_qa_per_episode=null"])
    assert all(r["error"] is None for r in tables["respond_full_history.responses"].to_pylist())
    seen = {}  # question -> (session 1 shown, session 3 shown, session 4 shown)
    for request in fake_llm.requests:
        prompt = "\n".join(m["content"] for m in request["body"]["messages"])
        question = next(q for q in ("What does Lena do", "What is Lena's job now", "Lena's sister") if q in prompt)
        seen[question] = ("ferry engines" in prompt, "moved to Lisbon" in prompt, "swimming at dawn" in prompt)
    assert seen == {"What does Lena do": (True, False, False), "What is Lena's job now": (True, True, False),
                    "Lena's sister": (True, True, False)}


# --- memory points --------------------------------------------------------------------------------------

def test_each_sessions_memory_points_are_gold_rows_with_updates_and_interference_kept() -> None:
    corpus = load_corpus("halumem", FIXTURE)
    points = {p["point_id"]: p for p in corpus.memory_points}
    assert list(points) == [f"{LENA}-s1-m1", f"{LENA}-s1-m2", f"{LENA}-s3-m1", f"{LENA}-s4-m1", f"{ORION}-s1-m1",
                            f"{ORION}-s2-m1", f"{ORION}-s2-m2"]
    update = points[f"{LENA}-s3-m1"]
    assert update == {
        "episode_id": LENA, "session_idx": 3, "point_id": f"{LENA}-s3-m1",
        "content": "Lena Ortiz now works as a harbour inspector in Lisbon.", "memory_type": "Event Memory",
        "memory_source": "secondary", "is_update": True,
        "original_memories": ["Lena Ortiz works as a ferry engineer in Porto."], "importance": 0.9,
        "timestamp": "Jan 28, 2026, 18:40:00"}
    assert points[f"{LENA}-s1-m2"]["memory_source"] == "interference"
    assert points[f"{LENA}-s1-m1"]["is_update"] is False and points[f"{LENA}-s1-m1"]["original_memories"] == []
    assert points[f"{ORION}-s1-m1"]["is_update"] is False  # a JSON boolean reads too
    assert points[f"{ORION}-s2-m2"]["memory_source"] == "system"


def test_the_tables_keep_the_canonical_schemas_and_other_corpora_have_no_memory_points() -> None:
    tables = load_corpus("halumem", FIXTURE).tables()
    assert [tables[k].schema for k in ("episodes", "turns", "qa", "memory_points")] == [EPISODES, TURNS, QA,
                                                                                        MEMORY_POINTS]
    assert tables["memory_points"].num_rows == 7
    sample = load_corpus("sample", Path(__file__).resolve().parent / "fixtures" / "corpora" / "sample").tables()
    assert sample["memory_points"].num_rows == 0 and sample["memory_points"].schema.equals(MEMORY_POINTS)


def test_ingest_writes_the_memory_points_table(tmp_path: Path) -> None:
    cfg = resolve_paths(load_config(None, [
        f"artifacts_dir={tmp_path / 'artifacts'}", "corpus.format=halumem", f"corpus.path={FIXTURE}",
        "stages=[ingest]", "methods=[]", "teabag.enabled=false", "ray.executor=inline", "ray.episodes_per_shard=1"]))
    Runner(cfg, registry(cfg)).run(only=["ingest"])
    sd = StageDir(cfg.run_dir, "ingest")
    assert sd.manifest().tables == {"episodes": 2, "turns": 20, "qa": 4, "memory_points": 7}
    written = sd.read_table("memory_points")
    assert written.schema.equals(MEMORY_POINTS)
    assert written.to_pylist() == load_corpus("halumem", FIXTURE).memory_points


# --- bad input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("edit", "field", "message"), [
    (lambda r: r["sessions"][0].pop("start_time"), "sessions[0].start_time", "required field is missing"),
    (lambda r: r["sessions"][0].update(start_time="yesterday"), "sessions[0].start_time", "unrecognised date/time"),
    (lambda r: r["sessions"][2].update(end_time=None), "sessions[2].end_time", "required field is missing"),
    (lambda r: r["sessions"][0]["dialogue"][1].update(role="system"), "sessions[0].dialogue[1].role",
     "expected one of user, assistant"),
    (lambda r: r["sessions"][0]["dialogue"][0].pop("content"), "sessions[0].dialogue[0].content",
     "required field is missing"),
    (lambda r: r["sessions"][2]["memory_points"][0].update(is_update="yes"), "sessions[2].memory_points[0].is_update",
     'expected "True", "False" or a boolean'),
    (lambda r: r["sessions"][2]["memory_points"][0].update(original_memories=[3]),
     "sessions[2].memory_points[0].original_memories[0]", "expected a string"),
    (lambda r: r["sessions"][0]["memory_points"][1].update(index=1), "sessions[0].memory_points[1]",
     "duplicate memory point"),
    (lambda r: r["sessions"][2]["questions"][0]["evidence"][0].pop("memory_content"),
     "sessions[2].questions[0].evidence[0].memory_content", "required field is missing"),
    (lambda r: r["sessions"][2]["questions"][1].update(answer=None), "sessions[2].questions[1].answer",
     "required field is missing"),
    (lambda r: r.update(uuid=""), "uuid", "must not be empty"),
])
def test_bad_input_fails_in_one_line_naming_file_record_and_field(tmp_path: Path, edit, field: str,
                                                                  message: str) -> None:
    records = _records()
    edit(records[0])
    path = _write(tmp_path, records)
    with pytest.raises(InputError) as e:
        load_corpus("halumem", path)
    text = str(e.value)
    assert len(text.splitlines()) == 1
    assert str(path) in text and "line 1" in text and field in text and message in text, text


def test_the_same_user_twice_is_a_duplicate_episode_named_by_its_uuid(tmp_path: Path) -> None:
    records = _records()
    path = _write(tmp_path, [records[0], records[0]])
    with pytest.raises(InputError, match=r"line 2.*uuid.*duplicate episode id 'halumem-a1f0c6d2-0001'"):
        load_corpus("halumem", path)


# --- the fetch ------------------------------------------------------------------------------------------

def test_the_registry_fetches_both_versions_and_points_the_corpus_at_medium(capsys) -> None:
    source = sources.REGISTRY["halumem"]
    assert (source.corpus_format, source.corpus_path) == ("halumem", "halumem/HaluMem-Medium.jsonl")
    assert [(f.url, f.fname, f.sha256) for f in source.files] == [
        ("https://huggingface.co/datasets/IAAR-Shanghai/HaluMem/resolve/main/HaluMem-Medium.jsonl",
         "halumem/HaluMem-Medium.jsonl", None),
        ("https://huggingface.co/datasets/IAAR-Shanghai/HaluMem/resolve/main/HaluMem-Long.jsonl",
         "halumem/HaluMem-Long.jsonl", None)]
    assert missing_corpus_hint("halumem", "data/halumem/HaluMem-Medium.jsonl") == "run `mempipe data fetch halumem`"
    parser = argparse.ArgumentParser(prog="mempipe")
    add_data_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", "list"])
    assert args.func is cmd_data and args.func(args) == 0
    listed = capsys.readouterr().out.split("\nhalumem  [", 1)[1].split("\nteabag  [", 1)[0]
    assert listed.startswith("unverified]") and listed.count("IAAR-Shanghai/HaluMem/resolve/main/") == 2
    assert "corpus: format halumem, path data/halumem/HaluMem-Medium.jsonl" in listed
    assert "Halu-Long" in listed and "CC BY-NC-ND 4.0" in listed


def test_fetch_pins_both_files_at_the_first_fetch_into_the_path_the_loader_reads(tmp_path: Path, mirror) -> None:
    body = FIXTURE.read_bytes()
    for f in sources.REGISTRY["halumem"].files:
        mirror.serve(f.url, body)
    fetched = fetch("halumem", tmp_path, progress=False, base_url_override=mirror.url)
    assert [(f.path.relative_to(tmp_path).as_posix(), f.check) for f in fetched] == [
        ("halumem/HaluMem-Medium.jsonl", "pinned now"), ("halumem/HaluMem-Long.jsonl", "pinned now")]
    assert set(json.loads((tmp_path / PINS_FILE).read_text())) == {"halumem/HaluMem-Medium.jsonl",
                                                                    "halumem/HaluMem-Long.jsonl"}
    assert load_corpus("halumem", tmp_path / "halumem" / "HaluMem-Medium.jsonl").qa == load_corpus(
        "halumem", FIXTURE).qa
    again = fetch("halumem", tmp_path, progress=False, base_url_override=mirror.url)
    assert [f.check for f in again] == ["pinned", "pinned"] and not any(f.downloaded for f in again)
