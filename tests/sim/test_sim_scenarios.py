import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.common.errors import ConfigError
from routecast.sim.cost import layer_cost, moe_gps_options, prefill
from routecast.sim.hardware import load_hardware
from routecast.sim.models import load_model
from routecast.sim.scenarios import (
    apply_error,
    balanced_counts,
    counts_from_placement,
    home_ranks,
    replica_bytes,
    sharded_counts,
    skew_loads,
    strategy_cost,
)

MIX = load_model("mixtral-8x7b")
A100 = load_hardware("a100-sxm-80gb")


def test_skew_loads_definition():
    loads = skew_loads([1.0, 1.4, 3.0], num_experts=4, total=[400, 400, 800])
    np.testing.assert_allclose(loads.sum(1), [400, 400, 800])
    np.testing.assert_allclose(loads[:, 0] / (loads.sum(1) / 4), [1.0, 1.4, 3.0])  # top / mean = skewness
    np.testing.assert_allclose(loads[1, 1:], (400 - 140) / 3)
    with pytest.raises(ConfigError, match="skewness"):
        skew_loads([0.5], num_experts=4, total=10)
    with pytest.raises(ConfigError, match="skewness"):
        skew_loads([5.0], num_experts=4, total=10)


def test_sharded_placement():
    np.testing.assert_array_equal(home_ranks(8, 4), [0, 0, 1, 1, 2, 2, 3, 3])
    np.testing.assert_array_equal(home_ranks(6, 4), [0, 0, 1, 2, 2, 3])
    c = sharded_counts(np.arange(8.0), 4)
    assert c.shape == (1, 4, 8) and np.all((c > 0).sum(1) <= 1)
    np.testing.assert_allclose(c.sum(1)[0], np.arange(8.0))
    with pytest.raises(ConfigError, match="num_ranks"):
        home_ranks(4, 8)


def test_counts_from_placement_with_replicas():
    share = np.zeros((2, 4))
    share[0, [0, 1]] = 1.0
    share[1, [2, 3]] = 1.0
    share[:, 0] = [0.5, 0.5]  # expert 0 replicated on both ranks
    c = counts_from_placement(np.array([[100.0, 10, 20, 30]]), share)
    np.testing.assert_allclose(c[0], [[50, 10, 0, 0], [50, 0, 20, 30]])
    np.testing.assert_allclose(counts_from_placement([1.0, 2, 3, 4], share[None])[0].sum(0), [1, 2, 3, 4])
    with pytest.raises(ConfigError, match="sum to 1"):
        counts_from_placement([[1.0, 1, 1, 1]], share * 2)
    with pytest.raises(ConfigError, match="shape"):
        counts_from_placement([[1.0, 1, 1, 1]], np.ones((2, 3)))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 4),
    st.lists(st.integers(0, 500), min_size=24, max_size=24),
)
def test_balanced_counts_balance_and_conserve(g, per_rank, raw):
    E = g * per_rank
    loads = np.asarray(raw[:E], dtype=float)
    base = sharded_counts(loads, g)
    bal = balanced_counts(base)
    assert np.all(bal >= -1e-9)
    np.testing.assert_allclose(bal.sum(-1), np.full((1, g), loads.sum() / g), atol=1e-6)  # every rank at the mean
    np.testing.assert_allclose(bal.sum(1), base.sum(1), atol=1e-6)  # every expert keeps its tokens
    # Underloaded ranks keep all their own tokens: nothing leaves a rank that was below the mean.
    under = base.sum(-1) <= loads.sum() / g + 1e-9
    np.testing.assert_allclose(np.where(under[..., None], np.minimum(bal, base), base), base, atol=1e-6)


def test_balancing_replicates_only_the_hot_expert():
    base = sharded_counts(skew_loads([2.2], num_experts=8, total=1024), 4)
    bal = balanced_counts(base)
    new = (bal > 1e-9) & (base <= 1e-9)
    assert set(np.nonzero(new)[2]) == {0}  # only expert 0 (the hot one) gets replicas
    np.testing.assert_array_equal(replica_bytes(base, bal, 10.0)[0], [0.0, 10.0, 10.0, 10.0])


def test_error_models():
    c = sharded_counts(np.full(8, 10.0), 4)
    c[0, 2] *= 2  # rank 2 is the busiest
    typ = apply_error(c, 0.1, "typical")
    assert typ[0, 2].sum() == pytest.approx(c[0, 2].sum() * 1.1) and np.allclose(typ[0, :2], c[0, :2])
    assert apply_error(c, 0.1, "pessimistic")[0, 2].sum() == pytest.approx(c[0, 2].sum() * 1.3)
    np.testing.assert_array_equal(apply_error(c, 0.1, "optimistic"), c)
    with pytest.raises(ConfigError, match="error model"):
        apply_error(c, 0.1, "worst")


def test_strategies_follow_moe_gps():
    skew = np.array([1.0, 1.4, 1.8, 2.2])
    kw = dict(model=MIX, hw=A100, skewness=skew, num_ranks=4, work=prefill(1, 512))
    none = strategy_cost("none", **kw)
    dist = strategy_cost("distribution", dist_error=0.018, placement="ideal", **kw)
    tok = strategy_cost("token", accuracy=0.9, overhead_s=50e-6, placement="ideal", **kw)
    assert np.all(np.diff(none.ffn) > 0)
    assert np.all(dist.ffn[1:] < none.ffn[1:])  # duplication flattens the busiest rank
    np.testing.assert_allclose(np.diff(dist.ffn), 0, atol=1e-12)  # FFN savings are skew-independent (§4)
    np.testing.assert_allclose(dist.dispatch, none.dispatch)  # distribution-only leaves the scatter as is
    assert np.all(tok.dispatch < none.dispatch) and np.all(tok.predict == 50e-6)
    perfect = strategy_cost("token", accuracy=1.0, placement="ideal", **kw)
    assert np.all(perfect.dispatch == 0.0)
    # Equal to pricing the explicit counts by hand.
    manual = layer_cost(sharded_counts(skew_loads(skew, num_experts=8, total=1024), 4), model=MIX, hw=A100,
                        work=prefill(1, 512), opts=moe_gps_options())
    np.testing.assert_allclose(none.total, manual.total)


def test_replica_placement_pays_the_fragment_weight_reads():
    kw = dict(model=MIX, hw=A100, skewness=[1.4], num_ranks=4, work=prefill(1, 512), dist_error=0.0)
    ideal = strategy_cost("distribution", placement="ideal", **kw)
    frag = strategy_cost("distribution", placement="replicas", **kw)
    w_read = MIX.expert_bytes() / A100.mem_effective
    assert frag.ffn[0] > ideal.ffn[0] + 0.5 * w_read  # a 29-token replica still streams 352 MB
    big = dict(kw, work=prefill(16, 2048))
    none_big = strategy_cost("none", **big)
    assert strategy_cost("distribution", placement="replicas", **big).ffn[0] < none_big.ffn[0]
    charged = strategy_cost("distribution", placement="replicas", charge_transfer=True, **kw)
    assert charged.transfer_exposed[0] > 0  # one 352 MB replica over NVLink outlasts this attention


def test_strategy_argument_errors():
    kw = dict(model=MIX, hw=A100, skewness=1.2, num_ranks=4)
    with pytest.raises(ConfigError, match="strategy"):
        strategy_cost("oracle", **kw)
    with pytest.raises(ConfigError, match="accuracy"):
        strategy_cost("token", accuracy=1.2, **kw)
    with pytest.raises(ConfigError, match="placement"):
        strategy_cost("token", placement="random", **kw)
