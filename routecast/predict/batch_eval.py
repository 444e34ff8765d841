"""Batch-level accuracy (ExpertFlow eq. 7) at fixed batch sizes, as in ExpertFlow's Table 1.

Held-out tokens are taken in the order the harness predicts them (step by step) and cut into batches of B
consecutive tokens; a batch's true and predicted (L, E) sets are the bit-wise OR of its tokens' true and
predicted top-K sets, and eq. 7 is averaged over the batches. Token-level predictors are run causally by
the harness once (their per-token forecast does not depend on how tokens are grouped afterwards); TLP's
prediction for a batch is the previous batch's true set (temporal locality at that batch size), so it is
computed from the routing directly. Distribution-only predictors give every token the same top-K here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.predict.forecast import multi_hot
from routecast.predict.harness import run_harness
from routecast.predict.metrics import batch_level_accuracy
from routecast.trace import Trace


def _chunk_or(hot_TLE: np.ndarray, B: int) -> np.ndarray:
    """(T, L, E) bool -> (ceil(T / B), L, E): OR over consecutive chunks of B tokens."""
    T = hot_TLE.shape[0]
    n = -(-T // B)
    pad = np.zeros((n * B - T, *hot_TLE.shape[1:]), bool)
    return np.concatenate([hot_TLE, pad]).reshape(n, B, *hot_TLE.shape[1:]).any(axis=1)


def batch_accuracy_at(pred_TLE: np.ndarray | None, true_TLE: np.ndarray, B: int) -> float:
    """Mean eq. 7 over batches of B tokens; pred None = TLP (the previous batch's true set)."""
    true = _chunk_or(true_TLE, B)
    if pred_TLE is None:
        pred, true = true[:-1], true[1:]
    else:
        pred = _chunk_or(pred_TLE, B)
    if len(true) == 0:
        return float("nan")
    return float(np.nanmean([batch_level_accuracy(p, t) for p, t in zip(pred, true, strict=True)]))


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
    split: str = "document",
) -> list[dict[str, Any]]:
    """One row per predictor, fitted once on train_fraction of the documents (split="request": requests; by
    request anyway when the trace records no documents) and run causally on the rest:
    'batch_<B>' (eq. 7 at batch size B), the per-step top-k accuracy, recall@2k and batch-level accuracy,
    and the measured µs per token."""
    from routecast.predict.evaluate import (
        _embeddings_for,
        _router_model,
        heldout,
        make_predictor,
        parse_names,
    )
    from routecast.predict.neural import torch_threads

    names = parse_names(names)
    if any(int(b) < 1 for b in sizes):
        raise ConfigError(f"batch sizes are {list(sizes)}; expected positive integers.")
    train, test, used = heldout(trace, split, train_fraction, seed)
    order = np.concatenate([idx for _, idx in test.batches()])
    E = trace.spec.num_experts
    true = multi_hot(test.experts_TLK[order], E)
    emb, src = _embeddings_for(names, trace, model_dir)
    rows = []
    step_sizes = [len(idx) for _, idx in test.batches()]
    for name in names:
        with torch_threads(threads):
            p = make_predictor(name, trace.spec, embeddings=emb, embedding_source=src, seed=seed, threads=threads,
                               progress=False, epochs=epochs, model_path=_router_model(name, trace, model_dir))
            p.fit(train)
            res = run_harness(p, test, collect=True)
        # TLP at batch size B predicts the previous B tokens' set, not the previous step's
        pred = None if name == "tlp" else np.concatenate(
            [multi_hot(fc.token_topk(n), E) for (_, fc), n in zip(res.forecasts, step_sizes, strict=True)])
        row: dict[str, Any] = {"predictor": name, "horizon": p.horizon, "split": used}
        row.update({m: float(np.nanmean(res.metrics[m])) for m in ("top_k_accuracy", "recall_at_2k", "batch_level_accuracy")})
        row.update(us_per_token=res.us_per_token, test_tokens=res.num_tokens, test_steps=res.num_steps)
        row.update({f"batch_{b}": batch_accuracy_at(pred, true, int(b)) for b in sizes})
        rows.append(row)
    return rows
