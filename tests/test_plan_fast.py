"""`mempipe plan` runs no model and answers fast on big corpora: compression and local embeddings
are simulated in its dry run, turn-by-turn stages are sampled by turns and probe-driven stages by
probes, and everything it samples is scaled back (pipeline/plan/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.plan import EpisodeSize, _best_measure, _take_within, make_plan
from pipeline.engine.runner import Runner

LLMLINGUA2_HUB = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"
MPNET_HUB = "sentence-transformers/multi-qa-mpnet-base-dot-v1"
SECOM = ("methods=[secom]", "stages=[ingest,guidance,segment,compress,banks,probes,respond_secom]",
         "method.secom.retriever=dense")


def _registry(cfg):
    from stages import registry

    return registry(cfg)


def _stage(plan, name: str):
    return next(s for s in plan.stages if s.name == name)


@pytest.fixture
def no_models(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_network) -> None:
    """An empty hub cache, the hub offline, and model loaders that fail the test if called."""
    import pipeline.compression as compression
    import pipeline.embeddings as embeddings

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"plan loaded a model: {args}")

    monkeypatch.setattr(compression, "_load_prompt_compressor", refuse)
    monkeypatch.setattr(embeddings, "_load_sentence_transformer", refuse)


def test_plan_compresses_and_embeds_without_a_model_and_says_so(run_cfg, fake_llm, no_models, tmp_path):
    cfg = run_cfg("corpus.limit=1", *SECOM, "compress.method=llmlingua2", f"compress.model={LLMLINGUA2_HUB}",
                  f"embedding.model={MPNET_HUB}", "embedding.normalize=false",
                  f"embedding.vector_cache_dir={tmp_path / 'vectors'}")
    plan = make_plan(cfg, _registry, write=False)
    assert fake_llm.total == 0
    models = plan.method["models"]
    assert models["compress"].startswith("estimated from sizes") and "rate" in models["compress"]
    assert models["embeddings"].startswith("simulated vectors") and "banks" in models["embeddings"]
    assert "no model" in models["embeddings"] and "no model" in models["compress"]
    assert _stage(plan, "respond_secom").total()["calls"] > 0
    assert not (tmp_path / "vectors").exists()  # simulated vectors never enter the real vector cache
    # The plan's fingerprints are the real run's (the dry run's own config never leaks into them).
    fps = Runner(cfg, _registry(cfg)).fingerprints()
    assert {s.name: s.fingerprint for s in plan.stages} == fps


def test_simulated_models_are_the_dry_runs_only(run_cfg, fake_llm):
    from pipeline.compression import Compressor
    from pipeline.config import EmbeddingConfig
    from pipeline.embeddings import CachedEmbedder, SimulatedEmbedder, make_embedder
    from pipeline.simulation import models_simulated

    make_plan(run_cfg("corpus.limit=1", *SECOM), _registry, write=False)
    # After a plan, the process embeds and compresses for real again.
    assert isinstance(make_embedder(EmbeddingConfig(vector_cache_dir=None)), CachedEmbedder)
    with models_simulated():
        emb = make_embedder(EmbeddingConfig(model=MPNET_HUB))
    assert isinstance(emb, SimulatedEmbedder) and emb.dim == 768
    a, b, c = emb.encode(["the dog in the park", "the dog in the park", "a new job"])
    assert a.tolist() == b.tolist() and abs(float(a @ a) - 1.0) < 1e-5 and float(a @ c) < float(a @ b)
    compressor = Compressor("llmlingua2", model=LLMLINGUA2_HUB, rate=0.5)
    with models_simulated():
        out = compressor.compress_unit(["Maya: one two three four five six seven eight\nTom: Yes.",
                               "Maya: Dr. Kim: is no tag here"], ["Maya", "Tom"])
    assert out.path == "per_exchange"
    assert out.text.split("\n") == ["Maya: one three five seven", "Tom: Yes.", "Maya: Dr. is tag"]


def _locomo(path: Path, conversations: int, sessions: int, questions: int) -> Path:
    """A small corpus in LoCoMo's layout: conversations of `sessions` sessions of 6 turns."""
    samples = []
    for c in range(conversations):
        conv: dict[str, Any] = {"speaker_a": "Maya", "speaker_b": "Tom"}
        ids = []
        for s in range(1, sessions + c + 1):  # conversations grow: scaling by turns is not by episodes
            turns = [{"speaker": ("Maya", "Tom")[t % 2], "dia_id": f"D{s}:{t + 1}",
                      "text": f"session {s} turn {t} about the garden and the band {c}"} for t in range(6)]
            ids += [t["dia_id"] for t in turns]
            conv[f"session_{s}"] = turns
            conv[f"session_{s}_date_time"] = f"1:00 pm on {s} May, 2023"
        qa = [{"question": f"What about the garden {q}?", "answer": "It grew.", "evidence": [ids[q % len(ids)]],
               "category": 1 + q % 4} for q in range(questions)]
        samples.append({"sample_id": f"conv-{c + 1}", "conversation": conv, "qa": qa})
    path.write_text(json.dumps(samples))
    return path


def test_probes_sampled_in_the_dry_run_are_scaled_back(run_cfg, fake_llm, tmp_path):
    corpus = _locomo(tmp_path / "locomo.json", 2, 3, 12)
    sets = ("corpus.format=locomo", f"corpus.path={corpus}", "corpus.limit=null", "methods=[full_history]",
            "stages=[ingest,probes,respond_full_history]", "probes.max_qa_per_episode=null",
            "probes.next_response=false")
    cfg = run_cfg(*sets)
    every = make_plan(cfg, _registry, write=False, probe_cap=None)
    sampled = make_plan(cfg, _registry, write=False, probe_cap=4)
    full, est = _stage(every, "respond_full_history").total(), _stage(sampled, "respond_full_history").total()
    assert full["calls"] == 24 and est["calls"] == pytest.approx(24)  # one call per question
    assert est["prompt_tokens"] == pytest.approx(full["prompt_tokens"], rel=0.15)
    assert "x 3 (the run's probes)" in _stage(sampled, "respond_full_history").roles[0].method["calls"]
    assert "at most 4 probes" in sampled.method["dry_run"]
    # Calibrated on a real run, the sampled probes are compared as if the dry run had made them all.
    Runner(cfg, _registry(cfg)).run()
    real = Runner(cfg, _registry(cfg)).status()
    usage = next(st.manifest for st in real if st.name == "respond_full_history").llm_usage["generator"]
    again = make_plan(cfg, _registry, write=False, probe_cap=4, from_="respond_full_history")
    est = _stage(again, "respond_full_history").roles[0]
    assert "calibrated on this run's manifests" in est.method["calls"]
    assert est.calls == pytest.approx(usage.calls + usage.failed_calls, rel=1e-6)
    assert est.prompt_tokens == pytest.approx(usage.prompt_tokens, rel=1e-6)


def test_turn_by_turn_stages_are_sampled_by_turns(run_cfg, fake_llm, tmp_path):
    corpus = _locomo(tmp_path / "locomo.json", 4, 3, 2)
    cfg = run_cfg("corpus.format=locomo", f"corpus.path={corpus}", "corpus.limit=null", "methods=[ld_agent]",
                  "stages=[ingest,memory_ld_agent]", "method.ld_agent.events=false", "method.ld_agent.persona_every=1")
    every = make_plan(cfg, _registry, write=False, max_turns=None)
    sampled = make_plan(cfg, _registry, write=False, max_turns=40)
    assert sampled.method["dry_run_episodes"] == 2 and every.method["dry_run_episodes"] == 4
    full, est = _stage(every, "memory_ld_agent").total(), _stage(sampled, "memory_ld_agent").total()
    assert est["calls"] == pytest.approx(full["calls"])  # a persona call per turn: exact by turns
    assert "by turns" in _stage(sampled, "memory_ld_agent").roles[0].method["calls"]


def test_the_size_a_stage_grows_with_and_the_turn_budget():
    sizes = [EpisodeSize("a", 2, 10, 5), EpisodeSize("b", 4, 30, 5)]
    assert _best_measure({"a": 20, "b": 60}, sizes) == "turns"
    assert _best_measure({"a": 2, "b": 4}, sizes) == "sessions"
    assert _best_measure({"a": 7, "b": 7}, sizes) == "episodes"  # a tie goes to episodes
    assert _best_measure({"a": 7}, sizes[:1]) == "episodes"  # one episode: nothing to choose by
    big = [[EpisodeSize(f"e{i}", 19, 400, 199) for i in range(10)]]
    assert _take_within(big, 20, 1000, 1) == 2  # at least 2, while they exceed the turn budget
    assert _take_within(big, 20, None, 1) == 10 and _take_within(big, 20, 1000, 5) == 5
    assert _take_within([[EpisodeSize("x", 5, 50, 0)] * 3], 20, 1000, 1) == 3
