"""Routing statistics over per-token groups, computed chunk by chunk: memory bounded by a chunk, not the trace.

Shapes (legend in spec.py): N sequences, n tasks, P (task, request) pairs, L layers, E experts. Every pass
walks Trace.chunks() (CHUNK_ROWS rows at a time, never across a shard of a lazy trace), so the arrays derived
from the token columns (group keys, ranks, masks, row indices) exist for one chunk at a time; what persists
is one entry per group (distinct requests, documents, sequences, (task, request) pairs, sampled rows), never
one per token. The results are identical to the whole-trace formulations they replace
(tests/trace/test_stats_stream.py checks them at a chunk size of a few rows against direct computations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from routecast.common.errors import ConfigError
from routecast.trace.stats import _ratio, column_chunks, l1_distance
from routecast.trace.stats_kernels import add_group_counts

if TYPE_CHECKING:
    from routecast.trace.trace import Trace


def distinct(trace: Trace, values: Callable[[dict[str, np.ndarray]], np.ndarray]) -> np.ndarray:
    """Sorted distinct values of values(columns) over every column chunk of the trace (column_chunks)."""
    parts = [np.unique(values(cols)) for _, cols in column_chunks(trace)]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def _member(sorted_vals: np.ndarray, x: np.ndarray) -> np.ndarray:
    """bool: x's entries that are in sorted_vals (a searchsorted np.isin for a sorted, distinct set)."""
    if not len(sorted_vals):
        return np.zeros(x.shape, bool)
    pos = np.minimum(np.searchsorted(sorted_vals, x), len(sorted_vals) - 1)
    return sorted_vals[pos] == x


def half_sample(trace: Trace, cap: int, rng: np.random.Generator, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Fit and scored rows of the token statistics: (fit_idx, eval_idx) sorted int64, at most cap each.

    The halves are stats.half_masks' (whole source documents, or requests when the trace records no
    documents, shuffled with seed; token order for a trace of one group); each half with more than cap rows
    is sampled without replacement with rng, the fit half first: the rows sample_indices(half_masks) gives,
    found in two passes over the token columns instead of two bool (T,) masks and their (T,) indices.
    """
    col = "document" if trace.has_documents else "request"
    groups = distinct(trace, lambda c: c[col])
    T = trace.num_tokens
    if len(groups) >= 2:
        perm = np.random.default_rng(seed).permutation(groups)
        fit_groups = np.sort(perm[: int(np.round(0.5 * len(groups)))])
        in_fit = lambda a, c: _member(fit_groups, c[col])  # noqa: E731
    else:
        in_fit = lambda a, c: a + np.arange(len(c[col])) < T // 2  # noqa: E731
    n_fit = sum(int(np.count_nonzero(in_fit(a, c))) for a, c in column_chunks(trace))
    picks = []
    for n in (n_fit, T - n_fit):  # ranks (among the half's rows) to keep; None = every row
        picks.append(None if n <= cap else np.sort(rng.choice(n, cap, replace=False)))
    out: tuple[list, list] = ([], [])
    seen = [0, 0]
    for a, c in column_chunks(trace):
        m = in_fit(a, c)
        for h, rows in enumerate((np.flatnonzero(m), np.flatnonzero(~m))):
            p = picks[h]
            if p is None:
                out[h].append(a + rows)
            else:
                lo, hi = np.searchsorted(p, [seen[h], seen[h] + len(rows)])
                out[h].append(a + rows[p[lo:hi] - seen[h]])
            seen[h] += len(rows)
    cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)  # noqa: E731
    return cat(out[0]), cat(out[1])


def sequence_skewness(trace: Trace, seq_len: int = 512) -> np.ndarray:
    """MoE-GPS skewness of each seq_len-token sequence (request, position // seq_len) at each layer.

    Sequences with fewer than seq_len // 2 tokens (tails, short requests) are left out: their skewness
    measures sampling noise more than routing. Returns float64 (N, L), N sequences in (request, chunk) order.
    Two passes: the token columns give each sequence's size and last row; the routing pass keeps (L, E)
    counts only for the sequences open at the current chunk (started, not finished: about the concurrent
    requests of a trace in step order) and finishes each at its last row.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise ConfigError(f"seq_len is {seq_len!r}; expected a positive number of tokens.")
    L, E = trace.spec.num_layers, trace.spec.num_experts
    reqs = distinct(trace, lambda c: c["request"])
    C = int(trace.tokens["position"].max(initial=0)) // seq_len + 1

    def key(c: dict[str, np.ndarray]) -> np.ndarray:  # request rank x C + position chunk: sorts as (request, chunk)
        return np.searchsorted(reqs, c["request"]) * C + c["position"].astype(np.int64) // seq_len

    ks, sizes, lasts = [], [], []
    for a, c in column_chunks(trace):
        u, first_rev, n = np.unique(key(c)[::-1], return_index=True, return_counts=True)
        ks.append(u), sizes.append(n), lasts.append(a + len(c["request"]) - 1 - first_rev)
    if not ks:
        return np.zeros((0, L))
    keys, inv = np.unique(np.concatenate(ks), return_inverse=True)
    size = np.zeros(len(keys), np.int64)
    np.add.at(size, inv, np.concatenate(sizes))
    last = np.zeros(len(keys), np.int64)
    np.maximum.at(last, inv, np.concatenate(lasts))
    keep = size >= max(1, seq_len // 2)
    keys, last = keys[keep], last[keep]
    N = len(keys)
    out = np.full((N, L), np.nan)
    slot_of = np.full(N, -1, np.int64)
    acc = np.zeros((0, L, E), np.int64)  # counts of the open sequences, one slot each
    free: list[int] = []
    for a, ch in trace.chunks():
        if not N:
            break
        k = key(ch.tokens)
        g = np.minimum(np.searchsorted(keys, k), N - 1)
        g = np.where(keys[g] == k, g, -1)
        ug = np.unique(g[g >= 0])
        new = ug[slot_of[ug] < 0]
        if len(new) > len(free):  # grow the slot pool (doubling), keeping the open sequences' counts
            grow = max(len(new) - len(free), len(acc))
            free.extend(range(len(acc), len(acc) + grow))
            acc = np.concatenate([acc, np.zeros((grow, L, E), np.int64)])
        slot_of[new] = [free.pop() for _ in range(len(new))]
        add_group_counts(ch.experts_TLK, np.where(g >= 0, slot_of[np.maximum(g, 0)], -1), acc)
        done = ug[last[ug] < a + ch.num_tokens]
        slots = slot_of[done]
        c = acc[slots]
        out[done] = _ratio(c.max(axis=-1), c.sum(axis=-1), E)
        acc[slots] = 0
        free.extend(slots.tolist())
        slot_of[done] = -1
        del ch  # before the next chunk maps the next shard
    return out


def task_distances(trace: Trace, *, seed: int = 0) -> dict[str, np.ndarray | list[str]]:
    """Per-task expert distributions compared pairwise, and each task's two halves as the reference.

    A task's requests are shuffled with seed and dealt alternately into two halves. Returns
    `tasks` (names, known tasks present), `l1_nnL` float64 (n, n, L) pairwise L1 between tasks and
    `half_l1_nL` (n, L) L1 between the halves of each task (NaN for a task with one request).
    """
    L, E = trace.spec.num_layers, trace.spec.num_experts
    tasks = distinct(trace, lambda c: c["task"][c["task"] >= 0]).astype(np.int64)
    if not len(tasks):
        return {"tasks": [], "l1_nnL": np.zeros((0, 0, L)), "half_l1_nL": np.zeros((0, L))}
    names = [trace.task_names[i] for i in tasks.tolist()]
    reqs = distinct(trace, lambda c: c["request"][c["task"] >= 0])
    R = len(reqs)

    def pair_code(c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:  # (known rows, task x R + request rank)
        known = c["task"] >= 0
        return known, c["task"][known].astype(np.int64) * R + np.searchsorted(reqs, c["request"][known])

    pairs = distinct(trace, lambda c: pair_code(c)[1])
    ptask = pairs // R
    shuffled = np.random.default_rng(seed).permutation(len(pairs))
    by_task = shuffled[np.argsort(ptask[shuffled], kind="stable")]
    first = np.searchsorted(ptask[by_task], ptask[by_task])
    half = np.empty(len(pairs), np.int64)
    half[by_task] = (np.arange(len(pairs)) - first) % 2
    group_P = np.searchsorted(tasks, ptask) * 2 + half  # dense group task index x 2 + half, per pair
    c = np.zeros((2 * len(tasks), L, E), np.int64)
    for _, ch in trace.chunks():  # one chunk (or shard) of routing in memory at a time
        known, code = pair_code(ch.tokens)
        g = np.full(ch.num_tokens, -1, np.int64)
        g[known] = group_P[np.searchsorted(pairs, code)]
        add_group_counts(ch.experts_TLK, g, c)
        del ch  # before the next chunk maps the next shard
    halves = c.reshape(len(tasks), 2, L, E)
    whole = halves.sum(axis=1)
    return {
        "tasks": names,
        "l1_nnL": l1_distance(whole[:, None], whole[None, :]),
        "half_l1_nL": l1_distance(halves[:, 0], halves[:, 1]),
    }
