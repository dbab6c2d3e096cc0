"""Render a run's report.html in headless Chromium at 1400 px and check it shows every method that ran.

Reads `method_summary` of the run for the methods, loads the page with Chromium (Debian package
`chromium`: `apt-get install chromium`), checks the rendered DOM names each method in the
leaderboard, the methods table, the per-probe rows and the probe browser's data, that every image
loaded, that the page fetches nothing from outside (no http(s) URL), and writes three screenshots (the
top of the page; from the head-to-head section on; the probe browser with its first probe open) and a table to bench/results/.

    python bench/report_render.py                      # the default job's run: artifacts/default
    python bench/report_render.py artifacts/<run>
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--allow-file-access-from-files", "--virtual-time-budget=5000"]
# Reports loaded images: naturalWidth is 0 for an image that failed to load.
CHECK_IMAGES = ("<script>addEventListener('load',()=>{document.body.setAttribute('data-broken',"
                "[...document.images].filter(i=>!i.naturalWidth).map(i=>i.src).join(' '))})</script>")




def focus(heading: str) -> str:
    """A script that hides what comes before the first h2 starting with `heading` and opens the probe
    browser's first probe: the page as scrolled there, for a screenshot."""
    return ("<script>addEventListener('load',()=>{for(const e of [...document.body.children]){"
            f"if(e.tagName==='H2'&&e.textContent.startsWith({heading!r}))break;e.style.display='none';}}"
            "const d=document.querySelector('#pb-list details');if(d){d.open=true;}})</script>")


class Cells(HTMLParser):
    """Text of every table cell, per table class, and the body's data-broken attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, list[str]] = {}
        self.broken: str | None = None
        self._cls = ""
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "body" and "data-broken" in a:
            self.broken = a["data-broken"] or ""
        if tag == "table":
            self._cls = a.get("class") or ""
            self.cells.setdefault(self._cls, [])
        self._in_cell = tag == "td"

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.cells[self._cls].append(data.strip())

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._in_cell = False


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not found:
        sys.exit("bench/report_render.py needs Chromium: apt-get install chromium")
    return found


def main(run_dir: Path) -> int:
    report = run_dir / "report" / "report.html"
    if not report.exists():
        sys.exit(f"no report at {report}: run `mempipe run` first")
    methods = list(dict.fromkeys(pq.read_table(run_dir / "report" / "method_summary").column("method").to_pylist()))
    browser = chromium()
    with tempfile.TemporaryDirectory() as tmp:
        page = report.with_name("_render_check.html")
        page.write_text(report.read_text().replace("</body>", CHECK_IMAGES + "</body>"))
        try:
            dom = subprocess.run([browser, *FLAGS, f"--user-data-dir={tmp}/a", "--dump-dom", page.as_uri()],
                                 capture_output=True, text=True, timeout=120, check=True).stdout
            RESULTS.mkdir(parents=True, exist_ok=True)
            subprocess.run([browser, *FLAGS, f"--user-data-dir={tmp}/b", "--window-size=1400,2000",
                            f"--screenshot={RESULTS / 'report_render.png'}", page.as_uri()],
                           capture_output=True, timeout=120, check=True)
            for i, (heading, shot) in enumerate((("Head-to-head", "report_render_winrates.png"),
                                                 ("Probe browser", "report_render_browser.png"))):
                page.write_text(report.read_text().replace("</body>", focus(heading) + "</body>"))
                subprocess.run([browser, *FLAGS, f"--user-data-dir={tmp}/c{i}", "--window-size=1400,1600",
                                f"--screenshot={RESULTS / shot}", page.as_uri()], capture_output=True,
                               timeout=120, check=True)
        finally:
            page.unlink(missing_ok=True)
    parsed = Cells()
    parsed.feed(dom)
    in_methods_table = {m: m in parsed.cells.get("", []) for m in methods}
    in_leaderboard = {m: m in parsed.cells.get("leaderboard", []) for m in methods}
    blob = re.search(r"<script type=.application/json. id=.probe-data.>(.*?)</script>", report.read_text(), re.DOTALL)
    probes = json.loads(blob.group(1)) if blob else []
    in_browser = {m: any(r["method"] == m for p in probes for r in p["responses"]) for m in methods}
    external = sorted(set(re.findall(r"https?://[^\s'\"<>)]+", report.read_text())))
    in_probe_rows = {m: m in parsed.cells.get("probes", []) for m in methods}
    yes = {True: "yes", False: "NO"}
    rows = [[m, yes[in_leaderboard[m]], yes[in_methods_table[m]], yes[in_probe_rows[m]], yes[in_browser[m]]]
            for m in methods]
    broken = (parsed.broken or "").split()
    teafarm = (run_dir / "report" / "teafarm_summary").is_dir() and \
        pq.read_table(run_dir / "report" / "teafarm_summary").num_rows > 0
    teafarm_ok = not teafarm or "TeaFarm (counterfactual questions)" in dom
    lines = [f"# Report render check ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
             (f"Run `{run_dir}`, Chromium `{browser}` at 1400 px; screenshots `bench/results/report_render.png` "
              "(top of the page), `report_render_winrates.png` (from the head-to-head section on) and "
              "`report_render_browser.png` (probe browser, first probe open)."), "",
             "| method | in the leaderboard | in the methods table | in the per-probe rows | in the probe browser |",
             "|---|---|---|---|---|",
             *[f"| {' | '.join(r)} |" for r in rows], "",
             f"Images that failed to load: {len(broken)}{' (' + ', '.join(broken) + ')' if broken else ''}.",
             (f"Probes in the browser's inline data: {len(probes)}; external URLs in the page: "
              f"{len(external)}{' (' + ', '.join(external) + ')' if external else ''}."),
             f"TeaFarm section: {'shown' if teafarm and teafarm_ok else 'MISSING' if teafarm else 'no TeaFarm in this run'}.",
             ""]
    text = "\n".join(lines)
    print(text)
    (RESULTS / "report_render.md").write_text(text)
    ok = teafarm_ok and not external and all(in_leaderboard.values()) and all(in_browser.values()) \
        and all(in_methods_table.values()) and all(in_probe_rows.values()) and parsed.broken is not None and not broken
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "artifacts" / "default"))
