"""`routecast schedule rebatch`: arrival-order vs path-clustered half-batches of each decode step.

The predictor (any name or saved folder; 'oracle' = the true paths) is fitted on train_fraction of the
documents (by request when the trace records none); the held-out requests are re-batched both ways with its causal per-token paths. The result holds
both traces (for the cache replay that prices them, done by the caller) and the activated experts per batch
(eq. 5's terms, on the true routing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from routecast.predict.batch_eval import token_sets
from routecast.predict.evaluate import fit_or_load, heldout
from routecast.predict.forecast import multi_hot
from routecast.schedule.rebatch import METHODS, activated_experts, rebatch
from routecast.trace import Trace


def step_sets(trace: Trace, paths_TLE: np.ndarray) -> np.ndarray:
    """Union of the tokens' predicted paths per step of `trace`: bool (S, L, E) in step order."""
    _, sidx = np.unique(trace.step, return_inverse=True)
    out = np.zeros((sidx.max() + 1 if len(sidx) else 0, *paths_TLE.shape[1:]), bool)
    np.logical_or.at(out, sidx, paths_TLE)
    return out


def run_rebatch(trace: Trace, *, predictor: str = "conditional-token", model: str | None = None,
                train_fraction: float = 0.8, seed: int = 0, split: str = "document", min_tokens: int = 4,
                threads: int = 1, quiet: bool = True) -> dict[str, Any]:
    """{'settings', 'arms': {method: {'trace', 'pred_SLE', 'activated_mean', 'activated_total', 'batches'}}}."""
    train, test, used = heldout(trace, split, train_fraction, seed)
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
    return {"settings": {"predictor": predictor, "split": used, "test_tokens": test.num_tokens, "min_tokens": min_tokens},
            "arms": arms}

