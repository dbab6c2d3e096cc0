"""On-disk layout of a run and atomic writes.

artifacts/<run>/<stage>/<table>/part-00000.parquet   finished stage (manifest written last)
artifacts/<run>/<stage>/_manifest.json
artifacts/<run>/<stage>.partial/                      stage in progress: finished shards + markers

A stage directory is only ever produced by renaming a complete `.partial` folder, so a crash
never leaves something that looks finished.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.manifest import Manifest

MANIFEST = "_manifest.json"
SHARD_MARKERS = "_shards"
FINGERPRINT_FILE = "_fingerprint"


def atomic_write_bytes(path: Path, data: bytes) -> None:
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        """Write the manifest last, then swap the partial folder in place of the old stage."""
        shutil.rmtree(self.partial / SHARD_MARKERS, ignore_errors=True)
        (self.partial / FINGERPRINT_FILE).unlink(missing_ok=True)
        atomic_write_json(self.partial / MANIFEST, manifest.to_json())
        old = self.run_dir / f"{self.stage}.old"
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
