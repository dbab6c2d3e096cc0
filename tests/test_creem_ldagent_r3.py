"""Round-3 review items of CREEM (seed 004) and LD-Agent (seed 003): the reply sees the memory of the
partner who spoke last (F1) and only the step's new insights (F2), the SumMem_MSC stand-in shows one
speaker's persona list (F3), a step retrieves from the past sessions (F4), Table 5's interval (I6),
LD-Agent's Table 1 retrieval and memory lines (F5), the project's choices on both sheets (F6), the
SUSPECT note (L4) and the persona prompt without the speaker's name (L5)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

import stages
from pipeline.reproduction import deviations, run_value
from pipeline.testing.fake_chat import FakeChat
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput, visible_memory
from stages.methods.creem import EVOLUTION_SUMMARY, Creem, CreemSettings
from stages.methods.creem.method import label_shares, replay
from stages.methods.ld_agent import LDAgent, LDAgentSettings
from stages.methods.ld_agent.method import memory_line
from test_creem import counting_builder

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
EPISODE = {"episode_id": "e1", "speakers": ["Ann", "Bob"], "dataset": "msc"}
CREEMS = ("creem", "creem_no_refine", "creem_no_preblend")


def config(name: str):
    return stages.load_config(CONFIGS / f"{name}.yaml")


def turns(n: int, session: int) -> list[dict]:
    return [{"speaker": "Ann" if i % 2 == 0 else "Bob", "text": f"line {session}.{i}", "turn_idx": i,
             "session_idx": session} for i in range(n)]


def build(sessions: dict, settings: CreemSettings) -> dict:
    llm = FakeChat(responder=counting_builder())
    return asyncio.run(Creem().build(MethodContext(settings=settings, llm=llm),
                                     EpisodeInput(episode=EPISODE, sessions=sessions)))


def probe_at(sessions: dict, s: int, t: int) -> ProbeInput:
    return ProbeInput(probe={"probe_id": f"nr:{s}:{t}", "kind": "next_response", "session_idx": s, "turn_idx": t,
                             "respondent": sessions[s][t]["speaker"], "request": sessions[s][t - 1]["text"]},
                      episode=EPISODE, history={k: v for k, v in sessions.items() if k < s},
                      current=sessions[s][:t])


def reply_memory_lines(settings: CreemSettings, sessions: dict, s: int, t: int) -> tuple[list[str], dict, object]:
    """The memory lines the reply to the probe at (s, t) is shown, the built logs, and the answer."""
    out = build(sessions, settings)
    seen = {name: visible_memory(rows, s, t, "log") for name, rows in out.items()}
    llm = FakeChat(responder=counting_builder("answer-time"))
    answer = asyncio.run(Creem().answer(MethodContext(settings=settings, llm=llm), probe_at(sessions, s, t), seen))
    user = llm.calls[-1]["messages"][1]["content"]
    block = user.split("Conversation:")[0].split(":\n", 1)[1]
    return [line[2:] for line in block.strip().splitlines()], out, answer


# ------------------------------------------------------------------------------- F1, F2, F4

def test_the_paper_config_runs_every_creem_variant_on_the_last_speakers_memory_with_its_new_insights():
    cfg = config("creem_msc")
    for name in CREEMS:
        settings = getattr(cfg.method, name)
        assert (settings.step_about, settings.reply_memory, settings.retrieve_from) == (
            "last_speaker", "added", "past_sessions"), name
    defaults = CreemSettings()
    assert (defaults.step_about, defaults.reply_memory, defaults.retrieve_from) == ("last_speaker", "added",
                                                                                   "past_sessions")


def test_the_reply_holds_exactly_the_steps_n_insights_about_the_last_speaker():
    sessions = {1: turns(4, 1), 2: turns(8, 2)}
    lines, out, answer = reply_memory_lines(CreemSettings(k=10), sessions, 2, 7)
    step = [r for r in out["evolution"] if (r["snapshot_session"], r["snapshot_turn"]) == (2, 6)]
    assert {r["speaker"] for r in step} == {"Ann"} and answer.details["memory_of"] == "Ann"  # Ann said turn 6
    assert lines == [r["text"] for r in step] and len(lines) == 2  # n = 2: the added insights only
    assert answer.used_ids == [r["memory_id"] for r in step]
    assert answer.details["retrieved"]  # it retrieved past memories, which the reply does not see
    # `kept_and_added`: the kept retrieved memories come before the new insights.
    lines, out, answer = reply_memory_lines(CreemSettings(k=10, reply_memory="kept_and_added"), sessions, 2, 7)
    kept = [m["text"] for m in replay(out["memories"], (2, 5))["Ann"]
            if m["memory_id"] in answer.details["retrieved"]]
    assert kept and lines == kept + [r["text"] for r in out["evolution"]
                                     if (r["snapshot_session"], r["snapshot_turn"]) == (2, 6)]


def test_a_step_retrieves_the_past_sessions_memories_only_unless_retrieve_from_all():
    sessions = {1: turns(4, 1), 2: turns(8, 2)}

    def sessions_retrieved(settings: CreemSettings) -> set[int]:
        out = build(sessions, settings)
        made = {r["memory_id"]: r["session_idx"] for r in out["memories"] if r["op"] == "add"}
        return {made[i] for r in out["evolution"] if r["session_idx"] == 2 for i in r["retrieved_ids"]}

    assert sessions_retrieved(CreemSettings(k=10)) == {1}  # Algorithm 1 line 4: M_[1,s-1]
    assert sessions_retrieved(CreemSettings(k=10, retrieve_from="all")) == {1, 2}


def test_the_creem_sheet_lists_reply_memory_retrieve_from_and_the_projects_choices():
    cfg = config("creem_msc")
    protocol = cfg.paper.protocol
    for name in CREEMS:
        assert protocol[f"method.{name}.reply_memory"].value == "added"
        assert "Sec. 2.3" in protocol[f"method.{name}.reply_memory"].source
        assert "kept_and_added" in protocol[f"method.{name}.reply_memory"].source
        setting = protocol[f"method.{name}.retrieve_from"]
        assert setting.value == "past_sessions" and setting.source.startswith("inferred:") and "line 4" in setting.source
        turns_row = protocol[f"method.{name}.first_session_turns"]
        assert turns_row.value == getattr(cfg.method, name).first_session_turns == 6
        assert turns_row.source.startswith("ours:")
    assert protocol["probes.agent_speaker"].value == cfg.probes.agent_speaker == 1
    assert protocol["probes.agent_speaker"].source.startswith("ours:")
    assert deviations(cfg) == []
    moved = stages.load_config(CONFIGS / "creem_msc.yaml", ["method.creem.reply_memory=kept_and_added"])
    assert [d.path for d in deviations(moved)] == ["method.creem.reply_memory"]


# ------------------------------------------------------------------------------- F3

def test_the_summem_stand_in_replies_from_the_partners_persona_list_and_is_rated_on_both():
    cfg = config("creem_msc")
    assert cfg.method.ld_agent.agent_personas is False and cfg.method.ld_agent.user_personas is True
    assert cfg.paper.protocol["method.ld_agent.agent_personas"].value is False
    assert "Table 6" in cfg.paper.protocol["method.ld_agent.agent_personas"].source
    sessions = {1: turns(2, 1), 2: turns(4, 2)}
    traits = [{"episode_id": "e1", "snapshot_session": 2, "snapshot_turn": t, "speaker": who, "session_idx": 2,
               "turn_idx": t, "trait": trait, "error": None, "raw": None}
              for t, who, trait in ((0, "Ann", "I keep bees."), (1, "Bob", "I fix clocks."))]
    llm = FakeChat(answers=["How are the bees?"])
    settings = cfg.method.ld_agent
    answer = asyncio.run(LDAgent().answer(MethodContext(settings=settings, llm=llm), probe_at(sessions, 2, 3),
                                          {"events": [], "personas": traits}))
    user = llm.calls[0]["messages"][1]["content"]
    assert "Memory of Ann:\n- I keep bees.\n" in user and "I fix clocks" not in user  # Bob answers Ann
    assert answer.details["agent_traits"] is None and answer.details["user_traits"] == 1
    view = LDAgent().memory_view(EpisodeInput(episode=EPISODE, sessions=sessions), {"personas": traits}, settings)
    assert view.splitlines() == ["[Ann] I keep bees.", "[Bob] I fix clocks."]  # Table 1 rates both speakers


# ------------------------------------------------------------------------------- I6

def test_evolution_summary_gives_episodes_and_an_episode_level_interval_beside_each_share():
    assert {"episodes", "items", "share_low", "share_high"} <= set(EVOLUTION_SUMMARY.names)
    evolution = [{"dataset": "msc", "episode_id": f"e{e}", "label": label}
                 for e, labels in enumerate((["New", "New", "Redundant"], ["New", "Updated"], ["Redundant", "New"],
                                             ["New", "New", "New", "Updated"]))
                 for label in labels] + [{"dataset": "msc", "episode_id": "e0", "label": "Blended"}]
    rows = {r["label"]: r for r in label_shares("creem", evolution)}
    new = rows["New"]
    assert (new["insights"], new["items"], new["episodes"]) == (7, 11, 4) and new["share"] == pytest.approx(7 / 11)
    assert new["share_low"] < new["share"] < new["share_high"]
    assert rows["Updated"]["episodes"] == 2 and rows["Updated"]["items"] == 11
    blended = rows["Blended"]
    assert blended["share"] is None and blended["share_low"] is None and blended["episodes"] == 1
    # The sheet reads the interval and the episodes from these columns.
    table = pa.Table.from_pylist(list(rows.values()), schema=EVOLUTION_SUMMARY)
    result = next(r for r in config("creem_msc").paper.results if r.name == "CREEM refine labels, MSC, New")
    value = run_value(table, result)
    assert value.value == pytest.approx(100 * 7 / 11) and value.low < value.value < value.high
    assert (value.n, value.episodes) == (11, 4)
    # One episode: no spread between episodes, no interval.
    one = {r["label"]: r for r in label_shares("creem", [r for r in evolution if r["episode_id"] == "e0"])}
    assert one["New"]["share_low"] is None and one["New"]["episodes"] == 1


# ------------------------------------------------------------------------------- F5, F6, L4, L5

def test_ldagent_table_1_is_compared_on_the_reference_codes_retrieval_with_eq_2_an_option():
    cfg = config("ldagent_msc")
    protocol = cfg.paper.protocol
    assert cfg.method.ld_agent.scoring == protocol["method.ld_agent.scoring"].value == "reference_code"
    source = protocol["method.ld_agent.scoring"].source
    assert "msc_gpt_eval.sh" in source and "Eq. 2" in source and "scoring: paper" in source
    assert LDAgentSettings().scoring == "paper"  # Eq. 2 stays the setting's default, an option here
    for path, start in (("method.ld_agent.gamma", "ours:"), ("method.ld_agent.turn_gap_s", "ours:"),
                        ("method.ld_agent.age_format", "reference code:")):
        assert protocol[path].source.startswith(start), path
    assert "No relevant memory" not in protocol["method.ld_agent.age_format"].source  # our wordings, described
    assert "(none noted yet)" in protocol["method.ld_agent.age_format"].source
    assert deviations(cfg) == []


def test_memory_lines_give_the_age_in_every_unit_as_the_reference_code_or_in_the_largest():
    age = 3 * 86400 + 2 * 3600 + 5 * 60 + 7
    assert memory_line(age, "They met.", "all_units") == "3 days 2 hours 5 minutes ago, They met.."
    assert memory_line(400 * 86400, "x", "all_units") == "1 years 1 months 5 days ago, x."
    assert memory_line(age, "They met.", "largest_unit") == "(3 days ago) They met."
    assert LDAgentSettings().age_format == "largest_unit"


def test_the_generator_prompt_carries_the_reference_codes_memory_line():
    from test_creem_ldagent_r2 import VocabNouns, event, ld_episode, ld_responder

    ep = ld_episode([[("Ann", "my dog loves the park"), ("Bob", "sure")]])
    probe = ProbeInput(probe={"probe_id": "nr:1:1", "kind": "next_response", "session_idx": 1, "turn_idx": 1,
                              "respondent": "Bob", "request": "my dog loves the park"},
                       episode=ep.episode, history={}, current=ep.sessions[1][:1])
    for fmt, line in (("all_units", "1 days ago, about dog and park."), ("largest_unit", "(1 day ago) about dog and park")):
        llm = FakeChat(responder=ld_responder)
        ctx = MethodContext(settings=LDAgentSettings(turn_gap_s=0.0, scoring="reference_code", age_format=fmt), llm=llm)
        asyncio.run(VocabNouns().answer(ctx, probe, {"events": [event("A", ["dog", "park"], 86400)], "personas": []}))
        assert line in llm.calls[-1]["messages"][1]["content"], fmt


def test_the_persona_extractor_is_sent_the_bare_sentence_without_its_speakers_name():
    from test_creem_ldagent_r2 import VocabNouns, ld_episode, ld_responder

    ep = ld_episode([[("Ann", "my dog"), ("Bob", "a dog too")]])
    llm = FakeChat(responder=ld_responder)
    asyncio.run(VocabNouns().build(MethodContext(settings=LDAgentSettings(events=False), llm=llm), ep))
    persona_calls = [c for c in llm.calls if "personal traits of" in c["messages"][-1]["content"]]
    assert len(persona_calls) == 2
    assert not any(name in m["content"] for c in persona_calls for m in c["messages"] for name in ("Ann", "Bob"))
    assert persona_calls[0]["messages"][-1]["content"].endswith("\nmy dog")
