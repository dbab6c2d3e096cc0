"""Benchmark: every concrete `mempipe` command of README.md, docs/**/*.md and the configs' header
comments (tests/docs_commands.py finds them; tests/test_docs_commands.py only parses them), run as
written, against local stand-ins, since this machine has no network and no API key:

- a temporary working folder (`configs/` linked into it from the checkout, so `-c configs/X.yaml`
  reads the real configs; `data/`, `artifacts/`, `exports/` and the caches are written there);
- `mempipe data fetch NAME` with MEMPIPE_DATA_MIRROR on a local HTTP mirror that serves, at each
  registry URL's path, a small file in that corpus's own published layout (the fixtures in
  tests/fixtures/corpora; MSC as a ParlAI-style tar.gz, Long-MT-Bench+ as Parquet; LoCoMo's two
  conversations and a copy of the first, so that `plan --calibrate 2` has more than it samples). MSC's sha256 is
  recorded from ParlAI, so its fake archive is refused (as designed); the bench then puts the MSC
  fixture where the fetch would have written it, for the MSC runs;
- `--set corpus.path=/data/...` pointed at the fetched files in the working folder (`/data/X` ->
  `<work>/data/X`; two header paths that are not where `data fetch` writes are named and mapped);
- for commands that call an LLM (`run`, `plan --calibrate`): every role on the fake OpenAI-compatible
  server (`python -m pipeline.testing.fake_openai` through bench/harness.py, its own process):
  `llm.provider=openai`, `llm.base_url`, and `roles.<r>.provider/base_url` for each role the config
  declares, OPENAI_API_KEY a dummy; sliced small: `corpus.limit=1` (K + 1 for `plan --calibrate K`),
  `probes.max_per_episode=1`, `probes.max_qa_per_episode=1`; a model the config needs that is not in
  the local caches (`mempipe models list` says "missing") replaced by a local stand-in (MiniLM for
  the embedding model, with CREEM's cosine similarity as its config says for offline runs; LLMLingua
  with the packaged causal LM for LLMLingua-2; BERTScore off);
- `plan --like artifacts/earlier`: the earlier run is this bench's own run of the same config.

Each row says which substitutions its command ran with. Commands that cannot run here are listed with
the reason (a real cloud, the real API, another repository's scripts). Prints the table and writes
bench/results/docs_commands.md and .json.

    python bench/docs_commands.py            # every command: about 15-25 minutes on 2 cores
    python bench/docs_commands.py --keep     # keep the working folder (logs in <work>/logs)
    python bench/docs_commands.py --only rsum_msc    # the commands containing this text (and the fetches)
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml
from harness import ROOT, FakeServer, table, write_results

sys.path.insert(0, str(ROOT / "tests"))
from docs_commands import command_lines, skipped_lines  # noqa: E402

from pipeline.corpus import load_corpus  # noqa: E402
from pipeline.corpus.sources import REGISTRY  # noqa: E402

MEMPIPE = str(Path(sys.executable).parent / "mempipe")
FIX = ROOT / "tests" / "fixtures" / "corpora"
MSC_FIXTURE = FIX / "msc" / "session_3.jsonl"
SLICE = ["corpus.limit=1", "probes.max_per_episode=1", "probes.max_qa_per_episode=1"]
# A model `mempipe models list` reports missing -> the local stand-in (its config key -> --set values).
OFFLINE = {"embedding.model": ["embedding.model=all-MiniLM-L6-v2", "embedding.normalize=true"],
           "compress.model": ["compress.method=llmlingua", "compress.model=null"],
           "response_metrics.bertscore_model": ["response_metrics.bertscore=false"]}
DESIGNED = {  # (command, what its stderr says) -> the verdict of a refusal by design
    ("mempipe data fetch msc", "sha256 mismatch"):
        "checksum refused, as designed (the fake archive is not ParlAI's; its sha256 is recorded)",
    ("mempipe data fetch teabag", "LangAGI-Lab/teafarm"):
        "no file recorded, as designed: names where TeaBag's episode list lives",
}
NOT_RUN = [  # (command, where, why)
    ("ray up ray_cluster.yaml", "docs/cluster.md", "needs a cloud provider and its credentials"),
    ("ray start --head / ray start --address=<head>:6379, ray get-auth-token", "docs/cluster.md",
     "run by bench/cluster.py (two local nodes, token auth)"),
    ("ray job submit --address http://<head>:8265 --working-dir . -- mempipe run -c configs/default.yaml ...",
     "docs/cluster.md", "run by bench/cluster.py (the docs' line, against the fake server)"),
    ("the runs above against the real OpenAI API (OPENAI_API_KEY)", "configs/*.yaml, docs/paid-runs.md",
     "paid and no network here: run against the fake server instead"),
    ("git clone ... locomo; python - ../exports/locomo/...; python3 evaluate_qa.py gpt-4o ...",
     "docs/leaderboards.md", "other repositories' scorers, with the network and (LongMemEval) a paid judge; "
     "the export formats are tested in tests/test_predictions_export.py"),
]


# ---------------------------------------------------------------- the mirror

def _released_dialseg(name: str) -> bytes:
    """SuperDialseg's released layout, {"dial_data": {name: [...]}}, from the TIAGE fixture's dialogues."""
    data = json.loads((FIX / "dialseg_released" / "tiage_released.json").read_text())
    return json.dumps({"dial_data": {name: next(iter(data["dial_data"].values()))}}).encode()


def _locomo() -> bytes:
    """LoCoMo's fixture (2 conversations) and a copy of its first under another id: 3 conversations, so
    that `plan --calibrate 2` samples fewer than the run has."""
    samples = json.loads((FIX / "locomo" / "locomo_mini.json").read_text())
    samples.append({**samples[0], "sample_id": samples[0]["sample_id"] + "-copy"})
    return json.dumps(samples, indent=1).encode()


def _msc_archive(member: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        payload = MSC_FIXTURE.read_bytes()
        info = tarfile.TarInfo(member)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def _parquet(jsonl: Path) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def mirror_files() -> dict[str, tuple[bytes, str]]:
    """URL path -> (body, what it is), one per file of every registry corpus that has files."""
    fixtures = {"locomo": _locomo(),
                "cc": (FIX / "cc" / "chronicles.json").read_bytes(),
                "longmemeval-s": (FIX / "longmemeval" / "longmemeval_mini.json").read_bytes(),
                "dialseg711": _released_dialseg("dialseg711"), "tiage": _released_dialseg("tiage"),
                "superdialseg": _released_dialseg("superdialseg")}
    fixtures["longmemeval-m"] = fixtures["longmemeval-oracle"] = fixtures["longmemeval-s"]
    out = {}
    for source in REGISTRY.values():
        for f in source.files:
            if f.unpack == "untar":
                body, what = _msc_archive(f.member or ""), "tar.gz of tests/fixtures/corpora/msc/session_3.jsonl"
            elif f.unpack == "parquet_to_jsonl":
                body = _parquet(FIX / "longmtbench" / "longmt_hf_release.jsonl")
                what = "Parquet of longmt_hf_release.jsonl"
            else:
                body, what = fixtures[source.name], "fixture"
            out[unquote(urlsplit(f.url).path)] = (body, what)
    return out


class Mirror:
    """The mirror's files in a folder, served by http.server on 127.0.0.1 (a thread of this process)."""

    def __init__(self, folder: Path) -> None:
        self.files = mirror_files()
        for path, (body, _) in self.files.items():
            target = folder / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(body)

        class Quiet(SimpleHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------- the commands

@dataclass
class Row:
    command: str
    sources: list[str]
    argv: list[str] = field(default_factory=list)
    subs: list[str] = field(default_factory=list)
    rc: int | None = None
    seconds: float = 0.0
    verdict: str = ""
    tail: str = ""


def phase(command: str) -> int:
    """Order: fetch the data; plans, as before a paid run (so that `--calibrate` has a run to sample);
    runs and checks; a plan `--like` an earlier run; the commands that read a run (export, report)."""
    verb = command.split()[1]
    if verb == "plan":
        return 3 if "--like" in command else 1
    return {"data": 0, "run": 2, "check": 2}.get(verb, 4)


def collect() -> list[Row]:
    rows: dict[str, Row] = {}
    for doc, command in command_lines():
        rows.setdefault(command, Row(command, [])).sources.append(doc)
    return sorted(rows.values(), key=lambda r: phase(r.command))


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def missing_models(work: Path, config: str, env: dict[str, str]) -> list[str]:
    """The config keys of the models `mempipe models list` finds neither packaged nor cached."""
    proc = subprocess.run([MEMPIPE, "models", "list", "-c", config], cwd=work, env=env, capture_output=True,
                          text=True, timeout=180)
    return re.findall(r"\(([a-z_.]+)\): missing", proc.stdout + proc.stderr)


class Bench:
    def __init__(self, work: Path, mirror: Mirror, llm_url: str, timeout: float) -> None:
        self.work, self.mirror, self.llm_url, self.timeout = work, mirror, llm_url, timeout
        self.data = work / "data"
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "OPENAI_API_KEY": "sk-bench-not-a-secret", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        self.env.pop("MEMPIPE_DATA_MIRROR", None)
        self.notes: list[str] = []
        self._missing: dict[str, list[str]] = {}

    # -- substitutions ------------------------------------------------------------------------------
    def _data_path(self, value: str, subs: list[str]) -> str:
        def repl(m: re.Match) -> str:
            return str(self.data / m.group(1))
        return re.sub(r"(?<![\w.])/data/([^\s,}\]']+)", repl, value)

    def prepare(self, row: Row) -> None:
        argv = shlex.split(row.command)[1:]
        subs = ["cwd: a temporary folder, configs/ linked"]
        verb = argv[0]
        if verb == "data":
            if len(argv) > 1 and argv[1] == "fetch":
                subs.append("MEMPIPE_DATA_MIRROR: the local mirror of fixtures")
            row.argv, row.subs = argv, subs
            return
        mapped = [self._data_path(a, subs) for a in argv]
        if mapped != argv:
            subs.append("/data/ -> <work>/data/")
        argv = mapped
        config = option(argv, "-c")
        if "--like" in argv and option(argv, "--like") == "artifacts/earlier":
            earlier = yaml.safe_load((ROOT / config).read_text())["run_name"] if config else "default"
            argv[argv.index("--like") + 1] = f"artifacts/{earlier}"
            subs.append(f"--like artifacts/{earlier} (this bench's run of {config})")
        calls_llm = verb == "run" and "--only" not in argv or (verb == "plan" and "--calibrate" in argv)
        if calls_llm and config:
            calibrate = option(argv, "--calibrate")
            sets = self._llm_sets(config, subs, limit=int(calibrate) + 1 if calibrate else 1)
            for s in sets:
                argv += ["--set", s]
        if verb == "run" and "--only" in argv:
            subs.append("no LLM stage: as written")
        if config and self._reads_msc(argv, config):
            subs.append("MSC: tests/fixtures/corpora/msc/session_3.jsonl (its fetch was refused)")
        row.argv, row.subs = argv, subs

    def _reads_msc(self, argv: list[str], config: str) -> bool:
        return any("msc/session_5" in a for a in argv) or "msc/" in str(
            (yaml.safe_load((ROOT / config).read_text()).get("corpus") or {}).get("path"))

    def _llm_sets(self, config: str, subs: list[str], limit: int = 1) -> list[str]:
        raw = yaml.safe_load((ROOT / config).read_text()) or {}
        roles = sorted((raw.get("roles") or {}).keys())
        sets = ["llm.provider=openai", f"llm.base_url={self.llm_url}", "llm.api_key_env=OPENAI_API_KEY"]
        for r in roles:
            sets += [f"roles.{r}.provider=openai", f"roles.{r}.base_url={self.llm_url}"]
        subs.append("every LLM role on the fake server" + (f" (llm + roles {', '.join(roles)})" if roles else " (llm)"))
        sliced = [f"corpus.limit={limit}", *SLICE[1:]]  # --calibrate K needs more than K episodes
        sets += sliced
        subs.append(", ".join(sliced))
        if config not in self._missing:
            self._missing[config] = missing_models(self.work, config, self.env)
        for key in self._missing[config]:
            stand_in = list(OFFLINE.get(key, []))
            if key == "embedding.model":
                stand_in += [f"method.{m}.similarity=cosine" for m in raw.get("methods") or [] if m.startswith("creem")]
            if stand_in:
                sets += stand_in
                subs.append(f"{key} not cached: " + ", ".join(stand_in))
        return sets

    # -- running ------------------------------------------------------------------------------------
    def run(self, i: int, row: Row) -> None:
        self.prepare(row)
        env = dict(self.env)
        if row.argv[:2] == ["data", "fetch"]:
            env["MEMPIPE_DATA_MIRROR"] = self.mirror.url
        print(f"[{i}] {row.command}", flush=True)
        started = time.perf_counter()
        try:
            proc = subprocess.run([MEMPIPE, *row.argv], cwd=self.work, env=env, capture_output=True, text=True,
                                  timeout=self.timeout)
            row.rc, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            row.rc = None
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            err += f"\n(timed out after {self.timeout:.0f} s)"
        row.seconds = time.perf_counter() - started
        (self.logs / f"{i:02d}.log").write_text(f"$ mempipe {shlex.join(row.argv)}\n{out}\n--- stderr ---\n{err}")
        row.verdict = self.verdict(row, out, err)
        row.tail = "\n".join((err or out).strip().splitlines()[-4:])
        print(f"[{i}] exit {row.rc} in {row.seconds:.1f} s: {row.verdict}", flush=True)
        if row.argv[:2] == ["data", "fetch"] and row.argv[2] == "msc":
            self.place_msc()

    def verdict(self, row: Row, out: str, err: str) -> str:
        for (command, says), verdict in DESIGNED.items():
            if row.command == command and row.rc == 1 and says in err:
                return verdict
        if row.rc not in (0, 6):
            return "FAILED" + (" (timed out)" if row.rc is None else "")
        failed = re.findall(r"^(\w+): done in .*?, (\d+) failed;", out + err, re.M)
        if failed:  # rows a stage recorded as failed (the run goes on and exits 6)
            return "ok; rows failed: " + ", ".join(f"{stage} {n}" for stage, n in failed)
        if row.argv[:2] == ["data", "fetch"]:
            read = []
            for name in row.argv[2:]:
                source = REGISTRY[name]
                if source.corpus_path:
                    corpus = load_corpus(source.corpus_format, self.data / source.corpus_path)
                    read.append(f"{len(corpus.episodes)} episodes, {len(corpus.qa)} questions")
            return "ok: fetched, checked, the loader reads it" + (f" ({'; '.join(read)})" if read else "")
        return "ok"

    def place_msc(self) -> None:
        """Where `data fetch msc` would have put session 5's test file: the MSC fixture."""
        target = self.data / (REGISTRY["msc"].corpus_path or "")
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(MSC_FIXTURE, target)
            self.notes.append(f"data/{REGISTRY['msc'].corpus_path} is tests/fixtures/corpora/msc/session_3.jsonl, put "
                              "there by the bench after `mempipe data fetch msc` refused the fake archive.")


# ---------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", action="store_true", help="keep the working folder")
    ap.add_argument("--only", default=None, help="run only the commands containing this text (and the fetches)")
    ap.add_argument("--timeout", type=float, default=480.0, help="seconds per command")
    args = ap.parse_args()

    rows = collect()
    if args.only:
        rows = [r for r in rows if args.only in r.command or phase(r.command) == 0]  # the data is always fetched
    work = Path(tempfile.mkdtemp(prefix="mempipe-docs-commands-"))
    mirror = Mirror(work / "mirror")
    started = time.perf_counter()
    try:
        with FakeServer() as server:
            bench = Bench(work / "run", mirror, server.base_url, args.timeout)
            (bench.work / "configs").symlink_to(ROOT / "configs")
            for i, row in enumerate(rows, 1):
                bench.run(i, row)
    finally:
        mirror.close()
    total = time.perf_counter() - started

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    ok = [r for r in rows if r.verdict.startswith(("ok", "checksum refused", "no file recorded"))]
    with_failed_rows = [r for r in ok if "rows failed" in r.verdict]
    failed = [r for r in rows if r not in ok]
    body = [f"Every concrete `mempipe` command of README.md, docs/ and the configs' headers "
            f"({len(command_lines())} lines, {len(rows)} distinct commands), run as written in a temporary "
            f"folder against local stand-ins (`bench/docs_commands.py`; what each stand-in is: the script's "
            f"docstring). **{len(ok)} of {len(rows)} ran as designed, {len(failed)} failed**; "
            f"{len(with_failed_rows)} of them exited 0 with rows a stage recorded as failed (here: answers of the fake "
            f"server that the stage's parser or schema check refused, e.g. a judge reply without `[[rating]]`; a run "
            f"records them and goes on, as designed); {total:.0f} s in all.\n",
            table(["command", "source", "substitutions", "exit", "seconds", "verdict"],
                  [[f"`{cell(r.command)}`", cell(", ".join(r.sources) if len(r.sources) < 3
                                                 else f"{len(r.sources)} files: " + ", ".join(r.sources)),
                    cell("; ".join(r.subs)), r.rc if r.rc is not None else "timeout", f"{r.seconds:.1f}",
                    cell(r.verdict)] for r in rows])]
    if bench.notes:
        body.append("\n" + "\n".join(f"- {n}" for n in bench.notes))
    if failed:
        body.append("\nThe failures' last lines:\n")
        for r in failed:
            body.append(f"- `{cell(r.command)}`:\n\n  ```\n" + "\n".join("  " + line for line in r.tail.splitlines())
                        + "\n  ```")
    body.append("\nNot run here:\n")
    body.append(table(["command", "source", "why"], [[f"`{cell(c)}`", s, cell(w)] for c, s, w in NOT_RUN]))
    skipped = skipped_lines()
    body.append(f"\nNot concrete, so not run ({len(skipped)} lines: synopses with [optional] parts, | choices or "
                "<placeholders>, or lines that elide arguments with \"...\"; each has a concrete sibling above or "
                "is the synopsis of one): " + "; ".join(f"`{cell(c)}` ({d})" for d, c in skipped) + ".")
    write_results("docs_commands", "Every command in the docs, run", "\n".join(body),
                  {"total_s": total, "work": str(work) if args.keep else None,
                   "rows": [{"command": r.command, "sources": r.sources, "argv": r.argv, "substitutions": r.subs,
                             "exit": r.rc, "seconds": round(r.seconds, 1), "verdict": r.verdict} for r in rows]})
    if args.keep:
        print(f"kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
