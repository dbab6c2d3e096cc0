"""Methods as plug-ins: per-method stages and fingerprints, memory snapshots a probe may see,
named LLM roles, structured modes, and reruns that never pay twice. Through Ray, against the
fake OpenAI-compatible server."""

from __future__ import annotations

import pytest

from pipeline.testing.fake_openai import FakeOpenAI
from pipeline.artifacts import StageDir
from pipeline.errors import ConfigError
from pipeline.engine.runner import Runner
from stages import load_config, registry
from stages.methods import METHODS
from stages.methods.base import visible_memory
from toy_methods import TOY_METHODS, ref

ALL_METHODS = {**METHODS, **TOY_METHODS}
TOYS = "stages=[ingest,probes,memory_turn_log,memory_session_notes,respond_turn_log,respond_session_notes]"
EVERY_PROBE = ("probes.max_per_episode=null", "probes.max_qa_per_episode=null")


def run(cfg, **kwargs) -> dict[str, str]:
    return Runner(cfg, registry(cfg, ALL_METHODS)).run(**kwargs)


def responses(cfg, method: str) -> list[dict]:
    return StageDir(cfg.run_dir, f"respond_{method}").read_table("responses").to_pylist()


def test_each_method_gets_its_own_memory_and_respond_stages(run_cfg):
    cfg = run_cfg("methods=[secom,turn_log,full_history]", methods=ALL_METHODS)
    names = list(registry(cfg, ALL_METHODS))
    # secom shows its bank units as its memory (a memory stage without tables); full history keeps none.
    assert names == ["ingest", "guidance", "segment", "compress", "banks", "probes", "memory_secom",
                     "memory_turn_log", "respond_secom", "respond_turn_log", "respond_full_history", "score",
                     "response_metrics", "judge_pairwise", "judge_answers", "diagnose", "memory_ops", "judge_memory",
                     "report"]
    responded = ("respond_secom", "respond_turn_log", "respond_full_history")
    assert registry(cfg, ALL_METHODS)["report"].inputs == (
        "probes", "score", "response_metrics", "judge_pairwise", "judge_answers", "diagnose", "memory_ops", "judge_memory",
        *responded,
        "memory_secom", "memory_turn_log")
    assert registry(cfg, ALL_METHODS)["judge_memory"].inputs == ("ingest", "memory_secom", "memory_turn_log")
    assert registry(cfg, ALL_METHODS)["judge_pairwise"].inputs == ("ingest", "probes", *responded)


def test_a_probe_sees_exactly_the_memory_built_before_its_turn(run_cfg, fake_llm):
    cfg = run_cfg("corpus.limit=1", "methods=[turn_log,session_notes]", TOYS, *EVERY_PROBE, methods=ALL_METHODS)
    assert set(run(cfg).values()) == {"ran"}
    turns = StageDir(cfg.run_dir, "ingest").read_table("turns").to_pylist()
    probes = {p["probe_id"]: p for p in StageDir(cfg.run_dir, "probes").read_table("probes").to_pylist()}
    assert {p["kind"] for p in probes.values()} == {"next_response", "qa"} and len(probes) > 10
    for r in responses(cfg, "turn_log"):
        p = probes[r["probe_id"]]
        before = [ref(t["session_idx"], t["turn_idx"]) for t in turns
                  if t["session_idx"] < p["session_idx"]
                  or (t["session_idx"] == p["session_idx"] and p["turn_idx"] is not None and t["turn_idx"] < p["turn_idx"])]
        assert r["error"] is None and sorted(r["memory_ids"]) == sorted(before), p["probe_id"]
    n_sessions = max(t["session_idx"] for t in turns)
    for r in responses(cfg, "session_notes"):
        p = probes[r["probe_id"]]
        last = min(p["session_idx"] - 1, n_sessions)  # its own session's note is built from its end
        assert r["memory_ids"] == [f"session {s}" for s in range(1, last + 1)], p["probe_id"]
    # The memory build used its own role; usage is reported per role.
    assert set(StageDir(cfg.run_dir, "memory_session_notes").manifest().llm_usage) == {"memory"}
    assert set(StageDir(cfg.run_dir, "respond_turn_log").manifest().llm_usage) == {"generator"}


def test_visible_memory_keys():
    rows = [{"snapshot_session": s, "snapshot_turn": t, "v": f"{s}/{t}"}
            for s, t in [(1, None), (2, 0), (2, 1), (2, None), (3, 4)]]
    assert [r["v"] for r in visible_memory(rows, 2, 1, "snapshots")] == ["2/0"]
    assert [r["v"] for r in visible_memory(rows, 2, 0, "snapshots")] == ["1/None"]
    assert [r["v"] for r in visible_memory(rows, 3, 0, "snapshots")] == ["2/None"]
    assert [r["v"] for r in visible_memory(rows, 3, 0, "log")] == ["1/None", "2/0", "2/1", "2/None"]
    assert [r["v"] for r in visible_memory(rows, 4, None, "snapshots")] == ["3/4"]
    assert visible_memory(rows, 1, 5, "log") == []


# The stages that read every method's responses.
SCORED_FROM_RESPONSES = {"response_metrics", "judge_pairwise", "judge_answers", "diagnose", "judge_memory", "report"}


def generated(fake_llm) -> list:
    """Requests for free text (responses), not structured (segmentation, judges)."""
    return [r for r in fake_llm.requests if "response_format" not in r["body"]]


def test_one_methods_setting_reruns_only_its_own_stages_and_the_report(run_cfg, fake_llm):
    first = run_cfg("corpus.limit=1", "compress.method=none", "methods=[secom,turn]")
    run(first)
    fake_llm.reset()
    changed = run_cfg("corpus.limit=1", "compress.method=none", "methods=[secom,turn]", "method.turn.top_k=5")
    out = run(changed)
    # memory_turn (its bank units as text, no LLM call) carries the method's settings too.
    assert {k for k, v in out.items() if v == "ran"} == {"memory_turn", "respond_turn", *SCORED_FROM_RESPONSES}
    assert out["respond_secom"] == "skipped" and out["segment"] == "skipped"
    n_probes = StageDir(changed.run_dir, "probes").manifest().rows
    # respond_turn's calls, none from respond_secom; the judges' calls are structured
    assert 0 < len(generated(fake_llm)) <= n_probes
    # Adding a method runs only its stage (and what scores and reports the responses).
    fake_llm.reset()
    added = run_cfg("corpus.limit=1", "compress.method=none", "methods=[secom,turn,zero_history]", "method.turn.top_k=5")
    out = run(added)
    # zero_history keeps no memory, so the memory judge (which reads memory stages) has nothing new.
    assert {k for k, v in out.items() if v == "ran"} == {"respond_zero_history", *SCORED_FROM_RESPONSES} - {
        "judge_memory"}
    assert len(generated(fake_llm)) <= n_probes


def test_method_settings_are_validated_by_the_method():
    cfg = load_config(None, ["methods=[turn]", "method.turn.top_k=5", "method.secom.retriever=dense"])
    assert cfg.method.turn.top_k == 5 and cfg.method.secom.retriever == "dense" and cfg.method.session.top_k == 1
    with pytest.raises(ConfigError, match=r"method\.turn\.top_kk: unknown key"):
        load_config(None, ["method.turn.top_kk=5"])
    with pytest.raises(ConfigError, match=r"method\.nosuch: unknown key"):
        load_config(None, ["method.nosuch.top_k=5"])
    with pytest.raises(ConfigError, match=r"methods: unknown method 'nosuch'"):
        load_config(None, ["methods=[secom,nosuch]"])
    with pytest.raises(ConfigError, match=r"roles\.writer: unknown role"):
        load_config(None, ["roles.writer.model=x"])


def test_roles_override_llm_field_by_field():
    cfg = load_config(None, ["llm.model=base", "llm.temperature=0.3", "roles.segmenter.model=gpt-4",
                             "roles.generator.seed=null"])
    seg, gen = cfg.role("segmenter"), cfg.role("generator")
    assert (seg.model, seg.temperature, seg.seed) == ("gpt-4", 0.3, 0)
    assert (gen.model, gen.seed) == ("base", None)


def test_json_schema_rejected_falls_back_to_json_object_and_records_the_mode(run_cfg, fake_llm):
    fake_llm.reject_formats = {"json_schema"}
    cfg = run_cfg("corpus.limit=1", "stages=[ingest,guidance,segment]")
    run(cfg)
    sd = StageDir(cfg.run_dir, "segment")
    rows = sd.read_table("segments").to_pylist()
    assert rows and not any(r["fallback"] for r in rows)
    m = sd.manifest()
    assert m.stats["fallback_sessions"] == 0
    assert m.llm_usage["segmenter"].structured_modes == {"json_object": m.stats["sessions"]}
    assert {(r["body"].get("response_format") or {}).get("type") for r in fake_llm.requests} == {
        "json_schema", "json_object"}


def test_two_roles_on_two_endpoints_are_called_and_cached_separately(run_cfg, fake_llm, tmp_path):
    with FakeOpenAI() as other:
        stages = "stages=[ingest,guidance,segment,compress,banks,probes,respond_secom]"
        sets = ("corpus.limit=1", "compress.method=none", "methods=[secom]", stages)
        cfg = run_cfg(*sets, f"roles.generator.base_url={other.base_url}", "roles.generator.model=answerer")
        run(cfg)
        assert fake_llm.count() > 0 and all("response_format" in r["body"] for r in fake_llm.requests)
        assert other.count() > 0 and all(r["body"]["model"] == "answerer" and "response_format" not in r["body"]
                                          for r in other.requests)
        n_answers = other.count()
        m = StageDir(cfg.run_dir, "respond_secom").manifest()
        assert m.roles == {"generator": "answerer"} and set(m.llm_usage) == {"generator"}
        # The generator's answers are cached under its endpoint: pointed at the first server with the
        # same model, nothing is replayed from the other one.
        fake_llm.reset()
        moved = run_cfg(*sets, "roles.generator.model=answerer", "run_name=moved")
        run(moved)
        generated = [r for r in fake_llm.requests if "response_format" not in r["body"]]
        assert len(generated) == n_answers and other.count() == n_answers


def test_a_forced_rerun_of_all_invalid_rows_sends_nothing_and_retry_failed_asks_anew(run_cfg, fake_llm):
    fake_llm.responder = lambda body: '{"segments": [{"start": 0, "end": 1}]}' if "response_format" in body else None
    cfg = run_cfg("corpus.limit=1", "llm.structured_retries=1", "stages=[ingest,guidance,segment]")
    run(cfg)
    sd = StageDir(cfg.run_dir, "segment")
    first = sd.read_table("segments")
    assert all(first.column("fallback").to_pylist())
    sent = fake_llm.count()
    assert sent == 2 * sd.manifest().stats["sessions"]  # each session: an answer and one re-ask
    assert run(cfg, force=["segment"])["segment"] == "ran"
    assert fake_llm.count() == sent and sd.read_table("segments").equals(first)
    # --retry-failed: only the failed requests are asked again, with the next sample's seed.
    fake_llm.responder = None  # the fake now answers with schema-valid (if arbitrary) segments
    out = run(cfg, retry_failed="segment")
    assert out == {"segment": "ran"}
    new = fake_llm.requests[sent:]
    assert len(new) >= sd.manifest().stats["sessions"] and {r["body"]["seed"] for r in new} == {cfg.segment.seed + 1}
    assert sd.manifest().retry_round == 1
    retried = sd.read_table("segments")
    # A later forced rerun keeps the retry round, so it replays the same answers for free.
    sent = fake_llm.count()
    run(cfg, force=["segment"])
    assert fake_llm.count() == sent and sd.read_table("segments").equals(retried)
    assert sd.manifest().retry_round == 1


def test_until_runs_a_stage_and_what_it_needs(run_cfg, fake_llm):
    cfg = run_cfg("corpus.limit=1", "compress.method=none", "methods=[secom]")
    out = run(cfg, until="segment")
    assert out == {"ingest": "ran", "guidance": "ran", "segment": "ran"}
    out = run(cfg, until="compress")
    assert out == {"ingest": "skipped", "guidance": "skipped", "segment": "skipped", "compress": "ran"}
