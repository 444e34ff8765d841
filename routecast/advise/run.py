"""The advisor end to end: a trace and a deployment in, the ranked verdict (and its artifacts) out.

    advise_trace(trace, dep, ...) -> (Verdict, extras)          every family priced on the same trace
    advise_deployment(trace_dir, model_profile=, hardware=, gpus=, ...) -> (Verdict, files)

Families (see each module): placement and Speculative MoE shuffling (advise.placement) when EP >= 2 and the
experts fit; caching / prefetch and eMoE residency (advise.offload) when they do not; request schedulers
(advise.serving) always. A family that does not apply is listed with its reason.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from routecast.advise.candidate import Candidate
from routecast.advise.rank import BENCH_DIR, Verdict, cost_model_error, rank
from routecast.advise.regime import Deployment, detect_regime
from routecast.common.errors import ConfigError
from routecast.trace.trace import Trace

FAMILIES = ("placement", "shuffle", "cache", "scheduler")
# Placement and shuffling plan and price every (step, layer) (PROBE's planner, the co-activation fit, the
# co-clustering's scoring): on a longer trace they run on its first MAX_EP_CELLS // MoE-layers steps (2,000 steps of a
# 20-layer model, 689 of DeepSeek-V3's 58); the regime and scheduling read the whole trace.
MAX_EP_CELLS = 40000
# Caching and prefetch replay every routed (token, layer) of the held-out requests with each policy object and fit
# a predictor on the rest: on a longer trace they run on its first steps holding at most MAX_CACHE_CELLS token-layer
# cells (all 43,319 tokens of a 16-request DeepSeek-V3 preset trace, about a minute here; a 2,000-request one has
# about 125 times as many). The regime and the schedulers read the whole trace.
MAX_CACHE_CELLS = 2_600_000


def first_steps(trace: Trace, n: int, *, max_tokens: int | None = None, what: str = "placement and shuffling",
                ) -> tuple[Trace, str]:
    """The trace's first `n` distinct steps, fewer if they would hold more than `max_tokens` tokens (whole steps,
    at least one) -> (trace, note or ""); the trace itself when it is within both."""
    import numpy as np

    steps = np.asarray(trace.tokens["step"])
    u, per = np.unique(steps, return_counts=True)
    if max_tokens is not None:
        n = min(n, max(int(np.searchsorted(np.cumsum(per), max_tokens, side="right")), 1))
    if u.size <= n:
        return trace, ""
    sub = trace.select(steps <= u[n - 1])
    return sub, (f"{what} priced on the first {n} of {u.size} steps ({sub.num_tokens} of "
                 f"{trace.num_tokens} tokens)")


def with_router_inputs(trace: Trace, path: str | Path) -> Trace:
    """`trace` (the first steps of the trace at `path`, or all of it) with the router inputs of the same rows when
    the files at `path` hold them (memory-mapped: only these rows' are read); else `trace` unchanged."""
    import numpy as np

    from routecast.trace.io import read_trace

    full = read_trace(path, load_hidden=True, load_logits=False)
    if full.hidden_TLH is None:
        return trace
    if full.num_tokens == trace.num_tokens:
        return full
    steps = np.asarray(full.tokens["step"])
    return full.select(steps <= int(np.asarray(trace.tokens["step"]).max()))


def advise_trace(trace: Trace, dep: Deployment, *, model_ref: str, hw_ref: str, families: tuple[str, ...] = FAMILIES,
                 shuffle_methods: tuple[str, ...] | None = None, predictor: str = "conditional-token",
                 emoe_quality: str | Path | None = None, seed: int = 0, bench_dir: str | Path = BENCH_DIR,
                 trace_path: str | Path | None = None) -> tuple[Verdict, dict[str, Any]]:
    """Price every applicable strategy of `families` on `trace` for `dep` -> (verdict, {plans, shuffle, serve}).
    trace_path: where `trace` was read from; when its files hold router inputs, the cache family reads them for the
    replayed steps only (with_router_inputs) and also prices fc-evict reading the reuse probe."""
    from routecast.advise.offload import offload_candidates
    from routecast.advise.placement import SHUFFLE_METHODS, placement_candidates, shuffle_candidates
    from routecast.advise.serving import scheduler_candidates

    bad = [f for f in families if f not in FAMILIES]
    if bad:
        raise ConfigError(f"--only holds {bad[0]!r}; expected names from {', '.join(FAMILIES)}.")
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    regime = detect_regime(dep, trace)
    timings["regime"] = time.perf_counter() - t0
    cands: list[Candidate] = []
    extras: dict[str, Any] = {"plans": None, "shuffle": None, "serve": None}
    run = None
    cap = max(MAX_EP_CELLS // trace.spec.num_layers, 1)
    ep_trace, note = first_steps(trace, cap) if {"placement", "shuffle"} & set(families) else (trace, "")
    if note:
        regime = dataclasses.replace(regime, notes=(*regime.notes, note))
    if "placement" in families:
        t0 = time.perf_counter()
        got, run = placement_candidates(ep_trace, dep, regime)
        cands += got
        extras["plans"] = run.plans if run is not None else None
        timings["placement"] = time.perf_counter() - t0
    if "shuffle" in families:
        t0 = time.perf_counter()
        got, sh = shuffle_candidates(ep_trace, dep, regime, methods=shuffle_methods or SHUFFLE_METHODS, seed=seed,
                                     attn_T=None if run is None else run.attn_T,
                                     tokens_T=None if run is None else run.tokens_T)
        cands += got
        extras["shuffle"] = sh or None
        timings["shuffle"] = time.perf_counter() - t0
    if "cache" in families:
        t0 = time.perf_counter()
        c_trace, c_note = (trace, "") if regime.fits else first_steps(  # nothing to replay when all experts fit
            trace, trace.num_tokens, what="caching and prefetch",
            max_tokens=max(MAX_CACHE_CELLS // trace.spec.num_layers, 1))
        if c_note:
            regime = dataclasses.replace(regime, notes=(*regime.notes, c_note))
        if trace_path is not None and not regime.fits:
            c_trace = with_router_inputs(c_trace, trace_path)
        cands += offload_candidates(c_trace, dep, regime, predictor=predictor, model_arg=model_ref,
                                    emoe_quality=emoe_quality, seed=seed,
                                    trace_ref=None if trace_path is None else str(trace_path))
        timings["cache"] = time.perf_counter() - t0
    if "scheduler" in families:
        t0 = time.perf_counter()
        got, conf = scheduler_candidates(trace, dep, regime, model_ref=model_ref, hw_ref=hw_ref, seed=seed)
        cands += got
        extras["serve"] = conf or None
        timings["scheduler"] = time.perf_counter() - t0
    err, src = cost_model_error(dep.hw, bench_dir)
    v = Verdict(deployment=dep.describe() + f", trace {trace!r}", regime=regime.as_dict(), regime_text=regime.describe(),
                rows=rank(cands, err), error=err, error_source=src, timings_s=timings)
    return v, extras


def make_deployment(*, model_profile: str, hardware: str, gpus: int, ep: int | None = None,
                    memory_gb: float | None = None, link: str = "nvlink", rate: float | None = None,
                    slo_ttft: str = "5x", slo_tpot: str = "5x") -> Deployment:
    """Load the profiles and build the Deployment (ep default: gpus; memory default: the profile's capacity)."""
    from routecast.serve.loop import parse_slo
    from routecast.sim.hardware import load_hardware
    from routecast.sim.models import load_model

    parse_slo(slo_ttft, "--slo-ttft-ms")
    parse_slo(slo_tpot, "--slo-tpot-ms")
    m, hw = load_model(model_profile), load_hardware(hardware)
    return Deployment(model=m, hw=hw, gpus=gpus, ep=gpus if ep is None else ep,
                      memory_gb=hw.mem_capacity / 1e9 if memory_gb is None else memory_gb, link=link, rate=rate,
                      slo_ttft=slo_ttft, slo_tpot=slo_tpot)
