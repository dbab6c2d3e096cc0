"""Corrupted corpora never crash the pipeline (issue 29): every loader, fed a valid fixture with one
random mutation (a field removed, a wrong type, null, the file truncated, invalid UTF-8, an empty
conversation, a duplicate id, an unknown speaker, evidence pointing nowhere, a 1 MB utterance),
either returns valid canonical records or raises InputError naming the file, the record and the
field. Any other exception fails the test. Hypothesis drives it, derandomized so CI is repeatable.

What the loaders do with odd but harmless input (docs/reliability.md, "Bad input"): a 1 MB utterance ingests;
evidence that names no turn is dropped and the question kept; a speaker the record does not
declare is an error where the format declares its speakers (sample, LoCoMo, Long-MT-Bench+'s
roles) and simply one more speaker where the turns' labels are the only list (MSC, CC, dialseg).
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.corpus import load_corpus
from pipeline.errors import InputError
from pipeline.schemas import EPISODES, QA, TURNS

CORPORA = Path(__file__).resolve().parent / "fixtures" / "corpora"

# (format, fixture): every format, and every record shape a format reads.
FUZZ_FIXTURES = [
    ("sample", CORPORA / "sample" / "episodes.jsonl"),
    ("msc", CORPORA / "msc" / "session_3.jsonl"),  # ParlAI records and a CC-style one
    ("cc", CORPORA / "cc" / "chronicles.json"),  # JSON Lines in a .json file, as released
    ("locomo", CORPORA / "locomo" / "locomo_mini.json"),
    ("longmtbench", CORPORA / "longmtbench" / "longmt_mini.json"),  # role/content
    ("longmtbench", CORPORA / "longmtbench" / "longmt_released.jsonl"),  # "[human]: ..." exchanges
    ("longmemeval", CORPORA / "longmemeval" / "longmemeval_mini.json"),  # has_answer turns as evidence
    ("dialseg", CORPORA / "dialseg" / "dialseg711_mini.json"),  # utterances + segments
    ("dialseg", CORPORA / "superdialseg" / "superdialseg_mini.json"),  # turns + segmentation_label
    ("dialseg", CORPORA / "tiage_dir" / "dlg_001.json"),  # one object per file, shift_labels
    ("dialseg", CORPORA / "tiage_dir" / "dlg_002.json"),  # speakers, labels, id from the file name
    ("dialseg", CORPORA / "dialseg_released" / "tiage_released.json"),  # {"dial_data": {...}}
    ("halumem", CORPORA / "halumem" / "HaluMem-Long.jsonl"),  # memory points, a generated QA session
]

KINDS = ("remove", "wrong_type", "null", "empty", "truncate", "invalid_utf8", "lone_surrogate",
         "duplicate_id", "unknown_speaker", "dangling_evidence", "huge_utterance")
# Mutations at a random JSON path explore more; the others have few distinct shapes.
EXAMPLES = {"remove": 30, "wrong_type": 30, "null": 25, "empty": 20, "truncate": 25, "invalid_utf8": 15}
DEFAULT_EXAMPLES = 10

# Formats whose records declare their speakers: a turn by anyone else is an error there. Elsewhere
# the turns' own labels are the speaker list, so a new name is one more speaker.
DECLARES_SPEAKERS = {"sample", "locomo", "longmtbench", "longmemeval", "halumem"}

BIG = "lorem ipsum " * 87_382  # just over 1 MiB
BAD_UTF8 = [b"\xff", b"\xfe\xfe", b"\x80", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80",
            b"\xc0\xaf"]
SURROGATES = ["\udc80", "\ud800", "\udfff"]
TEXT_KEYS = {"text", "content", "utterance", "utterances", "sessions"}

JsonPath = tuple  # a JSON path: ("sessions", 0, "turns", 1, "text")


# ---------------------------------------------------------------- fixtures as records


@dataclass(frozen=True)
class Fixture:
    fmt: str
    path: Path
    style: str  # jsonl | json_lines (JSON Lines in a .json file) | array | object
    records: tuple

    @property
    def id(self) -> str:
        return f"{self.fmt}-{self.path.stem}"


def read_fixture(fmt: str, path: Path) -> Fixture:
    text = path.read_text(encoding="utf-8")
    lines = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" else None
    if lines is not None:
        return Fixture(fmt, path, "jsonl", tuple(lines))
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return Fixture(fmt, path, "json_lines", tuple(json.loads(line) for line in text.splitlines() if line.strip()))
    return Fixture(fmt, path, "array", tuple(data)) if isinstance(data, list) else Fixture(fmt, path, "object", (data,))


def serialize(style: str, records: list) -> bytes:
    if style in ("jsonl", "json_lines"):
        return "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")
    if style == "array":
        return json.dumps(records, indent=1).encode("utf-8")
    assert len(records) == 1
    return json.dumps(records[0], indent=1).encode("utf-8")


def locator(style: str, index: int) -> str:
    """How the loader names record `index` (0-based) of a file written by `serialize`."""
    return {"jsonl": f"line {index + 1}", "json_lines": f"line {index + 1}", "array": f"item {index}",
            "object": "object"}[style]


def field_name(path: JsonPath) -> str:
    """("sessions", 0, "turns", 1, "text") -> "sessions[0].turns[1].text", as the loaders name fields."""
    out = ""
    for key in path:
        out = f"{out}[{key}]" if isinstance(key, int) else (f"{out}.{key}" if out else key)
    return out


FIXTURES = [read_fixture(fmt, p) for fmt, p in FUZZ_FIXTURES]


# ---------------------------------------------------------------- where mutations can land


def nodes(value: Any, path: JsonPath = ()) -> list[tuple[JsonPath, Any]]:
    """Every (path, value) in a JSON value, the root included, in document order."""
    out = [(path, value)]
    if isinstance(value, dict):
        for k, v in value.items():
            out += nodes(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += nodes(v, path + (i,))
    return out


def last_key(path: JsonPath) -> str | None:
    return next((k for k in reversed(path) if isinstance(k, str)), None)


def text_paths(record: Any) -> list[JsonPath]:
    """Utterance strings: turn texts, dialogue lists, Long-MT-Bench+ exchange strings."""
    return [p for p, v in nodes(record) if isinstance(v, str) and p
            and (last_key(p) in TEXT_KEYS or (last_key(p) or "").endswith("_dialogue"))]


def speaker_paths(fmt: str, record: Any) -> list[tuple[str, JsonPath]]:
    """("value", path): a speaker / role string to rename; ("tag", path): an exchange string whose
    "[human]:" tag to rename."""
    out = []
    for p, v in nodes(record):
        key = p[-1] if p else None
        parent = last_key(p)
        if key in ("speaker", "role") and isinstance(v, str):
            out.append(("value", p))
        elif isinstance(key, int) and isinstance(v, str) and (parent or "").endswith("_speakers"):
            out.append(("value", p))
        elif fmt == "msc" and isinstance(key, int) and isinstance(v, dict) and parent == "dialog":
            out.append(("value", p + ("id",)))  # ParlAI's turn speaker id (absent: alternating)
        elif fmt == "longmtbench" and parent == "sessions" and isinstance(v, str) and "[human]" in v:
            out.append(("tag", p))
    return out


def evidence_paths(fmt: str, record: Any) -> list[JsonPath]:
    """Lists of evidence ids (sample, LoCoMo), or Long-MT-Bench+'s per-question `turns` lists."""
    if fmt == "halumem":  # its evidence is memory points ({memory_content, memory_type}), no turn ids
        return []
    out = [p for p, v in nodes(record) if p and p[-1] == "evidence" and isinstance(v, list)]
    if fmt == "longmtbench" and isinstance(record.get("turns"), list):
        out += [("turns", i) for i, v in enumerate(record["turns"]) if isinstance(v, list)]
    return out


def applicable(fx: Fixture, kind: str) -> bool:
    recs = fx.records
    return {
        "unknown_speaker": any(speaker_paths(fx.fmt, r) for r in recs),
        "dangling_evidence": any(evidence_paths(fx.fmt, r) for r in recs),
        "huge_utterance": any(text_paths(r) for r in recs),
        "lone_surrogate": any(text_paths(r) for r in recs),
    }.get(kind, True)


def get(value: Any, path: JsonPath) -> Any:
    for k in path:
        value = value[k]
    return value


def put(record: Any, path: JsonPath, new: Any) -> Any:
    if not path:
        return new
    get(record, path[:-1])[path[-1]] = new
    return record


def json_type(v: Any) -> str:
    if v is None:
        return "null"
    return type(v).__name__  # bool, int, float, str, list, dict are distinct here


TYPE_VALUES = st.one_of(
    st.integers(-3, 10**6), st.just(2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.text(max_size=6), st.sampled_from(["line\nbreak", "", "  ", "\u2028"]),
    st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2),
)


# ---------------------------------------------------------------- one mutated corpus


@dataclass
class Case:
    """A mutated corpus on disk, and what the loader must say about it."""

    kind: str
    load_path: Path  # the file, or the folder holding the files
    file: str  # name of the file the mutation is in
    record: str | None  # the record's locator ("line 2", "item 0", "object"), None: file-level
    path: JsonPath | None = None  # the mutated JSON path inside the record
    expect: str = "either"  # either | ingest | error
    detail: Any = None


def draw_case(data: st.DataObject, fx: Fixture, kind: str, tmp: Path) -> Case:
    records = [copy.deepcopy(r) for r in fx.records]
    name = fx.path.name
    targets = {"unknown_speaker": lambda rec: speaker_paths(fx.fmt, rec),
               "dangling_evidence": lambda rec: evidence_paths(fx.fmt, rec),
               "huge_utterance": text_paths, "lone_surrogate": text_paths}.get(kind, lambda rec: True)
    r = data.draw(st.sampled_from([i for i, rec in enumerate(records) if targets(rec)]), label="record")
    rec = records[r]
    case = Case(kind, tmp / name, name, locator(fx.style, r))

    def write(recs: list) -> bytes:
        raw = serialize(fx.style, recs)
        (tmp / name).write_bytes(raw)
        return raw

    if kind in ("remove", "wrong_type", "null", "empty"):
        if kind == "remove":
            choices = [p for p, _ in nodes(rec) if p]
        elif kind == "empty":
            choices = [p for p, v in nodes(rec) if isinstance(v, (list, dict)) and v]
        else:
            choices = [p for p, _ in nodes(rec)]
        path = data.draw(st.sampled_from(choices), label="path")
        old = get(rec, path)
        if kind == "remove":
            del get(rec, path[:-1])[path[-1]]
        elif kind == "null":
            rec = put(rec, path, None)
        elif kind == "empty":
            rec = put(rec, path, type(old)())
        else:
            new = data.draw(TYPE_VALUES.filter(lambda v: json_type(v) != json_type(old)), label="value")
            rec = put(rec, path, new)
        records[r] = rec
        case.path = path
        if not path and fx.style == "object":
            case.record = None  # the file is no longer one record: a file-level error
        write(records)
        return case

    if kind == "truncate":
        raw = serialize(fx.style, records)
        cut = data.draw(st.integers(0, len(raw) - 1), label="cut")
        (tmp / name).write_bytes(raw[:cut])
        case.record = None  # JSON syntax errors name the line, found by the parser
        case.detail = raw[:cut]
        return case

    if kind == "invalid_utf8":
        raw = serialize(fx.style, records)
        pos = data.draw(st.integers(0, len(raw)), label="position")
        bad = data.draw(st.sampled_from(BAD_UTF8), label="bytes")
        (tmp / name).write_bytes(raw[:pos] + bad + raw[pos:])
        case.record = "line %d" % (raw[:pos].count(b"\n") + 1)  # the line the bad bytes are on
        case.expect = "error"
        return case

    if kind == "lone_surrogate":
        # Invalid UTF-8 the JSON way: a "\udc80" escape decodes to a lone surrogate, which no
        # UTF-8 (so no Arrow string) can hold.
        path = data.draw(st.sampled_from(text_paths(rec)), label="path")
        text = get(rec, path)
        at = data.draw(st.integers(0, min(len(text), 40)), label="at")
        put(rec, path, text[:at] + data.draw(st.sampled_from(SURROGATES)) + text[at:])
        case.path = path
        case.expect = "error"
        write(records)
        return case

    if kind == "duplicate_id":
        qa_dup = isinstance(rec.get("qa"), list) and rec["qa"] and data.draw(st.booleans(), label="qa")
        if qa_dup:  # a question given twice in the episode
            rec["qa"].append(copy.deepcopy(rec["qa"][data.draw(st.integers(0, len(rec["qa"]) - 1))]))
            case.detail = "qa"
            write(records)
        elif fx.style == "object":  # one record per file: the same file twice in a folder
            folder = tmp / "corpus"
            folder.mkdir()
            raw = serialize(fx.style, records)
            (folder / f"a_{name}").write_bytes(raw)
            (folder / f"b_{name}").write_bytes(raw)
            case.load_path, case.file = folder, f"b_{name}"
            case.detail = "episode"
        else:  # the record again, right after itself
            records.insert(r + 1, copy.deepcopy(rec))
            case.record = locator(fx.style, r + 1)
            case.detail = "episode"
            write(records)
        return case

    if kind == "unknown_speaker":
        how, path = data.draw(st.sampled_from(speaker_paths(fx.fmt, rec)), label="speaker")
        stranger = f"Stranger {data.draw(st.integers(0, 99), label='n')}"
        if how == "tag":
            put(rec, path, get(rec, path).replace("[human]", "[stranger]", 1))
        else:
            put(rec, path, stranger)
        case.path, case.detail = path, stranger
        case.expect = "error" if fx.fmt in DECLARES_SPEAKERS else "ingest"
        write(records)
        return case

    if kind == "dangling_evidence":
        path = data.draw(st.sampled_from(evidence_paths(fx.fmt, rec)), label="path")
        refs = get(rec, path)
        numeric = fx.fmt == "longmtbench" and all(isinstance(x, int) for x in refs)
        nowhere = (st.one_of(st.integers(10_000, 10**6), st.just(-1), st.just("S9:9")) if numeric else
                   st.sampled_from(["D99:1", "D1:99", "D0:0", "S9:9", "nowhere", "", "D1:1; D99:9"]))
        value = data.draw(nowhere, label="id")
        if refs and data.draw(st.booleans(), label="replace"):
            refs[data.draw(st.integers(0, len(refs) - 1))] = value
        else:
            refs.append(value)
        case.path, case.expect = path, "ingest"
        write(records)
        return case

    if kind == "huge_utterance":
        path = data.draw(st.sampled_from(text_paths(rec)), label="path")
        put(rec, path, get(rec, path) + " " + BIG)
        case.path, case.expect = path, "ingest"
        write(records)
        return case

    raise AssertionError(kind)


# ---------------------------------------------------------------- what the loader must do


def load(fmt: str, path: Path):
    """What ingest does with one corpus (stages/ingest.py): load_corpus, then the Arrow tables.
    Returns (corpus, tables) or the InputError; any other exception escapes and fails the test."""
    try:
        corpus = load_corpus(fmt, path)
        return corpus, corpus.tables(), None
    except InputError as err:
        return None, None, err


def check_valid(corpus, tables) -> None:
    """Valid canonical records: the schemas, dense indexes, known speakers, evidence that names turns."""
    assert tables["episodes"].schema.equals(EPISODES) and tables["turns"].schema.equals(TURNS)
    assert tables["qa"].schema.equals(QA)
    episodes = {e["episode_id"]: e for e in corpus.episodes}
    assert len(episodes) == len(corpus.episodes), "duplicate episode ids"
    sessions: dict[str, dict[int, list[int]]] = {}
    turn_ids: dict[str, set[str]] = {}
    for t in corpus.turns:
        ep = episodes[t["episode_id"]]
        assert t["speaker"] in ep["speakers"]
        assert isinstance(t["text"], str)
        sessions.setdefault(t["episode_id"], {}).setdefault(t["session_idx"], []).append(t["turn_idx"])
        turn_ids.setdefault(t["episode_id"], set()).add(t["source_turn_id"])
    for eid, ep in episodes.items():
        by_session = sessions.get(eid, {})
        assert sorted(by_session) == list(range(1, ep["n_sessions"] + 1)) and ep["n_sessions"] >= 1
        assert all(idx == list(range(len(idx))) and idx for idx in by_session.values())
    qa_ids = set()
    for q in corpus.qa:
        assert q["episode_id"] in episodes and (q["episode_id"], q["qa_id"]) not in qa_ids
        qa_ids.add((q["episode_id"], q["qa_id"]))
        missing = set(q["evidence"] or []) - turn_ids[q["episode_id"]]
        assert not missing, f"evidence pointing nowhere was kept: {missing}"


def assert_names(err: InputError, case: Case) -> None:
    """One line, starting with the file; the record (and field) when the mutation is inside one."""
    msg = str(err)
    assert "\n" not in msg and "\r" not in msg, f"not one line: {msg!r}"
    assert msg.startswith(f"file {err.file}") and Path(err.file).name == case.file, msg
    if case.record is not None:
        assert err.record is not None, msg
        if "duplicate episode id" not in msg:  # a mutated id may clash with a later record's
            assert err.record == case.record or err.record.endswith(f"({case.record})"), msg
    if case.path:  # inside a record, below its root: the field too
        assert err.field, msg


def check_case(fx: Fixture, case: Case) -> None:
    corpus, tables, err = load(fx.fmt, case.load_path)
    if err is not None:
        assert case.expect != "ingest", f"{case.kind} must ingest, got: {err}"
        assert_names(err, case)
        if case.kind == "truncate" and case.detail.strip():
            assert err.record is not None, str(err)  # the line the JSON breaks on
        if case.kind == "lone_surrogate":
            assert err.field == field_name(case.path), str(err)
        if case.kind == "unknown_speaker":
            assert err.field in (field_name(case.path), field_name(case.path[:-1])) or \
                re.search(r"(speaker|role)$", err.field or ""), str(err)
        if case.kind == "duplicate_id":
            assert "duplicate" in str(err) and err.field, str(err)
        return
    assert case.expect != "error", f"{case.kind} must fail with an InputError"
    check_valid(corpus, tables)
    if case.kind == "huge_utterance":
        assert max(len(t["text"]) for t in corpus.turns) >= len(BIG)
    if case.kind == "unknown_speaker":
        assert any(case.detail in e["speakers"] for e in corpus.episodes)
    if case.kind == "dangling_evidence":  # the question is kept
        assert len(corpus.qa) == len(load_corpus(fx.fmt, fx.path).qa)


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("fx", FIXTURES, ids=[fx.id for fx in FIXTURES])
def test_fixture_round_trips_unmutated(fx, tmp_path):
    """The fixtures as this file rewrites them load exactly as the originals."""
    (tmp_path / fx.path.name).write_bytes(serialize(fx.style, list(fx.records)))
    corpus, tables, err = load(fx.fmt, tmp_path / fx.path.name)
    assert err is None, str(err)
    check_valid(corpus, tables)
    original = load_corpus(fx.fmt, fx.path)
    assert [len(corpus.episodes), len(corpus.turns), len(corpus.qa)] == \
        [len(original.episodes), len(original.turns), len(original.qa)]


CASES = [(fx, kind) for fx in FIXTURES for kind in KINDS if applicable(fx, kind)]


@pytest.mark.parametrize("fx, kind", CASES, ids=[f"{fx.id}-{kind}" for fx, kind in CASES])
def test_a_mutated_corpus_ingests_or_names_file_record_and_field(fx, kind):
    @settings(max_examples=EXAMPLES.get(kind, DEFAULT_EXAMPLES), deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(st.data())
    def mutated(data):
        with tempfile.TemporaryDirectory() as tmp:
            check_case(fx, draw_case(data, fx, kind, Path(tmp)))

    mutated()


# ---------------------------------------------------------------- odd inputs found while fuzzing


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return p


def _sample_line(**over) -> str:
    ep = {"episode_id": "ep-x", "speakers": ["A", "B"],
          "sessions": [{"turns": [{"speaker": "A", "text": "hi"}, {"speaker": "B", "text": "hello"}]}]}
    ep.update(over)
    return json.dumps(ep)


@pytest.mark.parametrize("suffix, text, words", [
    (suffix, text, words) for suffix in (".json", ".jsonl") for text, words in [
        ("1" * 5000, "invalid JSON"),  # past Python's int digit limit: ValueError, not JSONDecodeError
        ("[" * 100_000, "nested too deeply"),  # RecursionError in the decoder
        ("", "holds no records"),
        ("\n  \n", "holds no records"),
    ]] + [(".json", "[]", "holds no records"), (".json", "null", "got null"), (".jsonl", "[]", "expected an object")])
def test_unparseable_or_empty_files_are_named(tmp_path, suffix, text, words):
    _, _, err = load("sample", _write(tmp_path, f"odd{suffix}", text))
    assert err is not None and words in str(err) and err.file.endswith(f"odd{suffix}") and "\n" not in str(err)


def test_invalid_utf8_names_its_line_in_a_big_jsonl_file(tmp_path):
    # The decoder reads in blocks: the error must still name the line the bad byte is on.
    lines = [_sample_line(episode_id=f"ep-{i}") for i in range(400)]
    raw = ("\n".join(lines[:300]) + "\n").encode() + lines[300].encode()[:-3] + b"\xff" + b'"}\n'
    _, _, err = load("sample", _write(tmp_path, "big.jsonl", raw))
    assert err is not None and err.record == "line 301", str(err)


def test_a_utf8_byte_order_mark_is_read(tmp_path):
    for name in ("bom.jsonl", "bom.json"):
        corpus, _, err = load("sample", _write(tmp_path, name, b"\xef\xbb\xbf" + _sample_line().encode() + b"\n"))
        assert err is None and [e["episode_id"] for e in corpus.episodes] == ["ep-x"], str(err)


def test_json_lines_in_a_json_file_split_at_newlines_only(tmp_path):
    # A raw U+2028 (legal inside a JSON string) is a line break to str.splitlines().
    recs = [{"dataID": "a", "first_session_dialogue": ["one\u2028two", "x\x85y"], "first_session_speakers": ["P", "Q"]},
            {"dataID": "b", "first_session_dialogue": ["three"], "first_session_speakers": ["P"]}]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
    corpus, _, err = load("cc", _write(tmp_path, "c.json", text))
    assert err is None, str(err)
    assert [t["text"] for t in corpus.turns] == ["one\u2028two", "x\x85y", "three"]


def test_a_time_past_the_calendar_is_named(tmp_path):
    line = json.loads(_sample_line())
    line["sessions"][0]["time"] = "0001-01-01T00:00:00+05:00"  # UTC would be year 0
    _, _, err = load("sample", _write(tmp_path, "t.jsonl", json.dumps(line)))
    assert err is not None and err.field == "sessions[0].time", str(err)


def test_an_id_with_a_line_break_keeps_the_error_on_one_line(tmp_path):
    line = json.loads(_sample_line(episode_id="two\nlines"))
    line["sessions"][0]["turns"][0]["text"] = 3
    _, _, err = load("sample", _write(tmp_path, "nl.jsonl", json.dumps(line)))
    assert err is not None and "\n" not in str(err) and "two\\nlines" in str(err)


def test_a_lone_surrogate_in_a_name_is_named(tmp_path):
    released = {"dial_data": {"ti\udc80ge": [{"turns": [{"role": "u", "utterance": "x", "segmentation_label": 0}]}]}}
    _, _, err = load("dialseg", _write(tmp_path, "d.json", json.dumps(released)))
    assert err is not None and err.field == "dial_data", str(err)
    s = json.loads((CORPORA / "locomo" / "locomo_mini.json").read_text())
    s[0]["observation"]["session_1_observation"] = {"Pri\ud800ya": [["x", "D1:1"]]}
    _, _, err = load("locomo", _write(tmp_path, "l.json", json.dumps(s)))
    assert err is not None and err.field == "observation.session_1_observation", str(err)


def test_locomo_packed_evidence_is_split_and_dangling_ids_dropped(tmp_path):
    s = json.loads((CORPORA / "locomo" / "locomo_mini.json").read_text())
    s[0]["qa"][0]["evidence"] = ["D1:1; D1:2", "D99:9"]
    s[0]["qa"][1]["evidence"] = ["D42:1"]
    corpus, _, err = load("locomo", _write(tmp_path, "l.json", json.dumps(s)))
    assert err is None, str(err)
    assert [q["evidence"] for q in corpus.qa[:2]] == [["D1:1", "D1:2"], None]


# ---------------------------------------------------------------- end to end, through the CLI


def _corrupt(fmt: str, tmp_path: Path) -> tuple[Path, str, str]:
    """One corrupted file per format: (path, record, field) the error must name."""
    fx = next(f for f in FIXTURES if f.fmt == fmt)
    recs = [copy.deepcopy(r) for r in fx.records]
    if fmt == "sample":
        recs[0]["sessions"][0]["turns"][1]["text"] = None
        record, field = "garden-01 (line 1)", "sessions[0].turns[1].text"
    elif fmt == "msc":
        recs[0]["dialog"][1]["text"] = 7
        record, field = "msc-train_77 (line 1)", "dialog[1].text"
    elif fmt == "cc":
        del recs[1]["second_session_speakers"]
        record, field = "cc-episode-2 (line 2)", "second_session_speakers"
    elif fmt == "locomo":
        recs[1]["qa"][0]["category"] = "hard"
        record, field = "locomo-conv-91 (item 1)", "qa[0].category"
    elif fmt == "longmtbench":
        recs[0]["sessions"][1][2]["role"] = "narrator"
        record, field = "longmtbench-lm-a (item 0)", "sessions[1][2].role"
    elif fmt == "longmemeval":
        recs[2]["haystack_dates"][1] = "last Tuesday"
        record, field = "longmemeval-tr_0003 (item 2)", "haystack_dates[1]"
    else:
        recs[1]["segments"] = [2, 3, 3]
        record, field = "dialseg-711-2 (item 1)", "segments"
    path = tmp_path / f"corrupt{fx.path.suffix}"
    path.write_bytes(serialize(fx.style, recs))
    return path, record, field


@pytest.mark.parametrize("fmt", ["sample", "msc", "cc", "locomo", "longmtbench", "longmemeval", "dialseg"])
def test_cli_exits_1_with_one_line_and_publishes_nothing(fmt, tmp_path, capsys, monkeypatch):
    from stages.cli import main

    monkeypatch.chdir(tmp_path)
    path, record, field = _corrupt(fmt, tmp_path)
    artifacts = tmp_path / "artifacts"
    code = main(["run", "--only", "ingest", "--set", f"artifacts_dir={artifacts}", "--set", f"corpus.format={fmt}",
                 "--set", f"corpus.path={path}", "--set", "corpus.limit=null", "--set", "ray.executor=inline"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("mempipe: error: file ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert all(line.startswith("ingest:") for line in lines[:-1]), err  # progress lines only
    prefix = f"mempipe: error: file {path}, record {record}, field {field!r}: "
    assert errors[0].startswith(prefix) and len(errors[0]) > len(prefix), err
    assert not list(artifacts.rglob("_manifest.json")) and not (artifacts / "default" / "ingest").exists()
