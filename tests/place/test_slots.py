"""SlotPlan: quotas, locality-first token -> slot assignment, sim's byte prediction (exact), weight moves."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.common.errors import ConfigError
from routecast.place.compare import eplb_transfers
from routecast.place.slot_plans import eplb_plan, moegps_plan, probe_plans, static_plan
from routecast.place.slots import SlotPlan, assign_items, slot_quotas, weight_moves
from routecast.sim.a2a import ep_a2a_bytes


def test_quotas_golden():
    # expert 0 on slots 0 and 2 (shares 1 : 2), expert 1 on slot 1; 7 items of expert 0 -> 7/3 and 14/3
    q = slot_quotas(np.array([0, 1, 0]), np.array([1.0, 1.0, 2.0]), np.array([7, 4]))
    assert q.tolist() == [2, 4, 5]
    # even split with a remainder: ties go to the lower slot
    assert slot_quotas(np.array([0, 0, 0, -1]), np.ones(4), np.array([5])).tolist() == [2, 2, 1, 0]


def _random_case(seed: int, G: int, E: int, n: int, K: int):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(E, 0.3))
    ids = np.stack([rng.choice(E, K, replace=False, p=p) for _ in range(n)])
    src = np.sort(rng.integers(0, G, n))
    return ids, src


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), G=st.sampled_from([2, 4]), n=st.integers(1, 60))
def test_assignment_meets_quotas_and_sim_bytes_exactly(seed, G, n):
    E, K = 8, 2
    ids, src = _random_case(seed, G, E, n, K)
    load = np.bincount(ids.reshape(-1), minlength=E)
    per_src = np.zeros((1, 1, G, E), np.int64)
    np.add.at(per_src[0, 0], (np.repeat(src, K), ids.reshape(-1)), 1)
    plans = [static_plan(1, E, G), eplb_plan(load[None], G, redundant_per_rank=1),
             moegps_plan(load[None], G, redundant_per_rank=2), probe_plans(per_src)[0]]
    for plan in plans:
        e, s = ids.reshape(-1), np.repeat(src, K)
        slot = assign_items(e, s, plan, 0)
        assert (plan.slots_LS[0][slot] == e).all()  # every item lands on a slot of its own expert
        q = plan.quotas(0, load)
        assert np.bincount(slot, minlength=plan.num_slots).tolist() == q.tolist()
        dst = plan.rank_of_slot()[slot]
        sent = np.bincount(s[dst != s], minlength=G) * 64
        recv = np.bincount(dst[dst != s], minlength=G) * 64
        local = np.zeros((G, E), np.int64)
        np.add.at(local, (s, e), 1)
        ps, pr = ep_a2a_bytes(local, plan.served_GE(0, load), 64)
        assert ps.tolist() == sent.tolist() and pr.tolist() == recv.tolist(), plan.method


def test_probe_plan_keeps_its_own_counts():
    ids, src = _random_case(3, 4, 16, 200, 2)
    per_src = np.zeros((1, 1, 4, 16), np.int64)
    np.add.at(per_src[0, 0], (np.repeat(src, 2), ids.reshape(-1)), 1)
    from routecast.place.duplication import sharded_placement
    from routecast.place.probe import plan_layers, token_costs

    ref = plan_layers(per_src[0], sharded_placement(16, 4), costs=token_costs(), hide_window_s=np.inf)
    plan = probe_plans(per_src)[0]
    assert (plan.served_GE(0, per_src[0, 0].sum(axis=0)) == ref.n_LEG[0].T).all()


def test_weight_moves_match_compare_transfer_counts():
    rng = np.random.default_rng(1)
    old = eplb_plan(rng.integers(0, 100, (3, 16)), 4, redundant_per_rank=2)
    new = eplb_plan(rng.integers(0, 100, (3, 16)), 4, redundant_per_rank=2)
    mv = weight_moves(old, new)
    n_in, n_out = eplb_transfers(old.slots_LS, new.slots_LS, 4)
    got_in = np.zeros((3, 4), np.int64)
    np.add.at(got_in, (mv[:, 0], mv[:, 3]), 1)
    got_out = np.zeros((3, 4), np.int64)
    np.add.at(got_out, (mv[:, 0], mv[:, 2]), 1)
    assert (got_in == n_in).all() and (got_out == n_out).all()
    assert len(weight_moves(old, old)) == 0


@pytest.mark.parametrize("slots,G,msg", [
    ([[0, 1, 2]], 2, "3 slots per layer do not divide over 2 ranks"),
    ([[0, 0, 1, 1]], 2, "expert 2 of layer 0 has no slot"),
    ([[0, 1, 2, -3]], 2, "holds expert -3"),
    ([[0, 1, 2, 3]], 2, "holds expert 3"),
])
def test_bad_plan_one_sentence(slots, G, msg):
    s = np.array(slots)
    with pytest.raises(ConfigError, match=msg):
        SlotPlan(slots_LS=s, share_LS=np.ones(s.shape), num_ranks=G, num_experts=3, layer_ids=(0,)).validate()


def test_routing_out_of_range_refused():
    plan = static_plan(1, 4, 2)
    with pytest.raises(ConfigError, match="expected experts < 4"):
        assign_items(np.array([0, 4]), np.array([0, 1]), plan, 0)
