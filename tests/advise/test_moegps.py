"""The advisor reproduces MoE-GPS's qualitative findings on our measured predictor overheads (and, as a what-if,
on the estimated Figure 4 curve; where a trend holds only on one of them the test says which), prices §3.3's error models in order,
skips the scatter for token-to-expert, and recommends the option with the minimum total, explained in one line."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from routecast.advise.moegps import (
    ACCURACIES,
    FIG7_GBPS,
    Setting,
    advise,
    advise_main,
    figure7,
    format_advice,
    moe_gps_setting,
    sweep,
    trace_skewness,
)
from routecast.common.errors import ConfigError
from routecast.sim.fits import (
    ExponentialFit,
    OverheadCurve,
    measured_overhead_curve,
    paper_overhead_curve,
    reference_measurement,
)
from routecast.sim.hardware import load_hardware
from routecast.sim.models import load_model
from routecast.trace import PREFILL, MoESpec, Trace, make_columns

SKEWS = (1.0, 1.4, 1.8, 2.2)


def _measured() -> dict:
    """Our predictors as measured (the shipped reference): their overhead curve, and only the grid accuracies
    they reach (beyond them the fit would extrapolate)."""
    meas, skew, _ = reference_measurement()
    acc = [r["top_k_accuracy"] for r in meas.token_rows()]
    return {"overhead": measured_overhead_curve(meas, skew),
            "accuracies": [a for a in ACCURACIES if min(acc) - 1e-9 <= a <= max(acc) + 1e-9]}


# The trends are checked on measured inputs first; the estimated-Figure-4 curve is a what-if kept for comparison.
INPUTS = {"measured": _measured(), "what-if estimate": {"overhead": paper_overhead_curve(), "accuracies": ACCURACIES}}


@pytest.mark.parametrize("inputs", INPUTS)
def test_distribution_only_wins_at_low_skew_on_nvlink(inputs):
    g = sweep(moe_gps_setting("nvlink"), skewness=[1.2, 1.4], **INPUTS[inputs])
    assert np.all(g.figure7 > 0) and np.all(g.distribution["total"] < g.none["total"])
    assert np.all(g.distribution["total"] < g.best_token_total)


@pytest.mark.parametrize("inputs", INPUTS)
def test_token_to_expert_wins_at_high_skew_on_pcie_under_the_strict_model(inputs):
    # The strict physical model (real replicas, 32 GB/s per direction) shows the trend on both inputs.
    assert sweep(moe_gps_setting("pcie", strict=True), skewness=[2.2], **INPUTS[inputs]).figure7[0] < 0


def test_token_to_expert_wins_at_high_skew_on_pcie_in_the_paper_setting_only_with_the_estimate():
    g = sweep(moe_gps_setting("pcie"), skewness=[2.2], **INPUTS["what-if estimate"])
    assert g.figure7[0] < 0 and g.best_token_total[0] < g.distribution["total"][0] < g.none["total"][0]
    # Measured inputs: this trend does NOT hold in the paper setting. Our most accurate predictors reach ~0.76, so
    # the best token-to-expert option still leaves ~24% error on the busiest rank, and distribution-only keeps a
    # small lead at skewness 2.2 on PCIe (it shrinks with skewness; see the next tests).
    m = sweep(moe_gps_setting("pcie"), skewness=[1.4, 2.2], **INPUTS["measured"])
    assert 0 < m.figure7[1] < m.figure7[0]


@pytest.mark.parametrize("link", ["nvlink", "pcie"])
def test_token_curve_is_u_shaped_in_accuracy(link):
    for inputs, setting in (("what-if estimate", moe_gps_setting(link)),
                            ("measured", moe_gps_setting(link, strict=True))):
        g = sweep(setting, skewness=[1.4, 1.8], **INPUTS[inputs])
        tot, best, rows = g.token["total"], g.best_token, np.arange(2)
        assert np.all((best > 0) & (best < g.accuracies.size - 1)), inputs  # the minimum lies strictly inside
        assert np.all(tot[:, 0] > tot[rows, best]) and np.all(tot[:, -1] > tot[rows, best])
        assert np.all(np.diff(g.overhead_frac, axis=1) > 0)  # overhead grows with accuracy ...
        ffn = np.diff(g.token["ffn"], axis=1)  # ... while FFN imbalance shrinks (with real replicas it stops
        assert np.all(ffn <= 0) and np.all(ffn[:, 0] < 0)  # falling once the replicas' own weight reads dominate)
    # Measured inputs in the paper setting (ideal duplication): NO U inside the accuracies our predictors reach.
    # Their overhead stays below ~3% of the forward, so the curve keeps falling up to the most accurate one; it
    # turns up inside the range only once every overhead is ~5-10x larger (asserted at 10x).
    m = INPUTS["measured"]
    g = sweep(moe_gps_setting(link), skewness=[1.4, 1.8], **m)
    assert np.all(np.diff(g.token["total"], axis=1) < 0)
    g10 = sweep(moe_gps_setting(link), skewness=[1.4, 1.8], overhead=m["overhead"].scaled(10.0),
                accuracies=m["accuracies"])
    assert np.all((g10.best_token > 0) & (g10.best_token < g10.accuracies.size - 1))


@pytest.mark.parametrize("inputs", INPUTS)
def test_figure7_gap_shrinks_with_skew_and_slower_links(inputs):
    v = figure7(moe_gps_setting("nvlink"), bandwidths=[b * 1e9 for b in FIG7_GBPS], skewness=SKEWS, **INPUTS[inputs])
    assert v.shape == (4, 4)
    assert np.all(np.diff(v, axis=1) < 0)  # token-to-expert gains with skewness
    assert np.all(np.diff(v, axis=0) < 0)  # and as bandwidth falls (600 -> 64 GB/s)


@pytest.mark.parametrize("inputs", INPUTS)
def test_error_models_are_ordered(inputs):
    base = moe_gps_setting("nvlink")
    acc = np.linspace(0.5, 0.95, 4)
    tot = {}
    for em in ("optimistic", "typical", "pessimistic"):
        g = sweep(dataclasses.replace(base, error_model=em), skewness=SKEWS, accuracies=acc,
                  overhead=INPUTS[inputs]["overhead"])
        tot[em] = (g.token["total"], g.distribution["total"])
    for i in range(2):
        assert np.all(tot["optimistic"][i] <= tot["typical"][i] + 1e-12)
        assert np.all(tot["typical"][i] <= tot["pessimistic"][i] + 1e-12)
    assert np.all(tot["typical"][0] < tot["pessimistic"][0])  # every accuracy < 1 carries some error


def test_token_to_expert_skips_the_scatter():
    g = sweep(moe_gps_setting("pcie"), skewness=[1.0], accuracies=[0.5, 0.8, 1.0])
    comm = g.token["ffn_comm"][0]
    assert np.all(np.diff(comm) < 0)  # fewer misrouted tokens, less dispatch traffic
    # At accuracy 1 only the combine is left: half of the no-prediction all-to-all at skewness 1.
    assert comm[-1] == pytest.approx(g.none["ffn_comm"][0] / 2, rel=1e-9)
    np.testing.assert_allclose(g.distribution["ffn_comm"], g.none["ffn_comm"])  # dist-only still scatters


def test_real_replicas_pay_only_at_larger_batches():
    strict = moe_gps_setting("nvlink", strict=True)
    small = sweep(strict, skewness=[1.4])
    big = sweep(dataclasses.replace(strict, batch=16), skewness=[1.4])
    assert small.distribution["total"][0] > small.none["total"][0]  # each replica re-reads 352 MB
    assert big.distribution["total"][0] < big.none["total"][0]


def _check_pick(adv):
    pick = [o for o in adv.options if o.achievable]
    assert adv.best.total_us == min(o.total_us for o in pick)
    for o in adv.options:
        assert o.total_us == pytest.approx(sum(o.parts_us.values()))
    assert adv.explanation.count(". ") == 0 and adv.explanation.endswith(".")  # one sentence
    assert "bottlenecked by communication?" in adv.explanation and "high load imbalance?" in adv.explanation
    assert adv.explanation.startswith(adv.best.label)


@pytest.mark.parametrize("link, placement, skew", [("nvlink", "ideal", 1.4), ("pcie", "ideal", 2.2),
                                                   ("nvlink", "replicas", 1.4), ("pcie", "replicas", 2.0)])
def test_advisor_returns_the_minimum_total(link, placement, skew):
    adv = advise(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4, link=link, placement=placement,
                 skewness=skew)
    _check_pick(adv)
    assert len(adv.options) == 2 + len(ACCURACIES)
    assert adv.other_placement["placement"] != placement
    assert adv.comm_bound == (adv.comm_share >= 0.25) and adv.high_imbalance == (skew >= 1.7)


def test_advisor_with_measured_rows_only_picks_what_was_measured():
    rows = [{"predictor": "distribution", "strategy": "distribution", "top_k_accuracy": 0.4, "overhead_frac": 0.001,
             "distribution_error_total": 0.02},
            {"predictor": "cheap", "strategy": "token", "top_k_accuracy": 0.55, "overhead_frac": 0.001},
            {"predictor": "good", "strategy": "token", "top_k_accuracy": 0.7, "overhead_frac": 0.004}]
    adv = advise(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4, link="pcie", placement="ideal",
                 skewness=2.2, predictor_rows=rows)
    _check_pick(adv)
    labels = [o.label for o in adv.options]
    assert "token-to-expert: good (measured)" in labels and adv.inputs["dist_error"] == 0.02
    grid = {o.accuracy: o.achievable for o in adv.options if o.label.startswith("token-to-expert @")}
    assert grid[0.55] and grid[0.7] and not grid[0.5] and not grid[0.95]
    assert adv.inputs["overhead_source"].startswith("measured")
    json.dumps(adv.as_dict(), allow_nan=False)
    with pytest.raises(ConfigError, match="lacks"):
        advise(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4, predictor_rows=[{"predictor": "x"}])


def test_custom_overhead_curve_changes_the_pick():
    free = OverheadCurve(skews=(1.4,), fits=(ExponentialFit(a=1e-9, b=1.0, r2=1.0, n=2),), source="free")
    kw = dict(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4, link="pcie", placement="ideal",
              skewness=2.2)
    assert advise(overhead=free, **kw).best.label == "token-to-expert @ 0.95"  # free accuracy: take the most


def _skewed_trace() -> Trace:
    """1024 prefill tokens all routed to experts 0 and 1 at both layers: skewness E / K = 4."""
    T = 1024
    ex = np.tile(np.array([0, 1], np.int16), (T, 2, 1))
    return Trace(spec=MoESpec(num_layers=2, num_experts=8, top_k=2),
                 tokens=make_columns(T, request=np.arange(T) // 256, position=np.arange(T) % 256,
                                     phase=np.full(T, PREFILL), step=np.arange(T) // 256),
                 experts_TLK=ex, weights_TLK=np.full(ex.shape, 0.5, np.float32))


def test_trace_skewness_and_advice_from_a_trace():
    tr = _skewed_trace()
    assert trace_skewness(tr, 512) == (pytest.approx(4.0), "trace: mean over 512-token prefill blocks and layers")
    s, src = trace_skewness(tr, 4096)  # no full block: per-step fallback
    assert s == pytest.approx(4.0) and "steps" in src
    adv = advise(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4, trace=tr, predictor_rows=[])
    assert adv.inputs["skewness"] == pytest.approx(4.0) and adv.inputs["skewness_source"].startswith("trace")
    _check_pick(adv)
    far = advise(model_profile="deepseek-v3", hardware="h100-sxm", gpus=8, trace=tr, predictor_rows=[])
    assert "8 experts" in far.inputs["note"]


def test_format_and_cli(capsys):
    adv = advise(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4, link="nvlink", skewness=1.4)
    text = format_advice(adv)
    assert "FFN comm" in text and f"* {adv.best.label}" in text and adv.explanation in text
    assert advise_main(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4, link="pcie",
                       skewness=1.8, as_json=True) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inputs"]["link_gbps_per_direction"] == pytest.approx(32.0)
    assert doc["best"]["total_us"] == min(o["total_us"] for o in doc["options"] if o["achievable"])


def test_bad_settings_fail_with_one_sentence():
    m, h = load_model("mixtral-8x7b"), load_hardware("a100-sxm-80gb")
    with pytest.raises(ConfigError, match="placement"):
        Setting(model=m, hw=h, gpus=4, placement="magic")
    with pytest.raises(ConfigError, match="gpus"):
        Setting(model=m, hw=h, gpus=16)
    with pytest.raises(ConfigError, match="error model"):
        Setting(model=m, hw=h, gpus=4, error_model="worst")
    with pytest.raises(ConfigError, match="skewness"):
        advise(model_profile=m, hardware=h, gpus=4, skewness=9.0)
    with pytest.raises(ConfigError, match="accuracies"):
        sweep(Setting(model=m, hw=h, gpus=4), skewness=[1.4], accuracies=[1.5])


def test_figure_plots_write_pngs(tmp_path):
    from routecast.report.moegps import plot_figure6, plot_figure7

    g = sweep(moe_gps_setting("nvlink"), skewness=SKEWS)
    p6 = plot_figure6(g, tmp_path / "f6.png", title="t")
    p7 = plot_figure7(SKEWS, FIG7_GBPS, np.zeros((4, 4)), tmp_path / "f7.png")
    for p in (p6, p7):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    with pytest.raises(ConfigError, match="shape"):
        plot_figure7(SKEWS, FIG7_GBPS, np.zeros((3, 4)), tmp_path / "bad.png")


@pytest.mark.slow
def test_demo_section_on_a_synthetic_trace(tmp_path):
    from routecast.report.html import render
    from routecast.report.moegps import ADVICE_PAIRS, section_moegps
    from routecast.trace.synth import SynthConfig, generate

    tr = generate(SynthConfig(name="demo-like", num_layers=4, num_experts=8, top_k=2, vocab_size=4096, num_tokens=8192,
                              seed=0, token_strength=3.0, prompt_len=(64.0,), output_len=(32.0,), max_running=16,
                              token_budget=512))
    sec, summary = section_moegps(tr, tmp_path, epochs=1)
    for name in ("fig4_measured", "fig6b", "fig6d", "fig7", "fig7_strict"):
        assert (tmp_path / "moegps" / f"{name}.png").is_file()
    assert len(summary["advice"]) == len(ADVICE_PAIRS) and "ffn" in summary["predictors"]
    assert "lstm" not in summary["predictors"] and 1.0 <= summary["skewness"] <= 8.0
    assert np.asarray(summary["figure7"]["paper"]).shape == (len(FIG7_GBPS), 7)
    assert "MoE-GPS" in render("t", [sec])
