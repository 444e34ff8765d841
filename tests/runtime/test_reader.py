"""Expert reads in reader processes (runtime/offload/reader.py): every computed slot holds its expert's checkpoint
bytes, the counts equal the slot replay's whatever the processes' timing (hypothesis), and a truncated file, a dead
reader or a tier without a child side is one sentence."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from routecast.common.errors import ConfigError
from routecast.runtime.offload.store import ExpertStore, StoreConfig
from routecast.runtime.offload.tier import DiskTier, ExpertLayout
from tests.runtime.test_store import MemTier, drive, random_steps, replay_routing

L, E, I2, H, I = 3, 6, 8, 64, 4  # noqa: E741
PARAMS = {"gate_up_proj": ((I2, H), torch.float32), "down_proj": ((H, I), torch.float32)}


def checkpoint(path, seed: int = 0) -> dict[str, torch.Tensor]:
    """A fused checkpoint of L MoE layers whose expert (l, e) has its own random values; -> the tensors."""
    g = torch.Generator().manual_seed(seed)
    t = {}
    for li in range(L):
        t[f"model.layers.{li}.mlp.experts.gate_up_proj"] = torch.randn(E, I2, H, generator=g)
        t[f"model.layers.{li}.mlp.experts.down_proj"] = torch.randn(E, H, I, generator=g)
    save_file(t, str(path))
    return t


def disk_tier(path) -> DiskTier:
    return DiskTier(ExpertLayout([path], [f"model.layers.{li}.mlp" for li in range(L)], PARAMS, E))


def expect(t: dict, key: int) -> tuple[torch.Tensor, torch.Tensor]:
    li, e = divmod(key, E)
    return t[f"model.layers.{li}.mlp.experts.gate_up_proj"][e], t[f"model.layers.{li}.mlp.experts.down_proj"][e]


def access(store: ExpertStore, t: dict, layer: int, experts: list[int]) -> None:
    seen: list[int] = []

    def compute(exps: np.ndarray, slots: np.ndarray) -> None:
        for e, s in zip(exps.tolist(), slots.tolist(), strict=True):
            gu, dn = expect(t, layer * E + e)
            assert torch.equal(store.pools["gate_up_proj"][s], gu) and torch.equal(store.pools["down_proj"][s], dn)
            seen.append(e)

    store.access(layer, experts, compute)
    assert sorted(seen) == experts
    store.check()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.integers(2, 14), st.booleans(), st.booleans(), st.integers(1, 2), st.integers(0, 2**31 - 1), st.booleans(),
       st.booleans())
def test_process_reads_fill_the_right_slots_and_count_as_the_replay(tmp_path, budget: int, per_layer: bool, ahead: bool,
                                                                    procs: int, seed: int, hold: bool,
                                                                    early: bool) -> None:
    path = tmp_path / f"m{seed}.safetensors"
    t = checkpoint(path, seed)
    S = 5
    budget = max(budget, L) if per_layer else budget
    pred, routing = random_steps(seed, S, L, E, ahead)
    tier = disk_tier(path)
    store = ExpertStore(tier, StoreConfig(budget=budget, per_layer=per_layer, check=True, early=early,
                                          loader_threads=procs, reader="process"))
    try:
        drive(store, pred, routing, ahead, hold, lambda lay, ex: access(store, t, lay, ex))
        store.drain()
        got = dict(store.stats)
        assert not store.inflight
        for k in store.resident_keys().tolist():  # every read that landed holds its own expert
            gu, dn = expect(t, k)
            assert torch.equal(store.pools["gate_up_proj"][store.slots.slot_of[k]], gu)
    finally:
        store.close()
        tier.close()
    assert tier.reads + got["reads_skipped"] == got["misses"] + got["prefetch_issued"]  # every load read or skipped
    rep = replay_routing(routing, L, E, budget, per_layer=per_layer, pred_SLE=pred, layer_ahead=ahead)
    for k in ("hits", "misses", "prefetch_issued", "prefetch_useful", "prefetch_cancelled", "evictions", "max_occupied"):
        assert got[k] == rep[k], k


def test_close_ends_the_reader_processes(tmp_path) -> None:
    t = checkpoint(tmp_path / "m.safetensors")
    tier = disk_tier(tmp_path / "m.safetensors")
    store = ExpertStore(tier, StoreConfig(budget=4, loader_threads=2, reader="auto"))  # a disk tier on Linux: processes
    assert len(store.proc.kids) == 2 and not store.threads
    access(store, t, 1, [0, 2, 5])
    kids = list(store.proc.kids)
    store.close()
    tier.close()
    assert all(k.returncode == 0 for k in kids)


def test_a_truncated_file_is_one_sentence_naming_the_expert(tmp_path) -> None:
    path = tmp_path / "m.safetensors"
    checkpoint(path)
    tier = disk_tier(path)
    os.truncate(path, os.path.getsize(path) // 2)  # the header still names every expert; the last ones are cut off
    store = ExpertStore(tier, StoreConfig(budget=4, reader="process"))
    try:
        with pytest.raises(ConfigError, match=r"read of expert 1[2-7] returned \d+ of \d+ bytes; the file is truncated"):
            store.access(2, [1], lambda e, s: None)
    finally:
        store.close()
        tier.close()


def test_a_dead_reader_is_one_sentence(tmp_path) -> None:
    t = checkpoint(tmp_path / "m.safetensors")
    tier = disk_tier(tmp_path / "m.safetensors")
    store = ExpertStore(tier, StoreConfig(budget=4, loader_threads=1, reader="process"))
    try:
        access(store, t, 0, [1])
        store.proc.kids[0].kill()
        store.proc.kids[0].wait()
        with pytest.raises(RuntimeError, match="expert reader process 0 exited with code -9"):
            store.access(1, [3], lambda e, s: None)
    finally:
        store.close()
        tier.close()


def test_reader_names_are_checked_and_a_memory_tier_has_no_child_side() -> None:
    with pytest.raises(ConfigError, match="reader is 'fork'; expected one of threads, process, auto"):
        StoreConfig(budget=2, reader="fork")
    auto = ExpertStore(MemTier(2, 3), StoreConfig(budget=2, reader="auto"))  # no disk: auto falls back to threads
    try:
        assert auto.proc is None and auto.threads
    finally:
        auto.close()
    with pytest.raises(ConfigError, match="reader 'process' needs a tier read from disk; MemTier has no child side"):
        ExpertStore(MemTier(2, 3), StoreConfig(budget=2, reader="process"))
