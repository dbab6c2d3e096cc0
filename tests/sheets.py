"""What the reproduction-sheet tests share: the paper configs, loaded, and deviations as a message."""

from __future__ import annotations

from pathlib import Path

import stages

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
# Every shipped config but the offline default and the benchmark runs reproduces a paper and carries
# its sheet. LongMemEval is a benchmark, not one of the seed papers a sheet cites.
BENCHMARK_CONFIGS = {"default", "longmemeval", "longmemeval_m", "locomo_judge_panel",
                     "locomo_plus", "memoryagentbench", "beam", "halumem"}
# (no paper of their own; locomo_plus, memoryagentbench, beam and halumem: their papers' numbers not on their sheets yet)
PAPER_CONFIGS = sorted(p.stem for p in CONFIGS.glob("*.yaml") if p.stem not in BENCHMARK_CONFIGS)


def sheet_config(name: str, overrides: list[str] | None = None):
    return stages.load_config(CONFIGS / f"{name}.yaml", overrides)


def described(devs) -> str:
    return "\n".join(f"{d.path}: config {d.run!r}, paper {d.paper!r} ({d.source})" for d in devs)
