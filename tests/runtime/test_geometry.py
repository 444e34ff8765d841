"""The I/O-bound geometry harness on a tiny geometry: expert ids mapped from the trace's, the random weights written
once and read back through the tier, warm-up excluded from the figures, fc-evict fed each token's request, and the
run's slot decisions equal to the replay's (replay_geometry) for every policy, with and without prefetch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.common.errors import ConfigError
from routecast.runtime.offload.geometry import (
    Geometry,
    GeometryRun,
    replay_geometry,
    run_geometry,
    write_weights,
)
from routecast.runtime.offload.geometry_routing import map_routing

TINY = Geometry(name="tiny", hidden=64, ffn=32, experts=8, top_k=2, layers=3)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.sampled_from([0.0, 0.3, 1.0]))
def test_map_routing_gives_distinct_groups_in_weight_order_and_skips_dropped_slots(seed: int, K: int, drop: float) -> None:
    rng = np.random.default_rng(seed)
    T, Lt, E = 5, 2, 64
    ids = np.stack([[rng.choice(E, K, replace=False) for _ in range(Lt)] for _ in range(T)])
    w = rng.random((T, Lt, K)).astype(np.float32)
    ids[rng.random(ids.shape) < drop] = -1  # a capture's dropped (token, layer, k) slots
    out_i, out_w = map_routing(ids, w, TINY, E)
    assert out_i.shape == (T, TINY.layers, TINY.top_k)
    assert out_i.min() >= -1 and out_i.max() < TINY.experts
    lay = np.arange(TINY.layers) % Lt
    for t in range(T):
        for g in range(TINY.layers):
            src = ids[t, lay[g]]
            groups = {int(e) // (E // TINY.experts) for e in src if e >= 0}
            got = [int(x) for x in out_i[t, g] if x >= 0]
            assert len(got) == len(set(got)) == min(TINY.top_k, len(groups)) and set(got) <= groups
            assert list(out_i[t, g][:len(got)]) == got  # -1 only after the routed groups
            assert np.all(out_w[t, g][out_i[t, g] < 0] == 0)
            if got:
                assert np.isclose(out_w[t, g].sum(), 1.0, atol=1e-5)
                ok = src >= 0
                heavy = int(src[ok][np.argmax(w[t, lay[g]][ok])]) // (E // TINY.experts)
                assert got[0] == heavy  # the heaviest group comes first


def test_map_routing_refuses_experts_that_do_not_divide() -> None:
    with pytest.raises(ConfigError, match="do not divide"):
        map_routing(np.zeros((1, 1, 2), np.int64), np.ones((1, 1, 2), np.float32), TINY, 12)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("geometry")
    return write_weights(folder, TINY)


def test_weights_are_written_once_and_read_back_through_the_tier(weights) -> None:
    side = json.loads(weights.with_suffix(".json").read_text())
    assert side["layers"] == 3 and "random" in side["note"]
    stamp = weights.stat().st_mtime_ns
    assert write_weights(weights.parent, TINY) == weights and weights.stat().st_mtime_ns == stamp  # reused
    from safetensors import safe_open

    run = GeometryRun(weights, TINY, budget=4, direct=False)
    try:
        with safe_open(str(weights), "pt") as f:
            want = f.get_tensor("layers.1.experts.down_proj")[5]
        dests = {p: torch.empty(shape, dtype=dt) for p, (shape, dt) in run.layout.params.items()}
        run.tier.read_into(1 * TINY.experts + 5, dests)
        assert torch.equal(dests["down_proj"], want)
        assert want.abs().min() >= 2 ** -7 and want.abs().max() < 2 ** -6  # the stated value range
    finally:
        run.close()


def routing(T: int, seed: int = 0, interleave: bool = False) -> dict:
    """A routing dict as trace_routing returns: 3 requests one after the other (interleave: a token of each in turn,
    the serving order, the last one joining late), a forecast that is right half the time."""
    rng = np.random.default_rng(seed)
    ids = np.stack([[rng.choice(TINY.experts, 2, replace=False) for _ in range(TINY.layers)] for _ in range(T)])
    fc = np.where(rng.random(ids.shape) < 0.5, ids, (ids + 3) % TINY.experts)  # (T, L, K) in forecast order
    rank = np.zeros((T, TINY.layers, TINY.experts), np.uint8)
    for k in range(fc.shape[-1] - 1, -1, -1):  # an expert forecast twice keeps its better rank
        np.put_along_axis(rank, fc[..., k:k + 1], k + 1, -1)
    return {"ids": ids, "w": np.full(ids.shape, 0.5, np.float32), "pred": rank > 0, "pred_rank": rank,
            "predict_s": 1e-4, "tokens": T,
            "request": np.r_[[0, 1, 0, 1], np.arange(T - 4) % 3] if interleave else np.repeat(np.arange(3), -(-T // 3))[:T]}


@pytest.mark.parametrize("policy", ["lru", "lfu", "lirs", "fc-evict"])
@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("interleave", [False, True])
def test_the_run_counts_only_timed_tokens_and_matches_the_replay(weights, policy: str, prefetch: bool,
                                                                 interleave: bool) -> None:
    T, warm = 14, 5
    rt = routing(T, interleave=interleave)
    fig = run_geometry(weights, TINY, rt, budget=6, policy=policy, prefetch=prefetch, warmup=warm, direct=False)
    timed = sum(len(np.unique(rt["ids"][t, g])) for t in range(warm, T) for g in range(TINY.layers))
    assert fig["hits"] + fig["misses"] == timed and fig["timed_tokens"] == T - warm
    assert fig["misses"] <= fig["reads"] <= fig["misses"] + fig["prefetch_issued"]  # warm-up reads not counted
    assert len(fig["log"]) == T * TINY.layers  # the warm-up's accesses are kept for the replay
    rep = replay_geometry(fig, TINY, rt, xfer_s=1e-3)
    assert (rep["hits"], rep["misses"]) == (fig["hits"], fig["misses"])  # the same decisions, clock-free
    assert rep["s_per_token"] > 0


@pytest.mark.parametrize("policy", ["lru", "fc-evict"])
def test_prefetch_top_keeps_each_tokens_most_likely_experts_and_the_replay_follows(weights, policy: str) -> None:
    from routecast.runtime.offload.geometry import prefetch_sets

    rt = routing(14, seed=2)
    one = prefetch_sets(rt, 1)
    assert np.array_equal(prefetch_sets(rt, 0), rt["pred"]) and np.array_equal(prefetch_sets(rt, TINY.top_k), rt["pred"])
    assert (one <= rt["pred"]).all() and (one.sum(-1) == 1).all()  # one expert per token and layer, from the forecast
    assert np.array_equal(np.argmax(one, -1), np.argmax(rt["pred_rank"] == 1, -1))  # the most likely one
    fig = run_geometry(weights, TINY, rt, budget=6, policy=policy, prefetch=True, warmup=4, direct=False, pred_top=1)
    assert np.array_equal(fig["pred_sets"][:, 1:], one[:, 1:]) and not fig["pred_sets"][:, 0].any()  # layer 0: never
    assert fig["pred_top"] == 1
    rep = replay_geometry(fig, TINY, rt, xfer_s=1e-3)
    assert (rep["hits"], rep["misses"]) == (fig["hits"], fig["misses"])


def test_prefetch_top_needs_the_forecasts_ranks() -> None:
    from routecast.runtime.offload.geometry import prefetch_sets

    rt = routing(4)
    rt.pop("pred_rank")
    assert np.array_equal(prefetch_sets(rt, 0), rt["pred"])
    with pytest.raises(ConfigError, match="needs the forecast's ranks"):
        prefetch_sets(rt, 1)
    with pytest.raises(ConfigError, match="--prefetch-top is -1"):
        prefetch_sets(routing(4), -1)


def test_fc_evict_sees_each_tokens_request(weights) -> None:
    rt = routing(9)
    run = GeometryRun(weights, TINY, budget=6, policy="fc-evict", direct=False)
    try:
        for t in range(9):
            run.step(rt["ids"][t], rt["w"][t], None, int(rt["request"][t]))
        for fc in run.store.slots.policies[0].fc.subs:  # every memory of the selected forecast learns each token
            assert set(fc.prof) == {0, 1, 2} and fc.step == 9
    finally:
        run.close()


def test_warmup_must_leave_timed_tokens(weights) -> None:
    with pytest.raises(ConfigError, match="geometry-warmup"):
        run_geometry(weights, TINY, routing(4), budget=6, warmup=4, direct=False)


@pytest.mark.parametrize("budget", [2, 5, 12])
def test_eviction_bound_orders_belady_first_and_matches_the_runs_lru(weights, budget: int) -> None:
    from routecast.runtime.offload.geometry import eviction_bound

    rt = routing(30, seed=3)
    m = eviction_bound(TINY, rt, budget)
    assert m["belady"] <= min(m["lru"], m["lfu"])
    fig = run_geometry(weights, TINY, rt, budget=budget, policy="lru", direct=False)
    assert fig["misses"] == m["lru"]  # the kernel's LRU = the runtime's slot decisions


def test_first_tokens_cuts_every_per_token_array() -> None:
    from routecast.runtime.offload.geometry_routing import first_tokens

    rt = routing(10)
    head = first_tokens(rt, 4)
    assert head["tokens"] == 4 and all(len(head[k]) == 4 for k in ("ids", "w", "pred", "request"))
    assert np.array_equal(head["ids"], rt["ids"][:4]) and head["predict_s"] == rt["predict_s"]
    with pytest.raises(ConfigError, match="geometry tokens"):
        first_tokens(rt, 11)


def test_concurrency_is_measured_per_reads_in_flight_into_the_stores_slots(weights) -> None:
    from routecast.runtime.offload.tier import measure_concurrency

    run = GeometryRun(weights, TINY, budget=4, direct=False)
    try:
        before = run.tier.reads
        got = measure_concurrency(run.tier, [run.store.slot_dests(i) for i in range(4)], threads=(1, 2, 4), reads=8)
        assert set(got) == {1, 2, 4} and all(v > 0 for v in got.values())
        assert run.tier.reads - before == 3 * 8  # every count read its share: 8, 2 x 4, 4 x 2
        with pytest.raises(ValueError, match="2 destinations for up to 4 threads"):
            measure_concurrency(run.tier, [run.store.slot_dests(i) for i in range(2)], threads=(1, 4))
    finally:
        run.close()


def test_weights_are_a_claimed_output_and_a_foreign_file_is_never_replaced(tmp_path) -> None:
    from routecast.common.outputs import writes

    @writes("--figures")
    def command(a) -> int:  # a command that writes the weights, as `routecast run --geometry` does
        write_weights(tmp_path / "w", TINY)
        return 0

    class Args:
        figures = None

    assert command(Args()) == 0  # no "wrote ... without claiming it"
    foreign = tmp_path / "other"
    foreign.mkdir()
    (foreign / "tiny-3layers.safetensors").write_bytes(b"the user's")
    with pytest.raises(ConfigError, match="was not written by routecast"):
        write_weights(foreign, TINY)
    assert (foreign / "tiny-3layers.safetensors").read_bytes() == b"the user's"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="--weights-dir"):
        write_weights(tmp_path / "file" / "w", TINY)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.integers(1, 5), st.sampled_from([(8, 8), (8, 16), (4, 16)]))
def test_map_reuse_reads_row_g_mod_l_and_the_least_of_each_groups_distances(seed, trace_L, geo_L, shape) -> None:
    from routecast.runtime.offload.geometry_routing import map_reuse

    geo_E, trace_E = shape
    geom = Geometry(name="g", hidden=8, ffn=8, experts=geo_E, top_k=2, layers=geo_L)
    rng = np.random.default_rng(seed)
    logd = rng.uniform(0, 3, (3, trace_L, trace_L * trace_E))
    got = map_reuse(logd, geom, trace_L, trace_E)
    assert got.shape == (3, geo_L, geo_L * geo_E)
    m = trace_E // geo_E
    for g in range(geo_L):
        for g2 in range(geo_L):
            for e in range(geo_E):
                lo = (g2 % trace_L) * trace_E + e * m
                want = logd[:, g % trace_L, lo:lo + m].min(-1)
                np.testing.assert_array_equal(got[:, g, g2 * geo_E + e], want)


@pytest.mark.parametrize("interleave", [False, True])
def test_fc_evict_reads_the_reuse_forecast_and_the_replay_makes_the_same_decisions(weights, interleave: bool) -> None:
    T, warm = 14, 5
    rt = routing(T, seed=2, interleave=interleave)
    rt.update(reuse=np.random.default_rng(2).uniform(0, 3, (T, TINY.layers, TINY.layers * TINY.experts)), reuse_s=1e-5)
    fig = run_geometry(weights, TINY, rt, budget=6, policy="fc-evict", warmup=warm, direct=False, reuse=True)
    rep = replay_geometry(fig, TINY, rt, xfer_s=1e-3)
    assert (rep["hits"], rep["misses"]) == (fig["hits"], fig["misses"]) and fig["reuse"]
    # the probe's time is charged to the run, and so is fc-evict's upkeep of its profiles (timed, inside the wall)
    assert 1e-5 * (T - warm) < fig["predict_s"] < fig["wall_s"]
    lru = run_geometry(weights, TINY, rt, budget=6, policy="lru", prefetch=True, warmup=warm, direct=False)
    assert lru["predict_s"] == pytest.approx(1e-4 * (T - warm))  # no profiles: the forecast's seconds alone
    run = GeometryRun(weights, TINY, budget=6, policy="fc-evict", direct=False)
    try:
        run.step(rt["ids"][0], rt["w"][0], None, 0, rt["reuse"][0])
        assert run.store.slots.policies[0].qL is not None  # the forecast reached the policy
    finally:
        run.close()
    with pytest.raises(ConfigError, match="read by fc-evict only"):
        run_geometry(weights, TINY, rt, budget=6, policy="lru", direct=False, reuse=True)
    with pytest.raises(ConfigError, match="without reuse forecasts"):
        run_geometry(weights, TINY, routing(T), budget=6, policy="fc-evict", direct=False, reuse=True)


def test_fc_evict_reads_the_waiting_requests_next_tokens_and_the_replay_makes_the_same_decisions(weights) -> None:
    """Serving order with routing['token_use']: fc-evict's runs get each waiting request's next-token forecast and the
    running request's own (their seconds charged), the replay makes the same decisions, and
    replay_geometry(next_tokens=False) leaves them out; LRU never reads them; one request at a time, its own only."""
    from routecast.runtime.offload.geometry import next_token_forecasts

    T, warm = 14, 5
    rt = routing(T, seed=3, interleave=True)
    rng = np.random.default_rng(3)
    rt.update(token_use=rng.uniform(0, 1, (T, TINY.layers * TINY.experts)), token_s=2e-5)
    nu = next_token_forecasts(rt, "fc-evict")
    assert nu is not None and any(nu) and next_token_forecasts(rt, "lru") is None
    for t in range(T):  # the running request's entry is its own token's forecast (its input now), not a later one's
        np.testing.assert_array_equal(nu[t][int(rt["request"][t])], rt["token_use"][t])
    fig = run_geometry(weights, TINY, rt, budget=6, policy="fc-evict", warmup=warm, direct=False)
    rep = replay_geometry(fig, TINY, rt, xfer_s=1e-3)
    assert fig["next_tokens"] and (rep["hits"], rep["misses"]) == (fig["hits"], fig["misses"])
    assert fig["predict_s"] > 2e-5 * (T - warm)
    plain = replay_geometry(fig, TINY, rt, xfer_s=1e-3, next_tokens=False)
    assert plain["hits"] + plain["misses"] == rep["hits"] + rep["misses"]
    one = routing(T, seed=3)  # one request at a time: none ever waits, the running one's own token is known
    one.update(token_use=rt["token_use"], token_s=2e-5)
    assert [list(d) for d in next_token_forecasts(one, "fc-evict")] == [[int(r)] for r in one["request"]]
    fig = run_geometry(weights, TINY, one, budget=6, policy="fc-evict", warmup=warm, direct=False)
    rep = replay_geometry(fig, TINY, one, xfer_s=1e-3)
    assert fig["next_tokens"] and (rep["hits"], rep["misses"]) == (fig["hits"], fig["misses"])


def test_every_policy_and_budget_computes_the_same_outputs_as_all_resident(tmp_path) -> None:
    wide = Geometry(name="wide", hidden=64, ffn=32, experts=8, top_k=4, layers=3)  # 4 terms: order would show
    weights = write_weights(tmp_path, wide)
    rng = np.random.default_rng(3)
    T, n = 12, wide.layers * wide.experts
    p = np.array([8, 8, 4, 4, 2, 1, 1, 1]) / 29  # skewed, as routing is: a cache of a few slots hits
    ids = np.stack([[rng.choice(wide.experts, 4, replace=False, p=p) for _ in range(wide.layers)] for _ in range(T)])
    rt = {"ids": ids, "w": rng.random(ids.shape).astype(np.float32), "pred": np.zeros((T, wide.layers, wide.experts), bool),
          "predict_s": 0.0, "tokens": T, "request": np.arange(T) % 3}
    want = run_geometry(weights, wide, rt, budget=n, warmup=3, direct=False)["outputs"]  # all-resident: no read
    assert want.shape == (9 * wide.layers, wide.hidden) and np.abs(want).max() > 0
    for policy, budget in (("lru", 14), ("lirs", 10), ("fc-evict", 16), ("arc", 20)):
        fig = run_geometry(weights, wide, rt, budget=budget, policy=policy, warmup=3, direct=False)
        assert fig["misses"] > 0 and fig["hits"] > 0  # layers split into rounds: hits first, then misses
        assert np.array_equal(fig["outputs"], want), (policy, budget)  # each slot held its expert; sums in one order
    slow = run_geometry(weights, wide, rt, budget=4, warmup=3, direct=False, kernel="torch")["outputs"]
    np.testing.assert_allclose(slow, want, rtol=0.02, atol=0.02 * np.abs(want).max())  # torch rounds h to bf16
    with pytest.raises(ConfigError, match="--geometry-kernel is 'cuda'; expected one of numba, torch"):
        run_geometry(weights, wide, rt, budget=4, warmup=3, direct=False, kernel="cuda")
