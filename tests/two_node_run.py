"""Runs the pipeline twice on a two-node Ray cluster on this machine (ray.cluster_utils.Cluster)
and prints one JSON line: the nodes, where each stage's shards ran, and each run's exit code.

Its own process, because the test session already holds a local Ray. This process is the driver
(as a `ray job submit` entrypoint is), connected before the command line runs: both runs are one job,
so the second finds the first's workers instead of starting and importing its own.

    python tests/two_node_run.py BASE_URL WORKDIR RPM
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = "respond_full_history"


def mempipe_run(base_url: str, workdir: Path, run_name: str, rpm: int) -> int:
    """`mempipe run`'s command line in this process, the driver of the cluster it is connected to."""
    sets = [f"run_name={run_name}", f"artifacts_dir={workdir / 'artifacts'}", f"llm.cache_dir={workdir / 'llm-cache'}",
            "llm.provider=openai", f"llm.base_url={base_url}", "llm.model=fake-model",
            "llm.api_key_env=MEMPIPE_TEST_KEY", f"llm.rpm={rpm}", "llm.max_concurrency=4", "corpus.limit=null",
            "methods=[full_history]", f"stages=[ingest,probes,{STAGE}]", "teabag.enabled=false",
            "ray.episodes_per_shard=1"]
    from stages.cli import main as mempipe

    return mempipe(["run", "-c", str(ROOT / "configs" / "default.yaml"), *(a for s in sets for a in ("--set", s))])


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster

    base_url, workdir, rpm = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    # One CPU per node: a task and an LLM worker on each (every worker a process that imports the
    # project: more CPUs would add processes, not coverage).
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        nodes = [node.node_id for node in cluster.list_all_nodes()]
        ray.init(address=cluster.address, logging_level=logging.WARNING)
        first = mempipe_run(base_url, workdir, "first", rpm)
        manifest = json.loads((workdir / "artifacts" / "first" / STAGE / "_manifest.json").read_text())
        again = mempipe_run(base_url, workdir, "again", rpm)  # same cache, new run name
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps({"nodes": nodes, "first_rc": first, "again_rc": again,
                      "shards_per_node": manifest["timings"]["shards_per_node"], "shards": manifest["shards"],
                      "rows": manifest["rows"], "errors": manifest["errors"]}))


if __name__ == "__main__":
    main()
