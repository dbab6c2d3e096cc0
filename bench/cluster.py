"""Benchmark: the docs' cluster path (docs/cluster.md) on a local two-node Ray cluster, with a worker node lost in
the middle of an LLM stage.

What it does, as a new user would (docs/cluster.md, "Running on a Ray cluster"):
1. a cluster token in a file named by RAY_AUTH_TOKEN_PATH, RAY_AUTH_MODE=token for every node and
   for the submitting shell; `ray start --head`, then a second `ray start --address` (the worker
   node) with its own --temp-dir; both with private ports so no other Ray on this machine is touched;
2. the default pipeline (configs/default.yaml against `python -m pipeline.testing.fake_openai` with latency,
   a synthetic corpus, llm.rpm set) submitted with the docs' `ray job submit` line;
3. in the middle of an LLM stage, with shards running on the worker node, its raylet and every
   other process of that node are SIGKILLed at once (a lost machine): Ray reruns the node's shards
   on the head; once the stage is published a replacement worker node joins (as an autoscaler's);
4. the same command again (must send 0 requests); the same pipeline uninterrupted under another run
   name with its own cache (the reference); with --cache-run, one more run name on the first run's
   cache (every call must come from the cache: 0 requests);
5. `mempipe status` from the checkout (the submitting machine) on the submitted run's artifacts.

Reported: job succeeded, rows lost (tables compared with the reference, rows sorted), repeated
calls (a request whose identical body had already been answered) against the requests in flight
when the node died, manifests equal but for timings and the fresh/cached split, the peak request
rate in any 60 s window against llm.rpm (the limiter is one actor for both nodes), requests of the
resubmissions.

    python bench/cluster.py                         # 3 episodes, llm.rpm 300
    python bench/cluster.py --cache-run --keep      # with step 4's last run; keep the work folder
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from harness import KEY_ENV, ROOT, FakeServer, fake_sets, table, write_results
from make_corpus import write_corpus

README = ROOT / "docs" / "cluster.md"
SECTION = "# Running on a Ray cluster"
VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")
KILL_STAGE = "memory_creem"  # the default job's LLM stage with the most calls per episode
BUSY_BEFORE_KILL_S = 5.0  # a shard running this long on the worker node is in the middle of its LLM calls
IN_FLIGHT_GRACE_S = 1.0  # an answer that arrived this long before the kill may not have reached the cache yet


# --- the docs' commands ----------------------------------------------------------------------------
def readme_block() -> str:
    """The first bash block of the docs' cluster page."""
    text = README.read_text()
    section = text[text.index(SECTION):]
    section = section[: section.find("\n## ", len(SECTION))]
    m = re.search(r"```bash\n(.*?)```", section, re.S)
    if not m:
        raise RuntimeError(f"no bash block in docs section {SECTION!r}")
    return m.group(1)


def readme_submit() -> list[str]:
    """The docs' `ray job submit ...` command line, continuation lines joined, as argv."""
    lines, out, taking = readme_block().splitlines(), [], False
    for line in lines:
        code = line.split("  #")[0].rstrip()
        if code.startswith("ray job submit"):
            taking = True
        if taking:
            out.append(code.rstrip("\\").strip())
            if not code.endswith("\\"):
                break
    if not out:
        raise RuntimeError("the docs' cluster page has no `ray job submit` line")
    return shlex.split(" ".join(out))


def submit_argv(head_url: str, values: dict[str, str], extra: list[str]) -> list[str]:
    """The README's submit line with its address and --set values replaced, then `extra` --set
    overrides (the fake endpoint, the synthetic corpus, the run name)."""
    argv = readme_submit()
    argv = [a.replace("http://<head>:8265", head_url) for a in argv]
    if head_url not in argv:
        raise RuntimeError(f"the README's submit line has no `--address http://<head>:8265`: {argv}")
    for i, a in enumerate(argv[:-1]):
        if a == "--set":
            key = argv[i + 1].split("=", 1)[0]
            if key in values:
                argv[i + 1] = f"{key}={values[key]}"
    shown = {argv[i + 1].split("=", 1)[0] for i, a in enumerate(argv[:-1]) if a == "--set"}
    if set(values) - shown:
        raise RuntimeError(f"the README's submit line does not set {sorted(set(values) - shown)}")
    for s in extra:
        argv += ["--set", s]
    return [RAY if argv[0] == "ray" else argv[0], *argv[1:]]


# --- a private two-node cluster on this machine ------------------------------------------------------
def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class LocalCluster:
    """`ray start --block` processes with their own temp dirs and ports; stop() ends exactly those
    (and any process whose command line names their temp dirs), never another Ray on the machine."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}
        self.head_port = self.dashboard_port = 0

    def _start(self, name: str, args: list[str], wait_for: str) -> None:
        temp = self.root / name
        agent, grpc, runtime_env, metrics, nm, om = free_ports(6)
        cmd = [RAY, "start", *args, f"--temp-dir={temp}", "--node-ip-address=127.0.0.1", "--block",
               "--disable-usage-stats", f"--dashboard-agent-listen-port={agent}",
               f"--dashboard-agent-grpc-port={grpc}", f"--runtime-env-agent-port={runtime_env}",
               f"--metrics-export-port={metrics}", f"--node-manager-port={nm}", f"--object-manager-port={om}",
               "--object-store-memory=200000000"]
        log = (self.root / f"{name}.log").open("w")
        env = {**self.env, "DASHBOARD_METRIC_PORT": str(free_ports(1)[0])}  # default 44227 may be taken
        self.procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, cwd=self.root)
        deadline = time.time() + 180
        while wait_for not in (self.root / f"{name}.log").read_text(errors="replace"):
            if self.procs[name].poll() is not None or time.time() > deadline:
                raise RuntimeError(f"ray start {name} failed:\n{(self.root / f'{name}.log').read_text()[-3000:]}")
            time.sleep(0.5)

    def start_head(self, cpus: int) -> None:
        self.head_port, self.dashboard_port, client = free_ports(3)
        # README: `ray start --head --dashboard-host=0.0.0.0`; here the dashboard stays on 127.0.0.1.
        self._start("head", ["--head", f"--port={self.head_port}", "--dashboard-host=127.0.0.1",
                             f"--dashboard-port={self.dashboard_port}", "--include-dashboard=true",
                             f"--ray-client-server-port={client}", f"--num-cpus={cpus}"],
                    "Ray runtime started")
        self.wait_dashboard()

    def add_worker(self, name: str, cpus: int) -> None:
        # README: `ray start --address=<head>:6379`.
        self._start(name, [f"--address=127.0.0.1:{self.head_port}", f"--num-cpus={cpus}",
                           f'--resources={{"{name}": 1}}'], "Ray runtime started")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def wait_dashboard(self) -> None:
        import urllib.error
        import urllib.request

        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/api/version", timeout=5).read()
                return
            except urllib.error.HTTPError:
                return  # it answers (401 without the token header is an answer)
            except OSError:
                time.sleep(1)
        raise RuntimeError("the head's dashboard did not come up")

    def tree(self, name: str) -> list[Any]:
        """The node's `ray start --block` process and all its descendants (raylet, GCS, agents,
        workers: workers retitle themselves `ray::...`, so their command lines no longer say whose
        they are; the process tree does)."""
        import psutil

        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return []
        try:
            root = psutil.Process(proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def raylet(self, name: str) -> Any | None:
        import psutil

        for p in self.tree(name):
            try:
                if p.name() == "raylet":
                    return p
            except psutil.Error:
                continue
        return None

    def kill_node(self, name: str) -> tuple[float, int]:
        """SIGKILL the node's raylet and, in the same instant, every other process of that node
        (workers, agents, its `ray start`), as when a machine is lost: (kill time, processes)."""
        import psutil

        raylet = self.raylet(name)
        if raylet is None:
            raise RuntimeError(f"no raylet of node {name}")
        procs = [raylet, *(p for p in self.tree(name) if p.pid != raylet.pid)]
        killed_at = time.time()
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        return killed_at, len(procs)

    def stop(self) -> None:
        """SIGTERM each `ray start --block` (it stops its node), then SIGKILL whatever of their
        process trees is left."""
        import psutil

        trees = [p for name in self.procs for p in self.tree(name)]
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for p in trees:  # psutil checks the start time, so a reused pid is never hit
            try:
                p.kill()
            except psutil.Error:
                pass


# --- the state API -----------------------------------------------------------------------------------
def retried_shards(url: str, submission_id: str) -> int:
    """Shard tasks of the job that ran more than once (Ray's attempt numbers)."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_tasks

    job_id = JobSubmissionClient(url).get_job_info(submission_id).job_id
    tasks = [t for name in ("_run_or_explain", "LLMWorker.run")  # a CPU stage's task, an LLM stage's shard
             for t in list_tasks(address=url, filters=[("job_id", "=", job_id), ("name", "=", name)],
                                 limit=10000, detail=True, timeout=60)]
    return len({t.task_id for t in tasks if (t.attempt_number or 0) > 0})


# --- one submission ----------------------------------------------------------------------------------
class Submission:
    """`ray job submit ...` running in the background from the checkout, output to a log."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.started = time.time()
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait(self, timeout: float) -> dict[str, Any]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc = -9
        text = self.log.read_text()
        m = re.search(r"Job '(\S+)' submitted successfully", text)
        return {"rc": rc, "succeeded": rc == 0 and re.search(r"Job '\S+' succeeded", text) is not None,
                "submission_id": m.group(1) if m else None, "wall_s": round(time.time() - self.started, 1),
                "tail": text[-2500:]}


def partial_markers(run_dir: Path, stage: str) -> int:
    folder = run_dir / f"{stage}.partial" / "_shards"
    return len(list(folder.glob("*.json"))) if folder.exists() else 0


def busy_workers(cluster: LocalCluster, node: str) -> set[int]:
    """Worker processes of `node` running shards now: Ray titles a worker by the task it runs
    (`ray::_run_or_explain`; `ray::IDLE` between tasks), an LLM stage's worker by its actor
    (`ray::LLMWorker`, kept for the run: the caller checks that the stage is in progress)."""
    import psutil

    busy = set()
    for p in cluster.tree(node):
        try:
            title = " ".join(p.cmdline())
            if "ray::_run_or_explain" in title or "ray::LLMWorker" in title:
                busy.add(p.pid)
        except psutil.Error:
            continue
    return busy


def kill_mid_stage(cluster: LocalCluster, sub: Submission, run_dir: Path, worker: str,
                   timeout: float) -> dict[str, Any]:
    """Wait until KILL_STAGE is in progress and one of its shards has been running on `worker` for
    BUSY_BEFORE_KILL_S (so it has finished some LLM calls and has others in flight), then kill
    that node."""
    deadline = time.time() + timeout
    first_seen: dict[int, float] = {}
    partial, final = run_dir / f"{KILL_STAGE}.partial", run_dir / KILL_STAGE / "_manifest.json"
    while time.time() < deadline and sub.proc.poll() is None and not final.exists():
        if partial.exists():
            now = time.time()
            busy = busy_workers(cluster, worker)
            first_seen = {pid: first_seen.get(pid, now) for pid in busy}
            if any(now - t >= BUSY_BEFORE_KILL_S for t in first_seen.values()):
                done = partial_markers(run_dir, KILL_STAGE)
                at, processes = cluster.kill_node(worker)
                return {"killed_at": at, "stage": KILL_STAGE, "shards_done_before": done,
                        "shards_running_on_node": len(busy), "processes_killed": processes}
        time.sleep(0.2)
    raise RuntimeError(f"never saw a shard of {KILL_STAGE} running on {worker} for {BUSY_BEFORE_KILL_S} s; "
                       "the job said:\n" + sub.log.read_text()[-3000:])


def wait_for_manifest(stage_dir: Path, sub: Submission, timeout: float) -> float | None:
    """Seconds until the stage is published (None if the job ended or time ran out first)."""
    started = time.time()
    while time.time() - started < timeout and sub.proc.poll() is None:
        if (stage_dir / "_manifest.json").exists():
            return round(time.time() - started, 1)
        time.sleep(0.5)
    return None


# --- what came back ----------------------------------------------------------------------------------
def repeats(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Requests whose identical body (key) had already been answered: an earlier request with the
    same key, outcome null and a `done` time before this one arrived. Each with that earlier one."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    out = []
    for c in sorted(chat, key=lambda c: c["t"]):
        earlier = [e for e in by_key.get(c["key"], []) if e["outcome"] is None and e["done"] and e["done"] <= c["t"]]
        if earlier:
            out.append({"key": c["key"], "t": c["t"], "earlier_t": earlier[-1]["t"], "earlier_done": earlier[-1]["done"]})
        by_key.setdefault(c["key"], []).append(c)
    return out


def in_flight_at(chat: list[dict[str, Any]], when: float) -> list[dict[str, Any]]:
    """Requests sent before `when` and not answered by then (less the grace for reaching the
    cache), each with how often its body was sent again afterwards."""
    later = Counter(c["key"] for c in chat if c["t"] > when)
    return [{"t": c["t"], "done": c["done"], "key": c["key"], "sent_again": later[c["key"]]} for c in chat
            if c["t"] <= when and (c["done"] is None or c["done"] + IN_FLIGHT_GRACE_S >= when)]


def classify_repeats(rep: list[dict[str, Any]], killed_at: float, baseline_keys: set[str]) -> dict[str, int]:
    """Repeats of the interrupted run: of a call in flight at the kill (its answer was lost with
    the node), of a prompt the uninterrupted run repeats too (the same prompt asked twice within
    one run, not the kill's doing), and the rest (finished calls sent again: must be 0)."""
    of_in_flight = sum(1 for r in rep if r["earlier_t"] <= killed_at <= r["earlier_done"] + IN_FLIGHT_GRACE_S)
    in_run = sum(1 for r in rep if not r["earlier_t"] <= killed_at <= r["earlier_done"] + IN_FLIGHT_GRACE_S
                 and r["key"] in baseline_keys)
    return {"repeated": len(rep), "repeated_of_in_flight": of_in_flight, "repeated_as_in_reference": in_run,
            "repeated_finished_calls": len(rep) - of_in_flight - in_run}


def peak_rate(times: list[float], window: float = 60.0) -> dict[str, float]:
    """Most requests in any `window` seconds (per minute); over the whole span when shorter."""
    times = sorted(times)
    if len(times) < 2:
        return {"peak_per_min": float(len(times)), "span_s": 0.0, "window": "run"}
    span = times[-1] - times[0]
    if span < window:
        return {"peak_per_min": round((len(times) - 1) / span * 60, 1), "span_s": round(span, 1), "window": "run"}
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] < t - window:
            j += 1
        best = max(best, i - j + 1)
    return {"peak_per_min": float(best), "span_s": round(span, 1), "window": f"{window:.0f} s"}


# Where an answer came from (a rerun shard takes its finished calls from the cache): bookkeeping
# that differs by design between an interrupted and an uninterrupted run; the answers do not.
_CACHE_SPLIT = {"cached_calls", "cached_cost_usd"}


def table_rows(table_dir: Path) -> list[str]:
    """Every row of a stage table as canonical JSON without the fresh/cached split, sorted."""
    import pyarrow.dataset as ds

    parts = sorted(str(p) for p in table_dir.glob("part-*.parquet"))
    if not parts:
        return []
    rows = ds.dataset(parts).to_table().to_pylist()
    return sorted(json.dumps({k: v for k, v in r.items() if k not in _CACHE_SPLIT}, sort_keys=True, default=str)
                  for r in rows)


def _comparable(obj: Any) -> Any:
    """A manifest without timings or the fresh/cached split of its LLM usage (a shard rerun after a
    lost node takes its finished calls from the cache: same answers, different bookkeeping)."""
    if isinstance(obj, dict):
        return {k: _comparable(v) for k, v in obj.items() if k != "timings" and k not in _CACHE_SPLIT}
    if isinstance(obj, list):
        return [_comparable(v) for v in obj]
    return obj


def compare_runs(run: Path, ref: Path) -> dict[str, Any]:
    """Stage by stage and table by table: rows lost / extra against the reference, manifests."""
    lost = extra = 0
    differing_tables, differing_manifests, tables = [], [], 0
    for manifest in sorted(ref.glob("*/_manifest.json")):
        stage = manifest.parent.name
        mine = run / stage / "_manifest.json"
        if not mine.exists():
            differing_manifests.append(f"{stage} (missing)")
            continue
        if _comparable(json.loads(mine.read_text())) != _comparable(json.loads(manifest.read_text())):
            differing_manifests.append(stage)
        for tdir in sorted(p for p in manifest.parent.iterdir() if p.is_dir() and list(p.glob("part-*.parquet"))):
            tables += 1
            a, b = Counter(table_rows(run / stage / tdir.name)), Counter(table_rows(tdir))
            lost += sum((b - a).values())
            extra += sum((a - b).values())
            if a != b:
                differing_tables.append(f"{stage}/{tdir.name}")
    return {"stages": len(list(ref.glob("*/_manifest.json"))), "tables": tables, "rows_lost": lost,
            "rows_extra": extra, "differing_tables": differing_tables, "differing_manifests": differing_manifests}


def cached_calls(run_dir: Path) -> int:
    """LLM calls the run's stages took from the cache (their manifests' usage)."""
    total = 0
    for m in run_dir.glob("*/_manifest.json"):
        for usage in (json.loads(m.read_text()).get("llm_usage") or {}).values():
            total += usage.get("cached_calls", 0)
    return total


def checkout_digest() -> str:
    """What fingerprints depend on in the checkout (code and configs): other people editing it
    while the bench runs make `mempipe status` differ from what the job ran, through no fault."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted([*ROOT.glob("pipeline/**/*.py"), *ROOT.glob("stages/**/*.py"), *ROOT.glob("configs/*.yaml")]):
        h.update(f.relative_to(ROOT).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def status_from_checkout(sets: list[str]) -> dict[str, Any]:
    """`mempipe status` in the checkout (the submitting machine), on the submitted run's config."""
    cmd = [str(VENV_BIN / "mempipe"), "status", "-c", "configs/default.yaml"]
    for s in sets:
        cmd += ["--set", s]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    states = re.findall(r"^(\S+)\s+(done|stale|partial|missing)\b", proc.stdout, re.M)
    return {"rc": proc.returncode, "stages": len(states), "done": sum(s == "done" for _, s in states),
            "not_done": [n for n, s in states if s != "done"], "output": (proc.stdout + proc.stderr)[-1500:]}


# --- the benchmark -----------------------------------------------------------------------------------
class Bench:
    """One benchmark: the cluster, the fake endpoint, the submissions and what they left."""

    def __init__(self, a: argparse.Namespace, work: Path, cluster: LocalCluster, srv: FakeServer,
                 corpus: Path, submit_env: dict[str, str]) -> None:
        self.a, self.work, self.cluster, self.srv, self.corpus = a, work, cluster, srv, corpus
        self.submit_env = submit_env
        self.shared = work / "shared" / "artifacts"  # "shared storage": both nodes are on this machine
        self.results: dict[str, Any] = {"args": vars(a), "commands": {}, "phases_s": {}}
        self.started = time.time()

    def phase(self, name: str) -> None:
        self.results["phases_s"][name] = round(time.time() - self.started, 1)

    def sets(self, run: str, cache: str) -> tuple[dict[str, str], list[str]]:
        """The README's --set values for this run, and the bench's own overrides after them."""
        values = {"llm.provider": "openai", "llm.model": "fake-model", "llm.rpm": str(self.a.rpm),
                  "artifacts_dir": str(self.shared), "llm.cache_dir": str(self.work / "head-disk" / cache)}
        extra = [s for s in fake_sets(self.work, self.srv.base_url, self.corpus, run_name=run)
                 if s.split("=", 1)[0] not in values]
        return values, [*extra, "compress.method=none"]

    def submit(self, run: str, cache: str, label: str) -> Submission:
        values, extra = self.sets(run, cache)
        argv = submit_argv(self.cluster.url, values, extra)
        self.results["commands"][label] = shlex.join(argv).replace(str(VENV_BIN) + "/", "")
        self.srv.reset()
        return Submission(argv, self.submit_env, self.work / f"{label}.log")

    def interrupted(self) -> None:
        """The run that loses its worker node in the middle of an LLM stage; once that stage is
        published (by the head alone), a replacement node joins, as an autoscaler's would."""
        self.digest = checkout_digest()
        sub = self.submit("cluster", "llm", "interrupted")
        kill = kill_mid_stage(self.cluster, sub, self.shared / "cluster", "worker1", self.a.timeout)
        kill["stage_published_after_s"] = wait_for_manifest(self.shared / "cluster" / KILL_STAGE, sub, self.a.timeout)
        if sub.proc.poll() is None:
            self.cluster.add_worker("worker2", self.a.worker_cpus)
        job = sub.wait(self.a.timeout)
        chat = self.srv.stats()["chat"]
        out = {**job, **kill, "requests": len(chat), "repeats": repeats(chat),
               "in_flight": in_flight_at(chat, kill["killed_at"]), **peak_rate([c["t"] for c in chat])}
        if job["submission_id"]:
            out["retried_shards"] = retried_shards(self.cluster.url, job["submission_id"])
            logs = subprocess.run([RAY, "job", "logs", job["submission_id"], "--address", self.cluster.url],
                                  env=self.submit_env, capture_output=True, text=True, timeout=120)
            out["job_logs"] = {"lines": len(logs.stdout.splitlines()),
                               "names_artifacts": f"artifacts: {self.shared / 'cluster'}" in logs.stdout}
        self.results["interrupted"] = out
        self.phase("interrupted")

    def again(self) -> None:
        """The same command again: every stage is done, nothing is sent."""
        job = self.submit("cluster", "llm", "resubmitted").wait(self.a.timeout)
        self.results["resubmitted"] = {**job, "requests": len(self.srv.stats()["chat"])}
        self.phase("resubmitted")

    def reference(self) -> None:
        """The same pipeline uninterrupted, under another run name with its own cache."""
        job = self.submit("reference", "llm-ref", "reference").wait(self.a.timeout)
        chat = self.srv.stats()["chat"]
        self.results["reference"] = {**job, "requests": len(chat), "repeats": repeats(chat),
                                     **peak_rate([c["t"] for c in chat])}
        self.phase("reference")

    def from_cache(self) -> None:
        """Another run name on the first run's cache: every call from the cache."""
        job = self.submit("from_cache", "llm", "from_cache").wait(self.a.timeout)
        self.results["from_cache"] = {**job, "requests": len(self.srv.stats()["chat"]),
                                      "compare": compare_runs(self.shared / "from_cache", self.shared / "reference")}
        self.phase("from_cache")

    def artifacts(self) -> None:
        """The interrupted run against the reference; `mempipe status` from the checkout."""
        self.results["compare"] = compare_runs(self.shared / "cluster", self.shared / "reference")
        self.results["interrupted"]["cached_calls"] = cached_calls(self.shared / "cluster")
        self.results["reference"]["cached_calls"] = cached_calls(self.shared / "reference")
        values, extra = self.sets("cluster", "llm")
        self.results["status"] = {**status_from_checkout([f"{k}={v}" for k, v in values.items()] + extra),
                                  "checkout_edited": checkout_digest() != self.digest}
        self.phase("compared")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.1, help="fake endpoint seconds per request")
    ap.add_argument("--rpm", type=int, default=300, help="llm.rpm for the job (both nodes share it)")
    ap.add_argument("--head-cpus", type=int, default=1)
    ap.add_argument("--worker-cpus", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per submission")
    ap.add_argument("--cache-run", action="store_true",
                    help="also run the pipeline under a new run name on the first run's cache (0 requests)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (path printed)")
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mpc-"))  # short: Ray's socket paths live under it
    token = work / "ray_auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}  # what the README exports
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    node_env = {**base_env, **auth, KEY_ENV: "sk-bench-not-a-secret", "PATH": f"{VENV_BIN}:{base_env.get('PATH', '')}",
                "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    os.environ.update(auth)  # this process's state-API calls carry the token too
    cluster = LocalCluster(work, node_env)
    try:
        corpus = write_corpus(work / "corpus.jsonl", a.episodes, sessions=3, turns=8, questions=2)
        with FakeServer(latency=a.latency) as srv:
            bench = Bench(a, work, cluster, srv, corpus, {**base_env, **auth})
            cluster.start_head(a.head_cpus)
            cluster.add_worker("worker1", a.worker_cpus)
            bench.phase("cluster_started")
            bench.interrupted()
            bench.again()
            bench.reference()
            if a.cache_run:
                bench.from_cache()
            bench.artifacts()
    finally:
        cluster.stop()
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    bench.phase("stopped")
    return report(bench.results, a)


def targets_of(r: dict[str, Any], a: argparse.Namespace, rep: dict[str, int]) -> list[tuple[str, bool | None, str]]:
    """(target, met: True / False / None for not applicable, detail) for every target."""
    i, ref, cmp_ = r["interrupted"], r["reference"], r["compare"]
    targets: list[tuple[str, bool | None, str]] = [
        ("job with a lost worker node succeeded", i["succeeded"], f"rc {i['rc']}"),
        ("rows lost (against the uninterrupted run)", cmp_["rows_lost"] == 0 and cmp_["rows_extra"] == 0,
         f"{cmp_['rows_lost']} lost, {cmp_['rows_extra']} extra, {cmp_['tables']} tables of {cmp_['stages']} stages"),
        ("tables and manifests equal to the uninterrupted run",
         not cmp_["differing_tables"] and not cmp_["differing_manifests"],
         f"differing tables: {cmp_['differing_tables'] or 'none'}; manifests: {cmp_['differing_manifests'] or 'none'}"),
        ("repeated calls: only those in flight at the kill",
         rep["repeated_finished_calls"] == 0 and rep["repeated_of_in_flight"] <= len(i["in_flight"]),
         f"{rep['repeated_of_in_flight']} of the {len(i['in_flight'])} in flight "
         f"({sum(1 for c in i['in_flight'] if c['sent_again'])} of those sent again); "
         f"{rep['repeated_finished_calls']} finished calls sent again; {rep['repeated_as_in_reference']} "
         f"prompt(s) asked twice in one run (the uninterrupted run: {len(ref['repeats'])}); requests "
         f"{i['requests']} vs {ref['requests']} uninterrupted; calls from the cache {i['cached_calls']} vs "
         f"{ref['cached_calls']} uninterrupted (the rerun shards' finished calls)"),
        ("`ray job logs <submission-id>` has the job's output (README)",
         bool(i.get("job_logs", {}).get("names_artifacts")),
         f"{i.get('job_logs', {}).get('lines')} lines, ending with the artifacts path"),
        ("shards rerun after the node loss", i.get("retried_shards", 0) >= 1, f"{i.get('retried_shards')} shard task(s)"),
        ("second submission sends 0 requests", r["resubmitted"]["succeeded"] and r["resubmitted"]["requests"] == 0,
         f"{r['resubmitted']['requests']} requests"),
        ("uninterrupted reference run succeeded", ref["succeeded"], f"rc {ref['rc']}"),
    ]
    if "from_cache" in r:
        fc = r["from_cache"]
        targets.append(("new run name on the same cache: 0 requests, same tables",
                        fc["succeeded"] and fc["requests"] == 0 and not fc["compare"]["differing_tables"],
                        f"{fc['requests']} requests; differing tables: {fc['compare']['differing_tables'] or 'none'}"))
    for label, run in (("interrupted", i), ("reference", ref)):
        limit = a.rpm + 1  # evenly spaced slots: a closed 60 s window can hold both ends
        targets.append((f"llm.rpm={a.rpm} held across nodes ({label} run)", run["peak_per_min"] <= limit,
                        f"peak {run['peak_per_min']:.0f} requests/min in any {run['window']} (span {run['span_s']} s)"))
    st = r["status"]
    status_ok: bool | None = st["rc"] == 0 and st["stages"] > 0 and not st["not_done"]
    detail = f"{st['done']}/{st['stages']} done" + (f"; not done: {st['not_done']}" if st["not_done"] else "")
    if not status_ok and st["checkout_edited"]:
        status_ok, detail = None, detail + " (n/a: the checkout's code changed while the bench ran)"
    targets.append(("`mempipe status` from the checkout sees the submitted run done", status_ok, detail))
    return targets


def report(r: dict[str, Any], a: argparse.Namespace) -> int:
    """Print and write bench/results/cluster.md / .json; 0 when every target is met."""
    i, ref, st = r["interrupted"], r["reference"], r["status"]
    rep = classify_repeats(i["repeats"], i["killed_at"], {x["key"] for x in ref["repeats"]})
    targets = targets_of(r, a, rep)
    rows = [[label, {True: "met", False: "MISSED", None: "n/a"}[ok], detail] for label, ok, detail in targets]
    subs = [("interrupted (worker node killed)", i), ("same command again", r["resubmitted"]),
            ("reference (uninterrupted)", ref)] + ([("new run name, same cache", r["from_cache"])] if "from_cache" in r else [])
    runs = [[name, "yes" if x["succeeded"] else "NO", x["wall_s"], x["requests"]] for name, x in subs]
    body = (f"Local two-node Ray cluster on this machine (head {a.head_cpus} CPU, worker {a.worker_cpus} CPUs, "
            f"token auth), the default pipeline on {a.episodes} synthetic episodes against the fake endpoint "
            f"({a.latency} s latency), llm.rpm={a.rpm}, submitted with the README's command:\n\n"
            f"```\n{r['commands']['interrupted']}\n```\n\n"
            "(the README's line with its address and --set values filled in, then the bench's own --set: the "
            "fake endpoint, the synthetic corpus, the run name; `RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN_PATH` "
            "exported as the README says. The nodes were started with the README's `ray start` lines plus "
            "private ports and temp dirs, so no other Ray on the machine is touched.)\n\n"
            f"During `{i['stage']}` ({i['shards_done_before']} of its {a.episodes} shards published, "
            f"{i['shards_running_on_node']} running on the worker node for {BUSY_BEFORE_KILL_S:.0f} s), its raylet and every other "
            f"process of that node ({i['processes_killed']}) were SIGKILLed at once; Ray reran its shards on the "
            f"head, which published the stage {i['stage_published_after_s']} s after the kill; then a replacement "
            f"worker node joined for the rest of the run. Repeated call = a request whose identical body had "
            f"already been answered earlier in the run (fake server /stats).\n\n"
            + table(["submission", "succeeded", "wall s", "requests"], runs) + "\n\n"
            + table(["target", "result", "detail"], rows) + "\n\n"
            + "Seconds since the start: " + ", ".join(f"{k} {v}" for k, v in r["phases_s"].items()) + ".\n")
    ok = all(t[1] is not False for t in targets)
    if not ok:
        for name, x in subs:
            if not x["succeeded"]:
                body += f"\n{name}: job output (tail):\n\n```\n{x['tail']}\n```\n"
        if st["not_done"]:
            body += f"\n`mempipe status` output:\n\n```\n{st['output']}\n```\n"
    data = {**r, "repeats_classified": rep, "targets": {t[0]: t[1] for t in targets}, "all_met": ok}
    for name in ("interrupted", "reference"):
        data[name] = {**r[name], "repeats": r[name]["repeats"][:50]}
    write_results("cluster", "Two-node Ray cluster: token auth, ray job submit, a lost worker node", body, data)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
