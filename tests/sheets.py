"""What the reproduction-sheet tests share: the paper configs, loaded, and deviations as a message."""

from __future__ import annotations

from pathlib import Path

import stages

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
# Every shipped config but the offline default reproduces a paper and carries its sheet.
PAPER_CONFIGS = sorted(p.stem for p in CONFIGS.glob("*.yaml") if p.stem != "default")


def sheet_config(name: str, overrides: list[str] | None = None):
    return stages.load_config(CONFIGS / f"{name}.yaml", overrides)


def described(devs) -> str:
    return "\n".join(f"{d.path}: config {d.run!r}, paper {d.paper!r} ({d.source})" for d in devs)
