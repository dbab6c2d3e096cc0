"""LoCoMo-Plus: the loader stitches each cue item into LoCoMo conversation i mod 10 as the release's
data/unified_input.py and data/build_conv.py do (xjtuleeyf/Locomo-Plus at commit
059f4e3d38f7f1f96765e8e2cb7de3097551bffb; expected values derived by hand from that code): the trigger is
asked a week after the last session, the cue session sits `time_gap` before it, A/B are speaker_a/speaker_b;
LoCoMo's own samples are read as the `locomo` format reads them; bad input fails naming file, record, field."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pipeline.corpus import load_corpus, sources
from pipeline.corpus.fetch import fetch, missing_corpus_hint
from pipeline.corpus.locomo_plus import gap_days
from pipeline.errors import InputError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "corpora" / "locomo_plus"


def _sessions(corpus, episode_id: str) -> list[list[str]]:
    """Each session's turn texts, in order."""
    out: dict[int, list[str]] = {}
    for t in corpus.turns:
        if t["episode_id"] == episode_id:
            out.setdefault(t["session_idx"], []).append(t["text"])
    return [out[k] for k in sorted(out)]


@pytest.mark.parametrize(("gap", "days"), [
    ("two weeks later", 14), ("about one year later", 365), ("a month later", 30), ("six weeks later", 42),
    ("3 months later", 90), ("several months later", 0), ("a couple of months later", 0),
    ("around one week after the birth", 7), ("two months after the challenge ended", 60),
])
def test_time_gap_reads_a_number_before_week_month_or_year_and_nothing_else(gap: str, days: int) -> None:
    assert gap_days(gap) == days


def test_cue_items_come_first_then_locomos_ten_as_the_locomo_format_reads_them() -> None:
    corpus = load_corpus("locomo_plus", FIXTURE)
    assert [e["episode_id"] for e in corpus.episodes] == [
        "locomo_plus-c0", "locomo_plus-c1", "locomo_plus-c2", "locomo-conv-90", "locomo-conv-91"]
    plain = load_corpus("locomo", FIXTURE / "locomo10.json")
    assert [q for q in corpus.qa if q["episode_id"].startswith("locomo-")] == plain.qa
    assert [t for t in corpus.turns if t["episode_id"].startswith("locomo-")] == plain.turns


def test_the_cue_session_sits_time_gap_before_a_trigger_asked_a_week_after_the_last_session() -> None:
    corpus = load_corpus("locomo_plus", FIXTURE, limit=3)
    base = _sessions(load_corpus("locomo", FIXTURE / "locomo10.json"), "locomo-conv-90")
    base91 = _sessions(load_corpus("locomo", FIXTURE / "locomo10.json"), "locomo-conv-91")
    cue0 = ["After learning to say 'no', I've felt a lot less stressed overall.",
            "That's a great skill to develop; protecting your time is important."]
    # conv-90 ends 27 Oct 2023 10:37; asked 3 Nov; two weeks back (20 Oct) falls between sessions 11 and 12
    assert _sessions(corpus, "locomo_plus-c0") == [*base[:11], cue0, base[11]]
    # item 1 pairs with conv-91 (1 mod 2); a year back is before its first session
    assert _sessions(corpus, "locomo_plus-c1") == [["My knee surgery is scheduled, so no running for a while."],
                                                   *base91]
    # item 2 pairs with conv-90 again; "several months" reads as 0 days: the cue follows the last session
    assert _sessions(corpus, "locomo_plus-c2")[:-1] == base
    cue_turns = [t for t in corpus.turns if t["episode_id"] == "locomo_plus-c0" and t["text"] in cue0]
    assert [(t["speaker"], t["source_turn_id"]) for t in cue_turns] == [("Priya", "C1:1"), ("Dev", "C1:2")]
    assert cue_turns[0]["session_time"] == datetime(2023, 10, 20, 10, 37)


def test_the_trigger_is_the_question_with_no_answer_and_the_cue_as_its_evidence() -> None:
    qa = load_corpus("locomo_plus", FIXTURE, limit=2).qa
    assert [(q["qa_id"], q["category"], q["answer"]) for q in qa] == [
        ("locomo_plus-c0-q0", "cognitive", None), ("locomo_plus-c1-q0", "cognitive", None)]
    assert qa[0]["question"] == "Priya: I ended up volunteering for that project, and now I'm totally overwhelmed."
    assert qa[1]["question"] == "Kim: Want to sign up for the city marathon with me next month?"  # B is speaker_b
    assert qa[0]["evidence"] == ["C1:1", "C1:2"]
    assert qa[0]["asked_at"] == datetime(2023, 11, 3, 10, 37)


def _copy(tmp_path: Path, items: list) -> Path:
    shutil.copy(FIXTURE / "locomo10.json", tmp_path / "locomo10.json")
    (tmp_path / "locomo_plus.json").write_text(json.dumps(items))
    return tmp_path


def test_bad_cue_items_fail_naming_the_file_the_item_and_the_field(tmp_path: Path) -> None:
    items = json.loads((FIXTURE / "locomo_plus.json").read_text())
    items[1]["trigger_query"] = "Want to sign up for the marathon?"
    with pytest.raises(InputError) as caught:
        load_corpus("locomo_plus", _copy(tmp_path, items))
    assert str(caught.value) == (f"file {tmp_path / 'locomo_plus.json'}, record item 1, field 'trigger_query': "
                                 'holds no "A:" or "B:" line')
    del items[1]["trigger_query"]
    with pytest.raises(InputError, match=r"record item 1, field 'trigger_query'"):
        load_corpus("locomo_plus", _copy(tmp_path, items))
    items[1]["trigger_query"] = "B: hi"
    items[0]["time_gap"] = 14
    with pytest.raises(InputError, match=r"record item 0, field 'time_gap'"):
        load_corpus("locomo_plus", _copy(tmp_path, items))


def test_a_directory_without_both_files_fails_naming_the_missing_one(tmp_path: Path) -> None:
    shutil.copy(FIXTURE / "locomo_plus.json", tmp_path / "locomo_plus.json")
    with pytest.raises(InputError, match="locomo10.json is missing"):
        load_corpus("locomo_plus", tmp_path)


def test_fetch_pins_both_release_files_at_one_commit_into_the_directory_the_loader_reads(tmp_path, monkeypatch,
                                                                                         mirror):
    source = sources.REGISTRY["locomo-plus"]
    assert missing_corpus_hint("locomo_plus") == "run `mempipe data fetch locomo-plus`"
    assert [f.fname for f in source.files] == ["locomo-plus/locomo_plus.json", "locomo-plus/locomo10.json"]
    assert all("/059f4e3d38f7f1f96765e8e2cb7de3097551bffb/data/" in f.url and f.sha256 for f in source.files)
    # The fixture files are not the release's: the same entry with the fixture's hashes.
    bodies = {urlsplit(f.url).path: (FIXTURE / f.fname.split("/")[1]).read_bytes() for f in source.files}

    mirror.files.update(bodies)
    monkeypatch.setitem(sources.REGISTRY, "locomo-plus", sources.CorpusSource(
        source.name, "", "", source.corpus_format, source.corpus_path, files=tuple(
            sources.RemoteFile(f.url, f.fname, hashlib.sha256(bodies[urlsplit(f.url).path]).hexdigest(), "the test")
            for f in source.files)))
    fetch("locomo-plus", tmp_path, progress=False, base_url_override=mirror.url)
    corpus = load_corpus("locomo_plus", tmp_path / source.corpus_path)
    assert len(corpus.episodes) == 5 and corpus.qa[0]["category"] == "cognitive"
