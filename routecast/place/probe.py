"""PROBE Algorithm 2: balance-optimal planning of replicas and token assignment inside a hiding window.

Legend: L MoE layers, G EP ranks, E experts, J water-filling candidates, K accepted moves (<= k_max).

Inputs are per (layer, source rank, expert) token counts n^{r_s}_e (load_LGE) and the baseline placement
P' (the static sharding). Per layer, as in the paper (§4.3, Algorithm 2):

 2  A <- locality-first: a token whose source rank hosts a copy of its expert stays there; the remaining
    (remote) tokens of an expert are split evenly over its copies.
 3  L_r = T_comp^r + T_comm^r: eq. 2 compute of every (rank, expert) GEMM group with the hardware's
    efficiency curve eta(n), floored by one read of the expert's weights (as in sim/cost.py), plus the
    all-to-all of the rank's busier direction (eq. 4 with lambda = 1; dispatch and combine: eq. 5).
 5-7 r_src = argmax L; r_dst = argmin L over helpers not marked invalid for r_src; e* = the hottest
    expert on r_src (most tokens processed there) among those with remote tokens on r_src (the only
    tokens that may move: r_src's own tokens stay on its local copy).
 8-9 dual-side budget: when r_dst lacks e*, a copy must be sent. With |Delta^in_r| replicas received and
    |Delta^out_r| sent by rank r, eq. 6 gives T_trans^r = max(|in|, |out|) W / BW_net; the move is valid
    only if, counting this replica, T_trans <= T_window on r_src (sender) and on r_dst (receiver) and
    r_dst holds at most max_redundant (3) redundant experts (the double-buffered replica region holds
    2 x 3 slots: this layer's and the next one's). An invalid pair is marked and the next helper tried;
    the loop picks the lightest passing helper in one scan and marks exactly the pairs the one-at-a-time
    loop would have marked (the lighter failing ones), so the results are the same.
 11 water-filling: r_dst's own tokens of e* become local to its new copy (locality-first); then remote
    tokens of e* are redirected from r_src to r_dst, at rank granularity, until r_src's latency reaches
    the cluster average or r_dst's rises to meet r_src's (the water level), or the pool runs out. The
    level is found on a grid of J points, refined once on the bracketing interval, interpolated.
 12 gain = r_src's latency before - the larger of r_src's and r_dst's after (no other rank rises, so the
    bottleneck never does; with a tie at the top the gain is still positive and the next iteration takes
    the other tied rank); stop when gain <= eps x bottleneck or k >= k_max (16).

Remote tokens of one expert are interchangeable between source ranks (any source without a local copy
sends them over the network either way), so the assignment A is kept as tokens per (expert, rank), n_LEG;
a cell's remote part is n minus the pinned local tokens x * P. Everything after the shape checks runs as one
compiled call (numba when installed; plain Python otherwise, same plans): the value checks, lines 2-3, lines
4-18 as a scalar loop per layer (an iteration touches one expert's column and two ranks, latencies updated
incrementally; a test recomputes them) and the result arrays. The PROBE runtime plans one layer per call, so
the fixed cost of a call (numpy dispatch, a few us each) matters as much as the loop; the sums keep numpy's
order, so the plans are bit for bit those of the numpy formulation (tests check it against a reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.sim.hardware import Hardware
from routecast.sim.models import ModelProfile

GRID = 16  # water-filling grid intervals per pass (two passes, then linear interpolation)


@dataclass(frozen=True, kw_only=True)
class PlanCosts:
    """The planner's latency model (SI units).

    flops_per_token: F-bar, FLOPs of one token in one expert; peak_flops: F_peak; eta_tokens / eta_values:
    GEMM efficiency vs tokens per expert (log-linear interpolation, flat outside, as Hardware.eta).
    weight_read_s: floor of an active (rank, expert) GEMM group (W / HBM_eff; 0 = none).
    comm_s_per_token: seconds per remote token on a rank's busier direction, dispatch + combine
    (2 H b / BW_net; 0 = compute only). expert_bytes: W; link_bandwidth: BW_net per direction (eq. 6).
    """

    flops_per_token: float
    peak_flops: float
    eta_tokens: tuple[float, ...] = (1.0,)
    eta_values: tuple[float, ...] = (1.0,)
    weight_read_s: float = 0.0
    comm_s_per_token: float = 0.0
    expert_bytes: float
    link_bandwidth: float

    def __post_init__(self) -> None:
        if min(self.flops_per_token, self.peak_flops, self.expert_bytes, self.link_bandwidth) <= 0:
            raise ConfigError("PlanCosts needs positive flops_per_token, peak_flops, expert_bytes and link_bandwidth.")
        if len(self.eta_tokens) != len(self.eta_values) or min(self.eta_values) <= 0:
            raise ConfigError(f"PlanCosts.eta_values is {self.eta_values}; expected positive, one per eta_tokens.")

    @cached_property
    def _log_tokens(self) -> np.ndarray:
        return np.log(np.asarray(self.eta_tokens, dtype=np.float64))

    @cached_property
    def _eta(self) -> np.ndarray:
        return np.asarray(self.eta_values, dtype=np.float64)

    @property
    def transfer_s(self) -> float:
        """Seconds to move one expert over the link (eq. 6 with one expert)."""
        return self.expert_bytes / self.link_bandwidth

    def expert_time(self, n: Any) -> np.ndarray:
        """Eq. 2 of one GEMM group of n tokens (any shape) -> seconds, 0 where n == 0."""
        n = np.asarray(n, dtype=np.float64)
        if self._eta.size == 1:
            t = n * (self.flops_per_token / (self._eta[0] * self.peak_flops))
        else:
            with np.errstate(divide="ignore"):
                eta = np.interp(np.log(n), self._log_tokens, self._eta)
            t = n * self.flops_per_token / (eta * self.peak_flops)
        if self.weight_read_s:
            t = np.where(n > 0, np.maximum(t, self.weight_read_s), 0.0)
        return t


def planner_costs(model: ModelProfile, hw: Hardware, *, link: str = "nvlink", comm: bool = True,
                  weight_floor: bool = True) -> PlanCosts:
    """PlanCosts of `model` on `hw`: eta from the profile, W = model.expert_bytes(), BW_net = the link."""
    bw = hw.link_bandwidth(link)
    if bw <= 0:
        raise ConfigError(f"link is {link!r}, which {hw.name} lacks; expected a link with bandwidth.")
    return PlanCosts(
        flops_per_token=float(model.expert_flops_per_token), peak_flops=hw.peak_flops,
        eta_tokens=hw.eta_tokens, eta_values=hw.eta_values,
        weight_read_s=model.expert_bytes() / hw.mem_effective if weight_floor else 0.0,
        comm_s_per_token=2.0 * model.hidden_size * model.dtype_bytes / bw if comm else 0.0,
        expert_bytes=float(model.expert_bytes()), link_bandwidth=bw,
    )


def token_costs(*, expert_bytes: float = 1.0, link_bandwidth: float = 1.0) -> PlanCosts:
    """PlanCosts in which a rank's latency is its token count (eta = 1, no floor, no network)."""
    return PlanCosts(flops_per_token=1.0, peak_flops=1.0, expert_bytes=expert_bytes, link_bandwidth=link_bandwidth)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Output of plan_layers for L layers.

    n_LEG: tokens of expert e processed on rank g (sums over g to the expert's load).
    placement_LEG: copies after planning (bool); replicas_LEG: the new, redundant ones (placement minus P').
    bytes_moved_L: expert weight bytes transferred; transfer_s_LG: eq. 6 time of each rank's transfers.
    iterations_L: accepted moves (k); moves_LK4: (expert, r_src, r_dst, tokens moved) of each, -1 padded.
    compute_LG, comm_LG, latency_LG: predicted seconds per rank after planning; start_latency_LG before.
    load_LG, start_load_LG: tokens processed per rank after / before.
    """

    n_LEG: np.ndarray
    placement_LEG: np.ndarray
    replicas_LEG: np.ndarray
    bytes_moved_L: np.ndarray
    transfer_s_LG: np.ndarray
    iterations_L: np.ndarray
    moves_LK4: np.ndarray
    compute_LG: np.ndarray
    comm_LG: np.ndarray
    latency_LG: np.ndarray
    start_latency_LG: np.ndarray
    load_LG: np.ndarray
    start_load_LG: np.ndarray

    @property
    def ir_L(self) -> np.ndarray:
        """PROBE eq. 1 on tokens: max rank load / mean rank load after planning."""
        return _ratio(self.load_LG)

    @property
    def start_ir_L(self) -> np.ndarray:
        return _ratio(self.start_load_LG)

    @property
    def speedup_L(self) -> np.ndarray:
        """Bottleneck latency before / after planning (>= 1)."""
        return self.start_latency_LG.max(axis=1) / np.maximum(self.latency_LG.max(axis=1), 1e-300)


def _ratio(x: np.ndarray) -> np.ndarray:
    m = x.mean(axis=-1)
    return np.where(m > 0, x.max(axis=-1) / np.where(m > 0, m, 1.0), 1.0)


def spread_sources(load_LE: np.ndarray, num_ranks: int) -> np.ndarray:
    """(L, E) tokens per expert -> (L, G, E) split evenly over source ranks (remainders to the first ranks).

    For when only per-expert counts are known (DP attention spreads tokens evenly over the ranks).
    """
    a = np.asarray(load_LE)
    if np.issubdtype(a.dtype, np.integer):
        base, rem = a // num_ranks, a % num_ranks
        return base[:, None, :] + (np.arange(num_ranks)[None, :, None] < rem[:, None, :])
    return np.repeat(a[:, None, :] / num_ranks, num_ranks, axis=1)


def _inputs(load_LGE: Any, placement: Any, hide_window_s: Any, k_max: int, max_redundant: int):
    """Shape and type checks (the value checks run compiled in _plan_call).

    Returns (x_LGE float64 C-contiguous, integral, P (1 or L, E, G) bool view, win (1 or L, 1 or G) float64).
    """
    x = np.asarray(load_LGE)
    kind = x.dtype.kind
    if x.ndim != 3 or 0 in x.shape or kind not in "iuf":
        raise ConfigError(f"load_LGE has shape {x.shape} and dtype {x.dtype}; expected (layers, ranks, experts) numbers.")
    L, G, E = x.shape
    P = np.asarray(placement, dtype=bool)
    if P.shape != (E, G) and P.shape != (L, E, G):
        raise ConfigError(f"placement has shape {np.shape(placement)}; expected ({E}, {G}) or ({L}, {E}, {G}).")
    w = np.asarray(hide_window_s, dtype=np.float64)
    win = w.reshape(1, 1) if w.ndim == 0 else (w[:, None] if w.ndim == 1 else w)
    if win.ndim != 2 or win.shape[0] not in (1, L) or win.shape[1] not in (1, G):
        raise ConfigError(f"hide_window_s has shape {w.shape}; expected (), ({L},) or ({L}, {G}).")
    if k_max < 0 or max_redundant < 0:
        raise ConfigError(f"k_max is {k_max} and max_redundant {max_redundant}; expected both >= 0.")
    return (np.ascontiguousarray(x, dtype=np.float64), kind != "f", P if P.ndim == 3 else P[None],
            np.ascontiguousarray(win))


def plan_layers(
    load_LGE: Any,
    placement: Any,
    *,
    costs: PlanCosts,
    hide_window_s: Any,
    k_max: int = 16,
    max_redundant: int = 3,
    eps: float = 1e-4,
) -> Plan:
    """PROBE Algorithm 2 for L layers at once (see the module docstring for every step).

    load_LGE: (L, G, E) predicted tokens of each expert on each source rank (int counts stay integral).
    placement: (E, G) or (L, E, G) bool baseline placement P' (e.g. duplication.sharded_placement).
    costs: PlanCosts (planner_costs(model, hw) or token_costs()); hide_window_s: T_window in seconds,
    scalar, (L,) or (L, G) (np.inf = unlimited); eps: minimum gain relative to the bottleneck latency.
    Returns a Plan.
    """
    x, integral, P_in, w_in = _inputs(load_LGE, placement, hide_window_s, k_max, max_redundant)
    err, lay, e, n, n_int, P, replicas, k, moves, moved, lg = _plan_call(
        x, P_in, w_in, integral, int(k_max), int(max_redundant), float(eps), float(costs.comm_s_per_token),
        float(costs.transfer_s), float(costs.flops_per_token), float(costs.peak_flops), costs._log_tokens,
        costs._eta, float(costs.weight_read_s), float(costs.expert_bytes))
    if err == 1:
        raise ConfigError("load_LGE holds a negative or non-finite count; expected token counts >= 0.")
    if err == 2:
        raise ConfigError(f"expert {e} of layer {lay} has tokens but no copy in placement; expected one.")
    if err == 3:
        raise ConfigError("hide_window_s holds a negative or NaN window; expected seconds >= 0.")
    comp, comm, lat, start_lat, load, start_load, trans = lg
    return Plan(n_LEG=n_int if integral else n, placement_LEG=P, replicas_LEG=replicas, bytes_moved_L=moved,
                transfer_s_LG=trans, iterations_L=k, moves_LK4=moves[:, :k_max], compute_LG=comp,
                comm_LG=comm,
                latency_LG=lat, start_latency_LG=start_lat, load_LG=load, start_load_LG=start_load)


# ---- the loop (lines 4-18): scalar code, compiled by numba when it is installed ------------------------------
# On one layer's small arrays a scalar loop beats any sequence of numpy calls (~1 us of dispatch each). The
# arithmetic is the same IEEE operations, in the same order, as PlanCosts.expert_time (np.interp of np.log)
# and np.mean (pairwise sum), so a plan does not depend on whether numba is present.
def _t(n: float, eta: tuple) -> float:
    """PlanCosts.expert_time of one GEMM group of n tokens; eta = (F, F_peak, log tokens, values, floor)."""
    if n == 0.0:  # what the formula gives for n = 0 (up to the sign of zero); most cells are empty
        return 0.0
    fpt, peak, xp, fp, floor = eta
    m = xp.size
    if m == 1:
        t = n * (fpt / (fp[0] * peak))
    else:
        v = np.log(n) if n > 0 else (-np.inf if n == 0 else np.nan)
        e = fp[0] if v <= xp[0] else (fp[m - 1] if v >= xp[m - 1] else np.nan)
        if xp[0] < v < xp[m - 1]:  # xp[j] <= v < xp[j + 1]; a scan beats a binary search on a few points
            j = 0
            while xp[j + 1] <= v:
                j += 1
            e = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]) * (v - xp[j]) + fp[j]
        t = n * fpt / (e * peak)
    if floor != 0.0:
        t = max(t, floor) if n > 0 else 0.0
    return t


def _block(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of a[lo:lo + n] for n <= 128: one loop over 8 accumulators."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r = a[lo:lo + 8].copy()
    i = 8
    while i < n - n % 8:
        for j in range(8):
            r[j] += a[lo + i + j]
        i += 8
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


def _pairwise(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of a[lo:lo + n] (what np.mean uses), bit for bit: pw(lo, n) = pw(lo, h) +
    pw(lo + h, n - h), h = n // 2 rounded down to a multiple of 8, down to blocks of <= 128, on explicit
    stacks (numba's cache mishandles recursion): nodes to expand, or kind 1: add the two latest sums."""
    if n <= 128:
        return _block(a, lo, n)
    node = np.empty((64, 3), dtype=np.int64)
    vals = np.empty(64)
    node[0, 0], node[0, 1], node[0, 2] = lo, n, 0
    top, nv = 1, 0
    while top:
        top -= 1
        l0, m, kind = node[top, 0], node[top, 1], node[top, 2]
        if kind == 1:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
        elif m <= 128:
            vals[nv] = _block(a, l0, m)
            nv += 1
        else:
            h = m // 2 - (m // 2) % 8
            node[top, 0], node[top, 1], node[top, 2] = 0, 0, 1
            node[top + 1, 0], node[top + 1, 1], node[top + 1, 2] = l0 + h, m - h, 0
            node[top + 2, 0], node[top + 2, 1], node[top + 2, 2] = l0, h, 0
            top += 3
    return vals[0]


def _pair(xm: float, f: tuple, eta: tuple) -> tuple:
    """(L_src, L_dst) after moving xm remote tokens of e* from r_src to r_dst (no other rank changes);
    f = (c, base_s, n_s, vin_s, vout_s, base_d, n_d, vin_d, vout_d, avg): base_* the compute of the rank's
    other experts, n_* its tokens of e*, vin / vout its remote tokens in / out, avg the cluster mean."""
    c, bs, ns, vis, vos, bd, nd, vid, vod, _ = f
    return (bs + _t(ns - xm, eta) + c * max(vis - xm, vos), bd + _t(nd + xm, eta) + c * max(vid + xm, vod))


def _cross(lo: float, hi: float, f: tuple, eta: tuple) -> tuple:
    """On GRID + 1 points over [lo, hi], the first x with L_src <= max(avg, L_dst) and the point before it
    -> (x_before, x_first, gap_before, gap_first), gap = L_src - max(avg, L_dst); where no point qualifies,
    x_first = hi and both gaps are positive (the pool runs out first)."""
    x_prev, g_prev, xj, g = lo, 0.0, lo, 0.0
    for j in range(GRID + 1):
        xj = lo + (hi - lo) * (j / GRID)
        ls, ld = _pair(xj, f, eta)
        g = ls - max(f[9], ld)
        if j == 0:
            x_prev, g_prev = xj, g  # the point before the first is the first itself
        if g <= 0 or j == GRID:
            break
        x_prev, g_prev = xj, g
    return x_prev, xj, g_prev, g


def _solve(pool: float, f: tuple, eta: tuple, integral: bool) -> tuple:
    """Line 11's water level -> (tokens to move in [0, pool], the pair's peak latency after it): the
    smallest x with L_src(x) <= max(avg, L_dst(x)) (r_src reaches the cluster average or meets r_dst
    rising), else the pool; on a grid, refined once on the bracketing interval, interpolated (exact when
    latency is linear in tokens); integer counts take the neighbouring integer with the lower peak."""
    lo, hi, _, _ = _cross(0.0, pool, f, eta)
    lo, hi, g_lo, g_hi = _cross(lo, hi, f, eta)
    if g_lo <= 0:
        x = lo
    else:
        x = lo + (hi - lo) * (g_lo / (g_lo - g_hi) if g_hi <= 0 else 1.0)
    best_x, best = x, np.inf
    for cand in ((np.floor(x), min(np.ceil(x), pool)) if integral else (x, x)):
        ls, ld = _pair(cand, f, eta)
        if max(ls, ld) < best:
            best_x, best = cand, max(ls, ld)
    return best_x, best


def _plan_one(x, P, n, comp, vin, vout, lat, win, cin, cout, moves, eta, c, t_unit, integral, k_max, max_red, eps):
    """Lines 4-18 for one layer, in place. x: (G, E), P / n: (E, G), the rest (G,); returns k."""
    G, E = x.shape
    invalid = np.zeros((G, G), dtype=np.bool_)
    take, col, vin1, vout1, t_old, comp1, lat1 = np.empty((7, G))
    k = 0
    while True:
        src = int(np.argmax(lat))
        # Line 7: hottest expert on r_src among those with remote tokens there (n minus pinned local ones).
        e, best = 0, -np.inf
        for q in range(E):
            ns = n[q, src]
            m = ns - x[src, q] * P[q, src]
            score = ns if m > (0.0 if integral else 1e-9 * (1.0 + ns)) else -1.0
            if score > best:
                e, best = q, score
        if best <= 0:
            return k
        # Lines 6, 8-9: least-loaded helper that passes the dual-side budget check; failing lighter ones
        # are marked invalid for r_src, as the sequential loop would mark them one by one.
        send_ok = max(cin[src], cout[src] + 1) * t_unit <= win[src]
        dst = -1
        for g in range(G):
            if g == src or invalid[src, g]:
                continue
            ok = P[e, g] or (send_ok and cin[g] + 1 <= max_red and max(cin[g] + 1, cout[g]) * t_unit <= win[g])
            if ok and (dst < 0 or lat[g] < lat[dst]):
                dst = g
        for g in range(G):
            if g == src or invalid[src, g] or P[e, g]:
                continue
            if not (send_ok and cin[g] + 1 <= max_red and max(cin[g] + 1, cout[g]) * t_unit <= win[g]):
                if dst < 0 or lat[g] < lat[dst] or (lat[g] == lat[dst] and g < dst):
                    invalid[src, g] = True
        if dst < 0:
            return k
        need = not P[e, dst]
        # Line 11: water-filling. First r_dst's own tokens of e* become local to its new copy, taken from
        # r_src's remote tokens first, then from ranks 0, 1, ...
        own = x[dst, e] if need else 0.0
        m_src = n[e, src] - x[src, e] * P[e, src]
        rest, cum = own - min(own, m_src), 0.0
        for g in range(G):  # before_g = cumsum - own value, as np.cumsum(other) - other computes it
            m = n[e, g] - x[g, e] * P[e, g] if g != src else 0.0
            cum += m
            take[g] = min(own, m_src) if g == src else min(max(rest - (cum - m), 0.0), m)
        for g in range(G):
            col[g] = n[e, g] - take[g]
        col[dst] += own
        for g in range(G):
            vin1[g] = vin[g] - take[g]
            vout1[g] = vout[g]
        vout1[dst] -= own
        for g in range(G):
            t_old[g] = _t(n[e, g], eta)
            comp1[g] = comp[g] - t_old[g] + (t_old[g] if col[g] == n[e, g] else _t(col[g], eta))
        for g in range(G):
            lat1[g] = comp1[g] + c * max(vin1[g], vout1[g])
        ts, td = _t(col[src], eta), _t(col[dst], eta)
        f = (c, comp1[src] - ts, col[src], vin1[src], vout1[src], comp1[dst] - td, col[dst], vin1[dst],
             vout1[dst], _pairwise(lat1, 0, G) / G)
        xm, peak = _solve(m_src - take[src], f, eta, integral)
        # Line 12: stop on a small gain or an exhausted iteration budget.
        if not (lat[src] - peak > eps * lat[src]) or k >= k_max:
            return k
        col[src] -= xm
        col[dst] += xm
        vin1[src] -= xm
        vin1[dst] += xm
        for g in range(G):
            comp[g] = comp[g] - t_old[g] + (t_old[g] if col[g] == n[e, g] else _t(col[g], eta))
            n[e, g] = col[g]
            vin[g], vout[g] = vin1[g], vout1[g]
            lat[g] = comp[g] + c * max(vin[g], vout[g])
        if need:
            P[e, dst] = True
            cin[dst] += 1
            cout[src] += 1
        moves[k, 0], moves[k, 1], moves[k, 2], moves[k, 3] = e, src, dst, int(np.rint(xm + own))
        k += 1


def _initial(x, tot, P, single, integral, eta, n, comp, vin, vout, load, own):
    """Lines 2-3 for one layer, into zeroed n (E, G), comp / vin / load (G,) and vout (G,); own (G,) scratch.

    x: (G, E) tokens per source rank; tot (E,) their sums over ranks; P: (E, G) copies; single: no expert of
    any layer has two copies (then an expert's tokens all go to its home rank). load: tokens per rank after.
    Sums run in numpy's order for the same arrays (sequential over the reduced axis, pairwise along a
    contiguous row), so the start state does not depend on whether numba is present.
    """
    G, E = x.shape
    for g in range(G):  # tokens each source sends, before subtracting its local ones
        if integral:  # integer sums are exact in any order: four independent chains, not one long one
            a0, a1, a2, a3, row, e4 = 0.0, 0.0, 0.0, 0.0, x[g], E - E % 4
            for e in range(0, e4, 4):
                a0 += row[e]
                a1 += row[e + 1]
                a2 += row[e + 2]
                a3 += row[e + 3]
            for e in range(e4, E):
                a0 += row[e]
            vout[g] = (a0 + a1) + (a2 + a3)
        else:
            vout[g] = _pairwise(x[g], 0, E)
        own[g] = 0.0
    if single:
        for e in range(E):
            h, o = 0, 0.0
            for g in range(G):
                if P[e, g]:
                    h, o = g, x[g, e]
                    n[e, g] = tot[e]
                    load[g] += tot[e]
                    break
            comp[h] += _t(tot[e], eta)
            vin[h] += tot[e] - o
            own[h] += o
    else:
        for e in range(E):
            cnt = 0
            for g in range(G):
                if P[e, g]:
                    n[e, g] = x[g, e]
                    own[g] += x[g, e]
                    cnt += 1
            remote = tot[e] - _pairwise(n[e], 0, G)
            c1 = max(cnt, 1)
            base, rem, cs = remote // c1, remote % c1, 0
            for g in range(G):
                if P[e, g]:
                    cs += 1
                    m = (base + (1.0 if cs - 1 < rem else 0.0)) if integral else remote / c1
                    n[e, g] += m
                    vin[g] += m
                if n[e, g] != 0.0:
                    comp[g] += _t(n[e, g], eta)
                    load[g] += n[e, g]
    for g in range(G):
        vout[g] -= own[g]


def _plan_call(x, P_in, w_in, integral, k_max, max_red, eps, c, t_unit, fpt, peak, xp, fp, floor,
               expert_bytes):
    """Checks, lines 2-3 and the loop for L layers -> (error code, its layer, expert or rank, Plan arrays).

    x: (L, G, E) float64; P_in: (1 or L, E, G) baseline copies; w_in: (1 or L, 1 or G) windows (seconds).
    Error codes: 1 a negative or non-finite load, 2 an expert with tokens and no copy (the first in layer,
    expert order), 3 a negative or NaN window; the arrays are then unfilled. n_int is n as int64 when
    integral (else empty). The per-rank results share one array, lg (7, L, G): compute, comm, latency,
    start latency, load, start load, transfer seconds (returning one array instead of seven saves the
    boxing of six on every call).
    """
    L, G, E = x.shape
    eta = (fpt, peak, xp, fp, floor)
    many_p, rows_w, cols_w = P_in.shape[0] > 1, w_in.shape[0] > 1, w_in.shape[1] > 1
    P = np.empty((L, E, G), dtype=np.bool_)
    replicas = np.zeros((L, E, G), dtype=np.bool_)
    n = np.zeros((L, E, G))
    n_int = np.empty((L, E, G) if integral else (0, 0, 0), dtype=np.int64)
    tot, win = np.zeros((L, E)), np.empty((L, G))
    vin, vout = np.zeros((L, G)), np.empty((L, G))
    lg = np.zeros((7, L, G))
    comp, comm, lat, start_lat, load, start_load, trans = lg[0], lg[1], lg[2], lg[3], lg[4], lg[5], lg[6]
    cin, cout = np.zeros((L, G), dtype=np.int64), np.zeros((L, G), dtype=np.int64)
    k, moved = np.zeros(L, dtype=np.int64), np.zeros(L)
    moves = np.full((L, max(k_max, 1), 4), -1, dtype=np.int64)
    out = (n, n_int, P, replicas, k, moves, moved, lg)
    valid = 0  # counted, not tested with an early exit, so that the loop vectorises
    for lay in range(L):
        t = tot[lay]
        for g in range(G):
            row = x[lay, g]
            for e in range(E):
                v = row[e]
                valid += (v >= 0.0) & (v < np.inf)
                t[e] += v  # sequential over source ranks, as numpy sums over a non-contiguous axis
    if valid != L * G * E:
        return (1, 0, 0) + out
    single = True
    for lay in range(L):
        src = lay if many_p else 0
        for e in range(E):
            cnt = 0
            for g in range(G):
                P[lay, e, g] = P_in[src, e, g]
                cnt += P_in[src, e, g]
            single = single and cnt <= 1
            if tot[lay, e] > 0.0 and cnt == 0:
                return (2, lay, e) + out
    for lay in range(L):
        for g in range(G):
            w = w_in[lay if rows_w else 0, g if cols_w else 0]
            if not w >= 0.0:
                return (3, lay, g) + out
            win[lay, g] = w
    own = np.empty(G)
    for lay in range(L):
        _initial(x[lay], tot[lay], P[lay], single, integral, eta, n[lay], comp[lay], vin[lay], vout[lay],
                 start_load[lay], own)
        for g in range(G):
            lat[lay, g] = comp[lay, g] + c * max(vin[lay, g], vout[lay, g])
            start_lat[lay, g] = lat[lay, g]
        if k_max > 0:
            k[lay] = _plan_one(x[lay], P[lay], n[lay], comp[lay], vin[lay], vout[lay], lat[lay], win[lay],
                               cin[lay], cout[lay], moves[lay], eta, c, t_unit, integral, k_max, max_red, eps)
        if k[lay] == 0:
            load[lay] = start_load[lay]
        else:
            for e in range(E):
                for g in range(G):
                    load[lay, g] += n[lay, e, g]
        received = 0
        for j in range(k[lay]):
            e, g = moves[lay, j, 0], moves[lay, j, 2]
            replicas[lay, e, g] = replicas[lay, e, g] or not P_in[lay if many_p else 0, e, g]
        for g in range(G):
            comm[lay, g] = c * max(vin[lay, g], vout[lay, g])
            trans[lay, g] = max(cin[lay, g], cout[lay, g]) * t_unit
            received += cin[lay, g]
        moved[lay] = received * expert_bytes
        if integral:
            for e in range(E):
                for g in range(G):
                    n_int[lay, e, g] = np.int64(n[lay, e, g])
    return (0, 0, 0) + out


try:  # numba is optional: without it the same functions run as Python (slower, same plans)
    from numba import njit
except ImportError:  # pragma: no cover - depends on the environment
    njit = None
if njit is not None:
    _t, _block, _pairwise, _pair, _cross, _solve, _plan_one, _initial, _plan_call = (
        njit(cache=True)(fn)
        for fn in (_t, _block, _pairwise, _pair, _cross, _solve, _plan_one, _initial, _plan_call))


# ---- what any plan could reach ------------------------------------------------------------------------------
def replica_budget(costs: PlanCosts, hide_window_s: Any, num_ranks: int, *, k_max: int = 16,
                   max_redundant: int = 3) -> np.ndarray:
    """Most new replicas a layer can get under Algorithm 2's constraints -> (L,) int64 (L = 1 for a scalar).

    hide_window_s: (), (L,) or (L, G). Rank r can receive min(max_redundant, floor(T_window^r / t)) and
    send floor(T_window^r / t) experts (t = W / BW_net, eq. 6); every replica is one receive and one send,
    and Algorithm 2 accepts at most k_max moves: B = min(k_max, sum_r receive_r, sum_r send_r).
    """
    w = np.asarray(hide_window_s, dtype=np.float64)
    if w.ndim > 2 or (w.ndim == 2 and w.shape[1] != num_ranks) or (w < 0).any():
        raise ConfigError(f"hide_window_s has shape {w.shape}; expected (), (L,) or (L, {num_ranks}) seconds >= 0.")
    win = np.broadcast_to(w[:, None] if w.ndim == 1 else np.atleast_2d(w), (w.shape[0] if w.ndim else 1, num_ranks))
    with np.errstate(invalid="ignore"):
        per = np.where(np.isinf(win), np.iinfo(np.int32).max, np.floor(win / costs.transfer_s + 1e-9))
    recv = np.minimum(per, max_redundant).sum(axis=1)
    return np.minimum(np.minimum(recv, per.sum(axis=1)), k_max).astype(np.int64)


def _greedy_min_max(a_LX: np.ndarray, c_LX: np.ndarray, cap_LX: np.ndarray, budget_L: np.ndarray) -> np.ndarray:
    """min over b >= 0 (sum_x b_x <= budget, c + b <= cap) of max_x a_x / (c_x + b_x), per layer -> (L,).

    Greedy is exact: the maximum only falls when its own argmax gets a unit, so each unit goes there; once
    the argmax is at its cap the maximum cannot fall further.
    """
    c = c_LX.astype(np.float64).copy()
    rows = np.arange(a_LX.shape[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        for step in range(int(budget_L.max(initial=0))):
            ratio = np.where(a_LX > 0, a_LX / c, 0.0)
            top = np.argmax(ratio, axis=1)
            go = (step < budget_L) & (c[rows, top] < cap_LX[rows, top])
            if not go.any():
                break
            c[rows[go], top[go]] += 1
        return np.where(a_LX > 0, a_LX / c, 0.0).max(axis=1)


def load_lower_bound(load_LE: Any, placement: Any, *, new_replicas: Any) -> np.ndarray:
    """Sound lower bound on the largest rank load (tokens) of ANY plan that adds at most B replicas.

    load_LE: (L, E) tokens per expert (or (L, G, E) per source rank, summed); placement: (E, G) or
    (L, E, G) baseline copies; new_replicas: B, scalar or (L,) (e.g. replica_budget(...)). Returns (L,):
    the largest of four bounds, each valid for every assignment that conserves tokens and only uses copies,
    so no planner, however it splits tokens, can go below it (M = the largest rank load):
      mean:    M >= sum_e n_e / G;
      expert:  expert e on c_e + b_e copies has one copy with >= n_e / (c_e + b_e) tokens, and
               sum_e b_e <= B, b_e <= G - c_e: M >= min_b max_e n_e / (c_e + b_e);
      rank:    N_r = tokens of the experts whose only baseline copy is on r is processed by r (<= M) and by
               the b_r new copies of those experts (<= M each), sum_r b_r <= B: M >= min_b max_r N_r / (1 + b_r);
      set:     the k ranks with the largest N_r hold N_S such tokens; they are processed inside the set
               (<= k M) or on ranks outside it that received a new copy (at most min(B, G - k) ranks,
               <= M each): M >= max_k N_S / (k + min(B, G - k)).
    The two minimisations are exact greedy allocations (_greedy_min_max). Integer loads round up: rank loads
    are then integers. With B = 0 the rank bound is the sharded load itself, so the bound is tight there.
    """
    a = np.asarray(load_LE)
    if a.ndim == 3:
        a = a.sum(axis=1)
    if a.ndim != 2:
        raise ConfigError(f"load_LE has shape {a.shape}; expected (layers, experts) or (layers, ranks, experts).")
    L, E = a.shape
    P = np.asarray(placement, dtype=bool)
    if P.ndim not in (2, 3) or P.shape[-2] != E:
        raise ConfigError(f"placement has shape {P.shape}; expected ({E}, G) or ({L}, {E}, G).")
    P = np.broadcast_to(P, (L, E, P.shape[-1]))
    G = P.shape[2]
    B = np.broadcast_to(np.asarray(new_replicas, dtype=np.int64), (L,))
    if (B < 0).any():
        raise ConfigError(f"new_replicas is {new_replicas!r}; expected counts >= 0.")
    n = a.astype(np.float64)
    copies = P.sum(axis=2)
    mean = n.sum(axis=1) / G
    expert = _greedy_min_max(n, np.maximum(copies, 1), np.full((L, E), G), B)
    single = copies == 1
    home = np.argmax(P, axis=2)
    idx = (np.arange(L)[:, None] * G + home)[single]
    N_LG = np.bincount(idx, weights=n[single], minlength=L * G).reshape(L, G)
    rank = _greedy_min_max(N_LG, np.ones((L, G)), np.full((L, G), np.inf), B)
    k = np.arange(1, G + 1)
    top = np.cumsum(-np.sort(-N_LG, axis=1), axis=1)
    sets = (top / (k + np.minimum(B[:, None], G - k))).max(axis=1)
    bound = np.max([mean, expert, rank, sets], axis=0)
    return np.ceil(bound - 1e-9) if np.issubdtype(a.dtype, np.integer) else bound
