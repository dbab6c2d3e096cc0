"""The Theanine and RSum configs hold the papers' protocols: Theanine's RSum-LLM (Sections 3.2-3.3) at
temperature 0.75 with relevant-memory selection, in RSum's own response frame (App. H: its original
prompt; no length instruction); RSum's own run (Section 4) at temperature 0, its four methods in that
one frame; next-response probes of both speakers in Theanine's sessions 3-5 (inferred from
App. D's ~3,600 responses per comparison)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

import stages
from stages.methods.rsum import RSum
from stages.probes import ProbesConfig, next_response_probes

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
THEANINE_SIDE = ["theanine_msc", "theanine_cc", "teafarm_msc_cc"]


def config(name: str):
    return stages.load_config(CONFIGS / f"{name}.yaml")


def rsum_temperatures(cfg) -> tuple[float, float]:
    """The temperature RSum's memory calls and its response calls are sent with: its own setting when
    given (sent per call, over the role's), else the role's."""
    sent = RSum().params(cfg.method.rsum)
    return tuple(sent.get("temperature", cfg.role(role).temperature) for role in (RSum.build_role, RSum.answer_role))


@pytest.mark.parametrize("name", THEANINE_SIDE)
def test_theanine_configs_run_rsum_llm_as_theanine_did(name):
    cfg = config(name)
    assert "rsum" in cfg.methods
    assert rsum_temperatures(cfg) == (0.75, 0.75)  # Section 3.3: 0.75 "in all experiments including baselines"
    assert cfg.role("generator").temperature == cfg.role("memory").temperature == 0.75
    rsum = cfg.method.rsum
    assert rsum.select_relevant  # Section 3.2 step (ii)
    assert rsum.response_style == "rsum"  # RSum's frame (App. H), no "short reply": Section 4's 77-word answers


@pytest.mark.parametrize("name", ["theanine_msc", "theanine_cc"])
def test_theanine_configs_probe_every_utterance_of_both_speakers_in_sessions_3_to_5(name):
    probes = config(name).probes
    assert probes.next_response and not probes.qa
    assert (probes.from_session, probes.to_session) == (3, 5)
    assert probes.agent_speaker == "all" and probes.max_per_episode is None


def test_rsum_config_runs_rsum_as_its_own_paper():
    cfg = config("rsum_msc")
    assert set(cfg.methods) == {"rsum", "all_context", "part_context", "gold_memory"}
    assert rsum_temperatures(cfg) == (0.0, 0.0)  # RSum Section 4: temperature 0 throughout
    assert cfg.role("generator").temperature == 0.0  # the context baselines and gold memory too
    assert not cfg.method.rsum.select_relevant and not cfg.method.rsum.one_shot
    # RSum's four methods share RSum's one response frame (no length limit), so they differ only in
    # what they remember; no "a short, natural reply" (the round-3 review's F1 / F9).
    m = cfg.method
    assert m.rsum.response_style == m.gold_memory.response_style == "rsum"
    assert m.all_context.response_style == m.part_context.response_style == "rsum"
    assert (cfg.probes.from_session, cfg.probes.to_session, cfg.probes.max_per_episode) == (2, 5, None)


def dialogue() -> tuple[dict, dict[int, list[dict]]]:
    episode = {"episode_id": "e1", "speakers": ["Ann", "Bob"]}
    sessions = {s: [{"speaker": "Ann" if i % 2 == 0 else "Bob", "text": f"s{s} t{i}", "turn_idx": i}
                    for i in range(4)] for s in (1, 2, 3)}
    sessions[3].append({"speaker": "Ann", "text": "s3 t4", "turn_idx": 4})
    return episode, sessions


def test_agent_speaker_all_probes_every_turn_after_the_first_answered_by_its_own_speaker():
    episode, sessions = dialogue()
    probes = next_response_probes(episode, sessions, ProbesConfig(from_session=2, to_session=3, agent_speaker="all"))
    assert [(p["session_idx"], p["turn_idx"], p["respondent"], p["request"], p["gold"]) for p in probes] == [
        (2, 1, "Bob", "s2 t0", "s2 t1"), (2, 2, "Ann", "s2 t1", "s2 t2"), (2, 3, "Bob", "s2 t2", "s2 t3"),
        (3, 1, "Bob", "s3 t0", "s3 t1"), (3, 2, "Ann", "s3 t1", "s3 t2"), (3, 3, "Bob", "s3 t2", "s3 t3"),
        (3, 4, "Ann", "s3 t3", "s3 t4")]
    assert len({p["probe_id"] for p in probes}) == len(probes)


def test_an_integer_agent_speaker_still_probes_that_speaker_only():
    episode, sessions = dialogue()
    bob = next_response_probes(episode, sessions, ProbesConfig(from_session=3, agent_speaker=1))
    assert [(p["turn_idx"], p["respondent"]) for p in bob] == [(1, "Bob"), (3, "Bob")]
    ann = next_response_probes(episode, sessions, ProbesConfig(from_session=3, agent_speaker=0))
    assert [(p["turn_idx"], p["respondent"]) for p in ann] == [(2, "Ann"), (4, "Ann")]  # turn 0 never a probe
    assert ProbesConfig().agent_speaker == 1
    assert stages.load_config(None, ["probes.agent_speaker=all"]).probes.agent_speaker == "all"
    assert stages.load_config(None, ["probes.agent_speaker=0"]).probes.agent_speaker == 0
    for bad in ("both", -1):
        with pytest.raises(ValidationError):
            ProbesConfig(agent_speaker=bad)
