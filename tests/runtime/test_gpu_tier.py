"""runtime/offload/gpu.py's PinnedTier (on the CPU here; the CUDA test runs where a GPU is) and the routing file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.common.errors import ConfigError
from routecast.runtime.offload.geometry import GeometryRun, replay_geometry, run_geometry, write_weights
from routecast.runtime.offload.geometry_routing import load_routing, save_routing
from routecast.runtime.offload.gpu import PinnedTier
from tests.runtime.test_geometry import TINY, routing


@pytest.fixture(scope="module")
def tier() -> PinnedTier:
    return PinnedTier(TINY, "cpu", seed=3)


def test_weights_are_random_in_the_stated_range_and_read_into_a_slot_exactly(tier) -> None:
    w = tier.host["gate_up_proj"][2]
    assert w.shape == (TINY.experts, 2 * TINY.ffn, TINY.hidden) and w.dtype == torch.bfloat16
    assert w.abs().min() >= 2 ** -7 and w.abs().max() < 2 ** -6  # geometry.py's value range
    assert (w > 0).float().mean().item() == pytest.approx(0.5, abs=0.05)  # random signs
    assert len(torch.unique(w)) > 200  # random mantissas, not a constant
    dests = {p: torch.empty(s, dtype=d) for p, (s, d) in tier.layout.params.items()}
    before = (tier.reads, tier.bytes_read)
    n = tier.read_into(2 * TINY.experts + 5, dests)
    assert torch.equal(dests["gate_up_proj"], w[5]) and torch.equal(dests["down_proj"], tier.host["down_proj"][2][5])
    assert n == TINY.expert_bytes == tier.layout.expert_bytes
    assert (tier.reads, tier.bytes_read) == (before[0] + 1, before[1] + n)
    assert tier.mode == "memory->cpu"


def test_the_store_makes_its_slots_with_the_tier_and_the_runs_share_one_tier(tier) -> None:
    run = GeometryRun(None, TINY, budget=5, tier=tier)
    try:
        assert run.store.pools["down_proj"].shape == (5, TINY.hidden, TINY.ffn)
        rt = routing(6)
        for t in range(6):
            run.step(rt["ids"][t], rt["w"][t])
    finally:
        run.close()
    assert tier.host["down_proj"]  # a shared tier outlives the run


@pytest.mark.parametrize("policy", ["lru", "lirs", "fc-evict"])
@pytest.mark.parametrize("prefetch", [False, True])
def test_pinned_runs_make_the_disk_runs_decisions_and_match_the_replay(tier, tmp_path_factory, policy, prefetch) -> None:
    weights = write_weights(tmp_path_factory.mktemp("w"), TINY)
    rt = routing(15, seed=4)
    kw = dict(budget=7, policy=policy, prefetch=prefetch, warmup=5)
    mem = run_geometry(None, TINY, rt, tier=tier, **kw)
    disk = run_geometry(weights, TINY, rt, direct=False, **kw)
    assert (mem["hits"], mem["misses"]) == (disk["hits"], disk["misses"])  # reads: a cancelled prefetch's read is
    assert mem["reads"] >= mem["misses"] and disk["reads"] >= disk["misses"]  # skipped only if it has not started
    rep = replay_geometry(mem, TINY, rt, xfer_s=1e-3)
    assert (rep["hits"], rep["misses"]) == (mem["hits"], mem["misses"])


def test_a_budget_of_every_expert_preloads_them_so_the_timed_tokens_read_nothing(tier) -> None:
    n = TINY.layers * TINY.experts
    fig = run_geometry(None, TINY, routing(8), budget=n, warmup=2, tier=tier)
    assert fig["reads"] == 0 and fig["misses"] == 0 and fig["hit_ratio"] == 1.0


def test_slots_beyond_the_free_memory_are_refused_before_allocating(tier) -> None:
    with pytest.raises(ConfigError, match="--budget: .* expert slots need"):
        tier.pool(1 << 40, (TINY.hidden, TINY.ffn), torch.bfloat16)


def test_a_cuda_device_on_a_machine_without_one_is_one_sentence() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="no CUDA device"):
        PinnedTier(TINY, "cuda")
    with pytest.raises(ConfigError, match="expected cuda"):
        PinnedTier(TINY, "meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_copies_land_on_the_device_from_pinned_memory_on_a_side_stream() -> None:
    t = PinnedTier(TINY, "cuda", seed=1)
    assert t.host["down_proj"][0].is_pinned() and t.mode == "pinned->cuda"
    rt = routing(12, seed=2)
    fig = run_geometry(None, TINY, rt, budget=6, warmup=3, tier=t, prefetch=True)
    ref = run_geometry(None, TINY, rt, budget=6, warmup=3, tier=PinnedTier(TINY, "cpu", seed=1), prefetch=True)
    assert (fig["hits"], fig["misses"]) == (ref["hits"], ref["misses"])
    pool = t.pool(2, (TINY.hidden, TINY.ffn), torch.bfloat16)
    t.read_into(4, {"gate_up_proj": torch.empty(2 * TINY.ffn, TINY.hidden, dtype=torch.bfloat16, device="cuda"),
                    "down_proj": pool[1]})
    assert torch.equal(pool[1].cpu(), t.host["down_proj"][0][4])


def _saved(tmp_path, T: int = 10):
    rt = routing(T) | {"trace": "t", "trace_layers": 2, "order": "step", "reuse_s": 2e-4, "token_s": 3e-6,
                       "reuse": np.zeros((T, TINY.layers, TINY.layers * TINY.experts), np.float32),
                       "token_use": np.full((T, TINY.layers * TINY.experts), 0.25)}
    return rt, save_routing(tmp_path / "r.npz", rt, TINY)


def test_a_saved_routing_reads_back_equal(tmp_path) -> None:
    rt, path = _saved(tmp_path)
    got = load_routing(path, TINY)
    for k in ("ids", "w", "request", "pred", "pred_rank", "reuse", "token_use"):
        assert np.array_equal(got[k], rt[k])
    assert got["tokens"] == 10 and got["predict_s"] == rt["predict_s"] and got["reuse_s"] == 2e-4
    assert got["token_s"] == 3e-6
    fig = run_geometry(None, TINY, got, budget=6, warmup=2, tier=PinnedTier(TINY, "cpu"), reuse=True, policy="fc-evict")
    assert fig["timed_tokens"] == 8


def test_a_routing_of_another_geometry_or_shape_is_refused(tmp_path) -> None:
    from dataclasses import replace

    _rt, path = _saved(tmp_path)
    with pytest.raises(ConfigError, match="mapped to"):
        load_routing(path, replace(TINY, layers=4))
    with pytest.raises(ConfigError, match="no such file"):
        load_routing(tmp_path / "none.npz", TINY)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["ids", "w", "request", "pred", "pred_rank", "reuse", "token_use"]),
       st.sampled_from(["shape", "nan", "range", "drop"]),
       st.integers(0, 2**31 - 1))
def test_a_damaged_routing_file_is_one_sentence_naming_it(tmp_path_factory, key, damage, seed) -> None:
    rt, _ = _saved(tmp_path_factory.mktemp("r"))
    rng = np.random.default_rng(seed)
    a = np.asarray(rt[key])
    if damage == "shape":
        rt[key] = a[: max(0, len(a) - 1 - int(rng.integers(0, 3)))]
    elif damage == "nan":
        if a.dtype.kind != "f":
            return
        a = a.copy()
        a.reshape(-1)[rng.integers(0, a.size)] = np.nan
        rt[key] = a
    elif damage == "range":
        if key not in ("ids", "token_use", "pred_rank"):
            return
        a = a.copy()
        bad = {"ids": [-2, TINY.experts, 1 << 20], "token_use": [-0.5, 1.5], "pred_rank": [0, TINY.top_k + 1, 255]}[key]
        i = rng.integers(0, a.size)
        if key == "pred_rank" and a.reshape(-1)[i] == 0:  # a rank where nothing is forecast: not the 'pred' sets
            bad = [1, TINY.top_k]
        a.reshape(-1)[i] = rng.choice(bad)
        rt[key] = a
    elif key not in ("reuse", "token_use", "pred_rank"):  # optional: dropping one is a valid file
        rt.pop(key)
    else:
        return
    path = save_routing(tmp_path_factory.mktemp("d") / "r.npz", rt, TINY)
    with pytest.raises(ConfigError, match="--routing-file .*r.npz"):
        load_routing(path, TINY)


def test_a_file_that_is_not_a_routing_is_refused(tmp_path) -> None:
    (tmp_path / "x.npz").write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(ConfigError, match="not a routing file"):
        load_routing(tmp_path / "x.npz", TINY)
    np.savez(tmp_path / "y.npz", header=np.frombuffer(json.dumps({"x": 1}).encode(), np.uint8))
    with pytest.raises(ConfigError, match="mapped to"):
        load_routing(tmp_path / "y.npz", TINY)
    np.save(tmp_path / "z.npz", np.zeros(3))  # an .npy under an .npz name
    (tmp_path / "z.npz.npy").rename(tmp_path / "z.npz")
    with pytest.raises(ConfigError, match="not a routing file"):
        load_routing(tmp_path / "z.npz", TINY)
