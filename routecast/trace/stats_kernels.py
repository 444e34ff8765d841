"""Compiled loops of the token-level routing statistics (numba, cached on disk after the first call).

Shapes (legend in spec.py): experts_TLK int16 (-1 = dropped slot), weights_TLK float, counts int64.
Each kernel is one pass over its input with scalar increments: the numpy formulations they replace
built (T, L, K, K) or (T, L, K) int64/float temporaries and sorted them, and measured 5-20x slower on a
DeepSeek-V3 geometry sample (benchmarks/stats_throughput.py). Without numba they run as plain Python
(same results, slow): numba is a dependency, so that happens only in a broken install.
"""

from __future__ import annotations

import numpy as np


def _top1(experts_TLK: np.ndarray, weights_TLK: np.ndarray) -> np.ndarray:
    T, L, K = experts_TLK.shape
    out = np.full((T, L), -1, np.int16)
    for t in range(T):
        for l in range(L):
            best = -np.inf
            for k in range(K):
                e = experts_TLK[t, l, k]
                if e >= 0 and (out[t, l] < 0 or weights_TLK[t, l, k] > best):
                    best = weights_TLK[t, l, k]
                    out[t, l] = e
    return out


def _add_transitions(experts_TLK: np.ndarray, out: np.ndarray) -> None:
    T, L, K = experts_TLK.shape
    for l in range(L - 1):  # layer outermost: one (E, E) block stays in cache while all tokens add to it
        for t in range(T):
            for i in range(K):
                a = experts_TLK[t, l, i]
                if a < 0:
                    continue
                for j in range(K):
                    b = experts_TLK[t, l + 1, j]
                    if b >= 0:
                        out[l, a, b] += 1


def _group_counts(experts_TLK: np.ndarray, group_T: np.ndarray, num_groups: int, num_experts: int,
                  out: np.ndarray) -> None:
    T, L, K = experts_TLK.shape
    for t in range(T):
        g = group_T[t]
        if g < 0 or g >= num_groups:
            continue
        for l in range(L):
            for k in range(K):
                e = experts_TLK[t, l, k]
                if e >= 0:
                    out[g, l, e] += 1


def _transition_hits(P_LEE: np.ndarray, experts_TLK: np.ndarray, top1_TL: np.ndarray, hits: np.ndarray,
                     total: np.ndarray) -> None:
    T, L, K = experts_TLK.shape
    E = P_LEE.shape[2]
    score = np.empty(E, P_LEE.dtype)
    for l in range(L - 1):
        for t in range(T):
            true = top1_TL[t, l + 1]
            score[:] = 0
            any_valid = False
            for k in range(K):
                a = experts_TLK[t, l, k]
                if a >= 0:
                    any_valid = True
                    for e in range(E):
                        score[e] += P_LEE[l, a, e]
            if true < 0 or not any_valid:
                continue
            best = 0
            for e in range(1, E):
                if score[e] > score[best]:
                    best = e
            total[l] += 1
            if best == true:
                hits[l] += 1


try:  # numba is a dependency; the fallback keeps a broken install correct, only slow
    from numba import njit
except ImportError:  # pragma: no cover - depends on the environment
    njit = None
if njit is not None:
    _top1, _add_transitions, _group_counts, _transition_hits = (
        njit(cache=True, nogil=True)(f) for f in (_top1, _add_transitions, _group_counts, _transition_hits))


def top1_TL(experts_TLK: np.ndarray, weights_TLK: np.ndarray) -> np.ndarray:
    """Each token's highest-weight routed expert per layer: int16 (T, L), -1 where every slot was dropped.

    Ties go to the earliest slot (as np.argmax).
    """
    return _top1(np.ascontiguousarray(experts_TLK), np.ascontiguousarray(weights_TLK))


def transition_counts(experts_TLK: np.ndarray, num_experts: int) -> np.ndarray:
    """(a at layer l, b at layer l+1) pair counts over every token's top-k sets: int64 (L-1, E, E)."""
    L = experts_TLK.shape[1]
    out = np.zeros((max(L - 1, 0), num_experts, num_experts), np.int64)
    _add_transitions(np.ascontiguousarray(experts_TLK), out)
    return out


def add_transitions(experts_TLK: np.ndarray, out_LEE: np.ndarray) -> np.ndarray:
    """out_LEE[l, a, b] += 1 for every (a in set_l, b in set_l+1) pair of every token; -> out (any dtype)."""
    _add_transitions(np.ascontiguousarray(experts_TLK), out_LEE)
    return out_LEE


def add_group_counts(experts_TLK: np.ndarray, group_T: np.ndarray, out_GLE: np.ndarray) -> np.ndarray:
    """out_GLE[g, l, e] += routed slots of tokens with group_T == g (groups outside 0..G-1 skipped); -> out."""
    _group_counts(np.ascontiguousarray(experts_TLK), np.ascontiguousarray(group_T, dtype=np.int64),
                  out_GLE.shape[0], out_GLE.shape[2], out_GLE)
    return out_GLE


def transition_hits(P_LEE: np.ndarray, experts_TLK: np.ndarray, top1_TL: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Score "layer l+1's expert = argmax_b sum_{a in set_l} P[l, a, b]" -> (hits, scored) int64 (L-1,).

    P_LEE float32 (L-1, E, E); a token counts where it has a top-1 expert at l+1 and a routed slot at l.
    Ties go to the lowest expert id (as np.argmax).
    """
    L = experts_TLK.shape[1]
    hits, total = np.zeros(max(L - 1, 0), np.int64), np.zeros(max(L - 1, 0), np.int64)
    _transition_hits(np.ascontiguousarray(P_LEE, np.float32), np.ascontiguousarray(experts_TLK),
                     np.ascontiguousarray(top1_TL), hits, total)
    return hits, total
