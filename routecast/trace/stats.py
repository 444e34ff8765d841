"""Routing statistics: skewness (MoE-GPS), imbalance ratio (PROBE eq. 1), entropy, drift, affinity.

Shapes (legend in spec.py): counts_xE (..., E) token-slot counts; S steps (forward passes, in increasing
step order); W windows of consecutive steps; V token ids. A "slot" is one (token, layer, k) routing
choice; counts always count slots, so a layer's counts sum to K x tokens (minus dropped slots).

Definitions, as the papers state them:
- skewness (MoE-GPS §2): tokens of the most popular expert / mean tokens per expert; 1 = even, E = all
  on one expert.
- imbalance ratio IR (PROBE eq. 1): max rank load / mean rank load, expert e on rank e // (E / ep)
  (contiguous sharded placement); 1 = even, ep = everything on one rank.
- per-token-id concentration (s-MoE appendix A): the kurtosis of a token id's activation map, i.e. of
  the E-vector counting how often each expert was chosen over all occurrences of that token id.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

import routecast.trace.trace as trace_mod
from routecast.common.errors import ConfigError
from routecast.trace.stats_kernels import (  # noqa: F401 (top1_TL re-exported)
    add_group_counts,
    top1_TL,
    transition_counts,
    transition_hits,
)

if TYPE_CHECKING:
    from routecast.trace.trace import Trace

# Tokens per counting chunk: the int64 key buffer (chunk x L x K x 8 bytes, 3.8 MB at DeepSeek-V3
# geometry) stays cache-resident, which measured ~1.4x faster than one whole-trace bincount.
CHUNK_TOKENS = 1024
# Count entries (groups x L x (E+1)) per chunk: ~2 MB of int64, close to one core's L2 + L3 share.
COUNT_BLOCK_ENTRIES = 1 << 18


# ---------------------------------------------------------------------------------------- count-level
def skewness(counts_xE: np.ndarray) -> np.ndarray:
    """MoE-GPS skewness: tokens of the most popular expert / mean tokens per expert.

    counts_xE: (..., E) token counts. Returns (...) float64; 1.0 = perfectly even, E = all on one expert.
    Rows with no tokens give NaN.
    """
    c = np.asarray(counts_xE, dtype=np.float64)
    mean = c.mean(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mean > 0, c.max(axis=-1) / mean, np.nan)


def rank_loads(counts_xE: np.ndarray, ep: int) -> np.ndarray:
    """Per-rank load under contiguous sharded placement (expert e on rank e // (E / ep)).

    counts_xE: (..., E) with E divisible by ep. Returns (..., ep) float64.
    """
    c = np.asarray(counts_xE, dtype=np.float64)
    check_ep(ep, c.shape[-1])
    return c.reshape(*c.shape[:-1], ep, c.shape[-1] // ep).sum(axis=-1)


def imbalance_ratio(counts_xE: np.ndarray, ep: int) -> np.ndarray:
    """PROBE eq. 1: IR = max_r load_r / mean_r load_r under contiguous sharded placement on ep ranks.

    counts_xE: (..., E). Returns (...) float64; NaN where no tokens.
    """
    return skewness(rank_loads(counts_xE, ep))


def check_ep(ep: int, num_experts: int) -> None:
    """Raise ConfigError unless ep is a positive divisor of num_experts (contiguous sharding needs it)."""
    if isinstance(ep, bool) or not isinstance(ep, (int, np.integer)) or ep < 1 or num_experts % ep:
        raise ConfigError(f"ep is {ep!r}; expected a positive divisor of the number of experts {num_experts}.")


def entropy_bits(counts_xE: np.ndarray) -> np.ndarray:
    """Shannon entropy of the expert distribution, in bits.

    counts_xE: (..., E). Returns (...) float64 in [0, log2 E]; NaN where no tokens.
    """
    c = np.asarray(counts_xE, dtype=np.float64)
    tot = c.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = c / tot
        h = -np.where(p > 0, p * np.log2(np.where(p > 0, p, 1.0)), 0.0).sum(axis=-1)
    return np.where(tot[..., 0] > 0, h, np.nan)


def popularity_curve(counts_xE: np.ndarray) -> np.ndarray:
    """Share of slots per expert, sorted from most to least popular.

    counts_xE: (..., E). Returns (..., E) float64, each row non-increasing and summing to 1 (NaN if empty).
    """
    c = np.asarray(counts_xE, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = c / c.sum(axis=-1, keepdims=True)
    return -np.sort(-share, axis=-1)


def l1_distance(counts_a_xE: np.ndarray, counts_b_xE: np.ndarray) -> np.ndarray:
    """L1 distance between the two normalised expert distributions, sum_e |p_e - q_e|.

    counts_a_xE, counts_b_xE: (..., E), broadcastable. Returns (...) float64 in [0, 2]; NaN if either is empty.
    """
    a = np.asarray(counts_a_xE, dtype=np.float64)
    b = np.asarray(counts_b_xE, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.abs(a / a.sum(-1, keepdims=True) - b / b.sum(-1, keepdims=True)).sum(-1)


def pearson_kurtosis(x_xE: np.ndarray) -> np.ndarray:
    """Fourth standardised moment m4 / m2^2 along the last axis (not excess: a normal sample gives ~3).

    x_xE: (..., E). Returns (...) float64; NaN where the row is constant. A row that is c on K of E
    entries and 0 elsewhere gives (1 - 3p(1-p)) / (p(1-p)) with p = K/E (see fixed_set_kurtosis).
    """
    x = np.asarray(x_xE, dtype=np.float64)
    d = x - x.mean(axis=-1, keepdims=True)
    d2 = d * d
    m2 = d2.mean(axis=-1)
    m4 = (d2 * d2).mean(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        # Relative threshold: floating residue of a constant row must not read as a huge kurtosis.
        flat = m2 <= 1e-12 * np.maximum(np.abs(x).max(axis=-1, initial=0.0), 1e-300) ** 2
        return np.where(flat, np.nan, m4 / (m2 * m2))


def fixed_set_kurtosis(num_experts: int, top_k: int) -> float:
    """Kurtosis of the activation map of a token id that picks the same top_k experts every time.

    The reference point for pearson_kurtosis of per-token maps: a fully concentrated token at this
    geometry (s-MoE reports most tokens above 8 on DeepSeek-MoE-16B, where this value is 8.8).
    """
    p = top_k / num_experts
    return float("nan") if p >= 1 else (1 - 3 * p * (1 - p)) / (p * (1 - p))


# ---------------------------------------------------------------------------------------- grouped counts
def dense_ranks(key_T: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Dense group ranks of a key, ready for iter_group_counts.

    key_T: integer (T,). Returns (values_G sorted distinct keys, rank_T int64 non-decreasing in the
    returned order, order_T or None): when key_T is already non-decreasing order is None and rank_T
    follows the trace; otherwise rank_T is given in the stable-sorted order `order_T`.
    """
    k = np.asarray(key_T)
    if k.size == 0:
        return k[:0], np.zeros(0, np.int64), None
    if (k[1:] >= k[:-1]).all():
        # Sorted traces (the usual case for steps) skip the O(T log T) unique.
        change = np.flatnonzero(k[1:] != k[:-1]) + 1
        rank = np.zeros(k.size, np.int64)
        rank[change] = 1
        return k[np.r_[0, change]], np.cumsum(rank), None
    order = np.argsort(k, kind="stable")
    vals, rank = np.unique(k[order], return_inverse=True)
    return vals, rank.astype(np.int64, copy=False), order


def iter_group_counts(
    experts_TLK: np.ndarray, rank_T: np.ndarray, num_experts: int, *, chunk_tokens: int = CHUNK_TOKENS
) -> Iterator[tuple[int, np.ndarray]]:
    """Stream per-group expert counts: yield (g0, counts_nLE) for groups g0 .. g0+n-1, each group complete.

    experts_TLK: int16 (T, L, K), -1 = dropped (not counted). rank_T: int (T,) non-decreasing group ranks
    with no gaps (as from dense_ranks). Memory stays O(chunk_tokens x L x K) plus one block of counts, so
    a decode trace with 10^5 steps never materialises a (S, L, E) array. Blocks are views, valid until
    the next iteration: copy to keep, and drop the reference before asking for the next block (speed).
    """
    T, L, _ = experts_TLK.shape
    E1 = num_experts + 1
    LE1 = L * E1
    # key = 1 + e + l*E1 + r*L*E1: dropped slots (e = -1) land in a sink column instead of needing a
    # boolean compaction pass, and int16 -> int64 widening happens once inside np.add.
    offs_L1 = np.arange(L, dtype=np.int64)[:, None] * E1 + 1
    buf = np.empty((min(chunk_tokens, T), L, experts_TLK.shape[2]), np.int64)
    # Cap the groups per chunk too, so a chunk of many tiny groups (decode steps) keeps its (n, L, E+1)
    # count block near cache size instead of allocating and sweeping megabytes per chunk.
    max_groups = max(1, COUNT_BLOCK_ENTRIES // LE1)
    pending = None
    t0 = 0
    while t0 < T:
        t1 = min(T, t0 + chunk_tokens)
        if rank_T[t1 - 1] - rank_T[t0] >= max_groups:
            t1 = t0 + int(np.searchsorted(rank_T[t0:t1], rank_T[t0] + max_groups))
        r = rank_T[t0:t1]
        g0 = int(r[0])
        n = int(r[-1]) - g0 + 1
        base_tL1 = (r - g0)[:, None, None] * LE1 + offs_L1[None]
        b = buf[: t1 - t0]
        np.add(experts_TLK[t0:t1], base_tL1, out=b)
        flat = np.bincount(b.reshape(-1), minlength=n * LE1 + 1)
        c = flat[1 : n * LE1 + 1].reshape(n, L, E1)[:, :, :num_experts]
        if pending is not None:
            c[0] += pending
            pending = None
        if t1 < T and rank_T[t1] == r[-1]:
            # The last group continues in the next chunk: hold it back until complete.
            pending = c[-1].copy()
            c = c[:-1]
        if len(c):
            yield g0, c
        del c, flat  # release before the next bincount allocates (see step_stats)
        t0 = t1


def group_counts(experts_TLK: np.ndarray, key_T: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Expert counts per distinct key value (for few groups: tasks, halves, windows).

    experts_TLK: int16 (T, L, K); key_T: int (T,). Returns (values_G, counts_GLE int64).
    """
    vals, rank, order = dense_ranks(key_T)
    ex = experts_TLK if order is None else experts_TLK[order]
    out = np.zeros((len(vals), experts_TLK.shape[1], num_experts), np.int64)
    for g0, c in iter_group_counts(ex, rank, num_experts):
        out[g0 : g0 + len(c)] = c
    return vals, out


def _ratio(top_x: np.ndarray, total_x: np.ndarray, n: int) -> np.ndarray:
    """max / mean with mean = total / n, NaN where total is 0 (shared by skewness and IR on int counts)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total_x > 0, top_x * float(n) / total_x, np.nan)


@dataclass(frozen=True, kw_only=True)
class StepStats:
    """Per-step load statistics from one counting pass over a trace.

    steps_S: int64 step values in increasing order; tokens_S: tokens per step.
    skew_SL, ir_SL: float64 (S, L) MoE-GPS skewness and PROBE IR (ep ranks) of each step at each layer.
    counts_LE: int64 (L, E) whole-trace counts. window: steps per window (W = complete windows).
    drift_WL: float64 (W-1, L) L1 distance between consecutive complete windows' distributions.
    """

    steps_S: np.ndarray
    tokens_S: np.ndarray
    skew_SL: np.ndarray
    ir_SL: np.ndarray
    counts_LE: np.ndarray
    ep: int
    window: int
    drift_WL: np.ndarray


def default_window(num_steps: int) -> int:
    """Steps per drift window when none is given: about 16 windows over the trace."""
    return max(1, num_steps // 16)


def column_chunks(trace: Trace) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """(first row, token columns of CHUNK_ROWS rows as views) over the trace: passes that need no routing
    read the columns alone (Trace.chunks would also map every routing shard)."""
    rows = trace_mod.CHUNK_ROWS
    for a in range(0, trace.num_tokens, rows):
        yield a, {k: v[a:a + rows] for k, v in trace.tokens.items()}


def masked_value_counts(trace: Trace, column: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values (U,), their counts (U,)) of token column `column` over the bool (T,) `rows`, read a
    chunk at a time (no per-token temporary of the whole trace)."""
    parts = [np.unique(c[column][rows[a:a + len(c[column])]], return_counts=True) for a, c in column_chunks(trace)]
    ids, inv = np.unique(np.concatenate([u for u, _ in parts]), return_inverse=True)
    counts = np.zeros(ids.size, np.int64)
    np.add.at(counts, inv, np.concatenate([k for _, k in parts]))
    return ids, counts


def step_runs(trace: Trace) -> tuple[bool, int]:
    """(steps never decrease in row order, number of runs of equal step values), one chunk at a time.

    When the first is True the second is the number of distinct steps S (every step one contiguous run).
    """
    ok, runs, prev = True, 0, None
    for _, cols in column_chunks(trace):
        st = cols["step"]
        if prev is not None:
            ok &= bool(st[0] >= prev)
            runs += int(st[0] != prev)
        else:
            runs = 1
        ok &= bool((st[1:] >= st[:-1]).all())
        runs += int(np.count_nonzero(st[1:] != st[:-1]))
        prev = st[-1]
    return ok, runs


def _step_blocks(trace: Trace, sorted_steps: bool) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(experts_TLK, dense step rank from 0, steps of the block) per block of whole steps, in step order.

    Steps in row order (synth, capture): one block per Trace.step_chunks window, so memory is bounded by
    the chunk. Otherwise the trace is one block regrouped by step (a copy of its routing, in memory).
    """
    if sorted_steps:
        for _, ch in trace.step_chunks():
            vals, rank, _ = dense_ranks(ch.tokens["step"])
            ex = ch.experts_TLK
            del ch  # hold no view of this shard while the next one is mapped (two shards' pages resident)
            yield ex, rank, vals
            del ex
        return
    vals, rank, order = dense_ranks(trace.tokens["step"])
    yield (trace.experts_TLK if order is None else trace.experts_TLK[order]), rank, vals


def step_stats(trace: Trace, *, ep: int = 8, window: int | None = None) -> StepStats:
    """Skewness and IR per step and layer, whole-trace counts and window-to-window drift, in one pass.

    A step is one forward pass (`trace.step`); steps are ordered by value. window: steps per drift window
    (None = default_window); a trailing incomplete window is left out of the drift. Steps in row order are
    streamed a window of whole steps at a time (Trace.step_chunks); other row orders are regrouped in memory.
    """
    s = trace.spec
    E, L = s.num_experts, s.num_layers
    check_ep(ep, E)
    sorted_steps, S = step_runs(trace)
    blocks = _step_blocks(trace, sorted_steps)
    if not sorted_steps:  # one block, regrouped by step: its step values give S
        blocks = list(blocks)
        S = len(blocks[0][2])
    if window is None:
        window = default_window(S)
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ConfigError(f"window is {window!r}; expected a positive number of steps.")
    skew = np.full((S, L), np.nan)
    ir = np.full((S, L), np.nan)
    counts = np.zeros((L, E), np.int64)
    n_windows = S // window
    drift = np.full((max(n_windows - 1, 0), L), np.nan)
    cur = np.zeros((L, E), np.int64)
    prev = None
    steps, tokens, base = [], [], 0
    for ex, rank, vals in blocks:
        steps.append(np.asarray(vals, np.int64))
        tokens.append(np.bincount(rank, minlength=len(vals)))
        for b0, c in iter_group_counts(ex, rank, E):
            g0, n = base + b0, len(c)
            # einsum's summing loop measured ~2x faster than .sum(-1) over the short E/ep axis.
            loads = np.einsum("nlrj->nlr", c.reshape(n, L, ep, E // ep))
            tot = loads.sum(axis=-1)
            skew[g0 : g0 + n] = _ratio(c.max(axis=-1), tot, E)
            ir[g0 : g0 + n] = _ratio(loads.max(axis=-1), tot, ep)
            # Windows are consecutive step ranks; sum each window's rows inside this block (slices, since
            # np.add.reduceat measured ~7x slower than sum on these strided blocks).
            w = (g0 + np.arange(n)) // window
            cuts = np.r_[0, np.flatnonzero(w[1:] != w[:-1]) + 1, n].tolist()
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                wid = int(w[a])
                part = c[a:b].sum(axis=0)
                counts += part
                cur += part
                if g0 + b >= (wid + 1) * window or g0 + b == S:
                    # Window wid is finished (its last step is in this block, or the trace ended).
                    if wid < n_windows:
                        if prev is not None:
                            drift[wid - 1] = l1_distance(prev, cur)
                        prev = cur.copy()
                    cur[:] = 0
            # Drop the block before the generator's next bincount so its buffer can be reused (holding
            # it measured ~2x slower: every chunk then faulted in fresh pages).
            del c
        base += len(vals)
        del ex  # before the next block maps the next shard

    cat = (lambda xs: np.concatenate(xs)) if steps else (lambda xs: np.zeros(0, np.int64))
    return StepStats(
        steps_S=cat(steps), tokens_S=cat(tokens).astype(np.int64, copy=False), skew_SL=skew, ir_SL=ir,
        counts_LE=counts, ep=int(ep), window=int(window), drift_WL=drift,
    )


# ---------------------------------------------------------------------------------------- token level
def half_masks(trace: Trace, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Fit/score halves by whole source documents, or whole requests when the trace records no documents
    (shuffled with seed, as Trace.split does): bool (T,), (T,).

    Requests cut from one document share text, so halves by request would score a token-id table on n-grams
    it was fitted on. A trace of a single document (or request) is cut by token order instead.
    """
    req = trace.tokens["document" if trace.has_documents else "request"]
    groups = np.unique(req)
    if len(groups) >= 2:
        perm = np.random.default_rng(seed).permutation(groups)
        fit = np.isin(req, perm[: int(np.round(0.5 * len(groups)))])
    else:
        fit = np.arange(trace.num_tokens) < trace.num_tokens // 2
    return fit, ~fit


def token_table_accuracy(
    token_fit_T: np.ndarray, top1_fit_TL: np.ndarray, token_eval_T: np.ndarray,
    top1_eval_TL: np.ndarray, experts_eval_TLK: np.ndarray, num_experts: int,
) -> dict[str, np.ndarray]:
    """Score a token-id -> expert MLE table (MoE-GPS appendix B conditional model), fit and scored apart.

    The table maps (token id, layer) to the most frequent top-1 expert in the fit tokens (ties: lowest
    id); ids never seen in fit fall back to the layer's most frequent top-1 expert. Returns (L,) arrays:
    `table_top1` (prediction = true top-1), `table_hit` (prediction in the true top-k set) and
    `global_top1` (the fallback alone, the MoE-GPS probability model). NaN where nothing is scored.
    """
    L, E = top1_fit_TL.shape[1], num_experts
    vocab, tok_fit = np.unique(token_fit_T, return_inverse=True)
    valid_fit = top1_fit_TL >= 0
    key = (tok_fit.astype(np.int64)[:, None] * L + np.arange(L)) * E + top1_fit_TL
    ukey, ucount = np.unique(key[valid_fit], return_counts=True)
    cell = ukey // E
    best = np.lexsort((-ucount, cell))  # by cell, then count descending, then expert id (stable)
    first = best[np.r_[True, cell[best][1:] != cell[best][:-1]]] if len(best) else best
    table_cell, table_expert = cell[first], ukey[first] % E
    glob = np.array([np.bincount(top1_fit_TL[valid_fit[:, l], l], minlength=E).argmax() for l in range(L)])
    # Lookup: (token index in the fit vocabulary, layer) cell -> expert, via searchsorted on sorted cells.
    pos = np.clip(np.searchsorted(vocab, token_eval_T), 0, max(len(vocab) - 1, 0))
    known = (vocab[pos] == token_eval_T) if len(vocab) else np.zeros(len(token_eval_T), bool)
    cell_eval = pos.astype(np.int64)[:, None] * L + np.arange(L)
    j = np.clip(np.searchsorted(table_cell, cell_eval), 0, max(len(table_cell) - 1, 0))
    hit_cell = known[:, None] & (table_cell[j] == cell_eval) if len(table_cell) else np.zeros(cell_eval.shape, bool)
    pred = np.where(hit_cell, table_expert[j] if len(table_cell) else 0, glob[None, :])
    valid = top1_eval_TL >= 0
    n = valid.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "table_top1": ((pred == top1_eval_TL) & valid).sum(0) / n,
            "table_hit": ((experts_eval_TLK == pred[..., None]).any(-1) & valid).sum(0) / n,
            "global_top1": ((glob[None, :] == top1_eval_TL) & valid).sum(0) / n,
        }


def token_kurtosis(
    token_T: np.ndarray, experts_TLK: np.ndarray, num_experts: int, *, min_count: int = 16, max_ids: int = 2048
) -> tuple[np.ndarray, np.ndarray]:
    """Kurtosis of each frequent token id's activation map (s-MoE appendix A), per layer.

    Token ids seen at least min_count times qualify; the max_ids most frequent of them are kept (maps
    of rarer ids are mostly sampling noise). Returns (ids_V, kurtosis_VL float64, NaN for a flat map).
    """
    ids, counts = np.unique(token_T, return_counts=True)
    keep = np.flatnonzero(counts >= min_count)
    keep = keep[np.argsort(-counts[keep], kind="stable")[:max_ids]]
    sel = np.sort(ids[keep])
    T, L, _ = experts_TLK.shape
    if len(sel) == 0:
        return sel, np.zeros((0, L))
    v = np.searchsorted(sel, token_T)
    mask = (v < len(sel)) & (sel[np.minimum(v, len(sel) - 1)] == token_T)
    E1 = num_experts + 1
    base = v[mask].astype(np.int64)[:, None] * E1 + 1
    kurt = np.empty((len(sel), L))
    ex = experts_TLK[mask]
    for l in range(L):  # one layer at a time keeps the (V, E) map small
        m = np.bincount((ex[:, l, :] + base).ravel(), minlength=len(sel) * E1 + 1)[1:]
        kurt[:, l] = pearson_kurtosis(m.reshape(len(sel), E1)[:, :num_experts])
    return sel, kurt


def transition_matrix(experts_TLK: np.ndarray, num_experts: int) -> np.ndarray:
    """Inter-layer transition P(e_{l+1} = b | e_l = a) from top-k sets: float64 (L-1, E, E).

    Every (a in set_l, b in set_l+1) pair of a token counts once; rows are normalised to sum to 1, and
    an expert never chosen at layer l gets a uniform row (no evidence, no preference).
    """
    E = num_experts
    c = transition_counts(experts_TLK, E).astype(np.float64)
    rows = c.sum(axis=2, keepdims=True)
    return np.where(rows > 0, c / np.where(rows > 0, rows, 1.0), 1.0 / E)


def transition_accuracy(
    P_LEE: np.ndarray, experts_TLK: np.ndarray, true_top1_TL: np.ndarray
) -> np.ndarray:
    """Top-1 accuracy of "layer l+1's expert = argmax_b sum_{a in set_l} P[l, a, b]".

    P_LEE: (L-1, E, E) from transition_matrix; experts_TLK, true_top1_TL: the scored tokens. Returns (L-1,)
    float64 (NaN where no token has a top-1 expert at l+1).
    """
    hits, total = transition_hits(np.asarray(P_LEE, np.float32), experts_TLK, true_top1_TL)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(total > 0, hits / np.maximum(total, 1), np.nan)
    return acc


# ---------------------------------------------------------------------------------------- grouped routing
def _topk_sets(score_TE: np.ndarray, k: int) -> np.ndarray:
    """Sorted ids of each row's k largest scores: int64 (T, k) (ties broken by numpy's partition)."""
    return np.sort(np.argpartition(-score_TE, k - 1, axis=-1)[:, :k], axis=-1)


def grouped_choice_counts(logits_TLE: np.ndarray, experts_TLK: np.ndarray, bias_LE: np.ndarray) -> dict[str, np.ndarray]:
    """The counts behind grouped_choice_effect, to be summed over chunks: int64 (L,) each.

    "group_changed", "bias_changed": tokens whose executed set differs (see grouped_choice_effect);
    "scored": tokens with no dropped slot at the layer.
    """
    T, L, K = experts_TLK.shape
    out = {k: np.zeros(L, np.int64) for k in ("group_changed", "bias_changed", "scored")}
    for li in range(L):
        ids = np.asarray(experts_TLK[:, li], np.int64)
        ok = (ids >= 0).all(-1)
        if not ok.any():
            continue
        executed = np.sort(ids[ok], axis=-1)
        s = 1.0 / (1.0 + np.exp(-np.asarray(logits_TLE[:, li])[ok].astype(np.float64)))
        free = _topk_sets(s + bias_LE[li][None, :], K)
        plain = _topk_sets(s, K)
        out["group_changed"][li] = np.count_nonzero((free != executed).any(-1))
        out["bias_changed"][li] = np.count_nonzero((plain != executed).any(-1))
        out["scored"][li] = executed.shape[0]
    return out


def grouped_choice_effect(logits_TLE: np.ndarray, experts_TLK: np.ndarray, bias_LE: np.ndarray) -> dict[str, np.ndarray]:
    """How much DeepSeek-V3's group limit and correction bias change each token's experts, per layer.

    logits_TLE: router logits (sigmoid scoring); experts_TLK: the executed ids; bias_LE: the routers'
    e_score_correction_bias. Returns float64 (L,) shares of tokens whose executed set differs from
    "group_changed": the unconstrained top-K of sigmoid + bias (the group limit alone),
    "bias_changed": the unconstrained top-K of the plain sigmoid scores (group limit and bias together).
    Rows with a dropped slot (-1) are left out. A trace read in chunks sums grouped_choice_counts instead.
    """
    return grouped_choice_shares(grouped_choice_counts(logits_TLE, experts_TLK, bias_LE))


def grouped_choice_shares(counts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """grouped_choice_counts (summed over chunks) -> the float64 (L,) shares (NaN where nothing scored)."""
    n = counts["scored"]
    with np.errstate(invalid="ignore", divide="ignore"):
        return {k: np.where(n > 0, counts[k] / np.maximum(n, 1), np.nan) for k in ("group_changed", "bias_changed")}
