"""Checks for runs on a multi-node Ray cluster: is `artifacts_dir` storage every node sees, and do
the run's paths sit inside a submitted job's uploaded working directory; and the live nodes that
the executor's workers and embedding services are placed on.

Shards write their Parquet parts and markers where `artifacts_dir` points, on whichever node runs
them; the driver publishes the stage from what it sees there. A node-local path on a multi-node
cluster would scatter shards over disks the driver never reads, so the run stops and says so.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

from pipeline.config import RunConfig
from pipeline.errors import PipelineError
from pipeline.storage import Location, is_remote

log = logging.getLogger("mempipe")

PROBE_TIMEOUT_S = 120.0  # a fresh worker on a busy node can take a while to start
MARKER_GRACE_S = 5.0  # NFS attribute caches may show another node's new file a moment late


def not_shared_message(artifacts_dir: str, nodes: list[str]) -> str:
    """What to tell the user when `nodes` (descriptions) do not see files the driver writes."""
    return (f"artifacts_dir {artifacts_dir} is not shared storage: Ray node(s) {', '.join(nodes)} do not "
            "see files this run writes there, so shards they run would land on their own disks and the "
            "stage could not be published. On a multi-node cluster, set artifacts_dir to storage every "
            "node mounts at the same path (NFS, EFS, ...): --set artifacts_dir=/shared/artifacts")


def working_dir_warnings(cfg: RunConfig, working_dir: Path) -> list[str]:
    """Warnings for run paths inside a submitted job's uploaded working directory (`working_dir`):
    Ray unpacks a fresh copy per checkout content and deletes old ones when it needs the space."""
    out = []
    if not is_remote(cfg.artifacts_dir) and Path(cfg.artifacts_dir).is_relative_to(working_dir):
        out.append(f"artifacts_dir {cfg.artifacts_dir} is inside this job's uploaded working directory, "
                   "a temporary copy on the head that Ray deletes when it needs the space, and that no "
                   "other node sees; set --set artifacts_dir=/shared/artifacts (storage every node mounts)")
    caches = {cfg.llm.cache_dir} | {c for r in cfg.roles.values() if (c := getattr(r, "cache_dir", None))}
    for cache in sorted(caches):
        if cfg.llm.cache_enabled and Path(cache).is_relative_to(working_dir):
            out.append(f"llm.cache_dir {cache} is inside this job's uploaded working directory: a submission "
                       "from a changed checkout gets a new copy and an empty cache (every call paid again); "
                       "set --set llm.cache_dir=/var/cache/mempipe/llm (a local path on the head)")
    return out


def _sees(path: str, token: str) -> bool:
    """Runs on another node: does it read the probe file the driver wrote?"""
    try:
        return Path(path).read_text() == token
    except OSError:
        return False


def _describe(node: dict[str, Any]) -> str:
    return f"{node.get('NodeManagerAddress', '?')} (node {str(node.get('NodeID', '?'))[:8]})"


def nodes_not_seeing(directory: Path, nodes: list[dict[str, Any]]) -> list[str] | None:
    """Descriptions of the `nodes` (entries of ray.nodes()) that do not see a file written now into
    `directory`; None when the check could not finish in time."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    directory.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(8)
    probe = directory / f".mempipe-shared-check-{token}"
    probe.write_text(token)
    try:
        sees = ray.remote(_sees)
        refs = [sees.options(num_cpus=0, max_retries=0,
                             scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(str(probe), token) for n in nodes]
        try:
            seen = ray.get(refs, timeout=PROBE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            for r in refs:
                ray.cancel(r, force=True)
            return None
        return [_describe(n) for n, ok in zip(nodes, seen) if not ok]
    finally:
        probe.unlink(missing_ok=True)


def check_cluster_paths(cfg: RunConfig) -> None:
    """After ray.init: warn about paths inside a submitted job's working directory, and stop the
    run when artifacts_dir is not visible from every other node of the cluster."""
    import ray

    ctx = ray.get_runtime_context()
    if (ctx.runtime_env or {}).get("working_dir"):
        for warning in working_dir_warnings(cfg, Path.cwd().resolve()):
            log.warning(warning)
    here = ctx.get_node_id()
    others = [n for n in ray.nodes() if n.get("Alive") and n.get("NodeID") != here]
    if not others or is_remote(cfg.artifacts_dir):  # an object store is the same for every node
        return
    missing = nodes_not_seeing(Path(cfg.artifacts_dir), others)
    if missing is None:
        log.warning("could not check in %.0f s that every node sees artifacts_dir %s; it must be shared "
                    "storage on a multi-node cluster", PROBE_TIMEOUT_S, cfg.artifacts_dir)
    elif missing:
        raise PipelineError(not_shared_message(cfg.artifacts_dir, missing))


def live_nodes() -> dict[str, float]:
    """Node id -> CPUs of every live node that has CPUs (where workers and services can run)."""
    import ray

    return {n["NodeID"]: n["Resources"]["CPU"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")}


def require_visible(marker: Location, node_id: str, artifacts_dir: str) -> None:
    """A shard that ran on another node reported its marker at `marker`: fail clearly when this
    driver cannot see it (the node wrote to its own disk), after a short grace for NFS caches."""
    if is_remote(marker):
        return  # an object store is the same for every node
    marker = Path(marker)
    deadline = time.monotonic() + MARKER_GRACE_S
    while not marker.exists():
        if time.monotonic() > deadline:
            raise PipelineError(not_shared_message(artifacts_dir, [f"node {node_id[:8]}"]))
        time.sleep(0.5)
