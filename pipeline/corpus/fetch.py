"""`mempipe data fetch NAME`: download a corpus a config names from its public home, checked by sha256.

Downloads go through pooch (`pooch.retrieve`), which checks the hash of the downloaded file and only
then moves it into place, so a mismatched download leaves nothing behind. Its downloader is ours
(pipeline/corpus/download.py, on `requests`): the bytes gather in `<target>.part`, a cut download keeps
them, and the next call asks only for the rest (`Range: bytes=N-`), with a progress bar that starts at
the bytes already there. Nothing retries within a call (pooch's `retry_if_failed` stays 0), so an
offline machine fails at once; the same command again resumes.

A file whose sha256 is recorded in `sources.py` is checked against it. An unverified one is pinned at
its first fetch in `<dir>/.mempipe-pins.json` and checked against the pin from then on. A file already
present whose hash matches is not downloaded again: the call sends no request.

A mirror (`--mirror URL` or MEMPIPE_DATA_MIRROR) replaces the scheme and host of every URL and keeps its
path (a mirror of huggingface.co such as hf-mirror.com works as is; tests serve fixtures this way).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pooch
import requests

from pipeline.corpus.download import DownloadCut, ResumableDownloader
from pipeline.corpus.sources import FORMAT_SOURCES, REGISTRY, CorpusSource, RemoteFile
from pipeline.errors import PipelineError

PINS_FILE = ".mempipe-pins.json"
MIRROR_ENV = "MEMPIPE_DATA_MIRROR"
DEFAULT_DIR = "data"
_TIMEOUT = (15, 120)  # requests' (connect, read) seconds: a dead host fails within seconds, not minutes
_HASH_MISMATCH = re.compile(r"expected (?:sha256:)?([0-9a-fA-F]+) but got ([0-9a-fA-F]+)")


class DataFetchError(PipelineError):
    """A download failed: the network, a checksum, an archive."""


class UnknownCorpusError(DataFetchError):
    """A name the registry does not hold."""


@dataclass(frozen=True)
class FetchedFile:
    remote: RemoteFile
    path: Path  # the file the loader reads
    sha256: str  # of the downloaded file (remote.fname)
    downloaded: bool  # False: it was present and matched, no request was sent
    check: str  # "recorded" | "pinned" (checked against a pin) | "pinned now" (first fetch)


def get_source(name: str) -> CorpusSource:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownCorpusError(f"unknown corpus {name!r} (known: {', '.join(REGISTRY)}; "
                                 "`mempipe data list` describes them)") from None


def mirror_url(url: str, base: str) -> str:
    """`url` on the mirror `base`: its scheme and host (and a path prefix) replace the original's."""
    src, mirror = urlsplit(url), urlsplit(base)
    if not mirror.scheme or not mirror.netloc:
        raise DataFetchError(f"mirror {base!r} is not a URL like http://host[:port][/prefix]")
    return urlunsplit((mirror.scheme, mirror.netloc, mirror.path.rstrip("/") + src.path, src.query, ""))


def fetch(name: str, directory: str | Path = DEFAULT_DIR, *, progress: bool = True,
          base_url_override: str | None = None) -> list[FetchedFile]:
    """Download every file of corpus `name` into `directory` (sha256-checked; a present file that
    matches is not downloaded again). `base_url_override` (else MEMPIPE_DATA_MIRROR) is a mirror."""
    source = get_source(name)
    if not source.files:
        raise DataFetchError(f"{name}: no download is recorded. {source.notes} ({source.homepage})")
    base = base_url_override or os.environ.get(MIRROR_ENV) or None
    directory = Path(directory)
    pins = _Pins(directory / PINS_FILE)
    return [_fetch_file(remote, directory, pins, progress, base) for remote in source.files]


def _fetch_file(remote: RemoteFile, directory: Path, pins: _Pins, progress: bool, base: str | None) -> FetchedFile:
    path = directory / remote.fname
    pinned = pins.get(remote.fname)
    expected = remote.sha256 or pinned
    check = "recorded" if remote.sha256 else "pinned"
    processor = _processor(remote, directory)
    if path.is_file():
        found = pooch.file_hash(str(path))
        if expected is None:  # present but never pinned (the pins file was removed): pin what is here
            pins.set(remote, found)
            expected, check = found, "pinned now"
        if found == expected.lower():
            if processor is not None:
                processor(str(path), "fetch", None)
            return FetchedFile(remote, directory / remote.target, found, False, check)
        # A present file that differs is downloaded again (pooch's "update") and must match.
    url = mirror_url(remote.url, base) if base else remote.url
    downloader = ResumableDownloader(path.with_name(path.name + ".part"), progress=progress, timeout=_TIMEOUT)
    try:
        with _quiet_pooch():
            pooch.retrieve(url, known_hash=expected, fname=path.name, path=path.parent,
                           processor=processor, downloader=downloader)
    except ValueError as e:
        m = _HASH_MISMATCH.search(str(e))
        if m is None:
            raise
        where = (f"recorded in pipeline/corpus/sources.py ({remote.sha256_source})" if remote.sha256
                 else f"pinned at its first fetch in {directory / PINS_FILE}")
        advice = ("" if remote.sha256 else "; if the publisher changed it on purpose, remove its entry "
                  "from the pins file and fetch again")
        raise DataFetchError(f"{path}: sha256 mismatch: the download from {url} has {m[2].lower()}, the hash "
                             f"{where} is {m[1].lower()}; the download was discarded{advice}") from None
    except DownloadCut as e:  # the connection ended mid-file: its bytes are kept for the next call
        raise DataFetchError(f"{path}: {e}") from None
    except requests.RequestException as e:  # offline, refused, timed out, HTTP 4xx/5xx
        raise DataFetchError(_network_message(url, e, base)) from None
    if expected is None:
        expected = pooch.file_hash(str(path))
        pins.set(remote, expected)
        check = "pinned now"
    return FetchedFile(remote, directory / remote.target, expected.lower(), True, check)


@contextmanager
def _quiet_pooch() -> Iterator[None]:
    """pooch logs every download at INFO, with advice to pass the hash to pooch.retrieve; we print our
    own lines (and pin the hash ourselves)."""
    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _network_message(url: str, e: Exception, base: str | None) -> str:
    response = getattr(e, "response", None)
    if response is not None and getattr(response, "status_code", None):
        return f"cannot download {url}: HTTP {response.status_code} {response.reason or ''}".rstrip()
    fix = "check the mirror" if base else f"set a mirror with --mirror URL or {MIRROR_ENV}"
    return (f"cannot download {url}: {type(e).__name__} (this machine looks offline or cannot reach the host; "
            f"{fix})")


# -- unpacking (pooch processors: called with the downloaded file, its action and the Pooch) ----------

class _ExtractMember:
    """One member of a tar archive, written to `target` (pooch's Untar extracts it)."""

    def __init__(self, member: str, target: Path) -> None:
        self.member = member
        self.target = target

    def __call__(self, fname: str, action: str, _pooch: object) -> str:
        if action == "fetch" and self.target.is_file():
            return str(self.target)
        self.target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".untar-", dir=self.target.parent))
        try:
            pooch.Untar(members=[self.member], extract_dir=str(scratch))(fname, "download", None)
            extracted = scratch / self.member
            if not extracted.is_file():
                raise DataFetchError(f"{fname}: the archive holds no file {self.member!r}")
            os.replace(extracted, self.target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return str(self.target)


class _ParquetToJsonl:
    """A Parquet table written as JSON Lines, one row a line (as `datasets`' to_json writes a split)."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __call__(self, fname: str, action: str, _pooch: object) -> str:
        if action == "fetch" and self.target.is_file():
            return str(self.target)
        import pyarrow.parquet as pq

        tmp = self.target.with_name(self.target.name + ".part")
        with tmp.open("w", encoding="utf-8") as out:
            for batch in pq.ParquetFile(fname).iter_batches():
                for row in batch.to_pylist():
                    out.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        os.replace(tmp, self.target)  # a reader never sees half a file
        return str(self.target)


def _processor(remote: RemoteFile, directory: Path):
    if remote.unpack == "untar":
        assert remote.member is not None
        return _ExtractMember(remote.member, directory / remote.target)
    if remote.unpack == "parquet_to_jsonl":
        return _ParquetToJsonl(directory / remote.target)
    return None


# -- pins of unverified files ---------------------------------------------------------------------------

class _Pins:
    """`<dir>/.mempipe-pins.json`: {file name: {sha256, url, pinned_at}} for files with no recorded hash."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, dict]:
        if not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise DataFetchError(f"{self.path}: unreadable pins file ({e}); fix or delete it") from None
        return data if isinstance(data, dict) else {}

    def get(self, fname: str) -> str | None:
        entry = self._read().get(fname)
        return entry.get("sha256") if isinstance(entry, dict) else None

    def set(self, remote: RemoteFile, sha256: str) -> None:
        data = self._read()
        data[remote.fname] = {"sha256": sha256, "url": remote.url,
                              "pinned_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)


# -- hints and the command line -------------------------------------------------------------------------

def missing_corpus_hint(fmt: str, path: str | Path | None = None) -> str | None:
    """What to run for a missing corpus file of format `fmt` ("run `mempipe data fetch msc`"); with
    `path`, the registry entry whose file it names and its --dir. None: no public source is recorded."""
    names = FORMAT_SOURCES.get(fmt)
    if not names:
        return None
    if path is not None:
        wanted = Path(path).as_posix()
        for name in names:
            target = REGISTRY[name].corpus_path
            if target and (wanted == target or wanted.endswith("/" + target)):
                directory = wanted[: -len(target)].rstrip("/") or "."
                where = "" if directory == DEFAULT_DIR else f" --dir {directory}"
                return f"run `mempipe data fetch {name}{where}`"
    others = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
    return f"run `mempipe data fetch {names[0]}`{others}"


LISTED_FILES = 6  # a corpus of more files (BEAM: one folder a conversation) lists these and counts the rest


def format_registry() -> str:
    """The registry as text: per corpus its files (verified or not; past `LISTED_FILES`, the first few
    and a count of the rest), the corpus.path and the configs."""
    lines = []
    for s in REGISTRY.values():
        state = "verified" if s.verified else ("no download" if not s.files else "unverified")
        lines.append(f"{s.name}  [{state}]  {s.description}")
        shown = s.files if len(s.files) <= LISTED_FILES else s.files[:3]
        for f in shown:
            check = f"sha256 {f.sha256[:12]}... ({f.sha256_source})" if f.sha256 else "unverified (pinned at first fetch)"
            unpack = f", {f.unpack} -> {f.target}" if f.unpack else ""
            lines.append(f"    {f.url}\n      -> {f.fname}{unpack}; {check}")
        rest = s.files[len(shown):]
        if rest:
            pinned = sum(1 for f in rest if f.sha256)
            lines.append(f"    ... and {len(rest)} more files ({pinned} with a recorded sha256, {len(rest) - pinned} "
                         "pinned at first fetch)")
        if s.corpus_path:
            lines.append(f"    corpus: format {s.corpus_format}, path data/{s.corpus_path}")
        lines.append(f"    configs: {', '.join(s.configs) or '-'}")
        if s.use:
            lines.append(f"    use: {s.use.format(dir=DEFAULT_DIR)}")
        if s.notes:
            lines.append(f"    note: {s.notes}")
    return "\n".join(lines)


def add_data_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`mempipe data fetch NAME... [--dir data/] [--mirror URL] [--list]` and `mempipe data list`."""
    data = subparsers.add_parser("data", help="download the corpora the configs read (fetch, list)")
    data.set_defaults(debug=False, func=cmd_data)
    sub = data.add_subparsers(dest="data_command", required=True)
    fetch_p = sub.add_parser("fetch", help="download corpora by name, sha256-checked; present files are kept")
    fetch_p.add_argument("names", nargs="*", metavar="NAME", help="corpus names (`mempipe data list`)")
    fetch_p.add_argument("--dir", default=DEFAULT_DIR, help=f"data directory (default {DEFAULT_DIR}/)")
    fetch_p.add_argument("--mirror", default=None, metavar="URL",
                         help=f"fetch from this base URL instead of each file's host (default ${MIRROR_ENV})")
    fetch_p.add_argument("--list", action="store_true", help="print the registry and exit")
    fetch_p.add_argument("--no-progress", action="store_true", help="no progress bar")
    list_p = sub.add_parser("list", help="the corpora that can be fetched: files, checksums, configs")
    for p in (fetch_p, list_p):
        p.add_argument("--debug", action="store_true", help="show tracebacks")
        p.set_defaults(func=cmd_data)
    return data


def cmd_data(args: argparse.Namespace) -> int:
    """0: done; 1: a download failed (network, checksum); 2: an unknown name or nothing named."""
    if args.data_command == "list" or getattr(args, "list", False):
        print(format_registry())
        return 0
    if not args.names:
        print(f"mempipe: error: data fetch: name a corpus (known: {', '.join(REGISTRY)})", file=sys.stderr)
        return 2
    try:
        sources = [get_source(n) for n in args.names]
    except UnknownCorpusError as e:
        print(f"mempipe: error: {e}", file=sys.stderr)
        return 2
    for source in sources:
        try:
            fetched = fetch(source.name, args.dir, progress=not args.no_progress, base_url_override=args.mirror)
        except DataFetchError as e:
            print(f"mempipe: error: {e}", file=sys.stderr)
            return 1
        for f in fetched:
            how = "downloaded" if f.downloaded else "present, not downloaded"
            check = {"recorded": "matches the recorded sha256", "pinned": "matches the pinned sha256",
                     "pinned now": f"unverified, pinned in {Path(args.dir) / PINS_FILE}"}[f.check]
            print(f"{source.name}: {f.path} ({how}; sha256 {f.sha256[:12]}... {check})")
        if source.corpus_path:
            configs = f" (configs: {', '.join(source.configs)})" if source.configs else ""
            print(f"{source.name}: corpus.format={source.corpus_format} "
                  f"corpus.path={Path(args.dir) / source.corpus_path}{configs}")
        if source.use:
            print(f"{source.name}: {source.use.format(dir=Path(args.dir))}")
    return 0
