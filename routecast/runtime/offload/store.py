"""The expert store: a fast tier of `budget` expert slots over the slow tier, with a background prefetcher.

Keys are ``layer * E + expert`` (MoE layers 0..L-1). Each slot holds one expert's fused tensors (one pool
tensor [budget, ...] per fused parameter, so the MoE forward computes straight from the pool). A key is
ABSENT, LOADING (a slot is reserved and a reader is filling it) or RESIDENT. Slots are pooled across
layers (ExpertFlow) or split evenly per layer (Cache-MoE); the slot count is fixed when the store is built
and every state change is checked (``check``): occupied slots never exceed the budget of their pool.

One access (``access``) is one MoE layer of one forward step: the union of the experts its tokens route to.
- Real-time correction first: queued prefetches of this layer that the true routing does not use are
  cancelled, and forecast experts of this layer that are resident but unused become the first victims
  (cache/policy.py, ExpertFlow's PLEC correction).
- Hits (RESIDENT) are computed at once; a prefetch still LOADING is waited for ("late"); a miss reserves a
  slot (evicting the policy's victim, never a pinned or loading expert) and is read on demand by the
  loader threads ahead of every queued prefetch, while the hits compute.
- Prefetches (``prefetch``) queue nearest layer first; a prefetch only evicts an expert that ranks below
  it (cache/policy.py), else it is dropped.
Counters: hits, late, misses, prefetches issued / loaded / useful / cancelled / dropped, bytes read,
stall seconds (the compute thread waiting for weights).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from routecast.cache.policy import ExpertPolicy
from routecast.common.errors import ConfigError

ABSENT, LOADING, RESIDENT = 0, 1, 2
_DEMAND = -1.0


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """budget: expert slots in the fast tier (all layers). per_layer: split them evenly per layer.
    loader_threads: background readers (demand loads and prefetches share them, demand first).
    check: verify the whole slot accounting after every change (tests); the occupied count is always asserted."""

    budget: int
    per_layer: bool = False
    loader_threads: int = 2
    check: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ConfigError(f"budget is {self.budget!r} expert slots; expected at least 1.")
        if self.loader_threads < 1:
            raise ConfigError(f"loader_threads is {self.loader_threads}; expected at least 1.")


class ExpertStore:
    """Fast tier of `cfg.budget` slots over `tier` (see the module docstring)."""

    def __init__(self, tier, cfg: StoreConfig) -> None:
        """tier: a slow tier with .layout (num_layers, num_experts, params {name: (shape, dtype)}) and
        read_into(key, dests) (tier.DiskTier; tests use an in-memory one)."""
        lay = tier.layout
        self.tier, self.cfg = tier, cfg
        self.L, self.E = lay.num_layers, lay.num_experts
        n_keys = self.L * self.E
        if cfg.budget > n_keys:
            raise ConfigError(f"budget is {cfg.budget} expert slots; expected at most {n_keys} (all L·E experts).")
        if cfg.per_layer and cfg.budget < self.L:
            raise ConfigError(f"budget of {cfg.budget} slots leaves layers with none when split over {self.L} layers; "
                              f"expected at least {self.L} for per-layer pools.")
        self.pools = {p: torch.empty((cfg.budget, *shape), dtype=dt) for p, (shape, dt) in lay.params.items()}
        n_pools = self.L if cfg.per_layer else 1
        base, extra = divmod(cfg.budget, n_pools)
        caps = [base + (i < extra) for i in range(n_pools)]
        starts = np.concatenate([[0], np.cumsum(caps)])
        self.capacity = caps
        self.free = [list(range(int(starts[i + 1]) - 1, int(starts[i]) - 1, -1)) for i in range(n_pools)]
        self.policies = [ExpertPolicy() for _ in range(n_pools)]
        self.state = np.zeros(n_keys, np.int8)
        self.slot_of = np.full(n_keys, -1, np.int64)
        self.key_of = np.full(cfg.budget, -1, np.int64)
        self.pins = np.zeros(n_keys, np.int64)
        self.prefetched = np.zeros(n_keys, bool)  # loaded by a prefetch and not used yet
        self.events: dict[int, threading.Event] = {}
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.jobs: list[tuple[float, int, int, int]] = []  # (priority, seq, key, slot or -1)
        self.queued: dict[int, int] = {}  # key -> seq of its live queued prefetch
        self.forecast: dict[int, set[int]] = {}  # layer -> keys forecast for it in this step
        self.seq = 0
        self.stats = dict(hits=0, late=0, misses=0, prefetch_issued=0, prefetch_loaded=0, prefetch_useful=0,
                          prefetch_cancelled=0, prefetch_dropped=0, evictions=0, mispredicted=0, stall_s=0.0,
                          accesses=0, max_occupied=0)
        self.error: BaseException | None = None
        self._stop = False
        self.threads = [threading.Thread(target=self._worker, daemon=True, name=f"offload-loader-{i}")
                        for i in range(cfg.loader_threads)]
        for t in self.threads:
            t.start()

    # ------------------------------------------------------------------ bookkeeping
    def pool_of(self, key: int) -> int:
        return key // self.E if self.cfg.per_layer else 0

    def _pinned(self, key: int) -> bool:
        return self.pins[key] > 0 or self.state[key] == LOADING

    def check(self) -> None:
        """Assert the slot accounting: occupied slots <= each pool's capacity (the budget), maps consistent."""
        occupied = np.flatnonzero(self.state != ABSENT)
        assert len(occupied) <= self.cfg.budget, f"{len(occupied)} experts occupy slots; budget {self.cfg.budget}"
        assert len(occupied) + sum(len(f) for f in self.free) == self.cfg.budget, "slot leak"
        assert int(np.count_nonzero(self.key_of >= 0)) == len(occupied), "slot map size"
        assert np.all(self.key_of[self.slot_of[occupied]] == occupied), "slot map mismatch"
        if self.cfg.per_layer:
            per = np.bincount(occupied // self.E, minlength=self.L)
            assert np.all(per <= np.asarray(self.capacity)), f"per-layer occupancy {per} over {self.capacity}"
        for p, pol in enumerate(self.policies):
            assert len(pol) == sum(1 for k in occupied if self.pool_of(int(k)) == p), "policy out of sync"

    def _take_slot(self, key: int, below: tuple[int, int] | None) -> int:
        """A free or freed slot of key's pool for key (evicting the policy's victim), -1 if none may be freed."""
        p = self.pool_of(key)
        if self.free[p]:
            return self.free[p].pop()
        victim = self.policies[p].victim(self._pinned, below)
        if victim < 0:
            return -1
        slot = int(self.slot_of[victim])
        self.policies[p].remove(victim)
        self.state[victim] = ABSENT
        self.slot_of[victim] = -1
        self.key_of[slot] = -1
        self.prefetched[victim] = False
        self.stats["evictions"] += 1
        return slot

    def _reserve(self, key: int, slot: int) -> threading.Event:
        self.state[key] = LOADING
        self.slot_of[key] = slot
        self.key_of[slot] = key
        self.policies[self.pool_of(key)].admit(key)
        ev = self.events[key] = threading.Event()
        occ = int(np.count_nonzero(self.state))
        assert occ <= self.cfg.budget, f"{occ} experts occupy slots; the budget is {self.cfg.budget}"
        self.stats["max_occupied"] = max(self.stats["max_occupied"], occ)
        return ev

    def _push(self, prio: float, key: int, slot: int, wake: bool = True) -> int:
        self.seq += 1
        heapq.heappush(self.jobs, (prio, self.seq, key, slot))
        if wake:
            self.cond.notify()
        return self.seq

    # ------------------------------------------------------------------ loader threads
    def _worker(self) -> None:
        while True:
            with self.cond:
                while not self.jobs and not self._stop:
                    self.cond.wait()
                if self._stop:
                    return
                prio, seq, key, slot = heapq.heappop(self.jobs)
                if slot < 0:  # a prefetch: still wanted, still absent, and a slot it may take?
                    if self.queued.get(key) != seq:
                        continue
                    del self.queued[key]
                    if self.state[key] != ABSENT:
                        continue
                    slot = self._take_slot(key, (2, -int(key // self.E)))
                    if slot < 0:
                        self.stats["prefetch_dropped"] += 1
                        continue
                    self._reserve(key, slot)
                    self.prefetched[key] = True
                    if self.cfg.check:
                        self.check()
                ev = self.events[key]
            try:
                self.tier.read_into(key, {p: t[slot] for p, t in self.pools.items()})
            except BaseException as e:  # surfaced to the compute thread, never swallowed
                self.error = e
            with self.cond:
                self.state[key] = RESIDENT
                if prio != _DEMAND:
                    self.stats["prefetch_loaded"] += 1
                ev.set()
                self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self._stop = True
            self.cond.notify_all()
        for t in self.threads:
            t.join()

    def preload(self, keys: Sequence[int] | np.ndarray) -> None:
        """Read `keys` into free slots now, on the calling thread (a warm fast tier before a timed run; keys
        beyond the free slots are skipped). Not counted as accesses, hits or prefetches."""
        with self.cond:
            for k in np.asarray(keys, np.int64).tolist():
                p = self.pool_of(k)
                if self.state[k] != ABSENT or not self.free[p]:
                    continue
                slot = self.free[p].pop()
                ev = self._reserve(k, slot)
                self.tier.read_into(k, {n: t[slot] for n, t in self.pools.items()})
                self.state[k] = RESIDENT
                ev.set()

    # ------------------------------------------------------------------ prefetch and correction
    def prefetch(self, layers: Sequence[int], keys_by_layer: Sequence[np.ndarray], current_layer: int = -1) -> None:
        """Queue the forecast experts of `layers` (nearest first: priority = layers ahead of current_layer);
        they are protected from eviction until their layer's routing arrives or the step ends."""
        with self.cond:
            for layer, keys in zip(layers, keys_by_layer, strict=True):
                ks = np.asarray(keys, np.int64)
                self.forecast.setdefault(int(layer), set()).update(ks.tolist())
                self.policies[0 if not self.cfg.per_layer else int(layer)].mark_predicted_at(ks.tolist(), int(layer))
                prio = float(layer - current_layer)
                for k in ks[self.state[ks] == ABSENT].tolist():
                    if k not in self.queued:
                        self.queued[k] = self._push(prio, k, -1, wake=False)
                        self.stats["prefetch_issued"] += 1
            if self.jobs:  # one wake-up per forecast, not per expert (each costs a GIL hand-over)
                self.cond.notify(len(self.threads))

    def _correct(self, layer: int, used: set[int]) -> None:
        """Layer `layer`'s true routing arrived: cancel its wrong queued prefetches, demote its wrong residents."""
        keys = self.forecast.pop(layer, set())
        for k in keys - used:
            if self.queued.pop(k, None) is not None:
                self.stats["prefetch_cancelled"] += 1
        pol = self.policies[layer if self.cfg.per_layer else 0]
        self.stats["mispredicted"] += len(pol.mark_spent(keys, used))

    def end_step(self) -> None:
        """The forward step finished: queued prefetches and forecast marks of the step are dropped."""
        with self.cond:
            self.stats["prefetch_cancelled"] += len(self.queued)
            self.queued.clear()
            self.forecast.clear()
            for pol in self.policies:
                pol.end_step()

    # ------------------------------------------------------------------ the access
    def access(self, layer: int, experts: Sequence[int] | np.ndarray,
               compute: Callable[[np.ndarray, np.ndarray], None]) -> None:
        """Make `experts` (ascending ids) of `layer` available and call compute(experts_n, slots_n) on ready
        groups of them (hits first, then loaded misses); every expert is computed exactly once. compute runs
        with the store's lock held (so its slots cannot be evicted meanwhile): it should only copy them out.

        Vectorised over the layer's experts: one state lookup, one pin update and one touch pass per group."""
        keys = np.asarray(experts, np.int64) + layer * self.E
        pol = self.policies[self.pool_of(int(keys[0]))] if len(keys) else None
        with self.cond:
            self.stats["accesses"] += 1
            if self.forecast:
                self._correct(layer, set(keys.tolist()))
            todo = keys
            first = True
            while len(todo):
                st = self.state[todo]
                have = todo[st != ABSENT]
                ready, wait, later = todo[st == RESIDENT], todo[st == LOADING], todo[st == ABSENT]
                if first:
                    self.stats["hits"] += len(ready)
                    self.stats["late"] += len(wait)
                    self.stats["misses"] += len(later)
                    self.stats["prefetch_useful"] += int(np.count_nonzero(self.prefetched[have]))
                self.prefetched[have] = False
                for k in have.tolist():  # in ascending order, as the replay kernel touches its hits
                    pol.touch(k)
                self.pins[todo] += 1
                waiting = [wait]
                for k in later.tolist():  # misses: a slot now (demand loads go before every queued prefetch)
                    self.queued.pop(k, None)
                    slot = self._take_slot(k, None)
                    if slot >= 0:
                        self._reserve(k, slot)
                        self._push(_DEMAND, k, slot, wake=False)
                    if self.cfg.check:
                        self.check()
                if len(later):
                    self.cond.notify(len(self.threads))
                    loading = later[self.state[later] != ABSENT]
                    waiting.append(loading)
                    deferred = later[self.state[later] == ABSENT]
                    self.pins[deferred] -= 1
                else:
                    deferred = later
                wait = np.sort(np.concatenate(waiting)) if len(waiting) > 1 else wait
                first = False
                if len(ready):
                    self._compute(ready, compute)
                    self.pins[ready] -= 1
                if len(wait):
                    self.cond.release()
                    try:
                        t0 = time.perf_counter()
                        for k in wait.tolist():
                            self.events[k].wait()
                        self.stats["stall_s"] += time.perf_counter() - t0
                    finally:
                        self.cond.acquire()
                    try:
                        if self.error is not None:
                            raise self.error
                        self._compute(wait, compute)
                    finally:
                        self.pins[wait] -= 1
                elif len(deferred) and not len(ready):  # every slot is loading a prefetch: wait for one
                    t0 = time.perf_counter()
                    self.cond.wait(timeout=0.05)
                    self.stats["stall_s"] += time.perf_counter() - t0
                todo = deferred

    def _compute(self, keys: np.ndarray, compute: Callable[[np.ndarray, np.ndarray], None]) -> None:
        compute(keys % self.E, self.slot_of[keys])

    def resident_keys(self) -> np.ndarray:
        with self.lock:
            return np.flatnonzero(self.state == RESIDENT)
