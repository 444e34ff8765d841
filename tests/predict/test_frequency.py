"""MoE-GPS frequency predictors: who wins on token- and position-determined routing, and the online MLE."""

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.predict.frequency import (
    ConditionalConfig,
    ConditionalPredictor,
    DistributionConfig,
    DistributionPredictor,
    ProbabilityPredictor,
    by_position_preset,
    by_token_preset,
    ema_preset,
    slot_counts_LE,
    static_preset,
)
from routecast.predict.harness import StepView, run_harness


def _acc(pred, test):
    return float(np.mean(run_harness(pred, test).metrics["top_k_accuracy"]))


def test_conditional_token_is_exact_on_token_routing_and_probability_is_not(routed_trace):
    tr = routed_trace(by="token")
    train, test = tr.split("request", (0.8, 0.2), seed=0)
    cond = ConditionalPredictor(tr.spec, by_token_preset()).fit(train)
    prob = ProbabilityPredictor(tr.spec).fit(train)
    pos = ConditionalPredictor(tr.spec, by_position_preset()).fit(train)
    assert cond.name == "conditional-token" and pos.name == "conditional-position"
    # every test token id also occurs in training (30 ids, ~480 training tokens)
    assert _acc(cond, test) == 1.0
    assert _acc(prob, test) < 0.6
    assert _acc(pos, test) < 0.6


def test_conditional_position_is_exact_on_position_routing(routed_trace):
    tr = routed_trace(by="position")
    train, test = tr.split("request", (0.8, 0.2), seed=0)
    assert _acc(ConditionalPredictor(tr.spec, by_position_preset()).fit(train), test) == 1.0
    assert _acc(ConditionalPredictor(tr.spec, by_token_preset()).fit(train), test) < 0.6


def test_conditional_falls_back_to_global_for_unseen_keys(routed_trace):
    tr = routed_trace(by="token")
    cond = ConditionalPredictor(tr.spec, ConditionalConfig(key="token")).fit(tr)
    n = 3
    view = StepView(spec=tr.spec, step=0, request=np.zeros(n, np.int64), position=np.arange(n, dtype=np.int32),
                    token_id=np.array([10_000, -1, 5], np.int32), phase=np.zeros(n, np.int8), task=np.zeros(n, np.int16))
    s = cond.predict(view).scores_TLE
    glob = slot_counts_LE(tr.experts_TLK, tr.spec.num_experts)
    glob /= glob.sum(-1, keepdims=True)
    np.testing.assert_allclose(s[0], glob, atol=1e-6)
    np.testing.assert_allclose(s[1], glob, atol=1e-6)
    # a seen id: its K table experts are its top K
    seen = tr.experts_TLK[tr.token_id == 5][0]
    assert (np.sort(cond.predict(view).topk()[2], -1) == np.sort(seen, -1)).all()


def test_distribution_is_the_online_mle_of_everything_seen(routed_trace):
    tr = routed_trace(by="token")
    train, test = tr.split("request", (0.5, 0.5), seed=1)
    pred = DistributionPredictor(tr.spec, DistributionConfig()).fit(train)
    res = run_harness(pred, test, collect=True)
    steps = [s for s, _ in res.forecasts]
    k = len(steps) // 2
    # the forecast of step k is the MLE over training + test steps before k
    seen = slot_counts_LE(train.experts_TLK, 8) + slot_counts_LE(test.experts_TLK[test.step < steps[k]], 8)
    np.testing.assert_allclose(res.forecasts[k][1].dist_LE, seen / seen.sum(-1, keepdims=True), rtol=1e-12)
    # static: never moves off the training MLE
    static = DistributionPredictor(tr.spec, static_preset()).fit(train)
    fc = run_harness(static, test, collect=True).forecasts
    tr_mle = slot_counts_LE(train.experts_TLK, 8)
    np.testing.assert_allclose(fc[-1][1].dist_LE, tr_mle / tr_mle.sum(-1, keepdims=True))


def test_distribution_ema_weights_the_newest_batch(routed_trace):
    tr = routed_trace(by="token", num_requests=6)
    pred = DistributionPredictor(tr.spec, ema_preset(0.25))
    res = run_harness(pred, tr, collect=True)
    steps = [idx for _, idx in tr.batches()]
    b0 = slot_counts_LE(tr.experts_TLK[steps[0]], 8)
    b1 = slot_counts_LE(tr.experts_TLK[steps[1]], 8)
    p0, p1 = b0 / b0.sum(-1, keepdims=True), b1 / b1.sum(-1, keepdims=True)
    np.testing.assert_allclose(res.forecasts[0][1].dist_LE, 1 / 8)  # nothing seen: uniform
    np.testing.assert_allclose(res.forecasts[1][1].dist_LE, p0)  # first batch replaces the empty state
    np.testing.assert_allclose(res.forecasts[2][1].dist_LE, 0.75 * p0 + 0.25 * p1)


def test_configs_reject_bad_values():
    with pytest.raises(ConfigError, match="decay"):
        DistributionConfig(decay=1.0)
    with pytest.raises(ConfigError, match="key"):
        ConditionalConfig(key="task")


def test_conditional_table_keeps_the_most_frequent_keys_within_max_keys(routed_trace):
    tr = routed_trace(by="token")
    ids, n = np.unique(tr.token_id, return_counts=True)
    cond = ConditionalPredictor(tr.spec, ConditionalConfig(key="token", max_keys=3)).fit(tr)
    assert cond.keys_U.tolist() == sorted(ids[np.argsort(-n, kind="stable")[:3]].tolist())
    assert cond.probs_ULE.shape == (3, tr.spec.num_layers, tr.spec.num_experts)
    glob = slot_counts_LE(tr.experts_TLK, tr.spec.num_experts)  # still from every training row
    np.testing.assert_allclose(cond.global_LE, glob / glob.sum(-1, keepdims=True), atol=1e-6)
    full = ConditionalPredictor(tr.spec, ConditionalConfig(key="token")).fit(tr)
    keep = np.searchsorted(full.keys_U, cond.keys_U)
    np.testing.assert_allclose(cond.probs_ULE, full.probs_ULE[keep], atol=1e-6)  # kept rows unchanged
    with pytest.raises(ConfigError, match="max_keys"):
        ConditionalConfig(max_keys=0)


def test_step_use_combines_each_tokens_use_as_independent(routed_trace):
    """ConditionalPredictor.step_use (fc-evict's forecast of a step from its input tokens): each token's row of the
    table, u = min(K·share, 0.99), combined as 1 - prod_t (1 - u_t); a token the table never saw uses the global row."""
    tr = routed_trace(by="token")
    cond = ConditionalPredictor(tr.spec, by_token_preset()).fit(tr)
    K, L, E = tr.spec.top_k, tr.spec.num_layers, tr.spec.num_experts
    seen = cond.keys_U[:3]
    u = np.minimum(K * cond.probs_ULE[:3].astype(np.float64), 0.99).reshape(3, L * E)
    np.testing.assert_allclose(cond.step_use(seen), 1 - np.prod(1 - u, 0), rtol=1e-12)
    np.testing.assert_allclose(cond.step_use(seen[:1]), u[0], rtol=1e-12)
    unseen = np.array([int(cond.keys_U.max()) + 7])
    np.testing.assert_allclose(cond.step_use(unseen), np.minimum(K * cond.global_LE.astype(np.float64), 0.99).ravel())
    assert np.all(cond.step_use(seen) >= cond.step_use(seen[:1]) - 1e-12)  # more tokens never use a key less
