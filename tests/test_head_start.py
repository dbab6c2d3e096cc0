"""What a Ray run starts before its first shard (RayExecutor.prepare): the LLM workers, with the LLM
stages' code imported, and the node's embedding service, while ingest runs; a head start that fails
is quiet, and the stage that needs the service starts it and reports."""

from __future__ import annotations

import time

import pytest
import ray

from pipeline.config import RunConfig
from pipeline.engine.execution.embedding_service import EmbeddingServices, service_name
from pipeline.engine.execution.executors import RayExecutor
from pipeline.engine.execution.llm_workers import LLMWorkers
from pipeline.engine.runner import Runner
from stages import registry


@pytest.mark.session_ray
def test_the_llm_workers_and_the_embedding_service_start_before_the_first_shard(run_cfg) -> None:
    cfg = run_cfg("methods=[secom]", "corpus.limit=1", executor="ray")
    stages = list(registry(cfg).values())
    llm = [s for s in stages if s.llm_roles(cfg)]
    assert llm and any(s.uses_embedder for s in stages)
    EmbeddingServices._started.clear()  # a service of an earlier test's job would count as started
    LLMWorkers.discard(cfg)  # an earlier test's pool on this session's Ray

    RayExecutor(cfg).prepare(stages)

    assert LLMWorkers._key(cfg) in LLMWorkers._pools  # started by prepare, not by a stage
    pool = LLMWorkers.of(cfg)
    assert pool.actors
    # Each worker received the LLM stages (their code imported there) before any shard.
    assert ray.get([a.warm.remote(llm) for a in pool.actors], timeout=120) == [len(llm)] * len(pool.actors)
    name = service_name(ray.get_runtime_context().get_job_id(), ray.get_runtime_context().get_node_id(), cfg.embedding)
    deadline = time.monotonic() + 120
    while name not in EmbeddingServices._started and time.monotonic() < deadline:
        time.sleep(0.2)
    assert name in EmbeddingServices._started  # started in the background, not by a stage


@pytest.mark.session_ray
def test_a_failed_head_start_is_quiet_and_the_stage_that_needs_it_reports(run_cfg, monkeypatch) -> None:
    cfg = run_cfg("methods=[secom]", "corpus.limit=1", "stages=[ingest,guidance,segment,compress,banks]",
                  executor="ray")
    calls: list[str] = []
    ensure = EmbeddingServices.ensure  # bound to the class

    def failing_once(run: RunConfig) -> None:
        calls.append("ensure")
        if len(calls) == 1:
            raise RuntimeError("the service could not start")
        ensure(run)

    monkeypatch.setattr(EmbeddingServices, "ensure", failing_once)
    EmbeddingServices._started.clear()
    out = Runner(cfg, registry(cfg)).run()
    assert set(out.values()) == {"ran"}  # the failed head start stopped nothing
    assert len(calls) >= 2  # banks started the service itself
