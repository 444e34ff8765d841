"""eMoE expert loading: eq. 2, per-layer budgets, residency choices; profile and quality on the built-in model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.cache.emoe import (
    LRUState,
    expected_tokens,
    layer_budgets,
    parse_fraction,
    random_resident,
    sensitivity_weights,
    top_l,
)
from routecast.common.errors import ConfigError


def test_eq2_worked_example():
    # Two tasks, one layer, three experts. Task 0: 100 input tokens, sensitive; task 1: 50 tokens, insensitive.
    f = np.array([[[0.5, 0.3, 0.2]], [[0.0, 0.0, 1.0]]])
    n = expected_tokens(f, np.array([100.0, 50.0]), np.array([[1], [0]]))
    assert np.allclose(n, [[50.0, 30.0, 20.0]])
    # With 2 running prompts of task 1 expected to generate 10 tokens each and s = 1: (50 + 2 * 10) * 1.0 on e2.
    n2 = expected_tokens(f, np.array([100.0, 50.0]), np.ones((2, 1)), np.array([0.0, 10.0]), np.array([0.0, 2.0]))
    assert np.allclose(n2, [[50.0, 30.0, 90.0]])


@settings(max_examples=200, deadline=None)
@given(L=st.integers(1, 6), E=st.integers(2, 64), K=st.integers(1, 8), frac=st.floats(0.01, 1.0),
       w=st.lists(st.floats(0, 1), min_size=6, max_size=6))
def test_layer_budgets_respect_total_and_bounds(L, E, K, frac, w):
    K = min(K, E)
    wl = np.array(w[:L])
    b = layer_budgets(frac, L, E, K, wl)
    total = min(L * E, max(L * K, int(round(frac * L * E))))
    assert b.shape == (L,) and (b >= K).all() and (b <= E).all()
    assert b.sum() == total
    if (wl > 0).any() and (wl <= 0).any():  # sensitive layers are never kept emptier than insensitive ones
        assert b[wl > 0].min() >= b[wl <= 0].max() or b[wl > 0].min() == E


def test_budgets_keep_sensitive_layers_fuller():
    b = layer_budgets(0.5, 4, 16, 2, np.array([0.0, 0.0, 1.0, 0.5]))
    assert b.sum() == 32 and list(b[:2]) == [4, 4] and list(b[2:]) == [12, 12]
    assert list(layer_budgets(0.5, 4, 16, 2)) == [8, 8, 8, 8]


def test_top_l_ties_and_random_and_lru():
    score = np.array([[1.0, 3.0, 3.0, 0.0]])
    assert top_l(score, np.array([2])).tolist() == [[False, True, True, False]]
    assert top_l(score, np.array([1]), tie_LE=np.array([[0, 0, 1, 0]])).tolist() == [[False, False, True, False]]
    r = random_resident(np.array([3, 1]), 5, np.random.default_rng(0))
    assert r.sum(1).tolist() == [3, 1]
    lru = LRUState(1, 4)
    lru.observe(np.array([[[0, 1]]]), tick=0)
    lru.observe(np.array([[[2, 1]], [[2, 3]]]), tick=1)  # 2 used twice in the newest tick
    assert lru.resident(np.array([2])).tolist() == [[False, True, True, False]]  # 1 and 3 tie: lower id
    assert lru.resident(np.array([1])).tolist() == [[False, False, True, False]]
    assert np.allclose(sensitivity_weights(np.array([[1, 0], [1, 1]]), np.array([3.0, 1.0])), [1.0, 0.25])


@pytest.mark.parametrize("text,want", [("50%", 0.5), ("0.25", 0.25), ("75", 0.75), ("100%", 1.0)])
def test_parse_fraction(text, want):
    assert parse_fraction(text) == pytest.approx(want)


@pytest.mark.parametrize("bad", ["0", "0%", "150%", "-5%", "nan", "abc", ""])
def test_parse_fraction_refuses(bad):
    with pytest.raises(ConfigError):
        parse_fraction(bad)
