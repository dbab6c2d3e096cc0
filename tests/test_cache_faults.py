"""A corrupt or foreign LLM cache is detected, never served as an answer, set aside and reported;
the run goes on without it."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import diskcache

from conftest import llm_config
from pipeline.llm.cache import CACHE_FORMAT, MARKER, DiskCallCache
from pipeline.llm.shared import make_client


def _ask(cfg, text: str = "hello") -> tuple[str, bool]:
    async def go():
        client = make_client(cfg)
        result = await client.chat([{"role": "user", "content": text}])
        await client.aclose()
        return result.text, result.cached

    return asyncio.run(go())


def _aside(directory: Path) -> list[Path]:
    return sorted(directory.parent.glob(directory.name + ".unusable-*"))


def test_a_garbage_database_is_set_aside_with_a_warning_and_the_call_is_made(tmp_path, fake_llm, caplog):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / "cache.db").write_bytes(b"this is not an SQLite database" * 100)
    with caplog.at_level(logging.WARNING):
        text, cached = _ask(llm_config(fake_llm, cache_dir=str(cache_dir)))
    assert not cached and fake_llm.count() == 1
    [aside] = _aside(cache_dir)
    assert (aside / "cache.db").read_bytes().startswith(b"this is not")  # kept for inspection, untouched
    assert any(str(cache_dir) in r.message and str(aside) in r.message for r in caplog.records)
    # The new cache works: the same call again is an answer from it.
    assert _ask(llm_config(fake_llm, cache_dir=str(cache_dir))) == (text, True) and fake_llm.count() == 1


def test_a_truncated_database_is_never_served_and_is_set_aside(tmp_path, fake_llm):
    cache_dir = tmp_path / "cache"
    cfg = llm_config(fake_llm, cache_dir=str(cache_dir))
    answers = {f"question {i}": _ask(cfg, f"question {i}")[0] for i in range(50)}
    db = cache_dir / "cache.db"
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 3])  # a crash or a full disk mid-copy
    again = {q: _ask(cfg, q) for q in answers}
    # Every answer is the model's (from a page SQLite could still read, or asked again) ...
    assert {q: text for q, (text, _) in again.items()} == answers
    # ... and the damaged database was found and set aside: the later questions were asked again.
    assert len(_aside(cache_dir)) == 1 and fake_llm.count() > 50
    assert not again["question 49"][1]


def test_a_cache_of_another_format_is_set_aside_not_read(tmp_path, fake_llm):
    cache_dir = tmp_path / "cache"
    cfg = llm_config(fake_llm, cache_dir=str(cache_dir))
    text, _ = _ask(cfg)
    assert json.loads((cache_dir / MARKER).read_text()) == {"format": CACHE_FORMAT}
    (cache_dir / MARKER).write_text(json.dumps({"format": CACHE_FORMAT + 1}))
    again, cached = _ask(cfg)
    assert not cached and fake_llm.count() == 2 and len(_aside(cache_dir)) == 1


def test_an_entry_that_is_not_one_of_ours_is_a_miss_not_an_answer(tmp_path, fake_llm):
    cache_dir = tmp_path / "cache"
    cfg = llm_config(fake_llm, cache_dir=str(cache_dir))
    _ask(cfg)
    with diskcache.Cache(str(cache_dir)) as raw:
        keys = list(raw.iterkeys())
        for key in keys:
            raw.set(key, "<html>not a value</html>")
    text, cached = _ask(cfg)
    assert not cached and fake_llm.count() == 2 and not text.startswith("<html>")
    store = DiskCallCache(cache_dir)
    assert store.get_many_raw(["no-such-key"]) == [None]
    store.close()
