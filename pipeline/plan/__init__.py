"""`mempipe plan`: before any paid call, which stages a run would run and why, and per stage and LLM
role the calls, prompt and completion tokens and cost it expects, each with how it was estimated.

Which stages, and why: `Runner.select`, the very selection `mempipe run` executes (same `--only`,
`--from`, `--force`, `--until`): `new` (no output yet), `stale` (an output of another fingerprint:
the stage's own settings / prompts / code / role changed, or an upstream stage's), `partial` (an
interrupted run of this fingerprint; its finished shards are not redone), `forced`, or `done`.

How much (per stage that would run and has LLM roles):

1. Calls and prompt tokens are counted by a dry run: the stages to run, and those they need, run in
   a scratch directory with every role pointed at `pipeline.plan.simulated` (an OpenAI-compatible
   endpoint on 127.0.0.1 that answers schema-valid JSON to structured requests and plain text of the
   assumed length otherwise, and counts tokens as OpenAI bills them, in cl100k), the cache off, the
   `inline` executor, no embedded model started. Roles keep their model names, so prices apply.
   No model runs and nothing is downloaded (`dryrun._no_models`): compression is estimated from sizes (a
   `rate` share of each utterance's words kept, speaker tags and lines intact:
   `pipeline.compression.simulate_line`), local embeddings are hashed-word vectors of the model's
   dimension (`pipeline.embeddings.SimulatedEmbedder`), and stages no LLM stage reads (the report,
   `score`, `response_metrics` with its BERTScore) are not run; `method["models"]` says which.
   Stages already done for this config are not simulated: their outputs are linked into the scratch
   directory, so the stages after them read the real data (only when the dry run covers every
   episode). Calls whose number is known from the inputs (segmentation: one per session; the
   judges: per probe, method pair and sample) are thereby exact; calls that depend on what the model
   answers (Theanine's links per memory, CREEM's steps, re-asks of invalid answers, TeaBag's rejects)
   are what the simulated answers make them.
2. Big corpora: the dry run reads the first `sample` episodes (per corpus source, in proportion),
   fewer while they hold more than `DRY_RUN_TURNS` turns (never under 2: turn-by-turn methods make
   calls per turn, and a LoCoMo conversation has ~400), and at most `DRY_RUN_PROBES` probes per
   episode and kind (the probes stage's own seeded random subset; the run's probes are made first and
   counted). A per-episode stage's counts are scaled to the run (`sampling._scales`): per episode made over
   to all of the run's probes where it reads them (x its probes / the sampled ones), then by the
   size they grow with, the one of episodes, turns, sessions and questions (counted in the corpus
   for every episode) over which the sampled episodes' counts are most even. Global stages are not
   scaled. Each role's `method` says how (e.g. "counted on 2 of 10 episode(s), x 5.09 by turns").
3. Completion tokens cannot be counted before the calls. Per (stage, role) they come from a
   calibration source, in this order: `--like RUN_DIR` (another run's manifests), `--calibrate K` (a
   real run of the first K episodes into `<run>-calibrate-K`, sharing the run's LLM cache so the real
   run does not pay for them again; plan states what it cost), or the manifests already in this run
   directory (any fingerprint: a previous run of this config, or of its earlier version). A source
   also corrects calls and prompt tokens: both are multiplied by real / simulated over the episodes
   the source and the dry run share (real tokenizers are not cl100k, real models write other
   answers than the simulated ones). Without a source, completions are assumed:
   `completion_fraction` (0.5) of each request's max_tokens, and calls and prompt tokens stay counted.
4. Cost: tokens x the role's price (`pipeline.llm.prices`: the default table, the config's
   `llm.prices` / `roles.<r>.prices` over it; `batch: true` roles at the batch discount). The cache is
   not consulted: a call the cache already holds is free in the run but counted here. Prompt tokens
   the endpoint would serve from its prompt cache are priced at `cached_input`: their share of each
   (stage, role)'s prompt tokens is the dry run's (`Usage.cached_prompt_tokens`: the simulated
   endpoint applies OpenAI's rule to the prompts it is sent), so it is estimated from the prompt
   structure, not measured.
5. Where the money goes: per method of the run, the cost of its memory and respond stages and its
   share of each judge stage. A (stage, role)'s cost is split by the dry run's `Usage.cost_by_method`
   (the judges bill each judged row to its method); where the dry run has none, a stage built for one
   method (`memory_<m>`, `respond_<m>`) is wholly that method's and any other stage is `(shared)`.

The estimate is also written to `<run_dir>/_plan.json`, which the live progress line of `mempipe run`
reads (calls done / expected, `pipeline.engine.progress.planned_calls`) when a stage's fingerprint matches:

    {"created_at": ISO time, "run_dir": str, "method": {...},
     "stages": {name: {"fingerprint": str, "calls": int, "prompt_tokens": int, "cached_prompt_tokens": int,
                       "completion_tokens": int, "cost_usd": float}},   # the stages that would run
     "total": {"calls", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "cost_usd"}}

`calls` counts every call the stage's clients make, answered or failed, embeddings one per text (as
the manifests' `calls + failed_calls` and the run's ledger count them). With `embedding.provider:
openai` the stages that embed (`banks`, `score`, methods that retrieve densely) have a row for the
`embedder` role: texts counted by the dry run, the requests they go in (up to 128 texts each), their
cl100k tokens, and the embedding model's input price ("no price" where the table has none).
"""

from __future__ import annotations

# The package's modules by job; these names were pipeline/plan.py's, and stay importable from here.
from pipeline.plan.calibration import (Calibration, CalibrationSource, _calibration_cost, _sent, calibrate,
                                       calibration_source)
from pipeline.plan.configs import PROBE_CAPS, SIM_KEY_ENV, _probe_caps, calibration_config, dry_run_config
from pipeline.plan.costing import _embedding_estimate, _estimate_stage
from pipeline.plan.dryrun import DryRun, dry_run
from pipeline.plan.estimates import (CACHED_PROMPT_RULE, DEFAULT_COMPLETION_FRACTION, DEFAULT_SAMPLE, DRY_RUN_PROBES,
                                     DRY_RUN_TURNS, TOTAL_KEYS, Plan, PlanOptions, Registry, RoleEstimate,
                                     StageEstimate)
from pipeline.plan.make import make_plan
from pipeline.plan.rendering import render, render_views
from pipeline.plan.sampling import (MEASURES, EpisodeSize, Scaling, _best_measure, _count_episodes, _episode_sizes,
                                    _per_episode, _scales, _take, _take_within)

__all__ = [
    "CACHED_PROMPT_RULE", "DEFAULT_COMPLETION_FRACTION", "DEFAULT_SAMPLE", "DRY_RUN_PROBES", "DRY_RUN_TURNS",
    "MEASURES", "PROBE_CAPS", "SIM_KEY_ENV", "TOTAL_KEYS", "Calibration", "CalibrationSource", "DryRun",
    "EpisodeSize", "Plan", "PlanOptions", "Registry", "RoleEstimate", "Scaling", "StageEstimate", "calibrate",
    "calibration_config", "calibration_source", "dry_run", "dry_run_config", "make_plan", "render", "render_views",
    # private helpers the tests reach
    "_best_measure", "_calibration_cost", "_count_episodes", "_embedding_estimate", "_episode_sizes",
    "_estimate_stage", "_per_episode", "_probe_caps", "_scales", "_sent", "_take", "_take_within",
]
