"""Placement for weight-read-bound steps: spread experts that fire together, replicate where slots allow.

Legend: N training steps, T steps, L MoE layers, E experts, G EP ranks, R replica slots per rank.

In a decode step each active expert on a rank costs one weight read whatever its token count, so a rank's
time is set by the distinct experts it runs (sim.cost roofline "rank": max(token compute, distinct x read)
plus per-call work). Balancing tokens (EPLB, MoE-GPS, PROBE) does not lower that; what does is putting
experts that are active in the same step on different ranks, so no rank collects many of a step's active
experts. The planner minimises, per layer, the expected step time of the slowest rank,

    J = mean_t  tau log sum_g exp(time_tg / tau),   time_tg = max(F_tg, t_read X_tg) + A_tg,

over training steps t (a smooth maximum: within tau log G of E[max_g time], and it breaks the ties that
integer distinct counts leave), where F_tg, X_tg and A_tg are rank g's token compute, distinct active
experts and fixed per-call work under the plan. It fits on steps of held-in traffic (co-activation is a
property of the model and the batch size, not of one request), then serves unseen steps:

  1. home placement: E / G experts per rank, from static sharding, improved by pair swaps (a swap moves
     two experts between two ranks; every pair's change of J is evaluated at once on the (N, E, E) grid;
     swaps on disjoint rank pairs are applied together when J falls);
  2. replicas: each of the G x R extra slots gets the (expert, rank) copy that lowers J most, given that a
     replicated expert's tokens go, per step, to the one copy whose rank it slows least (dispatch below);
  3. dispatch, per step: non-replicated experts run at home; each replicated expert (in order of training
     load) goes wholly to the copy whose rank would then finish first, judged on `decide` loads: the
     forecast of the step (causal: a layer-ahead predictor) or, for the oracle row, the actual loads.
     An expert forecast idle stays home. Whole, not split: a split costs a second weight read.
Weights move only when the plan is made (once, before serving), not per step.

Why a local search and not a graph partitioner: METIS (pymetis) and Mt-KaHyPar minimise the weight of cut
edges; keeping co-firing experts apart is the opposite (a balanced max-cut of the co-activation graph), and
the quantity that sets the time, the expected maximum over ranks of a per-step sum, is not a sum over pairs
(a pair objective also misses hot experts that fire with everything and the compute term of large batches).
The swap search optimises that maximum itself, on every training step, vectorised over all pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from routecast.common.errors import ConfigError
from routecast.place.slots import SlotPlan
from routecast.sim.hardware import Hardware
from routecast.sim.models import ModelProfile


@dataclass(frozen=True, kw_only=True)
class RankPrice:
    """The rank roofline of sim.cost (roofline "rank") per expert: seconds.

    t_read: one expert's weight read; call: fixed cost per active expert call; per_token: FLOPs of one token
    through one expert / peak; act: activation work per token per expert; hw: for the GEMM efficiency curve.
    """

    t_read: float
    call: float
    per_token: float
    act: float
    hw: Hardware

    @classmethod
    def of(cls, model: ModelProfile, hw: Hardware) -> RankPrice:
        return cls(t_read=float(hw.weight_read_time(model.expert_bytes())), call=hw.expert_call_overhead,
                   per_token=model.expert_flops_per_token / hw.peak_flops,
                   act=hw.activation_cost * (3 * model.hidden_size + 2 * model.expert_ffn), hw=hw)

    def parts(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Counts (..., E) -> (compute F, active X, fixed A), each (..., E) float64 seconds / 0-1.

        Fractional counts (a forecast's expected counts) give expected parts: X = P(active) = 1 - exp(-n), the
        chance that at least one of n expected (Poisson) arrivals comes.
        """
        n = np.asarray(n, np.float64)
        F = np.where(n > 0, n * self.per_token / self.hw.eta(n), 0.0)
        X = (n > 0).astype(np.float64) if np.array_equal(n, np.rint(n)) else 1.0 - np.exp(-n)
        return F, X, X * self.call + n * self.act

    def time(self, F: np.ndarray, X: np.ndarray, A: np.ndarray) -> np.ndarray:
        """Per-rank sums -> rank time max(F, t_read X) + A (same shape)."""
        return np.maximum(F, self.t_read * X) + A


@dataclass(frozen=True, kw_only=True)
class CoactPlan:
    """home_LE int64 (L, E): rank of each expert's home copy (E / G per rank); extra_LGR int64 (L, G, R):
    expert in each replica slot of each rank (-1 empty); order_LE: (L, E) dispatch order of replicated experts
    (training load, largest first)."""

    home_LE: np.ndarray
    extra_LGR: np.ndarray
    order_LE: np.ndarray

    @property
    def num_ranks(self) -> int:
        return int(self.extra_LGR.shape[1])

    def hosts_LEG(self) -> np.ndarray:
        """bool (L, E, G): rank g holds a copy of expert e."""
        L, E = self.home_LE.shape
        h = np.zeros((L, E, self.num_ranks), bool)
        h[np.arange(L)[:, None], np.arange(E)[None], self.home_LE] = True
        lay, g, _ = np.nonzero(self.extra_LGR >= 0)
        h[lay, self.extra_LGR[self.extra_LGR >= 0], g] = True
        return h

    def slot_plan(self, layer_ids: tuple[int, ...] | None = None) -> SlotPlan:
        """The plan as physical slots (home experts, then replicas; shares even), validated."""
        L, E = self.home_LE.shape
        G, R = self.num_ranks, self.extra_LGR.shape[2]
        per = E // G
        homes = np.argsort(self.home_LE, axis=1, kind="stable").reshape(L, G, per)
        slots = np.concatenate([homes, self.extra_LGR], axis=2).reshape(L, G * (per + R))
        ids = tuple(range(L)) if layer_ids is None else tuple(layer_ids)
        return SlotPlan(slots_LS=slots.astype(np.int64), share_LS=(slots >= 0).astype(np.float64), num_ranks=G,
                        num_experts=E, layer_ids=ids, method="coact").validate()


def _lse(times: np.ndarray, tau: float) -> np.ndarray:
    """(..., G) -> (...) tau log sum exp(times / tau), stable."""
    m = times.max(axis=-1, keepdims=True)
    return m[..., 0] + tau * np.log(np.exp((times - m) / tau).sum(axis=-1))


def _swap_search(F, X, A, home, price: RankPrice, tau: float, max_iter: int) -> np.ndarray:
    """Pair swaps of the home placement of one layer that lower J; (N, E) parts, (E,) home -> new home."""
    N, E = F.shape
    G = int(home.max()) + 1
    home = home.copy()
    for _ in range(max_iter):
        oh = np.eye(G)[home]  # (E, G)
        Fs, Xs, As = F @ oh, X @ oh, A @ oh
        times = price.time(Fs, Xs, As)
        m = times.max(axis=1, keepdims=True)
        z = np.exp((times - m) / tau)  # (N, G)
        J0 = float((m[:, 0] + tau * np.log(z.sum(axis=1))).mean())
        # rank of a after a is swapped out for b: (N, E_a, E_b)
        ga = home
        nf = Fs[:, ga][:, :, None] - F[:, :, None] + F[:, None, :]
        nx = Xs[:, ga][:, :, None] - X[:, :, None] + X[:, None, :]
        na = As[:, ga][:, :, None] - A[:, :, None] + A[:, None, :]
        za = np.exp((price.time(nf, nx, na) - m[:, :, None]) / tau)
        rest = z.sum(axis=1)[:, None, None] - z[:, ga][:, :, None] - z[:, ga][:, None, :]
        tot = np.maximum(rest, 0.0) + za + za.transpose(0, 2, 1)
        J = (m[:, 0, None, None] + tau * np.log(np.maximum(tot, 1e-300))).mean(axis=0)
        J[ga[:, None] == ga[None, :]] = np.inf
        gain = J0 - J
        best = np.argsort(-gain, axis=None)
        picked, used = [], set()
        for k in best[: 4 * E]:
            a, b = divmod(int(k), E)
            if gain[a, b] <= 1e-12 * max(abs(J0), 1e-30):
                break
            if home[a] in used or home[b] in used:
                continue
            picked.append((a, b))
            used.update((home[a], home[b]))
        if not picked:
            break
        trial = home.copy()
        for a, b in picked:
            trial[a], trial[b] = home[b], home[a]
        if len(picked) > 1 and _objective(F, X, A, trial, None, price, tau) >= J0:
            a, b = picked[0]  # the batch interfered: take only the best swap
            trial = home.copy()
            trial[a], trial[b] = home[b], home[a]
        home = trial
    return home


def _dispatch(F, X, A, home, extra, order, price: RankPrice) -> np.ndarray:
    """(N, E) parts of the decide loads -> (N, E) int64 rank that runs each expert in each step."""
    N, E = F.shape
    G = extra.shape[0]
    host = np.broadcast_to(home, (N, E)).copy()
    rep = [e for e in order if (extra == e).any()]
    if not rep:
        return host
    base = np.ones(E, bool)
    base[rep] = False
    oh = np.eye(G)[home] * base[:, None]
    Fs, Xs, As = F @ oh, X @ oh, A @ oh
    rows = np.arange(N)
    for e in rep:
        cand = np.unique(np.concatenate([[home[e]], np.flatnonzero((extra == e).any(axis=1))]))
        t_new = price.time(Fs[:, cand] + F[:, e, None], Xs[:, cand] + X[:, e, None], As[:, cand] + A[:, e, None])
        pick = cand[np.argmin(t_new, axis=1)]  # first minimum: home (listed first when lowest id) on ties
        pick = np.where(X[:, e] > 0, pick, home[e])
        host[:, e] = pick
        Fs[rows, pick] += F[:, e]
        Xs[rows, pick] += X[:, e]
        As[rows, pick] += A[:, e]
    return host


def _objective(F, X, A, home, extra, price: RankPrice, tau: float, order=None) -> float:
    N, E = F.shape
    G = int(home.max()) + 1
    if extra is None:
        host = np.broadcast_to(home, (N, E))
    else:
        host = _dispatch(F, X, A, home, extra, order, price)
    oh = np.zeros((N, E, G))
    oh[np.arange(N)[:, None], np.arange(E)[None], host] = 1.0
    times = price.time(np.einsum("ne,neg->ng", F, oh), np.einsum("ne,neg->ng", X, oh),
                       np.einsum("ne,neg->ng", A, oh))
    return float(_lse(times, tau).mean())


def _add_replicas(F, X, A, home, R: int, order, price: RankPrice, tau: float) -> np.ndarray:
    """Fill R replica slots per rank greedily, each with the (expert, rank) copy that lowers J most."""
    N, E = F.shape
    G = int(home.max()) + 1
    extra = np.full((G, R), -1, np.int64)
    for _ in range(G * R):
        host = _dispatch(F, X, A, home, extra, order, price)
        oh = np.zeros((N, E, G))
        oh[np.arange(N)[:, None], np.arange(E)[None], host] = 1.0
        Fs, Xs, As = (np.einsum("ne,neg->ng", P, oh) for P in (F, X, A))
        times = price.time(Fs, Xs, As)
        m = times.max(axis=1, keepdims=True)
        z = np.exp((times - m) / tau)
        J0 = m[:, 0] + tau * np.log(z.sum(axis=1))  # (N,)
        # per step: move e from its current rank h to g (N, E, G); keep it when that is not better
        h = host
        t_from = price.time(Fs[np.arange(N)[:, None], h] - F, Xs[np.arange(N)[:, None], h] - X,
                            As[np.arange(N)[:, None], h] - A)  # (N, E)
        t_to = price.time(Fs[:, None, :] + F[:, :, None], Xs[:, None, :] + X[:, :, None], As[:, None, :] + A[:, :, None])
        zh = np.take_along_axis(z, h, axis=1)  # (N, E)
        rest = z.sum(axis=1)[:, None, None] - zh[:, :, None] - z[:, None, :]
        new = np.maximum(rest, 0.0) + np.exp((t_from - m)[:, :, None] / tau) + np.exp((t_to - m[:, :, None]) / tau)
        Jn = m[:, 0, None, None] + tau * np.log(np.maximum(new, 1e-300))
        # a step keeps the expert where it is when the copy does not help; a copy on its own rank changes nothing
        Jn = np.where(h[:, :, None] == np.arange(G), J0[:, None, None], np.minimum(Jn, J0[:, None, None]))
        gain = J0.mean() - Jn.mean(axis=0)  # (E, G)
        hosts = np.zeros((E, G), bool)
        hosts[np.arange(E), home] = True
        for g in range(G):
            hosts[extra[g][extra[g] >= 0], g] = True
        full = (extra >= 0).all(axis=1)
        gain[hosts | full[None, :]] = -np.inf
        e, g = divmod(int(np.argmax(gain)), G)
        if not np.isfinite(gain[e, g]) or gain[e, g] <= 0:
            break
        extra[g, int(np.argmax(extra[g] < 0))] = e
    return extra


def fit_coact(loads_NLE: np.ndarray, *, num_ranks: int, replicas_per_rank: int, price: RankPrice,
              tau: float | None = None, max_iter: int = 60, max_steps: int = 256, seed: int = 0) -> CoactPlan:
    """Fit the plan of the module docstring on (N, L, E) training step loads (int counts) -> CoactPlan.

    num_ranks: G (E % G == 0); replicas_per_rank: R extra slots per rank (E / G + R slots each); tau: smoothing
    of the maximum in seconds (default half a weight read); max_iter: swap rounds per layer; max_steps: at most
    this many training steps are used (a seeded sample), bounding the (N, E, E) swap grid.
    """
    x = np.asarray(loads_NLE)
    if x.ndim != 3 or 0 in x.shape or (x < 0).any():
        raise ConfigError(f"loads has shape {x.shape}; expected (steps, layers, experts) counts >= 0.")
    N, L, E = x.shape
    G, R = int(num_ranks), int(replicas_per_rank)
    if G < 1 or E % G:
        raise ConfigError(f"num_ranks is {num_ranks}; expected a positive divisor of the {E} experts.")
    if R < 0 or R > E - E // G:
        raise ConfigError(f"replicas_per_rank is {replicas_per_rank}; expected 0..{E - E // G}.")
    if N > max_steps:
        x = x[np.sort(np.random.default_rng(seed).choice(N, max_steps, replace=False))]
    tau = 0.5 * price.t_read if tau is None else float(tau)
    if tau <= 0:
        raise ConfigError(f"tau is {tau}; expected a positive smoothing time in seconds.")
    homes, extras, orders = [], [], []
    static = np.arange(E) // (E // G)
    for lay in range(L):
        F, X, A = price.parts(x[:, lay])
        order = np.argsort(-x[:, lay].sum(axis=0), kind="stable")
        home = _swap_search(F, X, A, static, price, tau, max_iter) if G > 1 else static
        extra = _add_replicas(F, X, A, home, R, order, price, tau) if G > 1 and R else np.full((G, R), -1, np.int64)
        homes.append(home)
        extras.append(extra)
        orders.append(order)
    return CoactPlan(home_LE=np.stack(homes), extra_LGR=np.stack(extras).reshape(L, G, R), order_LE=np.stack(orders))


def coact_counts(plan: CoactPlan, loads_TLE: np.ndarray, price: RankPrice, decide_TLE: np.ndarray | None = None
                 ) -> np.ndarray:
    """Per-rank assignments of (T, L, E) loads under the plan -> (T, L, G, E) float64 counts.

    decide_TLE: the loads that choose each replicated expert's copy per step (a forecast; None = the actual
    loads, the oracle). Every expert's tokens run wholly on one of its copies.
    """
    loads = np.asarray(loads_TLE)
    T, L, E = loads.shape
    G = plan.num_ranks
    dec = loads if decide_TLE is None else np.asarray(decide_TLE)
    if dec.shape != loads.shape or plan.home_LE.shape != (L, E):
        raise ConfigError(f"loads {loads.shape}, decide {dec.shape} and plan {plan.home_LE.shape} disagree; "
                          "expected (T, L, E) for both and a plan of (L, E).")
    out = np.zeros((T, L, G, E))
    t_idx, e_idx = np.arange(T)[:, None], np.arange(E)[None]
    for lay in range(L):
        F, X, A = price.parts(dec[:, lay])
        host = _dispatch(F, X, A, plan.home_LE[lay], plan.extra_LGR[lay], plan.order_LE[lay], price)
        out[t_idx, lay, host, e_idx] = loads[:, lay]
    return out
