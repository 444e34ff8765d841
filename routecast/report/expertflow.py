"""ExpertFlow in the demo report: expert-cache policies at three budgets (hit ratio plot, gap to Belady,
stall) and token re-batching, on the demo's trace.

Small settings so the section stays quick: one predictor, the MoE-GPS token table (`conditional-token`,
fitted in about a second) instead of the trained routing-path transformer, fitted once on 80% of the
documents and used for both PLEC's forecast and the re-batching paths; every policy is replayed on the
held-out requests. The numbers come from routecast.cache and routecast.schedule; this module only runs
them with those settings, draws and lays them out.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from routecast.cache.compare import compare_policies
from routecast.cache.forecasts import forecast_sets
from routecast.cache.replay import ReplayConfig, replay
from routecast.common.errors import ConfigError
from routecast.predict.batch_eval import token_sets
from routecast.predict.evaluate import fit_or_load, heldout
from routecast.predict.reuse_probe import fit_reuse_probe, probe_steps
from routecast.report.html import Section, figure, paragraph, table
from routecast.report.plots import save_figure
from routecast.schedule.rebatch import METHODS, activated_experts, rebatch, step_sets
from routecast.sim.hardware import load_hardware
from routecast.trace import Trace

POLICIES = ("lru", "lfu", "lfuda", "lru-layer", "arc", "s3fifo", "lirs", "plec", "plec-correct", "fc-evict", "belady")
BUDGETS = (0.25, 0.5, 0.75)


def plot_hit_vs_budget(rows: list[dict[str, Any]], png: str | Path, title: str = "") -> Path:
    """Hit ratio vs budget (% of all experts), one line per policy, from rows with policy/budget_pct/hit."""
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.add_subplot()
    for pol in dict.fromkeys(r["policy"] for r in rows):
        pts = sorted((r["budget_pct"], r["hit"]) for r in rows if r["policy"] == pol)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", lw=1.3, label=pol,
                ls="--" if pol == "belady" else "-")
    ax.set_xlabel("device budget (% of all L x E experts)")
    ax.set_ylabel("hit ratio (on the device when the router asks)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return save_figure(fig, png)


def cache_rows(test: Trace, pred_SLE: np.ndarray, layer_ahead: bool, hardware: str,
               reuse: list[np.ndarray] | None = None) -> list[dict[str, Any]]:
    """One row per (budget, policy) of POLICIES at BUDGETS on `test` with the forecast pred_SLE (S, L, E) (and
    fc-evict's reuse probe forecasts, predict.reuse_probe.probe_steps of `test`, when given)."""
    s = test.spec
    n_keys = s.num_layers * s.num_experts
    out = []
    for frac in BUDGETS:
        budget = max(1, int(round(frac * n_keys)))
        names = [p for p in POLICIES if p != "lru-layer" or budget >= s.num_layers]
        for r in compare_policies(test, budget=budget, hardware=hardware, policies=names, forecast=pred_SLE,
                                  layer_ahead=layer_ahead, reuse=reuse):
            tg = r["time_gap_closed"]
            out.append({"budget_pct": round(100 * frac), "policy": r["policy"], "us_per_token": r["us_per_token"],
                        "time_gap_closed_pct": float("nan") if tg is None else 100 * tg, "hit": r["hit_ratio"],
                        "covered": r["covered_ratio"], "gap_closed_pct": 100 * r["gap_closed"],
                        "MB_moved": r["bytes_moved"] / 1e6, "stall_ms": 1e3 * r["stall_s"]})
    return out


def rebatch_rows(test: Trace, paths_TLE: np.ndarray, hardware: str, policy: str = "plec-correct",
                 seed: int = 0) -> list[dict[str, Any]]:
    """Arrival-order vs path-clustered half-batches of each decode step, priced by `policy` at 50%."""
    s = test.spec
    cfg = ReplayConfig(budget=max(1, round(0.5 * s.num_layers * s.num_experts)), hardware=load_hardware(hardware),
                       expert_bytes=s.expert_bytes)
    rows = []
    for m in METHODS:
        t = rebatch(test, paths_TLE, m, seed=seed)
        ae = activated_experts(t)
        r = next(x for x in replay(t, [policy], cfg, pred_SLE=step_sets(t, paths_TLE)) if x["policy"] == policy)
        rows.append({"method": m, "batches": int(len(ae)), "activated_per_batch": float(ae.mean()),
                     "hit": r["hit_ratio"], "stall_ms": 1e3 * r["stall_s"], "us_per_token": r["us_per_token"]})
    return rows


def _skipped(title: str, why: str) -> tuple[Section, dict[str, Any]]:
    sec = Section(key="expertflow", title=title)
    sec.parts.append(paragraph(f"Skipped: {why}"))
    return sec, {"skipped": why}


def section_expertflow(trace: Trace, out_dir: str | Path, *, predictor: str = "conditional-token",
                       hardware: str = "h100-sxm", seed: int = 0) -> tuple[Section, dict[str, Any]]:
    """Demo-report section (writes expertflow_hit.png into out_dir) -> (Section, summary dict)."""
    title = "ExpertFlow: expert caching and re-batching (simulated)"
    if not trace.spec.expert_bytes:
        return _skipped(title, "the trace records no expert size (expert_bytes = 0), so transfers cannot be priced; "
                               "pass --expert-bytes to `routecast cache replay`")
    try:
        train, test, used = heldout(trace, "document", 0.8, seed)
    except ConfigError as e:  # too few requests to hold any out
        return _skipped(title, str(e))
    pred = fit_or_load(predictor, train, model=None, seed=seed, threads=1, quiet=True)
    pred_SLE, layer_ahead = forecast_sets(pred, test)
    reuse = None
    if train.hidden_TLH is not None and test.hidden_TLH is not None:  # fc-evict reads the probe of the router inputs
        reuse = probe_steps(fit_reuse_probe(train), test)
    rows = cache_rows(test, pred_SLE, layer_ahead, hardware, reuse)
    png = plot_hit_vs_budget(rows, Path(out_dir) / "expertflow_hit.png",
                             title=f"{test.num_tokens} held-out tokens, {hardware}, forecast {predictor}")
    reb = rebatch_rows(test, token_sets(pred, test), hardware, seed=seed)
    speedup = reb[0]["us_per_token"] / reb[1]["us_per_token"]
    at50 = {r["policy"]: r for r in rows if r["budget_pct"] == 50}
    pc = at50["plec-correct"]
    lru = at50["lru"]
    sec = Section(key="expertflow", title=title)
    sec.parts.append(paragraph(
        f"Replay of the held-out {used}s ({test.num_tokens} tokens, {train.num_tokens} used to fit the forecast) "
        f"through expert-cache policies with device slots for 25/50/75% of all {trace.spec.num_layers} x "
        f"{trace.spec.num_experts} experts in one pool (lru-layer: split per layer), transfers over {hardware}'s "
        "host-to-device link. Hit = on the device when the router asks; gap closed = share of the LRU-to-Belady "
        f"hit-ratio gap. Demo settings: PLEC's forecast is the MoE-GPS token table ({predictor}), not the "
        "trained routing-path transformer (see `routecast cache replay --predictor expertflow` and "
        "benchmarks/cache_policies.py for the full runs)."))
    gap = pc["gap_closed_pct"]
    sec.parts.append(paragraph(
        f"At 50%: plec-correct hit {pc['hit']:.3f} vs LRU {lru['hit']:.3f} "
        f"({100 * (pc['hit'] - lru['hit']):+.1f} points; ExpertFlow reports +15-35), "
        + (f"{gap:.0f}% of the gap to Belady ({at50['belady']['hit']:.3f}) closed; " if math.isfinite(gap) else "")
        + f"stall {pc['stall_ms']:.2f} ms vs LRU {lru['stall_ms']:.2f} ms and Belady {at50['belady']['stall_ms']:.2f} ms "
        "(time follows bytes moved: PLEC also moves its mispredicted prefetches)."))
    fastest = [r for r in rows if r["budget_pct"] == 50 and r["policy"] != "belady"][:3]
    sec.parts.append(paragraph(
        "Ranked by simulated time at 50% (what a user pays): " + ", ".join(
            f"{r['policy']} {r['us_per_token']:.2f} µs/token ({r['time_gap_closed_pct']:.0f}% of LRU's time gap to "
            "Belady closed)" for r in fastest)
        + f"; LRU {lru['us_per_token']:.2f}, Belady {at50['belady']['us_per_token']:.2f}, plec-correct "
        f"{pc['us_per_token']:.2f}. fc-evict evicts by predicted next use and moves no extra bytes"
        + (", reading the reuse probe of the router inputs (fitted on the same training documents)." if reuse is not None
           else ".")))
    sec.parts.append(figure(png, "Hit ratio vs budget per policy (Belady: the offline bound for demand caching)."))
    sec.parts.append(table(rows))
    sec.parts.append(paragraph(
        "Token re-batching (ExpertFlow's scheduler): each decode step of 4+ held-out tokens split in two batches, "
        "by arrival or by balanced 2-means on the predicted paths (k-means-constrained); activated experts counted "
        f"on the true routing, time priced by plec-correct at 50%: clustered is {speedup:.3f}x arrival order "
        "in simulated time per token (ExpertFlow: up to 1.15x at batch 32)."))
    sec.parts.append(table(reb))
    return sec, {"predictor": predictor, "hardware": hardware, "rows": rows, "rebatch": reb,
                 "rebatch_speedup": speedup}
