"""`mempipe new-method NAME`: a new method's module, its test and its docs stub, which pass as
written. The module is the complete example of docs/adding-a-method.md (a test keeps the two equal
and runs it): one LLM digest per session, the latest few read back to answer."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

METHOD_TEMPLATE = '''\
"""{title}: one short digest of each session, written by the LLM when the session ends; a probe is
answered from the digests of the sessions before it (the latest `recent`)."""

import pyarrow as pa

from stages.methods.base import (SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, MethodSettings,
                                 ProbeInput, after_session)
from stages.dialogue import format_unit
from stages.methods.shared.memory_response import answer_from_memory

DIGESTS = pa.schema([*SNAPSHOT_FIELDS, pa.field("digest", pa.string())])


class {camel}Settings(MethodSettings):
    recent: int = 3  # digests an answer reads, the latest ones


class {camel}(Method[{camel}Settings]):
    name = "{name}"
    Settings = {camel}Settings
    memory = {{"digests": DIGESTS}}
    memory_kind = "log"  # one row per session; a probe sees the rows of every session before it
    prompts = {{"digest": "Summarise in two sentences what this conversation says about its speakers."}}

    async def build(self, ctx: MethodContext[{camel}Settings], episode: EpisodeInput) -> dict[str, list[dict]]:
        rows = []
        for session, turns in episode.sessions.items():
            reply = await ctx.llm.chat([{{"role": "system", "content": self.prompts["digest"]}},
                                        {{"role": "user", "content": format_unit(turns)}}])
            rows.append({{**after_session(episode.episode["episode_id"], session), "digest": reply.text}})
        return {{"digests": rows}}

    async def answer(self, ctx: MethodContext[{camel}Settings], probe: ProbeInput,
                     memory: dict[str, list[dict]]) -> Answer:
        latest = sorted(memory["digests"], key=lambda r: r["snapshot_session"])[-ctx.settings.recent:]
        text = "\\n".join(f"Session {{r['snapshot_session']}}: {{r['digest']}}" for r in latest)
        return await answer_from_memory(ctx.llm, probe, text, [f"S{{r['snapshot_session']}}" for r in latest])
'''

TEST_TEMPLATE = '''\
"""{title}, run on the sample corpus against the fake OpenAI-compatible server (stages.testing)."""

from stages.testing import run_method

from {module} import {camel}


def test_{name}_answers_every_probe_from_the_digests_before_it(fake_llm, tmp_path):
    fake_llm.responder = lambda body: ("Ann likes hiking." if "Summarise" in body["messages"][0]["content"]
                                       else "Sure, let us go hiking.")
    tables = run_method({camel}(), fake_llm.base_url, tmp_path, settings={{"recent": 2}})
    digests = tables["memory_{name}.digests"].to_pylist()
    responses = tables["respond_{name}.responses"].to_pylist()
    assert digests and all(d["digest"] == "Ann likes hiking." for d in digests)
    assert responses and all(r["error"] is None for r in responses)
    session_of = {{p["probe_id"]: p["session_idx"] for p in tables["probes.probes"].to_pylist()}}
    for r in responses:  # at most `recent` digests, each of a session before the probe's
        used = [int(i.removeprefix("S")) for i in r["memory_ids"]]
        assert len(used) <= 2 and all(s < session_of[r["probe_id"]] for s in used)
'''

DOCS_TEMPLATE = '''\
# {title} (`{name}`)

What it keeps: one digest per session, written by the LLM when the session ends.
How it answers: from the digests of the sessions before the probe, the latest `recent` of them.

| key | default | what it does |
|---|---|---|
| `method.{name}.recent` | `3` | digests an answer reads |

Run it beside the baselines: `methods: [{name}, full_history, rsum]`. Registered from its package:

```toml
[project.entry-points."mempipe.methods"]
{name} = "{module}:{camel}"
```
'''


def camel_case(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def method_files(name: str) -> dict[str, str]:
    """File name -> text of a new method `name` (snake_case): module, test, docs stub."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"method name {name!r}: use lower_snake_case (letters, digits, _), starting with a letter")
    fill = {"name": name, "camel": camel_case(name), "module": name, "title": camel_case(name)}
    return {f"{name}.py": METHOD_TEMPLATE.format(**fill), f"test_{name}.py": TEST_TEMPLATE.format(**fill),
            f"{name}.md": DOCS_TEMPLATE.format(**fill)}


def cmd_new_method(args: argparse.Namespace) -> int:
    out = Path(args.dir)
    files = method_files(args.name)
    taken = [f for f in files if (out / f).exists()]
    if taken:
        print(f"mempipe: error: {', '.join(str(out / f) for f in taken)} already exist; nothing written")
        return 1
    out.mkdir(parents=True, exist_ok=True)
    for f, text in files.items():
        (out / f).write_text(text)
        print(f"wrote {out / f}")
    print(f"next: `python -m pytest {out / f'test_{args.name}.py'}`; to select it in a config, register it "
          f"under the `mempipe.methods` entry point (see {args.name}.md) or in stages/methods/__init__.py")
    return 0


def add_new_method_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("new-method", help="write a new method's module, its test and its docs stub")
    p.add_argument("name", help="the method's name, lower_snake_case (what `methods:` selects)")
    p.add_argument("--dir", default=".", help="where to write them (default: here)")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.set_defaults(func=cmd_new_method)
