"""NAME+bypass: a miss the policy keeps out is read into a staging slot and not admitted (cache/objreplay.py, and
cache/slots.py for the runtime).

Golden timings of the staging slot on a hand-made access log, TinyLFU's rule on a scan, the budget on generated
traces, the equality with the plain policy one slot smaller when keeps_out never says so, and the runtime's slot
cache making the replay's decisions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import routecast.cache.objreplay as objreplay
from routecast.cache.compare import compare_policies, is_predictive
from routecast.cache.forecast_evict import ForecastEvictPolicy
from routecast.cache.forecasts import parse_policies
from routecast.cache.objreplay import step_uses
from routecast.cache.replay import build_accesses, true_sets
from routecast.cache.slots import SlotCache
from routecast.cache.zoo import STAGING, LFUPolicy, bypasses, describe, split_name
from routecast.common.errors import ConfigError
from routecast.runtime.offload.store import check_runtime_policy
from tests.cache.test_properties import HW, tiny_trace, trace_args


def one_layer(accesses: list[list[int]], E: int, budget: int, name: str, comp: float = 1.0, xfer: float = 10.0):
    """replay_objects over one layer whose accesses are `accesses` (each a list of experts), every expert
    computing in `comp` s and read in `xfer` s."""
    off = np.cumsum([0] + [len(a) for a in accesses]).astype(np.int64)
    keys = np.array([k for a in accesses for k in a], np.int64)
    return objreplay.replay_objects(name, off, keys, np.full(len(keys), comp), 1, E, budget, xfer_s=xfer,
                                    num_tokens=len(accesses), expert_bytes=1)


def test_names():
    assert split_name("fc-evict+bypass") == ("fc-evict", False)
    assert split_name("lfu+bypass+admit") == ("lfu", True)
    assert bypasses("fc-evict+bypass+admit") and not bypasses("fc-evict+admit") and not bypasses("lirs")
    assert is_predictive("fc-evict+bypass") and not is_predictive("lfu+bypass")
    assert "staging slot" in describe("lfu+bypass")
    assert parse_policies("lru,lfu+bypass,fc-evict+bypass+admit") == ["lru", "lfu+bypass", "fc-evict+bypass+admit"]
    for bad in ("arc+bypass", "fc-evict+admit+bypass", "lfu+bypass+bypass"):
        with pytest.raises(ConfigError, match="bypass"):
            split_name(bad)
        with pytest.raises(ConfigError, match="--policies"):
            parse_policies(bad)
    check_runtime_policy("fc-evict+bypass")
    check_runtime_policy("lfu+bypass")
    with pytest.raises(ConfigError, match="cache replay` only"):
        check_runtime_policy("fc-evict+bypass+admit")
    with pytest.raises(ConfigError, match="expected one of"):
        check_runtime_policy("arc+bypass")


def test_tinylfu_rule_keeps_the_hot_keys_through_a_scan():
    # cache of 2 (+1 staging): 0 and 1 are used 3 times each, then 2, 3, 4 once each between further uses of them
    seq = [[0], [1], [0], [1], [0], [1], [2], [0], [3], [1], [4], [0], [1]]
    plain = one_layer(seq, 5, 2, "lfu")  # no staging: the scan's keys take the slot of the LRU-tied key
    byp = one_layer(seq, 5, 3, "lfu+bypass")
    assert byp["bypassed"] == 3 and byp["evictions"] == 0
    assert byp["demand_loads"] == 5  # the compulsory misses only
    assert plain["demand_loads"] > byp["demand_loads"]
    lfu = LFUPolicy(2, 5)
    lfu.admit(0)
    lfu.touch(0)  # 2 uses
    lfu.admit(1)  # 1 use
    assert lfu.keeps_out(2, 1)  # counting this use, 2 ties with 1: the resident stays
    lfu.passed(2)  # a use without a slot still counts
    assert not lfu.keeps_out(2, 1) and lfu.keeps_out(2, 0) and 2 not in lfu


def test_staging_slot_serialises_the_layers_kept_out_reads():
    # three accesses make 0 and 1 resident and hot; the fourth misses 2 and 3, both kept out: the second read waits
    # for the first expert to be computed from the one staging slot
    x, c = 10.0, 1.0
    r = one_layer([[0, 1], [0, 1], [0, 1], [2, 3]], 4, 2 + STAGING, "lfu+bypass", comp=c, xfer=x)
    assert STAGING == 1 and r["bypassed"] == 2
    # first access: 0 computes while 1 is read; two hit accesses; then read 2, compute it, read 3, compute it
    assert r["sim_s"] == pytest.approx((2 * x + c) + 4 * c + (2 * x + 2 * c))
    assert r["demand_stall_s"] == pytest.approx((x + (x - c)) + x + x)
    free = one_layer([[0, 1], [0, 1], [0, 1], [2, 3]], 4, 4, "lfu", comp=c, xfer=x)  # a slot each: reads overlap
    assert free["sim_s"] == pytest.approx((2 * x + c) + 4 * c + (2 * x + c))


def test_budget_must_leave_a_slot_beside_staging():
    with pytest.raises(ConfigError, match="staging"):
        one_layer([[0]], 2, STAGING, "fc-evict+bypass")
    with pytest.raises(ConfigError, match="per-layer"):
        objreplay.replay_objects("lfu+bypass", np.array([0, 1]), np.array([0]), np.ones(1), 1, 2, 2, xfer_s=1.0,
                                 per_layer=True)


def case(args, frac: float):
    """A generated trace, its accesses, a budget of at least one slot beside staging, and (seed, L, E)."""
    seed, L, E, k, steps, per_step = args
    tr = tiny_trace(seed, L, E, min(k, E), steps, per_step)
    return tr, build_accesses(tr), max(1 + STAGING, int(round(frac * L * E))), (seed, L, E)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=trace_args, frac=st.floats(0.1, 1.0))
def test_pools_keep_budget_less_staging_and_every_access_is_served(args, frac):
    tr, acc, budget, (seed, L, E) = case(args, frac)
    rng = np.random.default_rng(seed)
    noisy = true_sets(acc) ^ (rng.random((len(acc.step_ids), L, E)) < 0.3)
    made = []
    real = objreplay.make_policy

    def spy(name, cap, L_, E_):
        pol = real(name, cap, L_, E_)
        made.append(pol)
        admit = pol.admit

        def checked(key, pol=pol, admit=admit):
            admit(key)
            assert len(pol) <= budget - STAGING
        pol.admit = checked
        return pol

    objreplay.make_policy = spy
    try:
        rows = {r["policy"]: r for r in compare_policies(tr, budget=budget, hardware=HW, forecast=noisy, dense_us=2.0,
                                                           policies=["lfu+bypass", "fc-evict+bypass", "lfu"])}
    finally:
        objreplay.make_policy = real
    assert len(made) == 2 and all(p.capacity == budget - STAGING for p in made)
    n = len(acc.req_key)
    for name in ("lfu+bypass", "fc-evict+bypass"):
        r = rows[name]
        assert r["covered_ratio"] * n + r["demand_loads"] == pytest.approx(n)  # each pair a hit or a demand read
        assert r["bypassed"] <= r["demand_loads"] and r["prefetches"] == 0
        assert r["bytes_moved"] == r["demand_loads"] * tr.spec.expert_bytes
        assert r["stall_s"] >= -1e-12


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=trace_args, frac=st.floats(0.1, 1.0))
def test_never_keeping_out_is_the_plain_policy_a_staging_slot_smaller(args, frac):
    tr, acc, budget, _ = case(args, frac)
    sets = true_sets(acc)
    keep = ForecastEvictPolicy.keeps_out
    ForecastEvictPolicy.keeps_out = lambda self, incoming, victim: False
    try:
        byp = next(r for r in compare_policies(tr, budget=budget, hardware=HW, forecast=sets, policies=["fc-evict+bypass"])
                   if r["policy"] == "fc-evict+bypass")
    finally:
        ForecastEvictPolicy.keeps_out = keep
    plain = next(r for r in compare_policies(tr, budget=budget - STAGING, hardware=HW, forecast=sets,
                                             policies=["fc-evict"]) if r["policy"] == "fc-evict")
    assert byp["bypassed"] == 0
    assert byp["demand_loads"] == plain["demand_loads"] and byp["sim_s"] == pytest.approx(plain["sim_s"], rel=1e-12)


def drive_slots(tr, name: str, budget: int, sets: np.ndarray) -> dict:
    """SlotCache(policy=name) driven as the runtime's store drives it (compute, unpin, the deferred rounds), its
    accounting checked after every access -> its stats."""
    acc = build_accesses(tr)
    L, E = tr.spec.num_layers, tr.spec.num_experts
    _, uses = step_uses(tr)
    sc = SlotCache(L, E, budget, policy=name)
    for s in range(len(acc.step_ids)):
        sc.begin_step(uses[s].requests, sets[s], None, None, None, uses[s].tokens)
        for lay in range(L):
            a = s * L + lay
            keys = acc.req_key[acc.req_off[a]:acc.req_off[a + 1]].tolist()
            _, hits, loads, deferred, _ = sc.access(lay, keys)
            gone = sc.unpin(hits + [kk for kk, _, _ in loads])
            while deferred:
                more, deferred = sc.next_round(deferred)
                gone += sc.unpin([kk for kk, _, _ in more])
            assert not any(sc.held[g] for g in gone)  # a staging slot given back holds nothing
            sc.check()
        sc.end_step(uses[s])
    return sc.stats


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=trace_args, frac=st.floats(0.0, 1.0))
def test_the_runtimes_slot_cache_keeps_out_what_the_replay_does(args, frac):
    """Where a layer's experts fit the pool, the runtime's decisions (SlotCache) are the object replay's: the same
    demand reads, the same misses kept out; the staging slot never makes the slots exceed the budget."""
    seed, L, E, k, steps, per_step = args
    tr = tiny_trace(seed, L, E, min(k, E), steps, per_step)
    acc = build_accesses(tr)
    widest = int(np.diff(acc.req_off).max())
    if widest + STAGING + 1 > L * E:
        return
    budget = widest + STAGING + 1 + int(frac * (L * E - widest - STAGING - 1))
    sets = true_sets(acc)
    for name in ("fc-evict+bypass", "lfu+bypass"):
        got = drive_slots(tr, name, budget, sets)
        want = next(r for r in compare_policies(tr, budget=budget, hardware=HW, forecast=sets, policies=[name])
                    if r["policy"] == name)
        assert (got["misses"], got["bypassed"]) == (want["demand_loads"], want["bypassed"])
        assert got["max_occupied"] <= budget


def test_slot_cache_refuses_bypass_without_room():
    with pytest.raises(ConfigError, match="staging"):
        SlotCache(2, 4, STAGING, policy="fc-evict+bypass")
    with pytest.raises(ConfigError, match="per-layer"):
        SlotCache(2, 4, 6, per_layer=True, policy="lfu+bypass")
