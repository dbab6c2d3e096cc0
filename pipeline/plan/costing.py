"""Per stage and LLM role: the dry run's counts, scaled and calibrated, priced (`_estimate_stage`)."""

from __future__ import annotations

from typing import Any

from pipeline.config import RunConfig
from pipeline.llm.prices import cost_usd, prices_for, role_prices
from pipeline.llm.usage import SHARED, Usage, method_shares
from pipeline.plan.calibration import Calibration, CalibrationSource, _sent, calibrate
from pipeline.plan.dryrun import DryRun
from pipeline.plan.estimates import RoleEstimate
from pipeline.plan.sampling import Scaling, _probe_share
from pipeline.engine.stage import EMBEDDER_ROLE, GlobalStage, Stage


def _estimate_stage(cfg: RunConfig, stage: Stage, dry: DryRun, scaling: Scaling | float,
                    source: CalibrationSource | None, completion_fraction: float, n_episodes: int,
                    remaining: int) -> list[RoleEstimate]:
    """Per LLM role of `stage` (and its `embedder` role, where it embeds through an endpoint): the dry
    run's counts scaled by `scaling` (a plain factor: every count by it), calibrated on `source`, priced."""
    if not isinstance(scaling, Scaling):  # a plain factor: every count by it, by episodes
        scaling = Scaling.flat(scaling, "counted" if scaling == 1.0 else
                               f"counted on {dry.episodes} episode(s) x {scaling:.3g} ({remaining} to run)")
    emb = dry.embeddings.get(stage.name)
    owner = stage.billed_method
    out = [_role_estimate(cfg, stage, role, dry, scaling, source, completion_fraction, remaining)
           for role in stage.llm_roles(cfg) if role != EMBEDDER_ROLE]
    if EMBEDDER_ROLE in stage.llm_roles(cfg):
        scaled = ("counted" if scaling.episodes == 1.0 else
                  f"counted on {dry.episodes} episode(s) x {scaling.episodes:.3g} ({remaining} to run)")
        e = _embedding_estimate(cfg.role(EMBEDDER_ROLE), emb, scaling.episodes, scaled, dry.episodes)
        e.by_method = {} if e.cost_usd is None else {owner or SHARED: e.cost_usd}  # the simulator bills no method
        out.append(e)
    return out


def _role_estimate(cfg: RunConfig, stage: Stage, role: str, dry: DryRun, scaling: Scaling,
                   source: CalibrationSource | None, completion_fraction: float, remaining: int) -> RoleEstimate:
    role_cfg = cfg.role(role)
    price = role_prices(role_cfg)
    m = dry.manifests.get(stage.name)
    u = (m.llm_usage or {}).get(role) if m is not None else None
    u = u or Usage()
    chat_calls, chat_prompt = _sent(u), u.prompt_tokens
    est = RoleEstimate(role, role_cfg.model, price=price,
                       counted={"calls": chat_calls, "prompt_tokens": chat_prompt, "episodes": dry.episodes})
    calls, prompt = chat_calls * scaling.calls, chat_prompt * scaling.prompt
    est.method = {"calls": scaling.how_calls,
                  "prompt_tokens": scaling.how_prompt + " (cl100k, OpenAI's chat framing)"}
    cal = None
    if source is not None and m is not None:
        # Embeddings go through the `embedder` role, never through this one: nothing to leave out.
        # Where the dry run sampled probes, its counts are compared as if it had made them all.
        pf = scaling.probe_factor
        cal = calibrate(stage, role, m, (chat_calls * _probe_share(m, pf, "calls"),
                                         chat_prompt * _probe_share(m, pf, "prompt_tokens")),
                        dry.episodes, source, (0.0, 0.0), pf)
    if cal is not None:
        episodes_to_run = 1 if isinstance(stage, GlobalStage) else remaining
        calls, prompt = _calibrated(est, cal, scaling, calls, prompt, episodes_to_run)
    if cal is not None and cal.completion_per_call is not None:
        completion = calls * cal.completion_per_call
        est.method["completion_tokens"] = f"{cal.completion_per_call:.1f} per call, calibrated on {cal.source}"
    else:
        per_call = completion_fraction * dry.max_tokens.get(stage.name, role_cfg.max_tokens)
        completion = calls * per_call
        est.method["completion_tokens"] = (f"assumed: {completion_fraction:g} x max_tokens "
                                           f"= {per_call:.1f} per call (no calibration source)")
    # The cached share of the prompts is the dry run's (see CACHED_PROMPT_RULE): it follows from
    # the prompts' structure, so it carries over to the scaled and calibrated prompt tokens.
    cached_share = min(u.cached_prompt_tokens / chat_prompt, 1.0) if chat_prompt else 0.0
    est.counted["cached_prompt_tokens"] = float(u.cached_prompt_tokens)
    est.method["cached_prompt_tokens"] = f"{cached_share:.1%} of prompt tokens, as in the dry run"
    est.calls, est.prompt_tokens, est.completion_tokens = calls, prompt, completion
    est.cached_prompt_tokens = prompt * cached_share
    est.cost_usd = None if price is None else cost_usd(price, prompt, completion, est.cached_prompt_tokens)
    if est.cost_usd is not None:
        shares = method_shares(u.cost_by_method, stage.billed_method)
        est.by_method = {k: est.cost_usd * f for k, f in shares.items()}
    return est


def _calibrated(est: RoleEstimate, cal: Calibration, scaling: Scaling, calls: float, prompt: float,
                episodes_to_run: int) -> tuple[float, float]:
    """Calls and prompt tokens corrected by `cal` (its real rate per episode where the dry run made no
    call); says how in `est.method`."""
    if cal.rate is not None:
        est.method["calls"] = est.method["prompt_tokens"] = f"per episode of {cal.source}"
        return cal.rate["calls"] * episodes_to_run, cal.rate["prompt_tokens"] * episodes_to_run
    if cal.calls is not None:
        calls *= cal.calls
        est.method["calls"] = f"{scaling.how_calls}, x {cal.calls:.3g} calibrated on {cal.source}"
    if cal.prompt is not None:
        prompt *= cal.prompt
        est.method["prompt_tokens"] = f"{scaling.how_prompt}, x {cal.prompt:.3g} calibrated on {cal.source}"
    return calls, prompt


def _embedding_estimate(role_cfg: Any, emb: dict[str, float] | None, scale: float, scaled: str,
                        episodes: int) -> RoleEstimate:
    """The `embedder` role of a stage that embeds through an endpoint: calls one per text (as the
    manifests and the run's ledger count them), sent in requests of up to `EMBED_BATCH` texts;
    tokens are the texts' (cl100k, as OpenAI's embedding models count them); cost at the embedding
    model's input price, None where the price table has no such model."""
    from pipeline.llm.client import EMBED_BATCH

    emb = emb or {}
    model = str(emb.get("model") or role_cfg.model)
    texts, tokens = float(emb.get("calls", 0.0)) * scale, float(emb.get("prompt_tokens", 0.0)) * scale
    requests = float(emb.get("requests", 0.0)) * scale
    p = prices_for(role_cfg).get(model)
    price = None if p is None else {"input": p.get("input", 0.0), "output": 0.0}
    return RoleEstimate(
        EMBEDDER_ROLE, model, texts, tokens, 0.0, None if price is None else cost_usd(price, tokens, 0), price,
        {"calls": f"{scaled} (one per text; {requests:,.0f} requests of up to {EMBED_BATCH} texts)",
         "prompt_tokens": scaled + " (cl100k)", "completion_tokens": "none (embeddings)"},
        {"calls": float(emb.get("calls", 0.0)), "requests": float(emb.get("requests", 0.0)),
         "prompt_tokens": float(emb.get("prompt_tokens", 0.0)), "episodes": episodes})

