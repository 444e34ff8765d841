"""Per-step replica moves on top of a co-activation plan (place.coact), PROBE-style, made only where they pay.

Legend: T steps, L MoE layers, E experts, G EP ranks, R replica slots per rank.

The home placement of a CoactPlan is kept and its R replica slots per rank start with the plan's replicas.
A slot keeps what it holds from one step to the next (using it again costs nothing); a step may overwrite a
slot it does not use with a new copy (one weight transfer). For layer l of step t, knowing a forecast of
the layer's loads (horizon `layer`: a layer-ahead predictor) and each rank's hiding window (its compute of
layer l-1 plus the attention of layer l):

  1. dispatch as place.coact does: replicated experts, in training-load order, each go wholly to the copy
     whose rank the forecast says finishes first;
  2. then repeat: take the rank the forecast says finishes last and its forecast-active expert with the
     most compute that has not been tried; copy it into an unused slot of the rank that gives the lowest
     smooth maximum (tau log sum_g exp(time_g / tau), tau half a weight read: it also falls when one of
     several tied slowest ranks speeds up). Keep the move when that falls and the transfer hides in both
     ranks' windows, or, when it would be exposed, only when the forecast gain of the hard maximum
     (seconds) exceeds the exposed time it adds on either end: max(0, (k + 1) t_x - W_g) - max(0, k t_x - W_g),
     k the copies that rank already receives (or sends) in this layer, t_x = expert bytes / link bandwidth.
The moved expert's tokens then all run on its new copy. Forecast counts may be fractional (expected
counts): an expert counts as active with probability 1 - exp(-n) and is a move candidate from one half.
"""

from __future__ import annotations

import numpy as np

from routecast.place.coact import CoactPlan, RankPrice


def step_hosts(plan: CoactPlan, lay: int, decide_TE: np.ndarray, window_TG: np.ndarray, t_xfer: float,
               price: RankPrice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hosts of layer `lay` under per-step moves -> (host_TE int64 rank running each expert, in_TG, out_TG
    int64 copies each rank receives / sends). window_TG: seconds each rank's transfers hide behind.

    Steps run in order (a slot keeps its copy into the next step); each step's arrays are (E,) and (G, R).
    """
    T, E = decide_TE.shape
    G, R = plan.num_ranks, plan.extra_LGR.shape[2]
    home = plan.home_LE[lay]
    order = plan.order_LE[lay]
    slots = plan.extra_LGR[lay].copy()
    F, X, A = price.parts(decide_TE)
    tau = 0.5 * price.t_read
    host_TE = np.empty((T, E), np.int64)
    n_in, n_out = np.zeros((T, G), np.int64), np.zeros((T, G), np.int64)
    ranks = np.arange(G)
    for t in range(T):
        f, x, a = F[t], X[t], A[t]
        host = home.copy()
        rep = [int(e) for e in order if (slots == e).any()]
        nonrep = np.ones(E, bool)
        nonrep[rep] = False
        Fs = np.bincount(home[nonrep], f[nonrep], G)
        Xs = np.bincount(home[nonrep], x[nonrep], G)
        As = np.bincount(home[nonrep], a[nonrep], G)
        used = np.zeros((G, R), bool)
        for e in rep:  # 1. dispatch over resident copies
            cand = np.concatenate([[home[e]], ranks[(slots == e).any(axis=1)]])
            g = int(cand[np.argmin(price.time(Fs[cand] + f[e], Xs[cand] + x[e], As[cand] + a[e]))]) if x[e] > 0 \
                else int(home[e])
            host[e] = g
            Fs[g] += f[e]
            Xs[g] += x[e]
            As[g] += a[e]
            used[g] |= slots[g] == e
        tried = x < 0.5
        for _ in range(G * R):  # 2. moves into unused slots
            times = price.time(Fs, Xs, As)
            gm = int(np.argmax(times))
            on = (host == gm) & ~tried
            if not on.any():
                break
            e = int(np.argmax(np.where(on, f + 1e-30, -1.0)))
            tried[e] = True
            free = ~used.all(axis=1)
            free[gm] = False
            free &= ~(slots == e).any(axis=1)  # a rank already holding e was offered in the dispatch
            if not free.any():
                continue
            t_from = price.time(Fs[gm] - f[e], Xs[gm] - x[e], As[gm] - a[e])
            t_to = price.time(Fs + f[e], Xs + x[e], As + a[e])
            m0 = times.max()
            z = np.exp((times - m0) / tau)
            rest = z.sum() - z[gm] - z
            soft = np.where(free, m0 + tau * np.log(np.maximum(rest, 0.0) + np.exp((t_from - m0) / tau)
                                                      + np.exp((t_to - m0) / tau)), np.inf)
            g = int(np.argmin(soft))
            gain = m0 + tau * np.log(z.sum()) - soft[g]
            after = times.copy()
            after[gm], after[g] = t_from, t_to[g]
            hard = m0 - after.max()
            w_to, w_from = window_TG[t, g], window_TG[t, gm]
            k_to, k_from = n_in[t, g], n_out[t, gm]
            cost = max(max(0.0, (k_to + 1) * t_xfer - w_to) - max(0.0, k_to * t_xfer - w_to),
                       max(0.0, (k_from + 1) * t_xfer - w_from) - max(0.0, k_from * t_xfer - w_from))
            if not (gain > 1e-12 * tau and (cost <= 0 or hard > cost)):
                continue
            open_r = np.flatnonzero(~used[g])
            r = int(open_r[np.argmin(np.where(slots[g, open_r] >= 0, x[np.maximum(slots[g, open_r], 0)], -1.0))])
            slots[g, r] = e  # overwrite the unused copy least likely to be needed (an empty slot first)
            used[g, r] = True
            host[e] = g
            Fs[gm] -= f[e]
            Xs[gm] -= x[e]
            As[gm] -= a[e]
            Fs[g] += f[e]
            Xs[g] += x[e]
            As[g] += a[e]
            n_in[t, g] += 1
            n_out[t, gm] += 1
        host_TE[t] = host
    return host_TE, n_in, n_out
