"""Artifacts on an object store (`artifacts_dir: s3://bucket/prefix`, `gs://...`) through pyarrow's
filesystems.

A location is either a local `Path` (a folder, NFS included: the artifacts module writes it with
temp files and renames) or a URI string `scheme://bucket/key` (written here). An object store has
no rename, but a single object appears whole or not at all, so the stage layout's guarantees come
from ordering instead: parts and shard markers first, the manifest last (see `StageDir.publish`).

Credentials and endpoint come from the environment as every S3 client reads them
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL` for a
compatible server such as MinIO; `GOOGLE_APPLICATION_CREDENTIALS` for GCS), never from the config,
so no key reaches a manifest or a log.
"""

from __future__ import annotations

import functools
import hashlib
import tempfile
from pathlib import Path
from typing import Iterable, TypeGuard, Union

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.errors import PipelineError

Location = Union[Path, str]
OBJECT_SCHEMES = ("s3", "gs", "gcs")


class ObjectStoreError(PipelineError):
    """The object store refused or failed a request."""

    def __init__(self, uri: str, reason: str) -> None:
        self.uri, self.reason = uri, reason
        super().__init__(f"cannot write {uri}: {reason}; nothing half-written was published: check the bucket, "
                         "credentials (AWS_* / GOOGLE_APPLICATION_CREDENTIALS) and endpoint, then run the same "
                         "command again to resume")

    def __reduce__(self) -> tuple:
        return (type(self), (self.uri, self.reason))


def is_remote(location: Location | None) -> TypeGuard[str]:
    """Whether `location` names an object store rather than a local (or mounted) folder (always a
    string: `location` makes every local one a Path)."""
    return isinstance(location, str) and location.split("://", 1)[0].lower() in OBJECT_SCHEMES and "://" in location


def join(base: Location, *parts: str) -> Location:
    """`base / part / ...` for a folder or a URI."""
    if is_remote(base):
        return "/".join([str(base).rstrip("/"), *(p.strip("/") for p in parts)])
    return Path(base).joinpath(*parts)


def location(value: str | Path) -> Location:
    """A configured directory as a location: a URI stays a string, anything else is a Path."""
    return value if is_remote(value) else Path(value)


def name_of(loc: Location) -> str:
    return str(loc).rstrip("/").rsplit("/", 1)[-1]


@functools.lru_cache(maxsize=None)
def _filesystem(scheme: str, bucket: str) -> pafs.FileSystem:
    fs, _ = pafs.FileSystem.from_uri(f"{scheme}://{bucket}")
    return fs


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, its path for `uri`), one filesystem per bucket and process."""
    scheme, rest = uri.split("://", 1)
    bucket = rest.split("/", 1)[0]
    return _filesystem(scheme.lower(), bucket), rest.rstrip("/")


def _uri(uri_of_root: str, fs_path: str) -> str:
    return f"{uri_of_root.split('://', 1)[0]}://{fs_path}"


def _failing(uri: str, e: OSError) -> ObjectStoreError:
    return ObjectStoreError(uri, str(e).splitlines()[0] if str(e) else type(e).__name__)


# --- objects ------------------------------------------------------------------------------------
def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def read_bytes(uri: str) -> bytes:
    """The object's content; FileNotFoundError when there is none."""
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as f:
            return f.read()
    except FileNotFoundError:
        raise
    except OSError:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            raise FileNotFoundError(uri) from None
        raise


def write_bytes(uri: str, data: bytes) -> None:
    """One PUT: readers see the old object or the new one, never part of it."""
    fs, path = filesystem(uri)
    try:
        with fs.open_output_stream(path) as f:
            f.write(data)
    except OSError as e:
        raise _failing(uri, e) from None


def write_parquet(uri: str, table: pa.Table) -> None:
    fs, path = filesystem(uri)
    try:
        pq.write_table(table, path, filesystem=fs, compression="zstd")
    except OSError as e:
        raise _failing(uri, e) from None


def dataset(uris: list[str], schema: pa.Schema | None = None) -> ds.Dataset:
    fs, _ = filesystem(uris[0])
    return ds.dataset([filesystem(u)[1] for u in uris], filesystem=fs, format="parquet", schema=schema)


# --- prefixes ("folders") -----------------------------------------------------------------------
def list_files(uri: str, recursive: bool = False) -> list[str]:
    """URIs of the objects under `uri`, sorted (none when the prefix is empty)."""
    fs, path = filesystem(uri)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=recursive, allow_not_found=True))
    return sorted(_uri(uri, i.path) for i in infos if i.type == pafs.FileType.File)


def delete_tree(uri: str) -> None:
    fs, path = filesystem(uri)
    try:
        if fs.get_file_info(path).type == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif fs.get_file_info(path).type == pafs.FileType.File:
            fs.delete_file(path)
    except OSError as e:
        raise _failing(uri, e) from None


def copy_tree(src: str, dst: str, skip: Iterable[str] = ()) -> None:
    """Copy every object under `src` to the same key under `dst` (server side), except the
    top-level entries named in `skip`."""
    fs, src_path = filesystem(src)
    _, dst_path = filesystem(dst)
    skipped = set(skip)
    for uri in list_files(src, recursive=True):
        rel = filesystem(uri)[1][len(src_path) + 1:]
        if rel.split("/", 1)[0] in skipped:
            continue
        try:
            fs.copy_file(f"{src_path}/{rel}", f"{dst_path}/{rel}")
        except OSError as e:
            raise _failing(f"{dst}/{rel}", e) from None


def upload_dir(local: Path, dst: str) -> int:
    """Every file under the local folder `local` to the same relative key under `dst`; returns the
    number of files."""
    n = 0
    for f in sorted(p for p in Path(local).rglob("*") if p.is_file()):
        write_bytes(f"{dst.rstrip('/')}/{f.relative_to(local).as_posix()}", f.read_bytes())
        n += 1
    return n


def download_dir(src: str, local: Path) -> int:
    """Every object under `src` into the local folder `local`; returns the number of files."""
    _, src_path = filesystem(src)
    n = 0
    for uri in list_files(src, recursive=True):
        target = Path(local) / filesystem(uri)[1][len(src_path) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(read_bytes(uri))
        n += 1
    return n


def local_scratch(uri: str, purpose: str) -> Path:
    """A local folder standing for `uri` where something must be a local file (a lock, the embedded
    model server's log): the same folder for the same URI on this machine."""
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "mempipe" / purpose / f"{name_of(uri)}-{digest}"
