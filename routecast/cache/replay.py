"""Replay a trace through expert-cache policies: the policy table, inputs for the kernel, metrics.

An *access* is one MoE layer of one forward step: the union of the experts that the step's tokens route
to at that layer (ExpertFlow eq. 7's bit-wise OR), each computed once for all its tokens; a step is L
accesses in layer order. Hit ratio = required (access, expert) pairs whose weights are on the device
when the router asks for them / all required pairs; covered ratio also counts prefetches still in flight
then (no demand load is needed, but the layer waits: that wait is in the stall time). The kernel's
timing model is in kernel.py. Keys are (layer, expert); the budget counts expert slots, in one pool shared
by all layers (ExpertFlow) or split evenly per layer (Cache-MoE's per-layer LRU).

`replay` streams a trace of any size: every policy (a PolicyRun) advances through one window of accesses
(stream.py) before the next is built, so memory is bounded by the window; `run_policy` replays accesses
already in memory (tests, benchmarks, the runtime's log), in one window or several (the same result).
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from routecast.cache import kernel as K
from routecast.cache import stream
from routecast.cache.stream import (
    ACCESS_ROWS,
    AccessWindow,
    NextUseFile,
    access_windows,
    first_use,
    forecast_window,
    next_use,
)
from routecast.common.errors import ConfigError
from routecast.sim.hardware import Hardware
from routecast.trace import Trace


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
        if not math.isfinite(self.dense_us) or self.dense_us < 0:  # NaN would price every step as NaN
            raise ConfigError(f"dense_us is {self.dense_us}; expected a finite non-negative number of microseconds.")
        if self.expert_bytes < 0:
            raise ConfigError(f"expert_bytes is {self.expert_bytes}; expected a positive byte count (0 = the trace's spec).")
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


def build_accesses(trace: Trace, rows: int | None = ACCESS_ROWS) -> Accesses:
    """The whole trace's accesses in memory: per (step, layer) the distinct experts and their token counts,
    in step then layer order, with Belady's next use (stream.access_windows, concatenated: for traces that
    fit in memory, tests and benchmarks; `replay` streams instead)."""
    L, E = trace.spec.num_layers, trace.spec.num_experts
    wins = list(access_windows(trace, rows))
    step_ids = np.concatenate([w.step_ids for w in wins]) if wins else np.zeros(0, np.int64)
    key = np.concatenate([w.req_key for w in wins]) if wins else np.zeros(0, np.int64)
    counts = np.concatenate([w.req_tokens for w in wins]) if wins else np.zeros(0, np.int64)
    sizes = np.concatenate([np.diff(w.req_off) for w in wins]) if wins else np.zeros(0, np.int64)
    req_off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    whole = AccessWindow(step_ids=step_ids, req_off=req_off, req_key=key, req_tokens=counts, num_tokens=trace.num_tokens)
    return Accesses(L=L, E=E, req_off=req_off, req_key=key, req_tokens=counts,
                    req_next=next_use(whole, 0, np.full(L * E, K.NEVER)), step_ids=step_ids,
                    num_tokens=trace.num_tokens)


def forecast_entries(acc: Accesses, pred_SLE: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Predicted batch sets bool (S, L, E) -> (pred_off (A+1,), pred_key (M,)) in access order."""
    if pred_SLE.shape != (len(acc.step_ids), acc.L, acc.E):
        raise ConfigError(
            f"forecast sets have shape {pred_SLE.shape}; expected ({len(acc.step_ids)}, {acc.L}, {acc.E})."
        )
    return forecast_window(pred_SLE)


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


def _pools(L: int, E: int, budget: int, per_layer: bool) -> tuple[np.ndarray, ...]:
    Kn = L * E
    if not per_layer:
        return np.zeros(Kn, np.int64), np.array([budget], np.int64), np.arange(Kn, dtype=np.int64), np.array([0, Kn], np.int64)
    base, extra = divmod(budget, L)
    if base == 0:
        raise ConfigError(f"--budget of {budget} expert slot(s) leaves layers with none when split over {L} layers; "
                          f"expected at least {L} for a per-layer policy.")
    cap = np.full(L, base, np.int64)
    cap[:extra] += 1
    keys = np.arange(Kn, dtype=np.int64)
    return keys // E, cap, keys, np.arange(L + 1, dtype=np.int64) * E


def _compute_s(req_tokens: np.ndarray, cfg: ReplayConfig, expert_bytes: int) -> np.ndarray:
    hw = cfg.hardware
    flops_per_token = 2.0 * expert_bytes / cfg.dtype_bytes  # 2 FLOPs per weight per token
    n = req_tokens.astype(np.float64)
    return np.maximum(expert_bytes / hw.mem_effective, n * flops_per_token / (hw.eta(n) * hw.peak_flops))


def compute_seconds(acc: Accesses, cfg: ReplayConfig, expert_bytes: int) -> np.ndarray:
    """(N,) seconds to run each required expert on its tokens: max(weights / HBM, FLOPs / (η(n)·peak))."""
    return _compute_s(acc.req_tokens, cfg, expert_bytes)


class PolicyRun:
    """One policy replayed window by window: feed() each window of whole steps in order, then result().

    The kernel's state (kernel.new_state: the cache, heaps, link queue, clock) goes from one window to the
    next, so any windowing gives bit-for-bit the same result; memory is the state (O(L·E)) plus a window.
    """

    def __init__(self, name: str, cfg: ReplayConfig, L: int, E: int, expert_bytes: int, *, layer_ahead: bool = False,
                 log: bool = False) -> None:
        pol = POLICIES.get(name)
        if pol is None:
            raise ConfigError(f"policy {name!r} is unknown; expected one of {', '.join(POLICIES)}.")
        if expert_bytes <= 0:
            raise ConfigError("expert size is unknown (the trace's spec has expert_bytes = 0); pass --expert-bytes.")
        self.name, self.pol, self.cfg, self.L, self.E, self.eb = name, pol, cfg, L, E, expert_bytes
        self.layer_ahead, self.log = layer_ahead, log
        self.pools = _pools(L, E, cfg.budget, pol.per_layer)
        self.state = K.new_state(pol.code, L, E, self.pools[3])
        self.xfer = expert_bytes / cfg.hardware.h2d_bandwidth
        self.counts = np.zeros(5, np.int64)  # hits, on time, misses, prefetches, evictions
        self.requests = 0
        self.cpu_s = 0.0
        self.parts: list[tuple[np.ndarray, ...]] = []

    def feed(self, a0: int, req_off: np.ndarray, req_key: np.ndarray, req_tokens: np.ndarray, req_next: np.ndarray,
             pred_off: np.ndarray | None = None, pred_key: np.ndarray | None = None, *,
             comp: np.ndarray | None = None) -> None:
        """Replay accesses a0 .. a0+W-1 (window-local CSR, req_next global; see kernel.replay_window).
        comp: the entries' compute seconds when the caller has them (the same for every policy)."""
        W = len(req_off) - 1
        if not self.pol.forecast or pred_off is None or pred_key is None:
            pred_off, pred_key = np.zeros(W + 1, np.int64), np.zeros(0, np.int64)
        comp = _compute_s(req_tokens, self.cfg, self.eb) if comp is None else comp
        dense = np.full(W, self.cfg.dense_us * 1e-6)
        pol, cfg = self.pol, self.cfg
        pool_of, cap, pool_keys, pool_off = self.pools
        t0 = time.thread_time()  # CPU time of this thread: the figure for "one core" on a shared machine
        out = K.replay_window(pol.code, pol.correct, pol.priority_demand, 0 if cfg.plec_fallback == "lru" else 1,
                              self.layer_ahead, cfg.plec_depth, self.L, self.E, pool_of, cap, pool_keys, pool_off,
                              self.state, a0, req_off, req_key, comp, req_next, pred_off, pred_key, dense, self.xfer,
                              self.log)
        self.cpu_s += time.thread_time() - t0
        hits, on_time, misses, pref, evs, _stall, _end, events = out
        self.counts += [hits.sum(), on_time.sum(), misses.sum(), pref.sum(), evs.sum()]
        self.requests += len(req_key)
        if self.log:
            self.parts.append((events, misses, hits))

    def result(self, num_tokens: int) -> dict[str, Any]:
        """The metrics dict of everything fed (and 'log', 'misses_A', 'hits_A' if asked)."""
        hits, on_time, misses, pref, evs = (int(x) for x in self.counts)
        sf, si = self.state[-2], self.state[-1]
        req, eb, wall = self.requests, self.eb, self.cpu_s
        sim_s = float(sf[K.F_CLOCK])
        row: dict[str, Any] = {
            "policy": self.name,
            "budget": self.cfg.budget,
            "hit_ratio": on_time / max(req, 1),
            "covered_ratio": hits / max(req, 1),
            "demand_loads": misses,
            "prefetches": pref,
            "useful_prefetches": int(si[K.I_USEFUL]),
            "evictions": evs,
            "bytes_moved": float((misses + pref) * eb),
            "stall_s": float(sf[K.F_STALL]),
            "sim_s": sim_s,
            "us_per_token": 1e6 * sim_s / max(num_tokens, 1),
            "ideal_us_per_token": 1e6 * float(sf[K.F_IDEAL]) / max(num_tokens, 1),
            "requests": req,
            "replay_s": wall,
            "events_per_s": num_tokens * self.L / wall if wall > 0 else float("inf"),
        }
        if self.log:
            parts = list(zip(*self.parts, strict=True)) or [[np.zeros((0, 3), np.int64)], [np.zeros(0, np.int64)],
                                                             [np.zeros(0, np.int64)]]
            row["log"], row["misses_A"], row["hits_A"] = (np.concatenate(p) for p in parts)
            row["log_overflow"] = bool(si[K.I_OVERFLOW])
        return row


def run_policy(acc: Accesses, name: str, cfg: ReplayConfig, *, forecast: tuple[np.ndarray, np.ndarray] | None = None,
               layer_ahead: bool = False, log: bool = False, expert_bytes: int = 0,
               window_steps: int | None = None) -> dict[str, Any]:
    """Replay in-memory accesses `acc` under POLICIES[name]; returns the metrics dict (and 'log' with the event
    log if asked). window_steps: steps per kernel call (None = all at once; the result is the same)."""
    pol = POLICIES.get(name)
    if pol is not None and pol.forecast and forecast is None:
        raise ConfigError(f"policy {name!r} needs a forecast; pass --predictor NAME|DIR (or 'oracle').")
    run = PolicyRun(name, cfg, acc.L, acc.E, expert_bytes or cfg.expert_bytes, layer_ahead=layer_ahead, log=log)
    pred_off, pred_key = forecast if forecast is not None else (np.zeros(acc.num_accesses + 1, np.int64),
                                                                 np.zeros(0, np.int64))
    S, L = len(acc.step_ids), acc.L
    ws = window_steps or max(S, 1)
    for s in range(0, max(S, 1), ws):
        lo, hi = s * L, min(S, s + ws) * L
        r0, r1, m0, m1 = acc.req_off[lo], acc.req_off[hi], pred_off[lo], pred_off[hi]
        run.feed(lo, acc.req_off[lo:hi + 1] - r0, acc.req_key[r0:r1], acc.req_tokens[r0:r1], acc.req_next[r0:r1],
                 pred_off[lo:hi + 1] - m0, pred_key[m0:m1])
    return run.result(acc.num_tokens)


def add_gap_closed(rows: Sequence[dict[str, Any]]) -> None:
    """Set each row's 'gap_closed' = (hit - hit_LRU) / (hit_Belady - hit_LRU) (NaN when the gap is 0)."""
    by = {r["policy"]: r["hit_ratio"] for r in rows}
    lru, bel = by.get("lru"), by.get("belady")
    for r in rows:
        if lru is None or bel is None or bel - lru <= 1e-12:
            r["gap_closed"] = float("nan")
        else:
            r["gap_closed"] = (r["hit_ratio"] - lru) / (bel - lru)


ORACLE = "oracle"  # pred_SLE="oracle": each step's true routing as the forecast (PLEC's upper bound)


def replay(trace: Trace, policies: Sequence[str], cfg: ReplayConfig, *, pred_SLE: Any = None,
           layer_ahead: bool = False, mask: np.ndarray | None = None, rows: int | None = None,
           tmp_dir: str | Path | None = None, progress: bool = False) -> list[dict[str, Any]]:
    """Run each policy over `trace`, streaming it window by window (LRU and Belady are always run: they
    anchor 'gap_closed'); every policy advances through one window before the next is built.

    pred_SLE: the forecast batch sets, one per replayed step (needed by PLEC policies): a bool (S, L, E)
    array, a stream.PackedSets, or ORACLE. layer_ahead: the forecast is layer-horizon (layer l known at
    layer l-1's start). mask: bool (T,) rows to replay (None = all). rows: trace rows per window (None =
    stream.ACCESS_ROWS). tmp_dir:
    where Belady's next-use file goes (a temporary directory inside it, removed at the end; None = the
    system's). Memory: the policies' states plus one window, whatever the trace's length.
    """
    names = list(dict.fromkeys(["lru", *policies, "belady"]))
    for n in names:
        if n not in POLICIES:
            raise ConfigError(f"--policies holds {n!r}; expected names from {', '.join(POLICIES)}.")
    if pred_SLE is None and any(POLICIES[n].forecast for n in names):
        raise ConfigError(f"policies {', '.join(n for n in names if POLICIES[n].forecast)} need a forecast; "
                          "pass --predictor NAME|DIR (or 'oracle').")
    s = trace.spec
    L, E = s.num_layers, s.num_experts
    eb = cfg.expert_bytes or s.expert_bytes
    runs = [PolicyRun(n, cfg, L, E, eb, layer_ahead=layer_ahead) for n in names]
    rows = stream.ACCESS_ROWS if rows is None else rows
    with tempfile.TemporaryDirectory(prefix="routecast-replay-", dir=tmp_dir) as tmp:
        nu = NextUseFile(Path(tmp) / "next_use.f64", L * E)
        try:
            a0, sizes = 0, []  # first pass: each window's first access of every key (Belady's next use)
            for win in access_windows(trace, rows, mask):
                nu.add(first_use(win, a0, L * E))
                sizes.append(len(win.step_ids))
                a0 += len(win.step_ids) * L
            nu.finish()
            S = sum(sizes)
            if isinstance(pred_SLE, str) or pred_SLE is None:
                if pred_SLE not in (None, ORACLE):
                    raise ConfigError(f"forecast is {pred_SLE!r}; expected sets or {ORACLE!r}.")
            elif tuple(pred_SLE.shape) != (S, L, E):
                raise ConfigError(f"forecast sets have shape {tuple(pred_SLE.shape)}; expected ({S}, {L}, {E}).")
            a0, s0, tokens = 0, 0, 0
            bar = tqdm(total=S, desc="cache replay", unit="step", disable=not progress, leave=False)
            for w, win in enumerate(access_windows(trace, rows, mask)):
                Sw = len(win.step_ids)
                if w >= len(sizes) or Sw != sizes[w]:
                    raise RuntimeError("cache replay: the trace's windows changed between the two passes")
                req_next = next_use(win, a0, nu.after(w))
                if pred_SLE is None:
                    fc = None, None
                elif isinstance(pred_SLE, str):
                    fc = win.req_off, win.req_key
                else:
                    fc = forecast_window(np.asarray(pred_SLE[s0:s0 + Sw], bool))
                comp = _compute_s(win.req_tokens, cfg, eb)
                for r in runs:
                    r.feed(a0, win.req_off, win.req_key, win.req_tokens, req_next, *fc, comp=comp)
                a0, s0, tokens = a0 + Sw * L, s0 + Sw, tokens + win.num_tokens
                bar.update(Sw)
            bar.close()
        finally:
            nu.close()
    out = [r.result(tokens) for r in runs]
    add_gap_closed(out)
    for r in out:
        r["shown"] = r["policy"] in policies
    return out
