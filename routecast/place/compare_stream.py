"""Streaming pieces of the PROBE / EPLB comparison (compare.py): per-step loads read from a trace step by
step, the causal transition forecast one step at a time, EPLB replayed window by window, and the windows
of steps that compare_methods plans and prices one at a time.

Legend: T steps, W steps of one window, L MoE layers, E experts, G EP ranks, S physical expert slots.
Memory is one window of (W, L, G, E) rank assignments plus one chunk of trace rows, never (T, L, G, E).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from routecast.common.errors import ConfigError
from routecast.place.eplb import EPLBDeployment
from routecast.trace.stats_kernels import add_group_counts
from routecast.trace.trace import Trace

# Steps per window of compare_methods: a window's (W, L, G, E) float64 assignments are ~120 MB at
# DeepSeek-V3 geometry with EP 32 (the whole-trace arrays reached 3.9 GB each on a 16-request demo).
WINDOW_STEPS = 32


def step_meta(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Token columns only -> (tokens_T int64, prefill_share_T float64) per step in increasing step order."""
    _, step_idx = np.unique(trace.tokens["step"], return_inverse=True)
    T = int(step_idx.max()) + 1 if step_idx.size else 0
    tokens = np.bincount(step_idx, minlength=T)
    pre = np.bincount(step_idx, weights=(trace.tokens["phase"] == 0).astype(np.float64), minlength=T)
    return tokens, pre / np.maximum(tokens, 1)


def iter_steps(trace: Trace, chunk_rows: int | None = None):
    """Stream a trace step by step in increasing step order -> yields (experts_nLK of the step, loads_LE int64).

    Reads one window of whole steps at a time (Trace.step_chunks), so memory is bounded by chunk_rows
    (None = Trace's default).
    """
    s = trace.spec
    L, E = s.num_layers, s.num_experts
    for _, ch in trace.step_chunks(chunk_rows):
        for _, idx in ch.batches():
            ids = np.asarray(ch.experts_TLK[idx])
            loads = np.zeros((L, E), np.int64)
            add_group_counts(ids, np.zeros(len(idx), np.int64), loads[None])
            yield ids, loads


def _add_pairs(experts_TLK: np.ndarray, w: float, trans: np.ndarray, rows: np.ndarray) -> None:
    """trans[l, a, b] += w and rows[l, a] += w for every (a in set_l, b in set_l+1) pair of every token."""
    T, L, K = experts_TLK.shape
    for t in range(T):
        for l in range(L - 1):
            for i in range(K):
                a = experts_TLK[t, l, i]
                if a < 0:
                    continue
                for j in range(K):
                    b = experts_TLK[t, l + 1, j]
                    if b >= 0:
                        trans[l, a, b] += w
                        rows[l, a] += w


try:  # numba is a dependency; the fallback keeps a broken install correct, only slow
    from numba import njit
except ImportError:  # pragma: no cover - depends on the environment
    njit = None
if njit is not None:
    _add_pairs = njit(cache=True, nogil=True)(_add_pairs)


class TransitionForecaster:
    """The causal layer-ahead forecast of compare.py's module docstring, one step at a time.

    forecast(loads_LE, tokens) -> (L, E) float64 counts for this step from statistics of earlier steps and
    this step's routing of the previous layer; learn(experts_nLK, loads_LE) then adds this step. State:
    decayed (L-1, E, E) transition counts, their row sums, and decayed layer-0 counts. The transition
    counts are kept scaled by decay^-t (step t's pairs are added with weight decay^-t, rescaled now and
    then), so a step costs no pass over the (L-1, E, E) table: the forecast uses only ratios
    P(e_l | e_{l-1}) = counts / row sum, which the common scale leaves unchanged.
    """

    def __init__(self, L: int, E: int, K: int, decay: float) -> None:
        if not 0.0 <= decay < 1.0:
            raise ConfigError(f"decay is {decay}; expected a value in [0, 1).")
        self.L, self.E, self.K, self.decay = L, E, K, decay
        self.trans = np.zeros((max(L - 1, 0), E, E))  # scaled decayed counts of (e at l-1, e' at l) pairs
        self.rows = np.zeros((max(L - 1, 0), E))  # their sums over e'
        self.scale = 1.0  # weight of the next step's pairs
        self.first = np.zeros(E)  # decayed layer-0 counts

    def forecast(self, loads_LE: np.ndarray, tokens: int) -> np.ndarray:
        L, E = self.L, self.E
        out = np.empty((L, E))
        tot = self.first.sum()
        out[0] = (self.first / tot if tot > 0 else np.full(E, 1.0 / E)) * tokens * self.K
        if L > 1:
            x = loads_LE[:-1].astype(np.float64)
            seen = self.rows > 0  # a row never seen sends its load uniformly
            w = np.where(seen, x / np.where(seen, self.rows, 1.0), 0.0)
            out[1:] = np.matmul(w[:, None, :], self.trans)[:, 0, :] + np.where(seen, 0.0, x).sum(axis=1)[:, None] / E
        return out

    def learn(self, experts_nLK: np.ndarray, loads_LE: np.ndarray) -> None:
        self.first = self.first * self.decay + loads_LE[0]
        if self.L < 2:
            return
        if self.decay == 0.0:  # only the last step counts
            self.trans[:] = 0.0
            self.rows[:] = 0.0
        if len(experts_nLK):
            _add_pairs(np.ascontiguousarray(experts_nLK), self.scale, self.trans, self.rows)
        if self.decay > 0.0:
            self.scale /= self.decay
            if self.scale > 1e150:  # rescale before the weights overflow
                self.trans /= self.scale
                self.rows /= self.scale
                self.scale = 1.0


def step_windows(src: Trace | np.ndarray, W: int, decay: float, preds: dict[str, np.ndarray] | None
                 ) -> Iterator[tuple[int, np.ndarray, dict[str, np.ndarray]]]:
    """Windows of W steps -> yields (first step t0, loads_WLE int64, {arm: forecast_WLE}).

    src: a Trace (streamed step by step) or (T, L, E) loads. preds: {arm: (T, L, E)} forecasts, sliced per
    window; None (a Trace only) = the "probe_pred" arm is the streaming TransitionForecaster.
    """
    if not isinstance(src, Trace):
        for t0 in range(0, src.shape[0], W):
            yield t0, src[t0:t0 + W], {k: v[t0:t0 + W] for k, v in (preds or {}).items()}
        return
    s = src.spec
    tokens, _ = step_meta(src)
    fc = None if preds is not None else TransitionForecaster(s.num_layers, s.num_experts, s.top_k, decay)
    buf: list[np.ndarray] = []
    pbuf: list[np.ndarray] = []
    t0 = 0
    for t, (ids, loads) in enumerate(iter_steps(src)):
        if fc is not None:
            pbuf.append(fc.forecast(loads, int(tokens[t])))
            fc.learn(ids, loads)
        buf.append(loads)
        if len(buf) == W or t == tokens.size - 1:
            pw = {"probe_pred": np.stack(pbuf)} if fc is not None else \
                {k: v[t0:t0 + len(buf)] for k, v in (preds or {}).items()}
            yield t0, np.stack(buf), pw
            t0 += len(buf)
            buf, pbuf = [], []


def assignment(loads_TLE: np.ndarray, share_LEG: np.ndarray) -> np.ndarray:
    """(T, L, E) loads split by (L, E, G) shares -> (T, L, G, E) tokens per rank."""
    return np.einsum("tle,leg->tlge", loads_TLE.astype(np.float64), share_LEG)


def eplb_shares(phy2log_LS: np.ndarray, E: int, G: int) -> np.ndarray:
    """(L, S) EPLB placement -> (L, E, G) share of each expert's tokens per rank (even over replicas)."""
    L, S = phy2log_LS.shape
    gpu = np.arange(S) // (S // G)
    cnt = np.zeros((L, E, G))
    np.add.at(cnt, (np.repeat(np.arange(L), S), phy2log_LS.reshape(-1), np.tile(gpu, L)), 1.0)
    return cnt / np.maximum(cnt.sum(axis=2, keepdims=True), 1.0)


def eplb_transfers(old_LS: np.ndarray, new_LS: np.ndarray, G: int) -> tuple[np.ndarray, np.ndarray]:
    """Expert copies each rank receives and sends when an EPLB placement changes -> (in_LG, out_LG) int64.

    old_LS / new_LS: (L, S) logical expert of every physical slot, S // G consecutive slots per rank. A rank
    receives every expert it hosts in new and did not host in old (one copy, however many slots it fills);
    each is sent by one old holder of that expert, the one that has sent the fewest so far (ties: lowest rank).
    """
    L, S = old_LS.shape
    E = int(max(old_LS.max(), new_LS.max())) + 1
    gpu = np.tile(np.arange(S) // (S // G), L)
    lay = np.repeat(np.arange(L), S)
    had, has = np.zeros((L, E, G), bool), np.zeros((L, E, G), bool)
    had[lay, old_LS.reshape(-1), gpu] = True
    has[lay, new_LS.reshape(-1), gpu] = True
    recv = has & ~had
    n_in = recv.sum(axis=1).astype(np.int64)
    n_out = np.zeros((L, G), np.int64)
    for lay_i, e, _ in np.argwhere(recv):  # sequential: each choice depends on the sends chosen before it
        holders = np.flatnonzero(had[lay_i, e])
        n_out[lay_i, holders[np.argmin(n_out[lay_i, holders])]] += 1
    return n_in, n_out


class EplbReplay:
    """Replay an EPLB deployment window by window: window(loads_WLE, t0) -> (counts_WLGE, transfers_WLG,
    bytes_W, planner_s_W).

    Before the first rebalance the placement is EPLB of uniform loads (no statistics yet). A rebalance at
    step a uses the loads of steps [a - window_steps, a): the running cumulative load is snapshotted at the
    steps those sums need, so no per-step history is kept. transfers: max(copies received, copies sent) per
    rank and layer at each rebalance step (PROBE eq. 6); bytes: copies received over the network x W.
    """

    def __init__(self, dep: EPLBDeployment, T: int, L: int, E: int, expert_bytes: float) -> None:
        self.dep, self.E, self.eb = dep, E, expert_bytes
        self.rebal = set(dep.rebalance_steps(T))
        self.need = {x for a in self.rebal for x in (a, max(0, a - dep.window_steps))}
        self.snap: dict[int, np.ndarray] = {}
        self.cum = np.zeros((L, E), np.int64)
        self.place = dep.place(np.ones((L, E)))
        self.share = eplb_shares(self.place, E, dep.num_gpus)

    def window(self, loads: np.ndarray, t0: int) -> tuple[np.ndarray, ...]:
        W, L, E = loads.shape
        G = self.dep.num_gpus
        counts = np.empty((W, L, G, E))
        xfer, bytes_W, plan_s = np.zeros((W, L, G)), np.zeros(W), np.zeros(W)
        a = 0
        for i in range(W + 1):  # runs of steps under one placement, assigned in one einsum each
            t = t0 + i
            if i == W or t in self.rebal:
                if i > a:
                    counts[a:i] = assignment(loads[a:i], self.share)
                a = i
            if i == W:
                break
            if t in self.need:
                self.snap[t] = self.cum.copy()
            if t in self.rebal:
                c0 = time.thread_time()
                p = self.dep.place(self.snap[t] - self.snap[max(0, t - self.dep.window_steps)])
                plan_s[i] = time.thread_time() - c0
                n_in, n_out = eplb_transfers(self.place, p, G)
                xfer[i] = np.maximum(n_in, n_out)
                bytes_W[i] = float(n_in.sum()) * self.eb
                self.place, self.share = p, eplb_shares(p, E, G)
                for x in [x for x in self.snap if x <= t - self.dep.window_steps]:
                    del self.snap[x]  # no later rebalance reads a snapshot this old
            self.cum += loads[i]
        return counts, xfer, bytes_W, plan_s
