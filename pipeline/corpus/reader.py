"""Find corpus files and read them as raw JSON records, naming the file and line on bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
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
        return files
    return [p]


def iter_records(path: str | Path) -> Iterator[RawRecord]:
    """Records of every corpus file in order. JSONL is streamed, so a limit need not read the whole file."""
    for f in corpus_files(path):
        yield from _file_records(f)


def _file_records(f: Path) -> Iterator[RawRecord]:
    if f.suffix == ".jsonl":
        with _open(f) as fh:
            yield from _lines(f, fh)
        return
    with _open(f) as fh:
        try:
            text = fh.read()
        except UnicodeDecodeError as e:
            raise InputError(str(f), None, None, f"not UTF-8 text: {e.reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        # Many ".json" dataset files are really JSON Lines; "Extra data" means the first value parsed whole.
        if e.msg == "Extra data":
            yield from _lines(f, text.splitlines())
            return
        raise InputError(str(f), f"line {e.lineno}", None, f"invalid JSON: {e.msg} (column {e.colno})") from None
    if isinstance(data, list):
        for i, item in enumerate(data):
            yield RawRecord(f, f"item {i}", i, item)
    elif isinstance(data, dict):
        yield RawRecord(f, "object", 0, data)
    else:
        raise InputError(str(f), None, None, f"expected a JSON object or a list of objects, got {type(data).__name__}")


def _open(f: Path):
    try:
        return f.open(encoding="utf-8")
    except OSError as e:
        raise InputError(str(f), None, None, f"cannot read: {e.strerror}") from None


def _lines(f: Path, lines) -> Iterator[RawRecord]:
    index = 0
    lineno = 0
    try:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(str(f), f"line {lineno}", None, f"invalid JSON: {e.msg} (column {e.colno})") from None
            yield RawRecord(f, f"line {lineno}", index, data)
            index += 1
    except UnicodeDecodeError as e:
        raise InputError(str(f), f"line {lineno + 1}", None, f"not UTF-8 text: {e.reason}") from None
