"""`routecast calibrate`: the fit from sweep times to the cost model's curves (synthetic times, CPU and GPU
plans), and a real quick calibration of this CPU."""

import dataclasses
import time

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.sim.calibrate import (
    QUICK_TOKENS,
    CalibrationPlan,
    bandwidth_curve,
    calibrate,
    cpu_plan,
    cuda_plan,
    eta_curve,
    fit_curves,
    median_times,
    plan_points,
    swiglu_bytes,
)
from routecast.sim.cost import layer_cost, prefill
from routecast.sim.hardware import load_hardware
from routecast.sim.models import ModelProfile


# ---- the fit, on synthetic times ---------------------------------------------------------------------------
class Truth:
    """A device whose expert call costs floor + max(W / B(W), flops / (eta(n) peak)) + act n (3H + 2I), B and
    eta smooth."""

    def __init__(self, *, floor, b_inf, w0, peak, eta_max, n0, dtype_bytes, act=0.0):
        self.floor, self.b_inf, self.w0, self.peak, self.act = floor, b_inf, w0, peak, act
        self.eta_max, self.n0, self.dtype_bytes = eta_max, n0, dtype_bytes

    def expert_s(self, H, I_, n):
        w = swiglu_bytes(H, I_, self.dtype_bytes)
        eta = self.eta_max * n / (n + self.n0)
        bw = self.b_inf * np.sqrt(w / (w + self.w0))  # small matrices stream slower, tiny ones cost ~0
        return self.floor + max(w / bw, 6.0 * n * H * I_ / (eta * self.peak)) + self.act * n * (3 * H + 2 * I_)


def _fit_and_predict(plan, truth, eta_shape, shapes, tokens):
    """Fit the plan's sweep on `truth` and return (|relative error| of predicted expert times, hardware)."""
    pts = plan_points(plan, eta_shape)
    t = np.array([truth.expert_s(*p) for p in pts])
    fit = fit_curves(plan, eta_shape, t, np.zeros(len(t)), 1e-4, truth.peak, truth.dtype_bytes, activation_s=truth.act)
    hw = dataclasses.replace(
        load_hardware("h100-sxm"), peak_flops=fit.peak_flops, tile_m=0, activation_cost=fit.activation_s, eta_tokens=fit.eta_tokens,
        eta_values=fit.eta_values, weight_bytes=fit.weight_bytes, weight_bandwidth=fit.weight_bandwidth,
        expert_call_overhead=fit.expert_call_s, moe_layer_overhead=fit.moe_layer_s,
    )
    errs = []
    for H, I_ in shapes:
        model = ModelProfile(name="v", vocab_size=1, num_layers=1, hidden_size=H, num_experts=2, top_k=1,
                             expert_ffn=I_, num_heads=1, num_kv_heads=1, head_dim=H, dtype_bytes=truth.dtype_bytes)
        counts = np.array([[[n, 0.0]] for n in tokens])  # one active expert with n tokens
        pred = layer_cost(counts, model=model, hw=hw, work=prefill(1, np.asarray(tokens, float))).ffn - fit.moe_layer_s
        true = np.array([truth.expert_s(H, I_, n) for n in tokens])
        errs.append(np.abs(pred / true - 1))
    return np.array(errs), hw, fit


def test_fit_recovers_each_term_on_the_cpu_plan():
    truth = Truth(floor=50e-6, b_inf=14e9, w0=2e6, peak=90e9, eta_max=0.85, n0=4, dtype_bytes=4, act=0.7e-9)
    plan = cpu_plan()
    errs, hw, fit = _fit_and_predict(plan, truth, plan.eta_shape, [(384, 1024), (768, 2048)], [1, 2, 8, 32, 128, 512])
    assert fit.expert_call_s == pytest.approx(truth.expert_s(*plan.floor_shape, 1))
    assert fit.moe_layer_s == pytest.approx(1e-4) and fit.peak_flops == truth.peak  # eta < 1 everywhere
    # Weight-read points: B(W) = W / (t - floor), exactly what the sizes cost beyond the floor.
    w = np.array(fit.weight_bytes)
    assert np.all(np.diff(fit.weight_bandwidth) > 0) and fit.weight_bandwidth[-1] < truth.b_inf
    # Memory-bound counts are left out of eta; the kept ones are the true efficiency.
    assert fit.eta_tokens[0] > 1 and set(fit.eta_tokens) <= set(float(n) for n in plan.tokens)
    eta_true = truth.eta_max * np.array(fit.eta_tokens) / (np.array(fit.eta_tokens) + truth.n0)
    np.testing.assert_allclose(fit.eta_values, eta_true, rtol=0.03)  # the floor expert reads a few KB
    assert w[0] > 0 and errs.max() < 0.06, errs  # shapes never timed, within a few % of the truth


def test_fit_on_the_cuda_plan_predicts_mixtral_and_deepseek_experts():
    # An H100-like device: no GPU is needed to check that the GPU plan's sweep pins the model down on the
    # shapes the GPU validation predicts (Mixtral-8x7B 4096x14336, DeepSeek-V3 7168x2048).
    truth = Truth(floor=40e-6, b_inf=2.9e12, w0=30e6, peak=750e12, eta_max=0.8, n0=40, dtype_bytes=2, act=2e-12)
    plan = cuda_plan()
    errs, hw, fit = _fit_and_predict(plan, truth, plan.eta_shape, [(4096, 14336), (7168, 2048)],
                                     [1, 16, 128, 1024, 4096, 16384])
    assert errs.max() < 0.08, errs
    assert fit.eta_tokens[0] >= 64  # a GPU expert is memory-bound up to a few hundred tokens
    # The one-token decode step is floor + weight reads, not the weight reads alone (the 3x miss).
    assert hw.expert_call_overhead > 0


def test_plans_never_time_a_validated_shape():
    for plan in (cpu_plan(), cpu_plan(quick=True)):
        timed = {plan.floor_shape, plan.eta_shape, *plan.memory_shapes}
        assert not timed & {(128, 256), (384, 1024), (768, 2048)}
    for plan in (cuda_plan(), cuda_plan(quick=True)):
        timed = {plan.floor_shape, plan.eta_shape, *plan.memory_shapes}
        assert not timed & {(4096, 14336), (7168, 2048)}
    assert cuda_plan().tokens[-1] == 16384 and cpu_plan().tokens[-1] == 1024


def test_curve_helpers():
    np.testing.assert_allclose(bandwidth_curve([1e6, 4e6], [1.5e-4, 4.5e-4], 5e-5), [1e10, 1e10])
    tokens, eta = eta_curve([1, 2, 4, 8], [1.05e-3, 1.06e-3, 1.3e-3, 2.5e-3], 5e-5, 10, 10, 1e7, memory_s=1e-3)
    assert tokens.tolist() == [4.0, 8.0]  # 1 and 2 tokens sit on the weight-read time: memory-bound
    np.testing.assert_allclose(eta, 6 * np.array([4, 8]) * 100 / (np.array([1.25e-3, 2.45e-3]) * 1e7))
    only, _ = eta_curve([1, 2], [1e-3, 1e-3], 0.0, 10, 10, 1e6, memory_s=1e-3)
    assert only.tolist() == [2.0]  # all memory-bound: the largest count is kept as an upper bound
    with pytest.raises(ConfigError, match="memory_shapes"):
        CalibrationPlan(floor_shape=(8, 8), memory_shapes=((64, 64), (32, 32)), eta_shape=(64, 64), tokens=(1, 2))
    with pytest.raises(ConfigError, match="tokens"):
        CalibrationPlan(floor_shape=(8, 8), memory_shapes=((64, 64),), eta_shape=(64, 64), tokens=(4, 2))
    with pytest.raises(ConfigError, match="per_expert_s"):
        fit_curves(cpu_plan(), (256, 640), np.ones(3), np.zeros(3), 0.0, 1e9, 4)


# ---- a real calibration of this CPU ----------------------------------------------------------------------
def test_quick_calibration_writes_a_loadable_profile(tmp_path):
    out = tmp_path / "prof" / "cpu.toml"
    t0 = time.perf_counter()
    hw = calibrate(out, quick=True, num_experts=4, top_k=2)
    assert time.perf_counter() - t0 < 30.0
    again = load_hardware(out)
    assert again == hw and hw.kind == "cpu" and hw.dtype == "fp32"
    assert set(hw.eta_tokens) <= set(float(t) for t in QUICK_TOKENS) and hw.eta_tokens[-1] == QUICK_TOKENS[-1]
    assert all(0 < v <= 1 for v in hw.eta_values)
    assert hw.eta_values[-1] > hw.eta_values[0]  # 1024-token GEMMs use the core better than small ones
    assert hw.peak_flops > 1e8 and hw.mem_bandwidth > 1e8 and hw.moe_layer_overhead > 0
    assert hw.expert_call_overhead > 0 and hw.activation_cost > 0 and len(hw.weight_bytes) == len(cpu_plan(quick=True).memory_shapes)
    assert all(b > 1e8 for b in hw.weight_bandwidth)
    assert hw.nvlink_bandwidth == hw.pcie_bandwidth == hw.alpha == 0.0
    text = out.read_text()
    assert "not applicable" in text and "measured" in text and "call floor" in text
    # The profile drives the cost model on one rank (no links needed); each active expert pays the floor.
    model = ModelProfile(name="t", vocab_size=10, num_layers=1, hidden_size=64, num_experts=4, top_k=2,
                         expert_ffn=128, num_heads=4, num_kv_heads=4, head_dim=16, dtype_bytes=4)
    r = layer_cost(np.array([[[8.0, 0, 4, 4]], [[16.0, 0, 0, 0]]]), model=model, hw=hw, work=prefill(1, 8))
    assert r.total[0] > 0 and r.dispatch[0] == 0.0
    no_floor = layer_cost(np.array([[[8.0, 0, 4, 4]]]), model=model, hw=dataclasses.replace(hw, expert_call_overhead=0.0),
                          work=prefill(1, 8))
    assert r.ffn[0] - no_floor.ffn[0] == pytest.approx(3 * hw.expert_call_overhead)


def test_median_times_is_robust_to_one_outlier():
    calls = {"n": 0}

    def sometimes_slow():
        calls["n"] += 1
        if calls["n"] == 3:
            time.sleep(0.05)

    t = median_times([sometimes_slow], reps=7)
    assert t.shape == (1,) and t[0] < 0.01


def test_bad_arguments(tmp_path):
    import torch

    with pytest.raises(ConfigError, match="device"):
        calibrate(tmp_path / "x.toml", device="tpu")
    with pytest.raises(ConfigError, match="threads"):
        calibrate(tmp_path / "x.toml", threads=0)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            calibrate(tmp_path / "x.toml", device="cuda")


def test_one_token_never_sets_eta():
    # A noisy one-token time 30% above the weight-read time still counts as memory-bound (a matrix-vector
    # product); the 2-token count, well above it, is the first point of the curve.
    tokens, _ = eta_curve([1, 2, 4], [1.3e-3, 2.0e-3, 3.0e-3], 0.0, 10, 10, 1e7, memory_s=1e-3)
    assert tokens.tolist() == [2.0, 4.0]


def test_peak_rises_to_the_best_rate_the_sweep_measured():
    plan = CalibrationPlan(floor_shape=(8, 8), memory_shapes=((64, 64), (128, 128)), eta_shape=(64, 64), tokens=(2, 4))
    # The 4-token calls run at 2x the given peak: eta would be 2, so the peak doubles and eta tops out at 1.
    t = np.array([1e-6, 5e-6, 9e-6, 1e-6 + 6 * 2 * 64 * 64 / 1e9, 1e-6 + 6 * 4 * 64 * 64 / 2e9])
    fit = fit_curves(plan, (64, 64), t, np.zeros(5), 0.0, 1e9, 4)
    assert fit.peak_flops == pytest.approx(2e9) and fit.eta_values == pytest.approx((0.5, 1.0))
