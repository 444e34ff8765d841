"""Batch-level accuracy (ExpertFlow eq. 7) at fixed batch sizes, as in ExpertFlow's Table 1.

Legend: R held-out requests, D decode index (the d-th generated token of a request), L MoE layers, E experts.

A batch of size B is B requests decoded together (ExpertFlow's input (B, S) with S = 1 in decoding): at
decode index d the batch runs one token of each of its requests, and its true (L, E) routing path is the
bit-wise OR of those tokens' top-K sets; the predicted path is the OR of each predictor's per-token top-K
sets, from one causal harness run over the held-out trace (a token's forecast does not depend on how the
tokens are grouped afterwards). Groups of B come from `perms` seeded shuffles of the held-out requests
(the remainder of each shuffle is left out); eq. 7 is averaged over every (group, decode index).

TLP is a predictor like the others (routecast.predict.locality): each token predicts its own request's
previous token's experts, so a batch's predicted path is exactly the path the same batch activated at
its previous decode step. Prefill batches are not scored: a batch's whole prompts activate nearly every
expert (eq. 7 is a recall), and no forward pass runs a prompt in chunks of B tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.predict.forecast import multi_hot
from routecast.predict.harness import run_harness
from routecast.predict.metrics import batch_level_accuracy_L
from routecast.trace import DECODE, Trace


def decode_rows_RD(trace: Trace) -> np.ndarray:
    """int64 (R, D): row of each request's d-th decode token (requests in id order), -1 past its end."""
    dec = np.flatnonzero(trace.tokens["phase"] == DECODE)
    if dec.size == 0:
        return np.zeros((0, 0), np.int64)
    req = trace.tokens["request"][dec]
    order = np.lexsort((trace.tokens["position"][dec], req))
    dec, req = dec[order], req[order]
    uniq, first, counts = np.unique(req, return_index=True, return_counts=True)
    d = np.arange(dec.size) - np.repeat(first, counts)
    out = np.full((uniq.size, int(counts.max())), -1, np.int64)
    out[np.repeat(np.arange(uniq.size), counts), d] = dec
    return out


def decode_batch_accuracy(pred_TLE: np.ndarray, true_TLE: np.ndarray, rows_RD: np.ndarray, B: int, *,
                          perms: int = 8, seed: int = 0) -> float:
    """Mean eq. 7 over decode batches of B requests: bool (T, L, E) predicted and true top-K sets by trace
    row, rows_RD from decode_rows_RD; NaN when fewer than B requests decode."""
    R = rows_RD.shape[0]
    if B < 1:
        raise ConfigError(f"batch size is {B}; expected a positive integer.")
    if R < B:
        return float("nan")
    rng = np.random.default_rng(seed)
    groups = np.concatenate([rng.permutation(R)[: R // B * B].reshape(-1, B) for _ in range(perms)])  # (G, B)
    rows = rows_RD[groups]  # (G, B, D)
    ok = rows >= 0
    safe = np.where(ok, rows, 0)
    mask = ok[..., None, None]
    true = (true_TLE[safe] & mask).any(axis=1)  # (G, D, L, E)
    pred = (pred_TLE[safe] & mask).any(axis=1)
    acc = batch_level_accuracy_L(pred, true)  # (G, D, L); NaN where a batch ran no token
    per_batch = np.nanmean(np.where(ok.any(axis=1)[..., None], acc, np.nan), axis=-1)
    return float(np.nanmean(per_batch))


def token_sets(predictor, test: Trace) -> np.ndarray:
    """Each token's predicted top-K experts from a causal harness run: bool (T, L, E) in test's trace order."""
    res = run_harness(predictor, test, collect=True)
    out = np.zeros((test.num_tokens, test.spec.num_layers, test.spec.num_experts), bool)
    for (_, fc), (_, idx) in zip(res.forecasts, test.batches(), strict=True):
        out[idx] = multi_hot(fc.token_topk(len(idx)), test.spec.num_experts)
    return out


def batch_accuracy_rows(
    trace: Trace, names: Sequence[str], sizes: Sequence[int] = (8, 16, 32), *, train_fraction: float = 0.8,
    seed: int = 0, model_dir: str | Path | None = None, threads: int = 1, epochs: int | None = None,
    split: str = "document", extra_train: Trace | Sequence[Trace] | None = None, perms: int = 8,
    expertflow: Any = None, save_expertflow: str | Path | None = None,
) -> list[dict[str, Any]]:
    """One row per predictor, fitted once on train_fraction of the documents (split="request": requests; by
    request anyway when the trace records no documents) plus extra_train (other captures of disjoint
    documents, see evaluate.with_extra_training; not for the lookahead, which needs router inputs) and run
    causally on the rest: 'batch_<B>' (eq. 7 over decode batches of B requests), the per-step top-k accuracy,
    recall@2k and batch-level accuracy, fit_s and the measured µs per token. expertflow: its ExpertFlowConfig
    (None: the default); save_expertflow: a folder to save the fitted path predictor in (with the split it
    was fitted on, so `cache replay --predictor DIR` and `predict eval` score it on the held-out part only)."""
    import time

    from routecast.predict.evaluate import (
        NEEDS_ROUTER_INPUTS,
        _embeddings_for,
        _router_model,
        heldout,
        make_predictor,
        parse_names,
        trace_fingerprint,
        with_extra_training,
    )
    from routecast.predict.neural import torch_threads

    names = parse_names(names)
    if any(int(b) < 1 for b in sizes):
        raise ConfigError(f"batch sizes are {list(sizes)}; expected positive integers.")
    base, test, used = heldout(trace, split, train_fraction, seed)
    train = base
    for extra in [] if extra_train is None else [extra_train] if isinstance(extra_train, Trace) else extra_train:
        train = with_extra_training(train, extra, test)
    E = trace.spec.num_experts
    true = multi_hot(test.experts_TLK, E)
    rows_RD = decode_rows_RD(test)
    emb, src = _embeddings_for(names, trace, model_dir)
    rows = []
    for name in names:
        with torch_threads(threads):
            t0 = time.perf_counter()
            p = make_predictor(name, trace.spec, embeddings=emb, embedding_source=src, seed=seed, threads=threads,
                               progress=False, epochs=epochs, model_path=_router_model(name, trace, model_dir),
                               expertflow=expertflow)
            fit_on = base if name in NEEDS_ROUTER_INPUTS else train  # extra captures carry no router inputs
            p.fit(fit_on)
            fit_s = time.perf_counter() - t0
            if name == "expertflow" and save_expertflow is not None:
                from routecast.predict.store import save_predictor

                save_predictor(p, save_expertflow, fitted_on={
                    "trace": trace_fingerprint(trace), "split": used, "train_fraction": train_fraction, "seed": seed,
                    "extra_tokens": fit_on.num_tokens - base.num_tokens})
            res = run_harness(p, test, collect=True)
        pred = np.zeros_like(true)
        for (_, fc), (_, idx) in zip(res.forecasts, test.batches(), strict=True):
            pred[idx] = multi_hot(fc.token_topk(len(idx)), E)
        row: dict[str, Any] = {"predictor": name, "horizon": p.horizon, "split": used,
                               "train_tokens": fit_on.num_tokens, "fit_s": fit_s}
        row.update({m: float(np.nanmean(res.metrics[m])) for m in ("top_k_accuracy", "recall_at_2k", "batch_level_accuracy")})
        row.update(us_per_token=res.us_per_token, test_tokens=res.num_tokens, test_steps=res.num_steps,
                   test_requests=int(rows_RD.shape[0]))
        row.update({f"batch_{b}": decode_batch_accuracy(pred, true, rows_RD, int(b), perms=perms, seed=seed)
                    for b in sizes})
        rows.append(row)
    return rows
