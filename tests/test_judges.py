"""The judge stages on hand-built episodes with a scripted judge: what each judge is shown (the past,
the whole current session, the rated speaker's memory, the dialogue), what each row records, CREEM's
seeded positions, the Golden Responses opponent, and the report's aggregation of the verdicts and
ratings against hand-computed tables."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import polars as pl
import pytest

import stages
from pipeline.testing.fake_chat import FakeChat
from pipeline.failures import row_or_failure
from pipeline.llm.types import LLMError
from pipeline.retrieval import count_tokens
from pipeline.engine.stage import StageContext
from stages.judging import judge_memory, judge_pairwise, pairwise
from stages.judging.judge_memory import JudgeMemoryStage, dialogue_within, speaker_lines
from stages.judging.judge_pairwise import JudgePairwiseStage
from stages.judging.pairwise import past_within, reference_shown_first
from stages.methods.base import MethodContext, ProbeInput
from stages.methods.baselines.golden import Golden, NoGold
from stages.metrics.significance import bootstrap_mean_interval, cluster_bootstrap_interval, sign_test, wilson_interval
from stages.report.tables import memory_summary, pairwise_summary

EPISODE = {"episode_id": "e1", "dataset": "msc", "speakers": ["Ann", "Bob"], "notes": None}
PAST = {1: "I adopted a dog called Rex", 2: "Rex learned to sit", 3: "We moved to Lyon"}


def turns() -> list[dict]:
    """Sessions 1-3 with one line each by Ann and Bob; session 4 has 14 turns (more than 10)."""
    out = []
    for s, line in PAST.items():
        out += [{"episode_id": "e1", "session_idx": s, "turn_idx": 0, "speaker": "Ann", "text": line},
                {"episode_id": "e1", "session_idx": s, "turn_idx": 1, "speaker": "Bob", "text": f"reply {s}"}]
    out += [{"episode_id": "e1", "session_idx": 4, "turn_idx": i, "speaker": ("Ann", "Bob")[i % 2],
             "text": f"now {i}"} for i in range(14)]
    return out


PROBE = {"episode_id": "e1", "probe_id": "nr:4:13", "kind": "next_response", "session_idx": 4, "turn_idx": 13,
         "respondent": "Bob", "request": "now 12", "gold": "now 13", "context": None}


def responses(method: str, text: str) -> list[dict]:
    return [{"probe_id": PROBE["probe_id"], "response": text, "error": None}]


def run_pairwise(llm: FakeChat, *sets: str, episode: dict = EPISODE) -> list[dict]:
    cfg = stages.load_config(None, ["methods=[secom,full_history]", *sets])
    llm.cfg = SimpleNamespace(model="fake-judge")  # type: ignore[attr-defined]
    stage = JudgePairwiseStage(("secom", "full_history"))
    ctx = StageContext(cfg=cfg, stage=stage, out_dir=None, clients={"judge": llm})  # type: ignore[arg-type]
    inputs = {"ingest.episodes": [episode], "ingest.turns": turns(), "probes.probes": [PROBE],
              "respond_secom.responses": responses("secom", "REF"),
              "respond_full_history.responses": responses("full_history", "OTHER")}
    return asyncio.run(stage.process_episode(ctx, "e1", inputs))["pairwise_judgments"]


def prompts(llm: FakeChat) -> list[str]:
    return [c["messages"][1]["content"] for c in llm.calls]


# --- 1. head-to-head judges see what they judge ------------------------------------------------


def test_the_both_orders_judge_sees_the_earlier_sessions_by_default_and_each_row_says_so():
    llm = FakeChat(responder=lambda m, s: {"better": "A", "reason": "r"})
    rows = run_pairwise(llm)
    assert len(rows) == 3 * 2 and {r["protocol"] for r in rows} == {"both_orders"}
    for text in prompts(llm):
        assert "Earlier sessions:\n[Session 1]\nAnn: I adopted a dog called Rex" in text
        assert "[Session 3]\nAnn: We moved to Lyon" in text
        # both_orders keeps the last 10 turns of the current session: turns 3..12
        assert "Ann: now 2" not in text and "Bob: now 3" in text and "Ann: now 12" in text
    assert {(r["past_shown"], r["past_summarised"], r["past_truncated"], r["current_shown"]) for r in rows} == {
        (3, 0, False, 10)}


def test_show_past_off_leaves_the_past_out_and_the_rows_null():
    llm = FakeChat(responder=lambda m, s: {"better": "tie", "reason": "r"})
    rows = run_pairwise(llm, "judge_pairwise.show_past=false")
    assert all("Earlier sessions" not in text for text in prompts(llm))
    assert {(r["past_shown"], r["past_truncated"]) for r in rows} == {(None, None)}


def test_over_budget_the_oldest_sessions_go_first_and_the_cut_is_recorded():
    block = {s: f"[Session {s}]\nAnn: {line}\nBob: reply {s}" for s, line in PAST.items()}
    sessions = {s: [t for t in turns() if t["session_idx"] == s] for s in (1, 2, 3, 4)}
    budget = count_tokens(block[2]) + count_tokens(block[3])  # room for exactly the two newest sessions
    past = past_within(sessions, 4, budget)
    assert past.text == f"{block[2]}\n\n{block[3]}" and (past.shown, past.summarised, past.truncated) == (2, 0, True)
    # A dropped session comes back as the corpus's summary when there is one and it fits.
    wide = budget + count_tokens("[Session 1, summary]\nAnn got a dog.")  # and for session 1's summary
    past = past_within(sessions, 4, wide, {1: "Ann got a dog.", 2: "Rex sits."})
    assert past.text.startswith("[Session 1, summary]\nAnn got a dog.\n\n[Session 2]")
    assert (past.shown, past.summarised, past.truncated) == (2, 1, True)
    # No budget: everything, nothing cut; the first session has no past at all.
    assert past_within(sessions, 4, None).shown == 3 and not past_within(sessions, 4, None).truncated
    assert past_within(sessions, 1, 10).text == "" and past_within(sessions, 1, 10).shown == 0


def test_the_stage_records_a_truncated_past_and_uses_the_corpus_summaries():
    episode = {**EPISODE, "notes": [{"session_idx": 1, "kind": "summary", "speaker": None, "text": "Ann got a dog."}]}
    budget = count_tokens("[Session 3]\nAnn: We moved to Lyon\nBob: reply 3") + count_tokens(
        "[Session 1, summary]\nAnn got a dog.")
    llm = FakeChat(responder=lambda m, s: {"better": "B", "reason": "r"})
    rows = run_pairwise(llm, f"judge_pairwise.past_session_tokens={budget}", episode=episode)
    assert {(r["past_shown"], r["past_summarised"], r["past_truncated"]) for r in rows} == {(1, 1, True)}
    assert all("[Session 1, summary]\nAnn got a dog.\n\n[Session 3]" in t and "Rex" not in t for t in prompts(llm))


# --- 2. CREEM's protocol exactly -----------------------------------------------------------------


def test_creem_draws_the_reference_position_per_sample_from_a_seeded_rng_and_shows_the_whole_session():
    llm = FakeChat(responder=lambda m, s: {"better": "A", "reason": "r"})
    rows = run_pairwise(llm, "judge_pairwise.protocol=creem")
    assert len(rows) == 2 * 19 and {r["criterion"] for r in rows} == {"consistency", "memorability"}
    for r in rows:
        assert r["reference_first"] == reference_shown_first(0, "e1", PROBE["probe_id"], "full_history",
                                                             r["criterion"], r["sample"])
        # "A" every time: the verdict follows the drawn position back to the method.
        assert r["preferred"] == ("reference" if r["reference_first"] else "other")
    assert {r["reference_first"] for r in rows} == {True, False}
    assert {r["current_shown"] for r in rows} == {13}
    for text in prompts(llm):
        assert "Ann: now 0" in text and "Ann: now 12" in text  # the whole current session (B.1)
        assert "Earlier sessions:\n[Session 1]" in text and '"tie"' not in text
    # Same config, same positions; another seed draws others.
    again = run_pairwise(FakeChat(responder=lambda m, s: {"better": "B"}), "judge_pairwise.protocol=creem")
    assert [r["reference_first"] for r in again] == [r["reference_first"] for r in rows]
    other_seed = run_pairwise(FakeChat(responder=lambda m, s: {"better": "B"}), "judge_pairwise.protocol=creem",
                              "judge_pairwise.seed=1")
    assert [r["reference_first"] for r in other_seed] != [r["reference_first"] for r in rows]


def test_creem_offers_no_tie_and_carries_b1s_definitions_and_instructions():
    llm = FakeChat([{"better": "tie", "reason": "r"}, {"better": "B", "reason": "r"}])
    [out] = asyncio.run(pairwise.judge_pair(llm, "consistency", pairwise.PairShown("Ann: hi", "Bob", "R", "O", past=""),
                                            pairwise.PairProtocol("creem")))
    assert out[0] == "other" and llm.calls[0]["attempts"] == 2  # a tie is not an answer: re-asked
    assert set(llm.calls[0]["schema"].model_fields["better"].annotation.__args__) == {"A", "B"}
    system, user = (m["content"] for m in llm.calls[0]["messages"][:2])
    for element in ("conversation between two people", "two candidate replies for the next turn",
                    "pick the better of the two replies on one criterion", "with care before you start",
                    "return to it as often as you need"):
        assert element in system
    for element in ("contradict nothing", "fit smoothly with what the two people already talked about",
                    "own character", "where things currently stand"):
        assert element in pairwise.CREEM_CRITERIA["consistency"] and element in user
    for element in ("bring back past events correctly", "holding on to what was shared in the earlier sessions",
                    "active use of what it remembers from the past dialogue"):
        assert element in pairwise.CREEM_CRITERIA["memorability"]
    assert "Earlier sessions:\n(none: this is the first session)" in user
    assert "given both the earlier sessions and the current session" in user and "brief explanation" in user


def test_per_call_all_gives_a_verdict_per_criterion_in_one_call_with_the_same_rows():
    per_criterion = run_pairwise(FakeChat(responder=lambda m, s: {"better": "A", "reason": "r"}))
    # [A, B, tie] for specificity, memorability, consistency, whichever order the pair is shown in.
    every = FakeChat(responder=lambda m, s: {"better": ["A", "B", "tie"], "reason": "why"})
    rows = run_pairwise(every, "judge_pairwise.per_call=all")
    assert len(every.calls) == 2 and len(rows) == len(per_criterion) == 6  # one call per order
    key = ("probe_id", "criterion", "reference", "other", "reference_first", "sample", "past_shown", "current_shown")
    assert [tuple(r[k] for k in key) for r in rows] == [tuple(r[k] for k in key) for r in per_criterion]
    verdicts = {(r["criterion"], r["reference_first"]): r["preferred"] for r in rows}
    assert verdicts == {("specificity", True): "reference", ("specificity", False): "other",
                        ("memorability", True): "other", ("memorability", False): "reference",
                        ("consistency", True): "tie", ("consistency", False): "tie"}
    assert all(r["reason"] == "why" and r["error"] is None and r["judge_model"] == "fake" for r in rows)
    call = every.calls[0]
    assert call["params"]["max_tokens"] == 160 * 3  # the limit holds per criterion
    system, user = (m["content"] for m in call["messages"])
    assert "Judge each criterion you are given on its own" in system
    assert "Earlier sessions:\n[Session 1]\nAnn: I adopted a dog called Rex" in user
    for i, c in enumerate(("specificity", "memorability", "consistency"), 1):
        assert f"{i}. {pairwise.CRITERIA[c]}" in user
    assert user.endswith("one per criterion in the order above (specificity, memorability, consistency).")
    # Exactly one verdict per criterion, or the call fails and so does each of its rows.
    for bad in ({"better": ["A", "B"]}, {"better": ["A", "B", "C"]}, "not json"):
        failed = run_pairwise(FakeChat(responder=lambda m, s, bad=bad: bad), "judge_pairwise.per_call=all")
        assert len(failed) == 6 and all(r["preferred"] is None and r["error"] for r in failed)
    with pytest.raises(Exception, match="per_call"):
        stages.load_config(None, ["judge_pairwise.protocol=creem", "judge_pairwise.per_call=all"])


# --- 3. memory-quality G-Eval as CREEM B.2 -------------------------------------------------------


def test_only_the_rated_speakers_memory_lines_are_kept():
    view = "[Ann] has a dog named Rex\n[Bob] works nights\n\n[session 2] they met in Lyon\nAnn: hi\n[Anna] x"
    assert speaker_lines(view, "Ann", ["Ann", "Bob"]) == ["[Ann] has a dog named Rex", "[session 2] they met in Lyon",
                                                           "Ann: hi", "[Anna] x"]
    assert speaker_lines(view, "Bob", ["Ann", "Bob"]) == ["[Bob] works nights", "[session 2] they met in Lyon",
                                                           "Ann: hi", "[Anna] x"]


def test_the_dialogue_keeps_the_newest_sessions_within_the_budget():
    sessions = {s: [t for t in turns() if t["session_idx"] == s] for s in (1, 2, 3)}
    block3 = "[Session 3]\nAnn: We moved to Lyon\nBob: reply 3"
    d = dialogue_within(sessions, count_tokens(block3))
    assert (d.text, d.sessions_shown, d.truncated) == (block3, 1, True)
    d = dialogue_within(sessions, count_tokens("Bob: reply 3"))  # not even the last session: its last turns
    assert (d.text, d.sessions_shown, d.truncated) == ("[Session 3, its last turns]\nBob: reply 3", 0, True)
    assert dialogue_within(sessions, None).sessions_shown == 3 and not dialogue_within(sessions, None).truncated


def run_memory(llm: FakeChat, view: str, *sets: str) -> list[dict]:
    cfg = stages.load_config(None, ["methods=[creem]", "judge_memory.samples=1", "judge_memory.episodes=null",
                                    "judge_memory.criteria=[relevance]", *sets])
    llm.cfg = SimpleNamespace(model="fake-judge")  # type: ignore[attr-defined]
    stage = JudgeMemoryStage(("creem",))
    ctx = StageContext(cfg=cfg, stage=stage, out_dir=None, clients={"judge": llm})  # type: ignore[arg-type]
    inputs = {"ingest.episodes": [EPISODE], "ingest.turns": [t for t in turns() if t["session_idx"] < 4],
              "memory_creem.memory_view": [{"episode_id": "e1", "method": "creem", "memory": view}]}
    return asyncio.run(stage.process_episode(ctx, "e1", inputs))["memory_judgments"]


def test_the_memory_judge_sees_the_dialogue_and_only_that_speakers_memory_cut_from_the_oldest_line():
    view = "[Ann] old fact\n[Bob] nights\n[Ann] newest fact"
    llm = FakeChat(responder=lambda m, s: {"score": 4})
    rows = run_memory(llm, view, f"judge_memory.max_memory_tokens={count_tokens('[Ann] newest fact')}")
    by_speaker = {r["speaker"]: r for r in rows}
    assert by_speaker["Ann"]["score"] == 4
    assert (by_speaker["Ann"]["memory_lines"], by_speaker["Ann"]["memory_lines_shown"],
            by_speaker["Ann"]["memory_truncated"]) == (2, 1, True)
    assert (by_speaker["Bob"]["memory_lines"], by_speaker["Bob"]["memory_truncated"]) == (1, False)
    assert {(r["dialogue_sessions_shown"], r["dialogue_truncated"]) for r in rows} == {(3, False)}
    ann = next(t for t in prompts(llm) if "Person: Ann" in t)
    assert "Dialogue:\n[Session 1]\nAnn: I adopted a dog called Rex" in ann
    assert "[Ann] newest fact" in ann and "old fact" not in ann and "nights" not in ann
    assert "closely tied to Ann, the participant of this conversation" in ann and "Evaluation steps:\n1. " in ann


def test_per_call_all_rates_every_criterion_in_one_call_with_the_same_rows():
    view = "[Ann] has a dog named Rex\n[Bob] works nights"
    criteria = ["integration", "relevance", "diversity"]
    sets = ["judge_memory.criteria=[integration,relevance,diversity]", "judge_memory.samples=2"]
    one = FakeChat(responder=lambda m, s: {"score": 4})
    per_criterion = run_memory(one, view, *sets)
    every = FakeChat(responder=lambda m, s: {"scores": [2, 5, 3]})
    rows = run_memory(every, view, *sets, "judge_memory.per_call=all")
    assert len(one.calls) == 2 * 3 * 2 and len(every.calls) == 2 * 2  # speakers x samples
    key = ("method", "speaker", "criterion", "group", "sample", "memory_lines", "dialogue_sessions_shown")
    assert [tuple(r[k] for k in key) for r in rows] == [tuple(r[k] for k in key) for r in per_criterion]
    assert {(r["criterion"], r["score"]) for r in rows} == {("integration", 2), ("relevance", 5), ("diversity", 3)}
    assert all(r["error"] is None and r["judge_model"] == "fake" for r in rows)
    call = every.calls[0]
    assert call["params"]["max_tokens"] == 24 * 3
    system, user = (m["content"] for m in call["messages"])
    assert "rate the memory about that person on it" in system
    # The dialogue and the numbered criteria (about "the person") first, the same for every call; then the memory.
    prefix = user.split("The person is ")[0]
    assert {c["messages"][1]["content"].split("The person is ")[0] for c in every.calls} == {prefix}
    assert prefix.startswith("Dialogue:\n[Session 1]\nAnn: I adopted a dog called Rex") and "Ann" not in prefix.split(
        "The criteria")[1]
    assert all(f"{i}. Criterion. {judge_memory.memory_quality.CRITERIA[c][1].format(speaker='the person')}" in prefix
               for i, c in enumerate(criteria, 1)) and prefix.count("Evaluation steps:\n1. ") == 3
    assert user.index("[Ann] has a dog named Rex") > user.index("The person is Ann.")
    assert user.endswith("3 scores from 1 to 5, one per criterion in the order above (integration, relevance, diversity).")
    # Exactly one 1-5 score per criterion, or the call fails and so does each of its rows.
    first = FakeChat(responder=lambda m, s: {"scores": [2, 5, 3]})
    only_ann = run_memory(first, view, *sets, "judge_memory.per_call=all", "judge_memory.max_speakers=1")
    assert len(first.calls) == 2 and {r["speaker"] for r in only_ann} == {"Ann"} and len(only_ann) == 6
    for bad in ({"scores": [2, 5]}, {"scores": [2, 5, 6]}, "not json"):
        failed = run_memory(FakeChat(responder=lambda m, s, bad=bad: bad), view, *sets, "judge_memory.per_call=all")
        assert len(failed) == 12 and all(r["score"] is None and r["error"] for r in failed)


def test_every_paper_config_rates_memory_one_criterion_per_prompt_as_b2():
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))
    per_call = {p.stem: stages.load_config(p).judge_memory.per_call for p in configs}
    assert per_call.pop("default") == "all" and set(per_call.values()) == {"criterion"}


def test_memory_criteria_carry_b2s_elements_about_the_speaker_and_each_has_its_own_steps():
    from stages.judging import memory_quality as mq

    elements = {
        "integration": ["links what was learned about {speaker}", "across the different sessions",
                        "how details about {speaker} changed over time", "one cohesive account spanning the sessions"],
        "consistency": ["contradict or conflict", "about {speaker}", "coherent and free of contradictions",
                        "across the whole conversation"],
        "sophistication": ["advanced", "beyond one-dimensional information about {speaker}",
                           "taken directly from the conversation"],
        "conciseness": ["well organised", "needless repetition", "extraneous information"],
        "relevance": ["closely tied to {speaker}", "contributes meaningfully to the conversation as it goes on"],
        "concreteness": ["substantial, specific information about {speaker}", "how detailed and precise"],
        "diversity": ["varied information about {speaker}"],
    }
    for criterion, parts in elements.items():
        assert all(p in mq.CRITERIA[criterion][1] for p in parts), criterion
        assert 3 <= len(mq.STEPS[criterion]) <= 4
    assert len({tuple(v) for v in mq.STEPS.values()}) == 7


# --- 10. Golden Responses ----------------------------------------------------------------------


def test_golden_answers_with_the_real_next_turn_without_calling_the_llm():
    llm = FakeChat([])
    probe = ProbeInput(probe=PROBE, episode=EPISODE, history={}, current=[])
    answer = asyncio.run(Golden().answer(MethodContext(settings=Golden.Settings(), llm=llm), probe, {}))
    assert answer.text == "now 13" and answer.model == "gold" and llm.calls == []


def test_a_probe_without_gold_becomes_a_failed_row_that_says_why():
    probe = ProbeInput(probe={**PROBE, "gold": None}, episode=EPISODE, history={}, current=[])

    async def answered() -> dict:
        ctx = MethodContext(settings=Golden.Settings(), llm=FakeChat([]))
        return {"response": (await Golden().answer(ctx, probe, {})).text}

    assert issubclass(NoGold, LLMError)
    row = asyncio.run(row_or_failure({"probe_id": PROBE["probe_id"], "response": None}, answered()))
    assert row["response"] is None and "has no gold response" in row["error"]
    assert "golden" in stages.methods.METHODS


# --- 9. the report's aggregation, by hand -------------------------------------------------------


def judgment(dataset: str, probe: str, first: bool, preferred: str | None, *, session: int = 3, sample: int = 0,
             protocol: str = "both_orders", error: str | None = None, truncated: bool = False) -> dict:
    return {"dataset": dataset, "episode_id": "e", "probe_id": probe, "session_idx": session,
            "criterion": "memorability", "reference": "theanine", "other": "rsum", "protocol": protocol,
            "reference_first": first, "sample": sample, "preferred": preferred, "reason": None, "past_shown": 2,
            "past_summarised": 0, "past_truncated": truncated, "current_shown": 10, "judge_model": "j",
            "prompt_fingerprint": "f", "error": error, "raw": None}


def test_pairwise_summary_matches_a_hand_computed_win_tie_loss_table():
    orders = {  # (dataset, probe, session): (verdict reference first, verdict reference second)
        ("msc", "p1", 3): ("reference", "reference"),  # win
        ("msc", "p2", 3): ("reference", "other"),  # flips with the order: tie
        ("msc", "p3", 4): ("reference", "tie"),  # win
        ("msc", "p4", 4): ("other", "other"),  # loss
        ("cc", "q1", 3): ("reference", "reference"),  # win
        ("cc", "q2", 3): ("other", "tie"),  # loss
    }
    rows = [judgment(d, p, first, v, session=s, truncated=p == "p1")
            for (d, p, s), pair in orders.items() for first, v in zip((True, False), pair)]
    rows += [judgment("msc", "p5", True, "reference", session=3),  # second order failed: incomplete
             judgment("msc", "p5", False, None, session=3, error="timeout")]
    out = pairwise_summary(pl.DataFrame(rows))
    table = {(r["dataset"], r["session_idx"]): r for r in out.to_dicts()}
    # dataset: (pairs, wins, ties, losses, incomplete)
    expected = {("msc", None): (4, 2, 1, 1, 1), ("msc", 3): (2, 1, 1, 0, 1), ("msc", 4): (2, 1, 0, 1, 0),
                ("cc", None): (2, 1, 0, 1, 0), ("cc", 3): (2, 1, 0, 1, 0),
                ("all", None): (6, 3, 1, 2, 1), ("all", 3): (4, 2, 1, 1, 1), ("all", 4): (2, 1, 0, 1, 0)}
    assert set(table) == set(expected)
    for key, (pairs, wins, ties, losses, incomplete) in expected.items():
        r = table[key]
        assert (r["pairs"], r["wins"], r["ties"], r["losses"], r["incomplete"]) == (pairs, wins, ties, losses,
                                                                                   incomplete), key
        assert r["win_rate"] == pytest.approx(wins / pairs) and r["win_share"] == pytest.approx(wins / (wins + losses))
        # Every dataset's pairs come from its episode "e": no cluster interval within one dataset, and the
        # Wilson one over pairs beside it; the pooled rows hold msc's and cc's episodes.
        assert (r["win_share_iid_low"], r["win_share_iid_high"]) == pytest.approx(wilson_interval(wins, wins + losses))
        assert r["sign_p"] == pytest.approx(sign_test(wins, losses))
        if r["episodes"] == 1:
            assert (r["win_share_low"], r["win_share_high"]) == (None, None)
            assert r["p_value"] == 1.0  # one episode: its wins and losses swapped together show nothing
        else:
            assert r["win_share_low"] <= r["win_share"] <= r["win_share_high"]
        assert r["past_shown"] is True
    assert {key: table[key]["episodes"] for key in expected} == {
        ("msc", None): 1, ("msc", 3): 1, ("msc", 4): 1, ("cc", None): 1, ("cc", 3): 1,
        ("all", None): 2, ("all", 3): 2, ("all", 4): 1}
    assert table[("all", None)]["win_share"] == pytest.approx(3 / 5) and table[("msc", None)]["win_rate"] == 0.5
    assert table[("msc", None)]["past_truncated"] == 1 and table[("cc", None)]["past_truncated"] == 0
    assert out["dataset"].to_list()[-3:] == ["all"] * 3  # the pooled rows come last


def test_creem_pairs_take_the_majority_of_every_sample_whatever_the_order():
    # 5 samples of one pair with the order drawn per sample: reference, reference, other | other, reference
    votes = [(True, "reference"), (False, "reference"), (True, "other"), (False, "other"), (True, "reference")]
    rows = [judgment("msc", "p1", first, v, sample=i, protocol="creem") for i, (first, v) in enumerate(votes)]
    rows += [judgment("msc", "p2", i % 2 == 0, "other", sample=i, protocol="creem") for i in range(5)]
    out = pairwise_summary(pl.DataFrame(rows)).filter(pl.col("session_idx").is_null()).to_dicts()
    assert len(out) == 1
    r = out[0]
    assert (r["pairs"], r["wins"], r["ties"], r["losses"], r["incomplete"]) == (2, 1, 0, 1, 0)
    assert r["win_share"] == 0.5 and r["protocol"] == "creem"


def test_memory_summary_averages_samples_then_ratings_with_an_interval_over_episodes():
    def rating(episode: str, speaker: str, sample: int, score: int | None, cut: bool = False) -> dict:
        return {"episode_id": episode, "dataset": "msc", "method": "creem", "speaker": speaker,
                "criterion": "diversity", "group": "fundamental", "sample": sample, "score": score,
                "memory_lines": 3, "memory_lines_shown": 2 if cut else 3, "memory_truncated": cut,
                "dialogue_sessions_shown": 5, "dialogue_truncated": False, "judge_model": "j",
                "prompt_fingerprint": "f", "error": None if score is not None else "bad", "raw": None}

    rows = [rating("e1", "Ann", 0, 4), rating("e1", "Ann", 1, 5, cut=True),  # rating 4.5
            rating("e1", "Bob", 0, 2), rating("e1", "Bob", 1, None),  # rating 2 (the failed sample is left out)
            rating("e2", "Ann", 0, 3), rating("e2", "Ann", 1, 3)]  # rating 3
    out = memory_summary(pl.DataFrame(rows)).to_dicts()
    assert len(out) == 1
    r = out[0]
    assert (r["ratings"], r["episodes"]) == (3, 2) and r["score"] == pytest.approx((4.5 + 2 + 3) / 3)
    # e1's two ratings are resampled together: the resamples are 3.25 (e1), 3 (e2) or a mix of both.
    assert (r["score_low"], r["score_high"]) == cluster_bootstrap_interval([4.5, 2.0, 3.0], ["e1", "e1", "e2"])
    assert 3.0 <= r["score_low"] <= r["score"] <= r["score_high"] <= 3.25
    assert (r["score_iid_low"], r["score_iid_high"]) == pytest.approx(bootstrap_mean_interval([2.0, 3.0, 4.5]))
    assert (r["memory_truncated"], r["dialogue_truncated"]) == (1, 0)


def test_the_settings_default_to_showing_the_past_under_every_protocol():
    cfg = stages.load_config(None, [])
    assert cfg.judge_pairwise.show_past is True and cfg.judge_pairwise.past_session_tokens == 6000
    assert judge_pairwise.PROTOCOL_CONTEXT_TURNS == {"both_orders": 10, "creem": None}
    assert judge_memory.JudgeMemorySettings().max_dialogue_tokens == 6000
