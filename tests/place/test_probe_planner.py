import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from routecast.common.errors import ConfigError
from routecast.place import probe_kernel
from routecast.place.duplication import sharded_placement
from routecast.place.probe import (
    PlanCosts,
    load_lower_bound,
    plan_layers,
    planner_costs,
    replica_budget,
    spread_sources,
    token_costs,
)
from routecast.sim.cost import layer_cost, prefill, probe_options
from routecast.sim.hardware import load_hardware
from routecast.sim.models import load_model

# A latency model with every term switched on: an efficiency curve (splitting a hot expert costs
# efficiency), a weight-read floor per GEMM group and network time per remote token.
CURVED = PlanCosts(flops_per_token=2.0, peak_flops=1.0, eta_tokens=(4.0, 16.0, 64.0), eta_values=(0.2, 0.6, 0.9),
                   weight_read_s=3.0, comm_s_per_token=0.3, expert_bytes=10.0, link_bandwidth=5.0)


def _loads(rng, L, G, E, scale=20.0):
    hot = rng.pareto(1.0, size=(L, 1, E))  # a few experts are hot on every source rank
    return rng.poisson(scale * hot * rng.uniform(0.5, 1.5, size=(L, G, E))).astype(np.int64)


def _latencies(x, plan, costs):
    """Eq. 2 + eq. 4/5 recomputed from scratch from the plan's assignment."""
    n, P = plan.n_LEG.astype(np.float64), plan.placement_LEG
    local = x.transpose(0, 2, 1) * P
    comp = costs.expert_time(n).sum(axis=1)
    vin = (n - local).sum(axis=1)
    vout = (x.transpose(0, 2, 1) * ~P).sum(axis=1)
    return comp + costs.comm_s_per_token * np.maximum(vin, vout), n - local


def _transfers(plan, P0):
    """(received, sent) new replicas per rank, rebuilt from the move log (eq. 6 counts)."""
    L, E, G = plan.n_LEG.shape
    recv, sent = np.zeros((L, G), int), np.zeros((L, G), int)
    for lay in range(L):
        have = P0[lay].copy()
        for e, s, d, _ in plan.moves_LK4[lay, : plan.iterations_L[lay]]:
            if not have[e, d]:
                have[e, d] = True
                recv[lay, d] += 1
                sent[lay, s] += 1
        assert (have == plan.placement_LEG[lay]).all()
    return recv, sent


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 100_000), G=st.integers(2, 5), per=st.integers(1, 4), L=st.integers(1, 3),
       curved=st.booleans(), window=st.sampled_from([0.0, 1.0, 2.0, 3.5, np.inf]), max_red=st.integers(0, 3),
       k_max=st.integers(0, 16), extra=st.booleans())
def test_plan_properties(seed, G, per, L, curved, window, max_red, k_max, extra):
    rng = np.random.default_rng(seed)
    E = G * per
    x = _loads(rng, L, G, E)
    P0 = np.broadcast_to(sharded_placement(E, G), (L, E, G)).copy()
    if extra:  # a baseline that already replicates some experts
        P0 |= rng.random((L, E, G)) < 0.15
    costs = CURVED if curved else token_costs(expert_bytes=10.0, link_bandwidth=5.0)
    win = window * costs.transfer_s
    plan = plan_layers(x, P0, costs=costs, hide_window_s=win, k_max=k_max, max_redundant=max_red)
    # tokens conserved per expert, integral, and only processed where a copy exists
    assert plan.n_LEG.dtype == np.int64 and (plan.n_LEG >= 0).all()
    assert (plan.n_LEG.sum(axis=2) == x.sum(axis=1)).all()
    assert not ((plan.n_LEG > 0) & ~plan.placement_LEG).any()
    # baseline kept; replicas = the new copies; budgets: <= max_redundant per rank, eq. 6 within the window
    assert (plan.placement_LEG >= P0).all()
    assert (plan.replicas_LEG == (plan.placement_LEG & ~P0)).all()
    recv, sent = _transfers(plan, P0)
    assert (recv == plan.replicas_LEG.sum(axis=1)).all() and (recv <= max_red).all()
    assert (np.maximum(recv, sent) * costs.transfer_s <= win + 1e-12).all()
    np.testing.assert_allclose(plan.transfer_s_LG, np.maximum(recv, sent) * costs.transfer_s)
    assert (plan.bytes_moved_L == recv.sum(axis=1) * costs.expert_bytes).all()
    assert (plan.iterations_L <= k_max).all()
    # locality-first: a source's tokens stay on its own copy; the incremental latencies are exact
    lat, remote = _latencies(x, plan, costs)
    assert (remote >= 0).all()
    np.testing.assert_allclose(plan.latency_LG, lat, rtol=1e-9, atol=1e-9)
    # never worse than the start: bottleneck latency, and IR on tokens when latency is tokens
    assert (plan.latency_LG.max(axis=1) <= plan.start_latency_LG.max(axis=1) + 1e-9).all()
    if not curved:
        assert (plan.ir_L <= plan.start_ir_L + 1e-12).all()
        # and no plan with this many new replicas can beat the lower bound
        bound = load_lower_bound(x, P0, new_replicas=recv.sum(axis=1))
        assert (plan.load_LG.max(axis=1) >= bound).all()


def _water_level(costs, c, rank_s, rank_d, avg, pool):
    """Line 11's level for one move: (tokens moved, peak latency of the pair), grid + refine + interpolate."""
    def pair(xm):
        (bs, ns, vis, vos), (bd, nd, vid, vod) = rank_s, rank_d
        return (bs + costs.expert_time(ns - xm) + c * np.maximum(vis - xm, vos),
                bd + costs.expert_time(nd + xm) + c * np.maximum(vid + xm, vod))

    def cross(lo, hi):
        xs = lo + (hi - lo) * (np.arange(probe_kernel.GRID + 1) / probe_kernel.GRID)
        ls, ld = pair(xs)
        gap = ls - np.maximum(avg, ld)
        j = int(np.argmax(gap <= 0)) if (gap <= 0).any() else probe_kernel.GRID
        i = max(j - 1, 0)
        return xs[i], xs[j], gap[i], gap[j]

    lo, hi, _, _ = cross(0.0, pool)
    lo, hi, g_lo, g_hi = cross(lo, hi)
    xm = lo if g_lo <= 0 else lo + (hi - lo) * (g_lo / (g_lo - g_hi) if g_hi <= 0 else 1.0)
    cand = np.array([np.floor(xm), min(np.ceil(xm), pool)])
    peak = np.maximum(*pair(cand))
    return float(cand[np.argmin(peak)]), float(peak.min())


def _start(x, P, costs):
    """Lines 2-3 for one layer of integer loads x (G, E), copies P (E, G) -> (n (E, G), comp, vin, vout (G,)):
    local tokens stay, an expert's remote ones are split evenly over its copies (remainder to the first)."""
    local = x.T * P
    remote = x.sum(axis=0) - local.sum(axis=1)
    copies = np.maximum(P.sum(axis=1), 1)
    rank_of_copy = np.cumsum(P, axis=1) - 1
    m = P * (remote[:, None] // copies[:, None] + (rank_of_copy < remote[:, None] % copies[:, None]))
    n = (local + m).astype(np.float64)
    vout = (x.sum(axis=1) - local.sum(axis=0)).astype(np.float64)
    return n, costs.expert_time(n).sum(axis=0), m.sum(axis=0).astype(np.float64), vout


def _reference(x, P0, costs, win, k_max, max_red, eps):
    """Algorithm 2 for one layer written as the paper states it: sequential, one invalid pair at a time,
    in numpy (the planner's loop is scalar code, compiled by numba when present): neither the control flow
    nor the water-filling code nor the initial assignment (_start) is shared, only PlanCosts.expert_time.
    """
    G, E = x.shape
    P = P0.copy()
    n, comp, vin, vout = _start(x, P, costs)
    c, t = costs.comm_s_per_token, costs.transfer_s
    cin, cout, invalid, k = np.zeros(G, int), np.zeros(G, int), set(), 0
    while True:
        lat = comp + c * np.maximum(vin, vout)
        src = int(np.argmax(lat))
        movable = n[:, src] - x[src] * P[:, src] > 0
        open_ = [g for g in range(G) if g != src and (src, g) not in invalid]
        if not movable.any() or not open_:
            return n, P, k
        e = int(np.argmax(np.where(movable, n[:, src], -1.0)))
        dst = min(open_, key=lambda g: (lat[g], g))
        need = not P[e, dst]
        if need and not (cin[dst] + 1 <= max_red and max(cin[dst] + 1, cout[dst]) * t <= win[dst]
                         and max(cin[src], cout[src] + 1) * t <= win[src]):
            invalid.add((src, dst))
            continue
        col_m = n[e] - x[:, e] * P[e]
        own = float(x[dst, e]) if need else 0.0
        other = np.where(np.arange(G) == src, 0.0, col_m)
        take = np.clip(own - min(own, col_m[src]) - (np.cumsum(other) - other), 0.0, other)
        take[src] = min(own, col_m[src])
        col = n[e] - take
        col[dst] += own
        vin1, vout1 = vin - take, vout.copy()
        vout1[dst] -= own
        t1 = costs.expert_time(col)
        comp1 = comp - costs.expert_time(n[e]) + t1
        avg = (comp1 + c * np.maximum(vin1, vout1)).mean()
        xm, f = _water_level(costs, c, (comp1[src] - t1[src], col[src], vin1[src], vout1[src]),
                             (comp1[dst] - t1[dst], col[dst], vin1[dst], vout1[dst]), avg, (col_m - take)[src])
        if lat[src] - f <= eps * lat[src] or k >= k_max:
            return n, P, k
        col[src] -= xm
        col[dst] += xm
        vin1[src] -= xm
        vin1[dst] += xm
        comp = comp - costs.expert_time(n[e]) + costs.expert_time(col)
        n[e], vin, vout = col, vin1, vout1
        if need:
            P[e, dst] = True
            cin[dst] += 1
            cout[src] += 1
        k += 1


@pytest.mark.parametrize("curved, extra", [(False, False), (True, False), (False, True)])
def test_vectorised_loop_matches_the_sequential_algorithm(curved, extra):
    rng = np.random.default_rng(7)
    L, G, E = 24, 6, 18
    x = _loads(rng, L, G, E)
    P0 = np.broadcast_to(sharded_placement(E, G), (L, E, G)) | (extra & (rng.random((L, E, G)) < 0.2))
    costs = CURVED if curved else token_costs(expert_bytes=10.0, link_bandwidth=5.0)
    win = rng.choice([0.0, 1.0, 2.0, 10.0], size=(L, G)) * costs.transfer_s  # ragged budgets -> invalid pairs
    plan = plan_layers(x, P0, costs=costs, hide_window_s=win, k_max=16, max_redundant=2)
    for lay in range(L):
        n, P, k = _reference(x[lay], P0[lay], costs, win[lay], 16, 2, 1e-4)
        assert plan.iterations_L[lay] == k
        assert (plan.placement_LEG[lay] == P).all()
        np.testing.assert_array_equal(plan.n_LEG[lay], n)
    assert plan.iterations_L.sum() > L  # the case is not trivial


def test_hot_expert_is_replicated_and_its_local_tokens_stay_local():
    # 4 ranks, 4 experts; expert 0 (rank 0) gets 70% of every rank's tokens.
    x = np.array([[[70, 10, 10, 10]] * 4])
    plan = plan_layers(x, sharded_placement(4, 4), costs=token_costs(), hide_window_s=np.inf)
    assert plan.start_load_LG[0].tolist() == [280, 40, 40, 40]
    assert plan.replicas_LEG[0, 0, 1:].all() and plan.moves_LK4[0, :3, 0].tolist() == [0, 0, 0]
    # every rank ends up serving exactly its own tokens of expert 0 (no network for it) ...
    assert plan.n_LEG[0, 0].tolist() == [70, 70, 70, 70]
    # ... then rank 0, now the lightest, takes its own tokens of experts 1-3 onto local copies
    assert plan.n_LEG[0, 1:, 0].tolist() == [10, 10, 10] and plan.replicas_LEG[0, 1:, 0].all()
    assert plan.load_LG[0].tolist() == [100, 100, 100, 100] and plan.iterations_L[0] == 6


@pytest.mark.parametrize("rank1, moved, after", [
    (0, 50, [50, 50, 20]),  # r_dst rises to meet r_src at 50 before r_src reaches the average 40
    (None, 40, [60, 40, 80]),  # r_src reaches the average 60 first (r_dst stays below it)
])
def test_water_filling_stops_at_the_level(rank1, moved, after):
    # expert 0 lives on rank 0: 10 tokens from rank 0 (pinned), 90 from rank 2 (movable); rank 1 is idle.
    x = np.zeros((1, 3, 3), dtype=np.int64)
    x[0, 0, 0], x[0, 2, 0] = 10, 90
    x[0, 2, 2] = 20 if rank1 == 0 else 80
    plan = plan_layers(x, sharded_placement(3, 3), costs=token_costs(), hide_window_s=np.inf, k_max=1)
    assert plan.moves_LK4[0, 0].tolist() == [0, 0, 1, moved]
    assert plan.load_LG[0].tolist() == after


def test_budgets_bind():
    rng = np.random.default_rng(0)
    x = _loads(rng, 4, 8, 32, scale=50.0)
    P0 = sharded_placement(32, 8)
    c = token_costs()
    free = plan_layers(x, P0, costs=c, hide_window_s=np.inf)
    none = plan_layers(x, P0, costs=c, hide_window_s=0.5)  # less than one transfer
    one = plan_layers(x, P0, costs=c, hide_window_s=1.0, max_redundant=3)
    assert none.replicas_LEG.sum() == 0
    # no replica: every expert's tokens stay on its one home copy (the locality-first start, unchanged)
    np.testing.assert_array_equal(none.n_LEG, x.sum(axis=1)[:, :, None] * P0[None])
    np.testing.assert_array_equal(none.load_LG, none.start_load_LG)
    assert one.replicas_LEG.sum(axis=1).max() <= 1 and one.transfer_s_LG.max() <= 1.0
    assert free.ir_L.mean() < one.ir_L.mean() < one.start_ir_L.mean()
    assert (free.iterations_L <= 16).all() and free.replicas_LEG.sum(axis=1).max() <= 3
    few = plan_layers(x, P0, costs=c, hide_window_s=np.inf, k_max=2)
    assert (few.iterations_L <= 2).all() and few.ir_L.mean() > free.ir_L.mean()


def test_skewed_step_is_balanced_on_a_real_profile_and_matches_the_simulator():
    model, hw = load_model("mixtral-8x7b"), load_hardware("h100-sxm")
    costs = planner_costs(model, hw, comm=False)
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.full(8, 0.5), size=6)
    x = np.stack([rng.multinomial(512 * 2 // 8, row, size=8) for row in p])  # 512 tokens, top-2, DP 8
    P0 = sharded_placement(8, 8)
    plan = plan_layers(x, P0, costs=costs, hide_window_s=np.inf)
    # the start latencies are the simulator's FFN time of the sharded layer
    counts = x.sum(axis=1)[:, None, :] * np.eye(8)[None]  # (C=L, G, E): expert e on rank e
    sim = layer_cost(counts, model=model, hw=hw, work=prefill(1, 512), opts=probe_options("nvlink"))
    np.testing.assert_allclose(plan.start_latency_LG, sim.ffn_CG, rtol=1e-12)
    assert (plan.speedup_L >= 1.0).all() and plan.speedup_L.mean() > 1.2
    # each replica of a 352 MB expert takes 0.78 ms on NVLink: a 1 ms window allows one per rank
    one = plan_layers(x, P0, costs=costs, hide_window_s=1e-3)
    assert one.replicas_LEG.sum(axis=1).max() <= 1 and one.transfer_s_LG.max() <= 1e-3


def _lp_optimum(n_E, P0, B):
    """min over every placement with <= B new copies of the LP min-max rank load (fractional split)."""
    E, G = P0.shape
    free = [(e, g) for e in range(E) for g in range(G) if not P0[e, g]]
    best = np.inf
    for b in range(B + 1):
        for extra in itertools.combinations(free, b):
            P = P0.copy()
            for e, g in extra:
                P[e, g] = True
            cells = np.argwhere(P)
            V = len(cells)
            cost = np.zeros(V + 1)
            cost[-1] = 1.0
            A_eq = np.zeros((E, V + 1))
            A_eq[cells[:, 0], np.arange(V)] = 1.0
            A_ub = np.zeros((G, V + 1))
            A_ub[cells[:, 1], np.arange(V)] = 1.0
            A_ub[:, -1] = -1.0
            res = linprog(cost, A_ub=A_ub, b_ub=np.zeros(G), A_eq=A_eq, b_eq=n_E, bounds=(0, None), method="highs")
            best = min(best, res.fun)
    return best


def test_lower_bound_is_sound_against_the_lp_optimum():
    rng = np.random.default_rng(5)
    for trial in range(6):
        G, E = 3, 3 + 3 * (trial % 2)
        n = rng.pareto(1.0, E) * 10 + 0.1
        P0 = sharded_placement(E, G)
        for B in (0, 1, 2):
            bound = load_lower_bound(n[None], P0, new_replicas=B)[0]
            opt = _lp_optimum(n, P0, B)
            assert bound <= opt + 1e-7, (trial, B, bound, opt)
            if B == 0:
                assert bound == pytest.approx(opt)  # tight without replicas


def test_lower_bound_parts_and_budget():
    P0 = sharded_placement(4, 4)
    # one hot expert: 3 new copies spread it over 4 ranks; 1 copy only halves it
    n = np.array([[100.0, 0.0, 0.0, 0.0]])
    assert load_lower_bound(n, P0, new_replicas=3)[0] == pytest.approx(25.0)
    assert load_lower_bound(n, P0, new_replicas=1)[0] == pytest.approx(50.0)
    assert load_lower_bound(np.array([[7, 0, 0, 0]]), P0, new_replicas=1)[0] == 4  # integers round up
    c = token_costs(expert_bytes=10.0, link_bandwidth=5.0)  # 2 s per transfer
    assert replica_budget(c, 0.0, 4).tolist() == [0]
    assert replica_budget(c, 4.0, 4, max_redundant=3).tolist() == [8]
    assert replica_budget(c, np.inf, 4, max_redundant=3, k_max=16).tolist() == [12]
    assert replica_budget(c, np.array([[2.0, 0.0, 0.0, 0.0]]), 4).tolist() == [1]


def test_expected_counts_plan_in_floats():
    rng = np.random.default_rng(2)
    x = _loads(rng, 3, 4, 12) / 3.0  # expected counts from a forecast are fractional
    P0 = sharded_placement(12, 4)
    for costs in (token_costs(), CURVED):
        plan = plan_layers(x, P0, costs=costs, hide_window_s=np.inf)
        assert plan.n_LEG.dtype == np.float64
        np.testing.assert_allclose(plan.n_LEG.sum(axis=2), x.sum(axis=1), rtol=1e-12)
        assert not ((plan.n_LEG > 1e-9) & ~plan.placement_LEG).any() and (plan.n_LEG >= -1e-9).all()
        np.testing.assert_allclose(plan.latency_LG, _latencies(x, plan, costs)[0], rtol=1e-9)
        assert (plan.latency_LG.max(axis=1) < plan.start_latency_LG.max(axis=1)).all()


@pytest.mark.parametrize("extra", [False, True])
def test_compiled_start_state_and_result_arrays_match_numpy(extra):
    """The compiled call (checks, lines 2-3, results) against numpy: bit for bit on integer loads."""
    rng = np.random.default_rng(11)
    L, G, E = 5, 4, 16
    x = _loads(rng, L, G, E)
    P0 = np.broadcast_to(sharded_placement(E, G), (L, E, G)) | (extra & (rng.random((L, E, G)) < 0.25))
    for costs in (token_costs(expert_bytes=10.0, link_bandwidth=5.0), CURVED):
        win = np.array([0.0, 1.0, 2.0, 3.0, np.inf]) * costs.transfer_s
        plan = plan_layers(x, P0, costs=costs, hide_window_s=win)
        start = [_start(x[lay], P0[lay], costs) for lay in range(L)]
        np.testing.assert_array_equal(plan.start_load_LG, [n.sum(axis=0) for n, *_ in start])
        np.testing.assert_array_equal(plan.start_latency_LG, [cp + costs.comm_s_per_token * np.maximum(vi, vo)
                                                              for _, cp, vi, vo in start])
        # the final arrays are what the assignment and the move log say
        np.testing.assert_array_equal(plan.load_LG, plan.n_LEG.sum(axis=1))
        np.testing.assert_array_equal(plan.replicas_LEG, plan.placement_LEG & ~P0)
        recv, sent = _transfers(plan, P0)
        np.testing.assert_array_equal(plan.bytes_moved_L, recv.sum(axis=1) * costs.expert_bytes)
        np.testing.assert_array_equal(plan.transfer_s_LG, np.maximum(recv, sent) * costs.transfer_s)
        np.testing.assert_allclose(plan.latency_LG, _latencies(x, plan, costs)[0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(plan.compute_LG + plan.comm_LG, plan.latency_LG, rtol=1e-12)
        assert not plan.replicas_LEG[0].any() and plan.replicas_LEG[4].any()  # windows of 0 and inf
        # the same values in another dtype or memory layout plan the same way
        frac = (x / 3.0).astype(np.float32)
        for a, b in ((x, np.asfortranarray(x.astype(np.int32))), (frac.astype(np.float64), frac)):
            p = plan_layers(a, P0, costs=costs, hide_window_s=win)
            q = plan_layers(b, P0, costs=costs, hide_window_s=win)
            np.testing.assert_array_equal(p.n_LEG, q.n_LEG)
            np.testing.assert_array_equal(p.latency_LG, q.latency_LG)


def test_spread_sources_and_errors():
    s = spread_sources(np.array([[5, 0, 3]]), 2)
    assert s.tolist() == [[[3, 0, 2], [2, 0, 1]]]
    c = token_costs()
    with pytest.raises(ConfigError, match="load_LGE has shape"):
        plan_layers(np.ones((2, 4)), sharded_placement(4, 2), costs=c, hide_window_s=1.0)
    with pytest.raises(ConfigError, match="placement has shape"):
        plan_layers(np.ones((1, 2, 4), int), sharded_placement(4, 4), costs=c, hide_window_s=1.0)
    with pytest.raises(ConfigError, match="no copy"):
        plan_layers(np.ones((1, 2, 2), int), np.array([[True, False], [False, False]]), costs=c, hide_window_s=1.0)
    with pytest.raises(ConfigError, match="hide_window_s"):
        plan_layers(np.ones((1, 2, 2), int), sharded_placement(2, 2), costs=c, hide_window_s=-1.0)
    with pytest.raises(ConfigError, match="negative"):
        plan_layers(-np.ones((1, 2, 2), int), sharded_placement(2, 2), costs=c, hide_window_s=1.0)
    with pytest.raises(ConfigError, match="non-finite"):
        plan_layers(np.array([[[1.0, np.nan], [2.0, 1.0]]]), sharded_placement(2, 2), costs=c,
                    hide_window_s=1.0)
    with pytest.raises(ConfigError, match="expert 1 of layer 1"):
        P = np.stack([sharded_placement(2, 2), [[True, False], [False, False]]])
        plan_layers(np.ones((2, 2, 2), int), P, costs=c, hide_window_s=1.0)
    with pytest.raises(ConfigError, match="NaN window"):
        plan_layers(np.ones((2, 2, 2), int), sharded_placement(2, 2), costs=c, hide_window_s=[1.0, np.nan])
    with pytest.raises(ConfigError, match=r"hide_window_s has shape \(3,\)"):
        plan_layers(np.ones((2, 2, 2), int), sharded_placement(2, 2), costs=c, hide_window_s=[1.0, 1.0, 1.0])
    with pytest.raises(ConfigError, match="link"):
        planner_costs(load_model("mixtral-8x7b"), load_hardware("h100-sxm"), link="infiniband")


def _double(v):
    return 2.0 * v


def test_compilation_is_cached_or_falls_back_without_a_writable_cache(monkeypatch):
    numba = pytest.importorskip("numba")
    from numba.core import caching

    from routecast.place.probe_kernel import compile_all

    (fn,) = compile_all((_double,), numba.njit)
    assert fn(3.0) == 6.0 and type(fn._cache).__name__ == "FunctionCache"  # cached on disk
    # no cache location numba may write to: numba refuses cache=True; the planner compiles uncached, warns once
    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])
    with pytest.raises(RuntimeError):
        numba.njit(cache=True)(_double)
    with pytest.warns(RuntimeWarning, match="NUMBA_CACHE_DIR"):
        (fn,) = compile_all((_double,), numba.njit)
    assert fn(3.0) == 6.0 and type(fn._cache).__name__ == "NullCache"
