"""fc-evict under a server's schedule (cache/reuse.py, cache/forecast_evict.py): the expected wait through one period of the
schedule against a brute-force sum, the schedule of a step that repeats itself changing nothing, the round-robin
schedule read from who was served and who finished, and the golden case where only the schedule names the key that
is needed next."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routecast.cache.forecast_evict import ForecastEvictPolicy
from routecast.cache.reuse import StepUse, round_robin, schedule_probs, schedule_q, schedule_q_at
from routecast.cache.slots import replay_slots
from routecast.common.errors import ConfigError


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), R=st.integers(1, 6), K=st.integers(1, 5))
def test_schedule_q_is_the_expected_wait_of_the_repeating_schedule(seed, R, K):
    """1/q1 - 1 = sum over m >= 1 of P(no use in the first m steps), the schedule's steps repeating; q0 puts this
    step's q_now first. Brute force: 4000 steps of the repeated schedule (probabilities >= 0.05: the tail is < 1e-80)."""
    rng = np.random.default_rng(seed)
    p_up, q_now = rng.uniform(0.05, 0.99, (R, K)), rng.uniform(0.05, 0.99, K)
    q0, q1 = schedule_q(q_now, p_up)
    surv = np.cumprod(1.0 - np.tile(p_up, (4000 // R + 1, 1)), 0)  # P(none of the first m steps uses k), m = 1..
    np.testing.assert_allclose(1.0 / q1 - 1.0, surv.sum(0), rtol=1e-9)
    np.testing.assert_allclose(1.0 / q0 - 1.0, (1.0 - q_now) * (1.0 + surv.sum(0)), rtol=1e-9)


def test_a_schedule_of_one_step_is_the_geometric_wait():
    q = np.array([0.1, 0.5, 0.9])
    q0, q1 = schedule_q(q, q[None])
    np.testing.assert_allclose(q0, q)
    np.testing.assert_allclose(q1, q)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(2, 4), E=st.integers(2, 8), steps=st.integers(1, 6),
       probe=st.booleans())
def test_a_schedule_that_repeats_the_step_changes_no_distance(seed, L, E, steps, probe):
    """upcoming = [this step's requests] (one user at a time, or a batching server) gives the distances of no
    schedule at every layer, with and without a reuse probe's rows."""
    rng = np.random.default_rng(seed)
    K = L * E
    a, b = ForecastEvictPolicy(K, L=L, E=E), ForecastEvictPolicy(K, L=L, E=E)
    keys = np.arange(K)
    for _ in range(steps):
        req = np.unique(rng.integers(0, 3, int(rng.integers(1, 3))))
        ru = rng.uniform(0, 3, (len(req), L, K)) if probe else None
        a.begin_step(req, None, ru)
        b.begin_step(req, None, ru, [req])
        for lay in range(L):
            np.testing.assert_allclose(b.next_use(keys, lay), a.next_use(keys, lay), rtol=1e-9)
        use = StepUse.from_routing(np.repeat(req, 2), rng.integers(0, E, (2 * len(req), L, 2)), E)
        a.end_step(use)
        b.end_step(use)


def test_the_schedule_names_the_key_the_next_request_needs():
    """Golden: A always uses key 0, B always key 1, in turn. At A's step, with key 2 coming in and one slot to free,
    A's own profile says key 1 is never used (evict it); the schedule [B, A] says B needs key 1 next step: key 0 goes."""
    L, E = 1, 3
    for sched, want in ((None, 1), ([np.array([1]), np.array([0])], 0)):
        pol = ForecastEvictPolicy(2, L=L, E=E)
        for t in range(8):  # A, B, A, B, ...: both profiles learnt
            r = t % 2
            pol.begin_step(np.array([r]))
            pol.admit(r) if r not in pol else pol.touch(r)
            pol.end_step(StepUse.from_routing(np.array([r]), np.array([[[r]]]), E))
        pol.begin_step(np.array([0]), None, None, sched)
        pol.touch(0)  # A's token used key 0 at this layer; the next access needs key 2
        pol.cur = set()  # a new layer's access (L = 1: the next step's)
        assert pol.victim(lambda _k: False, None, 2) == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40))
def test_round_robin_holds_the_requests_in_flight_least_recently_served_first(req):
    req = np.array(req)
    out = round_robin(req)
    assert len(out) == len(req)
    for t, sched in enumerate(out):
        ids = [int(s[0]) for s in sched]
        assert all(len(s) == 1 for s in sched) and ids[-1] == req[t] and len(set(ids)) == len(ids)
        seen_before = {int(r) for r in req[:t]}
        last = {int(r): i for i, r in enumerate(req.tolist())}
        assert set(ids[:-1]) == {r for r in seen_before if last[r] >= t and r != req[t]}  # in flight, not finished
        served = [max(i for i in range(t) if req[i] == r) for r in ids[:-1]]
        assert served == sorted(served)  # least recently served first


def test_round_robin_of_a_strict_rotation_is_the_next_tokens_and_of_one_user_is_itself():
    rot = np.arange(12) % 4
    assert [[int(s[0]) for s in x] for x in round_robin(rot)[4:8]] == [
        [1, 2, 3, 0], [2, 3, 0, 1], [3, 0, 1, 2], [0, 1, 2, 3]]
    assert all(len(x) == 1 for x in round_robin(np.repeat(np.arange(3), 4)))


def test_schedule_probs_combines_each_steps_requests_and_refuses_an_empty_step():
    pi = {0: np.array([0.5, 0.0]), 1: np.array([0.5, 1.0])}
    p, mine = schedule_probs(lambda ids: np.stack([pi[int(r)] for r in ids]), [np.array([0, 1]), np.array([1])],
                             np.array([1, 0]))
    np.testing.assert_allclose(p, [[0.75, 0.999], [0.5, 0.999]])  # probabilities capped at 0.999, as next_step_probs
    assert mine.tolist() == [True, False]
    with pytest.raises(ValueError, match="batches no request"):
        schedule_probs(lambda ids: np.zeros((len(ids), 2)), [np.array([0]), np.array([], np.int64)], np.array([0]))


def test_replay_refuses_a_schedule_per_step_of_another_length():
    off, key = np.arange(5), np.arange(4)
    with pytest.raises(ConfigError, match="one per step"):
        replay_slots(off, key, 1, 4, 2, policy="fc-evict", requests_S=np.zeros(4, np.int64),
                     upcoming=round_robin(np.zeros(3, np.int64)))


def test_each_requests_latest_probe_hazards_forecast_its_later_turns():
    """A and B in turn, each with a reuse probe for its own key: the mix keeps each request's latest row, and the
    schedule's steps of that request read it as ReuseMix mixes it (a·hazard + (1 - a)·profile, a the mix chosen)."""
    from routecast.cache.reuse import ReuseMix

    L, E = 1, 4
    pol = ForecastEvictPolicy(2, L=L, E=E)
    rows = {}
    for t in range(6):
        r = t % 2
        logd = np.full((1, L, L * E), np.log(1000.0))
        logd[0, 0, r] = 0.0  # d̂ = 1: the request's next token uses its key
        rows[r] = np.exp(-logd[0, 0])
        pol.begin_step(np.array([r]), None, logd, [np.array([1 - r]), np.array([r])])
        pol.end_step(StepUse.from_routing(np.array([r]), np.array([[[r]]]), E))
    for r in (0, 1):
        np.testing.assert_allclose(pol.mix.latest[r], rows[r])
    prof = pol.fc.request_probs(np.array([0, 1]))
    for i, a in enumerate(ReuseMix.ALPHAS):
        pol.mix.loss[:] = 1.0
        pol.mix.loss[i] = 0.0  # this mix chosen
        np.testing.assert_allclose(pol._later_probs(np.array([0, 1])),
                                   a * np.stack([rows[0], rows[1]]) + (1 - a) * prof)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), R=st.integers(1, 4), K=st.integers(1, 40), a=st.sampled_from([0.0, 0.5, 1.0]),
       f32=st.booleans())
def test_mix_row_is_reuse_mix_arithmetic_in_one_call(seed, R, K, a, f32):
    """The compiled row (ReuseMix.row inside a layer) equals the numpy form of ReuseMix._q to rounding."""
    from routecast.cache.reuse import ReuseMix, mix_row

    rng = np.random.default_rng(seed)
    logd = rng.uniform(0, 4, (R, K)).astype(np.float32 if f32 else np.float64)
    pi = rng.uniform(0, 1, (R, K))
    hz, q = mix_row(logd, pi, a)
    want_hz = np.exp(np.negative(logd, dtype=np.float64))
    np.testing.assert_allclose(hz, want_hz, rtol=1e-14)
    np.testing.assert_allclose(q, ReuseMix._q(a, pi, want_hz), rtol=1e-12, atol=1e-15)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), R=st.integers(1, 12), L=st.integers(1, 6), E=st.integers(1, 9))
def test_schedule_q_at_is_schedule_q_for_one_layer(seed, R, L, E):
    """The compiled q_at of one layer gives schedule_q's q0 for the keys of later layers and q1 for the others, with
    this step's own requests' rows replaced by q_now (to rounding: numpy sums the rows pairwise, the loop in turn)."""
    rng = np.random.default_rng(seed)
    K = L * E
    q, up = rng.uniform(0.0, 0.999, K), rng.uniform(0.0, 0.999, (R, K))
    mine, layer_K, layer = rng.random(R) < 0.3, np.arange(K) // E, int(rng.integers(L))
    q0, q1 = schedule_q(q, np.where(mine[:, None], q[None], up))
    np.testing.assert_allclose(schedule_q_at(q, up, mine, layer_K, layer), np.where(layer_K > layer, q0, q1),
                               rtol=1e-12, atol=0)


def test_known_next_use_gives_each_served_unfinished_requests_next_token_and_the_running_ones_own():
    """known_next_use: at token t, every request that ran before t and has a later token with the forecast of that
    later token (its next input, known since its last turn), and t's own request with t's forecast (the input token
    it feeds in now, never the one it will sample); a request that has not started, or has finished, is absent."""
    from routecast.cache.reuse import known_next_use, next_turns

    req = np.array([5, 7, 5, 9, 7, 5, 9])
    use = np.arange(len(req), dtype=float)[:, None] * np.ones((1, 3))
    assert next_turns(req).tolist() == [2, 4, 5, 6, -1, -1, -1]
    got = [{r: int(v[0]) for r, v in d.items()} for d in known_next_use(req, use)]
    assert got == [{5: 0}, {5: 2, 7: 1}, {7: 4, 5: 2}, {5: 5, 7: 4, 9: 3}, {5: 5, 9: 6, 7: 4}, {9: 6, 5: 5}, {9: 6}]


def test_next_token_mix_is_chosen_by_its_order_and_skips_the_running_request():
    """NextTokenMix: no token forecast (a = 0) until one is scored; a forecast that names the keys a waiting request
    then uses orders them first (every mix with it ties on AUC; the lowest log-loss of those wins) and is mixed in at
    its next turns; the running request never gets one."""
    from routecast.cache.reuse import NextTokenMix

    K = 6
    mix = NextTokenMix()
    pi = np.full((2, K), 0.3)
    nu = {1: np.array([0.95, 0.95, 0.01, 0.01, 0.01, 0.01]), 2: np.full(K, 0.5)}
    out = mix.mix(pi.copy(), np.array([1, 2]), nu, running={2})
    np.testing.assert_array_equal(out, pi)  # a = 0 to start
    assert set(mix.pending) == {1}  # request 2 runs now: its next token is not known
    mix.observe(StepUse.from_routing(np.array([1]), np.array([[[0, 1]]]), K))  # request 1 used keys 0 and 1
    assert mix.chosen == len(mix.ALPHAS) - 1 and not mix.pending
    a = mix.ALPHAS[mix.chosen]
    out = mix.mix(pi.copy(), np.array([1, 2]), nu, running=set())
    np.testing.assert_allclose(out[0], a * nu[1] + (1 - a) * pi[0])
    np.testing.assert_allclose(out[1], a * nu[2] + (1 - a) * pi[1])


def test_next_token_mix_prefers_the_better_order_to_the_better_calibration():
    """The profile ranks the used key first but is overconfident on the rest; the token forecast is calibrated but
    ranks an unused key first: log-loss would pick a token mix, the order (AUC) keeps the profile (a = 0)."""
    from routecast.cache.reuse import NextTokenMix, auc, log_loss

    mix = NextTokenMix()
    pi = np.array([[0.99, 0.98, 0.98, 0.98]])
    nu = np.array([0.3, 0.4, 0.0, 0.0])
    mix.mix(pi.copy(), np.array([1]), {1: nu}, running=set())
    mix.observe(StepUse.from_routing(np.array([1]), np.array([[[0]]]), 4))
    assert int(np.argmin(mix.loss)) != 0  # calibration alone would mix the token forecast in
    assert mix.chosen == 0 and mix.ALPHAS[mix.chosen] == 0.0
    used = np.array([True, False, False, False])
    a = np.asarray(mix.ALPHAS)[:, None]
    np.testing.assert_allclose(mix.auc, auc(a * nu + (1 - a) * pi, used))
    np.testing.assert_allclose(mix.loss, log_loss(a * nu + (1 - a) * pi, used))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12).flatmap(lambda k: st.tuples(
    st.lists(st.integers(0, 4), min_size=2 * k, max_size=2 * k), st.lists(st.booleans(), min_size=k, max_size=k))))
def test_auc_counts_ordered_pairs(case):
    """auc equals the share of (used, unused) key pairs in order, ties half, counted pair by pair; 0 without both."""
    from routecast.cache.reuse import auc

    vals, used = case
    used = np.array(used)
    q = np.array(vals, float).reshape(2, -1) / 4
    got = auc(q, used)
    for m in range(2):
        pairs = [(a, b) for a in q[m, used] for b in q[m, ~used]]
        want = np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs]) if pairs else 0.0
        assert got[m] == pytest.approx(want)


def test_fc_evict_keeps_the_expert_a_waiting_requests_next_token_needs():
    """Golden case: two requests take turns; both profiles are flat, so without the token forecast the victim is the
    least recently used key; request 1's next token is known to use key 1, and once the forecasts have paid (a > 0)
    fc-evict keeps key 1 and evicts key 0 instead. A malformed forecast is refused in one sentence."""
    L, E = 1, 4
    pol = ForecastEvictPolicy(2, L=L, E=E)
    pol.tok.loss[:] = [1.0, 1.0, 1.0, 0.0]  # the token forecasts have paid so far
    for k in (1, 0):  # key 1 used first: least recent
        pol.admit(k)
    nu = {1: np.array([0.01, 0.99, 0.01, 0.01])}
    pol.begin_step(np.array([0]), None, None, [np.array([1]), np.array([0])], nu)
    assert pol.victim(lambda k: False, incoming=2) == 0
    pol.begin_step(np.array([0]), None, None, [np.array([1]), np.array([0])], None)
    assert pol.victim(lambda k: False, incoming=2) == 1  # no forecast: least recent
    with pytest.raises(ValueError, match="next-token forecast of request 1"):
        pol.begin_step(np.array([0]), None, None, [np.array([1])], {1: np.array([0.5, np.nan, 0.1, 0.1])})
    with pytest.raises(ValueError, match="expected \\(4,\\)"):
        pol.begin_step(np.array([0]), None, None, [np.array([1])], {1: np.zeros(3)})


def test_fc_evict_keeps_the_expert_the_running_requests_own_token_needs_later_in_the_step():
    """Golden case: one request, no profile yet (every key's q is 0); at layer 0 the victim is one of layer 1's two
    resident keys. Without a forecast it is the least recently used (key 3); with the running request's own input
    token forecast to use key 3 at layer 1 (and the token forecasts having paid, a > 0), key 2 goes instead. The
    forecast is of this step only: the request's later turns keep its profile (tok_now scores it on this step)."""
    L, E = 2, 2
    pol = ForecastEvictPolicy(2, L=L, E=E)
    for k in (3, 2):  # key 3 used first: least recent
        pol.admit(k)
    pol.begin_step(np.array([0]), None, None, None, None)
    assert pol.victim(lambda k: False, incoming=0) == 3
    pol.tok_now.loss[:] = [1.0, 1.0, 1.0, 0.0]
    pol.begin_step(np.array([0]), None, None, None, {0: np.array([0.5, 0.5, 0.01, 0.99])})
    assert pol.victim(lambda k: False, incoming=0) == 2
    assert pol.q[3] == pytest.approx(pol.q[2])  # the profile's q (later turns) is untouched
    pol.end_step(StepUse.from_routing(np.array([0]), np.array([[[0], [1]]]), E))
    assert not pol.tok_now.pending  # scored on the step it forecast


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), budget=st.integers(1, 10))
def test_the_runtime_store_and_the_replay_agree_with_next_token_forecasts(seed, budget):
    """replay_slots with next_use makes the decisions a SlotCache driven step by step with the same begin_step makes
    (the runtime's path), and no policy holds more keys than its slots."""
    from routecast.cache.reuse import known_next_use
    from routecast.cache.slots import SlotCache

    rng = np.random.default_rng(seed)
    L, E, S = 2, 6, 30
    req = rng.integers(0, 4, S)
    ids = rng.integers(0, E, (S, L, 2))
    use = rng.uniform(0, 1, (S, L * E))
    up = round_robin(req)
    nu = known_next_use(req, use)
    uses = [StepUse.from_routing(req[s:s + 1], ids[s][None], E) for s in range(S)]
    off, keys = [0], []
    for s in range(S):
        for lay in range(L):
            ks = sorted({lay * E + int(e) for e in ids[s, lay]})
            keys += ks
            off.append(len(keys))
    rep = replay_slots(np.array(off), np.array(keys), L, E, budget, policy="fc-evict", requests_S=req, uses=uses,
                       upcoming=up, next_use=nu)
    sc = SlotCache(L, E, budget, False, 1, 0, "fc-evict")
    for s in range(S):
        sc.begin_step(req[s:s + 1], None, None, up[s], nu[s])
        for lay in range(L):
            ks = keys[off[s * L + lay]:off[s * L + lay + 1]]
            sc.access(lay, ks)
            sc.unpin(ks)
            assert sum(len(p) for p in sc.policies) <= budget
        sc.end_step(uses[s])
    assert (rep["hits"], rep["misses"]) == (sc.stats["hits"], sc.stats["misses"])
