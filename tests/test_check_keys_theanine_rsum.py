"""Every setting the round-3 review of Theanine and RSum names (shared/audits/round3/theanine_rsum.md:
#5, N2, N4, N6, N9, F1-F3, F8, F9) is on its config's sheet with its source, and `mempipe check` lists it,
with that source, as soon as a run differs from it.

In the shipped configs each of these keys equals the sheet's value, so `mempipe check` prints no line
for it ("matches the paper's protocol"). The test therefore asserts both halves: the sheet holds the key
with the config's value and a source of the named kind (ours / inferred / reference code / paper), and a
check of the same config with every key set to another value (`--set`) prints the key's line ending in
that source."""

from __future__ import annotations

from pathlib import Path

import pytest

import stages
from stages.cli import main
from pipeline.reproduction import effective, source_kind

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
ABLATIONS = ("theanine_no_relation", "theanine_no_refine", "theanine_all")

# key -> (the kind of its source, a value that differs from the sheet's, for --set)
THEANINE: dict[str, tuple[str, str | None]] = {
    "method.theanine.origin_tokens": ("ours", "300"),             # #5, F3: the 600-token origin-dialogue cut
    "method.theanine.max_memories": ("ours", "5"),                # F3: the 10-memory cap
    "method.theanine.timelines_per": ("paper", "component"),      # F3: k*n timelines (Sec. 2.2)
    "method.theanine.draw_order": ("ours", "recency"),            # F8
    "llm.max_tokens": ("ours", "256"),                            # F3
    "roles.judge.temperature": ("ours", "1.0"),                   # F2, F3: the judge's temperature
    "judge_pairwise.temperature": ("ours", "0.5"),                # ... and the stage's own override of it
    "judge_pairwise.samples": ("ours", "3"),                      # F2
    "judge_pairwise.runs": ("ours", "2"),
    "judge_pairwise.max_tokens": ("ours", "200"),                 # the judge's max_tokens
    "judge_pairwise.reason_first": ("paper", "false"),            # F2 (App. D: CoT before the form)
    "judge_pairwise.context_turns": ("inferred", "10"),           # N2
    "judge_pairwise.length_rule": ("ours", "true"),               # N2
    "judge_pairwise.past_session_tokens": ("ours", "1000"),
    "judge_pairwise.max_probes_per_episode": ("paper", "3"),
    "corpus.episode_ids": ("ours", "[msc-1]"),                    # N6, #27
    "probes.agent_speaker": ("reference code", "1"),             # N9
    "method.rsum.response_style": ("paper", "short"),             # F1 (App. H: RSum's original prompt)
    "method.rsum.max_sentences": ("paper", "10"),                 # N4
    "method.memochat.preset": ("paper", "project"),               # MemoChat's own loop (App. H)
    "method.theanine.max_paths": ("ours", "50"),
    "method.theanine.link_mode": ("paper", "all_labelled"),
    "method.theanine.dedupe_timelines": ("paper", "false"),
}
# #5 and F3 for Table 2's ablations: the same choices, each its own setting.
THEANINE_ABLATIONS: dict[str, tuple[str, str | None]] = {
    f"method.{m}.{key}": (kind, other) for m in ABLATIONS
    for key, kind, other in (("origin_tokens", "ours", "300"), ("max_memories", "ours", "5"),
                             ("timelines_per", "paper", "component"), ("draw_order", "ours", "recency"))}
# N6 for the pooled config's second source (configs/theanine_msc_cc.yaml, the CC corpus); `--set` cannot
# reach into a list, so the test sets the whole source at once (`SETS`), and these have no value of their own.
POOLED: dict[str, tuple[str, str | None]] = {
    "corpus.extra.0.episode_ids": ("ours", None),
    "corpus.extra.0.limit": ("paper", None),
}
SETS = {"theanine_msc_cc": ["corpus.extra=[{format: cc, path: data/cc/test.json, limit: 10, episode_ids: [cc-1]}]"]}
RSUM: dict[str, tuple[str, str | None]] = {
    "method.rsum.response_style": ("reference code", "short"),        # F1
    "method.gold_memory.response_style": ("reference code", "short"),  # F9: one frame for the four
    "method.all_context.response_style": ("reference code", "short"),
    "method.part_context.response_style": ("reference code", "short"),
    "method.rsum.max_sentences": ("reference code", "10"),            # N4
    "method.rsum.max_words": ("reference code", "50"),
    "method.rsum.one_shot": ("inferred", "true"),                     # D9: the invented one-shot dialogue, off
    "method.rsum.temperature": ("paper", "0.5"),
    "method.all_context.token_budget": ("reference code", "1000"),
    "probes.agent_speaker": ("reference code", "all"),                # N9
    "llm.max_tokens": ("ours", "256"),                                # F3
    "roles.memory.model": ("ours", "gpt-4o"),                         # the retired gpt-3.5-turbo-0301
}
KEYS: dict[str, dict[str, tuple[str, str | None]]] = {
    "theanine_msc": {**THEANINE, **THEANINE_ABLATIONS},
    "theanine_cc": {**THEANINE, **THEANINE_ABLATIONS},
    "theanine_msc_cc": {**THEANINE, **POOLED},
    "rsum_msc": RSUM,
}


@pytest.mark.parametrize("name", sorted(KEYS))
def test_every_key_the_review_names_is_on_the_sheet_with_its_source_and_the_configs_value(name):
    cfg = stages.load_config(CONFIGS / f"{name}.yaml", [])
    protocol = cfg.paper.protocol
    for key, (kind, _) in KEYS[name].items():
        assert key in protocol, f"{name}: {key} is not on the sheet"
        assert source_kind(protocol[key].source) == kind, (name, key, protocol[key].source)
        # equal in the shipped config, so check prints nothing for it until a run differs
        assert effective(cfg, key) == protocol[key].value, (name, key)


@pytest.mark.parametrize("name", sorted(KEYS))
def test_check_lists_every_key_the_review_names_with_its_source_when_the_run_differs(name, capsys):
    keys = KEYS[name]
    path = str(CONFIGS / f"{name}.yaml")
    assert main(["check", "-c", path]) == 0
    assert "matches the paper's protocol" in capsys.readouterr().out  # all equal as shipped
    sets = [arg for key, (_, other) in keys.items() if other is not None for arg in ("--set", f"{key}={other}")]
    sets += [arg for value in SETS.get(name, []) for arg in ("--set", value)]
    assert main(["check", "-c", path, *sets]) == 0
    lines = capsys.readouterr().out.split("\n\nstages of this run")[0].splitlines()
    protocol = stages.load_config(path, []).paper.protocol
    assert any(f"{len(keys)} of {len(protocol)} settings differ" in ln for ln in lines)
    for key in keys:
        expected = f", {protocol[key].source})"
        assert any(ln.startswith(f"  {key}: ") and ln.endswith(expected) for ln in lines), (name, key)


def test_rsums_check_shows_no_judge_stage_and_so_no_judge_settings():
    """F5 and the judges' temperatures: no RSum number needs a judge, so rsum_msc runs none (neither the
    head-to-head nor the memory-quality ratings) and check lists no judge setting or stage."""
    cfg = stages.load_config(CONFIGS / "rsum_msc.yaml", [])
    assert not cfg.judge_pairwise.enabled and not cfg.judge_memory.enabled
    assert not [k for k in cfg.paper.protocol if k.startswith(("roles.judge", "judge_"))]
    assert not [s for s in stages.registry(cfg) if s.startswith("judge")]


@pytest.mark.parametrize("name", ["theanine_msc", "theanine_cc", "theanine_msc_cc"])
def test_the_theanine_configs_run_no_memory_judge_no_number_of_theirs_needs(name):
    cfg = stages.load_config(CONFIGS / f"{name}.yaml", [])
    assert not cfg.judge_memory.enabled and "judge_memory" not in stages.registry(cfg)
    assert "judge_pairwise" in stages.registry(cfg)


def test_a_run_without_the_second_source_differs_on_its_settings_and_a_typo_still_fails(capsys):
    """A sheet path may index a list (`corpus.extra.0.limit`); an item the run lacks reads as None."""
    path = str(CONFIGS / "theanine_msc_cc.yaml")
    assert main(["check", "-c", path, "--set", "corpus.extra=[]"]) == 0
    out = capsys.readouterr().out
    assert "  corpus.extra.0.limit: None (paper: 50, App. C-D" in out
    assert "  corpus.extra.0.format: None (paper: 'cc', Sec. 3.1" in out
    cfg = stages.load_config(path, [])
    assert effective(cfg, "corpus.extra.0.limit") == 50
    with pytest.raises(KeyError, match="no 'corpus.extra.0.limt'"):
        effective(cfg, "corpus.extra.0.limt")
