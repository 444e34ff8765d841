"""Property tests of the replay kernel on random tiny traces: budget, residency at compute, Belady's bound."""

from __future__ import annotations

import dataclasses
import itertools
from functools import cache

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routecast.cache import kernel as K
from routecast.cache.replay import (
    POLICIES,
    ReplayConfig,
    build_accesses,
    forecast_entries,
    run_policy,
    true_sets,
)
from routecast.sim.hardware import load_hardware
from routecast.trace import MoESpec, Trace, make_columns

HW = load_hardware("h100-sxm")


def tiny_trace(seed: int, L: int, E: int, k: int, steps: int, per_step: int) -> Trace:
    rng = np.random.default_rng(seed)
    T = steps * per_step
    experts = np.argsort(rng.random((T, L, E)), axis=-1)[..., :k].astype(np.int16)
    # skew: half the time route to the low ids, so caches have something to learn
    experts = np.where(rng.random((T, L, k)) < 0.5, experts % max(1, E // 2), experts).astype(np.int16)
    experts = np.sort(experts, axis=-1)
    dup = np.zeros_like(experts, dtype=bool)
    dup[..., 1:] = experts[..., 1:] == experts[..., :-1]
    experts[dup] = -1  # a repeated id in one token's list stands for a dropped slot
    w = np.full((T, L, k), 1.0 / k, np.float32)
    return Trace(spec=MoESpec(num_layers=L, num_experts=E, top_k=k, expert_bytes=1 << 20),
                 tokens=make_columns(T, request=np.arange(T) % 3, position=np.arange(T), step=np.arange(T) // per_step),
                 experts_TLK=experts, weights_TLK=w)


def check_log(acc, row, budget: int, per_layer: bool) -> None:
    """Replay the event log: capacity after every event, residency at every compute, computes = required."""
    log = row["log"]
    assert not row["log_overflow"]
    resident: set[int] = set()
    cap = [budget] if not per_layer else [budget // acc.L + (1 if layer < budget % acc.L else 0) for layer in range(acc.L)]
    computed: dict[int, list[int]] = {}
    for a, key, op in log.tolist():
        pool = key // acc.E if per_layer else 0
        if op == K.OP_STREAM:  # fetched into the staging slot, computed, not cached
            assert key not in resident
            computed.setdefault(a, []).append(key)
            continue
        if op in (K.OP_LOAD, K.OP_PREFETCH):
            assert key not in resident
            resident.add(key)
        elif op == K.OP_EVICT:
            assert key in resident
            resident.remove(key)
        else:
            assert key in resident, f"expert key {key} computed at access {a} while not resident"
            computed.setdefault(a, []).append(key)
        used = sum(1 for r in resident if (r // acc.E if per_layer else 0) == pool)
        assert used <= cap[pool]
    for a in range(acc.num_accesses):
        want = acc.req_key[acc.req_off[a]:acc.req_off[a + 1]].tolist()
        assert sorted(computed.get(a, [])) == sorted(want)


@cache
def _opt(sets: tuple[frozenset, ...], cap: int) -> int:
    """Fewest demand loads of any demand policy (exhaustive): after an access with set S from state R, any
    R' within R | S of at most cap experts can be kept (misses not kept stream through the staging slot)."""
    best = {frozenset(): 0}
    for S in sets:
        nxt: dict[frozenset, int] = {}
        for R, c in best.items():
            cost = c + len(S - R)
            pool = sorted(R | S)
            for n in range(min(cap, len(pool)) + 1):
                for keep in itertools.combinations(pool, n):
                    f = frozenset(keep)
                    if nxt.get(f, 1 << 30) > cost:
                        nxt[f] = cost
        best = nxt
    return min(best.values())


trace_args = st.tuples(st.integers(0, 10_000), st.integers(1, 3), st.integers(2, 5), st.integers(1, 2),
                       st.integers(1, 6), st.integers(1, 3))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=trace_args, frac=st.floats(0.05, 1.0), depth=st.integers(1, 3), fb=st.sampled_from(["lfu", "lru"]))
def test_budget_residency_and_belady_bound(args, frac, depth, fb):
    seed, L, E, k, steps, per_step = args
    k = min(k, E)
    tr = tiny_trace(seed, L, E, k, steps, per_step)
    acc = build_accesses(tr)
    budget = max(1, int(round(frac * L * E)))
    cfg = ReplayConfig(budget=budget, hardware=HW, plec_fallback=fb, plec_depth=depth, dense_us=1.0)
    # a noisy forecast: the truth with some experts flipped, so corrections happen
    rng = np.random.default_rng(seed)
    pred = true_sets(acc) ^ (rng.random((len(acc.step_ids), L, E)) < 0.3)
    fc = forecast_entries(acc, pred)
    rows = {}
    for name, pol in POLICIES.items():
        if pol.per_layer and budget < L:
            continue
        rows[name] = run_policy(acc, name, cfg, forecast=fc, log=True, expert_bytes=tr.spec.expert_bytes)
        check_log(acc, rows[name], budget, pol.per_layer)
        assert rows[name]["stall_s"] >= -1e-12
    bel = rows["belady"]["demand_loads"]
    for name, r in rows.items():
        if POLICIES[name].demand_only:
            assert bel <= r["demand_loads"], f"{name} needed fewer demand loads than Belady"


@settings(max_examples=150, deadline=None)
@given(args=trace_args, budget=st.integers(1, 4))
def test_belady_matches_exhaustive_optimum(args, budget):
    seed, L, E, k, steps, per_step = args
    E = min(E, 3)
    k = min(k, E)
    tr = tiny_trace(seed, min(L, 2), E, k, min(steps, 5), per_step)
    acc = build_accesses(tr)
    budget = min(budget, acc.L * acc.E)
    sets = tuple(frozenset(acc.req_key[acc.req_off[a]:acc.req_off[a + 1]].tolist()) for a in range(acc.num_accesses))
    r = run_policy(acc, "belady", ReplayConfig(budget=budget, hardware=HW), expert_bytes=1 << 20)
    assert r["demand_loads"] == _opt(sets, budget)


def _python_lru(acc, budget: int) -> int:
    """Reference pooled LRU in plain Python: hits touched first (expert order), then misses inserted."""
    from collections import OrderedDict

    cache: OrderedDict[int, None] = OrderedDict()
    loads = 0
    for a in range(acc.num_accesses):
        req = acc.req_key[acc.req_off[a]:acc.req_off[a + 1]].tolist()
        hits = [k for k in req if k in cache]
        for k in hits:
            cache.move_to_end(k)
        for k in req:
            if k not in hits:  # a hit is computed even if a later miss of this access evicts it
                loads += 1
                if len(cache) >= budget:
                    cache.popitem(last=False)
                cache[k] = None
    return loads


@settings(max_examples=60, deadline=None)
@given(args=trace_args, frac=st.floats(0.05, 1.0))
def test_lru_equals_a_plain_python_lru(args, frac):
    seed, L, E, k, steps, per_step = args
    tr = tiny_trace(seed, L, E, min(k, E), steps, per_step)
    acc = build_accesses(tr)
    budget = max(1, int(round(frac * L * E)))
    r = run_policy(acc, "lru", ReplayConfig(budget=budget, hardware=HW), expert_bytes=1 << 20)
    assert r["demand_loads"] == _python_lru(acc, budget)


@settings(max_examples=40, deadline=None)
@given(args=trace_args, frac=st.floats(0.05, 1.0))
def test_per_layer_lru_equals_one_plain_python_lru_per_layer(args, frac):
    """lru-layer runs on the kernel's recency lists, one per layer pool: it must equal L independent LRUs
    with the budget split as replay._pools splits it (the first budget % L layers get one slot more)."""
    seed, L, E, k, steps, per_step = args
    tr = tiny_trace(seed, L, E, min(k, E), steps, per_step)
    acc = build_accesses(tr)
    budget = max(L, int(round(frac * L * E)))
    r = run_policy(acc, "lru-layer", ReplayConfig(budget=budget, hardware=HW), expert_bytes=1 << 20)
    want = 0
    for layer in range(L):
        # the layer's accesses: every L-th access of the step-major order, re-based into one CSR
        offs = [(acc.req_off[a], acc.req_off[a + 1]) for a in range(layer, acc.num_accesses, L)]
        keys = np.concatenate([acc.req_key[lo:hi] for lo, hi in offs]) if offs else np.zeros(0, np.int64)
        off = np.concatenate([[0], np.cumsum([hi - lo for lo, hi in offs])]).astype(np.int64)
        sub = dataclasses.replace(acc, L=1, req_off=off, req_key=keys)
        want += _python_lru(sub, budget // L + (1 if layer < budget % L else 0))
    assert r["demand_loads"] == want
