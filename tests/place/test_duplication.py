import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.common.errors import ConfigError
from routecast.place.duplication import dispatch_items, duplicate_experts, sharded_placement


def test_paper_figure_2_example_balances_the_hot_expert():
    # MoE-GPS Fig. 2/3: 4 GPUs, expert 1 (index 0) holds 75% of the tokens -> skewness 3.
    load = np.array([75, 10, 10, 5])
    r = duplicate_experts(load, sharded_placement(4, 4))
    assert r.start_imbalance == pytest.approx(3.0)
    assert r.load_G.max() - r.load_G.min() <= 1
    assert r.copies_E[0] == 4 and r.copies_E[1:].tolist() == [1, 1, 1]
    assert r.served_EG.sum(axis=1).tolist() == load.tolist()


def test_golden_moves_pin_line_5_of_algorithm_1():
    # Worked by hand from MoE-GPS Algorithm 1 (l = ceil((L_gh - L_gc) / 2), line 5), Figure 2's loads:
    # L = [75, 10, 10, 5]. 1: gh 0, gc 3, l = ceil(70/2) = 35, e* = 0, copied to 3 -> [40, 10, 10, 40];
    # 2: gh 0 (first of the tie), gc 1, l = ceil(30/2) = 15, e* = 0, copied to 1 -> [25, 25, 10, 40];
    # 3: gh 3, gc 2, l = 15, e* = 0 (35 of its items on 3), copied to 2 -> [25, 25, 25, 25]; done.
    r = duplicate_experts(np.array([75, 10, 10, 5]), sharded_placement(4, 4))
    assert r.moves == [(0, 0, 3, 35, True), (0, 0, 1, 15, True), (0, 3, 2, 15, True)]
    assert r.served_EG[0].tolist() == [25, 15, 15, 20] and r.load_G.tolist() == [25, 25, 25, 25]
    assert r.iterations == 3
    # An odd gap rounds up: experts 0-1 on GPU 0, 2-3 on GPU 1, L = [10, 1]: l = ceil(9/2) = 5 -> [5, 6],
    # then max - min = 1 ends the loop (floor would give [6, 5], a third of the gap [7, 4] and more moves).
    r = duplicate_experts(np.array([10, 0, 1, 0]), sharded_placement(4, 2))
    assert r.moves == [(0, 0, 1, 5, True)] and r.load_G.tolist() == [5, 6] and r.iterations == 1


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda g: st.tuples(
            st.just(g),
            st.integers(1, 4).map(lambda m: m * g),
            st.integers(0, 10_000),
            st.integers(1, 4),
            st.integers(0, 3),
        )
    )
)
def test_properties(args):
    G, E, seed, c_max, mem_slots = args
    rng = np.random.default_rng(seed)
    load = (rng.pareto(1.0, E) * 20).astype(np.int64)
    P0 = sharded_placement(E, G)
    memory = np.full(G, mem_slots * 100)
    r = duplicate_experts(load, P0, memory_G=memory, expert_bytes=100, c_max=c_max)
    # tokens conserved per expert, only served where a copy exists
    assert (r.served_EG.sum(axis=1) == load).all()
    assert not ((r.served_EG > 0) & ~r.placement_EG).any()
    # initial copies kept; copies <= max(c_max, initial); memory respected
    assert (r.placement_EG >= P0).all()
    assert (r.copies_E <= np.maximum(c_max, P0.sum(1))).all()
    assert (r.memory_used_G <= memory).all()
    # imbalance never increases
    assert r.load_G.max() <= r.start_load_G.max()
    assert r.load_G.sum() == load.sum()
    # token-level dispatch agrees with the counts and only targets GPUs holding the expert
    f = np.repeat(np.arange(E), load)
    rng.shuffle(f)
    d = dispatch_items(f, r.served_EG)
    assert r.placement_EG[f, d].all()
    assert np.bincount(d, minlength=G).tolist() == r.load_G.tolist()


def test_unlimited_resources_reach_perfect_balance():
    rng = np.random.default_rng(1)
    load = rng.integers(0, 1000, 64)
    r = duplicate_experts(load, sharded_placement(64, 8))
    assert r.load_G.max() - r.load_G.min() <= 1


def test_no_memory_means_no_new_copies():
    load = np.array([100, 0, 0, 0])
    r = duplicate_experts(load, sharded_placement(4, 4), memory_G=np.zeros(4), expert_bytes=10)
    assert r.new_copies == 0 and r.load_G.tolist() == [100, 0, 0, 0]


def test_bad_inputs():
    with pytest.raises(ConfigError, match="load_E has shape"):
        duplicate_experts(np.ones(3), sharded_placement(4, 2))
    with pytest.raises(ConfigError, match="no GPU"):
        duplicate_experts(np.ones(2), np.array([[True], [False]]))
    with pytest.raises(ConfigError, match="divisor"):
        sharded_placement(6, 4)
