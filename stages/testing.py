"""A test kit for method authors: run one method on the sample corpus against a scripted
OpenAI-compatible server and read back every table it wrote, in a few lines. Authors import it from
`stages.api`, as everything else of ours:

    from stages.api import run_method

    def test_my_method(fake_llm, tmp_path):            # `fake_llm`: pytest fixture of this kit
        fake_llm.responder = lambda body: "a scripted reply"
        tables = run_method(MyMethod(), fake_llm.base_url, tmp_path)
        assert tables["respond_my_method.responses"].num_rows > 0

The fixtures (`fake_llm`, `sample_corpus`) come with the package as a pytest plug-in (the `pytest11`
entry point `mempipe`: `pipeline.testing.plugin`): installed, they are there in any project's tests.
The server and a scripted in-process client are `FakeOpenAI` and `FakeChat` in `stages.api`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.artifacts import StageDir
from pipeline.config import resolve_paths
from pipeline.engine.runner import Runner
from pipeline.testing.plugin import SAMPLE_CORPUS
from stages import load_config, registry
from stages.method_stages import respond_stage_name
from stages.methods import METHODS
from stages.methods.base import Method

_KEY_ENV = "MEMPIPE_TESTING_KEY"  # a dummy key for the fake server; never a real one


def run_method(method: Method, llm_url: str, workdir: Path, *, settings: Mapping[str, Any] | None = None,
               corpus: Path = SAMPLE_CORPUS, episodes: int | None = 1, sets: Sequence[str] = (),
               executor: str = "inline") -> dict[str, pa.Table]:
    """Ingest `corpus` (sample format; `episodes` of it, None for all), make its probes, build
    `method`'s memory and answer every probe with it, every LLM role at `llm_url`, under `workdir`;
    returns each table the run wrote as "<stage>.<table>". `settings`: the method's settings
    (`method.<name>.<key>`); `sets`: any other config keys as `--set` takes them; `executor`: `ray`
    runs the shards on Ray as a real run does (slower to start)."""
    os.environ.setdefault(_KEY_ENV, "sk-fake-for-tests")
    methods = {**METHODS, method.name: method}
    cfg = resolve_paths(load_config(None, [
        f"artifacts_dir={workdir / 'artifacts'}", f"run_name=test-{method.name}", f"methods=[{method.name}]",
        "corpus.format=sample", f"corpus.path={corpus}", f"corpus.limit={'null' if episodes is None else episodes}",
        "llm.provider=openai", f"llm.base_url={llm_url}", f"llm.api_key_env={_KEY_ENV}",
        f"llm.cache_dir={workdir / 'llm-cache'}", "llm.backoff_base_s=0.01", f"ray.executor={executor}",
        f"embedding.vector_cache_dir={workdir / 'vectors'}",
        "teabag.enabled=false",
        *(f"method.{method.name}.{k}={v}" for k, v in (settings or {}).items()), *sets,
    ], methods=methods))
    runner = Runner(cfg, registry(cfg, methods))
    respond = respond_stage_name(method.name)
    runner.run(until=respond)  # the method's answers and whatever they need (banks for SeCom-like methods)
    ran = [s for s in runner.plan if s.name in runner.upstream(respond)]
    return {f"{s.name}.{table}": StageDir(cfg.run_dir, s.name).read_table(table) for s in ran for table in s.outputs}
