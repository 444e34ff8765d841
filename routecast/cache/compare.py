"""Every cache policy on one trace, ranked by simulated time per token: the function the advisor calls.

`compare_policies(trace, budget=, hardware=, policies=, mask=, forecast=)` replays the kernel's policies
(replay.POLICIES: lru, lfu, lfuda, lru-layer, semoe, plec*, belady) and the policy objects (zoo.py: arc,
s3fifo, lirs, fc-evict, NAME+admit) on the same accesses with the same time model (kernel.py; objreplay.py
for the objects, equal to the kernel's for lru and lfu), LRU and Belady always included, and returns one row
per policy, fastest first, with:

- us_per_token: simulated µs per token (the ranking key); time_gap_closed = (LRU µs - policy µs) / (LRU µs -
  Belady µs) (1 = Belady's time, 0 = LRU's, negative = slower than LRU);
- hit_ratio (on device when the router asks), bytes_per_token (demand loads + prefetches), prefetch_bytes_unused
  (prefetched bytes evicted or left without a use), stall_share (share of the time the compute waits on the
  link), demand_stall_share (the part of it spent waiting for demand loads; None for the kernel's prefetching
  policies, which do not split it), gap_closed (the same gap in hit ratio), predictive (uses a forecast).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from routecast.cache import objreplay, zoo
from routecast.cache.replay import (
    ORACLE,
    POLICIES,
    ReplayConfig,
    add_gap_closed,
    build_accesses,
    compute_seconds,
    forecast_entries,
    parse_budget,
    run_policy,
    true_sets,
)
from routecast.common.errors import ConfigError
from routecast.sim.hardware import Hardware, load_hardware
from routecast.trace import Trace

ALL_POLICIES = [*POLICIES, *(n for n in zoo.DESCRIBE if n not in POLICIES)]


def is_predictive(name: str) -> bool:
    """True when the policy acts on a forecast (kernel PLEC variants, fc-evict, any +admit)."""
    if name in POLICIES:
        return POLICIES[name].forecast
    return zoo.uses_forecast(name)


def check_names(names: Sequence[str]) -> list[str]:
    """Known policy names, in order, duplicates dropped (ConfigError naming the first unknown one)."""
    out = list(dict.fromkeys(names))
    for n in out:
        if n not in POLICIES:
            zoo.split_name(n)  # raises with the list of names
    return out


def compare_policies(trace: Trace, *, budget: str | int, hardware: str | Hardware = "h100-sxm",
                     policies: Sequence[str] = ("lru", "lfu", "arc", "s3fifo", "lirs", "belady"),
                     mask: np.ndarray | None = None, forecast: Any = None, layer_ahead: bool = False,
                     dense_us: float = 0.0, expert_bytes: int = 0,
                     reuse: Sequence[np.ndarray] | None = None) -> list[dict[str, Any]]:
    """Replay `policies` (plus lru and belady) on `trace` -> rows ranked by us_per_token (module docstring).

    trace: a Trace (its rows `mask`, bool (T,), when given: e.g. held-out documents). budget: '50%', an expert
    count or bytes (replay.parse_budget). hardware: a profile name or Hardware (its h2d link moves experts).
    forecast: bool (S, L, E) predicted sets, one per replayed step (needed by predictive policies), or
    'oracle' (each step's true routing). layer_ahead: the forecast is layer-horizon. dense_us: non-expert µs
    per layer. expert_bytes: 0 = the trace's. reuse: predict.reuse_probe.probe_steps of the replayed rows
    (fc-evict's forecast from the router inputs; None = request profiles only). Every row also carries 'rank'
    (1 = fastest) and the budget in slots. This signature is what advise/ calls: keep it stable.
    """
    names = check_names(["lru", *policies, "belady"])
    sub = trace if mask is None else trace.select(np.asarray(mask, bool))
    s = sub.spec
    L, E = s.num_layers, s.num_experts
    eb = expert_bytes or s.expert_bytes
    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    slots = parse_budget(budget, L * E, eb)
    cfg = ReplayConfig(budget=slots, hardware=hw, dense_us=dense_us, expert_bytes=eb)
    acc = build_accesses(sub)
    if isinstance(forecast, str):
        if forecast != ORACLE:
            raise ConfigError(f"forecast is {forecast!r}; expected predicted sets or {ORACLE!r}.")
        forecast = true_sets(acc)
    needs = [n for n in names if is_predictive(n)]
    if needs and forecast is None:
        raise ConfigError(f"policies {', '.join(needs)} need a forecast; pass forecast= sets (S, L, E) or 'oracle'.")
    entries = forecast_entries(acc, np.asarray(forecast, bool)) if forecast is not None else None
    comp = compute_seconds(acc, cfg, eb)
    uses = None
    rows = []
    for n in names:
        if n in POLICIES:
            r = run_policy(acc, n, cfg, forecast=entries if POLICIES[n].forecast else None, layer_ahead=layer_ahead)
            r["prefetch_bytes_unused"] = float((r["prefetches"] - r["useful_prefetches"]) * eb)
            r["demand_stall_s"] = r["stall_s"] if POLICIES[n].demand_only else None
        else:
            if uses is None:
                steps, uses = objreplay.step_uses(sub)
                if not np.array_equal(steps, acc.step_ids):
                    raise RuntimeError("cache compare: request routing and accesses disagree on the steps")
            r = objreplay.replay_objects(n, acc.req_off, acc.req_key, comp, L, E, slots, xfer_s=cfg_xfer(cfg, eb),
                                         dense_s=dense_us * 1e-6, pred_SLE=None if forecast is None else
                                         np.asarray(forecast, bool), uses=uses, num_tokens=acc.num_tokens,
                                         expert_bytes=eb, reuse=reuse)
        r["predictive"] = is_predictive(n)
        rows.append(r)
    add_gap_closed(rows)
    add_time_metrics(rows, acc.num_tokens)
    rows.sort(key=lambda r: r["us_per_token"])
    for i, r in enumerate(rows):
        r["rank"] = i + 1
    return rows


def cfg_xfer(cfg: ReplayConfig, expert_bytes: int) -> float:
    """Seconds to move one expert over the profile's host-to-device link."""
    return expert_bytes / cfg.hardware.h2d_bandwidth


def add_time_metrics(rows: Sequence[dict[str, Any]], num_tokens: int) -> None:
    """Set time_gap_closed, bytes_per_token, stall_share and demand_stall_share on replay rows (in place)."""
    by = {r["policy"]: r["us_per_token"] for r in rows}
    lru, bel = by.get("lru"), by.get("belady")
    for r in rows:
        gap = None if lru is None or bel is None or lru - bel <= 1e-12 else (lru - r["us_per_token"]) / (lru - bel)
        r["time_gap_closed"] = gap
        r["bytes_per_token"] = r["bytes_moved"] / max(num_tokens, 1)
        sim = r["sim_s"]
        r["stall_share"] = r["stall_s"] / sim if sim > 0 else 0.0
        ds = r.get("demand_stall_s")
        r["demand_stall_share"] = None if ds is None else (ds / sim if sim > 0 else 0.0)
