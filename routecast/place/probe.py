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
    the vectorised loop tries all helpers of one (r_src, e*) at once and marks exactly the pairs the
    sequential loop would have marked (the lighter failing ones), so the results are the same.
 11 water-filling: r_dst's own tokens of e* become local to its new copy (locality-first); then remote
    tokens of e* are redirected from r_src to r_dst, at rank granularity, until r_src's latency reaches
    the cluster average or r_dst's rises to meet r_src's (the water level), or the pool runs out. The
    level is found on a grid of J points, refined once on the bracketing interval, interpolated.
 12 gain = r_src's latency before - the larger of r_src's and r_dst's after (no other rank rises, so the
    bottleneck never does; with a tie at the top the gain is still positive and the next iteration takes
    the other tied rank); stop when gain <= eps x bottleneck or k >= k_max (16).

Remote tokens of one expert are interchangeable between source ranks (any source without a local copy
sends them over the network either way), so the assignment A is kept as tokens per (expert, rank), n_LEG;
a cell's remote part is n minus the pinned local tokens x * P. Every step of the loop is vectorised over
the layers still active; each iteration touches one expert's column per layer, so latencies are updated
incrementally (a test recomputes them from scratch).
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


def _prepare(load_LGE: Any, placement: Any, hide_window_s: Any, k_max: int, max_redundant: int):
    """Validate; returns (x_LGE as given, integral, P_LEG writable copy, P0_LEG read-only view, win_LG)."""
    x = np.asarray(load_LGE)
    if x.ndim != 3 or 0 in x.shape or not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise ConfigError(f"load_LGE has shape {x.shape} and dtype {x.dtype}; expected (layers, ranks, experts) numbers.")
    integral = np.issubdtype(x.dtype, np.integer)
    if (not integral and not np.isfinite(x).all()) or (x < 0).any():
        raise ConfigError("load_LGE holds a negative or non-finite count; expected token counts >= 0.")
    L, G, E = x.shape
    P = np.asarray(placement, dtype=bool)
    if P.shape not in ((E, G), (L, E, G)):
        raise ConfigError(f"placement has shape {np.shape(placement)}; expected ({E}, {G}) or ({L}, {E}, {G}).")
    P0 = np.broadcast_to(P, (L, E, G))
    homeless = (x.sum(axis=1) > 0) & ~P0.any(axis=2)
    if homeless.any():
        lay, e = np.argwhere(homeless)[0]
        raise ConfigError(f"expert {e} of layer {lay} has tokens but no copy in placement; expected one.")
    w = np.asarray(hide_window_s, dtype=np.float64)
    try:
        win = np.broadcast_to(w[:, None] if w.ndim == 1 else w, (L, G))
    except ValueError:
        raise ConfigError(f"hide_window_s has shape {w.shape}; expected (), ({L},) or ({L}, {G}).") from None
    if (win < 0).any() or np.isnan(win).any():
        raise ConfigError("hide_window_s holds a negative or NaN window; expected seconds >= 0.")
    if k_max < 0 or max_redundant < 0:
        raise ConfigError(f"k_max is {k_max} and max_redundant {max_redundant}; expected both >= 0.")
    return x, integral, P0.copy(), P0, win


def _initial(x: np.ndarray, P: np.ndarray, costs: PlanCosts, integral: bool):
    """Line 2 (locality-first) and line 3: (n_LEG, comp_LG, vin_LG, vout_LG).

    x: (L, G, E) tokens per source rank; P: (L, E, G) copies. A token whose source holds a copy of its
    expert stays there; an expert's other (remote) tokens are split evenly over its copies.
    """
    L, G, E = x.shape
    tot = x.sum(axis=1, dtype=np.float64)  # (L, E)
    sent = x.sum(axis=2, dtype=np.float64)  # (L, G)
    copies = P.sum(axis=2)
    if (copies <= 1).all():
        # One copy per expert (sharding): every token of e is processed on its home rank.
        home = np.argmax(P, axis=2)  # (L, E)
        own = np.take_along_axis(x, home[:, None, :], axis=1)[:, 0, :] * (copies > 0)
        idx = (np.arange(L)[:, None] * G + home).reshape(-1)
        n = P * tot[:, :, None]
        comp = np.bincount(idx, costs.expert_time(tot).reshape(-1), L * G).reshape(L, G)
        vin = np.bincount(idx, (tot - own).reshape(-1), L * G).reshape(L, G)
        vout = sent - np.bincount(idx, own.reshape(-1), L * G).reshape(L, G)
        return n, comp, vin, vout
    n = np.multiply(x.transpose(0, 2, 1), P, dtype=np.float64)  # local tokens
    remote = tot - n.sum(axis=2)
    vout = sent - n.sum(axis=1)
    c1 = np.maximum(copies, 1)
    if integral:
        base, rem = remote // c1, remote % c1
        m = P * (base[:, :, None] + (np.cumsum(P, axis=2) - 1 < rem[:, :, None]))
    else:
        m = P * (remote / c1)[:, :, None]
    n += m
    return n, _rank_time(costs, n), m.sum(axis=1), vout


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
    x, integral, P, P0, win = _prepare(load_LGE, placement, hide_window_s, k_max, max_redundant)
    L, G, E = x.shape
    n, comp, vin, vout = _initial(x, P, costs, integral)  # n: (L, E, G)
    c = costs.comm_s_per_token
    lat = comp + c * np.maximum(vin, vout)
    start_lat, start_load = lat.copy(), n.sum(axis=1)
    cin = np.zeros((L, G), dtype=np.int64)
    cout = np.zeros((L, G), dtype=np.int64)
    invalid = np.zeros((L, G, G), dtype=bool)
    k = np.zeros(L, dtype=np.int64)
    moves = np.full((L, max(k_max, 1), 4), -1, dtype=np.int64)
    active = np.full(L, k_max > 0)
    t_unit, ranks = costs.transfer_s, np.arange(G)

    while active.any():
        a = np.flatnonzero(active)
        rows = np.arange(a.size)
        lat_a = lat[a]
        src = np.argmax(lat_a, axis=1)
        # Line 7: hottest expert on r_src among those with remote tokens there (n minus pinned local ones).
        n_src = n[a, :, src]  # (A, E)
        m_src = n_src - x[a, src, :] * P[a, :, src]
        score = np.where(m_src > (0.0 if integral else 1e-9 * (1.0 + n_src)), n_src, -1.0)
        e = np.argmax(score, axis=1)
        stuck = score[rows, e] <= 0
        # Lines 6, 8-9: least-loaded helper that passes the dual-side budget check.
        hold = P[a, e, :]  # (A, G) ranks that already hold e*
        send_ok = np.maximum(cin[a, src], cout[a, src] + 1) * t_unit <= win[a, src]
        recv_ok = (cin[a] + 1 <= max_redundant) & (np.maximum(cin[a] + 1, cout[a]) * t_unit <= win[a])
        ok = hold | (send_ok[:, None] & recv_ok)
        open_ = ~invalid[a, src] & (ranks != src[:, None])
        cand = np.where(ok & open_, lat_a, np.inf)
        dst = np.argmin(cand, axis=1)
        found = np.isfinite(cand[rows, dst]) & ~stuck
        lat_dst = np.where(found, lat_a[rows, dst], np.inf)
        tried_first = (lat_a < lat_dst[:, None]) | ((lat_a == lat_dst[:, None]) & (ranks < dst[:, None]))
        ia, ig = np.nonzero(open_ & ~ok & tried_first & ~stuck[:, None])
        invalid[a[ia], src[ia], ig] = True
        active[a[~found]] = False
        if not found.any():
            break
        a, src, dst, e, hold, lat_a = a[found], src[found], dst[found], e[found], hold[found], lat_a[found]
        rows = np.arange(a.size)
        need = ~hold[rows, dst]
        # Line 11: water-filling. First r_dst's own tokens of e* become local to its new copy.
        col_n, col_x = n[a, e, :], x[a, :, e]  # (A, G)
        col_m = col_n - col_x * hold
        own = np.where(need, col_x[rows, dst], 0.0)
        take = _take_front(col_m, src, own)  # remote tokens of e* that turn local, per rank
        col_n1 = col_n - take
        col_n1[rows, dst] += own
        vin1 = vin[a] - take
        vout1 = vout[a].copy()
        vout1[rows, dst] -= own
        t_old, t1 = costs.expert_time(col_n), costs.expert_time(col_n1)
        comp1 = comp[a] - t_old + t1
        lat1 = comp1 + c * np.maximum(vin1, vout1)
        fill = _Fill(costs, c, comp1[rows, src] - t1[rows, src], col_n1[rows, src], vin1[rows, src],
                     vout1[rows, src], comp1[rows, dst] - t1[rows, dst], col_n1[rows, dst], vin1[rows, dst],
                     vout1[rows, dst], lat1.mean(axis=1), integral)
        pool = (col_m - take)[rows, src]
        xmove, f = fill.solve(pool)
        # Line 12: stop on a small gain or an exhausted iteration budget.
        bottleneck = lat_a[rows, src]
        accept = (bottleneck - f > eps * bottleneck) & (k[a] < k_max)
        active[a[~accept]] = False
        if not accept.any():
            break
        r = np.flatnonzero(accept)
        a, s, d, ee, xm, rr = a[r], src[r], dst[r], e[r], xmove[r], np.arange(r.size)
        col_n1, vin1, vout1 = col_n1[r], vin1[r], vout1[r]
        for col in (col_n1, vin1):
            col[rr, s] -= xm
            col[rr, d] += xm
        comp1 = comp[a] - t_old[r] + costs.expert_time(col_n1)
        n[a, ee, :] = col_n1
        comp[a], vin[a], vout[a] = comp1, vin1, vout1
        lat[a] = comp1 + c * np.maximum(vin1, vout1)
        nd = need[r]
        P[a[nd], ee[nd], d[nd]] = True
        cin[a, d] += nd
        cout[a, s] += nd
        moves[a, k[a]] = np.stack([ee, s, d, np.rint(xm + own[r]).astype(np.int64)], axis=1)
        k[a] += 1

    return Plan(
        n_LEG=n.astype(np.int64) if integral else n, placement_LEG=P, replicas_LEG=P & ~P0,
        bytes_moved_L=cin.sum(axis=1) * costs.expert_bytes,
        transfer_s_LG=np.maximum(cin, cout) * t_unit, iterations_L=k, moves_LK4=moves[:, :k_max],
        compute_LG=comp, comm_LG=c * np.maximum(vin, vout), latency_LG=lat, start_latency_LG=start_lat,
        load_LG=n.sum(axis=1), start_load_LG=start_load,
    )


def _rank_time(costs: PlanCosts, n_LEG: np.ndarray) -> np.ndarray:
    """(L, E, G) tokens -> (L, G) seconds: eq. 2 summed over each rank's active GEMM groups."""
    L, E, G = n_LEG.shape
    flat = n_LEG.reshape(-1)
    nz = np.flatnonzero(flat)
    if nz.size * 2 > flat.size:
        return costs.expert_time(n_LEG).sum(axis=1)
    # Replicated placements still leave most (expert, rank) cells empty: price only the active ones.
    idx = nz // (E * G) * G + nz % G
    return np.bincount(idx, weights=costs.expert_time(flat[nz]), minlength=L * G).reshape(L, G)


def _take_front(col_AG: np.ndarray, src_A: np.ndarray, amount_A: np.ndarray) -> np.ndarray:
    """(A, G) amounts taken from col_AG: up to amount_A from rank src_A first, the rest from ranks 0, 1, ..."""
    rows = np.arange(col_AG.shape[0])
    from_src = np.minimum(amount_A, col_AG[rows, src_A])
    other = col_AG.copy()
    other[rows, src_A] = 0.0
    before = np.cumsum(other, axis=1) - other
    take = np.clip((amount_A - from_src)[:, None] - before, 0.0, other)
    take[rows, src_A] = from_src
    return take


@dataclass(frozen=True)
class _Fill:
    """Latency of r_src and r_dst when x remote tokens of e* move from r_src to r_dst; all fields (A,).

    base_*: compute of the rank's other experts; n_*: tokens of e* there; vin_*, vout_*: remote tokens in,
    tokens out; avg: the cluster-wide mean latency before the move. No other rank changes.
    """

    costs: PlanCosts
    c: float
    base_s: np.ndarray
    n_s: np.ndarray
    vin_s: np.ndarray
    vout_s: np.ndarray
    base_d: np.ndarray
    n_d: np.ndarray
    vin_d: np.ndarray
    vout_d: np.ndarray
    avg: np.ndarray
    integral: bool

    def _pair(self, x_AJ: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(L_src, L_dst) after moving x_AJ tokens, both (A, J)."""
        col = (slice(None), None)
        t = self.costs.expert_time(np.concatenate([self.n_s[col] - x_AJ, self.n_d[col] + x_AJ], axis=1))
        J = x_AJ.shape[1]
        lat_s = self.base_s[col] + t[:, :J] + self.c * np.maximum(self.vin_s[col] - x_AJ, self.vout_s[col])
        lat_d = self.base_d[col] + t[:, J:] + self.c * np.maximum(self.vin_d[col] + x_AJ, self.vout_d[col])
        return lat_s, lat_d

    def _cross(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """On a grid over [lo, hi], the first point where L_src <= max(avg, L_dst) and the one before it.

        Returns (x_before, x_first, gap_before, gap_first) with gap = L_src - max(avg, L_dst); where no
        point qualifies, x_first = hi and both gaps are positive (the pool runs out first).
        """
        x = lo[:, None] + (hi - lo)[:, None] * (np.arange(GRID + 1) / GRID)
        lat_s, lat_d = self._pair(x)
        gap = lat_s - np.maximum(self.avg[:, None], lat_d)
        done = gap <= 0
        j = np.where(done.any(axis=1), np.argmax(done, axis=1), GRID)
        i = np.maximum(j - 1, 0)
        rows = np.arange(x.shape[0])
        return x[rows, i], x[rows, j], gap[rows, i], gap[rows, j]

    def solve(self, pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tokens to move (A,) in [0, pool] and the pair's peak latency after it (A,).

        The water level: the smallest x with L_src(x) <= max(avg, L_dst(x)), i.e. r_src reaches the
        cluster average or meets r_dst rising, else the whole pool. Found on a grid, refined once on the
        bracketing interval and interpolated linearly (exact when latency is linear in tokens); integer
        counts take whichever neighbouring integer gives the lower peak.
        """
        lo, hi, _, _ = self._cross(np.zeros_like(pool), pool)
        lo, hi, g_lo, g_hi = self._cross(lo, hi)
        crossing = (g_lo > 0) & (g_hi <= 0)
        frac = np.where(crossing, g_lo / np.where(crossing, g_lo - g_hi, 1.0), 1.0)
        x = np.where(g_lo <= 0, lo, lo + (hi - lo) * frac)
        if self.integral:
            cand = np.stack([np.floor(x), np.minimum(np.ceil(x), pool)], axis=1)
        else:
            cand = x[:, None]
        lat_s, lat_d = self._pair(cand)
        peak = np.maximum(lat_s, lat_d)
        j = np.argmin(peak, axis=1)
        rows = np.arange(cand.shape[0])
        return cand[rows, j], peak[rows, j]


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
