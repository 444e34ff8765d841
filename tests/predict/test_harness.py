"""The harness shows each predictor only what its horizon allows; check_no_leak proves it per predictor."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from routecast.common.errors import ConfigError
from routecast.predict.embeddings import load_input_embeddings
from routecast.predict.forecast import Forecast
from routecast.predict.frequency import (
    ConditionalPredictor,
    DistributionPredictor,
    ProbabilityPredictor,
    by_position_preset,
    by_token_preset,
    ema_preset,
    mle_preset,
)
from routecast.predict.harness import (
    LAYER,
    REQUEST,
    LeakError,
    Predictor,
    check_no_leak,
    perturb_forbidden,
    run_harness,
)
from routecast.predict.neural import NeuralPredictor, ffn_preset, lstm_preset


class PrevLayer(Predictor):
    """Layer horizon, honest: layer l's experts = this step's layer l-1 experts, boosted by the router
    input of layer l-1 and the logits of layer l-1 (uses every input the layer view offers)."""

    name, horizon = "prev-layer", LAYER

    def predict(self, view):
        T, E = view.num_tokens, self.spec.num_experts
        if view.layer == 0:
            return Forecast(top_k=self.spec.top_k, dist_LE=np.full((1, E), 1.0 / E))
        s = np.zeros((T, E))
        np.put_along_axis(s, view.experts_TlK[:, -1].astype(np.int64), 1.0, axis=-1)
        s += np.abs(view.hidden_TlH[:, -1, :E]) + np.abs(view.logits_TlE[:, -1])
        return Forecast(top_k=self.spec.top_k, scores_TLE=(s / s.sum(-1, keepdims=True))[:, None, :])


class Oracle(Predictor):
    """Cheats: reads the true routing of the step from the trace under evaluation (however obtained)."""

    def __init__(self, spec, holder, horizon):
        super().__init__(spec)
        self.holder, self.horizon, self.name = holder, horizon, f"oracle-{horizon}"

    def predict(self, view):
        tr = self.holder["trace"]
        idx = np.flatnonzero(tr.step == view.step)
        hot = np.zeros((len(idx), self.spec.num_layers, self.spec.num_experts)) + 1e-3
        np.put_along_axis(hot, tr.experts_TLK[idx].astype(np.int64), 1.0, axis=-1)
        hot /= hot.sum(-1, keepdims=True)
        return Forecast(top_k=self.spec.top_k, scores_TLE=hot if view.layer is None else hot[:, view.layer : view.layer + 1])


class NoReset(DistributionPredictor):
    """Forgets to forget: a second evaluation starts with everything the first one revealed."""

    def reset(self):
        return None


def _quick(preset, **kw):
    return preset(embedding="learned", epochs=2, progress=False, val_fraction=0.0, **kw)


@pytest.fixture(scope="module")
def traces(routed_trace):
    tr = routed_trace(by="token", num_requests=20, prompt_len=6, decode_len=4, hidden=8, logits=True)
    train, test = tr.split("request", (0.7, 0.3), seed=0)
    return tr, train, test


def _shipped(spec, train, tmp_path):
    emb = np.random.default_rng(0).standard_normal((40, 12)).astype(np.float32)
    save_file({"model.embed_tokens.weight": emb}, str(tmp_path / "model.safetensors"))
    preds = [
        DistributionPredictor(spec, mle_preset()),
        DistributionPredictor(spec, ema_preset(0.3)),
        ProbabilityPredictor(spec),
        ConditionalPredictor(spec, by_token_preset()),
        ConditionalPredictor(spec, by_position_preset()),
        NeuralPredictor(spec, _quick(ffn_preset)),
        NeuralPredictor(spec, _quick(lstm_preset, window=4)),  # window < request length: exercises the ring
        NeuralPredictor(spec, ffn_preset(epochs=2, progress=False), embeddings=load_input_embeddings(tmp_path)),
    ]
    return [p.fit(train) for p in preds]


def test_no_leak_for_every_shipped_predictor(traces, tmp_path):
    tr, train, test = traces
    for pred in _shipped(tr.spec, train, tmp_path):
        assert check_no_leak(pred, test, seed=3) == 4, pred.name


def test_no_leak_for_a_layer_horizon_predictor_and_its_views(traces):
    tr, _, test = traces
    pred = PrevLayer(tr.spec)
    assert check_no_leak(pred, test, steps=[int(test.step.min()), int(test.step.max())]) == 2 * tr.spec.num_layers
    res = run_harness(pred, test)
    assert 0.0 <= np.mean(res.metrics["top_k_accuracy"]) <= 1.0 and res.forecast_kind == "token"


def test_cheating_predictors_are_caught(traces, monkeypatch):
    import routecast.predict.harness as harness

    tr, _, test = traces
    holder = {}
    walk = harness.run_harness

    def recording_run(pred, trace, **kw):
        holder["trace"] = trace
        return walk(pred, trace, **kw)

    monkeypatch.setattr(harness, "run_harness", recording_run)
    for horizon in (REQUEST, LAYER):
        with pytest.raises(LeakError, match="oracle"):
            check_no_leak(Oracle(tr.spec, holder, horizon), test)
    with pytest.raises(LeakError, match="distribution"):
        check_no_leak(NoReset(tr.spec), test)


def test_views_hold_only_what_the_horizon_allows(traces):
    tr, _, test = traces
    seen = []

    class Spy(Predictor):
        name = "spy"

        def predict(self, view):
            seen.append(view)
            with pytest.raises(ValueError):
                view.token_id[0] = 1  # read-only copies: a predictor cannot write into the trace
            return Forecast(top_k=2, dist_LE=np.full((1 if view.layer is not None else 3, 8), 1 / 8))

    run_harness(Spy(tr.spec), test, stop_after_step=int(test.step.min()))
    v = seen[0]
    assert v.layer is None and v.experts_TlK is None and v.hidden_TlH is None and v.logits_TlE is None
    seen.clear()
    Spy.horizon = LAYER
    run_harness(Spy(tr.spec), test, stop_after_step=int(test.step.min()))
    assert [v.layer for v in seen] == [0, 1, 2]
    assert [v.experts_TlK.shape[1] for v in seen] == [0, 1, 2]
    assert [v.hidden_TlH.shape[1] for v in seen] == [0, 1, 2]
    first = np.flatnonzero(test.step == test.step.min())
    np.testing.assert_array_equal(seen[2].hidden_TlH[:, 1], test.hidden_TLH[first, 1])


def test_perturbation_changes_exactly_the_forbidden_data(traces):
    tr, _, test = traces
    s = int(np.unique(test.step)[3])
    p = perturb_forbidden(test, s, layer=1, seed=0)
    past, now, fut = test.step < s, test.step == s, test.step > s
    assert (p.experts_TLK[past] == test.experts_TLK[past]).all() and (p.hidden_TLH[past] == test.hidden_TLH[past]).all()
    assert (p.experts_TLK[now][:, :1] == test.experts_TLK[now][:, :1]).all()
    assert (p.token_id[now] == test.token_id[now]).all()
    assert not (p.hidden_TLH[now][:, 1:] == test.hidden_TLH[now][:, 1:]).all()
    assert not (p.token_id[fut] == test.token_id[fut]).all() and not (p.logits_TLE[fut] == test.logits_TLE[fut]).all()


def test_harness_rejects_a_predictor_for_another_model(traces):
    tr, _, test = traces
    from routecast.trace import MoESpec

    with pytest.raises(ConfigError, match="E=4"):
        run_harness(ProbabilityPredictor(MoESpec(num_layers=3, num_experts=4, top_k=2)), test)


def test_harness_rejects_malformed_forecasts_naming_the_predictor(traces):
    tr, _, test = traces

    class Bad(Predictor):
        name = "bad"

        def __init__(self, spec, dist):
            super().__init__(spec)
            self.dist = dist

        def predict(self, view):
            return Forecast(top_k=2, dist_LE=self.dist)

    with pytest.raises(ConfigError, match="'bad' returned a forecast of shape \\(2, 8\\)"):
        run_harness(Bad(tr.spec, np.full((2, 8), 1 / 8)), test)
    with pytest.raises(ConfigError, match="'bad' at step .* summing to 2"):
        run_harness(Bad(tr.spec, np.full((3, 8), 2 / 8)), test)
