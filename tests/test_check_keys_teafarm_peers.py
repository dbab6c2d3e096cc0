"""The keys the round-3 review of TeaFarm and the peers names (audits/round3/teafarm_peers.md), and the choices
of ours in the same configs, each on its paper sheet with a source of the right kind, and each listed by
`mempipe check` with that source once a run differs from the sheet.

Most of these keys equal the sheet in the shipped config, so `mempipe check` prints nothing for them; for
those the test asserts the sheet holds the key with its source and then runs `check` with every key set
away from the sheet in one call, to see each listed as `path: run (paper: value, source)`. A key the
shipped config already differs on (LongMemEval's release) is asserted in the plain `check`'s output."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from pipeline.reproduction import source_kind
from stages.cli import main
from sheets import sheet_config
from stages.probes import teafarm_probes
from stages.report import pairwise as pairwise_report

ROOT = Path(__file__).resolve().parent.parent

# config -> key -> (the kind of source the sheet gives it, a value away from the sheet for `--set`);
# the review's item ids beside the keys it names; the others are the "every choice of ours".
KEYS: dict[str, dict[str, tuple[str, str | None]]] = {
    "teafarm_msc_cc": {
        "teabag.leak_check": ("inferred", "true"),  # N3
        "teabag.counterfactual_check": ("inferred", "true"),
        "method.memochat.preset": ("paper", "project"),  # F5, P9
        "method.memochat.temperature": ("paper", "0.2"),  # F5
        "method.comedy.temperature": ("paper", "0.2"),  # N5
        "method.comedy.memory_words": ("ours", "100"),  # P6
        "method.rsum.response_style": ("paper", "short"),
        "method.theanine.origin_tokens": ("ours", "400"),
        "method.theanine.max_memories": ("ours", "8"),
        "method.theanine.timelines_per": ("paper", "component"),
        "method.theanine.draw_order": ("ours", "recency"),
        "llm.max_tokens": ("ours", "1024"),
        "roles.judge.model": ("ours", "gpt-4o"),
        "roles.judge.temperature": ("ours", "0.3"),
        "judge_answers.max_tokens": ("ours", "300"),
        "judge_answers.explain": ("ours", "false"),
        "teabag.max_memories": ("ours", "5"),
        "teabag.session_turns": ("ours", "12"),
        "teabag.style_turns": ("ours", "4"),
        "teabag.max_tokens": ("ours", "1024"),
        "teabag.sessions": ("paper", "4"),  # N6: sessions 1-5 the past
        "teabag.questions_per_episode": ("paper", "4"),
        "roles.teabag.model": ("paper", "gpt-4o"),
        "roles.teabag.temperature": ("paper", "0.0"),
        "probes.next_response": ("paper", "true"),
        "corpus.episode_ids": ("ours", "[a, b]"),
    },
    "longmemeval": {
        "judge_answers.correctness": ("paper", "[strict]"),  # F9, P3, P4
        "judge_answers.max_tokens": ("reference code", "20"),
        "roles.judge.model": ("paper", "gpt-4o-mini"),
        "roles.judge.temperature": ("reference code", "0.5"),
        "roles.generator.temperature": ("paper", "0.5"),
        "method.full_history.qa_prompt": ("paper", "ours"),  # P1
        "method.full_history.token_budget": ("reference code", "100000"),  # P14
        "method.full_history.keep": ("reference code", "newest"),  # P14
        "method.full_history.budget_tokenizer": ("reference code", "cl100k"),  # P14
        "method.turn.key_side": ("reference code", "both"),  # P12
        "method.turn.use_compression": ("paper", "true"),
        "method.turn.retriever": ("ours", "dense"),
        "method.turn.top_k": ("ours", "5"),
        "method.session.retriever": ("ours", "dense"),
        "method.session.top_k": ("ours", "3"),
        "probes.max_qa_per_episode": ("paper", "1"),
    },
    "locomo_memory_systems": {
        "method.full_history.qa_prompt": ("reference code", "ours"),  # F1
        "method.turn.qa_prompt": ("reference code", "ours"),  # F1
        "method.mem0_style.show_work": ("paper", "false"),  # F2, P11
        "method.mem0.show_work": ("paper", "false"),  # F2
        "method.mem0_style.extract_every": ("paper", "session"),  # P8, P10 (its source names the missing summary)
        "method.mem0_style.recent_turns": ("paper", "5"),  # P8
        "method.mem0_style.per_speaker": ("reference code", "false"),  # P5
        "judge_answers.unanswerable": ("paper", "not_mentioned"),  # F6
        "judge_answers.correctness": ("paper", "[strict]"),  # F8: mem0's J
        "judge_answers.runs": ("paper", "1"),
        "roles.judge.model": ("reference code", "gpt-4o"),
        "roles.judge.temperature": ("reference code", "0.5"),
        "llm.max_tokens": ("ours", "1024"),
        "judge_answers.max_tokens": ("ours", "300"),
        "method.turn.token_budget": ("inferred", "256"),
        "method.turn.retriever": ("inferred", "bm25"),
        "method.a_mem.search": ("inferred", "vector"),
        "method.a_mem.top_k": ("inferred", "5"),
        "corpus.answer_key": ("paper", None),  # on the sheet only: the audited key needs its fetched file
    },
}

# Keys the shipped config already differs on, so the plain `mempipe check` lists them.
LISTED_AS_SHIPPED: dict[str, dict[str, str]] = {
    "longmemeval": {"corpus.path": "paper"},  # F4: the cleaned release against Figure 3b's 2024 file
}


def check_output(capsys, name: str, overrides: Sequence[str] = ()) -> list[str]:
    args = ["check", "-c", str(ROOT / "configs" / f"{name}.yaml")]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 0
    return capsys.readouterr().out.split("\n\nstages of this run")[0].splitlines()


def listed(lines: list[str], path: str, source: str) -> bool:
    """A line `  path: run (paper: value, source)` for this path with its sheet source."""
    return any(ln.startswith(f"  {path}: ") and ln.endswith(f", {source})") for ln in lines)


@pytest.mark.parametrize("name", sorted(KEYS))
def test_every_named_key_is_on_the_sheet_with_a_source_of_its_kind(name):
    protocol = sheet_config(name).paper.protocol
    wanted = {**{k: v[0] for k, v in KEYS[name].items()}, **LISTED_AS_SHIPPED.get(name, {})}
    missing = [k for k in wanted if k not in protocol]
    assert not missing, f"{name}: not on the sheet: {missing}"
    wrong = {k: protocol[k].source[:60] for k, want in wanted.items() if source_kind(protocol[k].source) != want}
    assert not wrong, f"{name}: source of another kind than the test expects: {wrong}"


@pytest.mark.parametrize("name", sorted(KEYS))
def test_check_lists_each_named_key_with_its_source_once_the_run_differs(name, capsys):
    protocol = sheet_config(name).paper.protocol
    shipped = check_output(capsys, name)
    # Equal to the sheet in the shipped config: check prints nothing for these keys...
    for key in KEYS[name]:
        assert not listed(shipped, key, protocol[key].source), f"{name}: {key} differs in the shipped config"
    # ...the keys the shipped config differs on are listed as they are...
    for key in LISTED_AS_SHIPPED.get(name, {}):
        assert listed(shipped, key, protocol[key].source), f"{name}: {key} not listed by check"
    # ...and every key set away from the sheet is listed, with the sheet's source.
    overrides = {k: v for k, (_, v) in KEYS[name].items() if v is not None}
    moved = check_output(capsys, name, [f"{k}={v}" for k, v in overrides.items()])
    unlisted = [k for k in overrides if not listed(moved, k, protocol[k].source)]
    assert not unlisted, f"{name}: set away from the sheet but not listed by check: {unlisted}"
    for key in overrides:
        line = next(ln for ln in moved if ln.startswith(f"  {key}: "))
        src = protocol[key].source
        assert f"(paper: {protocol[key].value!r}, " in line and (source_kind(src) == "paper" or f", {source_kind(src)}:" in line)


def test_teafarm_questions_are_answered_by_the_speaker_who_did_not_ask_so_agent_speaker_is_off_the_sheet():
    # `probes.agent_speaker` picks the responder of next-response probes only; TeaFarm's probe names its own
    # answerer (Sec. 5.1 (3): a question from each speaker's side), so no setting of it moves Table 3.
    questions = [{"error": None, "question_id": "q1", "episode_id": "e1", "memory_sessions": 5, "answerer": "Speaker 1",
                  "question": "Why did you sell the boat?", "answer": "I never owned one.", "evidence_sessions": [2],
                  "false_premise": "Speaker 1 owned a boat."}]
    sessions = [{"question_id": "q1", "turn_idx": 0, "speaker": "Speaker 2", "text": "Why did you sell the boat?"}]
    (probe,) = teafarm_probes(questions, sessions)
    assert probe["respondent"] == "Speaker 1"
    cfg = sheet_config("teafarm_msc_cc")
    assert cfg.probes.next_response is False and "probes.agent_speaker" not in cfg.paper.protocol


def test_the_teafarm_avg_rows_are_the_pooled_micro_row_and_say_so():  # o5
    rows = [r for r in sheet_config("teafarm_msc_cc").paper.results if r.name.endswith("Avg.")]
    assert len(rows) == 8
    assert all(r.where["dataset"] == "all" and "pooled micro row" in r.source for r in rows)


def test_the_report_and_the_teafarm_page_say_the_p_values_are_per_cell_and_uncorrected():  # o4
    assert "uncorrected for multiple comparisons" in pairwise_report.MULTIPLICITY_NOTE
    page = (ROOT / "docs" / "reproducing" / "teafarm.md").read_text()
    assert "per-cell tests, uncorrected" in page


def test_the_mem0_rows_without_a_primary_copy_say_they_are_unverified():
    results = sheet_config("locomo_memory_systems").paper.results
    unverified = [r for r in results if "not verified against a primary copy" in r.source]
    amem_j = [r for r in unverified if r.name.startswith("A-Mem*,") and r.name.endswith(", J")]
    f1_b1 = [r for r in unverified if r.column in ("mem0_f1", "mem0_bleu1")]
    rag = [r for r in unverified if r.name.startswith("RAG ")]
    assert (len(amem_j), len(f1_b1), len(rag)) == (4, 48, 14)
    assert len(unverified) == 66  # and no other row
    assert all("consistent with Table 2" in r.source for r in amem_j)
    # Checked against a second copy in round 3 (the Memobase README, the widemem page): no such note.
    checked = {"Mem0, overall J", "Full-context, overall J", "Mem0, Single Hop (LoCoMo category 1), J"}
    assert not [r for r in results if r.name in checked and "not verified" in r.source]


def test_the_longmemeval_rows_say_they_are_consistent_but_unverified():
    results = sheet_config("longmemeval").paper.results
    assert len(results) == 2
    assert all("Consistent with the stated drop, not verified against a primary copy" in r.source for r in results)


def test_the_token_rows_name_the_format_they_count():  # F7
    sources = {r.name: r.source for r in sheet_config("locomo_memory_systems").paper.results}
    assert "timestamp | speaker: text" in sources["Full-context, context tokens"]
    assert "ours: counted as our prompt shows them" in sources["Mem0, memory tokens"]


def test_the_mem0_style_sheet_says_it_has_no_running_summary():  # P10
    protocol = sheet_config("locomo_memory_systems").paper.protocol
    assert "no running conversation summary S" in protocol["method.mem0_style.extract_every"].source


def test_the_teafarm_sheet_says_our_comedy_profiles_both_speakers():  # P13
    source = sheet_config("teafarm_msc_cc").paper.protocol["method.comedy.memory_words"].source
    assert source.startswith("ours:") and "profiles both speakers" in source
