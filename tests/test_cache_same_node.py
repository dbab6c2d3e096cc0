"""The call cache on the host's node: a worker there opens the SQLite file itself (no actor call per
batch); a worker elsewhere, or one that cannot open it, goes through the host; both see one cache."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

import pytest
import ray

from pipeline.config import LLMConfig
from pipeline.llm.shared import ActorCallCache, SharedLLMHandles


@ray.remote
def _in_a_worker(cache: ActorCallCache, key: str, value: dict) -> tuple[bool, dict | None, dict | None]:
    """In a Ray worker process: (opened the file itself?, what it read for `key`, what it read of a
    key it wrote)."""
    async def go() -> tuple[dict | None, dict | None]:
        seen = await cache.get(key)
        await cache.set(key + "-w", value)
        return seen, await cache.get(key + "-w")

    seen, written = asyncio.run(go())
    return cache.local, seen, written


@pytest.mark.session_ray
def test_a_worker_on_the_hosts_node_opens_the_cache_itself_and_shares_it(ray_local: None, tmp_path: Path) -> None:
    cfg = LLMConfig(cache_dir=str(tmp_path / "cache"))
    handles = SharedLLMHandles.get_or_create(cfg, f"test-{uuid.uuid4().hex[:8]}")
    try:
        driver = ActorCallCache(handles.cache, directory=handles.cache_dir, node=handles.cache_node)
        asyncio.run(driver.set("k", {"text": "from the driver"}))
        local, seen, written = ray.get(_in_a_worker.remote(driver, "k", {"text": "from a worker"}))
        assert local and seen == {"text": "from the driver"} and written == {"text": "from a worker"}
        # The host's own connection reads what the worker wrote through its own.
        assert ray.get(handles.cache.get_many_raw.remote(["k-w"])) == ['{"text":"from a worker"}']

        elsewhere = ActorCallCache(handles.cache, directory=handles.cache_dir, node="another-node")
        local, seen, _ = ray.get(_in_a_worker.remote(elsewhere, "k", {"text": "x"}))
        assert not local and seen == {"text": "from the driver"}  # through the host
    finally:
        handles.close()


@pytest.mark.session_ray
def test_a_cache_directory_made_anew_is_opened_anew(ray_local: None, tmp_path: Path) -> None:
    """A process keeps its connection per directory; a directory removed and made again (a cleared
    cache) must not be read through the old, unlinked file."""
    directory = tmp_path / "cache"
    cfg = LLMConfig(cache_dir=str(directory))
    first = SharedLLMHandles.get_or_create(cfg, f"test-{uuid.uuid4().hex[:8]}")
    try:
        cache = ActorCallCache(first.cache, directory=first.cache_dir, node=first.cache_node)
        asyncio.run(cache.set("k", {"text": "old"}))
    finally:
        first.close()
    shutil.rmtree(directory)
    second = SharedLLMHandles.get_or_create(cfg, f"test-{uuid.uuid4().hex[:8]}")
    try:
        again = ActorCallCache(second.cache, directory=second.cache_dir, node=second.cache_node)
        assert again.local and asyncio.run(again.get("k")) is None
    finally:
        second.close()
