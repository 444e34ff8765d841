"""MoE-GPS §3.2.2 fits recover known parameters; the reference data keeps the paper's stated trends; measuring
our predictors yields overheads as predictor time over the forward time of the same run."""

from __future__ import annotations

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.sim.fits import (
    TABLE1,
    ExponentialFit,
    OverheadCurve,
    fit_exponential,
    fit_polynomial,
    measure_predictors,
    measured_overhead_curve,
    paper_dist_error,
    paper_overhead_curve,
    pareto_front,
)
from routecast.trace import MoESpec, Trace, make_columns


@pytest.mark.parametrize("a, b", [(2e-3, 7.0), (0.05, 2.5), (1e-4, 12.0)])
def test_exponential_fit_recovers_parameters(a, b):
    rng = np.random.default_rng(0)
    acc = rng.uniform(0.2, 0.95, 60)
    overhead = a * np.exp(b * acc) * np.exp(rng.normal(0, 0.05, acc.size))  # 5% multiplicative noise
    f = fit_exponential(acc, overhead)
    assert f.a == pytest.approx(a, rel=0.1) and f.b == pytest.approx(b, rel=0.03)
    assert 0.9 < f.r2 <= 1.0 and f.n == 60
    np.testing.assert_allclose(f([0.3, 0.7]), f.a * np.exp(f.b * np.array([0.3, 0.7])))
    exact = fit_exponential([0.3, 0.6, 0.9], a * np.exp(b * np.array([0.3, 0.6, 0.9])))
    assert exact.r2 == pytest.approx(1.0) and exact.b == pytest.approx(b)


def test_polynomial_fit_recovers_coefficients_and_sweet_spot():
    rng = np.random.default_rng(1)
    acc = np.linspace(0.3, 0.95, 40)
    coef = (-3.0, 4.2, -0.5)  # peak at 4.2 / 6 = 0.7
    perf = np.polyval(coef, acc) + rng.normal(0, 0.005, acc.size)
    f = fit_polynomial(acc, perf)
    np.testing.assert_allclose(f.coef, coef, atol=0.15)
    assert f.deg == 2 and f.r2 > 0.98
    assert f.argmax(0.3, 0.95) == pytest.approx(0.7, abs=0.01)
    assert f.argmax(0.8, 0.95) == pytest.approx(0.8)  # vertex outside: the bound nearest it
    cubic = fit_polynomial(acc, np.polyval((1.0, -2.0, 0.5, 0.1), acc), 3)
    np.testing.assert_allclose(cubic.coef, (1.0, -2.0, 0.5, 0.1), atol=1e-8)


def test_fit_arguments_fail_with_one_sentence():
    with pytest.raises(ConfigError, match="one overhead per accuracy"):
        fit_exponential([0.1, 0.2], [0.1])
    with pytest.raises(ConfigError, match="distinct"):
        fit_exponential([0.5, 0.5], [0.1, 0.2])
    with pytest.raises(ConfigError, match="positive"):
        fit_exponential([0.1, 0.5], [0.0, 0.2])
    with pytest.raises(ConfigError, match="distinct"):
        fit_polynomial([0.1, 0.5], [1.0, 0.5], 2)
    with pytest.raises(ConfigError, match="degree"):
        fit_polynomial([0.1, 0.5], [1.0, 0.5], -1)


def test_pareto_front():
    acc = np.array([0.4, 0.6, 0.5, 0.6, 0.9])
    ovh = np.array([0.01, 0.02, 0.05, 0.03, 0.2])
    # 0.5 @ 0.05 is beaten by 0.6 @ 0.02; 0.6 @ 0.03 by 0.6 @ 0.02.
    np.testing.assert_array_equal(pareto_front(acc, ovh), [True, True, False, False, True])


def test_overhead_curve_interpolates_in_skewness():
    lo, hi = ExponentialFit(a=1e-3, b=8.0, r2=1.0, n=2), ExponentialFit(a=4e-3, b=4.0, r2=1.0, n=2)
    c = OverheadCurve(skews=(2.0, 1.0), fits=(hi, lo), source="test")  # unsorted on purpose
    np.testing.assert_allclose(c(0.7, 1.0), lo(0.7))
    np.testing.assert_allclose(c(0.7, 2.0), hi(0.7))
    np.testing.assert_allclose(c(0.7, 1.5), np.sqrt(lo(0.7) * hi(0.7)))  # log-linear: geometric mean
    beyond = c(0.7, 3.0)  # extended, not clamped
    assert beyond == pytest.approx(np.exp(2 * np.log(hi(0.7)) - np.log(lo(0.7))))
    assert c(np.array([[0.5, 0.9]]), np.array([[1.0], [2.0]])).shape == (2, 2)
    np.testing.assert_allclose(c.scaled(3.0)(0.6, 1.7), 3.0 * c(0.6, 1.7))
    one = OverheadCurve(skews=(1.4,), fits=(lo,), source="one")
    np.testing.assert_allclose(one(0.8, [1.0, 2.2]), lo(0.8))
    with pytest.raises(ConfigError, match="one fit per skewness"):
        OverheadCurve(skews=(1.0, 2.0), fits=(lo,), source="bad")


def test_paper_reference_keeps_the_papers_trends():
    c = paper_overhead_curve()
    acc = np.linspace(0.5, 0.95, 10)
    for s in (1.0, 1.4, 2.0, 2.2):
        assert np.all(np.diff(c(acc, s)) > 0)  # accuracy costs overhead
    assert np.all(c(acc, 2.0) < c(acc, 1.4))  # §3.2.2: higher skewness, cheaper accuracy
    assert all(f.r2 > 0.9 for f in c.fits) and "estimated" in c.source
    err = paper_dist_error(np.array([1.0, 1.4, 2.0, 2.2]))
    assert err[0] == 0.0 and np.all(np.diff(err) >= 0)  # Table 1: more skew, worse estimates
    sst2 = next(r for r in TABLE1 if r[0] == "SST2")
    assert paper_dist_error(sst2[1]) == pytest.approx(sst2[2], abs=0.01)


def _affine_trace(T: int = 1200, seed: int = 0) -> Trace:
    """Requests of 20 tokens in 4-token steps; each token id has fixed experts (conditional-token is exact)."""
    rng = np.random.default_rng(seed)
    L, E, K, V = 2, 8, 2, 40
    req = np.arange(T) // 20
    step = np.arange(T) // 4
    tid = rng.integers(0, V, T)
    table = np.argsort(rng.random((V, L, E)), axis=-1)[..., :K]
    ex = table[tid].astype(np.int16)
    return Trace(spec=MoESpec(num_layers=L, num_experts=E, top_k=K, name="fits-test"),
                 tokens=make_columns(T, request=req, position=np.arange(T) % 20, token_id=tid, step=step),
                 experts_TLK=ex, weights_TLK=np.full(ex.shape, 0.5, np.float32), provenance={"generator": "test"})


def test_measure_predictors_relates_predictor_time_to_the_forward():
    tr = _affine_trace()
    m = measure_predictors(tr, ("distribution", "probability", "conditional-token"), model_dir="none", repeat=3)
    by = {r["predictor"]: r for r in m.rows}
    assert by["distribution"]["strategy"] == "distribution" and by["conditional-token"]["strategy"] == "token"
    assert m.forward_us_per_token > 0 and m.forward_tokens == 4 and "random-init" in m.forward_source
    for r in m.rows:
        assert r["overhead_frac"] == pytest.approx(r["us_per_token"] / m.forward_us_per_token)
    assert by["conditional-token"]["top_k_accuracy"] > 0.95 > by["probability"]["top_k_accuracy"]
    assert np.isfinite(m.dist_error()) and len(m.token_rows()) == 2
    curve = measured_overhead_curve(m, 1.6)
    assert curve.skews == (1.6,) and curve.fits[0].n == 2 and "measured" in curve.source


def test_measurement_round_trips_and_the_shipped_reference_is_the_default_curve(tmp_path):
    from routecast.sim.fits import (
        load_measurement,
        reference_measurement,
        reference_overhead_curve,
        save_measurement,
    )

    meas, skew, doc = reference_measurement()
    assert doc["trace"] and "split by document" in meas.split  # held-out documents, not requests
    for r in meas.rows:
        assert r["overhead_frac"] == pytest.approx(r["us_per_token"] / meas.forward_us_per_token)
    curve = reference_overhead_curve()
    want = measured_overhead_curve(meas, skew)
    assert curve.fits == want.fits and curve.source.startswith("measured")
    p = save_measurement(meas, skew, tmp_path / "m.json", trace="t")
    back, s2, d2 = load_measurement(p)
    assert back == meas and s2 == skew and d2["trace"] == "t"
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ConfigError, match="bad.json: cannot be read as a predictor measurement"):
        load_measurement(tmp_path / "bad.json")
