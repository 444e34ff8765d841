"""Golden tests of the metrics and of Forecast's derived sets, on cases small enough to check by hand."""

import math

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.predict.forecast import Forecast, multi_hot
from routecast.predict.metrics import (
    CostMeter,
    MetricAccumulator,
    batch_level_accuracy,
    batch_level_accuracy_L,
    confusion_counts,
    distribution_error,
    exact_set_accuracy,
    precision_recall_f1,
    recall_at_2k,
    top_half_k_hit_rate,
    topk_accuracy,
)


def test_topk_accuracy_counts_overlap_over_true_and_ignores_dropped():
    pred = np.array([[0, 1], [1, 3], [5, 6], [2, 4]])
    true = np.array([[1, 2], [1, -1], [-1, -1], [4, 2]])
    got = topk_accuracy(pred, true)
    assert got[0] == 0.5  # {0,1} ∩ {1,2} = {1}
    assert got[1] == 1.0  # the one surviving true expert was predicted
    assert math.isnan(got[2])  # nothing was routed: not scored
    assert got[3] == 1.0  # order does not matter


def test_exact_set_accuracy():
    pred = np.array([[2, 1], [1, 3], [1, 0]])
    true = np.array([[1, 2], [1, 2], [1, -1]])
    np.testing.assert_array_equal(exact_set_accuracy(pred, true), [1.0, 0.0, 0.0])


def test_top_half_k_hit_rate_scores_the_heaviest_true_experts():
    # K = 4: the two heaviest true experts are 2 (.4) and 3 (.3); the prediction has 2 but not 3.
    w4 = np.array([[0.1, 0.4, 0.3, 0.2]])
    assert top_half_k_hit_rate(np.array([[5, 1, 2, 7]]), np.array([[1, 2, 3, 4]]), w4)[0] == 0.5
    # K = 2: only the heavier true expert counts.
    w2 = np.array([[0.3, 0.7]])
    assert top_half_k_hit_rate(np.array([[0, 2]]), np.array([[1, 2]]), w2)[0] == 1.0
    assert top_half_k_hit_rate(np.array([[1, 0]]), np.array([[1, 2]]), w2)[0] == 0.0
    # a dropped slot is never the heavy one; K = 3 takes ceil(3/2) = 2
    assert top_half_k_hit_rate(np.array([[4, 0]]), np.array([[-1, 4]]), np.array([[0.9, 0.1]]))[0] == 1.0
    w3 = np.array([[0.5, 0.3, 0.2]])
    assert top_half_k_hit_rate(np.array([[7, 4, 0]]), np.array([[4, 1, 7]]), w3)[0] == 0.5


def test_recall_at_2k():
    assert recall_at_2k(np.array([[0, 1, 2, 3]]), np.array([[3, 7]]))[0] == 0.5
    assert recall_at_2k(np.array([[7, 1, 2, 3]]), np.array([[3, 7]]))[0] == 1.0


def test_batch_level_accuracy_is_expertflow_eq7():
    R = np.array([[1, 1, 0, 0], [0, 0, 0, 1]], bool)
    R_hat = np.array([[1, 0, 1, 0], [0, 0, 0, 1]], bool)
    np.testing.assert_array_equal(batch_level_accuracy_L(R_hat, R), [0.5, 1.0])
    assert batch_level_accuracy(R_hat, R) == 0.75
    # A layer with no routed token is left out of the mean rather than counted as 0 or 1.
    R2 = np.array([[1, 1, 0, 0], [0, 0, 0, 0]], bool)
    assert batch_level_accuracy(R_hat, R2) == 0.5


def test_distribution_error_is_l1_over_num_experts():
    # p_hat = [.75, .25], p = [.5, .5]: L1 = .5, over E = 2 -> .25
    assert distribution_error(np.array([3.0, 1.0]), np.array([1.0, 1.0])) == pytest.approx(0.25)
    # per row, and rows with no mass are undefined
    got = distribution_error(np.array([[1.0, 0, 0, 0], [1, 1, 1, 1]]), np.array([[0, 0, 0, 1.0], [0, 0, 0, 0]]))
    assert got[0] == pytest.approx(0.5) and math.isnan(got[1])


def test_precision_recall_f1_and_confusion():
    pred = np.array([[1, 1, 1, 0, 0, 0, 0]], bool)
    true = np.array([[1, 1, 0, 1, 1, 1, 0]], bool)
    tp, fp, fn = confusion_counts(pred, true, axis=-1)
    assert (tp[0], fp[0], fn[0]) == (2, 1, 3)
    p, r, f1 = precision_recall_f1(tp, fp, fn)
    assert p[0] == pytest.approx(2 / 3) and r[0] == pytest.approx(2 / 5) and f1[0] == pytest.approx(0.5)  # 2PR/(P+R) = 2tp/(2tp+fp+fn) = 4/8


def test_cost_meter():
    c = CostMeter()
    assert math.isnan(c.us_per_token)
    c.add(2000, 4)
    c.add(4000, 2)
    assert c.us_per_token == 1.0 and c.us_per_batch == 3.0


def test_forecast_topk_breaks_ties_to_lower_expert_and_derives_sets():
    s = np.array([[[0.25, 0.25, 0.5, 0.0]], [[0.1, 0.2, 0.3, 0.4]]])  # T=2, L=1, E=4
    f = Forecast(top_k=2, scores_TLE=s)
    np.testing.assert_array_equal(f.topk(), [[[2, 0]], [[3, 2]]])
    np.testing.assert_array_equal(f.topk(1), [[[2]], [[3]]])
    np.testing.assert_allclose(f.expected_counts_LE(), [[0.7, 0.9, 1.6, 0.8]])
    np.testing.assert_array_equal(f.active_sets(threshold=0.3), [[[0, 0, 1, 0]], [[0, 0, 1, 1]]])
    np.testing.assert_array_equal(f.batch_active_LE(2), [[1, 0, 1, 1]])
    assert f.token_level and f.num_tokens == 2 and f.num_layers == 1 and f.num_experts == 4


def test_distribution_forecast_batch_set_grows_with_batch_size():
    d = Forecast(top_k=1, dist_LE=np.array([[0.5, 0.3, 0.15, 0.05]]))
    np.testing.assert_array_equal(d.topk(), [[0]])
    np.testing.assert_allclose(d.expected_counts_LE(10), [[5.0, 3.0, 1.5, 0.5]])
    # 1 token: 0.5+0.3+0.15+0.05 = 1 expected distinct expert -> the top one.
    np.testing.assert_array_equal(d.batch_active_LE(1), [[1, 0, 0, 0]])
    # 10 tokens: (1-.5^10) + (1-.7^10) + (1-.85^10) + (1-.95^10) = 3.17 -> the top three.
    np.testing.assert_array_equal(d.batch_active_LE(10), [[1, 1, 1, 0]])
    # 40 tokens: 3.87 -> all four.
    np.testing.assert_array_equal(d.batch_active_LE(40), [[1, 1, 1, 1]])
    assert d.token_topk(3).shape == (3, 1, 1) and d.num_tokens is None
    with pytest.raises(ConfigError, match="num_tokens"):
        d.expected_counts_LE()


def test_forecast_rejects_malformed_input():
    with pytest.raises(ConfigError, match="exactly one"):
        Forecast(top_k=1)
    with pytest.raises(ConfigError, match="summing to 1"):
        Forecast(top_k=1, dist_LE=np.array([[0.5, 0.2]])).validate()
    with pytest.raises(ConfigError, match="min entry -0.5"):
        Forecast(top_k=1, dist_LE=np.array([[1.5, -0.5]])).validate()
    with pytest.raises(ConfigError, match="3-d float"):
        Forecast(top_k=1, scores_TLE=np.zeros((2, 3)))
    with pytest.raises(ConfigError, match="top_k"):
        Forecast(top_k=3, dist_LE=np.array([[0.5, 0.5]]))


def test_multi_hot_skips_dropped():
    np.testing.assert_array_equal(multi_hot(np.array([[2, -1], [0, 1]]), 3), [[0, 0, 1], [1, 1, 0]])


def test_accumulator_reduces_tokens_and_steps_by_hand():
    acc = MetricAccumulator(num_layers=1, num_experts=4, top_k=2)
    # step 1: two tokens; prediction {0,1} for both; truth {0,2} and {0,1}
    s1 = np.tile(np.array([0.4, 0.3, 0.2, 0.1]), (2, 1, 1))
    acc.update(Forecast(top_k=2, scores_TLE=s1), np.array([[[0, 2]], [[0, 1]]]), np.array([[[0.4, 0.6]], [[0.9, 0.1]]]))
    # step 2: one token predicted {2,3}; truth {2,3}
    s2 = np.array([[[0.0, 0.0, 0.5, 0.5]]])
    acc.update(Forecast(top_k=2, scores_TLE=s2), np.array([[[3, 2]]]), np.array([[[0.5, 0.5]]]))
    r = acc.result()
    assert r["top_k_accuracy"][0] == pytest.approx((0.5 + 1 + 1) / 3)
    assert r["exact_set_accuracy"][0] == pytest.approx(2 / 3)
    assert r["recall_at_2k"][0] == pytest.approx(1.0)
    # heaviest true experts: 2 (missed), 0 (hit), 3 (hit)
    assert r["top_half_k_hit_rate"][0] == pytest.approx(2 / 3)
    # batch level: step 1 R={0,1,2}, R_hat={0,1} -> 2/3; step 2 -> 1; mean over steps
    assert r["batch_level_accuracy"][0] == pytest.approx((2 / 3 + 1) / 2)
    # active sets micro-averaged: tp 2+2, fp 0, fn 1
    assert r["active_precision"][0] == 1.0 and r["active_recall"][0] == pytest.approx(0.8)
    # distribution error step 1: p_hat = [.4,.3,.2,.1], p = [.5,.25,.25,0] -> L1 .3 / 4; step 2 exact
    assert r["distribution_error"][0] == pytest.approx((0.075 + 0.0) / 2)
    # over the whole run: p_hat ∝ [1.6,1.2,1.8,1.4] / 6, p ∝ [2,1,2,1] / 6
    assert r["distribution_error_total"][0] == pytest.approx(np.abs(np.array([1.6, 1.2, 1.8, 1.4]) - [2, 1, 2, 1]).sum() / 6 / 4)


@pytest.mark.parametrize("E,k", [(256, 8), (64, 6), (32, 4), (256, 1), (8, 2)])
def test_topk_indices_equals_a_stable_sort_with_ties(E, k):
    from routecast.predict.forecast import topk_indices

    rng = np.random.default_rng(E + k)
    for scores in (rng.integers(0, 4, (500, E)).astype(np.float32),  # many ties at the k-th value
                   rng.random((20, 7, E)), np.zeros((3, E))):
        want = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
        np.testing.assert_array_equal(topk_indices(scores, k), want)


def test_topk_indices_of_a_broadcast_forecast_ranks_one_row():
    from routecast.predict.forecast import topk_indices

    row = np.random.default_rng(0).random((5, 64))
    b = np.broadcast_to(row, (1000, 5, 64))
    got = topk_indices(b, 6)
    assert got.shape == (1000, 5, 6) and got.strides[0] == 0  # no (T, L, E) copy was made
    np.testing.assert_array_equal(got, np.argsort(-b, axis=-1, kind="stable")[..., :6])
