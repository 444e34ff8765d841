"""`routecast schedule rebatch`: arrival-order vs path-clustered half-batches of each decode step.

The predictor (any name or saved folder; 'oracle' = the true paths) is fitted on train_fraction of the
requests; the held-out requests are re-batched both ways with its causal per-token paths. The result holds
both traces (for the cache replay that prices them, done by the caller) and the activated experts per batch
(eq. 5's terms, on the true routing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.predict.batch_eval import token_sets
from routecast.predict.evaluate import fit_or_load
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
                train_fraction: float = 0.8, seed: int = 0, min_tokens: int = 4, threads: int = 1,
                quiet: bool = True) -> dict[str, Any]:
    """{'settings', 'arms': {method: {'trace', 'pred_SLE', 'activated_mean', 'activated_total', 'batches'}}}."""
    if not 0 < train_fraction < 1:
        raise ConfigError(f"--train-fraction is {train_fraction}; expected a number strictly between 0 and 1.")
    train, test = trace.split("request", (train_fraction, 1 - train_fraction), seed=seed)
    if train.num_tokens == 0 or test.num_tokens == 0:
        raise ConfigError("the trace has too few requests to hold some out; expected at least 2.")
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
    return {"settings": {"predictor": predictor, "test_tokens": test.num_tokens, "min_tokens": min_tokens},
            "arms": arms}
