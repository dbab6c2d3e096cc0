"""Every SeCom setting the round-3 review names (shared/audits/round3/secom.md, item ids beside each
key) is on its config's reproduction sheet with the kind of source it has: the paper (its section,
table or appendix), the reference code, `inferred:` or `ours`; and `mempipe check` prints it with that
source as soon as a run departs from it.

The SeCom configs run every one of these settings at its sheet value (their choices of our own are
written on the sheet as what the run does, with an `ours` source), so `mempipe check` on a config as it
stands prints no line for them ("matches the paper's protocol"). For those keys the test asserts the
sheet instead: the protocol path is there, with a source of the expected kind. It then runs check once
more per config with every named key moved off its sheet value (`--set`) and asserts each key's line,
`path: run (paper: value, source)`, carrying that same source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import stages
from stages.cli import main
from pipeline.reproduction import deviations, source_kind

ROOT = Path(__file__).resolve().parent.parent
QA = ("secom", "turn", "session")


def _qa_keys() -> dict[str, tuple[str, Any, str]]:
    """What both QA sheets (LoCoMo, Long-MT-Bench+) hold: path -> (source kind, a value that moves the
    run off the sheet, the review items that name it)."""
    keys: dict[str, tuple[str, Any, str]] = {
        "roles.judge.model": ("paper", "gpt-4o", "row 1"),
        "roles.judge.temperature": ("ours", 0.5, "D10"),
        "roles.generator.temperature": ("reference code", 0.0, "row 12"),
        "roles.generator.seed": ("reference code", 7, "row 12"),
        "roles.generator.max_tokens": ("reference code", 256, "row 12"),
        "roles.segmenter.max_tokens": ("ours", 2048, "max_tokens (issue 68)"),
        "segment.answer_format": ("reference code", "spans", "D9"),
        "segment.max_units_per_call": ("reference code", 30, "row 15"),
        "segment.fallback_size": ("reference code", 2, "N10"),
        "llm.structured_retries": ("ours", 0, "N10"),
        "compress.rate": ("paper", 0.9, "N12"),
        "compress.restore_pruned_lines": ("reference code", True, "D8"),
        "embedding.normalize": ("reference code", True, "row 10"),
        "score.similarity": ("reference code", "cosine", "row 10"),
        "judge_answers.gpt4score_mode": ("paper", "reference", "row 4, D10, N7, N8"),
        "judge_answers.memochat_dates": ("reference code", True, "N1"),
        "judge_answers.memochat_max_tokens": ("ours", 256, "N8"),
        "method.full_history.token_budget": ("ours", 12000, "row 3"),
    }
    for m in QA:
        keys[f"method.{m}.qa_prompt"] = ("reference code", "ours", "D2")
        keys[f"method.{m}.secom_chat_order"] = ("paper", "rank", "N4")
        keys[f"method.{m}.bm25_tokens"] = ("reference code", "words", "row 11")
        keys[f"method.{m}.bm25_idf"] = ("reference code", "lucene", "row 11, N9")
    return keys


LOCOMO = {**_qa_keys(),
          "corpus.captions": ("inferred", True, "N3, row 23"),
          "judge_answers.unanswerable": ("inferred", "not_mentioned", "D3, N6"),
          "response_metrics.postprocess": ("inferred", "clean", "N2"),
          "method.secom.token_budget": ("inferred", 3500, "N11"),
          "method.session.token_budget": ("ours", 3000, "N11"),
          "method.turn.top_k": ("inferred", 50, "D7")}
LONGMTBENCH = {**_qa_keys(),
               # corpus.format is not moved: another format would read another corpus (D6, row 22)
               "corpus.format": ("paper", None, "D6, row 22"),
               "response_metrics.postprocess": ("reference code", "clean", "N2"),
               **{f"method.{m}.similarity": ("reference code", "cosine", "row 10") for m in QA},
               **{f"method.{m}.top_k": ("reference code", 2, "row 15") for m in QA}}
DIALSEG = {"roles.segmenter.model": ("paper", "gpt-4o", "row 1"),
           "score.segmentation_convention": ("paper", "slots", "row 2"),
           "segment.unit": ("inferred", "exchange", "row 2"),
           "segment.answer_format": ("reference code", "spans", "D9"),
           "segment.temperature": ("reference code", 0.0, "row 12"),
           "segment.max_units_per_call": ("ours", 30, "row 15"),
           "segment.fallback_size": ("reference code", 2, "N10"),
           "roles.segmenter.max_tokens": ("ours", 2048, "max_tokens (issue 68)"),
           "llm.structured_retries": ("ours", 0, "N10")}
CONFIGS = {"secom_locomo": LOCOMO, "secom_longmtbench": LONGMTBENCH, "secom_dialseg": DIALSEG}
# Words a source must carry beyond its kind: the review's residuals, stated where the key is.
ALSO = {"judge_answers.gpt4score_mode": ["first [[rating]]"],
        "roles.judge.temperature": ["default temperature"],
        "compress.restore_pruned_lines": ["line by line", "never does"],
        "corpus.format": ["ours (a deviation)", "<Turn k>", "not been checked against the Hugging Face file"],
        "llm.structured_retries": ["falls back less often"],
        "compress.rate": ["0.9"]}
ALSO_BY_CONFIG = {("secom_longmtbench", "judge_answers.gpt4score_mode"): ["history_source full_past"]}


def _yaml(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_key_the_review_names_is_on_the_sheet_with_its_source_kind(name):
    cfg = stages.load_config(ROOT / "configs" / f"{name}.yaml")
    assert cfg.paper is not None
    protocol = cfg.paper.protocol
    # As the configs stand, check prints none of these keys: each equals its sheet value.
    assert deviations(cfg) == []
    for path, (kind, _, items) in CONFIGS[name].items():
        assert path in protocol, f"{name}: {path} ({items}) is not on the sheet"
        source = protocol[path].source
        assert source_kind(source) == kind, f"{name}: {path} ({items}): {source!r} is not a {kind} source"
        for words in ALSO.get(path, []) + ALSO_BY_CONFIG.get((name, path), []):
            assert words in source, f"{name}: {path}'s source does not say {words!r}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_check_prints_each_named_key_with_its_source_once_the_run_departs_from_it(name, capsys):
    keys = CONFIGS[name]
    moved = {path: alt for path, (_, alt, _) in keys.items() if alt is not None}
    sets = [arg for path, alt in moved.items() for arg in ("--set", f"{path}={_yaml(alt)}")]
    assert main(["check", "-c", str(ROOT / "configs" / f"{name}.yaml"), *sets]) == 0
    out = capsys.readouterr().out.split("\n\nstages of this run")[0].splitlines()
    sheet = stages.load_config(ROOT / "configs" / f"{name}.yaml").paper
    assert sheet is not None
    header = [ln for ln in out if f"(paper: block of {ROOT / 'configs' / name}.yaml)" in ln]
    assert len(header) == 1 and header[0].endswith(f"{len(moved)} of {len(sheet.protocol)} settings differ")
    lines = {ln.strip().split(": ", 1)[0]: ln.strip() for ln in out if ln.startswith("  ") and ": " in ln}
    for path, alt in moved.items():
        setting = sheet.protocol[path]
        assert path in lines, f"{name}: check does not list {path} once it is moved"
        assert lines[path] == f"{path}: {alt!r} (paper: {setting.value!r}, {setting.source})"
        assert source_kind(lines[path].split(f"(paper: {setting.value!r}, ", 1)[1]) == keys[path][0]
