"""The policy zoo (ARC, S3-FIFO, LIRS, LFU, fc-evict): golden sequences from each paper's rules, properties on
random traces (budget, Belady's bound), and the equality of the object and kernel forms of LRU and LFU."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routecast.cache.arc import ARCPolicy
from routecast.cache.compare import compare_policies
from routecast.cache.forecast_evict import ForecastEvictPolicy, admit_prefetch, victim_order
from routecast.cache.lirs import LIRSPolicy
from routecast.cache.objreplay import replay_objects, step_uses
from routecast.cache.replay import ReplayConfig, build_accesses, compute_seconds, run_policy, true_sets
from routecast.cache.reuse import ReuseForecast, ReuseMix, SelectedForecast, StepUse
from routecast.cache.s3fifo import S3FIFOPolicy
from routecast.cache.slots import SlotCache
from routecast.cache.zoo import make_policy
from routecast.common.errors import ConfigError
from tests.cache.test_properties import HW, tiny_trace, trace_args

ZOO = ["lru", "lfu", "arc", "s3fifo", "lirs", "fc-evict"]


def drive(pol, seq):
    """Plain demand driver over single-key accesses -> the evicted keys, in order."""
    out = []
    for k in seq:
        if k in pol:
            pol.touch(k)
            continue
        if len(pol) >= pol.capacity:
            v = pol.victim(lambda _k: False, None, k)
            pol.remove(v)
            out.append(v)
        pol.admit(k)
    return out


def test_arc_golden_adaptation():
    """Worked by hand from ARC's rules (FAST'03 Fig. 4), c = 2: 1 2 1 3 2 1.
    3 misses with p = 0 and |T1| = 1 > p: T1's LRU (2) goes to B1. 2 is a B1 ghost hit: p = 0 + max(0/1, 1) = 1,
    |T1| = 1 is not > p, so T2's LRU (1) goes to B2. 1 is a B2 ghost hit: p = 1 - max(0/1, 1) = 0, T1's 3 goes."""
    pol = ARCPolicy(2)
    assert drive(pol, [1, 2, 1, 3, 2]) == [2, 1]
    assert pol.p == 1.0 and list(pol.t2) == [2] and list(pol.b2) == [1]
    assert drive(pol, [1]) == [3]
    assert pol.p == 0.0 and list(pol.t2) == [2, 1] and list(pol.b1) == [3]


def test_s3fifo_golden_quick_demotion():
    """Worked by hand from S3-FIFO's Algorithm 1 (SOSP'23), capacity 4 (S holds >= 1 key = 10%, rounded up):
    1 2 3 4 enter S; 1 is hit twice (freq 2), 2 once. Miss 5: S's oldest 1 (freq 2 > 1) moves to M, 2
    (freq 1) is evicted into G. Miss 2: found in G, enters M; S's oldest 3 is evicted. Miss 6: 4 is evicted."""
    pol = S3FIFOPolicy(4)
    assert drive(pol, [1, 2, 3, 4, 1, 1, 2, 5, 2, 6]) == [2, 3, 4]
    assert list(pol.m) == [1, 2] and list(pol.s) == [5, 6] and list(pol.g) == [3, 4]


def test_lirs_golden_irr():
    """Worked by hand from LIRS's rules (SIGMETRICS'02), capacity 3: L_lirs = 2, L_hirs = 1. 1 2 become LIR, 3 is
    resident HIR. Miss 4 evicts 3 (Q's front; 3 stays in S, non-resident). Miss 3: 4 is evicted; 3 was still in
    S (its reuse distance is short), so it turns LIR and the bottom LIR key 1 turns HIR: the next miss evicts 1,
    where LRU would evict 4's successor... and keep 1."""
    pol = LIRSPolicy(3)
    assert drive(pol, [1, 2, 3, 4, 3]) == [3, 4]
    assert pol.lir == {2, 3} and list(pol.queue) == [1]
    assert drive(pol, [5]) == [1]


def test_admission_rule():
    x = 1.0
    assert not admit_prefetch(0.99, x, 0.0, 0.0)  # a busy link: nothing to gain
    assert admit_prefetch(0.9, x, 2.0, 0.5)  # idle link, confident, victim rarely reused
    assert not admit_prefetch(0.3, x, 0.5, 0.5)  # half the transfer spills and the forecast is weak
    assert admit_prefetch(1.0, x, 0.1, 1.0)  # a certain forecast costs nothing if wrong (it is never wrong)


def test_fc_evict_keeps_the_steps_forecast_and_evicts_the_farthest():
    """L = 3, E = 4. Request 0 used keys 1 (layer 0) and 9 (layer 2) on every token, never 5 (layer 1). At layer 0
    of the next step, with 9 forecast for layer 2: 9 is needed 2 accesses ahead, 1 at the next step (q near 1),
    5 never by this request's profile: 5 goes first, then 1, and 9 last."""
    pol = ForecastEvictPolicy(3, L=3, E=4)
    for k in (1, 5, 9):
        pol.admit(k)
    pol.end_step(StepUse(requests=np.array([0]), off=np.array([0, 2]), keys=np.array([1, 9]),
                         counts=np.array([8.0, 8.0]), tokens=np.array([8])))
    fc = np.zeros((3, 4), bool)
    fc[2, 1] = True
    pol.begin_step(np.array([0]), fc)
    assert pol.victim(lambda _k: False, None, 2) == 5
    assert pol.victim(lambda k: k == 5, None, 2) == 1
    assert pol.victim(lambda k: k in (1, 5), None, 2) == 9
    assert pol.next_use(np.array([9]), 0)[0] == 2.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=trace_args, frac=st.floats(0.05, 1.0))
def test_object_lru_and_lfu_equal_the_kernel(args, frac):
    seed, L, E, k, steps, per_step = args
    tr = tiny_trace(seed, L, E, min(k, E), steps, per_step)
    acc = build_accesses(tr)
    budget = max(1, int(round(frac * L * E)))
    cfg = ReplayConfig(budget=budget, hardware=HW, dense_us=1.0)
    comp = compute_seconds(acc, cfg, 1 << 20)
    for name in ("lru", "lfu"):
        want = run_policy(acc, name, cfg, expert_bytes=1 << 20)
        got = replay_objects(name, acc.req_off, acc.req_key, comp, L, E, budget, xfer_s=(1 << 20) / HW.h2d_bandwidth,
                             dense_s=1e-6, num_tokens=acc.num_tokens, expert_bytes=1 << 20)
        assert got["demand_loads"] == want["demand_loads"] and got["hit_ratio"] == want["hit_ratio"]
        assert got["us_per_token"] == pytest.approx(want["us_per_token"], rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=trace_args, frac=st.floats(0.05, 1.0), admit=st.booleans())
def test_zoo_never_beats_belady_and_keeps_the_budget(args, frac, admit):
    seed, L, E, k, steps, per_step = args
    tr = tiny_trace(seed, L, E, min(k, E), steps, per_step)
    acc = build_accesses(tr)
    budget = max(1, int(round(frac * L * E)))
    rng = np.random.default_rng(seed)
    noisy = true_sets(acc) ^ (rng.random((len(acc.step_ids), L, E)) < 0.3)
    names = [n + ("+admit" if admit else "") for n in ZOO]
    rows = {r["policy"]: r for r in compare_policies(tr, budget=budget, hardware=HW, policies=names, forecast=noisy,
                                                       dense_us=2.0)}
    bel = rows["belady"]["demand_loads"]
    for n in names:  # a prefetch can turn a demand load into a prefetch, never save a read: count both (+admit)
        loads = rows[n]["demand_loads"] + rows[n]["prefetches"]
        assert loads >= bel, f"{n} read fewer experts than Belady's demand loads"
        assert admit or rows[n]["prefetches"] == 0
        assert rows[n]["stall_s"] >= -1e-12
    # the same objects under the runtime's slot accounting: never more than `budget` experts hold slots
    _, uses = step_uses(tr)
    for n in ZOO:
        sc = SlotCache(L, E, budget, policy=n)
        for s in range(len(acc.step_ids)):
            sc.begin_step(uses[s].requests, noisy[s])
            for lay in range(L):
                a = s * L + lay
                keys = acc.req_key[acc.req_off[a]:acc.req_off[a + 1]].tolist()
                _, hits, loads, deferred, _ = sc.access(lay, keys)
                done = hits + [kk for kk, _, _ in loads]
                sc.unpin(done)
                while deferred:
                    more, deferred = sc.next_round(deferred)
                    sc.unpin([kk for kk, _, _ in more])
                sc.check()
            sc.end_step(uses[s])


def test_compare_ranks_by_time_and_anchors_the_gap():
    tr = tiny_trace(3, 2, 6, 2, 12, 3)
    rows = compare_policies(tr, budget="50%", hardware=HW, policies=["lfu", "arc", "lirs"])
    us = [r["us_per_token"] for r in rows]
    assert us == sorted(us) and [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    by = {r["policy"]: r for r in rows}
    assert by["lru"]["time_gap_closed"] == 0.0 and by["belady"]["time_gap_closed"] == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="forecast"):
        compare_policies(tr, budget="50%", hardware=HW, policies=["fc-evict"])
    with pytest.raises(ConfigError, match="nosuch"):
        compare_policies(tr, budget="50%", hardware=HW, policies=["nosuch"])


def test_step_use_from_routing_equals_the_replays_per_step_uses():
    tr = tiny_trace(5, 2, 6, 2, 6, 3)
    steps, uses = step_uses(tr)
    step = np.asarray(tr.step)
    for i, s in enumerate(steps.tolist()):
        m = step == s
        got = StepUse.from_routing(np.asarray(tr.tokens["request"])[m], np.asarray(tr.experts_TLK)[m], 6)
        want = uses[i]
        for f in ("requests", "off", "keys", "counts", "tokens"):
            assert np.array_equal(getattr(got, f), getattr(want, f)), f


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(2, 6), E=st.integers(16, 48), ties=st.booleans())
def test_fc_evict_victim_equals_the_full_order(seed, L, E, ties):
    """victim() (its compiled order, cache/forecast_evict.victim_order) names the key the numpy farthest-then-LRU
    order of next_use names."""
    rng = np.random.default_rng(seed)
    K = L * E
    pol = ForecastEvictPolicy(K, L=L, E=E)
    pol.res[:] = rng.random(K) < 0.9
    pol.n = int(pol.res.sum())
    pol.last[:] = rng.permutation(K).astype(float)
    pol.q = rng.choice([0.0, 0.5], K) if ties else rng.random(K)  # ties: many keys share a predicted distance
    pol.fset = rng.random(K) < 0.2
    pol.layer = int(rng.integers(L))
    pol.cur = set(rng.choice(K, size=int(rng.integers(0, 8)), replace=False).tolist())
    pinned_set = set(rng.choice(K, size=int(rng.integers(0, K)), replace=False).tolist())
    incoming = int(rng.integers(-1, K))

    layer = incoming // E if incoming >= 0 else pol.layer
    keys = np.flatnonzero(pol.res)
    d = pol.next_use(keys, layer)
    order = keys[np.lexsort((pol.last[keys], -d))].tolist()
    want = next((k for k in order if k not in pol.cur and k not in pinned_set),
                next((k for k in order if k not in pinned_set), -1))
    assert pol.victim(lambda k: k in pinned_set, incoming=incoming) == want


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(1, 6), E=st.integers(1, 48), head=st.integers(1, 80),
       ties=st.booleans())
def test_victim_order_head_is_an_exact_prefix_of_the_whole_order(seed, L, E, head, ties):
    """victim_order(head) gives the first `head` keys of the whole order and every key tied with the last of them
    (no fewer, unless fewer are resident): the head a victim walk reads is the whole order's start."""
    rng = np.random.default_rng(seed)
    K = L * E
    res = rng.random(K) < 0.8
    q = rng.choice([0.0, 0.25, 0.5], K) if ties else rng.random(K)
    fset = rng.random(K) < 0.2
    last = rng.choice(4, K).astype(float) if ties else rng.permutation(K).astype(float)
    layer = int(rng.integers(L))
    whole = victim_order(res, q, fset, last, layer, L, E, 0)
    part = victim_order(res, q, fset, last, layer, L, E, head)
    assert len(whole) == res.sum()
    assert np.array_equal(part, whole[:len(part)])
    assert len(part) >= min(head, len(whole))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(2, 4), E=st.integers(4, 24), n_ops=st.integers(1, 120))
def test_fc_evict_memoised_victims_equal_the_full_order_over_a_run(seed, L, E, n_ops):
    """victim() keeps its order for the rest of a step's layer: after any run of admits, touches, removals, steps and
    layer changes, every victim is the one the full farthest-then-LRU order of that moment names."""
    rng = np.random.default_rng(seed)
    K = L * E
    pol = ForecastEvictPolicy(K, L=L, E=E)
    for _ in range(n_ops):
        op, key = int(rng.integers(5)), int(rng.integers(K))
        if op == 0 and not pol.res[key]:
            pol.admit(key)
        elif op == 1 and pol.res[key]:
            pol.touch(key)
        elif op == 2:
            pol.remove(key)
        elif op == 3:
            ks = np.unique(rng.choice(K, size=int(rng.integers(1, K)), replace=True))
            pol.end_step(StepUse(requests=np.array([0]), off=np.array([0, len(ks)]), keys=ks,
                                 counts=rng.integers(1, 4, len(ks)).astype(float), tokens=np.array([1])))
            pol.begin_step(np.array([0]), rng.random((L, E)) < 0.2)
        else:
            pinned = set(rng.choice(K, size=int(rng.integers(0, K)), replace=False).tolist())
            incoming = int(rng.integers(-1, K))
            layer = incoming // E if incoming >= 0 else pol.layer
            keys = np.flatnonzero(pol.res)
            order = keys[np.lexsort((pol.last[keys], -pol.next_use(keys, layer)))].tolist()
            want = next((k for k in order if k not in pol.cur and k not in pinned),
                        next((k for k in order if k not in pinned), -1))
            got = pol.victim(lambda k, p=pinned: k in p, incoming=incoming)
            assert got == want
            if got >= 0 and rng.random() < 0.7:  # the driver usually evicts the victim
                pol.remove(got)


def _step(request: int, keys) -> StepUse:
    ks = np.unique(np.asarray(keys, np.int64))
    return StepUse(requests=np.array([request]), off=np.array([0, len(ks)]), keys=ks, counts=np.ones(len(ks)),
                   tokens=np.array([1]))


def test_selected_forecast_scores_each_memory_by_log_loss():
    """The loss added per step is -sum log(q_k if k was used else 1 - q_k) of the forecast each memory made for it."""
    sel = SelectedForecast(4)
    sel.observe(_step(0, [1, 2]))  # nothing forecast yet: no score, profiles learn
    assert np.all(sel.loss == 0)
    qs = [f.next_step_probs(np.array([0])) for f in sel.subs]
    q_sel = sel.next_step_probs(np.array([0]))
    assert np.array_equal(q_sel, qs[sel.chosen])
    sel.observe(_step(0, [1, 3]))
    used = np.isin(np.arange(4), [1, 3])
    for i, q in enumerate(qs):
        q = np.clip(q, 1e-4, 1 - 1e-4)
        assert sel.loss[i] == pytest.approx(-np.log(np.where(used, q, 1 - q)).sum())


@pytest.mark.parametrize("drift", [False, True])
def test_selected_forecast_picks_long_memory_for_stationary_routing_and_short_for_drift(drift):
    """Stationary: every token draws 2 of 16 keys from one skewed law -> the long memory forecasts better. Drift: a
    request's keys change every 6 tokens -> the short memory (a request's last ~10 tokens) forecasts better."""
    rng = np.random.default_rng(0)
    K, sel = 16, SelectedForecast(16)
    law = rng.dirichlet(np.full(K, 0.5))
    for r in range(40):
        for t in range(30):
            if drift and t % 6 == 0:
                block = rng.choice(K, 3, replace=False)
            keys = rng.choice(block, 2, replace=False) if drift else rng.choice(K, 2, replace=False, p=law)
            sel.next_step_probs(np.array([r]))
            sel.observe(_step(r, keys))
    assert sel.chosen == (0 if drift else 1)


def test_trace_wide_share_counts_request_steps_not_tokens():
    """A 100-token prefill of one expert and a 1-token decode step of another weigh the same in the trace-wide share
    (cache reuse happens per step: a prefill is one access of each of its keys), so a new request forecasts both
    keys with equal probability."""
    fc = ReuseForecast(4)
    fc.observe(StepUse(requests=np.array([0]), off=np.array([0, 1]), keys=np.array([1]), counts=np.array([100.0]),
                       tokens=np.array([100])))
    fc.observe(StepUse(requests=np.array([0]), off=np.array([0, 1]), keys=np.array([2]), counts=np.array([1.0]),
                       tokens=np.array([1])))
    q = fc.next_step_probs(np.array([7]))  # request 7 has no profile: the trace-wide share alone
    assert q[1] == pytest.approx(q[2]) == pytest.approx(0.5) and q[0] == q[3] == 0.0


@pytest.mark.parametrize("informative", [True, False])
def test_reuse_mix_scores_each_mix_on_the_step_after_its_forecast(informative):
    """A probe that names the next step's keys (1 token away) wins over the profile (a = 1 chosen); one that names
    the wrong keys loses (a = 0, the profiles alone). Each forecast is scored on the step after the one it was made in."""
    rng = np.random.default_rng(0)
    L, E = 2, 8
    K = L * E
    sel, mix = SelectedForecast(K), ReuseMix()
    keys = [np.unique(rng.choice(K, 4, replace=False)) for _ in range(60)]
    for s in range(59):
        nxt = keys[s + 1] if informative else np.setdiff1d(np.arange(K), keys[s + 1])[:4]
        logd = np.full((1, L, K), np.log(32.0))
        logd[0, :, nxt] = 0.0
        sel.next_step_probs(np.array([0]))
        mix.probs(sel.request_probs(np.array([0])), logd)
        mix.observe(_step(0, keys[s]))
        sel.observe(_step(0, keys[s]))
    assert mix.chosen == (2 if informative else 0)


def test_fc_evict_reads_the_reuse_row_of_the_running_layer_only():
    """Evicting at layer l reads row l of the step's reuse forecast: changing later rows changes nothing there."""
    L, E = 3, 4
    pol = ForecastEvictPolicy(6, L=L, E=E)
    logd = np.random.default_rng(1).uniform(0, 3, (2, L, L * E))
    keys = np.arange(L * E)
    pol.begin_step(np.array([0, 1]), None, logd)
    base = [pol.next_use(keys, lay) for lay in range(L)]
    for lay in range(L):
        other = logd.copy()
        other[:, lay + 1:] = 0.0
        pol.begin_step(np.array([0, 1]), None, other)
        np.testing.assert_array_equal(pol.next_use(keys, lay), base[lay])
    with pytest.raises(ValueError, match="one row per request of the step"):
        pol.begin_step(np.array([0]), None, logd)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=trace_args, frac=st.floats(0.05, 1.0))
def test_fc_evict_with_reuse_forecasts_keeps_the_budget_and_never_beats_belady(args, frac):
    seed, L, E, k, steps, per_step = args
    tr = tiny_trace(seed, L, E, min(k, E), steps, per_step)
    budget = max(1, int(round(frac * L * E)))
    _, uses = step_uses(tr)
    rng = np.random.default_rng(seed)
    reuse = [rng.uniform(0, 4, (len(u.requests), L, L * E)) for u in uses]
    rows = {r["policy"]: r for r in compare_policies(tr, budget=budget, hardware=HW, policies=["fc-evict"],
                                                       forecast="oracle", reuse=reuse)}
    assert rows["fc-evict"]["demand_loads"] >= rows["belady"]["demand_loads"]
    assert rows["fc-evict"]["stall_s"] >= -1e-12
    with pytest.raises(ConfigError, match="expected one per step"):
        compare_policies(tr, budget=budget, hardware=HW, policies=["fc-evict"], forecast="oracle", reuse=reuse[1:])


def test_a_policy_missing_a_residency_method_cannot_be_made():
    """BasePolicy's residency methods are abstract: a policy without victim() fails when made, not mid-replay."""
    from routecast.cache.policy import BasePolicy

    class NoVictim(BasePolicy):
        def __len__(self):
            return 0

        def __contains__(self, key):
            return False

        def admit(self, key):
            pass

        def touch(self, key):
            pass

        def remove(self, key):
            pass

    with pytest.raises(TypeError, match="victim"):
        NoVictim(4)
    for name in ZOO:  # every shipped policy implements them all
        assert make_policy(name, 4, 2, 4).capacity == 4
