"""The offload engine's numpy frozen-gate forecast (engine._frozen_gate_sets, the decode-step fast path) picks the
same experts as the predictor's own router rule (RouterRule.forecast, torch) for every scoring and group limit."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.predict.lookahead import RouterRule
from routecast.runtime.offload.engine import _frozen_gate_sets


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(1, 1, "max"), (4, 2, "max"), (8, 4, "top2"), (4, 1, "top2")]),
       st.sampled_from(["softmax", "sigmoid"]), st.integers(1, 8), st.integers(1, 6))
def test_numpy_sets_equal_the_router_rule(seed: int, groups, scoring: str, top: int, T: int) -> None:
    n_group, topk_group, group_score = groups
    if scoring == "softmax" and n_group > 1:  # the engine sends this case to the torch path
        n_group, topk_group = 1, 1
    rule = RouterRule(scoring=scoring, n_group=n_group, topk_group=topk_group, group_score=group_score)
    rng = np.random.default_rng(seed)
    H, E = 16, 32
    h, W, b = (rng.standard_normal(s).astype(np.float32) for s in ((T, H), (H, E), (E,)))
    corr = (rng.standard_normal(E) * 0.1).astype(np.float32) if scoring == "sigmoid" else np.zeros(E, np.float32)
    got = _frozen_gate_sets(h, W, b, corr, rule, top)
    score = rule.forecast(torch.from_numpy(h @ W + b), torch.from_numpy(corr))
    want = np.zeros((1, E), bool)
    want[0, score.topk(top, dim=-1).indices.reshape(-1).numpy()] = True
    assert got.shape == (1, E) and np.array_equal(got, want)
