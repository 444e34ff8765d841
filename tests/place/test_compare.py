import dataclasses

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.place.compare import (
    METHODS,
    compare_methods,
    section_probe,
    step_loads,
    summarize,
    throughput_series,
    transition_forecast,
)
from routecast.sim.hardware import load_hardware
from routecast.sim.models import load_model
from routecast.trace.synth import SynthConfig, generate

HW, MODEL = load_hardware("h100-sxm"), load_model("mixtral-8x7b")


@pytest.fixture(scope="module")
def trace():
    cfg = SynthConfig(num_layers=3, num_experts=8, top_k=2, num_tokens=40 * 96, token_budget=96, max_running=96,
                      prompt_len=(8.0,), output_len=(60.0,), popularity_alpha=1.5, layer_strength=2.0,
                      layer_fanout=1, token_strength=1.0, drift_sigma=0.3, drift_window=4, shift_step=20,
                      shift_strength=0.8, seed=3)
    return generate(cfg)


@pytest.fixture(scope="module")
def res(trace):
    return compare_methods(trace, ep=4, hw=HW, model=MODEL)


def test_loads_are_conserved_by_every_method(trace, res):
    loads, tokens, _ = step_loads(trace)
    assert loads.sum() == trace.num_tokens * trace.spec.top_k * trace.spec.num_layers
    assert (loads.sum(axis=2) == tokens[:, None] * trace.spec.top_k).all()
    assert set(res["methods"]) == set(METHODS)
    for name, m in res["methods"].items():
        np.testing.assert_allclose(m["load_TLG"].sum(axis=2), loads.sum(axis=2), rtol=1e-9, err_msg=name)
        assert m["moe_s_TL"].shape == loads.shape[:2] and (m["moe_s_TL"] > 0).all()
    assert (res["methods"]["static"]["bytes_T"] == 0).all()


def test_oracle_beats_the_forecast_and_bounds_hold(res):
    m = res["methods"]
    assert m["probe_oracle"]["moe_s_TL"].mean() <= m["probe_pred"]["moe_s_TL"].mean()
    # planning on the true loads never makes a layer slower than static sharding
    assert (m["probe_oracle"]["moe_s_TL"] <= m["static"]["moe_s_TL"] * (1 + 1e-9)).all()
    # no plan within PROBE's replica budget goes below the lower bound (static and the oracle are such plans)
    for name in ("static", "probe_oracle"):
        assert (m[name]["ir_TL"] >= res["ir_bound_TL"] - 1e-9).all(), name
    assert (m["static"]["ir_TL"] > res["ir_bound_TL"] + 1e-9).any()


def test_forecast_is_causal_and_conserves_tokens(trace):
    pred = transition_forecast(trace)
    loads, tokens, _ = step_loads(trace)
    K = trace.spec.top_k
    np.testing.assert_allclose(pred[:, 0].sum(axis=1), tokens * K)
    np.testing.assert_allclose(pred[:, 1:].sum(axis=2), loads[:, :-1].sum(axis=2))
    # rewriting step 30's routing of layer 2 changes no forecast of earlier steps nor of step 30's layers <= 2
    steps = np.unique(trace.tokens["step"])
    later = trace.tokens["step"] == steps[30]
    other = dataclasses.replace(trace, experts_TLK=trace.experts_TLK.copy())
    other.experts_TLK[later, 2] = (other.experts_TLK[later, 2] + 1) % trace.spec.num_experts
    pred2 = transition_forecast(other)
    np.testing.assert_array_equal(pred2[:31], pred[:31])
    assert not np.array_equal(pred2[31:], pred[31:])
    # the forecast learns the inter-layer structure: closer to the truth than a uniform guess
    err = np.abs(pred[5:, 1:] - loads[5:, 1:]).sum()
    uniform = np.abs(loads[5:, 1:].sum(axis=2, keepdims=True) / 8 - loads[5:, 1:]).sum()
    assert err < uniform


def test_summary_plot_section_and_errors(trace, res, tmp_path):
    rows = summarize(res, shift_step=20)
    by = {r["method"]: r for r in rows}
    assert by["eplb_window"]["decode_vs_eplb"] == pytest.approx(1.0)
    assert by["static"]["MB_per_step"] == 0 and by["ir_lower_bound"]["IR"] <= by["static"]["IR"]
    assert by["probe_oracle"]["moe_us_after"] <= by["static"]["moe_us_after"]
    series = throughput_series(res)
    assert all(v.shape == (res["tokens_T"].size,) and (v > 0).all() for v in series.values())
    sec, info = section_probe(trace, str(tmp_path), ep=4, shift_step=20)
    assert sec.key == "probe" and any("<table>" in p for p in sec.parts) and (tmp_path / "probe_vs_eplb.png").exists()
    assert info["settings"]["ep"] == 4
    loads = res["loads_TLE"]
    with pytest.raises(ConfigError, match="predicted"):
        compare_methods(loads, ep=4, hw=HW, model=MODEL)
    with pytest.raises(ConfigError, match="experts"):
        compare_methods(loads, ep=3, hw=HW, model=MODEL, predicted=loads)
    # with the truth as the forecast, the predictor-driven plan is the oracle's
    same = compare_methods(loads[:6], ep=4, hw=HW, model=MODEL, predicted=loads[:6])
    np.testing.assert_allclose(same["methods"]["probe_pred"]["moe_s_TL"], same["methods"]["probe_oracle"]["moe_s_TL"])
