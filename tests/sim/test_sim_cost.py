import dataclasses

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.sim import cost as collectives
from routecast.sim.cost import (
    CostOptions,
    LayerCost,
    Workload,
    _context_sum,
    _expert_time,
    decode,
    layer_cost,
    moe_gps_options,
    prefill,
    probe_options,
)
from routecast.sim.hardware import load_hardware
from routecast.sim.models import load_model
from routecast.sim.scenarios import sharded_counts, skew_loads

MIX = load_model("mixtral-8x7b")
A100 = load_hardware("a100-sxm-80gb")


# ---- collectives against hand computations -----------------------------------------------------------
def test_ring_allreduce_four_ranks_by_hand():
    # 2(N-1) alpha + 2(N-1)/N S/B = 6 x 10 us + 1.5 x 1 MB / 100 GB/s = 60 us + 15 us.
    assert collectives.ring_allreduce(1e6, 4, 100e9, 10e-6) == pytest.approx(75e-6)
    assert collectives.ring_allgather(1e6, 4, 100e9, 10e-6) == pytest.approx(37.5e-6)
    assert collectives.ring_reduce_scatter(1e6, 4, 100e9, 10e-6) == pytest.approx(37.5e-6)
    assert collectives.alltoall(3e6, 4, 300e9, 10e-6) == pytest.approx(20e-6)
    assert collectives.ring_allreduce(1e6, 1, 0.0, 10e-6) == 0.0  # one rank moves nothing
    assert collectives.alltoall(1e6, 1, 0.0, 10e-6) == 0.0
    got = collectives.collective_time("allreduce", np.array([1e6, 2e6]), np.array([2, 8]), 100e9, 0.0)
    np.testing.assert_allclose(got, [1e6 / 100e9, 2 * 7 / 8 * 2e6 / 100e9])
    with pytest.raises(ConfigError, match="bandwidth"):
        collectives.ring_allreduce(1e6, 4, 0.0, 1e-6)
    with pytest.raises(ConfigError, match="broadcast"):
        collectives.collective_time("broadcast", 1, 2, 1, 0)


def test_context_sum_matches_brute_force():
    for ctx, s, w in [(0, 7, 0), (5, 3, 0), (0, 10, 4), (3, 6, 5), (20, 1, 8), (2, 2, 100)]:
        brute = sum(min(j, w) if w else j for j in range(ctx + 1, ctx + s + 1))
        assert _context_sum(np.array([float(ctx)]), np.array([float(s)]), w)[0] == pytest.approx(brute)


# ---- the layer cost ------------------------------------------------------------------------------------
def test_single_expert_by_hand():
    counts = np.zeros((1, 8))
    counts[0, 3] = 256
    r = layer_cost(counts, model=MIX, hw=A100, work=prefill(1, 128))
    flops = 256 * 2 * 3 * 4096 * 14336
    expect = max(MIX.expert_bytes() / (2039e9 * 0.8), flops / (A100.eta(256) * 312e12))
    assert r.ffn[0] == pytest.approx(expect)
    assert r.dispatch[0] == r.combine[0] == r.attention_comm[0] == 0.0  # one rank: no communication
    assert r.total[0] == pytest.approx(r.attention[0] + r.ffn[0])


# A100 with a measured weight-read curve (Mixtral's 352 MB expert sits between 100 MB and 1 GB), a call floor
# and activation work: each term priced by hand below.
A100_CAL = dataclasses.replace(A100, weight_bytes=(100e6, 1e9), weight_bandwidth=(1e12, 2e12),
                               expert_call_overhead=20e-6, activation_cost=1e-12)


@pytest.mark.parametrize("hw", [A100, A100_CAL], ids=["datasheet", "calibrated"])
@pytest.mark.parametrize("zero_share", [0.2, 0.8])  # dense path and sparse (bincount) path
def test_expert_time_matches_a_loop(zero_share, hw):
    rng = np.random.default_rng(1)
    n = rng.integers(1, 3000, (5, 4, 8)).astype(float) * (rng.random((5, 4, 8)) >= zero_share)
    W = MIX.expert_bytes()
    bw = 1e12 + 1e12 * np.log(W / 100e6) / np.log(10.0) if hw.weight_bytes else hw.mem_effective
    for staircase in (False, True):
        got = _expert_time(n, MIX, hw, staircase)
        ref = np.zeros((5, 4))
        for c, g, e in zip(*np.nonzero(n), strict=True):
            eta = float(hw.eta(n[c, g, e], staircase=staircase))
            ref[c, g] += hw.expert_call_overhead + max(W / bw, n[c, g, e] * MIX.expert_flops_per_token / (eta * hw.peak_flops))
            ref[c, g] += hw.activation_cost * n[c, g, e] * (3 * 4096 + 2 * 14336)
        np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_balanced_loads_give_equal_per_rank_ffn():
    counts = sharded_counts(np.full(8, 128.0), 4)
    r = layer_cost(counts, model=MIX, hw=A100, work=prefill(1, 512), opts=moe_gps_options())
    assert np.allclose(r.ffn_CG, r.ffn_CG[0, 0]) and np.allclose(r.dispatch_CG, r.dispatch_CG[0, 0])


def test_cost_grows_with_skew():
    skew = np.linspace(1.0, 4.0, 13)
    counts = sharded_counts(skew_loads(skew, num_experts=8, total=1024), 4)
    for link in ("nvlink", "pcie"):
        r = layer_cost(counts, model=MIX, hw=A100, work=prefill(1, 512), opts=moe_gps_options(link))
        for part in (r.ffn, r.dispatch, r.combine, r.total):
            assert np.all(np.diff(part) >= -1e-15)
        assert r.total[-1] > r.total[0] * 1.3
        np.testing.assert_allclose(r.attention, r.attention[0])  # skew touches only the MoE part


def test_moe_gps_bottleneck_volume():
    # MoE-GPS §2: the busiest GPU receives (N-1)/N x skewness x T/N tokens (top-1, E = N).
    mgps = dataclasses.replace(MIX, num_experts=4, top_k=1)
    counts = sharded_counts(skew_loads([1.0, 3.0], num_experts=4, total=512), 4)
    r = layer_cost(counts, model=mgps, hw=A100, work=prefill(1, 512))
    vol = 3 / 4 * np.array([1.0, 3.0]) * 512 / 4 * 4096 * 2
    np.testing.assert_allclose(r.dispatch, 10e-6 + vol / 300e9)


def test_token_to_expert_mode_removes_the_scatter():
    counts = sharded_counts(skew_loads([1.5], num_experts=8, total=1024), 4)
    base = layer_cost(counts, model=MIX, hw=A100, work=prefill(1, 512))
    t2e = layer_cost(counts, model=MIX, hw=A100, work=prefill(1, 512), opts=CostOptions(skip_scatter=True))
    assert base.dispatch[0] > 0 and t2e.dispatch[0] == 0.0
    assert t2e.combine[0] == base.combine[0]
    assert t2e.total[0] == pytest.approx(base.total[0] - base.dispatch[0])
    mis = layer_cost(counts, model=MIX, hw=A100, work=prefill(1, 512),
                     opts=CostOptions(skip_scatter=True, misroute_fraction=0.2))
    assert 0 < mis.dispatch[0] < base.dispatch[0]


def test_dedup_and_local_fraction_cut_the_all_to_all():
    counts = sharded_counts(skew_loads([2.0], num_experts=8, total=1024), 4)
    base = layer_cost(counts, model=MIX, hw=A100, work=prefill(1, 512))
    dedup = layer_cost(counts, model=MIX, hw=A100, work=prefill(1, 512), opts=CostOptions(dedup=True))
    local = layer_cost(counts, model=MIX, hw=A100, work=prefill(1, 512), opts=CostOptions(local_fraction=1.0))
    assert dedup.dispatch[0] < base.dispatch[0]
    assert local.dispatch[0] == pytest.approx(A100.alpha)
    uniq = layer_cost(counts, model=MIX, hw=A100, work=prefill(1, 512), opts=CostOptions(dedup=True),
                      unique=np.full((1, 4), 100.0))
    assert uniq.dispatch[0] == pytest.approx(A100.alpha + 0.75 * 100 * 4096 * 2 / 300e9)


def test_transfer_is_exposed_only_beyond_the_window():
    counts = sharded_counts(np.full(8, 128.0), 4)
    w = prefill(1, 512)
    hidden = layer_cost(counts, model=MIX, hw=A100, work=w, opts=CostOptions(transfer_bytes=1e6))
    assert hidden.transfer_exposed[0] == 0.0  # 3 us of NVLink hides behind attention
    big = layer_cost(counts, model=MIX, hw=A100, work=w, opts=CostOptions(transfer_bytes=MIX.expert_bytes()))
    assert big.transfer_exposed[0] == pytest.approx(MIX.expert_bytes() / 300e9 - big.attention[0])
    win = layer_cost(counts, model=MIX, hw=A100, work=w,
                     opts=CostOptions(transfer_bytes=MIX.expert_bytes(), hide_window_s=1.0))
    assert win.transfer_exposed[0] == 0.0


def test_per_rank_windows_and_a_zero_window_exposes_every_byte():
    counts = np.repeat(sharded_counts(np.full(8, 128.0), 4), 3, axis=0)
    w = decode(batch=64, context_len=512)
    t = MIX.expert_bytes() / 300e9  # one expert over A100 NVLink, per direction
    base = layer_cost(counts, model=MIX, hw=A100, work=w, opts=probe_options())
    # rank 1 moves two experts; rank 2 one: with per-rank windows only each rank's own excess counts
    xfer = np.array([[0, 2, 1, 0]] * 3) * float(MIX.expert_bytes())
    win = np.array([[0.0, 0.0, 0.0, 0.0], [9.0, 1.5 * t, 0.0, 9.0], [0.0, 9.0, 9.0, 0.0]])
    r = layer_cost(counts, model=MIX, hw=A100, work=w,
                   opts=dataclasses.replace(probe_options(), transfer_bytes=xfer, hide_window_s=win))
    np.testing.assert_allclose(r.transfer_exposed, [2 * t, t, 0.0], rtol=1e-12)
    # bytes moved behind a zero-width window raise the layer time by exactly their transfer time
    np.testing.assert_allclose(r.total - base.total, [2 * t, t, 0.0], rtol=1e-9, atol=1e-15)
    assert r.total[0] > base.total[0]


def test_vectorised_equals_a_scalar_loop():
    rng = np.random.default_rng(0)
    C = 24
    counts = rng.integers(0, 200, (C, 4, 8)).astype(float) * (rng.random((C, 4, 8)) < 0.7)
    work = Workload(batch=rng.integers(1, 8, C), seq_len=rng.integers(1, 600, C), context_len=rng.integers(0, 900, C))
    for base in (moe_gps_options("pcie"), probe_options()):
        opts = dataclasses.replace(base, predict_s=rng.random(C) * 1e-4, transfer_bytes=rng.random((C, 4)) * 1e9,
                                   staircase=True)
        batch = layer_cost(counts, model=MIX, hw=A100, work=work, opts=opts)
        for c in range(C):
            w = Workload(batch=work.batch[c], seq_len=work.seq_len[c], context_len=work.context_len[c])
            o = dataclasses.replace(opts, predict_s=opts.predict_s[c], transfer_bytes=opts.transfer_bytes[c])
            one = layer_cost(counts[c], model=MIX, hw=A100, work=w, opts=o)
            for k, v in one.as_dict().items():
                assert getattr(batch, k)[c] == pytest.approx(v[0], rel=1e-12), k
    sel = batch.select(slice(2, 5))
    assert isinstance(sel, LayerCost) and sel.total.shape == (3,) and sel.ffn_CG.shape == (3, 4)
    assert batch.select(7).ffn_CG.shape == (1, 4) and batch.select(7).total[0] == batch.total[7]


def test_attention_roofline_behaves():
    counts = sharded_counts(np.full(8, 16.0), 4)
    ctx = np.array([128.0, 1024.0, 8192.0])
    r = layer_cost(np.repeat(counts, 3, 0), model=MIX, hw=A100, work=decode(batch=64, context_len=ctx))
    assert np.all(np.diff(r.attention) > 0)  # longer contexts read more KV cache
    gpt = load_model("gpt-oss-120b")  # half its layers use a 128-token window
    c = sharded_counts(np.full(128, 2.0), 8)
    short = layer_cost(c, model=gpt, hw=A100, work=decode(64, 8192)).attention[0]
    full = layer_cost(c, model=dataclasses.replace(gpt, sliding_window=0), hw=A100, work=decode(64, 8192)).attention[0]
    assert short < full
    ds = load_model("deepseek-v3")
    rd = layer_cost(sharded_counts(np.full(256, 16.0), 8), model=ds, hw=A100, work=prefill(1, 512),
                    opts=probe_options())
    assert rd.attention[0] > 0 and rd.attention_comm[0] == 0.0  # DP attention has no collective


def test_bad_inputs_get_one_clear_sentence():
    with pytest.raises(ConfigError, match="non-negative"):
        layer_cost(-np.ones((2, 8)), model=MIX, hw=A100)
    with pytest.raises(ConfigError, match="num_experts = 8"):
        layer_cost(np.ones((2, 6)), model=MIX, hw=A100)
    with pytest.raises(ConfigError, match=r"\(C, G, E\)"):
        layer_cost(np.ones(8), model=MIX, hw=A100)
    with pytest.raises(ConfigError, match="shape"):
        layer_cost(np.ones((3, 2, 8)), model=MIX, hw=A100, work=Workload(batch=[1, 2]))
    with pytest.raises(ConfigError, match="link"):
        CostOptions(link="ethernet")
    with pytest.raises(ConfigError, match="Workload.seq_len"):
        Workload(seq_len=0)
    with pytest.raises(ConfigError, match="misroute_fraction"):
        CostOptions(misroute_fraction=1.5)
    cpu = dataclasses.replace(A100, nvlink_bandwidth=0.0, pcie_bandwidth=0.0)
    with pytest.raises(ConfigError, match="no bandwidth"):
        layer_cost(np.ones((2, 8)), model=MIX, hw=cpu)
    assert layer_cost(np.ones((1, 8)), model=MIX, hw=cpu).total[0] > 0  # one rank needs no link


def test_rank_roofline_golden_case_by_hand():
    # Mixtral-8x7B on A100 (no call floor, no activation cost), 2 ranks, one step:
    #   rank 0 runs experts 0, 1, 2 with one token each (a decode step's shape);
    #   rank 1 runs expert 4 with 2048 tokens and experts 5, 6, 7 with one token each.
    # weight read  t_r = 352,321,536 B / (2039 GB/s x 0.8)              = 215.99 us
    # one token    c_1 = 352,321,536 FLOP / (eta(1) = 0.15 x 312 TFLOP/s) =   7.528 us
    # 2048 tokens  c_2048 = 2048 x 352,321,536 / (eta = 0.80 x 312e12)    = 2890.8 us
    # rank roofline  max(compute, distinct x t_r):
    #   rank 0: max(3 x 7.528, 3 x 215.99)          =  647.97 us (weight-read bound)
    #   rank 1: max(2890.8 + 3 x 7.528, 4 x 215.99) = 2913.4 us (compute bound)
    # expert roofline (each expert the slower of its read and its GEMM, summed): rank 1 = 2890.8 + 3 x 215.99 = 3538.8 us
    assert A100.eta(1) == pytest.approx(0.15) and A100.eta(2048) == pytest.approx(0.80)
    counts = np.zeros((1, 2, 8))
    counts[0, 0, :3] = 1
    counts[0, 1, 4], counts[0, 1, 5:] = 2048, 1
    rank = _expert_time(counts, MIX, A100, False, "rank")[0]
    expert = _expert_time(counts, MIX, A100, False, "expert")[0]
    np.testing.assert_allclose(rank * 1e6, [647.97, 2913.4], rtol=2e-4)
    np.testing.assert_allclose(expert * 1e6, [647.97, 3538.8], rtol=2e-4)
    opts = dataclasses.replace(probe_options(), roofline="rank")
    r = layer_cost(counts, model=MIX, hw=A100, work=decode(2054, 0), opts=opts)
    assert r.ffn[0] * 1e6 == pytest.approx(2913.4, rel=2e-4)
    with pytest.raises(ConfigError, match="roofline"):
        CostOptions(roofline="both")
