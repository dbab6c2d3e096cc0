"""Round-2 review items of RSum (seed 002): its memory prompt's elements and 20-sentence memory (N4),
whose turns it predicts and the Session-2 Gold Memory rows (N9), and the precisions of its scorer (N1)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import stages
from pipeline.testing.fake_chat import FakeChat
from pipeline.reproduction import deviations
from stages.methods.base import EpisodeInput, MethodContext
from stages.methods.rsum import RSum, RSumSettings, update_messages
from stages.probes import next_response_probes

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "rsum_msc.yaml"
SESSION = [{"speaker": "Speaker 1", "text": "I just adopted a puppy.", "turn_idx": 0, "session_idx": 1},
           {"speaker": "Speaker 2", "text": "Lovely, I grew up with dogs.", "turn_idx": 1, "session_idx": 1}]


def prompt(**settings) -> str:
    return "\n".join(m["content"] for m in update_messages("", SESSION, 1, RSumSettings(**settings)))


def test_the_memory_prompt_keeps_both_speakers_personality_in_at_most_20_sentences():
    text = prompt()
    assert RSumSettings().max_sentences == 20 and "in 20 sentences at most" in text
    assert "a few" not in text
    assert "personality of each of them" in text  # the key personality information of both speakers
    # RSum's update steps: take the traits the session reveals, weigh relevance and importance, stay coherent.
    steps = ["1. Go through the latest session and pick out the personality traits",
             "2. Weigh how relevant and how important", "3. Fold it into the memory so far"]
    assert all(s in text for s in steps) and [text.index(s) for s in steps] == sorted(text.index(s) for s in steps)
    assert "one coherent account" in text and "refer to it" in text  # a reference for replying in keeping
    assert "in 5 sentences at most" in prompt(max_sentences=5)
    assert "sentences at most" not in prompt(max_sentences=None)


def test_every_memory_update_of_a_build_asks_for_the_sentence_limit():
    llm = FakeChat(answers=["Speaker 1 has a puppy.", "Speaker 2 grew up with dogs."])
    episode = EpisodeInput(episode={"episode_id": "e1", "speakers": ["Speaker 1", "Speaker 2"]},
                           sessions={1: SESSION, 2: [{**t, "session_idx": 2} for t in SESSION]})
    asyncio.run(RSum().build(MethodContext(settings=RSumSettings(max_sentences=12), llm=llm), episode))
    assert len(llm.calls) == 2 and all("in 12 sentences at most" in c["messages"][-1]["content"] for c in llm.calls)


def test_the_rsum_sheet_holds_the_sentence_limit_and_speaker_2_as_the_chatbot():
    cfg = stages.load_config(CONFIG)
    protocol = cfg.paper.protocol
    assert cfg.method.rsum.max_sentences == protocol["method.rsum.max_sentences"].value == 20
    assert "20 sentences" in protocol["method.rsum.max_sentences"].source
    assert cfg.probes.agent_speaker == protocol["probes.agent_speaker"].value == 1
    assert "read_msc_data" in protocol["probes.agent_speaker"].source
    assert deviations(cfg) == []
    # Speaker 2 (index 1) answers: only the odd turns of a session are predicted.
    episode = {"episode_id": "e1", "speakers": ["Speaker 1", "Speaker 2"]}
    session = [{"speaker": f"Speaker {1 + i % 2}", "text": f"t{i}", "turn_idx": i} for i in range(6)]
    probes = next_response_probes(episode, {2: session}, cfg.probes)
    assert [p["turn_idx"] for p in probes] == [1, 3, 5] and {p["respondent"] for p in probes} == {"Speaker 2"}


def test_the_session_2_gold_memory_rows_say_the_papers_gold_memory_was_empty_there():
    results = stages.load_config(CONFIG).paper.results
    gold = {r.name.rsplit(", ", 1)[1]: r for r in results if r.name.startswith("Gold Memory, Session 2,")}
    part = {r.name.rsplit(", ", 1)[1]: r for r in results if r.name.startswith("Part Context, Session 2,")}
    assert len(gold) == 5 and {k: r.paper for k, r in gold.items()} == {k: r.paper for k, r in part.items()}
    assert all("empty" in r.source and "Part Context" in r.source for r in gold.values())
    later = [r for r in results if r.name.startswith("Gold Memory, Session 3,")]
    assert later and not any("empty" in r.source for r in later)


def test_bleu_rows_use_rsums_precisions():  # N1, verified: the sheet reads evaluate's clipped precisions
    results = stages.load_config(CONFIG).paper.results
    bleu = [r for r in results if r.table == "metric_summary" and "BLEU" in r.name]
    assert len(bleu) == 32 and {r.column for r in bleu} == {"evaluate_precision1", "evaluate_precision2"}
