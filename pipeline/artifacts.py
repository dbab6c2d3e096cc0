"""On-disk layout of a run and atomic writes.

artifacts/<run>/<stage>/<table>/part-00000.parquet   finished stage (manifest written last)
artifacts/<run>/<stage>/_manifest.json
artifacts/<run>/<stage>.partial/                      stage in progress: finished shards + markers

A stage directory is only ever produced by renaming a complete `.partial` folder, so a crash
never leaves something that looks finished. On an object store (`artifacts_dir: s3://...`, see
pipeline/storage.py), which cannot rename, the same holds by order: a stage is finished when its
manifest exists, and publishing removes the old manifest first and writes the new one last. A write the filesystem refuses (disk full, read-only,
no permission) becomes one `ArtifactWriteError` naming the path; the temp file is removed, the
stage is not published, and the next run resumes from the finished shards.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline import storage
from pipeline.errors import PipelineError
from pipeline.manifest import Manifest
from pipeline.storage import Location, is_remote

MANIFEST = "_manifest.json"
LOCK_FILE = "_lock"
SHARD_MARKERS = "_shards"
FINGERPRINT_FILE = "_fingerprint"
# Why the latest attempt at a stage stopped before publishing (`mempipe status` shows it).
FAILED_ATTEMPT = "_failed_attempt.json"


class ArtifactWriteError(PipelineError):
    """The filesystem refused a write under the artifacts directory."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"cannot write {path}: {reason}; nothing half-written was published: free space "
                         "(or make the folder writable) and run the same command again to resume")

    def __reduce__(self) -> tuple:
        return (type(self), (self.path, self.reason))


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn the filesystem's refusal to write `path` into one ArtifactWriteError naming it."""
    try:
        yield
    except OSError as e:
        if e.errno is None:
            raise
        raise ArtifactWriteError(str(path), e.strerror or str(e)) from None


def atomic_write_bytes(path: Location, data: bytes) -> None:
    if is_remote(path):
        return storage.write_bytes(path, data)  # one PUT is already all or nothing
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_json(path: Location, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())


def atomic_write_parquet(path: Location, table: pa.Table) -> None:
    if is_remote(path):
        return storage.write_parquet(path, table)
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            pq.write_table(table, tmp, compression="zstd")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def read_text(path: Location) -> str:
    """A file's or an object's text; FileNotFoundError when there is none."""
    return storage.read_bytes(path).decode() if is_remote(path) else Path(path).read_text()


def exists(path: Location) -> bool:
    return storage.exists(path) if is_remote(path) else Path(path).exists()


def make_dirs(path: Location) -> None:
    """Create a local folder (an object store has none to create)."""
    if not is_remote(path):
        with writing(Path(path)):
            Path(path).mkdir(parents=True, exist_ok=True)


class RunDirBusy(PipelineError):
    """Another `mempipe run` holds the run directory."""


@contextlib.contextmanager
def run_lock(where: Location) -> Iterator[None]:
    """Hold the run directory for one `mempipe run` at a time (two terminals, or a job resubmitted
    while the first still runs), so their artifacts never interleave. An OS lock (flock) on
    `<run_dir>/_lock`: it dies with its process, so a killed run leaves no stale lock behind. An
    object store has no such lock: a run there is held by a lock file on this machine (two
    drivers on different machines are not told apart)."""
    run_dir = storage.local_scratch(where, "locks") if is_remote(where) else Path(where)
    with writing(run_dir / LOCK_FILE):
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / LOCK_FILE, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise RunDirBusy(f"run directory {where} is in use by {holder}; wait for it to finish, "
                             "or give this run another name (--set run_name=...)") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"`mempipe run` pid {os.getpid()} on {socket.gethostname()}, started "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


def part_name(shard_idx: int) -> str:
    return f"part-{shard_idx:05d}.parquet"


class StageDir:
    """Paths and state of one stage inside one run directory (a folder, or a prefix on an object
    store: then `final` and `partial` are URIs)."""

    def __init__(self, run_dir: Location, stage: str) -> None:
        self.remote = is_remote(run_dir)
        self.run_dir = storage.location(run_dir)
        self.stage = stage
        self.final = storage.join(self.run_dir, stage)
        self.partial = storage.join(self.run_dir, f"{stage}.partial")

    # --- finished stage -------------------------------------------------------------------
    def manifest(self) -> Manifest | None:
        try:
            return Manifest.from_json(json.loads(read_text(storage.join(self.final, MANIFEST))))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, AttributeError):  # JSONDecodeError is a ValueError
            return None  # unreadable manifest = not finished

    def table_dir(self, table: str) -> Location:
        return storage.join(self.final, table)

    def read_table(self, table: str, episode_ids: list[str] | None = None, schema: pa.Schema | None = None,
                   parts: list[str] | None = None) -> pa.Table:
        """Read a finished table, optionally only the rows of some episodes, and only from the part
        files `parts` (None: every part; see `episode_parts`)."""
        return self._read(self.table_dir(table), table, episode_ids, schema, parts)

    def read_partial_table(self, table: str, episode_ids: list[str] | None = None, schema: pa.Schema | None = None,
                           parts: list[str] | None = None) -> pa.Table:
        """The same from the stage in progress: the parts its finished shards wrote (FileNotFoundError
        when one of `parts` is not there: not written yet, or the stage published meanwhile)."""
        return self._read(storage.join(self.partial, table), table, episode_ids, schema, parts, every_part=True)

    def _read(self, where: Location, table: str, episode_ids: list[str] | None, schema: pa.Schema | None,
              parts: list[str] | None, every_part: bool = False) -> pa.Table:
        files = self._part_files(where, parts)
        if every_part and parts is not None and len(files) < len(parts):
            raise FileNotFoundError(f"stage {self.stage} in progress: table {table!r} lacks a part of {parts}")
        if not files:
            if schema is None:
                raise FileNotFoundError(f"no table {table!r} in stage {self.stage}")
            return schema.empty_table()
        if self.remote:
            dataset = storage.dataset([str(f) for f in files], schema)
        else:
            dataset = ds.dataset([str(f) for f in files], format="parquet", schema=schema)
        if episode_ids is not None and "episode_id" in dataset.schema.names:
            return dataset.to_table(filter=ds.field("episode_id").isin(episode_ids))
        return dataset.to_table()

    def _part_files(self, path: Location, parts: list[str] | None) -> list[Location]:
        if self.remote:
            present: list[Location] = [f for f in storage.list_files(str(path))
                                       if storage.name_of(f).startswith("part-") and f.endswith(".parquet")]
            return present if parts is None else [f for f in present if storage.name_of(f) in set(parts)]
        path = Path(path)
        if parts is not None:
            return [f for f in (path / p for p in parts) if f.exists()]
        return sorted(path.glob("part-*.parquet")) if path.exists() else []

    def read_file(self, name: str) -> bytes:
        """A side file the finished stage wrote beside its tables (FileNotFoundError if none)."""
        where = storage.join(self.final, name)
        return storage.read_bytes(where) if is_remote(where) else Path(where).read_bytes()

    def episode_parts(self) -> dict[str, str] | None:
        """Episode id -> the part file holding its rows, from the manifest (None when the stage
        recorded no layout: read every part)."""
        manifest = self.manifest()
        return None if manifest is None else manifest.episode_parts()

    # --- in-progress stage ----------------------------------------------------------------
    def open_partial(self, fingerprint: str) -> None:
        """Reuse finished shards of an interrupted run with the same fingerprint, else start clean."""
        if self.partial_fingerprint() != fingerprint:
            self._remove(self.partial)
            if not self.remote:
                with writing(Path(self.partial)):
                    Path(self.partial).mkdir(parents=True)
            atomic_write_bytes(storage.join(self.partial, FINGERPRINT_FILE), fingerprint.encode())

    def partial_fingerprint(self) -> str | None:
        try:
            return read_text(storage.join(self.partial, FINGERPRINT_FILE)).strip()
        except FileNotFoundError:
            return None

    def record_failed_attempt(self, reason: str) -> None:
        """Say in the stage in progress that this attempt stopped, and why (its finished shards stay)."""
        when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        atomic_write_json(storage.join(self.partial, FAILED_ATTEMPT), {"failed_at": when, "reason": reason})

    def failed_attempt(self) -> dict[str, Any] | None:
        """The record of the latest attempt's stop, if it stopped (None: none, or it was retried since)."""
        try:
            return json.loads(read_text(storage.join(self.partial, FAILED_ATTEMPT)))
        except (FileNotFoundError, ValueError):
            return None

    def clear_failed_attempt(self) -> None:
        if self.remote:
            storage.delete_tree(str(storage.join(self.partial, FAILED_ATTEMPT)))
        else:
            Path(self.partial, FAILED_ATTEMPT).unlink(missing_ok=True)

    def shard_marker(self, shard_idx: int) -> Location:
        return storage.join(self.partial, SHARD_MARKERS, f"{shard_idx:05d}.json")

    def finished_shards(self) -> dict[int, dict[str, Any]]:
        folder = storage.join(self.partial, SHARD_MARKERS)
        if self.remote:
            files: list[Location] = [f for f in storage.list_files(str(folder)) if f.endswith(".json")]
        else:
            files = sorted(Path(folder).glob("*.json")) if Path(folder).exists() else []
        return {int(storage.name_of(f)[:-len(".json")]): json.loads(read_text(f)) for f in files}

    def drop_partial_table(self, table: str) -> None:
        """Forget a table's parts in the stage in progress (a retried attempt starts clean)."""
        self._remove(storage.join(self.partial, table))

    def publish(self, manifest: Manifest) -> None:
        """Write the manifest last, then swap the partial folder in place of the old stage. The
        shard markers go only once the manifest is written: a write that fails keeps them, so the
        next run resumes from them."""
        if self.remote:
            return self._publish_by_order(manifest)
        partial, final = Path(self.partial), Path(self.final)
        atomic_write_json(partial / MANIFEST, manifest.to_json())
        shutil.rmtree(partial / SHARD_MARKERS, ignore_errors=True)
        (partial / FINGERPRINT_FILE).unlink(missing_ok=True)
        (partial / FAILED_ATTEMPT).unlink(missing_ok=True)
        old = Path(self.run_dir) / f"{self.stage}.old"
        with writing(final):
            if old.exists():
                shutil.rmtree(old)
            if final.exists():
                os.replace(final, old)
            os.replace(partial, final)
        shutil.rmtree(old, ignore_errors=True)

    def _publish_by_order(self, manifest: Manifest) -> None:
        """Object store: the old stage stops being finished (its manifest goes first), its objects
        go, the new ones are copied in, the manifest is written last, and only then is the partial
        prefix dropped. A crash anywhere leaves no manifest over a half stage, and the partial
        prefix with its shard markers is still there to publish from on the next run."""
        final, partial = str(self.final), str(self.partial)
        storage.delete_tree(f"{final}/{MANIFEST}")
        storage.delete_tree(final)
        storage.copy_tree(partial, final, skip=(SHARD_MARKERS, FINGERPRINT_FILE, MANIFEST, FAILED_ATTEMPT))
        storage.write_bytes(f"{final}/{MANIFEST}",
                            json.dumps(manifest.to_json(), indent=2, sort_keys=True, default=str).encode())
        storage.delete_tree(partial)

    def invalidate(self) -> None:
        """Forget a finished stage (used by --force); partial shards are dropped too."""
        if self.remote:
            storage.delete_tree(f"{self.final}/{MANIFEST}")  # first: never a manifest over a half-deleted stage
        for p in (self.final, self.partial):
            self._remove(p)

    def _remove(self, where: Location) -> None:
        if self.remote:
            storage.delete_tree(str(where))
        elif Path(where).exists():
            shutil.rmtree(where)
