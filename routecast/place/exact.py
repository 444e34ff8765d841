"""Exact minimum of EPLB's objective for tiny cases: the yardstick the greedy heuristic is measured against.

Legend: L layers, E experts, S slots, G GPUs, C candidate replica-count vectors.

EPLB's model (eplb.py): every expert gets c_e >= 1 of the S slots (sum c_e = S), its load is split evenly
over its replicas (w_e / c_e each), and every GPU holds exactly S / G slots. The objective is the largest
GPU load. EPLB fixes the counts greedily first and packs afterwards; this module searches both jointly:

- counts: every composition of S into E positive parts (C(S-1, E-1) of them: 6,435 for 16 slots and 8
  experts), visited in increasing order of the lower bound max(mean, max_e w_e / c_e) and cut off as soon
  as that bound reaches the best packing found;
- packing, for given counts: one slot per GPU is the largest item; two slots per GPU are paired largest
  with smallest, which is optimal (exchange argument: if the largest item a_1 is paired with b while the
  smallest a_n sits with c, swapping b and a_n does not raise either pair's maximum); three or more slots
  per GPU use a depth-first branch and bound (tiny cases only: at most 12 slots).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import comb

import numpy as np

from routecast.common.errors import ConfigError

MAX_COMPOSITIONS = 200_000
MAX_DFS_SLOTS = 12


@dataclass(frozen=True, kw_only=True)
class ExactResult:
    """Optimal EPLB-model placements of L layers.

    max_load_L: (L,) the optimal largest GPU load; counts_LE: (L, E) replicas per expert;
    phy2log_LS: (L, S) an optimal slot map (slot s on GPU s // (S / G)), evaluable with eplb.gpu_loads.
    """

    max_load_L: np.ndarray
    counts_LE: np.ndarray
    phy2log_LS: np.ndarray


def compositions(total: int, parts: int) -> np.ndarray:
    """(C, parts) int64: every way to write `total` as an ordered sum of `parts` positive integers."""
    n = comb(total - 1, parts - 1)
    if n > MAX_COMPOSITIONS:
        raise ConfigError(
            f"{total} slots over {parts} experts give {n} replica-count vectors; expected <= {MAX_COMPOSITIONS}."
        )
    cuts = np.array(list(combinations(range(1, total), parts - 1)), dtype=np.int64).reshape(n, parts - 1)
    edges = np.concatenate([np.zeros((n, 1), np.int64), cuts, np.full((n, 1), total, np.int64)], axis=1)
    return np.diff(edges, axis=1)


def _items(w_E: np.ndarray, counts_CE: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate, the S slot items sorted heaviest first: (values_CS, expert_CS)."""
    C, E = counts_CE.shape
    S = int(counts_CE[0].sum())
    cum = np.cumsum(counts_CE, axis=1)
    expert = (cum[:, :, None] <= np.arange(S)).sum(axis=1)  # (C, S): expert of the s-th replica
    vals = w_E[expert] / np.take_along_axis(counts_CE, expert, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(vals, order, axis=1), np.take_along_axis(expert, order, axis=1)


def _pack_dfs(vals_S: np.ndarray, G: int, per: int, best: float) -> tuple[float, np.ndarray | None]:
    """Min-max packing of sorted items into G bins of `per` items; (value, bin of each item) if < best."""
    S = vals_S.size
    load, fill = np.zeros(G), np.zeros(G, dtype=np.int64)
    assign = np.empty(S, dtype=np.int64)
    found: list = [best, None]

    def go(i: int, cur: float) -> None:
        if cur >= found[0]:
            return
        if i == S:
            found[0], found[1] = cur, assign.copy()
            return
        seen: set[tuple[float, int]] = set()
        for g in np.argsort(load, kind="stable"):
            if fill[g] == per or (load[g], fill[g]) in seen:  # equal bins are interchangeable
                continue
            seen.add((load[g], fill[g]))
            load[g] += vals_S[i]
            fill[g] += 1
            assign[i] = g
            go(i + 1, max(cur, load[g]))
            load[g] -= vals_S[i]
            fill[g] -= 1

    go(0, 0.0)
    return found[0], found[1]


def _best_layer(w_E: np.ndarray, S: int, G: int) -> tuple[float, np.ndarray, np.ndarray]:
    E, per = w_E.size, S // G
    counts = compositions(S, E)
    bound = np.maximum(w_E.sum() / G, (w_E / counts).max(axis=1))
    vals, expert = _items(w_E, counts)
    if per <= 2:
        pair = vals[:, :G] + (vals[:, ::-1][:, :G] if per == 2 else 0.0)
        value = pair.max(axis=1)
        c = int(np.argmin(value))
        bins = np.concatenate([np.arange(G), np.arange(G)[::-1]])[:S]
        slot_order = np.argsort(bins * per + np.arange(S) // G, kind="stable")
        return float(value[c]), counts[c], expert[c][slot_order]
    if S > MAX_DFS_SLOTS:
        raise ConfigError(f"num_slots is {S} with {per} per GPU; the exact search handles <= {MAX_DFS_SLOTS}.")
    best, best_c, best_bins = np.inf, -1, None
    for c in np.argsort(bound, kind="stable"):
        if bound[c] >= best:
            break
        v, bins = _pack_dfs(vals[c], G, per, best)
        if bins is not None:
            best, best_c, best_bins = v, int(c), bins
    assert best_bins is not None  # the first candidate always packs
    rank = np.empty(S, dtype=np.int64)
    for g in range(G):
        rank[best_bins == g] = np.arange(per)
    phy2log = np.empty(S, dtype=np.int64)
    phy2log[best_bins * per + rank] = expert[best_c]
    return float(best), counts[best_c], phy2log


def exact_rebalance(weight_LE: np.ndarray, num_slots: int, num_gpus: int) -> ExactResult:
    """Jointly optimal replica counts and packing under EPLB's model, per layer (tiny cases only).

    weight_LE: (L, E) loads; num_slots: S, a multiple of num_gpus and >= E. A Python loop over layers:
    each layer is an independent search over C(S-1, E-1) count vectors.
    """
    w = np.asarray(weight_LE, dtype=np.float64)
    if w.ndim != 2 or not np.isfinite(w).all() or (w < 0).any():
        raise ConfigError(f"weight_LE has shape {w.shape}; expected (layers, experts) of finite loads >= 0.")
    L, E = w.shape
    if num_gpus < 1 or num_slots % num_gpus or num_slots < E:
        raise ConfigError(f"num_slots is {num_slots}; expected a multiple of num_gpus = {num_gpus} and >= {E}.")
    out = [_best_layer(w[i], num_slots, num_gpus) for i in range(L)]
    return ExactResult(
        max_load_L=np.array([o[0] for o in out]),
        counts_LE=np.stack([o[1] for o in out]),
        phy2log_LS=np.stack([o[2] for o in out]),
    )
