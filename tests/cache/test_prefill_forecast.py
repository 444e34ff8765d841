"""fc-evict on steps of many tokens and with prefetch (cache/forecast_evict.py, cache/reuse.py, cache/slots.py): a
request of n tokens uses a key with 1 - (1 - pi)^n this step; a prefill's routing, folded layer by layer, forecasts
the next step as end_step will; a prefetched key is kept until its layer; a layer-ahead prefetch never evicts the keys
the running layer's router chose; the replay and a SlotCache driven step by step decide alike."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routecast.cache.forecast_evict import ForecastEvictPolicy
from routecast.cache.reuse import ReuseForecast, StepUse
from routecast.cache.slots import SlotCache, replay_slots


def test_a_step_of_n_tokens_uses_a_key_with_one_minus_its_profile_to_the_n():
    """begin_step(tokens=[n]): this step's q (later layers) is 1 - (1 - pi)^n, the next step's stays pi."""
    L, E = 2, 3
    pol = ForecastEvictPolicy(4, L=L, E=E)
    pol.end_step(StepUse.from_routing(np.array([5, 5]), np.array([[[0], [4]], [[1], [4]]]), E))
    pol.begin_step(np.array([5]), tokens=np.array([1]))
    one = pol.q.copy()
    assert pol.q_this is pol.q
    pol.begin_step(np.array([5]), tokens=np.array([4]))
    np.testing.assert_allclose(pol.q, one)
    np.testing.assert_allclose(pol.q_this, 1 - (1 - np.minimum(one, 0.999)) ** 4, rtol=1e-9)
    np.testing.assert_allclose(pol.q_at(0), np.where(np.arange(L * E) // E > 0, pol.q_this, one))
    with pytest.raises(ValueError, match="tokens has shape"):
        pol.begin_step(np.array([5]), tokens=np.array([4, 4]))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 40), first=st.booleans())
def test_folded_is_the_profile_observe_will_make(seed, n, first):
    """ReuseForecast.folded(layer's keys) while the step runs equals request_probs of that layer after observe."""
    rng = np.random.default_rng(seed)
    L, E = 3, 5
    fc = ReuseForecast(L * E)
    if not first:  # an earlier step of the request (and another's, for the trace-wide share)
        fc.observe(StepUse.from_routing(np.array([1, 2]), rng.integers(0, E, (2, L, 2)), E))
    ids = rng.integers(0, E, (n, L, 2))
    use = StepUse.from_routing(np.full(n, 1), ids, E)
    lay = int(rng.integers(0, L))
    sel = use.keys // E == lay
    got = fc.folded(1, n, lay * E, E, use.keys[sel], use.counts[sel])
    fc.observe(use)
    np.testing.assert_allclose(got, fc.request_probs(np.array([1]))[0, lay * E:(lay + 1) * E], rtol=1e-12)


def test_a_prefill_keeps_what_its_routing_used_and_evicts_what_it_did_not():
    """Golden case: a new request's prefill (8 tokens), two layers of 4 experts, three slots. Layer 0's routing used
    expert 0 (all 8 tokens) and not expert 1; both were resident with equal (trace-wide) forecasts, expert 1 the more
    recent. Without the fold the victim at layer 1 is the least recent (expert 0); with layer 0's routing folded into
    the next step's forecast, expert 1 (unused by the prefill) goes."""
    L, E = 2, 4
    for fold in (False, True):
        pol = ForecastEvictPolicy(3, L=L, E=E)
        pol.end_step(StepUse.from_routing(np.array([9]), np.array([[[0, 1], [4, 5]]]), E))  # keys 0, 1 equally common
        pol.begin_step(np.array([2]), tokens=np.array([8]))
        for k in (0, 1, 4):
            pol.admit(k)
        if fold:
            pol.routed(0, np.array([0]), np.array([8]))
        pol.touch(0)
        pol.touch(1)  # expert 1 the more recent
        pol.touch(4)  # layer 1 running: its key is in use
        assert pol.victim(lambda k: k == 4, incoming=5) == (1 if fold else 0)


def test_a_prefetched_key_is_kept_until_its_layer():
    """mark_predicted: a key forecast for a later layer of this step is needed there (kept); once spent it is
    ranked by its profile again."""
    L, E = 3, 2
    pol = ForecastEvictPolicy(2, L=L, E=E)
    pol.begin_step(np.array([0]))
    pol.admit(4)  # layer 2, least recent
    pol.admit(2)  # layer 1
    pol.touch(0)  # layer 0 running
    assert pol.victim(lambda k: k == 0, incoming=1) == 4
    pol.mark_predicted([4], lambda k: k // E)
    assert pol.victim(lambda k: k == 0, incoming=1) == 2
    pol.mark_spent({4}, set())
    assert pol.victim(lambda k: k == 0, incoming=1) == 4


@pytest.mark.parametrize("policy", ["lru", "fc-evict"])
def test_a_layer_ahead_prefetch_never_evicts_the_running_layers_keys(policy):
    """SlotCache.prefetch(running=...): the next layer's forecast reserves slots without evicting the keys the
    running layer's router chose (they are about to compute); without `running` LRU would take them."""
    L, E = 2, 4
    sc = SlotCache(L, E, 3, False, 1, 0, policy)
    sc.begin_step(np.array([0]))
    for k in (0, 1, 2):  # layer 0's keys 0, 1 and 2, all resident; 0 and 1 the least recent
        sc.access(0, [k])
        sc.unpin([k])
    sc.end_step(None)
    sc.begin_step(np.array([0]))
    loads = sc.prefetch([1], [np.array([4, 5])], 0, running=[0, 1])
    assert sc.held[[0, 1]].all() and [k for k, _, _ in loads] == [4]  # only key 2 could make room
    assert sc.stats["prefetch_dropped"] == 1 and not sc.pins.any()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), budget=st.integers(2, 12), ahead=st.booleans())
def test_the_replay_and_a_slot_cache_driven_step_by_step_agree_on_prefills(seed, budget, ahead):
    """replay_slots with each step's token count, the routed counts and layer-ahead forecasts makes the decisions of
    a SlotCache driven as the runtime drives it (begin_step(tokens), prefetch(running) before the access, the access
    with its counts); no pool holds more keys than its slots and the running keys are never evicted by a prefetch."""
    rng = np.random.default_rng(seed)
    L, E = 3, 5
    steps = [(r, n) for r in range(3) for n in [int(rng.integers(2, 9))] + [1] * int(rng.integers(1, 5))]
    S = len(steps)
    uses, off, keys, counts = [], [0], [], []
    for r, n in steps:
        ids = rng.integers(0, E, (n, L, 2))
        uses.append(StepUse.from_routing(np.full(n, r), ids, E))
        for lay in range(L):
            u, c = np.unique(lay * E + ids[:, lay].ravel(), return_counts=True)
            keys += u.tolist()
            counts += c.tolist()
            off.append(len(keys))
    req = np.array([r for r, _ in steps])
    pred = rng.random((S, L, E)) < 0.3 if ahead else None
    rep = replay_slots(np.array(off), np.array(keys), L, E, budget, policy="fc-evict", requests_S=req, uses=uses,
                       req_count=np.array(counts), pred_SLE=pred, layer_ahead=ahead)
    sc = SlotCache(L, E, budget, False, 1, 0, "fc-evict")
    for s in range(S):
        sc.begin_step(req[s:s + 1], None, None, None, None, uses[s].tokens)
        if ahead and pred[s, 0].any():  # the first layer's own forecast, before its decoder layer (inblock.py)
            sc.prefetch([0], [np.flatnonzero(pred[s, 0])], -1)
        for lay in range(L):
            a = s * L + lay
            ks, cs = keys[off[a]:off[a + 1]], np.array(counts[off[a]:off[a + 1]])
            if ahead and lay + 1 < L:
                held = sc.held[ks].copy()
                sc.prefetch([lay + 1], [(lay + 1) * E + np.flatnonzero(pred[s, lay + 1])], lay, ks)
                assert sc.held[ks][held].all()  # what the running layer held, it still holds
            released, hits, loads, deferred, _ = sc.access(lay, ks, cs)
            got = hits + [k for k, _, _ in loads]
            while deferred:
                sc.unpin(got)
                loads, deferred = sc.next_round(deferred)
                got = [k for k, _, _ in loads]
            sc.unpin(got)
            assert sc.occupied <= budget
        sc.end_step(uses[s])
    assert (rep["hits"], rep["misses"]) == (sc.stats["hits"], sc.stats["misses"])
