"""ExpertFlow's token scheduler: regroup a step's tokens into two equal batches with similar routing paths.

Legend: T tokens, L MoE layers, E experts. ExpertFlow runs two batches as one scheduling unit (the
dual-batch pipeline) and reassigns their 2T tokens to two new batches of T so that each activates few
experts (eq. 5: minimise Σ_batches Σ_l |experts activated at l|, the union of the batch's tokens' paths).
Here a unit is one decode step of the trace, split into two half-batches run one after the other:
- arrival order: the first half of the step's requests, then the rest;
- clustered: balanced 2-means (k-means-constrained: exact sizes ⌊T/2⌋ and ⌈T/2⌉) on the tokens' predicted
  L·E paths; on 0/1 vectors the squared Euclidean distance is the Hamming distance, so this clusters by
  ExpertFlow's similarity S_ij = 1 - d_ij / (L·E) (eq. 6).
Decode tokens of one step belong to different requests, so any split keeps every request's order; prefill
steps and steps of fewer than min_tokens tokens stay one batch in both arms (a prompt is not split).
Activated experts are counted on the TRUE routing; the predicted paths only decide the grouping.

``run_rebatch`` is `routecast schedule rebatch`'s experiment: the predictor (any name or saved folder; 'oracle' =
the true paths) is fitted on train_fraction of the documents (by request when the trace records none); the
held-out requests (``step_window``: the first steps up to --max-tokens) are re-batched both ways with its causal
per-token paths. The result holds both traces (for the cache replay that prices them, done by the caller) and
the activated experts per batch (eq. 5's terms, on the true routing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.predict.batch_eval import token_sets
from routecast.predict.evaluate import fit_or_load, heldout_rows
from routecast.predict.forecast import multi_hot
from routecast.schedule.cocluster import fit_sample
from routecast.trace import DECODE, Trace
from routecast.trace.stats import column_chunks, masked_value_counts

METHODS = ("arrival", "clustered")


def split_step(paths_TX: np.ndarray, method: str, seed: int = 0) -> np.ndarray:
    """Half (0 or 1) of each of a step's T tokens. paths_TX: bool (T, L·E) predicted paths, arrival order."""
    T = paths_TX.shape[0]
    if method == "arrival":
        return (np.arange(T) >= T // 2).astype(np.int64)
    if method != "clustered":
        raise ConfigError(f"re-batching method is {method!r}; expected one of {', '.join(METHODS)}.")
    from k_means_constrained import KMeansConstrained

    km = KMeansConstrained(n_clusters=2, size_min=T // 2, size_max=T - T // 2, random_state=seed, n_init=4)
    return km.fit_predict(paths_TX.astype(np.float64)).astype(np.int64)


def check_min_tokens(min_tokens: int) -> None:
    """min_tokens: a step is split into two batches, so it needs at least 2 tokens (ConfigError otherwise)."""
    if min_tokens < 2:
        raise ConfigError(f"--min-tokens is {min_tokens}; expected at least 2 (a re-batched step is split in two).")


def rebatch(trace: Trace, paths_TLE: np.ndarray, method: str, *, seed: int = 0, min_tokens: int = 4) -> Trace:
    """A copy of trace whose decode steps of >= min_tokens tokens are each split into two batches.

    paths_TLE: bool (T, L, E) predicted paths of trace's tokens (trace order). New step ids: 2·s + half,
    in the original step order (half 0 first).
    """
    check_min_tokens(min_tokens)
    if paths_TLE.shape != (trace.num_tokens, trace.spec.num_layers, trace.spec.num_experts):
        raise ConfigError(f"paths have shape {paths_TLE.shape}; expected "
                          f"({trace.num_tokens}, {trace.spec.num_layers}, {trace.spec.num_experts}).")
    _, sidx = np.unique(trace.step, return_inverse=True)
    new = 2 * sidx.astype(np.int64)
    flat = paths_TLE.reshape(trace.num_tokens, -1)
    for _, idx in trace.batches():
        if len(idx) >= min_tokens and (trace.phase[idx] == DECODE).all():
            idx = idx[np.argsort(trace.request[idx], kind="stable")]
            new[idx] += split_step(flat[idx], method, seed)
    tokens = dict(trace.tokens)
    tokens["step"] = new
    return Trace(spec=trace.spec, tokens=tokens, experts_TLK=trace.experts_TLK, weights_TLK=trace.weights_TLK,
                 task_names=trace.task_names, source_names=trace.source_names, provenance=dict(trace.provenance))


def activated_experts(trace: Trace) -> np.ndarray:
    """Per step: Σ_l |experts the step's tokens route to at l| (eq. 5's term), int64 (steps,) in step order."""
    _, sidx = np.unique(trace.step, return_inverse=True)
    hot = multi_hot(trace.experts_TLK, trace.spec.num_experts)  # (T, L, E)
    per = np.zeros((sidx.max() + 1 if len(sidx) else 0, *hot.shape[1:]), bool)
    np.logical_or.at(per, sidx, hot)
    return per.sum(axis=(1, 2)).astype(np.int64)


def step_sets(trace: Trace, paths_TLE: np.ndarray) -> np.ndarray:
    """Union of the tokens' predicted paths per step of `trace`: bool (S, L, E) in step order."""
    _, sidx = np.unique(trace.step, return_inverse=True)
    out = np.zeros((sidx.max() + 1 if len(sidx) else 0, *paths_TLE.shape[1:]), bool)
    np.logical_or.at(out, sidx, paths_TLE)
    return out


def step_window(trace: Trace, rows: np.ndarray, max_tokens: int | None) -> tuple[np.ndarray, str]:
    """bool (T,) `rows` limited to the first steps (in step order) holding at most max_tokens of them (at least
    one step; None: no cap), and a one-sentence note when it cut ("" otherwise). Whole steps are kept, so every
    kept step is re-batched as it ran; the token columns are read a chunk at a time."""
    n = int(np.count_nonzero(rows))
    if max_tokens is None or n <= max_tokens:
        return rows, ""
    steps, per = masked_value_counts(trace, "step", rows)
    k = max(1, int(np.count_nonzero(np.cumsum(per) <= max_tokens)))
    out = np.zeros_like(rows)
    for a, c in column_chunks(trace):
        b = a + len(c["step"])
        out[a:b] = rows[a:b] & (c["step"] <= steps[k - 1])
    return out, (f"re-batched the held-out tokens of the first {k} of {steps.size} steps ({int(out.sum())} of {n} "
                 f"tokens; --max-tokens {max_tokens})")


def run_rebatch(trace: Trace, *, predictor: str = "conditional-token", model: str | None = None,
                train_fraction: float = 0.8, seed: int = 0, split: str = "document", min_tokens: int = 4,
                threads: int = 1, quiet: bool = True, max_tokens: int | None = None) -> dict[str, Any]:
    """{'settings', 'arms': {method: {'trace', 'pred_SLE', 'activated_mean', 'activated_total', 'batches'}}}.

    max_tokens (None: no cap) bounds memory on a large trace: the predictor is fitted on a seeded sample of
    whole training requests of at most that many tokens, and the held-out tokens of the first steps up to it
    are re-batched (settings['notes'] says so); only those rows are copied into memory.
    """
    check_min_tokens(min_tokens)  # before the predictor is fitted
    train_m, test_m, used = heldout_rows(trace, split, train_fraction, seed)
    train_m, fit_note = fit_sample(trace, train_m, max_tokens, seed)
    test_m, test_note = step_window(trace, test_m, max_tokens)
    train, test = trace.select(train_m), trace.select(test_m)
    del train_m, test_m
    if predictor == "oracle":
        paths = multi_hot(test.experts_TLK, test.spec.num_experts)
    else:
        paths = token_sets(fit_or_load(predictor, train, model=model, seed=seed, threads=threads, quiet=quiet), test)
    arms = {}
    for m in METHODS:
        t = rebatch(test, paths, m, seed=seed, min_tokens=min_tokens)
        ae = activated_experts(t)
        arms[m] = {"trace": t, "pred_SLE": step_sets(t, paths), "activated_mean": float(ae.mean()),
                   "activated_total": int(ae.sum()), "batches": int(len(ae))}
    notes = [x for x in (fit_note, test_note) if x]
    return {"settings": {"predictor": predictor, "split": used, "test_tokens": test.num_tokens, "min_tokens": min_tokens,
                         "max_tokens": max_tokens, "notes": notes},
            "arms": arms}
