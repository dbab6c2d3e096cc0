"""Corpus loaders: exact counts per format, session ordering past 9, limits, directories, bad input."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from pipeline.corpus import FORMATS, load_corpus
from pipeline.errors import ConfigError, InputError
from pipeline.schemas import EPISODES, MEMORY_POINTS, QA, TURNS

CORPORA = Path(__file__).resolve().parent / "fixtures" / "corpora"

FIXTURES = {
    "sample": CORPORA / "sample" / "episodes.jsonl",
    "msc": CORPORA / "msc" / "session_3.jsonl",
    "cc": CORPORA / "cc" / "chronicles.json",
    "locomo": CORPORA / "locomo" / "locomo_mini.json",
    "longmtbench": CORPORA / "longmtbench" / "longmt_mini.json",
    "dialseg": CORPORA / "dialseg" / "dialseg711_mini.json",
    "longmemeval": CORPORA / "longmemeval" / "longmemeval_mini.json",
    "memoryagentbench": CORPORA / "memoryagentbench",
    "beam": CORPORA / "beam",
    "locomo_plus": CORPORA / "locomo_plus",
    "halumem": CORPORA / "halumem" / "HaluMem-Long.jsonl",
}


def turns_per_session(corpus, episode_id: str) -> list[int]:
    counts: dict[int, int] = {}
    for t in corpus.turns:
        if t["episode_id"] == episode_id:
            counts[t["session_idx"]] = counts.get(t["session_idx"], 0) + 1
    assert sorted(counts) == list(range(1, len(counts) + 1))
    return [counts[i] for i in sorted(counts)]


def session_field(corpus, episode_id: str, column: str) -> list:
    """One value per session (checked to be constant within the session)."""
    values: dict[int, set] = {}
    for t in corpus.turns:
        if t["episode_id"] == episode_id:
            values.setdefault(t["session_idx"], set()).add(t[column])
    assert all(len(v) == 1 for v in values.values())
    return [next(iter(values[i])) for i in sorted(values)]


def test_every_format_has_a_fixture():
    assert set(FIXTURES) == set(FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_tables_use_canonical_schemas(fmt):
    tables = load_corpus(fmt, FIXTURES[fmt]).tables()
    assert tables["episodes"].schema.equals(EPISODES)
    assert tables["turns"].schema.equals(TURNS)
    assert tables["qa"].schema.equals(QA)
    assert tables["memory_points"].schema.equals(MEMORY_POINTS)
    # turn_idx is 0-based and dense within each session
    turns = tables["turns"].to_pylist()
    by_session: dict[tuple, list[int]] = {}
    for t in turns:
        by_session.setdefault((t["episode_id"], t["session_idx"]), []).append(t["turn_idx"])
    assert all(idx == list(range(len(idx))) for idx in by_session.values())


def test_empty_corpus_tables_keep_schemas():
    tables = load_corpus("sample", FIXTURES["sample"], limit=0).tables()
    assert [tables[k].num_rows for k in ("episodes", "turns", "qa")] == [0, 0, 0]
    assert tables["turns"].schema.equals(TURNS)


def test_sample():
    c = load_corpus("sample", FIXTURES["sample"])
    assert [e["episode_id"] for e in c.episodes] == ["garden-01", "trip-02"]
    ep = c.episodes[0]
    assert ep["dataset"] == "sample"
    assert ep["speakers"] == ["Mira", "Tobin"]
    assert ep["personas"] == [["I keep bees.", "I live near the coast."], ["I repair bicycles."]]
    assert ep["relationship"] == "neighbours" and ep["n_sessions"] == 2
    assert ep["source_file"].endswith("episodes.jsonl")
    assert c.episodes[1]["personas"] is None and c.episodes[1]["relationship"] is None

    assert turns_per_session(c, "garden-01") == [4, 3]
    assert turns_per_session(c, "trip-02") == [2]
    # the zoned time is converted to UTC and stored naive
    assert session_field(c, "garden-01", "session_time") == [datetime(2024, 3, 2, 9, 15), datetime(2024, 3, 9, 17, 40)]
    assert session_field(c, "garden-01", "session_gap_label") == [None, "one week later"]
    assert session_field(c, "trip-02", "session_time") == [None]

    garden = [t for t in c.turns if t["episode_id"] == "garden-01"]
    assert [t["source_turn_id"] for t in garden] == ["D1:1", "D1:2", "D1:3", "D1:4", "D2:1", "D2:2", "D2:3"]
    # topics given somewhere in the episode: unset turns are False; no topics at all: None
    assert [t["gold_topic_boundary"] for t in garden] == [True, False, False, True, False, False, False]
    assert {t["gold_topic_boundary"] for t in c.turns if t["episode_id"] == "trip-02"} == {None}

    assert len(c.qa) == 2
    q = c.qa[0]
    assert q["qa_id"] == "garden-01-q1" and q["answer"] == "A strap for a hive lid"
    assert q["evidence"] == ["D1:3", "D2:2"] and q["category"] == "multi-hop" and q["source"] == "dataset"


def test_msc_parlai_and_cc_style_records():
    c = load_corpus("msc", FIXTURES["msc"])
    assert [e["episode_id"] for e in c.episodes] == ["msc-train_77", "msc-session_3-1", "msc-m-5"]
    assert {e["dataset"] for e in c.episodes} == {"msc"}

    ep = c.episodes[0]
    assert ep["speakers"] == ["Speaker 1", "Speaker 2"] and ep["n_sessions"] == 3
    assert ep["personas"] == [["I grow tomatoes."], ["I play the cello.", "I have a cat."]]
    assert turns_per_session(c, "msc-train_77") == [3, 2, 4]
    # time_num/time_unit of previous dialog k is the gap before the session after it
    assert session_field(c, "msc-train_77", "session_gap_label") == [None, "3 days later", "1 week later"]
    assert session_field(c, "msc-train_77", "session_time") == [None, None, None]
    speakers = [(t["session_idx"], t["speaker"]) for t in c.turns if t["episode_id"] == "msc-train_77"]
    # previous dialogs have no ids and alternate; the current dialog's own ids win
    assert speakers[:5] == [(1, "Speaker 1"), (1, "Speaker 2"), (1, "Speaker 1"), (2, "Speaker 1"), (2, "Speaker 2")]
    assert speakers[5:] == [(3, "Speaker 2"), (3, "Speaker 1"), (3, "Speaker 2"), (3, "Speaker 1")]

    # no id in the record: file stem + position
    assert turns_per_session(c, "msc-session_3-1") == [2]
    # CC-schema record: trailing empty padding session dropped, gap labels from time_interval
    assert turns_per_session(c, "msc-m-5") == [2, 3]
    assert session_field(c, "msc-m-5", "session_gap_label") == [None, "2 hours later"]
    assert c.qa == []


def test_msc_per_session_persona_summaries_become_notes_of_their_session(tmp_path):
    """previous_dialogs[k].personas (one list per speaker) are persona notes of session k+1; the top-level
    personas stay the episode's; the current dialog carries none."""
    rec = {"metadata": {"initial_data_id": "p1"},
           "personas": [["I grow tomatoes.", "I moved to Leeds."], ["I play the cello."]],
           "previous_dialogs": [
               {"dialog": [{"text": "Hi"}, {"text": "Hello"}], "personas": [["I grow tomatoes."], []]},
               {"dialog": [{"text": "Back"}, {"text": "Hey"}],
                "personas": [["I moved to Leeds."], ["I play the cello."]]},
               {"dialog": [{"text": "Again"}, {"text": "Yes"}]}],
           "dialog": [{"text": "Now"}, {"text": "Ok"}]}
    c = load_corpus("msc", write_jsonl(tmp_path / "m.jsonl", [rec]))
    ep = c.episodes[0]
    assert ep["notes"] == [
        {"session_idx": 1, "kind": "persona", "speaker": "Speaker 1", "text": "I grow tomatoes."},
        {"session_idx": 2, "kind": "persona", "speaker": "Speaker 1", "text": "I moved to Leeds."},
        {"session_idx": 2, "kind": "persona", "speaker": "Speaker 2", "text": "I play the cello."},
    ]
    assert ep["personas"] == [["I grow tomatoes.", "I moved to Leeds."], ["I play the cello."]]
    assert load_corpus("msc", FIXTURES["msc"]).episodes[0]["notes"] is None  # no per-session personas


def test_bad_msc_session_personas(tmp_path):
    rec = {"metadata": {"initial_data_id": "v1"}, "dialog": [{"text": "c"}],
           "previous_dialogs": [{"dialog": [{"text": "a"}], "personas": [["ok"], [3]]}]}
    err = load_error("msc", write_jsonl(tmp_path / "m.jsonl", [rec]))
    assert_names(err, "m.jsonl", "msc-v1 (line 1)", "previous_dialogs[0].personas[1][0]")
    rec["previous_dialogs"][0]["personas"] = [["a"], ["b"], ["c"]]
    err = load_error("msc", write_jsonl(tmp_path / "m.jsonl", [rec]))
    assert_names(err, "m.jsonl", "msc-v1", "previous_dialogs[0].personas")


def test_cc_with_twelve_sessions():
    c = load_corpus("cc", FIXTURES["cc"])  # a .json file holding JSON Lines, as released
    assert [e["episode_id"] for e in c.episodes] == ["cc-episode-1", "cc-episode-2"]
    five, twelve = c.episodes
    assert five["relationship"] == "Athlete and Coach" and five["dataset"] == "cc"
    assert five["speakers"] == ["Coach Lee", "Jordan"]
    assert turns_per_session(c, "cc-episode-1") == [2, 3, 2, 4, 2]
    # time_interval shorter than the sessions: later gaps unknown
    assert session_field(c, "cc-episode-1", "session_gap_label") == [
        None, "A few hours after", "A couple of days after", None, None,
    ]

    assert twelve["n_sessions"] == 12
    assert turns_per_session(c, "cc-episode-2") == [2, 3, 4, 2, 3, 4, 2, 3, 4, 2, 3, 4]
    assert session_field(c, "cc-episode-2", "session_gap_label") == [None] + [f"{i} weeks after" for i in range(1, 12)]
    # session 10 is the tenth one, not sorted after session 1 as a string would be
    tenth = [t for t in c.turns if t["episode_id"] == "cc-episode-2" and t["session_idx"] == 10]
    assert tenth[0]["text"].startswith("[episode-2 s10 u1]") and tenth[0]["source_turn_id"] == "D10:1"
    assert tenth[0]["speaker"] == "Jordan"


def test_locomo_with_twelve_sessions():
    c = load_corpus("locomo", FIXTURES["locomo"])
    assert [e["episode_id"] for e in c.episodes] == ["locomo-conv-90", "locomo-conv-91"]
    ep = c.episodes[0]
    assert ep["speakers"] == ["Priya", "Dev"] and ep["n_sessions"] == 12 and ep["dataset"] == "locomo"
    assert turns_per_session(c, "locomo-conv-90") == [3, 2, 2, 2, 2, 2, 2, 2, 2, 4, 3, 2]
    assert turns_per_session(c, "locomo-conv-91") == [2, 3]
    times = session_field(c, "locomo-conv-90", "session_time")
    assert times[0] == datetime(2023, 5, 8, 13, 56)
    assert times[9] == datetime(2023, 9, 5, 16, 4)
    assert times[11] == datetime(2023, 10, 27, 10, 37)
    assert times == sorted(times)
    conv = [t for t in c.turns if t["episode_id"] == "locomo-conv-90"]
    # the dataset's own dia_ids, in numeric session order
    assert [t["source_turn_id"] for t in conv if t["session_idx"] in (1, 10)] == [
        "D1:1", "D1:2", "D1:3", "D10:1", "D10:2", "D10:3", "D10:4",
    ]
    shared = next(t for t in conv if t["source_turn_id"] == "D10:2")
    assert shared["text"].endswith(" [shares a photo of a loaf of sourdough bread on a table]")
    assert {t["gold_topic_boundary"] for t in c.turns} == {None}

    qa = [q for q in c.qa if q["episode_id"] == "locomo-conv-90"]
    assert len(c.qa) == 6 and len(qa) == 5
    assert [q["qa_id"] for q in qa] == [f"locomo-conv-90-q{i}" for i in range(5)]
    assert [q["category"] for q in qa] == ["single-hop", "multi-hop", "temporal", "open-domain", "adversarial"]
    assert qa[1]["answer"] == "3"  # numeric answers become text
    assert qa[1]["evidence"] == ["D11:1", "D11:3"] and qa[3]["evidence"] == []
    assert qa[4]["answer"] is None and qa[4]["evidence"] == ["D12:2"]  # adversarial: no true answer
    # its tempting wrong answer is kept: LoCoMo's official protocol offers it beside "not mentioned"
    assert [q["adversarial_answer"] for q in qa] == [None, None, None, None, "red"]


def test_longmtbench():
    c = load_corpus("longmtbench", FIXTURES["longmtbench"])
    assert [e["episode_id"] for e in c.episodes] == ["longmtbench-lm-a", "longmtbench-longmt_mini-1"]
    assert c.episodes[0]["speakers"] == ["user", "assistant"]
    assert turns_per_session(c, "longmtbench-lm-a") == [2, 4]
    assert turns_per_session(c, "longmtbench-longmt_mini-1") == [2]
    assert [t["speaker"] for t in c.turns[:2]] == ["user", "assistant"]
    assert [(q["qa_id"], q["question"], q["answer"]) for q in c.qa] == [
        ("longmtbench-lm-a-q0", "What club name was suggested?", "Knight Owls"),
        ("longmtbench-lm-a-q1", "What was the short slogan?", "Move smart"),
        ("longmtbench-longmt_mini-1-q0", "How many miles is 3 km?", "About 1.86"),
    ]
    assert {q["evidence"] is None for q in c.qa} == {True}


def test_dialseg_segments():
    c = load_corpus("dialseg", FIXTURES["dialseg"])
    assert [e["episode_id"] for e in c.episodes] == ["dialseg-711-1", "dialseg-711-2"]
    assert [e["n_sessions"] for e in c.episodes] == [1, 1]
    assert turns_per_session(c, "dialseg-711-1") == [6]
    first = [t for t in c.turns if t["episode_id"] == "dialseg-711-1"]
    assert [t["gold_topic_boundary"] for t in first] == [True, False, False, False, True, False]
    assert [t["speaker"] for t in first] == ["A", "B", "A", "B", "A", "B"]
    second = [t["gold_topic_boundary"] for t in c.turns if t["episode_id"] == "dialseg-711-2"]
    assert second == [True, False, True, False, False, True, False]


def test_superdialseg_labels_mark_the_last_utterance_of_each_segment():
    c = load_corpus("dialseg", CORPORA / "superdialseg" / "superdialseg_mini.json")
    assert [e["episode_id"] for e in c.episodes] == ["dialseg-sds-1"]
    assert [t["gold_topic_boundary"] for t in c.turns] == [True, False, True, False, False]
    assert [t["speaker"] for t in c.turns] == ["user", "agent", "user", "agent", "user"]


def test_longmtbench_exchange_strings_load_every_question_and_exchange_and_converted_turns_give_evidence(tmp_path):
    # The release's record shape, with `turns` as a converted file may give evidence (exchange numbers
    # per question); the release's own `turns` is memory units (next test).
    path = CORPORA / "longmtbench" / "longmt_released.jsonl"
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    c = load_corpus("longmtbench", path)
    assert [e["episode_id"] for e in c.episodes] == ["longmtbench-lmb-0", "longmtbench-lmb-1"]
    assert len(c.qa) == sum(len(r["questions"]) for r in raw)
    assert [q["question"] for q in c.qa] == [q for r in raw for q in r["questions"]]
    assert turns_per_session(c, "longmtbench-lmb-0") == [4, 2]  # each exchange: a user and an assistant turn
    first = [t for t in c.turns if t["episode_id"] == "longmtbench-lmb-0"]
    assert [(t["speaker"], t["text"], t["source_turn_id"]) for t in first[2:4]] == [
        ("user", "Now a slogan?", "S1:2"),  # the "<Turn 2>:" prefix is dropped
        ("assistant", "Think two moves ahead.\nOr: plan first.", "S1:2"),  # an answer may span lines
    ]
    assert c.qa[0]["evidence"] == ["S1:1", "S1:2"] and c.qa[1]["evidence"] == ["S2:1"]
    # The same records as a JSON array (as `datasets` exports them too) load the same.
    array = tmp_path / "released.json"
    array.write_text(json.dumps(raw))
    assert [q["evidence"] for q in load_corpus("longmtbench", array).qa] == [q["evidence"] for q in c.qa]


def test_longmtbench_as_released_has_no_evidence_its_turns_are_the_exchange_units():
    """The release (panzs19/Long-MT-Bench-Plus as SeCom's download_data.py writes it): conversation_id,
    sessions, questions, answers, and `turns`, the conversation's exchanges as turn-level memory units
    (a list of one-string lists). No field gives a question's reference turns: evidence is unknown."""
    path = CORPORA / "longmtbench" / "longmt_hf_release.jsonl"
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(r["turns"] == [[x] for session in r["sessions"] for x in session] for r in raw)  # the shape
    c = load_corpus("longmtbench", path)
    assert [e["episode_id"] for e in c.episodes] == ["longmtbench-0", "longmtbench-1"]
    assert [q["evidence"] for q in c.qa] == [None, None, None]
    # One question and one exchange: `turns` has one entry per question, and is still not evidence.
    assert len(raw[1]["turns"]) == len(raw[1]["questions"]) and c.qa[2]["evidence"] is None
    assert turns_per_session(c, "longmtbench-0") == [6, 4]
    first = [t for t in c.turns if t["episode_id"] == "longmtbench-0"]
    assert [(t["speaker"], t["text"], t["source_turn_id"]) for t in first[4:6]] == [
        ("user", "Write a two-line care note for the snake plant.", "S1:3"),  # "<Turn 2>: " dropped
        ("assistant", "Water it once the soil is dry.\nKeep it out of cold drafts.", "S1:3"),
    ]


def test_longmtbench_exchange_without_a_speaker_tag_is_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"conversation_id": "x", "sessions": [["no tag here"]], "questions": [],
                               "answers": []}) + "\n")
    with pytest.raises(InputError, match=r"record longmtbench-x .*field 'sessions\[0\]\[0\]'.*speaker tag"):
        load_corpus("longmtbench", bad)


def test_dialseg_directory_of_tiage_files():
    c = load_corpus("dialseg", CORPORA / "tiage_dir")
    assert [e["episode_id"] for e in c.episodes] == ["dialseg-t1", "dialseg-dlg_002"]
    t1 = [t["gold_topic_boundary"] for t in c.turns if t["episode_id"] == "dialseg-t1"]
    assert t1 == [True, False, False, True, False]
    assert c.episodes[1]["speakers"] == ["host", "guest"]
    assert [t["gold_topic_boundary"] for t in c.turns if t["episode_id"] == "dialseg-dlg_002"] == [True, False, True]


def test_directory_reads_json_files_sorted_and_ignores_others():
    c = load_corpus("sample", CORPORA / "sample_dir")
    assert [e["episode_id"] for e in c.episodes] == ["dir-a", "dir-b"]
    assert [e["source_file"].rsplit("/", 1)[-1] for e in c.episodes] == ["a_first.jsonl", "b_second.json"]
    assert len(c.turns) == 3


def test_limit_takes_first_episodes_in_file_order():
    c = load_corpus("locomo", FIXTURES["locomo"], limit=1)
    assert [e["episode_id"] for e in c.episodes] == ["locomo-conv-90"]
    assert {t["episode_id"] for t in c.turns} == {"locomo-conv-90"} and len(c.turns) == 28
    assert {q["episode_id"] for q in c.qa} == {"locomo-conv-90"}
    assert len(load_corpus("cc", FIXTURES["cc"], limit=5).episodes) == 2
    across_files = load_corpus("sample", CORPORA / "sample_dir", limit=1)
    assert [e["episode_id"] for e in across_files.episodes] == ["dir-a"]


def test_limit_stops_reading(tmp_path):
    # documented: with a limit, records after the first N are not read
    p = tmp_path / "big.jsonl"
    p.write_text(FIXTURES["sample"].read_text().splitlines()[1] + "\n{broken\n")
    assert [e["episode_id"] for e in load_corpus("sample", p, limit=1).episodes] == ["trip-02"]
    with pytest.raises(InputError):
        load_corpus("sample", p)


def test_unknown_format_and_negative_limit():
    with pytest.raises(ConfigError, match="unknown format 'parquet'"):
        load_corpus("parquet", FIXTURES["sample"])
    with pytest.raises(ConfigError, match="limit"):
        load_corpus("sample", FIXTURES["sample"], limit=-1)


# ---------------------------------------------------------------- bad input


def ok_sample(**over) -> dict:
    ep = {
        "episode_id": "ep-x",
        "speakers": ["A", "B"],
        "sessions": [
            {"turns": [{"speaker": "A", "text": "hi"}, {"speaker": "B", "text": "hello"}]},
            {"turns": [{"speaker": "B", "text": "back again"}]},
        ],
    }
    ep.update(over)
    return ep


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def load_error(fmt: str, path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        load_corpus(fmt, path)
    return info.value


def assert_names(err: InputError, file: str, record: str | None, field: str | None) -> None:
    msg = str(err)
    assert file in msg and err.file.endswith(file)
    if record is not None:
        assert record in msg and record in (err.record or "")
    if field is not None:
        assert f"field {field!r}" in msg and err.field == field


def test_bad_missing_file(tmp_path):
    err = load_error("sample", tmp_path / "nowhere.jsonl")
    assert_names(err, "nowhere.jsonl", None, None)
    assert "no such file" in str(err)


def test_bad_empty_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    assert "no .json or .jsonl files" in str(load_error("sample", tmp_path))


def test_bad_json_line_number(tmp_path):
    p = tmp_path / "broken.jsonl"
    p.write_text(json.dumps(ok_sample()) + "\n\n" + '{"episode_id": "ep-y", "speakers": [\n')
    err = load_error("sample", p)
    assert_names(err, "broken.jsonl", "line 3", None)
    assert "invalid JSON" in str(err)


def test_bad_json_document_line_number(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('[\n  {"sample_id": "c1",\n   "conversation": {,}\n  }\n]\n')
    err = load_error("locomo", p)
    assert_names(err, "broken.json", "line 3", None)


def test_bad_missing_required_field(tmp_path):
    ep = ok_sample()
    del ep["sessions"]
    err = load_error("sample", write_jsonl(tmp_path / "nosess.jsonl", [ep]))
    assert_names(err, "nosess.jsonl", "ep-x (line 1)", "sessions")
    assert "missing" in str(err)


def test_bad_missing_episode_id_names_the_line(tmp_path):
    ep = ok_sample()
    del ep["episode_id"]
    err = load_error("sample", write_jsonl(tmp_path / "noid.jsonl", [ok_sample(episode_id="ok"), ep]))
    assert_names(err, "noid.jsonl", "line 2", "episode_id")


def test_bad_text_not_a_string(tmp_path):
    ep = ok_sample()
    ep["sessions"][0]["turns"][1]["text"] = 42
    err = load_error("sample", write_jsonl(tmp_path / "types.jsonl", [ep]))
    assert_names(err, "types.jsonl", "ep-x", "sessions[0].turns[1].text")
    assert "expected a string, got integer" in str(err)


def test_bad_sessions_not_a_list(tmp_path):
    err = load_error("sample", write_jsonl(tmp_path / "types.jsonl", [ok_sample(sessions={"turns": []})]))
    assert_names(err, "types.jsonl", "ep-x", "sessions")
    assert "expected a list, got object" in str(err)


def test_bad_empty_session(tmp_path):
    ep = ok_sample()
    ep["sessions"][1]["turns"] = []
    err = load_error("sample", write_jsonl(tmp_path / "empty.jsonl", [ep]))
    assert_names(err, "empty.jsonl", "ep-x", "sessions[1]")
    assert "empty session" in str(err)


def test_bad_unknown_speaker(tmp_path):
    ep = ok_sample()
    ep["sessions"][1]["turns"][0]["speaker"] = "Zed"
    err = load_error("sample", write_jsonl(tmp_path / "who.jsonl", [ep]))
    assert_names(err, "who.jsonl", "ep-x", "sessions[1].turns[0].speaker")
    assert "'Zed'" in str(err)


def test_bad_duplicate_episode_id(tmp_path):
    err = load_error("sample", write_jsonl(tmp_path / "dup.jsonl", [ok_sample(), ok_sample()]))
    assert_names(err, "dup.jsonl", "ep-x (line 2)", "episode_id")
    assert "duplicate" in str(err)


def test_bad_duplicate_episode_id_across_files(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [ok_sample()])
    write_jsonl(tmp_path / "b.jsonl", [ok_sample()])
    err = load_error("sample", tmp_path)
    assert_names(err, "b.jsonl", "ep-x", "episode_id")
    assert "a.jsonl" in str(err)


def test_bad_record_in_second_file_fails_the_whole_load(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [ok_sample(episode_id="fine")])
    ep = ok_sample()
    ep["sessions"][0]["turns"][0]["text"] = None
    write_jsonl(tmp_path / "b.jsonl", [ep])
    err = load_error("sample", tmp_path)
    assert_names(err, "b.jsonl", "ep-x", "sessions[0].turns[0].text")


def test_bad_time(tmp_path):
    ep = ok_sample()
    ep["sessions"][0]["time"] = "last tuesday"
    err = load_error("sample", write_jsonl(tmp_path / "when.jsonl", [ep]))
    assert_names(err, "when.jsonl", "ep-x", "sessions[0].time")


def locomo_sample(**conv_over) -> dict:
    conv = {
        "speaker_a": "Ann",
        "speaker_b": "Ben",
        "session_1_date_time": "9:00 am on 2 March, 2024",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "hey"}, {"speaker": "Ben", "dia_id": "D1:2", "text": "yo"}],
        "session_2": [{"speaker": "Ben", "dia_id": "D2:1", "text": "again"}],
    }
    conv.update(conv_over)
    return {"sample_id": "conv-1", "conversation": conv, "qa": [{"question": "q?", "answer": "a", "evidence": ["D1:1"], "category": 4}]}


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=1))
    return path


def test_locomo_fixture_builder_is_valid(tmp_path):
    c = load_corpus("locomo", write_json(tmp_path / "ok.json", [locomo_sample()]))
    assert turns_per_session(c, "locomo-conv-1") == [2, 1]


def test_bad_locomo_speaker(tmp_path):
    s = locomo_sample()
    s["conversation"]["session_2"][0]["speaker"] = "Cat"
    err = load_error("locomo", write_json(tmp_path / "lc.json", [s]))
    assert_names(err, "lc.json", "locomo-conv-1 (item 0)", "conversation.session_2[0].speaker")


def test_bad_locomo_empty_session(tmp_path):
    err = load_error("locomo", write_json(tmp_path / "lc.json", [locomo_sample(session_2=[])]))
    assert_names(err, "lc.json", "locomo-conv-1", "conversation.session_2")


def test_bad_locomo_missing_session_number(tmp_path):
    s = locomo_sample()
    s["conversation"]["session_3"] = s["conversation"].pop("session_2")
    err = load_error("locomo", write_json(tmp_path / "lc.json", [s]))
    assert_names(err, "lc.json", "locomo-conv-1", "conversation.session_2")


def test_bad_locomo_category_and_date(tmp_path):
    s = locomo_sample()
    s["qa"][0]["category"] = 9
    err = load_error("locomo", write_json(tmp_path / "lc.json", [s]))
    assert_names(err, "lc.json", "locomo-conv-1", "qa[0].category")
    err = load_error("locomo", write_json(tmp_path / "lc2.json", [locomo_sample(session_1_date_time="soon")]))
    assert_names(err, "lc2.json", "locomo-conv-1", "conversation.session_1_date_time")


def test_bad_locomo_missing_speaker_b(tmp_path):
    s = locomo_sample()
    del s["conversation"]["speaker_b"]
    err = load_error("locomo", write_json(tmp_path / "lc.json", [s]))
    assert_names(err, "lc.json", "locomo-conv-1", "conversation.speaker_b")


def cc_record(**over) -> dict:
    r = {
        "dataID": "e9",
        "first_session_dialogue": ["a", "b"],
        "first_session_speakers": ["P", "Q"],
        "second_session_dialogue": ["c"],
        "second_session_speakers": ["Q"],
    }
    r.update(over)
    return r


def test_bad_cc_speaker_count(tmp_path):
    err = load_error("cc", write_jsonl(tmp_path / "cc.jsonl", [cc_record(second_session_speakers=["Q", "P"])]))
    assert_names(err, "cc.jsonl", "cc-e9 (line 1)", "second_session_speakers")


def test_bad_cc_empty_session_before_a_real_one(tmp_path):
    rec = cc_record(second_session_dialogue=[], second_session_speakers=[], third_session_dialogue=["d"], third_session_speakers=["P"])
    err = load_error("cc", write_jsonl(tmp_path / "cc.jsonl", [rec]))
    assert_names(err, "cc.jsonl", "cc-e9", "second_session_dialogue")
    assert "empty session" in str(err)


def test_bad_cc_missing_middle_session(tmp_path):
    rec = cc_record(third_session_dialogue=["d"], third_session_speakers=["P"])
    del rec["second_session_dialogue"], rec["second_session_speakers"]
    err = load_error("cc", write_jsonl(tmp_path / "cc.jsonl", [rec]))
    assert_names(err, "cc.jsonl", "cc-e9", "second_session_dialogue")


def test_bad_cc_utterance_type(tmp_path):
    err = load_error("cc", write_jsonl(tmp_path / "cc.jsonl", [cc_record(first_session_dialogue=["a", 7])]))
    assert_names(err, "cc.jsonl", "cc-e9", "first_session_dialogue[1]")


def test_cc_numeric_session_keys_sort_numerically(tmp_path):
    rec = {"dataID": 4, "session_11_dialogue": ["k"], "session_11_speakers": ["P"]}
    for n in range(1, 11):
        rec[f"session_{n}_dialogue"] = [f"s{n}"] * n
        rec[f"session_{n}_speakers"] = ["P"] * n
    c = load_corpus("cc", write_jsonl(tmp_path / "num.jsonl", [rec]))
    assert c.episodes[0]["episode_id"] == "cc-4"
    assert turns_per_session(c, "cc-4") == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1]


def test_bad_msc_turn_text(tmp_path):
    rec = {"metadata": {"initial_data_id": "v1"}, "previous_dialogs": [{"dialog": [{"text": "a"}, {"txt": "b"}]}], "dialog": [{"text": "c"}]}
    err = load_error("msc", write_jsonl(tmp_path / "m.jsonl", [rec]))
    assert_names(err, "m.jsonl", "msc-v1 (line 1)", "previous_dialogs[0].dialog[1].text")


def test_bad_msc_missing_dialog(tmp_path):
    err = load_error("msc", write_jsonl(tmp_path / "m.jsonl", [{"metadata": {"initial_data_id": "v1"}}]))
    assert_names(err, "m.jsonl", "msc-v1", "dialog")


def test_bad_longmtbench(tmp_path):
    rec = {"id": "r1", "sessions": [[{"role": "user", "content": "x"}]], "questions": ["a?", "b?"], "answers": ["a"]}
    err = load_error("longmtbench", write_json(tmp_path / "lm.json", [rec]))
    assert_names(err, "lm.json", "longmtbench-r1 (item 0)", "answers")
    rec = {"id": "r1", "sessions": [[{"role": "system", "content": "x"}]], "questions": [], "answers": []}
    err = load_error("longmtbench", write_json(tmp_path / "lm2.json", [rec]))
    assert_names(err, "lm2.json", "longmtbench-r1", "sessions[0][0].role")
    rec = {"id": "r1", "sessions": [[{"role": "user", "content": "x"}], []], "questions": [], "answers": []}
    err = load_error("longmtbench", write_json(tmp_path / "lm3.json", [rec]))
    assert_names(err, "lm3.json", "longmtbench-r1", "sessions[1]")


def test_bad_dialseg_segment_sum(tmp_path):
    rec = {"dial_id": "d1", "utterances": ["a", "b", "c"], "segments": [2, 2]}
    err = load_error("dialseg", write_json(tmp_path / "seg.json", [rec]))
    assert_names(err, "seg.json", "dialseg-d1 (item 0)", "segments")
    assert "sum to 4" in str(err) and "3 utterances" in str(err)


def test_bad_dialseg_labels(tmp_path):
    err = load_error("dialseg", write_json(tmp_path / "lab.json", {"id": "d2", "utterances": ["a", "b"], "shift_labels": [0]}))
    assert_names(err, "lab.json", "dialseg-d2 (object)", "shift_labels")
    err = load_error("dialseg", write_json(tmp_path / "none.json", {"id": "d3", "utterances": ["a", "b"]}))
    assert_names(err, "none.json", "dialseg-d3", "segments")


def test_bad_sample_personas_and_speakers(tmp_path):
    err = load_error("sample", write_jsonl(tmp_path / "p.jsonl", [ok_sample(personas={"A": ["x"], "Q": ["y"]})]))
    assert_names(err, "p.jsonl", "ep-x", "personas")
    assert "'Q'" in str(err)
    err = load_error("sample", write_jsonl(tmp_path / "s.jsonl", [ok_sample(speakers=["A", "B", "A"])]))
    assert_names(err, "s.jsonl", "ep-x", "speakers")


def test_not_an_object(tmp_path):
    err = load_error("locomo", write_json(tmp_path / "l.json", [locomo_sample(), "oops"]))
    assert_names(err, "l.json", "item 1", None)
    assert "expected an object, got string" in str(err)


def test_locomo_keeps_session_summaries_and_observations_as_notes(tmp_path):
    s = locomo_sample()
    s["session_summary"] = {"session_1_summary": "Ann and Ben said hello."}
    s["observation"] = {"session_2_observation": {"Ben": [["Ben came back.", "D2:1"]]}}
    c = load_corpus("locomo", write_json(tmp_path / "notes.json", [s]))
    notes = c.episodes[0]["notes"]
    assert notes == [{"session_idx": 1, "kind": "summary", "speaker": None, "text": "Ann and Ben said hello."},
                     {"session_idx": 2, "kind": "observation", "speaker": "Ben", "text": "Ben came back."}]
    assert load_corpus("locomo", write_json(tmp_path / "bare.json", [locomo_sample()])).episodes[0]["notes"] is None
    s["observation"] = {"session_2_observation": {"Ben": [[7, "D2:1"]]}}
    err = load_error("locomo", write_json(tmp_path / "bad.json", [s]))
    assert_names(err, "bad.json", "locomo-conv-1", "observation.session_2_observation.Ben[0]")
