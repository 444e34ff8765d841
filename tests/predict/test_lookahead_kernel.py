"""The compiled lookahead selection equals RouterRule.forecast + topk on generated logits (predict/lookahead_kernel.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.predict.lookahead import GROUP_MAX, GROUP_TOP2, SIGMOID, SOFTMAX, RouterRule
from routecast.predict.lookahead_kernel import gate_logits, union_topk


@st.composite
def cases(draw):
    n_group = draw(st.sampled_from([1, 2, 4, 8]))
    E = n_group * draw(st.integers(2, 12))
    topk_group = draw(st.integers(1, n_group))
    sigmoid = draw(st.booleans())
    group = GROUP_TOP2 if sigmoid and draw(st.booleans()) else GROUP_MAX
    top = draw(st.integers(1, topk_group * (E // n_group)))
    T = draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([0.01, 1.0, 30.0]))  # near-flat to saturated sigmoids
    logits = (rng.standard_normal((T, E)) * scale).astype(np.float32)
    corr = (rng.standard_normal(E) * 0.1 if sigmoid else np.zeros(E)).astype(np.float32)
    return logits, corr, RouterRule(scoring=SIGMOID if sigmoid else SOFTMAX, n_group=n_group, topk_group=topk_group,
                                    group_score=group), top


def _reference(logits, corr, rule, top):
    score = rule.forecast(torch.from_numpy(logits), torch.from_numpy(corr))
    vals, idx = score.topk(top, dim=-1)
    return vals, np.bincount(idx.reshape(-1).numpy(), minlength=logits.shape[1]) > 0


@settings(max_examples=300, deadline=None)
@given(cases())
def test_union_equals_the_router_rule(case) -> None:
    logits, corr, rule, top = case
    vals, want = _reference(logits, corr, rule, top)
    got = union_topk(logits, corr, sigmoid=rule.scoring == SIGMOID, n_group=rule.n_group,
                     topk_group=rule.topk_group, group_top2=rule.group_score == GROUP_TOP2, top=top)
    if not np.array_equal(got, want):  # only an exact tie at a boundary may break differently (float32 saturation)
        score = rule.forecast(torch.from_numpy(logits), torch.from_numpy(corr))
        kth = vals[:, -1:]
        assert bool(((score == kth).sum(-1) > 1).any()), (got, want)
    assert got.sum() <= min(logits.shape[0] * top, logits.shape[1])


def test_bad_settings_named() -> None:
    x = np.zeros((1, 8), np.float32)
    with pytest.raises(ValueError, match="top 5"):
        union_topk(x, np.zeros(8, np.float32), sigmoid=True, n_group=4, topk_group=2, top=5)
    with pytest.raises(ValueError, match="softmax router's top-2"):
        union_topk(x, np.zeros(8, np.float32), sigmoid=False, n_group=2, topk_group=1, group_top2=True, top=1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 33), st.booleans(), st.integers(0, 2**32 - 1))
def test_gate_logits_equal_the_torch_norm_and_matmul(T: int, H: int, E: int, normed: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((T, H)).astype(np.float32) * 3
    W = rng.standard_normal((H, E)).astype(np.float32)
    b = rng.standard_normal(E).astype(np.float32)
    w = rng.standard_normal(H).astype(np.float32)
    x = torch.from_numpy(h)
    if normed:  # the RMSNorm of the Llama-style blocks, in float32
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * torch.from_numpy(w)
    want = (x @ torch.from_numpy(W) + torch.from_numpy(b)).numpy()
    got = gate_logits(h, W, b, w if normed else None, 1e-6)
    assert got.shape == (T, E) and np.allclose(got, want, rtol=1e-4, atol=1e-4)
