"""The README stays short and keeps its two commands; the reference under docs/ builds in strict mode."""

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# The two set-up paths a newcomer copies, byte for byte.
DEFAULT_JOB = (
    'python3 -m venv .venv && . .venv/bin/activate && CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF '
    "-DGGML_AMX_INT8=OFF\" pip install torch==2.13.0 -e '.[local]' && mempipe run -c configs/default.yaml"
)
TESTS = (
    'python3 -m venv .venv && . .venv/bin/activate && CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF '
    "-DGGML_AMX_INT8=OFF\" pip install torch==2.13.0 -e '.[local,test]' && python -m pytest"
)


def bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, re.S)]


def test_readme_is_short_and_holds_exactly_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert bash_blocks(text) == [DEFAULT_JOB, TESTS]


def test_ci_runs_the_readme_test_command_then_builds_the_docs():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert TESTS in ci
    build = [line for line in ci if "mkdocs build" in line]
    assert build and "--strict" in build[0] and ci.index(build[0]) > ci.index(TESTS)


def test_readme_links_and_images_point_at_files():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert "docs/img/report.png" in targets
    for target in targets:
        if "://" in target:
            continue
        assert (ROOT / target.split("#")[0]).is_file(), target


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["theme"]["name"] == "material"

    def pages(nav):
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                yield from pages(value)
            else:
                yield value

    listed = set(pages(config["nav"]))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert listed == on_disk


def test_mkdocs_build_strict(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, or a page missing from the nav, fails."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "img" / "report.png").is_file()
