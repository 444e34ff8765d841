"""Per-step replica moves on top of a co-activation plan (place.coact), PROBE-style, made only where they pay.

Legend: T steps, L MoE layers, E experts, G EP ranks, R replica slots per rank.

The home placement of a CoactPlan is kept; its R replica slots per rank are rewritten every step (as PROBE
rewrites its replica buffer each layer). For layer l of step t, knowing a forecast of the layer's loads
(horizon `layer`: a layer-ahead predictor) and each rank's hiding window (its compute of layer l-1 plus
the attention of layer l), the planner repeats, in every step at once:

    take the rank the forecast says finishes last; take its forecast-active expert with the most compute
    that has not moved yet; copy it to the rank (with a free slot) on which the forecast maximum is lowest;
    keep the move only when the forecast gain (old maximum - new maximum, seconds) exceeds the exposed
    transfer time the move adds on either end: max(0, (k + 1) t_x - W_g) - max(0, k t_x - W_g), with k the
    copies that rank already receives (or sends) in this layer, t_x = expert bytes / link bandwidth.

The moved expert's tokens then all run on its new copy. Forecast counts may be fractional (expected
counts): an expert counts as active with probability 1 - exp(-n) (at least one of n expected Poisson
arrivals) and is a move candidate when that is at least one half.
"""

from __future__ import annotations

import numpy as np

from routecast.place.coact import CoactPlan, RankPrice


def step_hosts(plan: CoactPlan, lay: int, decide_TE: np.ndarray, window_TG: np.ndarray, t_xfer: float,
               price: RankPrice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hosts of layer `lay` under per-step moves -> (host_TE int64 rank running each expert, in_TG, out_TG
    int64 copies each rank receives / sends). window_TG: seconds each rank's transfers hide behind."""
    T, E = decide_TE.shape
    G = plan.num_ranks
    R = plan.extra_LGR.shape[2]
    home = plan.home_LE[lay]
    F, X, A = price.parts(decide_TE)
    host = np.broadcast_to(home, (T, E)).copy()
    oh = np.eye(G)[home]
    Fs, Xs, As = F @ oh, X @ oh, A @ oh
    n_in, n_out = np.zeros((T, G), np.int64), np.zeros((T, G), np.int64)
    moved = np.zeros((T, E), bool)
    rows = np.arange(T)
    cand_ok = X >= 0.5
    for _ in range(G * R):
        times = price.time(Fs, Xs, As)
        gm = np.argmax(times, axis=1)
        on = (host == gm[:, None]) & cand_ok & ~moved
        if not on.any():
            break
        e = np.argmax(np.where(on, F + 1e-30, -1.0), axis=1)  # most compute; any active one in decode
        ok = on[rows, e]
        fe, xe, ae = F[rows, e], X[rows, e], A[rows, e]
        t_to = price.time(Fs + fe[:, None], Xs + xe[:, None], As + ae[:, None])  # (T, G) if e went to g
        t_from = price.time(Fs[rows, gm] - fe, Xs[rows, gm] - xe, As[rows, gm] - ae)
        others = times.copy()
        others[rows, gm] = -np.inf
        new_max = np.empty((T, G))
        for g in range(G):  # max over the ranks other than gm and g, with gm and g changed
            rest = others.copy()
            rest[:, g] = -np.inf
            new_max[:, g] = np.maximum(rest.max(axis=1), np.maximum(t_from, t_to[:, g]))
        new_max[(n_in >= R)] = np.inf
        new_max[rows, gm] = np.inf
        g = np.argmin(new_max, axis=1)
        gain = times.max(axis=1) - new_max[rows, g]
        w_to, w_from = window_TG[rows, g], window_TG[rows, gm]
        k_to, k_from = n_in[rows, g], n_out[rows, gm]
        exp_to = np.maximum(0.0, (k_to + 1) * t_xfer - w_to) - np.maximum(0.0, k_to * t_xfer - w_to)
        exp_from = np.maximum(0.0, (k_from + 1) * t_xfer - w_from) - np.maximum(0.0, k_from * t_xfer - w_from)
        take = ok & np.isfinite(gain) & (gain > np.maximum(exp_to, exp_from) + 1e-12)
        moved[rows, e] |= ok  # tried: not offered again this step
        t = rows[take]
        et, gt, st = e[take], g[take], gm[take]
        host[t, et] = gt
        for S, P in ((Fs, F), (Xs, X), (As, A)):
            S[t, st] -= P[t, et]
            S[t, gt] += P[t, et]
        n_in[t, gt] += 1
        n_out[t, st] += 1
    return host, n_in, n_out
