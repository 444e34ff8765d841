"""Replay a trace through expert-cache policies: the policy table, inputs for the kernel, metrics.

An *access* is one MoE layer of one forward step: the union of the experts that the step's tokens route
to at that layer (ExpertFlow eq. 7's bit-wise OR), each computed once for all its tokens; a step is L
accesses in layer order. Hit ratio = required (access, expert) pairs whose weights are on the device
when the router asks for them / all required pairs; covered ratio also counts prefetches still in flight
then (no demand load is needed, but the layer waits: that wait is in the stall time). The kernel's
timing model is in kernel.py. Keys are (layer, expert); the budget counts expert slots, in one pool shared
by all layers (ExpertFlow) or split evenly per layer (Cache-MoE's per-layer LRU).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from routecast.cache import kernel as K
from routecast.common.errors import ConfigError
from routecast.sim.hardware import Hardware
from routecast.trace import Trace
from routecast.trace.stats_kernels import add_group_counts

# Rows per window when the accesses are built: a window of small decode steps (16 tokens each) holds
# 1,024 steps x L x E int32 counts, 61 MB at DeepSeek-V3 geometry.
ACCESS_ROWS = 16384


@dataclass(frozen=True, kw_only=True)
class Policy:
    """One cache policy as the kernel runs it (see kernel.py for each code's priority)."""

    code: int
    describe: str
    per_layer: bool = False
    correct: bool = False
    priority_demand: int = K.DEMAND_FIFO
    forecast: bool = False
    demand_only: bool = True


POLICIES: dict[str, Policy] = {
    "lru": Policy(code=K.LRU, describe="least recently used, one pool"),
    "lfu": Policy(code=K.LFU, describe="least frequently used (counts kept across evictions), recency ties"),
    "lfuda": Policy(code=K.LFUDA, describe="LFU with dynamic aging (in-cache counts + the pool's age)"),
    "lru-layer": Policy(code=K.LRU, per_layer=True, describe="per-layer LRU, fixed slots per layer (Cache-MoE)"),
    "semoe": Policy(code=K.SEMOE, demand_only=False,
                    describe="SE-MoE: prefetch the next layer's experts (most used first), LRU eviction"),
    "plec": Policy(code=K.PLEC, forecast=True, demand_only=False,
                   describe="ExpertFlow PLEC: prefetch the forecast's experts, nearest layer first"),
    "plec-correct": Policy(code=K.PLEC, forecast=True, demand_only=False, correct=True, priority_demand=K.DEMAND_SLACK,
                           describe="PLEC + real-time correction: mispredicted experts are evicted first; misses "
                                    "overtake queued prefetches that can spare the time"),
    "plec-correct-eager": Policy(code=K.PLEC, forecast=True, demand_only=False, correct=True,
                                 priority_demand=K.DEMAND_EAGER,
                                 describe="PLEC + correction, misses overtake every queued prefetch (late prefetches)"),
    "plec-correct-fifo": Policy(code=K.PLEC, forecast=True, demand_only=False, correct=True,
                                describe="PLEC + correction of the victims only: misses queue behind prefetches"),
    "belady": Policy(code=K.BELADY, describe="Belady MIN: evict the expert needed farthest ahead (offline bound)"),
}


@dataclass(frozen=True, kw_only=True)
class ReplayConfig:
    """budget: expert slots (all layers together). hardware: its h2d link moves experts, its HBM and peak
    price expert compute. dense_us: non-expert time per layer before the router (attention etc.), µs.
    plec_fallback: "lfu" | "lru", how PLEC ranks experts with no predicted use left in the step.
    plec_depth: layers ahead whose forecast PLEC prefetches (the rest only protects from eviction).
    expert_bytes: bytes per expert (0 = the trace's spec). dtype_bytes: bytes per weight, for FLOPs."""

    budget: int
    hardware: Hardware
    dense_us: float = 0.0
    plec_fallback: str = "lfu"
    plec_depth: int = 1
    expert_bytes: int = 0
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        if self.plec_fallback not in ("lfu", "lru"):
            raise ConfigError(f"plec_fallback is {self.plec_fallback!r}; expected 'lfu' or 'lru'.")
        if self.plec_depth < 1:
            raise ConfigError(f"plec_depth is {self.plec_depth}; expected at least 1 layer.")
        if self.dense_us < 0:
            raise ConfigError(f"dense_us is {self.dense_us}; expected a non-negative number of microseconds.")
        if self.hardware.h2d_bandwidth <= 0:
            raise ConfigError(
                f"hardware '{self.hardware.name}' has no host-to-device link (h2d_gbps = 0); expected a GPU profile."
            )


@dataclass(frozen=True)
class Accesses:
    """The kernel's input for one trace. A = steps·L; N required entries; keys = layer·E + expert.

    req_off (A+1,), req_key (N,) int64, req_tokens (N,) int64 tokens routed to that expert, req_next (N,)
    float64 next access needing the key (kernel.NEVER if none); step_ids (S,) the trace's step numbers.
    """

    L: int
    E: int
    req_off: np.ndarray
    req_key: np.ndarray
    req_tokens: np.ndarray
    req_next: np.ndarray
    step_ids: np.ndarray
    num_tokens: int

    @property
    def num_accesses(self) -> int:
        return len(self.req_off) - 1


def step_windows(trace: Trace, rows: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The trace in windows of whole steps, in step order -> yields (step value (n,), experts_nLK int16 (n, L, K)).

    Trace.step_chunks: about `rows` rows at a time (default CHUNK_ROWS), one shard of a lazy trace mapped at a
    time; a trace whose steps are not sorted comes as one window.
    """
    for _, ch in trace.step_chunks(rows):
        yield np.asarray(ch.tokens["step"]), np.asarray(ch.experts_TLK)


def build_accesses(trace: Trace, rows: int | None = ACCESS_ROWS) -> Accesses:
    """Per (step, layer) the distinct experts and their token counts, in step then layer order.

    The routing is read window by window (step_windows, `rows` rows at a time) and counted per (step, layer,
    expert) by a compiled kernel: only the distinct entries are kept, never (T, L, K) index arrays; a window
    holds (steps in it, L, E) int32 counts.
    """
    s = trace.spec
    L, E = s.num_layers, s.num_experts
    steps, uniq_parts, count_parts = [], [], []
    s0 = 0
    for step, ids in step_windows(trace, rows):
        step_ids, sidx = np.unique(step, return_inverse=True)
        c = add_group_counts(ids, sidx, np.zeros((step_ids.size, L, E), np.int32))  # tokens per (step, layer, expert)
        flat = np.flatnonzero(c)  # increasing: step, then layer, then expert order
        steps.append(step_ids)
        uniq_parts.append(flat + s0 * L * E)
        count_parts.append(c.ravel()[flat])
        s0 += step_ids.size
    step_ids = np.concatenate(steps) if steps else np.zeros(0, np.int64)
    uniq = np.concatenate(uniq_parts) if uniq_parts else np.zeros(0, np.int64)
    counts = np.concatenate(count_parts) if count_parts else np.zeros(0, np.int64)
    A = len(step_ids) * L
    acc = uniq // E
    key = (acc % L) * E + uniq % E
    req_off = np.searchsorted(acc, np.arange(A + 1)).astype(np.int64)
    # Belady's next use: sort entries by key then access; the next entry of the same key is its next use.
    order = np.lexsort((acc, key))
    nxt = np.full(len(uniq), K.NEVER)
    same = key[order][1:] == key[order][:-1]
    nxt[order[:-1][same]] = acc[order][1:][same]
    return Accesses(L=L, E=E, req_off=req_off, req_key=key, req_tokens=counts.astype(np.int64), req_next=nxt,
                    step_ids=step_ids, num_tokens=trace.num_tokens)


def forecast_entries(acc: Accesses, pred_SLE: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Predicted batch sets bool (S, L, E) -> (pred_off (A+1,), pred_key (M,)) in access order."""
    if pred_SLE.shape != (len(acc.step_ids), acc.L, acc.E):
        raise ConfigError(
            f"forecast sets have shape {pred_SLE.shape}; expected ({len(acc.step_ids)}, {acc.L}, {acc.E})."
        )
    s_i, l_i, e_i = np.nonzero(pred_SLE)
    a = s_i.astype(np.int64) * acc.L + l_i
    off = np.searchsorted(a, np.arange(acc.num_accesses + 1)).astype(np.int64)
    return off, (l_i.astype(np.int64) * acc.E + e_i)


def true_sets(acc: Accesses) -> np.ndarray:
    """The accesses' true expert sets as bool (S, L, E) (the 'oracle' forecast)."""
    out = np.zeros(len(acc.step_ids) * acc.L * acc.E, dtype=bool)
    a = np.repeat(np.arange(acc.num_accesses), np.diff(acc.req_off))
    out[a * acc.E + acc.req_key % acc.E] = True
    return out.reshape(len(acc.step_ids), acc.L, acc.E)


_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_budget(text: str | int, num_keys: int, expert_bytes: int, where: str = "--budget") -> int:
    """'50%' (of all L·E experts), '96' (experts) or '12GB' / '800MiB' (bytes) -> expert slots in 1..L·E."""
    raw = str(text).strip().lower()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(%|[kmgt]i?b|b)?", raw)
    if not m:
        raise ConfigError(f"{where} is {text!r}; expected a percentage ('50%'), an expert count ('96') or bytes ('12GB').")
    v, unit = float(m.group(1)), m.group(2)
    if unit == "%":
        n = int(round(v / 100.0 * num_keys))
    elif unit:
        if expert_bytes <= 0:
            raise ConfigError(f"{where} is {text!r} in bytes but the trace records no expert size; pass --expert-bytes.")
        n = int(v * _UNITS[unit] // expert_bytes)
    else:
        if v != int(v):
            raise ConfigError(f"{where} is {text!r}; an expert count must be a whole number.")
        n = int(v)
    if not 1 <= n <= num_keys:
        raise ConfigError(f"{where} is {text!r} = {n} expert slot(s); expected 1..{num_keys} (all L·E experts).")
    return n


def _pools(acc: Accesses, budget: int, per_layer: bool) -> tuple[np.ndarray, ...]:
    Kn = acc.L * acc.E
    if not per_layer:
        return np.zeros(Kn, np.int64), np.array([budget], np.int64), np.arange(Kn, dtype=np.int64), np.array([0, Kn], np.int64)
    base, extra = divmod(budget, acc.L)
    if base == 0:
        raise ConfigError(f"--budget of {budget} expert slot(s) leaves layers with none when split over {acc.L} layers; "
                          f"expected at least {acc.L} for a per-layer policy.")
    cap = np.full(acc.L, base, np.int64)
    cap[:extra] += 1
    keys = np.arange(Kn, dtype=np.int64)
    return keys // acc.E, cap, keys, np.arange(acc.L + 1, dtype=np.int64) * acc.E


def compute_seconds(acc: Accesses, cfg: ReplayConfig, expert_bytes: int) -> np.ndarray:
    """(N,) seconds to run each required expert on its tokens: max(weights / HBM, FLOPs / (η(n)·peak))."""
    hw = cfg.hardware
    flops_per_token = 2.0 * expert_bytes / cfg.dtype_bytes  # 2 FLOPs per weight per token
    n = acc.req_tokens.astype(np.float64)
    return np.maximum(expert_bytes / hw.mem_effective, n * flops_per_token / (hw.eta(n) * hw.peak_flops))


def run_policy(acc: Accesses, name: str, cfg: ReplayConfig, *, forecast: tuple[np.ndarray, np.ndarray] | None = None,
               layer_ahead: bool = False, log: bool = False, expert_bytes: int = 0) -> dict[str, Any]:
    """Replay `acc` under POLICIES[name]; returns the metrics dict (and 'log' with the event log if asked)."""
    pol = POLICIES.get(name)
    if pol is None:
        raise ConfigError(f"policy {name!r} is unknown; expected one of {', '.join(POLICIES)}.")
    eb = expert_bytes or cfg.expert_bytes
    if eb <= 0:
        raise ConfigError("expert size is unknown (the trace's spec has expert_bytes = 0); pass --expert-bytes.")
    if pol.forecast and forecast is None:
        raise ConfigError(f"policy {name!r} needs a forecast; pass --predictor NAME|DIR (or 'oracle').")
    pred_off, pred_key = forecast if pol.forecast else (np.zeros(acc.num_accesses + 1, np.int64), np.zeros(0, np.int64))
    pool_of, cap, pool_keys, pool_off = _pools(acc, cfg.budget, pol.per_layer)
    comp = compute_seconds(acc, cfg, eb)
    dense = np.full(acc.num_accesses, cfg.dense_us * 1e-6)
    xfer = eb / cfg.hardware.h2d_bandwidth
    t0 = time.thread_time()  # CPU time of this thread: the figure for "one core" on a shared machine
    out = K.replay_kernel(pol.code, pol.correct, pol.priority_demand, 0 if cfg.plec_fallback == "lru" else 1,
                          layer_ahead, cfg.plec_depth, acc.L, acc.E, pool_of, cap, pool_keys, pool_off, acc.req_off, acc.req_key,
                          comp, acc.req_next, pred_off, pred_key, dense, xfer, log)
    wall = time.thread_time() - t0
    hits, on_time, misses, pref, evs, stall, end, useful, events, overflow = out
    req = int(len(acc.req_key))
    sim_s = float(end[-1]) if len(end) else 0.0
    ideal = float(comp.sum() + dense.sum())
    row: dict[str, Any] = {
        "policy": name,
        "budget": cfg.budget,
        "hit_ratio": float(on_time.sum()) / max(req, 1),
        "covered_ratio": float(hits.sum()) / max(req, 1),
        "demand_loads": int(misses.sum()),
        "prefetches": int(pref.sum()),
        "useful_prefetches": int(useful),
        "evictions": int(evs.sum()),
        "bytes_moved": float((misses.sum() + pref.sum()) * eb),
        "stall_s": float(stall.sum()),
        "sim_s": sim_s,
        "us_per_token": 1e6 * sim_s / max(acc.num_tokens, 1),
        "ideal_us_per_token": 1e6 * ideal / max(acc.num_tokens, 1),
        "requests": req,
        "replay_s": wall,
        "events_per_s": acc.num_tokens * acc.L / wall if wall > 0 else float("inf"),
    }
    if log:
        row["log"] = events
        row["log_overflow"] = bool(overflow)
        row["misses_A"] = misses
        row["hits_A"] = hits
    return row


def add_gap_closed(rows: Sequence[dict[str, Any]]) -> None:
    """Set each row's 'gap_closed' = (hit - hit_LRU) / (hit_Belady - hit_LRU) (NaN when the gap is 0)."""
    by = {r["policy"]: r["hit_ratio"] for r in rows}
    lru, bel = by.get("lru"), by.get("belady")
    for r in rows:
        if lru is None or bel is None or bel - lru <= 1e-12:
            r["gap_closed"] = float("nan")
        else:
            r["gap_closed"] = (r["hit_ratio"] - lru) / (bel - lru)


def replay(trace: Trace, policies: Sequence[str], cfg: ReplayConfig, *, pred_SLE: np.ndarray | None = None,
           layer_ahead: bool = False) -> list[dict[str, Any]]:
    """Run each policy over `trace` (LRU and Belady are always run: they anchor 'gap_closed').

    pred_SLE: bool (S, L, E) forecast batch sets, one per step of the trace (needed by PLEC policies).
    layer_ahead: the forecast is layer-horizon (layer l known at layer l-1's start).
    """
    names = list(dict.fromkeys(["lru", *policies, "belady"]))
    for n in names:
        if n not in POLICIES:
            raise ConfigError(f"--policies holds {n!r}; expected names from {', '.join(POLICIES)}.")
    acc = build_accesses(trace)
    eb = cfg.expert_bytes or trace.spec.expert_bytes
    fc = None if pred_SLE is None else forecast_entries(acc, pred_SLE)
    rows = [run_policy(acc, n, cfg, forecast=fc, layer_ahead=layer_ahead, expert_bytes=eb) for n in names]
    add_gap_closed(rows)
    for r in rows:
        r["shown"] = r["policy"] in policies
    return rows
