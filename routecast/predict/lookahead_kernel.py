"""PROBE's lookahead at decode size: router logits -> the union of each token's top-k, one compiled loop.

Shapes: logits_TE float32 (T tokens, E experts), correction_E float32 (sigmoid routers' score-correction
bias; zeros otherwise), out_E bool (True = some token's top-k holds the expert).

The same selection as RouterRule.forecast followed by topk, without building the forecast rows:
  score = logits (softmax routers: softmax is monotone, so the logits order the experts) or
          sigmoid(logits) + correction (sigmoid routers);
  with n_group > 1, each group's score (its max, or for sigmoid routers the sum of its top 2) picks the topk_group best
  groups, and only their experts stay;
  each token's `top` best remaining experts enter the union.
Equal scores may break differently from torch.topk (a measure-zero event on real logits).

Why a kernel: inside the runtime's MoE block this runs once per layer per decode step on one token.
The torch form is a dozen small tensor ops (sigmoid, view, top-2, scatter, masked_fill, topk, bincount),
each a few microseconds of dispatch, which the runtime measured as the lookahead's share of the run. The
loop over T x E scalars is a few hundred comparisons per token. Without numba it runs as plain Python
(same sets, slow): numba is a dependency, so that happens only in a broken install.
"""

from __future__ import annotations

import numpy as np


def _mark_best(values: np.ndarray, taken: np.ndarray, n: int) -> None:
    """Mark the n largest values not yet taken (the first index wins a tie)."""
    for _ in range(n):
        best = -1
        for i in range(values.shape[0]):
            if not taken[i] and (best < 0 or values[i] > values[best]):
                best = i
        taken[best] = True


def _union_topk(logits_TE: np.ndarray, correction_E: np.ndarray, sigmoid: bool, n_group: int, topk_group: int,
                group_top2: bool, top: int, out_E: np.ndarray) -> None:
    T, E = logits_TE.shape
    size = E // n_group
    score = np.empty(E, np.float32)
    gscore = np.empty(n_group, np.float32)
    keep = np.empty(n_group, np.bool_)
    taken = np.empty(E, np.bool_)
    for t in range(T):
        for e in range(E):
            x = logits_TE[t, e]
            score[e] = 1.0 / (1.0 + np.exp(-x)) + correction_E[e] if sigmoid else x
        if n_group > 1:
            for g in range(n_group):
                a = -np.inf
                b = -np.inf  # the group's best and second best
                for e in range(g * size, (g + 1) * size):
                    s = score[e]
                    if s > a:
                        b = a
                        a = s
                    elif s > b:
                        b = s
                gscore[g] = a + b if group_top2 else a
            keep[:] = False
            _mark_best(gscore, keep, topk_group)
            for g in range(n_group):
                if not keep[g]:
                    for e in range(g * size, (g + 1) * size):
                        score[e] = -np.inf
        taken[:] = False
        _mark_best(score, taken, top)
        for e in range(E):
            if taken[e]:
                out_E[e] = True


def _gate_logits(h_TH: np.ndarray, W_HE: np.ndarray, b_E: np.ndarray, norm_H: np.ndarray, eps: float,
                 out_TE: np.ndarray) -> None:
    """out = RMSNorm(h) @ W + b, the norm (h / sqrt(mean(h^2) + eps) * norm_H) skipped when norm_H is empty."""
    T, H = h_TH.shape
    E = W_HE.shape[1]
    x = np.empty(H, np.float32)
    for t in range(T):
        scale = 1.0
        if norm_H.shape[0]:
            acc = 0.0
            for i in range(H):
                acc += h_TH[t, i] * h_TH[t, i]
            scale = 1.0 / np.sqrt(acc / H + eps)
        for i in range(H):
            x[i] = h_TH[t, i] * scale * norm_H[i] if norm_H.shape[0] else h_TH[t, i]
        for e in range(E):
            out_TE[t, e] = b_E[e]
        for i in range(H):
            xi = x[i]
            for e in range(E):
                out_TE[t, e] += xi * W_HE[i, e]


try:  # numba is a dependency; the fallback keeps a broken install correct, only slow
    from numba import njit
except ImportError:  # pragma: no cover - depends on the environment
    njit = None
if njit is not None:
    _mark_best = njit(cache=True, nogil=True)(_mark_best)
    _union_topk = njit(cache=True, nogil=True)(_union_topk)
    _gate_logits = njit(cache=True, nogil=True)(_gate_logits)


def gate_logits(h_TH: np.ndarray, W_HE: np.ndarray, b_E: np.ndarray, norm_H: np.ndarray | None = None,
                eps: float = 0.0) -> np.ndarray:
    """Router logits (T, E) = h @ W + b, h first RMS-normed with weight norm_H (H,) and eps when given: one compiled
    loop instead of the handful of torch calls (each a few µs of dispatch) a decode-size matmul otherwise costs."""
    out = np.empty((h_TH.shape[0], W_HE.shape[1]), np.float32)
    _gate_logits(np.ascontiguousarray(h_TH, np.float32), W_HE, b_E,
                 np.zeros(0, np.float32) if norm_H is None else norm_H, float(eps), out)
    return out


def union_topk(logits_TE: np.ndarray, correction_E: np.ndarray, *, sigmoid: bool, n_group: int = 1,
               topk_group: int = 1, group_top2: bool = False, top: int) -> np.ndarray:
    """logits_TE (T, E) -> out_E bool: the union over tokens of each token's `top` experts by the router's rule
    (module docstring). top must not exceed the experts the group limit leaves (topk_group * E / n_group)."""
    T, E = logits_TE.shape
    if group_top2 and not sigmoid and n_group > 1:
        raise ValueError("union_topk: a softmax router's top-2 group score is a sum of probabilities, which the "
                         "logits do not order; expected the group max, or sigmoid scoring.")
    if E % n_group or not 1 <= topk_group <= n_group or not 1 <= top <= topk_group * (E // n_group):
        raise ValueError(f"union_topk: E {E}, n_group {n_group}, topk_group {topk_group}, top {top}; expected "
                         "n_group dividing E, 1 <= topk_group <= n_group and 1 <= top <= the experts the groups keep.")
    out = np.zeros(E, np.bool_)
    _union_topk(np.ascontiguousarray(logits_TE, np.float32), np.ascontiguousarray(correction_E, np.float32),
                bool(sigmoid), int(n_group), int(topk_group), bool(group_top2), int(top), out)
    return out
