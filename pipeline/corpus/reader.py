"""Find corpus files and read them as raw JSON records, naming the file and line on bad input."""

from __future__ import annotations

import json
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError

SUFFIXES = (".json", ".jsonl")


@dataclass(frozen=True)
class RawRecord:
    file: Path
    locator: str  # "line 3" (JSONL), "item 2" (JSON list) or "object" (file holding one object)
    index: int  # 0-based position of the record within its file
    data: Any

    @property
    def single(self) -> bool:
        """The file holds just this one object (dialseg: one dialogue per file)."""
        return self.locator == "object"


def corpus_files(path: str | Path) -> list[Path]:
    """A file as given, or every *.json / *.jsonl file in a directory, sorted by name."""
    p = Path(path)
    if not p.exists():
        raise InputError(str(p), None, None, "no such file or directory")
    if p.is_dir():
        files = sorted((f for f in p.iterdir() if f.is_file() and f.suffix in SUFFIXES), key=lambda f: f.name)
        if not files:
            raise InputError(str(p), None, None, "directory holds no .json or .jsonl files")
    else:
        files = [p]
    for f in files:
        try:
            str(f).encode("utf-8")
        except UnicodeEncodeError:
            # A name in bytes that are not UTF-8 (Linux keeps them as surrogates): it would reach the
            # tables as `source_file` (and as episode ids derived from it), which Arrow cannot store.
            shown = str(f).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            raise InputError(shown, None, None, "the file name is not valid UTF-8: rename the file") from None
    return files


def iter_records(path: str | Path) -> Generator[RawRecord, None, None]:
    """Records of every corpus file in order. JSONL is streamed, so a limit need not read the whole file."""
    for f in corpus_files(path):
        yield from _file_records(f)


_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark (Windows tools write one) is skipped


def _file_records(f: Path) -> Iterator[RawRecord]:
    if f.suffix == ".jsonl":
        # Bytes, decoded line by line: an invalid byte is reported on its own line (a text-mode file
        # decodes in blocks, ahead of the line being read).
        with _open(f) as fh:
            yield from _lines(f, fh)
        return
    with _open(f) as fh:
        raw = fh.read()
    if raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputError(str(f), f"line {line}", None, f"not UTF-8 text: {e.reason}") from None
    if not text.strip():
        raise InputError(str(f), None, None, "holds no records (the file is empty)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        # Many ".json" dataset files are really JSON Lines; "Extra data" means the first value parsed whole.
        # Lines end at "\n" only: str.splitlines() would also break inside a string at U+2028 and kin.
        if e.msg == "Extra data":
            yield from _lines(f, text.split("\n"))
            return
        raise InputError(str(f), f"line {e.lineno}", None, f"invalid JSON: {e.msg} (column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise InputError(str(f), None, None, _unreadable(e)) from None
    if isinstance(data, list):
        if not data:
            raise InputError(str(f), None, None, "holds no records (an empty list)")
        for i, item in enumerate(data):
            yield RawRecord(f, f"item {i}", i, item)
    elif isinstance(data, dict):
        yield RawRecord(f, "object", 0, data)
    else:
        kind = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string"}
        raise InputError(str(f), None, None, f"expected a JSON object or a list of objects, got {kind[type(data)]}")


def _unreadable(e: Exception) -> str:
    """json.loads' errors that are not JSONDecodeError: a number past Python's digit limit
    (ValueError), nesting past the recursion limit (RecursionError)."""
    if isinstance(e, RecursionError):
        return "invalid JSON: nested too deeply"
    return f"invalid JSON: {str(e).split(':')[0]}"


def _open(f: Path):
    try:
        return f.open("rb")
    except OSError as e:
        raise InputError(str(f), None, None, f"cannot read: {e.strerror}") from None


def _lines(f: Path, lines: Iterable[bytes | str]) -> Iterator[RawRecord]:
    index = 0
    for lineno, line in enumerate(lines, start=1):
        if isinstance(line, bytes):
            if lineno == 1 and line.startswith(_BOM):
                line = line[len(_BOM):]
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(str(f), f"line {lineno}", None,
                                 f"not UTF-8 text: {e.reason} (byte {e.start + 1} of the line)") from None
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(str(f), f"line {lineno}", None, f"invalid JSON: {e.msg} (column {e.colno})") from None
        except (ValueError, RecursionError) as e:
            raise InputError(str(f), f"line {lineno}", None, _unreadable(e)) from None
        yield RawRecord(f, f"line {lineno}", index, data)
        index += 1
    if index == 0:
        raise InputError(str(f), None, None, "holds no records (the file is empty or blank)")
