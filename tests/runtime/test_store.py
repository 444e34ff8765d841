"""The expert store on an in-memory tier: budget never exceeded (hypothesis), every computed slot holds the right
expert, real-time correction, and the shared LRU policy object equal to the replay kernel's LRU."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routecast.cache.policy import replay_demand
from routecast.cache.replay import ReplayConfig, build_accesses, run_policy
from routecast.cache.slots import replay_slots
from routecast.common.errors import ConfigError
from routecast.runtime.offload.store import ExpertStore, StoreConfig
from routecast.sim.hardware import load_hardware
from tests.cache.test_properties import tiny_trace


class MemTier:
    """Expert k's tensors are filled with the value k; `gate` (an Event) can hold every read back."""

    def __init__(self, L: int, E: int, gate: threading.Event | None = None) -> None:
        self.layout = SimpleNamespace(num_layers=L, num_experts=E, expert_bytes=8 * 4,
                                      params={"w": ((2, 4), torch.float32)})
        self.gate = gate
        self.reads: list[int] = []

    def read_into(self, key: int, dests: dict[str, torch.Tensor]) -> int:
        if self.gate is not None:
            assert self.gate.wait(5)
        dests["w"].fill_(float(key))
        self.reads.append(key)
        return 32


def run_accesses(store: ExpertStore, L: int, E: int, accesses: list[tuple[int, list[int]]]) -> None:
    for layer, experts in accesses:
        seen: list[int] = []

        def compute(exps: np.ndarray, slots: np.ndarray, layer: int = layer, seen: list[int] = seen) -> None:
            for e, s in zip(exps.tolist(), slots.tolist(), strict=True):
                assert torch.all(store.pools["w"][s] == layer * E + e)  # the slot holds this expert's weights
                seen.append(e)

        store.access(layer, experts, compute)
        assert sorted(seen) == experts  # each expert computed exactly once
        store.check()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 12), st.booleans(), st.integers(0, 2**31 - 1), st.booleans())
def test_budget_never_exceeded_under_random_routing_and_prefetch(budget: int, per_layer: bool, seed: int, pf: bool) -> None:
    L, E = 3, 6
    if per_layer and budget < L:
        budget = L
    rng = np.random.default_rng(seed)
    store = ExpertStore(MemTier(L, E), StoreConfig(budget=budget, per_layer=per_layer, check=True, loader_threads=2))
    total = 0
    try:
        for _step in range(6):
            if pf:  # a random forecast of every layer, as a request-horizon predictor gives
                store.prefetch(list(range(L)), [lay * E + np.flatnonzero(rng.random(E) < 0.4) for lay in range(L)])
            acc = [(lay, sorted(rng.choice(E, size=int(rng.integers(1, E + 1)), replace=False).tolist())) for lay in range(L)]
            run_accesses(store, L, E, acc)
            total += sum(len(x) for _, x in acc)
            store.end_step()
        st_ = store.stats
        assert st_["max_occupied"] <= budget
        assert st_["hits"] + st_["misses"] == total and st_["late"] <= st_["hits"]
    finally:
        store.close()


def test_counts_add_up_and_budget_bad_values() -> None:
    store = ExpertStore(MemTier(2, 4), StoreConfig(budget=3, check=True))
    try:
        run_accesses(store, 2, 4, [(0, [0, 1, 2]), (1, [0, 3]), (0, [1, 2])])
        s = store.stats
        assert s["hits"] + s["misses"] == 7 and s["max_occupied"] == 3
    finally:
        store.close()
    with pytest.raises(ConfigError, match="at least 1"):
        StoreConfig(budget=0)
    with pytest.raises(ConfigError, match="at most 8"):
        ExpertStore(MemTier(2, 4), StoreConfig(budget=9))


def test_correction_releases_wrong_prefetches_and_skips_their_reads() -> None:
    L, E = 2, 8
    gate = threading.Event()
    tier = MemTier(L, E, gate)
    store = ExpertStore(tier, StoreConfig(budget=4, loader_threads=1, check=True))
    try:
        # layer 1 forecast {1, 2, 3, 4}: four slots reserved now; the single reader is held on the first read
        store.prefetch([1], [np.array([E + 1, E + 2, E + 3, E + 4])], current_layer=0)
        assert store.stats["prefetch_issued"] == 4 and store.slots.occupied == 4
        done = threading.Thread(target=run_accesses, args=(store, L, E, [(1, [2, 5])]))
        done.start()
        gate.set()
        done.join(5)
        s = store.stats
        # true routing {2, 5}: 2 is a hit (late or not: it held a slot), 5 a miss; the wrong 1, 3, 4 give their
        # slots back, and the reads of those not started yet are skipped
        assert (s["hits"], s["misses"], s["prefetch_cancelled"], s["prefetch_useful"]) == (1, 1, 3, 1)
        assert s["reads_skipped"] >= 2 and E + 3 not in tier.reads and E + 4 not in tier.reads
        assert sorted(store.resident_keys().tolist()) == [E + 2, E + 5]
    finally:
        store.close()


def test_late_prefetch_is_a_hit_waited_for_without_a_second_read() -> None:
    L, E = 2, 4
    gate = threading.Event()
    tier = MemTier(L, E, gate)
    store = ExpertStore(tier, StoreConfig(budget=4, loader_threads=1, check=True))
    try:
        store.prefetch([1], [np.array([E + 1, E + 3])], current_layer=0)
        t = threading.Thread(target=run_accesses, args=(store, L, E, [(1, [3])]))
        t.start()
        t.join(0.2)
        assert t.is_alive()  # waiting for the held read
        gate.set()
        t.join(5)
        s = store.stats
        assert (s["hits"], s["late"], s["misses"]) == (1, 1, 0)
        assert tier.reads.count(E + 3) == 1 and s["stall_s"] > 0.1
    finally:
        store.close()


def test_mispredicted_resident_is_evicted_before_lru() -> None:
    L, E = 2, 4
    store = ExpertStore(MemTier(L, E), StoreConfig(budget=3, check=True))
    try:
        run_accesses(store, L, E, [(0, [0]), (1, [2]), (1, [1])])  # resident: 0, E+2, E+1 (LRU order)
        store.end_step()
        store.prefetch([1], [np.array([E + 2])], current_layer=0)  # resident already: marked, no read
        run_accesses(store, L, E, [(1, [1])])  # forecast E+2 unused: mispredicted (it was used before: kept)
        assert store.stats["mispredicted"] == 1 and store.stats["prefetch_cancelled"] == 0
        run_accesses(store, L, E, [(0, [3])])  # needs a slot: E+2 goes, not the least recent key 0
        res = set(store.resident_keys().tolist())
        assert E + 2 not in res and 0 in res
    finally:
        store.close()


@pytest.mark.parametrize("seed,budget", [(0, 3), (1, 7), (2, 12)])
def test_policy_object_equals_the_replay_kernels_lru(seed: int, budget: int) -> None:
    trace = tiny_trace(seed, L=3, E=8, k=2, steps=40, per_step=3)
    acc = build_accesses(trace)
    hits, misses = replay_demand(acc.req_off, acc.req_key, budget)
    row = run_policy(acc, "lru", ReplayConfig(budget=budget, hardware=load_hardware("h100-sxm")), expert_bytes=1 << 20)
    assert misses == row["demand_loads"]
    assert hits == round(row["hit_ratio"] * len(acc.req_key))
    rep = replay_slots(acc.req_off, acc.req_key, acc.L, acc.E, budget)  # the runtime's slot accounting, no forecast
    assert (rep["hits"], rep["misses"]) == (hits, misses)


def random_steps(seed: int, S: int, L: int, E: int, ahead: bool) -> tuple[np.ndarray, list[list[list[int]]]]:
    """(forecast sets (S, L, E), routing: step, layer -> sorted experts) drawn from seed; with ahead, half the seeds
    have no first-layer forecast (inblock.py's is made at the step's start)."""
    rng = np.random.default_rng(seed)
    pred = rng.random((S, L, E)) < 0.4
    if ahead and seed % 2:
        pred[:, 0] = False
    routing = [[sorted(rng.choice(E, size=int(rng.integers(1, E + 1)), replace=False).tolist()) for _ in range(L)]
               for _ in range(S)]
    return pred, routing


def drive(store: ExpertStore, pred: np.ndarray, routing: list[list[list[int]]], ahead: bool, hold: bool,
          access_layer) -> None:
    """Drive `store` over the steps of `routing` (step, layer -> experts) as the engine does: a request-horizon
    forecast pred (S, L, E) before each step, or (ahead) layer 0's own forecast at the step's start and layer l+1's
    inside layer l's block; access_layer(layer, experts) runs the access."""
    S, L, E = pred.shape
    for s in range(S):
        if not ahead:
            store.prefetch(list(range(L)), [lay * E + np.flatnonzero(pred[s, lay]) for lay in range(L)])
        elif pred[s, 0].any():  # layer 0's forecast before its decoder layer (engine._lookahead_first)
            store.prefetch([0], [np.flatnonzero(pred[s, 0])], -1)
        for lay in range(L):
            if ahead and lay + 1 < L:
                store.prefetch([lay + 1], [(lay + 1) * E + np.flatnonzero(pred[s, lay + 1])], current_layer=lay,
                               hold=hold, running=[lay * E + int(e) for e in routing[s][lay]])
            access_layer(lay, routing[s][lay])
        store.end_step()


def replay_routing(routing: list[list[list[int]]], L: int, E: int, budget: int, **kw) -> dict:
    """replay_slots over the same routing (what the store's counts must equal)."""
    keys = [lay * E + np.asarray(routing[s][lay]) for s in range(len(routing)) for lay in range(L)]
    off = np.concatenate([[0], np.cumsum([len(k) for k in keys])])
    return replay_slots(off, np.concatenate(keys), L, E, budget, **kw)


class SlowTier(MemTier):
    """MemTier whose reads take a random 0-2 ms: which prefetches arrive in time changes from run to run."""

    def __init__(self, L: int, E: int, seed: int) -> None:
        super().__init__(L, E)
        self.rng = np.random.default_rng(seed)

    def read_into(self, key: int, dests: dict[str, torch.Tensor]) -> int:
        threading.Event().wait(float(self.rng.random()) * 0.002)
        return super().read_into(key, dests)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 14), st.booleans(), st.booleans(), st.integers(1, 3), st.integers(0, 1), st.integers(0, 2**31 - 1),
       st.booleans(), st.booleans())
def test_runtime_counts_equal_the_slot_replay_whatever_the_thread_timing(budget: int, per_layer: bool, ahead: bool,
                                                                         depth: int, keep: int, seed: int,
                                                                         hold: bool, early: bool) -> None:
    L, E, S = 3, 6, 5
    budget = max(budget, L) if per_layer or keep else budget
    pred, routing = random_steps(seed, S, L, E, ahead)
    store = ExpertStore(SlowTier(L, E, seed), StoreConfig(budget=budget, per_layer=per_layer, check=True, depth=depth,
                                                                keep_per_layer=keep, early=early))
    try:
        drive(store, pred, routing, ahead, hold, lambda lay, ex: run_accesses(store, L, E, [(lay, ex)]))
        got = dict(store.stats)
    finally:
        store.close()
    rep = replay_routing(routing, L, E, budget, per_layer=per_layer, pred_SLE=pred, layer_ahead=ahead, depth=depth,
                         keep_per_layer=keep)
    for k in ("hits", "misses", "prefetch_issued", "prefetch_useful", "prefetch_cancelled", "prefetch_dropped",
              "evictions", "max_occupied"):
        assert got[k] == rep[k], k


def test_preload_fills_free_slots_only_and_counts_no_access() -> None:
    L, E = 2, 4
    tier = MemTier(L, E)
    store = ExpertStore(tier, StoreConfig(budget=3, check=True))
    try:
        store.preload(np.arange(L * E))
        assert store.resident_keys().tolist() == [0, 1, 2] and tier.reads == [0, 1, 2]
        store.check()
        run_accesses(store, L, E, [(0, [1, 2]), (1, [0])])  # 2 hits on preloaded experts, 1 miss evicting the LRU 0
        s = store.stats
        assert (s["hits"], s["misses"], s["accesses"]) == (2, 1, 2) and 0 not in store.resident_keys()
    finally:
        store.close()


def test_a_held_forecast_is_read_after_the_running_layers_demand_loads() -> None:
    L, E = 2, 6
    gate = threading.Event()
    tier = MemTier(L, E, gate)
    store = ExpertStore(tier, StoreConfig(budget=8, loader_threads=1))
    try:
        store.prefetch([1], [E + np.array([0, 1, 2])], current_layer=0, hold=True)  # PROBE's forecast of layer 1
        threading.Event().wait(0.02)
        assert not store.jobs and len(store.held) == 3  # nothing queued yet: the loader cannot take it first
        gate.set()
        run_accesses(store, L, E, [(0, [3, 4])])  # layer 0's own misses
        store.drain()
        assert tier.reads[:2] == [3, 4] and sorted(tier.reads[2:]) == [E, E + 1, E + 2]
        run_accesses(store, L, E, [(1, [0, 1])])
        assert store.stats["prefetch_useful"] == 2 and not store.held
    finally:
        store.close()



@pytest.mark.parametrize("early", [True, False])
def test_early_computes_the_resident_experts_while_the_misses_are_read(early: bool) -> None:
    """StoreConfig.early: an access computes its hits before its misses' reads end (here a read waits until the hits
    were computed, so without early it could not finish); each expert once, from the right slot, in two rounds."""
    L, E = 1, 4
    gate = threading.Event()
    store = ExpertStore(MemTier(L, E), StoreConfig(budget=3, check=True, early=early))
    try:
        run_accesses(store, L, E, [(0, [0, 1])])  # 0 and 1 resident
        store.tier.gate = gate
        rounds: list[list[int]] = []

        def compute(exps: np.ndarray, slots: np.ndarray) -> None:
            for e, s in zip(exps.tolist(), slots.tolist(), strict=True):
                assert torch.all(store.pools["w"][s] == e)
            rounds.append(exps.tolist())
            if exps.tolist() == [0, 1]:
                gate.set()  # the hits computed: the miss's read may end

        if not early:
            gate.set()  # one round after every read: nothing to wait for
        store.access(0, [0, 1, 2], compute)
        assert rounds == ([[0, 1], [2]] if early else [[0, 1, 2]])
        store.check()
        assert store.slots.pins.sum() == 0  # every key unpinned after the access
    finally:
        store.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 12), st.integers(0, 2**31 - 1), st.sampled_from(["lfu+bypass", "fc-evict+bypass"]),
       st.booleans())
def test_bypass_computes_kept_out_misses_from_the_staging_slot(budget: int, seed: int, policy: str, early: bool) -> None:
    """+bypass in the runtime: a miss kept out is read into the staging slot, computed from it (the slot holds that
    expert's weights), and forgotten; every expert is computed once and the slots never exceed the budget."""
    L, E = 3, 6
    rng = np.random.default_rng(seed)
    tier = MemTier(L, E)
    store = ExpertStore(tier, StoreConfig(budget=budget, check=True, loader_threads=2, policy=policy, early=early))
    total = 0
    try:
        for _step in range(8):
            store.begin_step()
            hot = rng.choice(E, size=2, replace=False)  # two experts of each layer used often, the rest now and then
            acc = [(lay, sorted(set(hot.tolist()) | set(np.flatnonzero(rng.random(E) < 0.3).tolist())))
                   for lay in range(L)]
            run_accesses(store, L, E, acc)
            total += sum(len(x) for _, x in acc)
            assert not store.ready[store.slots.staged].any() and not store.slots.staged.any()
            store.end_step()
        st_ = store.stats
        assert st_["max_occupied"] <= budget and st_["hits"] + st_["misses"] == total
        assert len(tier.reads) == st_["misses"]  # a kept-out miss is one read, like any demand load
        assert store.slots.capacity == [budget - 1]
    finally:
        store.close()
