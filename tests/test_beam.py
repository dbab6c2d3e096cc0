"""BEAM: the loader reads the release's chats/ layout (<size>/<id>/ with the chat and
probing_questions/probing_questions.json; a 10M chat as its plans' batches in one list) into one episode
per conversation, a batch a session, a message a turn, every probing question a QA row of its ability with
the release's ideal answer and rubric; bad input fails naming file, record and field; `mempipe data fetch
beam` pins the release's files at one commit into that layout. The fixture is our own tiny conversations
in the published layout (mohammadtavakoli78/BEAM at b2a3ee8ba12d)."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pipeline.corpus import beam_manifest, iter_episodes, load_corpus, sources
from pipeline.corpus.beam import ANSWER_FIELDS, anchor_time
from pipeline.corpus.fetch import PINS_FILE, fetch, missing_corpus_hint
from pipeline.errors import InputError
from pipeline.schemas import EPISODES, QA, TURNS

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "corpora" / "beam"
QUESTIONS = Path("probing_questions") / "probing_questions.json"


def _turns(corpus, episode_id: str) -> list[dict]:
    return [t for t in corpus.turns if t["episode_id"] == episode_id]


def _qa(corpus, episode_id: str) -> dict[str, dict]:
    return {q["category"]: q for q in corpus.qa if q["episode_id"] == episode_id}


# --- the loader -------------------------------------------------------------------------------------

def test_each_conversation_is_an_episode_read_size_by_size_in_numeric_order():
    corpus = load_corpus("beam", FIXTURE)
    assert [(e["episode_id"], e["dataset"], e["n_sessions"], e["speakers"]) for e in corpus.episodes] == [
        ("beam-100K-1", "beam", 2, ["user", "assistant"]), ("beam-100K-2", "beam", 1, ["user", "assistant"]),
        ("beam-10M-1", "beam", 3, ["user", "assistant"])]
    assert corpus.episodes[0]["source_file"] == str(FIXTURE / "100K" / "1" / "chat.json")


def test_a_batch_is_a_session_and_each_message_a_turn_of_its_role_with_its_id():
    turns = _turns(load_corpus("beam", FIXTURE), "beam-100K-1")
    assert [(t["session_idx"], t["turn_idx"], t["speaker"], t["source_turn_id"]) for t in turns] == [
        (1, 0, "user", "0"), (1, 1, "assistant", "1"), (1, 2, "user", "2"), (1, 3, "assistant", "3"),
        (2, 0, "user", "4"), (2, 1, "assistant", "5")]
    # the text as published, the user's plan marker kept
    assert turns[2]["text"] == "Which of those needs the most sun? ->-> 1,2"


def test_a_session_is_dated_by_the_time_anchor_its_first_message_carries():
    turns = _turns(load_corpus("beam", FIXTURE), "beam-100K-1")
    assert {t["session_idx"]: t["session_time"] for t in turns} == {1: datetime(2024, 3, 15),
                                                                     2: datetime(2024, 4, 2)}  # "Apr-2-2024"


def test_a_batch_anchor_of_its_own_dates_the_session_before_its_messages_anchors(tmp_path: Path):
    conv = _copy(tmp_path, "100K/1")
    chat = json.loads((conv / "chat.json").read_text())
    chat[1]["time_anchor"] = "May-9-2024"
    (conv / "chat.json").write_text(json.dumps(chat))
    turns = _turns(load_corpus("beam", conv), "beam-100K-1")
    assert turns[-1]["session_time"] == datetime(2024, 5, 9)


@pytest.mark.parametrize(("text", "when"), [("March-15-2024", datetime(2024, 3, 15)),
                                            ("Sep-1-2023", datetime(2023, 9, 1)),
                                            ("2024-06-30", datetime(2024, 6, 30))])
def test_time_anchors_read_as_month_day_year_or_iso(text: str, when: datetime):
    assert anchor_time(text) == when


def test_the_truncated_chat_is_read_where_the_folder_has_one():
    corpus = load_corpus("beam", FIXTURE)
    texts = [t["text"] for t in _turns(corpus, "beam-100K-2")]
    assert texts == ["I run 5 km every Sunday morning. ->-> 1,1", "A steady weekly run is a good base."]
    assert corpus.episodes[1]["source_file"] == str(FIXTURE / "100K" / "2" / "chat_trunecated.json")


def test_every_probing_question_is_a_qa_row_of_its_ability_with_the_ideal_answer_and_rubric():
    qa = _qa(load_corpus("beam", FIXTURE), "beam-100K-1")
    assert list(qa) == list(ANSWER_FIELDS)  # all ten abilities, in the file's order
    published = json.loads((FIXTURE / "100K" / "1" / QUESTIONS).read_text())
    for ability, field in ANSWER_FIELDS.items():
        assert qa[ability]["answer"] == published[ability][0][field]
        assert qa[ability]["judge_notes"] == published[ability][0]["rubric"]
        assert qa[ability]["question"] == published[ability][0]["question"]
    assert qa["abstention"]["answer"].startswith("Based on the provided chat, there is no information")
    assert qa["instruction_following"]["answer"] == "Response should be a single sentence."
    assert qa["event_ordering"]["judge_notes"] == ["Sunlight", "Mint"]
    assert qa["temporal_reasoning"]["qa_id"] == "beam-100K-1-temporal_reasoning-0"
    assert [q for q in qa if qa[q]["abstention"]] == ["abstention"]


def test_evidence_is_the_message_ids_source_chat_ids_names_kept_to_the_chats_messages():
    qa = _qa(load_corpus("beam", FIXTURE), "beam-100K-1")
    assert qa["event_ordering"]["evidence"] == ["2", "4"]  # a list
    assert qa["contradiction_resolution"]["evidence"] == ["0", "4"]  # an object of lists, in order
    assert qa["temporal_reasoning"]["evidence"] == ["0"]  # once each
    assert qa["knowledge_update"]["evidence"] == ["0", "4"]  # 99 names no message: dropped
    assert qa["summarization"]["evidence"] is None and qa["abstention"]["evidence"] is None  # none given


def test_a_10m_chat_reads_its_plans_batches_in_order_with_ids_in_one_sequence():
    corpus = load_corpus("beam", FIXTURE)
    turns = _turns(corpus, "beam-10M-1")
    assert [(t["session_idx"], t["source_turn_id"]) for t in turns] == [
        (1, "0"), (1, "1"), (2, "2"), (2, "3"), (3, "4"), (3, "5")]
    assert [t["session_time"] for t in turns[::2]] == [datetime(2025, 1, 10), datetime(2025, 2, 3),
                                                       datetime(2025, 2, 20)]
    assert _qa(corpus, "beam-10M-1")["knowledge_update"]["evidence"] == ["0", "2"]


def test_a_size_folder_or_one_conversation_folder_loads_alone():
    assert [e["episode_id"] for e in load_corpus("beam", FIXTURE / "100K").episodes] == ["beam-100K-1",
                                                                                         "beam-100K-2"]
    assert [e["episode_id"] for e in load_corpus("beam", FIXTURE / "10M" / "1").episodes] == ["beam-10M-1"]


def test_episodes_are_selected_by_episode_id_or_the_corpus_own_size_and_id():
    corpus = load_corpus("beam", FIXTURE, episode_ids=["100K-2", "beam-10M-1"])
    assert [e["episode_id"] for e in corpus.episodes] == ["beam-100K-2", "beam-10M-1"]
    assert [r.episode["episode_id"] for r in iter_episodes("beam", FIXTURE, limit=1)] == ["beam-100K-1"]


# --- bad input ---------------------------------------------------------------------------------------

def _copy(tmp_path: Path, conversation: str) -> Path:
    """A copy of one fixture conversation, as tmp_path/<size>/<id>."""
    target = tmp_path / conversation
    shutil.copytree(FIXTURE / conversation, target)
    return target


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_bad_message_fails_naming_the_chat_file_the_conversation_and_the_field(tmp_path: Path):
    conv = _copy(tmp_path, "100K/1")
    chat = conv / "chat.json"
    _edit(chat, lambda d: d[1]["turns"][0][1].update(role="system"))
    with pytest.raises(InputError) as caught:
        load_corpus("beam", tmp_path)
    assert str(caught.value) == (f"file {chat}, record beam-100K-1 (conversation 100K/1), field "
                                 "'[1].turns[0][1].role': expected 'user' or 'assistant', got 'system'")
    _edit(chat, lambda d: d[1]["turns"][0][1].update(role="assistant", content=None))
    with pytest.raises(InputError, match=r"field '\[1\]\.turns\[0\]\[1\]\.content': required field is missing"):
        load_corpus("beam", tmp_path)
    _edit(chat, lambda d: d[1]["turns"][0][1].update(content="ok", id=2))
    with pytest.raises(InputError, match=r"field '\[1\]\.turns\[0\]\[1\]\.id': duplicate message id '2' "
                                         r"\(first: \[0\]\.turns\[1\]\[0\]\)"):
        load_corpus("beam", tmp_path)
    _edit(chat, lambda d: d[1]["turns"][0][1].update(id=5) or d[1]["turns"][0][0].update(time_anchor="spring"))
    with pytest.raises(InputError, match=r"field '\[1\]\.turns\[0\]\[0\]\.time_anchor': unrecognised time anchor "
                                         r"'spring'"):
        load_corpus("beam", tmp_path)


def test_a_bad_probing_question_fails_naming_the_questions_file_and_the_field(tmp_path: Path):
    conv = _copy(tmp_path, "100K/1")
    questions = conv / QUESTIONS
    _edit(questions, lambda d: d["summarization"][0].pop("ideal_summary"))
    with pytest.raises(InputError) as caught:
        load_corpus("beam", tmp_path)
    assert str(caught.value) == (f"file {questions}, record beam-100K-1 (conversation 100K/1), field "
                                 "'summarization[0].ideal_summary': required field is missing or null")
    _edit(questions, lambda d: d["summarization"][0].update(ideal_summary="s", rubric="one item"))
    with pytest.raises(InputError, match=r"field 'summarization\[0\]\.rubric': expected a list, got string"):
        load_corpus("beam", tmp_path)
    _edit(questions, lambda d: d["summarization"][0].update(rubric=["r"], source_chat_ids={"first": [1, [2]]}))
    with pytest.raises(InputError, match=r"field 'summarization\[0\]\.source_chat_ids\.first\[1\]': expected an "
                                         r"integer or a string, got list"):
        load_corpus("beam", tmp_path)
    _edit(questions, lambda d: d.update(recall=[]) or d["summarization"][0].pop("source_chat_ids"))
    with pytest.raises(InputError, match=r"field 'recall': unknown ability 'recall' \(known: abstention, "):
        load_corpus("beam", tmp_path)


def test_a_conversation_folder_without_its_files_or_with_bad_json_fails_naming_it(tmp_path: Path):
    conv = _copy(tmp_path, "100K/1")
    (conv / QUESTIONS).unlink()
    with pytest.raises(InputError, match=r"probing_questions/probing_questions.json; it is missing"):
        load_corpus("beam", tmp_path)
    shutil.rmtree(conv)
    conv = _copy(tmp_path, "100K/1")
    (conv / "chat.json").write_text('[{"batch_number": 1,')
    with pytest.raises(InputError, match=rf"file {conv / 'chat.json'}, record line 1: invalid JSON"):
        load_corpus("beam", tmp_path)
    with pytest.raises(InputError, match="holds no BEAM conversations"):
        load_corpus("beam", tmp_path / "100K" / "1" / "probing_questions")
    with pytest.raises(InputError, match="no such directory"):
        load_corpus("beam", tmp_path / "missing", limit=0)


# --- the release's files and the fetch ------------------------------------------------------------------

def test_the_manifest_lists_each_conversations_chat_and_questions_at_one_commit():
    counts = {size: len(beam_manifest.files((size,))) for size in ("100K", "500K", "1M", "10M")}
    assert counts == {"100K": 40, "500K": 70, "1M": 70, "10M": 20}  # 20 / 35 / 35 / 10 conversations, two files
    paths = [p for p, _ in beam_manifest.files(("100K", "500K", "1M", "10M"))]
    assert paths[:2] == ["100K/1/chat.json", "100K/1/probing_questions/probing_questions.json"]
    assert "100K/5/chat_trunecated.json" in paths and "100K/5/chat.json" not in paths
    assert all(sha is not None for p, sha in beam_manifest.files(("100K", "500K")))


def test_the_registry_fetches_100k_to_1m_into_beam_and_10m_apart_into_beam_10m():
    beam, ten = sources.REGISTRY["beam"], sources.REGISTRY["beam-10m"]
    assert (beam.corpus_format, beam.corpus_path, beam.configs) == ("beam", "beam", ("beam.yaml",))
    assert (ten.corpus_format, ten.corpus_path) == ("beam", "beam-10m")
    assert len(beam.files) == 180 and len(ten.files) == 20
    url = f"https://raw.githubusercontent.com/mohammadtavakoli78/BEAM/{beam_manifest.COMMIT}/chats/100K/1/chat.json"
    assert (beam.files[0].url, beam.files[0].fname) == (url, "beam/100K/1/chat.json")
    assert ten.files[0].fname == "beam-10m/10M/1/chat_trunecated.json" and ten.files[0].sha256 is None
    assert all(f.sha256_source for f in beam.files if f.sha256)
    assert missing_corpus_hint("beam", "data/beam") == "run `mempipe data fetch beam`"
    assert missing_corpus_hint("beam", "data/beam-10m") == "run `mempipe data fetch beam-10m`"


def test_fetch_writes_the_layout_the_loader_reads_pinning_files_with_no_recorded_hash(tmp_path, monkeypatch,
                                                                                      mirror):
    # The registry's URL and file layout over the fixture's files: the chats unverified (pinned at the
    # first fetch, as the release's large files are), the questions with their hashes recorded.
    source = sources.REGISTRY["beam"]
    base = source.files[0].url.rsplit("/chats/", 1)[0]
    files = []
    for path in sorted(FIXTURE.rglob("*.json")):
        rel = path.relative_to(FIXTURE).as_posix()
        body = path.read_bytes()
        mirror.files[urlsplit(f"{base}/chats/{rel}").path] = body
        sha = None if "chat" in path.name else hashlib.sha256(body).hexdigest()
        files.append(sources.RemoteFile(f"{base}/chats/{rel}", f"beam/{rel}", sha, "the test" if sha else None))
    monkeypatch.setitem(sources.REGISTRY, "beam", sources.CorpusSource(
        "beam", "", "", "beam", "beam", files=tuple(files)))
    fetched = fetch("beam", tmp_path, progress=False, base_url_override=mirror.url)
    assert {f.check for f in fetched} == {"recorded", "pinned now"}
    pins = json.loads((tmp_path / PINS_FILE).read_text())
    assert set(pins) == {f.fname for f in files if f.sha256 is None}
    got, want = load_corpus("beam", tmp_path / "beam"), load_corpus("beam", FIXTURE)
    assert got.turns == want.turns and got.qa == want.qa
    # a second fetch finds every file in place and asks for nothing
    before = sum(mirror.requests.values())
    assert not any(f.downloaded for f in fetch("beam", tmp_path, progress=False, base_url_override=mirror.url))
    assert sum(mirror.requests.values()) == before


def test_the_tables_keep_the_canonical_schemas():
    tables = load_corpus("beam", FIXTURE).tables()
    assert [tables[k].schema for k in ("episodes", "turns", "qa")] == [EPISODES, TURNS, QA]
