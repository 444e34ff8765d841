import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.common.errors import ConfigError
from routecast.place.coact import CoactPlan, RankPrice, coact_counts, fit_coact
from routecast.place.coact_step import step_hosts
from routecast.place.slots import replica_counts
from routecast.sim.hardware import load_hardware
from routecast.sim.models import load_model

HW = load_hardware("h100-sxm")
PRICE = RankPrice.of(load_model("deepseek-v2-lite"), HW)


def _loads(seed: int, N: int, L: int, E: int, k: int, tokens: int, groups: int) -> np.ndarray:
    """Decode-like step loads with co-activation: each step draws from one of `groups` expert groups."""
    rng = np.random.default_rng(seed)
    out = np.zeros((N, L, E), np.int64)
    pools = [rng.permutation(E)[: max(k, E // 2)] for _ in range(groups)]
    for n in range(N):
        pool = pools[rng.integers(groups)]
        for lay in range(L):
            for _ in range(tokens):
                out[n, lay, rng.choice(pool, k, replace=False)] += 1
    return out


def _max_distinct(counts_TLGE: np.ndarray) -> float:
    return float((counts_TLGE > 0).sum(axis=3).max(axis=2).mean())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), shape=st.sampled_from([(8, 2), (8, 4), (16, 4), (16, 8), (12, 3)]),
       R=st.integers(0, 3), tokens=st.integers(1, 6))
def test_plan_respects_slots_and_keeps_every_expert(seed, shape, R, tokens):
    E, G = shape
    R = min(R, E - E // G)
    loads = _loads(seed, 20, 2, E, 2, tokens, 3)
    plan = fit_coact(loads, num_ranks=G, replicas_per_rank=R, price=PRICE, max_iter=10, seed=seed)
    # every rank holds exactly E / G home experts; replica slots never exceed R and never repeat a held expert
    for lay in range(2):
        assert (np.bincount(plan.home_LE[lay], minlength=G) == E // G).all()
    hosts = plan.hosts_LEG()
    assert (hosts.sum(axis=2) >= 1).all()  # every expert keeps a copy
    assert (hosts.sum(axis=1) <= E // G + R).all()  # slot capacity
    sp = plan.slot_plan()
    assert sp.num_slots == G * (E // G + R) and (replica_counts(sp.slots_LS, E) >= 1).all()
    # tokens are conserved and each expert runs on one of its copies
    c = coact_counts(plan, loads, PRICE)
    np.testing.assert_allclose(c.sum(axis=2), loads)
    assert not ((c > 0) & ~hosts.transpose(0, 2, 1)[None]).any()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), R=st.integers(1, 2), ep=st.sampled_from([2, 4]))
def test_step_moves_keep_slot_capacity_and_copies(seed, R, ep):
    E = 8
    loads = _loads(seed, 12, 1, E, 2, 3, 2)
    plan = fit_coact(loads, num_ranks=ep, replicas_per_rank=R, price=PRICE, max_iter=5)
    rng = np.random.default_rng(seed)
    window = rng.random((12, ep)) * 3 * PRICE.t_read
    forecast = np.where(rng.random(loads[:, 0].shape) < 0.2, 1 - np.sign(loads[:, 0]), loads[:, 0])  # some wrong
    host, n_in, n_out = step_hosts(plan, 0, forecast, window, 2 * PRICE.t_read, PRICE)
    assert (n_in <= R).all() and n_in.sum() == n_out.sum()
    home = plan.home_LE[0]
    moved = host != home[None]
    # an expert off its home runs on a replica slot: per step at most R experts a rank beyond its home ones
    for t in range(12):
        extra = np.bincount(host[t][moved[t]], minlength=ep)
        assert (extra <= R).all()
        assert (np.bincount(host[t], minlength=ep) <= E // ep + R).all()


def test_planner_spreads_experts_that_fire_together():
    # two experts always fire together, and so do two others: static sharding puts each pair on one rank
    N, E, G = 40, 8, 4
    loads = np.zeros((N, 1, E), np.int64)
    loads[::2, 0, [0, 1]] = 3
    loads[1::2, 0, [2, 3]] = 3
    loads[np.arange(N), 0, 4 + np.arange(N) % 4] = 1
    plan = fit_coact(loads, num_ranks=G, replicas_per_rank=0, price=PRICE)
    static = CoactPlan(home_LE=(np.arange(E) // 2)[None], extra_LGR=np.full((1, G, 0), -1),
                       order_LE=np.arange(E)[None])
    assert plan.home_LE[0, 0] != plan.home_LE[0, 1] and plan.home_LE[0, 2] != plan.home_LE[0, 3]
    assert _max_distinct(coact_counts(plan, loads, PRICE)) < _max_distinct(coact_counts(static, loads, PRICE))


def test_replicas_lower_the_expected_maximum_on_training_steps():
    loads = _loads(3, 60, 1, 16, 3, 4, 4)
    no = fit_coact(loads, num_ranks=4, replicas_per_rank=0, price=PRICE)
    yes = fit_coact(loads, num_ranks=4, replicas_per_rank=2, price=PRICE)
    assert _max_distinct(coact_counts(yes, loads, PRICE)) <= _max_distinct(coact_counts(no, loads, PRICE))


def test_fractional_forecasts_are_probabilities_of_activity():
    F, X, A = PRICE.parts(np.array([0.0, 0.5, 2.0]))
    np.testing.assert_allclose(X, 1 - np.exp(-np.array([0.0, 0.5, 2.0])))
    F, X, A = PRICE.parts(np.array([0, 1, 3]))
    np.testing.assert_array_equal(X, [0, 1, 1])


def test_bad_input():
    with pytest.raises(ConfigError, match="num_ranks"):
        fit_coact(np.ones((4, 1, 8), np.int64), num_ranks=3, replicas_per_rank=0, price=PRICE)
    with pytest.raises(ConfigError, match="replicas_per_rank"):
        fit_coact(np.ones((4, 1, 8), np.int64), num_ranks=2, replicas_per_rank=5, price=PRICE)
    with pytest.raises(ConfigError, match="loads"):
        fit_coact(np.ones((4, 8), np.int64), num_ranks=2, replicas_per_rank=0, price=PRICE)
    plan = fit_coact(np.ones((4, 1, 8), np.int64), num_ranks=2, replicas_per_rank=0, price=PRICE)
    with pytest.raises(ConfigError, match="disagree"):
        coact_counts(plan, np.ones((4, 2, 8), np.int64), PRICE)
    assert dataclasses.is_dataclass(plan)
