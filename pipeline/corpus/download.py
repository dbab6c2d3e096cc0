"""A pooch downloader that resumes: a cut download keeps its bytes in `<target>.part`, and the next
call asks only for the rest (`Range: bytes=N-`).

pooch calls a downloader as `downloader(url, output_file, pooch, check_only=False)` and then checks
the hash of `output_file` and moves it into place (pooch.core.stream_download), so the checksum and
pinning in fetch.py apply to the finished file however many calls it took. This one streams with
`requests` into the `.part` file beside the target and, once every byte is there, moves it onto
`output_file`. A server that answers a range request with 200 (it ignores ranges, or the file changed:
`If-Range` carries the ETag or Last-Modified it gave at the first try) sends the whole file, which
replaces the part; a 416 (the range starts at or past the end) means the part is already whole when
`Content-Range: bytes */SIZE` says the file has exactly its size, else the part is dropped and the
file fetched again from zero. The progress bar (tqdm) starts at the bytes already present.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import requests

CHUNK = 64 * 1024


class DownloadCut(requests.RequestException):
    """The connection ended before the whole file arrived; what did arrive is kept in the part file."""


class ResumableDownloader:
    """For one file: `part` is where its bytes gather between calls (`<target>.part`)."""

    def __init__(self, part: str | Path, *, progress: bool = True, timeout: Any = (15, 120)) -> None:
        self.part = Path(part)
        self.meta = self.part.with_name(self.part.name + ".json")  # the validator for If-Range
        self.progress = progress
        self.timeout = timeout
        self.sent_range: str | None = None  # the Range header of the last request (for callers and tests)

    def __call__(self, url: str, output_file: Any, pooch: object = None, check_only: bool = False) -> bool | None:
        if check_only:
            with requests.head(url, allow_redirects=True, timeout=self.timeout) as r:
                return r.status_code == 200
        self.part.parent.mkdir(parents=True, exist_ok=True)
        if not self._download(url, resume=True):  # a 416 that did not match the part: once from zero
            self._download(url, resume=False)
        if hasattr(output_file, "write"):
            with self.part.open("rb") as f:
                shutil.copyfileobj(f, output_file)
            self._drop()
        else:
            os.replace(self.part, output_file)
            self.meta.unlink(missing_ok=True)
        return None

    def _download(self, url: str, *, resume: bool) -> bool:
        """Bring the part file to the whole file. False: the server refused the range (416) and the part
        is not the whole file (it was dropped)."""
        have = self.part.stat().st_size if resume and self.part.is_file() else 0
        headers = {"Accept-Encoding": "identity"}  # byte ranges count bytes on the wire
        self.sent_range = None
        if have:
            self.sent_range = headers["Range"] = f"bytes={have}-"
            validator = self._validator(url)
            if validator:
                headers["If-Range"] = validator
        with requests.get(url, headers=headers, stream=True, timeout=self.timeout) as r:
            if have and r.status_code == 416:
                size = _total_from_content_range(r.headers.get("Content-Range"))
                if size == have:
                    return True  # the part is already the whole file
                self._drop()
                return False
            r.raise_for_status()
            start = 0
            if have and r.status_code == 206:
                if _start_from_content_range(r.headers.get("Content-Range")) != have:
                    r.close()  # not the range asked for: this body cannot extend the part
                    self._drop()
                    return False
                start = have
            length = r.headers.get("Content-Length")
            total = start + int(length) if length and length.isdigit() else None
            if start == 0:
                self._remember(url, r.headers)
            self._stream(url, r, start, total)
        return True

    def _stream(self, url: str, r: requests.Response, start: int, total: int | None) -> None:
        got = start
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=total, initial=start, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                       desc=self.part.name.removesuffix(".part"), leave=True, ascii=True)
        try:
            with self.part.open("ab" if start else "wb") as out:
                try:
                    for chunk in r.iter_content(CHUNK):
                        out.write(chunk)
                        got += len(chunk)
                        if bar is not None:
                            bar.update(len(chunk))
                except (requests.exceptions.ChunkedEncodingError, requests.ConnectionError,
                        requests.Timeout) as e:
                    out.flush()
                    raise self._cut(url, got, total, e) from None
            if total is not None and got < total:
                raise self._cut(url, got, total, None)
        finally:
            if bar is not None:
                bar.close()

    def _cut(self, url: str, got: int, total: int | None, cause: Exception | None) -> DownloadCut:
        of = f" of {total:,}" if total is not None else ""
        why = f" ({type(cause).__name__})" if cause is not None else ""
        return DownloadCut(f"the download from {url} was cut after {got:,}{of} bytes{why}; they are kept in "
                           f"{self.part}: run the same command again to fetch the rest")

    def _remember(self, url: str, headers: Any) -> None:
        validator = headers.get("ETag") or headers.get("Last-Modified")
        if validator and not validator.startswith("W/"):  # If-Range needs a strong validator
            self.meta.write_text(json.dumps({"url": url, "validator": validator}), encoding="utf-8")
        else:
            self.meta.unlink(missing_ok=True)

    def _validator(self, url: str) -> str | None:
        try:
            data = json.loads(self.meta.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data.get("validator") if isinstance(data, dict) and data.get("url") == url else None

    def _drop(self) -> None:
        self.part.unlink(missing_ok=True)
        self.meta.unlink(missing_ok=True)


def _start_from_content_range(value: str | None) -> int | None:
    """`bytes 100-199/200` -> 100."""
    try:
        return int(value.split()[1].split("-")[0]) if value else None
    except (IndexError, ValueError):
        return None


def _total_from_content_range(value: str | None) -> int | None:
    """`bytes */200` (or `bytes 0-9/200`) -> 200; None when absent or `*`."""
    try:
        total = value.rsplit("/", 1)[1] if value else "*"
        return int(total) if total != "*" else None
    except (IndexError, ValueError):
        return None
