"""Offloading strategies on a trace: expert caching and prefetch policies, eMoE residency with fallback routing.

    offload_candidates(trace, dep, regime, predictor=, emoe_quality=) -> list[Candidate]

Applies when the routed experts do not all fit (regime.resident_share < 1): the budget is that share of the
trace's L x E expert slots. Every policy of cache.compare.ALL_POLICIES (the kernel's and the policy objects:
ARC, S3-FIFO, LIRS, forecast-guided eviction) runs through cache.compare.compare_policies, the same replay (time first: the
kernel's clock, expert compute on the hardware profile, misses and prefetches over its host-to-device link,
one link per GPU), on the held-out rows of an 80/20 document split, so the forecast-driven policies (PLEC) are
judged on requests their predictor never saw. Belady and PLEC on the true routing are listed as bounds.
"Doing nothing" is on-demand LRU (every miss loads when its layer asks; no prediction).

eMoE residency: the budget's most-used experts of each layer on the training rows stay resident, a token
routed to an absent expert falls back to its next resident top-k choice (no load ever waits), so its time is
the replay's stall-free time; its cost is quality: the share of routed (token, k) slots rerouted on the held-out
rows is measured here, the perplexity change comes from `routecast emoe quality` (its JSON, --emoe-quality)
or is "unknown".
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from routecast.advise.candidate import Candidate, not_applicable
from routecast.advise.regime import Deployment, Regime
from routecast.cache.compare import ALL_POLICIES, compare_policies, is_predictive
from routecast.cache.replay import ORACLE
from routecast.common.errors import ConfigError
from routecast.place.compare import step_work
from routecast.sim.cost import attention_time, probe_options
from routecast.trace.trace import Trace

PROBE_ROW = "fc-evict+probe"  # fc-evict also reading the reuse probe (predict/reuse_probe.py), on traces with router inputs
SYSTEMS = {"arc": "ARC (bigrig)", "s3fifo": "S3-FIFO (bigrig)", "lirs": "LIRS (bigrig)",
           "fc-evict": "forecast-guided eviction (routecast cache)",
           PROBE_ROW: "forecast-guided eviction reading the router inputs (routecast cache)",
           "lru": "LRU (mixtral-offloading's policy, one pool)", "lfu": "LFU (Pre-gated MoE)",
           "lfuda": "LFUDA (bigrig default)", "lru-layer": "per-layer LRU (Cache-MoE, mixtral-offloading)",
           "semoe": "SE-MoE next-layer prefetch", "plec": "ExpertFlow PLEC", "plec-correct": "ExpertFlow PLEC",
           "plec-correct-eager": "ExpertFlow PLEC", "plec-correct-fifo": "ExpertFlow PLEC",
           "belady": "Belady MIN (offline bound)"}
DEFAULT_PREDICTOR = "conditional-token"
# runtime flags (`routecast run --offload`) that run a replayed policy for real
RUNTIME_FLAGS = {"lru": "--prefetch none", "lru-layer": "--prefetch none --per-layer",
                 "plec-correct": "--prefetch ffn", "plec": "--prefetch ffn", "plec-correct-eager": "--prefetch ffn",
                 "plec-correct-fifo": "--prefetch ffn"}


def _run_line(model_arg: str, share: float, policy: str, runtime_policies: tuple[str, ...]) -> str:
    if policy in runtime_policies:
        flags = f"--policy {policy}"
    elif policy in RUNTIME_FLAGS:
        flags = RUNTIME_FLAGS[policy]
    else:
        return f"routecast run --model {model_arg} --offload --budget {share:.0%} (policy {policy}: not in the runtime)"
    return f"routecast run --model {model_arg} --offload --budget {share:.0%} {flags}"


def runtime_policies() -> tuple[str, ...]:
    """Policies `routecast run --offload --policy NAME` runs (the runtime's own list: every cache/zoo.py policy
    object). It was read from the argument parser's choices, which --policy does not declare (the runtime checks
    the name itself), so every policy's command said 'not in the runtime'."""
    from routecast.runtime.offload.store import RUNTIME_POLICIES

    return tuple(RUNTIME_POLICIES)


def emoe_quality_cost(path: str | Path | None, share: float) -> str:
    """Perplexity change of eMoE residency at the budget nearest `share` from an `emoe quality` JSON, or unknown."""
    if path is None:
        return "unknown (run `routecast emoe quality`)"
    try:
        doc = json.loads(Path(path).read_text())
        full = float(doc["full"]["ppl"])
        rows = [r for r in doc["rows"] if r.get("choice") in ("emoe", "emoe-a", "oracle", "frequency")] or doc["rows"]
        r = min(rows, key=lambda r: abs(float(r["budget"]) - share))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--emoe-quality {path}: cannot read it ({e}); expected the JSON `routecast emoe quality "
                          "--out` writes.") from None
    return f"perplexity {float(r['ppl']) / full - 1:+.1%} at {float(r['budget']):.0%} ({r['choice']})"


def _residency_rerouted(trace: Trace, train: np.ndarray, test: np.ndarray, share: float) -> tuple[float, np.ndarray]:
    """-> (share of held-out routed slots whose expert is not resident, (L, E) bool resident set)."""
    s = trace.spec
    L, E = s.num_layers, s.num_experts
    cnt = np.zeros((L, E), np.int64)
    miss = tot = 0
    for a, ch in trace.step_chunks():
        ex = np.asarray(ch.experts_TLK, np.int64)
        m = train[a:a + ch.num_tokens]
        e = ex[m]
        ok = e >= 0
        lay = np.broadcast_to(np.arange(L)[None, :, None], e.shape)
        np.add.at(cnt, (lay[ok], e[ok]), 1)
    keep = max(int(math.floor(share * E)), s.top_k)
    order = np.argsort(-cnt, axis=1, kind="stable")[:, :keep]
    res = np.zeros((L, E), bool)
    np.put_along_axis(res, order, True, axis=1)
    for a, ch in trace.step_chunks():
        e = np.asarray(ch.experts_TLK, np.int64)[test[a:a + ch.num_tokens]]
        ok = e >= 0
        lay = np.broadcast_to(np.arange(L)[None, :, None], e.shape)
        miss += int((~res[lay[ok], e[ok]]).sum())
        tot += int(ok.sum())
    return miss / max(tot, 1), res


def probe_candidate(trace: Trace, test: np.ndarray | None, pred: Any, ahead: bool, kw: dict[str, Any], scale: float,
                    run_line: str, fitted: str) -> Candidate:
    """fc-evict reading the reuse probe, fitted on the rows `test` leaves out (the predictor's training rows) and
    replayed on `test` with the same forecast sets, budget and clock as every other cache policy."""
    from routecast.predict.reuse_probe import fit_reuse_probe, probe_steps

    train = np.ones(trace.num_tokens, bool) if test is None else ~test
    try:
        probe = fit_reuse_probe(trace, train)
    except ConfigError as e:
        return not_applicable(PROBE_ROW, SYSTEMS[PROBE_ROW], "cache", str(e))
    reuse = probe_steps(probe, trace, test)
    r = next(r for r in compare_policies(trace, policies=["fc-evict"], forecast=pred, layer_ahead=ahead, reuse=reuse,
                                         **kw) if r["policy"] == "fc-evict")
    return Candidate(name=PROBE_ROW, system=SYSTEMS[PROBE_ROW], family="cache", value=r["us_per_token"] * scale,
                     artifact=run_line,
                     detail={"hit_ratio": r["hit_ratio"], "stall_s": r["stall_s"], "bytes_moved": r["bytes_moved"],
                             "budget_slots": kw["budget"], "forecast": f"{fitted} + reuse probe"})


def offload_candidates(trace: Trace, dep: Deployment, regime: Regime, *, predictor: str = DEFAULT_PREDICTOR,
                       model_arg: str = "MODEL", emoe_quality: str | Path | None = None, seed: int = 0,
                       trace_ref: str | None = None) -> list[Candidate]:
    """Cache policies and eMoE residency at the regime's resident share (module docstring). A trace with router
    inputs (hidden_TLH) also prices fc-evict reading the reuse probe (probe_candidate); its command fits the probe
    on `trace_ref` (the trace's path)."""
    names = [*(n for n in ALL_POLICIES if n != "belady"), "belady"]
    if regime.fits:
        why = "everything fits in memory: no expert is offloaded"
        return [not_applicable(n, SYSTEMS.get(n, n), "cache", why) for n in names] + \
            [not_applicable("eMoE residency with fallback", "eMoE", "residency", why)]
    if dep.hw.h2d_bandwidth <= 0:
        why = f"hardware {dep.hw.name} has no host-to-device link (h2d_gbps 0) to load experts over"
        return [not_applicable(n, SYSTEMS.get(n, n), "cache", why) for n in names]
    from routecast.cache.forecasts import make_forecast

    s, m = trace.spec, dep.model
    L, E = s.num_layers, s.num_experts
    slots = max(int(math.floor(regime.resident_share * L * E)), s.top_k * L)
    share = slots / (L * E)
    work = step_work(trace)
    T = int(np.size(work.batch))
    attn = attention_time(m, dep.hw, work, probe_options(), 1, T)[0]
    dense_us = float(np.mean(attn) * 1e6)
    hw = dataclasses.replace(dep.hw, h2d_bandwidth=dep.hw.h2d_bandwidth * dep.gpus)
    scale = m.num_moe_layers / L
    test, pred, ahead, fitted = make_forecast(trace, predictor, seed=seed)
    kw = dict(budget=slots, hardware=hw, mask=test, dense_us=dense_us, expert_bytes=m.expert_bytes())
    rows = {r["policy"]: r for r in compare_policies(trace, policies=names, forecast=pred, layer_ahead=ahead, **kw)}
    oracle = compare_policies(trace, policies=["plec-correct"], forecast=ORACLE, **kw)
    rt = runtime_policies()
    out = []
    for n in names:
        r = rows[n]
        c = Candidate(name=n if n != "lru" else "on-demand LRU", system=SYSTEMS.get(n, n), family="cache",
                      value=r["us_per_token"] * scale, deployable=n != "belady",
                      artifact="none (needs the future)" if n == "belady" else _run_line(model_arg, share, n, rt),
                      detail={"hit_ratio": r["hit_ratio"], "stall_s": r["stall_s"], "bytes_moved": r["bytes_moved"],
                              "budget_slots": slots, "forecast": fitted if is_predictive(n) else ""})
        out.append(c)
    if trace.hidden_TLH is not None:
        line = _run_line(model_arg, share, "fc-evict", rt) + f" --reuse-probe --fit-trace {trace_ref or 'TRACE'}"
        out.append(probe_candidate(trace, test, pred, ahead, kw, scale, line, fitted))
    o = next(r for r in oracle if r["policy"] == "plec-correct")
    out.append(Candidate(name="plec-correct on the true routing (bound)", system="ExpertFlow PLEC", family="cache",
                         value=o["us_per_token"] * scale, deployable=False, artifact="none (needs the future)",
                         detail={"hit_ratio": o["hit_ratio"]}))
    train = ~test if test is not None else np.ones(trace.num_tokens, bool)
    held = test if test is not None else np.ones(trace.num_tokens, bool)
    rer, _ = _residency_rerouted(trace, train, held, share)
    ideal = rows["lru"]["ideal_us_per_token"] * scale
    out.append(Candidate(
        name="eMoE residency with fallback", system="eMoE", family="residency", value=ideal,
        quality=f"{rer:.1%} of routed slots rerouted; " + emoe_quality_cost(emoe_quality, share),
        artifact=f"routecast run --model {model_arg} --offload --budget {share:.0%} --fallback",
        detail={"rerouted_share": rer, "budget_share": share}))
    return out
