"""The README's test command is what CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = ROOT.joinpath("README.md").read_text()
    ci = ROOT.joinpath(".ci", "run").read_text()
    command = [line for line in ci.splitlines() if line.startswith("python3 -m venv")][0]
    assert command in readme
    assert "python -m pytest" in command
