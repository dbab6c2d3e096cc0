"""On-disk layout of a run and atomic writes.

artifacts/<run>/<stage>/<table>/part-00000.parquet   finished stage (manifest written last)
artifacts/<run>/<stage>/_manifest.json
artifacts/<run>/<stage>.partial/                      stage in progress: finished shards + markers

A stage directory is only ever produced by renaming a complete `.partial` folder, so a crash
never leaves something that looks finished. A write the filesystem refuses (disk full, read-only,
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
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.errors import PipelineError
from pipeline.manifest import Manifest

MANIFEST = "_manifest.json"
LOCK_FILE = "_lock"
SHARD_MARKERS = "_shards"
FINGERPRINT_FILE = "_fingerprint"


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


def atomic_write_bytes(path: Path, data: bytes) -> None:
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


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())


def atomic_write_parquet(path: Path, table: pa.Table) -> None:
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


class RunDirBusy(PipelineError):
    """Another `mempipe run` holds the run directory."""


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run directory for one `mempipe run` at a time (two terminals, or a job resubmitted
    while the first still runs), so their artifacts never interleave. An OS lock (flock) on
    `<run_dir>/_lock`: it dies with its process, so a killed run leaves no stale lock behind."""
    run_dir = Path(run_dir)
    with writing(run_dir / LOCK_FILE):
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / LOCK_FILE, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise RunDirBusy(f"run directory {run_dir} is in use by {holder}; wait for it to finish, "
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
    """Paths and state of one stage inside one run directory."""

    def __init__(self, run_dir: Path, stage: str) -> None:
        self.run_dir = Path(run_dir)
        self.stage = stage
        self.final = self.run_dir / stage
        self.partial = self.run_dir / f"{stage}.partial"

    # --- finished stage -------------------------------------------------------------------
    def manifest(self) -> Manifest | None:
        path = self.final / MANIFEST
        if not path.exists():
            return None
        try:
            return Manifest.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, AttributeError):  # JSONDecodeError is a ValueError
            return None  # unreadable manifest = not finished

    def table_dir(self, table: str) -> Path:
        return self.final / table

    def read_table(self, table: str, episode_ids: list[str] | None = None, schema: pa.Schema | None = None,
                   parts: list[str] | None = None) -> pa.Table:
        """Read a finished table, optionally only the rows of some episodes, and only from the part
        files `parts` (None: every part; see `episode_parts`)."""
        path = self.table_dir(table)
        if parts is not None:
            files = [f for f in (path / p for p in parts) if f.exists()]
        else:
            files = sorted(path.glob("part-*.parquet")) if path.exists() else []
        if not files:
            if schema is None:
                raise FileNotFoundError(f"no table {table!r} in stage {self.stage}")
            return schema.empty_table()
        dataset = ds.dataset([str(f) for f in files], format="parquet", schema=schema)
        if episode_ids is not None and "episode_id" in dataset.schema.names:
            return dataset.to_table(filter=ds.field("episode_id").isin(episode_ids))
        return dataset.to_table()

    def episode_parts(self) -> dict[str, str] | None:
        """Episode id -> the part file holding its rows, from the manifest (None when the stage
        recorded no layout: read every part)."""
        manifest = self.manifest()
        return None if manifest is None else manifest.episode_parts()

    # --- in-progress stage ----------------------------------------------------------------
    def open_partial(self, fingerprint: str) -> None:
        """Reuse finished shards of an interrupted run with the same fingerprint, else start clean."""
        marker = self.partial / FINGERPRINT_FILE
        if self.partial.exists():
            if not marker.exists() or marker.read_text().strip() != fingerprint:
                shutil.rmtree(self.partial)
        if not self.partial.exists():
            with writing(self.partial):
                self.partial.mkdir(parents=True)
            atomic_write_bytes(marker, fingerprint.encode())

    def partial_fingerprint(self) -> str | None:
        marker = self.partial / FINGERPRINT_FILE
        return marker.read_text().strip() if marker.exists() else None

    def shard_marker(self, shard_idx: int) -> Path:
        return self.partial / SHARD_MARKERS / f"{shard_idx:05d}.json"

    def finished_shards(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        folder = self.partial / SHARD_MARKERS
        if folder.exists():
            for f in sorted(folder.glob("*.json")):
                out[int(f.stem)] = json.loads(f.read_text())
        return out

    def publish(self, manifest: Manifest) -> None:
        """Write the manifest last, then swap the partial folder in place of the old stage. The
        shard markers go only once the manifest is written: a write that fails keeps them, so the
        next run resumes from them."""
        atomic_write_json(self.partial / MANIFEST, manifest.to_json())
        shutil.rmtree(self.partial / SHARD_MARKERS, ignore_errors=True)
        (self.partial / FINGERPRINT_FILE).unlink(missing_ok=True)
        old = self.run_dir / f"{self.stage}.old"
        with writing(self.final):
            if old.exists():
                shutil.rmtree(old)
            if self.final.exists():
                os.replace(self.final, old)
            os.replace(self.partial, self.final)
        shutil.rmtree(old, ignore_errors=True)

    def invalidate(self) -> None:
        """Forget a finished stage (used by --force); partial shards are dropped too."""
        for p in (self.final, self.partial):
            if p.exists():
                shutil.rmtree(p)
