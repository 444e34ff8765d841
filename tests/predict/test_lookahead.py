"""Lookahead predictor: cloned routers (Mixtral softmax, DeepSeek sigmoid/groups), distillation, online, store, leaks.

A tiny random Mixtral (tests.trace.test_capture.build) is captured with router inputs and logits into a
small trace once per module; the built-in checkpoint is never loaded here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from routecast.common.errors import ConfigError
from routecast.predict import check_no_leak, load_predictor, run_harness, save_predictor
from routecast.predict.frequency import slot_counts_LE
from routecast.predict.lookahead import LookaheadConfig, LookaheadPredictor, RouterRule
from routecast.trace.capture import capture
from routecast.trace.capture_arch import find_blocks, spec_from_model
from routecast.trace.io import TraceWriter, read_trace
from tests.trace.test_capture import build, tokenizer  # noqa: F401  (tokenizer is a fixture)

torch.set_num_threads(1)
WORDS = "the a cat dog sat on mat ran fast slow red blue green one two three if else for while def return".split()


@pytest.fixture(scope="module")
def mixtral():
    return build("mixtral", seed=3, num_hidden_layers=4)


@pytest.fixture(scope="module")
def tiny_trace(mixtral, tokenizer, tmp_path_factory):  # noqa: F811
    """24 requests of 3-7 random words, 6 new tokens each, routed by the tiny Mixtral (hidden + logits)."""
    rng = np.random.default_rng(0)
    prompts = [{"prompt": " ".join(rng.choice(WORDS, int(rng.integers(3, 8)))), "max_new_tokens": 6}
               for _ in range(24)]
    mixtral.generation_config.eos_token_id = None
    w = TraceWriter(tmp_path_factory.mktemp("la") / "t", spec_from_model(mixtral))
    capture(mixtral, tokenizer, prompts, w, max_new_tokens=6, batch_size=8, hidden=True, logits=True, progress=False)
    return read_trace(w.close())


def topk_acc(pred, trace) -> np.ndarray:
    return np.asarray(run_harness(pred, trace).metrics["top_k_accuracy"])


# ---------------------------------------------------------------------- the frozen-gate prior
def test_untrained_predictor_is_the_cloned_router_of_the_next_layer(mixtral, tiny_trace) -> None:
    tr = tiny_trace
    pred = LookaheadPredictor.from_model(mixtral, tr.spec, config=LookaheadConfig(epochs=0)).fit(tr)
    routers = [b.router for b in find_blocks(mixtral)]
    for layer in range(1, tr.spec.num_layers):
        h_prev = np.array(tr.hidden_TLH[:, layer - 1])
        want = h_prev @ routers[layer].weight.detach().numpy().T  # eq. 7 with a zero residual
        np.testing.assert_allclose(pred.predict_logits(layer, h_prev), want, rtol=1e-5, atol=1e-5)
        # the clone is layer l's own router: on layer l's input it reproduces the recorded logits
        np.testing.assert_allclose(pred.predict_logits(layer, tr.hidden_TLH[:, layer]), tr.logits_TLE[:, layer],
                                   rtol=1e-4, atol=1e-4)
    res = run_harness(pred, tr, collect=True)
    fc0 = res.forecasts[0][1]
    share = slot_counts_LE(tr.experts_TLK[:, :1], tr.spec.num_experts)[0]
    np.testing.assert_allclose(fc0.scores_TLE[0, 0], share / share.sum(), rtol=1e-6)  # layer 0: global shares
    assert res.forecast_kind == "token"


def test_needs_router_inputs_and_logits(mixtral, tiny_trace) -> None:
    no_hidden = dataclasses.replace(tiny_trace, hidden_TLH=None)
    pred = LookaheadPredictor.from_model(mixtral, tiny_trace.spec, config=LookaheadConfig(epochs=1))
    with pytest.raises(ConfigError, match="hidden_TLH"):
        pred.fit(no_hidden)
    with pytest.raises(ConfigError, match="router inputs"):
        run_harness(LookaheadPredictor.from_model(mixtral, config=LookaheadConfig(epochs=0)), no_hidden)
    with pytest.raises(ConfigError, match="expected"):
        LookaheadPredictor(tiny_trace.spec, np.zeros((2, 3, 4)))


# ---------------------------------------------------------------------- router rules
@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v2", "deepseek_v3"])
def test_rule_picks_the_routers_experts(arch: str) -> None:
    model = build(arch, seed=1)
    pred = LookaheadPredictor.from_model(model, config=LookaheadConfig(epochs=0))
    want_scoring = "sigmoid" if arch == "deepseek_v3" else "softmax"
    assert pred.rule.scoring == want_scoring and (pred.rule.n_group > 1) == (arch != "mixtral")
    K = pred.spec.top_k
    g = torch.Generator().manual_seed(0)
    for i, b in enumerate(find_blocks(model)[1:]):
        h = torch.randn(256, pred.spec.hidden_size, generator=g)
        with torch.no_grad():
            logits, _, idx = b.router(h)
        np.testing.assert_allclose(pred.predict_logits(i + 1, h.numpy()), logits.numpy(), rtol=1e-5, atol=1e-5)
        probs = pred.rule.forecast(logits, pred.net.correction[i])
        np.testing.assert_allclose(probs.sum(-1).numpy(), 1.0, rtol=1e-5)
        got = np.sort(probs.topk(K, dim=-1).indices.numpy(), -1)
        assert (got == np.sort(idx.numpy(), -1)).all(-1).mean() > 0.99


def test_rule_rejects_bad_settings() -> None:
    with pytest.raises(ConfigError):
        RouterRule(scoring="relu")
    with pytest.raises(ConfigError):
        RouterRule(n_group=2, topk_group=3)
    with pytest.raises(ConfigError):
        LookaheadConfig(buffer_tokens=0)


# ---------------------------------------------------------------------- distillation
def test_offline_distillation_beats_the_prior_and_reset_restores_it(mixtral, tiny_trace) -> None:
    tr = tiny_trace
    train, test = tr.split("request", (0.75, 0.25), seed=0)
    prior = LookaheadPredictor.from_model(mixtral, tr.spec, config=LookaheadConfig(epochs=0)).fit(train)
    cfg = LookaheadConfig(epochs=30, batch_size=64, lr=3e-3, seed=0)
    dist = LookaheadPredictor.from_model(mixtral, tr.spec, config=cfg).fit(train)
    assert dist.fit_log[-1] < dist.fit_log[0] - 0.02
    a_prior, a_dist = topk_acc(prior, test), topk_acc(dist, test)
    assert a_dist[1:].mean() > a_prior[1:].mean() + 0.02, (a_prior, a_dist)
    assert a_dist[0] == a_prior[0]  # layer 0 is the same global-share fallback
    again = LookaheadPredictor.from_model(mixtral, tr.spec, config=cfg).fit(train)
    np.testing.assert_array_equal(again.net.W2.detach().numpy(), dist.net.W2.detach().numpy())  # seeded


def test_online_updates_after_each_step_within_a_bounded_buffer(mixtral, tiny_trace) -> None:
    tr = tiny_trace
    cfg = LookaheadConfig(epochs=0, online=True, buffer_tokens=40, batch_size=32, online_updates=2, lr=3e-3)
    pred = LookaheadPredictor.from_model(mixtral, tr.spec, config=cfg).fit(tr.select(np.arange(0)))
    n_steps = len(np.unique(tr.step))
    run_harness(pred, tr)
    assert len(pred.online_loss) == 2 * n_steps
    assert pred._buf_h.shape[0] == 40 and pred._buf_y.shape[0] == 40
    assert np.abs(pred.net.W2.detach().numpy()).max() > 0  # the residual left zero
    assert pred.counts0_E.sum() == tr.spec.top_k * tr.num_tokens
    pred.reset()
    assert np.abs(pred.net.W2.detach().numpy()).max() == 0 and pred._buf_h is None and pred.counts0_E.sum() == 0
    first = run_harness(pred, tr, collect=True).forecasts
    second = run_harness(pred, tr, collect=True).forecasts  # reset() inside: same stream, same forecasts
    for (_, a), (_, b) in zip(first, second, strict=True):
        np.testing.assert_array_equal(a.scores_TLE, b.scores_TLE)


# ---------------------------------------------------------------------- store and causality
def test_save_load_round_trip(mixtral, tiny_trace, tmp_path) -> None:
    tr = tiny_trace
    pred = LookaheadPredictor.from_model(mixtral, tr.spec, config=LookaheadConfig(epochs=2, seed=5)).fit(tr)
    back = load_predictor(save_predictor(pred, tmp_path / "la"))
    assert isinstance(back, LookaheadPredictor) and back.rule == pred.rule and back.config == pred.config
    a = run_harness(pred, tr, collect=True).forecasts
    b = run_harness(back, tr, collect=True).forecasts
    for (_, x), (_, y) in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.scores_TLE, y.scores_TLE)


@pytest.mark.parametrize("online", [False, True])
def test_no_leak(mixtral, tiny_trace, online: bool) -> None:
    cfg = LookaheadConfig(epochs=1, online=online, buffer_tokens=64, batch_size=32)
    pred = LookaheadPredictor.from_model(mixtral, tiny_trace.spec, config=cfg).fit(tiny_trace)
    steps = np.unique(tiny_trace.step)
    assert check_no_leak(pred, tiny_trace, steps=[int(steps[0]), int(steps[len(steps) // 2])]) == 2 * 4
