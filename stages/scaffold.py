"""`mempipe new-method NAME`: a new method as a package of its own, the form docs/adding-a-method.md
shows: `pyproject.toml` registering it under the `mempipe.methods` entry point, the method's module
(`src/<package>/method.py`), its test (`tests/test_<name>.py`) and a README. Everything it imports of
ours comes from `stages.api`, and its test passes as written once the package is installed
(`pip install --no-deps --no-build-isolation -e DIR`).

The module is a neutral, working template named for the method: it keeps the last `k` turns of each
session and answers from the `top_n` of them BM25 finds for the request, each setting with its
bounds. The page prints it (a test keeps the two equal and runs it)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from string import Template

METHOD_MODULE = "method"  # src/<package>/method.py

METHOD_TEMPLATE = Template('''\
"""$camel (`$name`): what the method keeps, and how it answers from it.

As written (a template to replace): it keeps the last `k` turns of each session, one memory row per
turn, and answers a probe from the `top_n` rows of earlier sessions that BM25 ranks highest for the
probe's request."""

import pyarrow as pa
from pydantic import Field

from stages.api import (SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, MethodSettings, ProbeInput,
                        Rows, after_session, answer_from_memory, bm25_scores, format_unit, top_k)

NOTES = pa.schema([*SNAPSHOT_FIELDS, pa.field("memory_id", pa.string()), pa.field("text", pa.string())])


class ${camel}Settings(MethodSettings):
    k: int = Field(3, ge=1)  # turns kept per session, the last ones
    top_n: int = Field(5, ge=1)  # memory rows an answer reads


class $camel(Method[${camel}Settings]):
    name = "$name"  # what `methods:` selects; its settings are `method.$name.*` (the model in Method[...])
    memory = {"notes": NOTES}
    memory_kind = "log"  # rows accumulate: a probe sees the rows of every session before it

    async def build(self, ctx: MethodContext[${camel}Settings], episode: EpisodeInput) -> dict[str, Rows]:
        rows = []
        for session, turns in episode.sessions.items():  # session index -> its turns, in order
            for turn in turns[-ctx.settings.k:]:
                rows.append({**after_session(episode.episode["episode_id"], session),
                             "memory_id": f"{session}:{turn['turn_idx']}", "text": format_unit([turn])})
        return {"notes": rows}

    async def answer(self, ctx: MethodContext[${camel}Settings], probe: ProbeInput,
                     memory: dict[str, Rows]) -> Answer:
        notes = memory["notes"]  # only the rows built before the probe's turn
        best = [notes[i] for i in top_k(bm25_scores(probe.request, [n["text"] for n in notes]), ctx.settings.top_n)]
        return await answer_from_memory(ctx.llm, probe, "\\n".join(n["text"] for n in best),
                                        [n["memory_id"] for n in best])

    def memory_view(self, episode: EpisodeInput, memory: dict[str, Rows], settings: ${camel}Settings) -> str:
        return "\\n".join(n["text"] for n in memory["notes"])  # what the memory-quality judge reads
''')

TEST_TEMPLATE = Template('''\
"""$camel on the sample corpus against the fake OpenAI-compatible server (`fake_llm`, a fixture
mempipe's test kit registers with pytest)."""

from collections import Counter

from stages.api import run_method

from $package.$module import $camel


def test_${name}_keeps_k_turns_a_session_and_answers_from_earlier_sessions(fake_llm, tmp_path):
    fake_llm.responder = lambda body: "Sure, let us go hiking."
    tables = run_method($camel(), fake_llm.base_url, tmp_path, settings={"k": 2, "top_n": 3})
    notes = tables["memory_$name.notes"].to_pylist()
    responses = tables["respond_$name.responses"].to_pylist()
    assert notes and max(Counter(n["snapshot_session"] for n in notes).values()) <= 2
    assert responses and all(r["error"] is None and r["response"] for r in responses)
    session_of = {p["probe_id"]: p["session_idx"] for p in tables["probes.probes"].to_pylist()}
    for r in responses:  # at most top_n rows, each from a session before the probe's
        assert len(r["memory_ids"]) <= 3
        assert all(int(i.split(":")[0]) < session_of[r["probe_id"]] for i in r["memory_ids"])
''')

PYPROJECT_TEMPLATE = Template('''\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "$camel, a memory method for mempipe"
requires-python = ">=3.11"
# mempipe itself comes from its clone, installed in the same environment (pip install -e <clone>)

[project.entry-points."mempipe.methods"]
$name = "$package.$module:$camel"

[tool.setuptools.packages.find]
where = ["src"]
''')

README_TEMPLATE = Template('''\
# $camel (`$name`)

A memory method for mempipe. What it keeps: the last `k` turns of each session (the template's
memory: replace it). How it answers: from the `top_n` memory rows BM25 finds for the request.

| key | default | what it does |
|---|---|---|
| `method.$name.k` | `3` | turns kept per session, the last ones (at least 1) |
| `method.$name.top_n` | `5` | memory rows an answer reads (at least 1) |

Install it into mempipe's environment (offline: no download, no build environment), then test it:

```bash
pip install --no-deps --no-build-isolation -e .
python -m pytest tests
```

Run it beside the baselines: `methods: [$name, rsum, full_history]` (mempipe's
docs/adding-a-method.md, "A quick run", runs it against a fake server in under a minute).
''')


def camel_case(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _check_name(what: str, value: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", value):
        raise ValueError(f"{what} {value!r}: use lower_snake_case (letters, digits, _), starting with a letter")


def method_files(name: str, package: str | None = None) -> dict[str, str]:
    """Path (relative to the package's folder) -> text of a new method `name` (snake_case) in the
    Python package `package` (default: the method's name): pyproject.toml, README.md, the package's
    `__init__.py` and method module, and the test."""
    _check_name("method name", name)
    package = package or name
    _check_name("package name", package)
    if package in ("pipeline", "stages", "tests"):
        raise ValueError(f"package name {package!r} is one of mempipe's own; choose another")
    fill = {"name": name, "camel": camel_case(name), "package": package, "module": METHOD_MODULE,
            "dist": package.replace("_", "-")}
    return {"pyproject.toml": PYPROJECT_TEMPLATE.substitute(fill), "README.md": README_TEMPLATE.substitute(fill),
            f"src/{package}/__init__.py": "",
            f"src/{package}/{METHOD_MODULE}.py": METHOD_TEMPLATE.substitute(fill),
            f"tests/test_{name}.py": TEST_TEMPLATE.substitute(fill)}


def cmd_new_method(args: argparse.Namespace) -> int:
    out = Path(args.dir or args.name)
    try:
        files = method_files(args.name, args.package)
    except ValueError as e:
        print(f"mempipe: error: {e}")
        return 1
    taken = [f for f in files if (out / f).exists()]
    if taken:
        print(f"mempipe: error: {', '.join(str(out / f) for f in taken)} already exist; nothing written")
        return 1
    for f, text in files.items():
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        (out / f).write_text(text)
        print(f"wrote {out / f}")
    print(f"next: cd {out} && pip install --no-deps --no-build-isolation -e . && python -m pytest tests; "
          f"then `methods: [{args.name}, ...]` selects it (docs/adding-a-method.md)")
    return 0


def add_new_method_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("new-method", help="write a new method as a package of its own: pyproject, module, test, README")
    p.add_argument("name", help="the method's name, lower_snake_case (what `methods:` selects)")
    p.add_argument("--dir", default=None, help="the package's folder (default: ./NAME)")
    p.add_argument("--package", default=None, help="the Python package, lower_snake_case (default: NAME)")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.set_defaults(func=cmd_new_method)
