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
    level is found on a grid of J points (by bisection), refined once on the bracketing interval, interpolated.
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
from routecast.place.probe_kernel import _plan_call
from routecast.sim.hardware import Hardware
from routecast.sim.models import ModelProfile


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

    Returns (x_LGE C-contiguous, int64 for integer loads and float64 otherwise, integral, P (1 or L, E, G) bool
    view, win (1 or L, 1 or G) float64). Integer loads are not copied to float64: a fresh (L, G, E) copy per
    call costs more than the plan at 58 x 32 x 256 (each call's large allocations fault their pages in anew).
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
    wide = kind == "u" and x.dtype.itemsize == 8 and x.size and int(x.max()) > np.iinfo(np.int64).max
    dtype = np.float64 if kind == "f" or wide else np.int64
    return (np.ascontiguousarray(x, dtype=dtype), kind != "f", P if P.ndim == 3 else P[None],
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
