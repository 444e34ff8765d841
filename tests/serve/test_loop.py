"""Serving simulation: a hand-computed golden case, invariants under random workloads, the cost-table knobs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.common.errors import ConfigError
from routecast.serve.engine import Engine, EngineConfig, ExpertLoader, StepPrices, build_engine
from routecast.serve.loop import SLO, simulate, weighted_percentile
from routecast.serve.sched import SCHEDULERS, make_scheduler
from routecast.serve.workload import Requests, emoe_tasks, make_requests
from routecast.sim.hardware import load_hardware
from routecast.sim.models import load_model

TB, SEQS = 16, 4


def toy_engine(kv: int = 10_000) -> Engine:
    """A step of n tokens costs 10 ms + 1 ms per token; no context, prompt or miss terms."""
    n = np.arange(TB + SEQS + 1, dtype=np.float64)
    base = np.where(n > 0, 0.010 + 0.001 * n, 0.0)
    prices = StepPrices(base_n=base, attn_n=np.zeros_like(base), miss_n=np.zeros_like(base),
                        ctx_grid=np.array([0.0, 1e6]), dec_ctx=np.zeros((SEQS + 1, 2)), pre_grid=np.array([1.0, TB]),
                        pre_extra=np.zeros(2))
    return Engine(config=EngineConfig(token_budget=TB, max_seqs=SEQS), model=load_model("mixtral-8x7b"),
                  hw=load_hardware("h100-sxm"), gpus=1, prices=prices, kv_capacity=kv, weight_bytes=0.0,
                  expert_load_s=0.0, resident_per_layer=8)


def reqs(arrival, prompt, output, task=None) -> Requests:
    n = len(arrival)
    return Requests(arrival=np.asarray(arrival, float), prompt=np.asarray(prompt, np.int64),
                    output=np.asarray(output, np.int64), task=np.zeros(n, np.int64) if task is None else np.asarray(task),
                    task_names=("t",), task_mean_output=np.array([float(np.mean(output))]))


def test_golden_two_requests_fastgen_and_vllm():
    # r0 arrives at 0 (4 prompt, 3 output tokens), r1 at 5 ms (2 prompt, 2 output); worked by hand:
    # fastgen: prefill r0 [0, 14 ms]; r1's prompt + r0's decode in one step [14, 27]; both decode [27, 39].
    r = reqs([0.0, 0.005], [4, 2], [3, 2])
    res = simulate(toy_engine(), r, make_scheduler("fastgen"), slo=SLO(ttft=1.0, tpot=1.0), record=True)
    np.testing.assert_allclose(res.first, [0.014, 0.027])
    np.testing.assert_allclose(res.finish, [0.039, 0.039])
    np.testing.assert_allclose(res.ttft, [0.014, 0.022])
    np.testing.assert_allclose(res.tpot, [0.0125, 0.012])
    # vllm: prefill r0 [0, 14]; prefill-only r1 [14, 26] (r0 stalls); decode both [26, 38] (r1 done); r0 [38, 49].
    res = simulate(toy_engine(), r, make_scheduler("vllm"), slo=SLO(ttft=1.0, tpot=1.0), record=True)
    np.testing.assert_allclose(res.first, [0.014, 0.026])
    np.testing.assert_allclose(res.finish, [0.049, 0.038])
    # r0's first decode gap counts the prefill step that stalled it: 12 + 12 ms
    np.testing.assert_allclose(sorted(res.tbt), [0.011, 0.012, 0.024])
    # fcfs: prefill r0 alone; r1 waits for the whole batch: [0,14] [14,25] [25,36] then r1 [36,48] [48,59]
    res = simulate(toy_engine(), r, make_scheduler("fcfs"), slo=SLO(ttft=1.0, tpot=1.0))
    np.testing.assert_allclose(res.finish, [0.036, 0.059])


def test_weighted_percentile():
    assert weighted_percentile(np.array([1.0, 2.0, 3.0]), np.array([1, 1, 8]), 50) == 3.0
    assert weighted_percentile(np.array([1.0, 2.0]), np.array([9, 1]), 90) == 1.0


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.tuples(st.floats(0, 0.2), st.integers(1, TB - 1), st.integers(1, 9), st.integers(0, 1)),
                  min_size=1, max_size=25),
    sched=st.sampled_from(SCHEDULERS),
    kv=st.integers(26, 200),
)
def test_invariants(data, sched, kv):
    data.sort()
    arr, pr, out, task = (np.array(x) for x in zip(*data, strict=True))
    r = Requests(arrival=arr.astype(float), prompt=pr.astype(np.int64), output=out.astype(np.int64),
                 task=task.astype(np.int64), task_names=("a", "b"), task_mean_output=np.array([3.0, 6.0]))
    res = simulate(toy_engine(kv), r, make_scheduler(sched), slo=SLO(ttft=0.05, tpot=0.02), record=True)
    steps = res.steps
    # every request is prefilled exactly once and finishes
    pre = np.concatenate([np.asarray(s["prefill"], np.int64) for s in steps])
    assert sorted(pre.tolist()) == list(range(r.n))
    assert np.all(np.isfinite(res.finish))
    # causality: nobody starts before arriving, tokens come in order
    assert np.all(res.admit >= r.arrival - 1e-12)
    assert np.all(res.first > res.admit) and np.all(res.finish >= res.first)
    for s in steps:
        assert all(r.arrival[i] <= s["start"] + 1e-12 for i in s["prefill"])
    assert all(a["end"] <= b["start"] + 1e-12 for a, b in zip(steps, steps[1:], strict=False))
    # tokens conserved: one first token per request plus every decode token = all outputs
    assert r.n + sum(s["decode"] * s["k"] for s in steps) == int(r.output.sum())
    assert int(pre.size) == r.n and sum(int(r.prompt[s["prefill"]].sum()) for s in steps) == int(r.prompt.sum())
    # the batch limits hold
    for s in steps:
        p = int(r.prompt[s["prefill"]].sum())
        assert s["decode"] + len(s["prefill"]) <= SEQS and s["kv"] <= kv  # KV reserved for prompt + output
        if sched in ("emoe", "fastgen"):
            assert p == 0 or s["decode"] + p < TB
        elif sched == "vllm":
            assert p <= TB and (p == 0 or s["decode"] == 0)


def test_same_arrivals_every_scheduler_and_mixtral_low_load():
    eng = build_engine(EngineConfig(model="mixtral-8x7b", hardware="h100-sxm", samples=2))
    r = make_requests(emoe_tasks(), 150, 2.0, seed=3)
    r2 = make_requests(emoe_tasks(), 150, 2.0, seed=3)
    np.testing.assert_array_equal(r.arrival, r2.arrival)
    got = {s: simulate(eng, r, make_scheduler(s)).metrics() for s in SCHEDULERS}
    for s in ("emoe", "vllm", "fastgen"):
        assert got[s]["slo_attainment"] > 0.95  # an idle engine meets 5x its idle latency
    assert got["fcfs"]["ttft_mean_s"] > got["vllm"]["ttft_mean_s"]  # waits for whole batches


def test_lar_and_budget_move_the_step_price():
    base = dict(model="mixtral-8x7b", hardware="h100-sxm", gpus=4, samples=2)
    lo, hi = (build_engine(EngineConfig(**base, lar=v)).prices for v in (0.25, 0.9))
    assert hi.base_n[2048] < lo.base_n[2048]  # fewer bytes cross the all-to-all
    full = build_engine(EngineConfig(**base)).prices
    half = build_engine(EngineConfig(**base, budget=0.5)).prices
    load = build_engine(EngineConfig(**base, budget=0.5, miss="load")).prices
    assert half.base_n[32] < full.base_n[32] < load.base_n[32] + load.miss_n[32]
    assert load.miss_n[32] > 0 and not half.miss_n.any()


def test_expert_loader_periodic_and_bad_input():
    eng = build_engine(EngineConfig(model="mixtral-8x7b", hardware="h100-sxm", budget=0.5, samples=2))
    ld = ExpertLoader(eng, np.array([10.0, 100.0]), period=2, seed=0)
    assert ld.admit(1, np.array([500.0, 0.0]), np.array([1.0, 0.0])) == 0.0  # not due yet
    t = ld.admit(1, np.array([0.0, 500.0]), np.array([0.0, 3.0]))
    assert t == pytest.approx(ld.loaded_experts * eng.expert_load_s) and ld.resident.sum(1).tolist() == [4] * 32
    with pytest.raises(ConfigError):
        ExpertLoader(eng, np.array([1.0]), period=0, seed=0)
    for bad in (dict(budget=0.0), dict(budget=float("nan")), dict(lar=1.5), dict(miss="x"), dict(token_budget=0)):
        with pytest.raises(ConfigError):
            EngineConfig(**bad)
    with pytest.raises(ConfigError):
        make_scheduler("sjf")
    with pytest.raises(ConfigError):
        make_requests(emoe_tasks(), 10, float("nan"), seed=0)
    with pytest.raises(ConfigError):  # a prompt that can never fit the token budget
        simulate(toy_engine(), reqs([0.0], [TB], [2]), make_scheduler("vllm"))


def test_requests_from_trace(small_trace):
    tr = small_trace()
    r = Requests.from_trace(tr)
    assert r.n == np.unique(tr.request).size
    assert int(r.prompt.sum() + r.output.sum() - r.n) == tr.num_tokens
    assert r.arrival[0] == 0 and np.all(np.diff(r.arrival) >= 0)
    assert dataclasses.replace(r, arrival=r.arrival * 2).n == r.n


def test_emoe_admits_the_most_stringent_request_that_fits():
    # r0 is prefilling when r1 (12-token prompt) and then r2 (11 tokens) arrive; only one fits the 16-token step.
    # TTFT targets are 5x each prompt's idle prefill, so r2's deadline (0.002 + 5 x 21 ms) precedes r1's
    # (0.001 + 5 x 22 ms): eMoE takes r2 first, FastGen takes r1 (arrival order, head of line).
    r = reqs([0.0, 0.001, 0.002], [2, 12, 11], [5, 3, 3])
    em = simulate(toy_engine(), r, make_scheduler("emoe"))
    fg = simulate(toy_engine(), r, make_scheduler("fastgen"))
    assert em.admit[2] == pytest.approx(0.012) and em.admit[1] > em.admit[2]
    assert fg.admit[1] == pytest.approx(0.012) and fg.admit[2] > fg.admit[1]


def test_emoe_slo_check_holds_a_request_that_would_break_a_running_slo():
    # r0 runs with an end-to-end SLO of 0.02 + 8 x 0.002 = 36 ms; eq. 3 with c = 26 ms / 16 tokens: admitting r1
    # (W = 14) makes r0's expected latency (14 + 2 x 8) c + 12 ms = 61 ms > 36 ms, so eMoE waits for r0 to finish.
    r = reqs([0.0, 0.001], [2, 14], [9, 9])
    slo = SLO(ttft=0.02, tpot=0.002)
    em = simulate(toy_engine(), r, make_scheduler("emoe"), slo=slo)
    assert em.admit[1] >= em.finish[0]
    for other in (make_scheduler("fastgen"), make_scheduler("emoe", slo_check=False)):
        res = simulate(toy_engine(), r, other, slo=slo)
        assert res.admit[1] == pytest.approx(0.012)  # admitted with r0's first decode step
