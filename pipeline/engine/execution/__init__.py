"""Where shards run: the executors (inline, or Ray tasks and LLM workers), the per-node embedding
service and the multi-node cluster checks. The only part of the framework that talks to Ray's
scheduler; stages never import it: the executor hands a stage what it needs (an embedder factory
through `StageContext`, the LLM clients' shared handles)."""
