"""The expert store: a fast tier of `budget` expert slots over the slow tier, with background loader threads.

Keys are ``layer * E + expert`` (MoE layers 0..L-1). Each slot holds one expert's fused tensors (one pool
tensor [budget, ...] per fused parameter, so the MoE forward computes straight from the pool).

Which experts hold slots is decided by cache/slots.py's SlotCache, on the compute thread, from the accesses and
forecasts alone: the same object drives the Python replay (``cache.slots.replay_slots``), so the runtime's hit
ratio equals the replay's for the same access log and forecast sets, whatever the threads do. This file adds
the data side: a reserved slot is filled by a loader thread or, with StoreConfig.reader 'process', by a reader
process writing into shared-memory pools (reader.py: the compute thread collects its completions when it needs a
slot; late prefetches and cancellations are messages to it). Demand loads go first, then prefetches nearest layer
first (a layer-ahead forecast made before the running layer's access is read only after that access's demand
loads are queued, ``prefetch(hold=True)``, as the replay times it); an access computes the experts whose weights
are in their slots at once and waits for the rest.
- A hit whose prefetch is still queued or being read is a *late prefetch*: it is waited for (no second read; a
  queued one jumps to the front of the queue) and counted in ``late``; the wait is stall time.
- A miss reserves a slot (evicting the policy's victim) and is read on demand; the layer computes once all of
  its experts are in their slots (straight from the slot pool: no copy, no scratch memory beyond the budget).
- NAME+bypass: a miss the policy keeps out is read into a staging slot of the budget, computed from it and
  forgotten when SlotCache.unpin gives the slot back (its ready flag cleared, as for an eviction).
- Real-time correction: a prefetch of this layer that the routing does not use and nothing used yet gives its
  slot back, and its read is skipped if it has not started (``reads_skipped``).
- An evicted or released key's queued read is skipped; a slot still being written by an old read is reused
  only when that read ends.
Counters: SlotCache's (hits, misses, prefetches issued / useful / cancelled / dropped, evictions, ...) plus
late, prefetch_loaded, reads_skipped and stall seconds (the compute thread waiting for weights).
"""

from __future__ import annotations

import heapq
import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from routecast.cache.slots import Load, SlotCache
from routecast.cache.zoo import ADMIT, BYPASS, BYPASSES, DESCRIBE
from routecast.common.errors import ConfigError
from routecast.runtime.offload import reader_child as RC
from routecast.runtime.offload.reader import ProcessReader, process_reader_fits

_DEMAND = -1.0


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """budget: expert slots in the fast tier (all layers). per_layer: split them evenly per layer.
    loader_threads: background readers (demand loads and prefetches share them, demand first).
    check: verify the whole slot accounting after every change (tests); the occupied count is always asserted.
    depth: a forecast expert reserves its slot (and is read) at most this many layers ahead of the running one.
    keep_per_layer: never evict from a layer holding this many experts or fewer (the fallback's top-k).
    policy: the slots' replacement policy (cache/zoo.py RUNTIME_POLICIES: the replay's own objects).
    early: an access computes its hits already in their slots while its misses are read, then the rest (the
    replay's timing, cache.slots.replay_slots); the compute callback then runs in two rounds, its sums in another
    order (allclose, not bit-identical). Off: one round once every expert of the layer is in (the engine's exact
    logits).
    reader: 'threads' (loader threads of this process), 'process' (loader_threads reader processes, reader.py:
    no GIL shared with the compute thread; a tier read from disk only) or 'auto' (process where that runs: a tier read
    from disk on Linux; else threads)."""

    budget: int
    per_layer: bool = False
    loader_threads: int = 2
    check: bool = False
    depth: int = 1
    keep_per_layer: int = 0
    policy: str = "lru"
    early: bool = False
    reader: str = "threads"

    def __post_init__(self) -> None:
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ConfigError(f"budget is {self.budget!r} expert slots; expected at least 1.")
        if self.loader_threads < 1:
            raise ConfigError(f"loader_threads is {self.loader_threads}; expected at least 1.")
        if self.reader not in READERS:
            raise ConfigError(f"reader is {self.reader!r}; expected one of {', '.join(READERS)}.")
        check_runtime_policy(self.policy)


READERS = ("threads", "process", "auto")
RUNTIME_POLICIES = (*DESCRIBE, *(b + BYPASS for b in BYPASSES))  # the policy objects of cache/zoo.py; +admit runs
# in the replay only


def check_runtime_policy(name: str) -> None:
    """--policy NAME for the runtime: a cache/zoo.py policy object, +bypass included (prefetch admission, NAME+admit,
    is timed by the replay's link model and is not run here)."""
    if name.endswith(ADMIT) and name.removesuffix(ADMIT) in RUNTIME_POLICIES:
        raise ConfigError(f"--policy is {name!r}; prefetch admission (+admit) runs in `routecast cache replay` only; "
                          f"expected one of {', '.join(RUNTIME_POLICIES)}.")
    if name not in RUNTIME_POLICIES:
        raise ConfigError(f"--policy is {name!r}; expected one of {', '.join(RUNTIME_POLICIES)}.")


class ExpertStore:
    """Fast tier of `cfg.budget` slots over `tier` (see the module docstring)."""

    def __init__(self, tier, cfg: StoreConfig) -> None:
        """tier: a slow tier with .layout (num_layers, num_experts, params {name: (shape, dtype)}) and
        read_into(key, dests) (tier.DiskTier, gpu.PinnedTier; tests use an in-memory one), and optionally
        pool(n, shape, dtype) making the slot pools (default: page-aligned host memory)."""
        lay = tier.layout
        self.tier, self.cfg = tier, cfg
        self.L, self.E = lay.num_layers, lay.num_experts
        self.slots = SlotCache(self.L, self.E, cfg.budget, cfg.per_layer, cfg.depth, cfg.keep_per_layer, cfg.policy)
        n_keys = self.L * self.E
        self._maps: list[mmap.mmap] = []
        proc = cfg.reader == "process" or (cfg.reader == "auto" and process_reader_fits(tier))
        self.proc = ProcessReader(tier, cfg.loader_threads) if proc else None
        make = self.proc.pool if self.proc is not None else getattr(tier, "pool", self._pool)  # a tier with its own
        self.pools = {p: make(cfg.budget, shape, dt) for p, (shape, dt) in lay.params.items()}  # memory makes them
        # a tier that takes byte arrays is given flat uint8 numpy views of a slot (cheaper on the loader threads)
        self._bytes = {p: t.view(torch.uint8).numpy().reshape(cfg.budget, -1) for p, t in self.pools.items()} \
            if getattr(tier, "accepts_bytes", False) else None
        self.ready = np.zeros(n_keys, bool)  # the holder's weights are in its slot
        self.load_id = np.zeros(n_keys, np.int64)  # bumped when a key (re)reserves or loses its slot
        self.job_seq = np.zeros(n_keys, np.int64)  # the seq of the key's live queued read
        self.writing = np.zeros(cfg.budget, bool)  # a read is filling the slot
        self.by_prefetch = np.zeros(n_keys, bool)  # the key's current read was issued by a prefetch
        self.events: dict[int, threading.Event] = {}
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.jobs: list[tuple[float, int, int, int, int]] = []  # (priority, seq, key, slot, load id)
        self.held: list[tuple[float, int, int, int]] = []  # (priority, key, slot, load id): queued at the next access
        self.seq = 0
        self.stats = self.slots.stats
        self.stats.update(late=0, prefetch_loaded=0, reads_skipped=0, stall_s=0.0)
        self.error: BaseException | None = None
        self._stop = False
        self.inflight: dict[int, tuple[int, int, int]] = {}  # reader processes: seq -> (key, load id, slot)
        self.threads = [] if self.proc is not None else [
            threading.Thread(target=self._worker, daemon=True, name=f"offload-loader-{i}")
            for i in range(cfg.loader_threads)]
        for t in self.threads:
            t.start()
        if self.proc is not None:
            self.proc.start(list(lay.params))

    def _pool(self, n: int, shape: tuple[int, ...], dt: torch.dtype) -> torch.Tensor:
        """[n, *shape] of dt on page-aligned anonymous memory: a slot whose size is a whole number of pages starts
        on a page, so the tier can read an aligned expert straight into it with O_DIRECT (no copy)."""
        nbytes = n * int(np.prod(shape)) * torch.empty((), dtype=dt).element_size()
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)  # pages faulted in now,
        buf = mmap.mmap(-1, max(nbytes, 1), flags=flags)  # not on the first read into each slot during the run
        self._maps.append(buf)
        return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes).view(dt).view(n, *shape)

    @property
    def capacity(self) -> list[int]:
        return self.slots.capacity

    def check(self) -> None:
        """Assert the slot accounting (SlotCache.check): held keys <= each pool's capacity, maps consistent."""
        with self.lock:
            self.slots.check()

    # ------------------------------------------------------------------ loader threads
    def _push(self, prio: float, key: int, slot: int) -> None:
        self.seq += 1
        self.job_seq[key] = self.seq
        if self.proc is not None:
            self.inflight[self.seq] = (key, int(self.load_id[key]), slot)
            self.proc.submit(self.seq, key, slot, prio)
            return
        heapq.heappush(self.jobs, (prio, self.seq, key, slot, int(self.load_id[key])))

    def _issue(self, loads: list[Load], prio_of: Callable[[int], float], prefetch: bool = False,
               hold: bool = False) -> None:
        """Reserved slots -> queued reads (hold: kept back until the next access has queued its own, _release);
        an evicted key's queued read goes stale."""
        for key, slot, victim in loads:
            if victim >= 0:
                self._lose(victim)
            self.load_id[key] += 1
            self.ready[key] = False
            self.by_prefetch[key] = prefetch
            if self.proc is None:  # reader processes: the compute thread polls their completions instead
                self.events[key] = threading.Event()
            if hold:
                self.held.append((prio_of(key), key, slot, int(self.load_id[key])))
            else:
                self._push(prio_of(key), key, slot)
        if loads and not hold:
            self.cond.notify(len(self.threads))
        if self.proc is not None:
            self.proc.flush()
        if self.cfg.check:
            self.slots.check()

    def _release(self) -> None:
        """Held reads -> the queue, behind the demand loads already there (a key that lost its slot meanwhile is
        skipped: its read never started)."""
        for prio, key, slot, lid in self.held:
            if self.load_id[key] == lid and not self.ready[key]:
                self._push(prio, key, slot)
            else:
                self.stats["reads_skipped"] += 1
        if self.held:
            self.held = []
            self.cond.notify(len(self.threads))
        if self.proc is not None:
            self.proc.flush()

    def _lose(self, key: int) -> None:
        """key left its slot: a read not started is skipped, one in progress is discarded when it ends."""
        if not self.ready[key] and self.job_seq[key] > 0:
            if self.proc is not None:  # counted skipped when the reader says it had not started
                seq = int(self.job_seq[key])
                self.proc.cancel(seq, self.inflight[seq][2])
            else:
                self.stats["reads_skipped"] += 1
            self.job_seq[key] = 0
        self.load_id[key] += 1
        self.ready[key] = False

    def _worker(self) -> None:
        while True:
            with self.cond:
                while True:
                    while not self.jobs and not self._stop:
                        self.cond.wait()
                    if self._stop:
                        return
                    prio, seq, key, slot, lid = heapq.heappop(self.jobs)
                    if self.job_seq[key] != seq or self.load_id[key] != lid:
                        continue  # stale: skipped, or re-queued ahead (late prefetch)
                    while self.writing[slot]:  # an old read still fills this slot
                        self.cond.wait()
                    if self.job_seq[key] == seq and self.load_id[key] == lid:
                        break
                self.job_seq[key] = 0
                self.writing[slot] = True
            try:
                self.tier.read_into(key, self.slot_dests(slot))
            except BaseException as e:  # surfaced to the compute thread, never swallowed
                self.error = e
            with self.cond:
                self.writing[slot] = False
                if self.load_id[key] == lid:
                    self.ready[key] = True
                    self.events[key].set()
                    if self.by_prefetch[key]:
                        self.stats["prefetch_loaded"] += 1
                self.cond.notify_all()

    def _collect(self, block: bool = False) -> None:
        """Reader processes: apply their completions (block: wait for at least one). Lock held."""
        for seq, status, a, b, c in self.proc.poll(block):
            key, lid, _slot = self.inflight.pop(seq)
            if self.job_seq[key] == seq:
                self.job_seq[key] = 0
            if status == RC.SKIPPED:
                self.stats["reads_skipped"] += 1
            elif status == RC.SHORT:
                raise ConfigError(f"checkpoint: read of expert {key} returned {a} of {b} bytes; the file is truncated.")
            elif status == RC.OSERR:
                raise OSError(a, f"reading expert {key}: {os.strerror(a)}")
            else:
                self.tier.add_read(a, b * 1e-9, c)
                if self.load_id[key] == lid:
                    self.ready[key] = True
                    if self.by_prefetch[key]:
                        self.stats["prefetch_loaded"] += 1

    def _await(self, keys: list[int]) -> None:
        """Wait until every key of `keys` is in its slot."""
        if self.proc is None:
            for k in keys:
                self.events[k].wait()
            return
        with self.lock:
            while not all(self.ready[k] for k in keys):
                self._collect(block=True)

    def slot_dests(self, slot: int) -> dict:
        """Slot `slot`'s tensors by parameter name (what a read of an expert into that slot fills)."""
        pools = self._bytes if self._bytes is not None else self.pools
        return {p: t[slot] for p, t in pools.items()}

    def drain(self) -> None:
        """Wait until every queued read (a live one: not skipped) has landed in its slot."""
        with self.cond:
            self._release()
            while self.proc is not None and self.inflight:
                self._collect(block=True)
            while self.writing.any() or any(self.job_seq[k] == sq and self.load_id[k] == lid
                                            for _, sq, k, _, lid in self.jobs):
                if self.error is not None:
                    raise self.error
                self.cond.wait(0.05)

    def close(self) -> None:
        with self.cond:
            self._stop = True
            self.cond.notify_all()
        for t in self.threads:
            t.join()
        if self.proc is not None:
            self.proc.close()

    def preload(self, keys: Sequence[int] | np.ndarray) -> None:
        """Read `keys` into free slots now, on the calling thread (a warm fast tier before a timed run; keys
        beyond the free slots are skipped). Not counted as accesses, hits or prefetches."""
        with self.cond:
            for k in np.asarray(keys, np.int64).tolist():
                p = self.slots.pool_of(k)
                if self.slots.held[k] or not self.slots.free[p]:
                    continue
                slot = self.slots.free[p].pop()
                self.slots._reserve(k, slot)
                self.tier.read_into(k, self.slot_dests(slot))
                self.ready[k] = True
                self.events[k] = threading.Event()
                self.events[k].set()

    # ------------------------------------------------------------------ prefetch
    def prefetch(self, layers: Sequence[int], keys_by_layer: Sequence[np.ndarray], current_layer: int = -1,
                 hold: bool = False, running: Sequence[int] = ()) -> None:
        """Forecast keys of `layers` reserve their slots (SlotCache.prefetch: now up to `depth` layers ahead, the rest
        as the layers run); their reads queue nearest layer first (priority = layers ahead of the running one).
        hold: a layer-ahead forecast made before `current_layer`'s own access (PROBE's lookahead inside its MoE
        block): the slots are reserved now (the replay's decision order) but the reads queue only once that access
        has queued its demand loads, so a forecast never delays the layer that is running (the replay's timing).
        running: that access's keys, which these reservations never evict (SlotCache.prefetch)."""
        with self.cond:
            loads = self.slots.prefetch(layers, keys_by_layer, current_layer, running)
            self._issue(loads, lambda k: float(k // self.E - current_layer), prefetch=True, hold=hold)

    def begin_step(self, requests: np.ndarray | None = None, forecast_LE: np.ndarray | None = None,
                   reuse_RLK: np.ndarray | None = None, upcoming=None, next_use=None, tokens=None) -> None:
        """A forward step starts: its requests, forecast sets, reuse forecasts, the schedule's next steps, the
        requests' next-token forecasts and tokens in the step go to the policies that use them (fc-evict)."""
        with self.cond:
            self.slots.begin_step(requests, forecast_LE, reuse_RLK, upcoming, next_use, tokens)

    def reuse_row(self, layer: int, logd_RK: np.ndarray) -> None:
        """A reuse probe's row of `layer`, computed inside that layer's MoE block, to the policies (fc-evict)."""
        with self.cond:
            self.slots.reuse_row(layer, logd_RK)

    def end_step(self, observed=None) -> None:
        """The forward step finished: its forecast marks are dropped (reads already issued go on); observed (a
        cache.reuse.StepUse, the step's routing per request) updates the policies' request profiles."""
        with self.cond:
            self._release()
            self.slots.end_step(observed)

    # ------------------------------------------------------------------ the access
    def access(self, layer: int, experts: Sequence[int], compute: Callable[[np.ndarray, np.ndarray], None],
               counts: np.ndarray | None = None) -> None:
        """Make `experts` (ascending ids) of `layer` available and call compute(experts_n, slots_n) once per round
        with every expert of the round in its slot (ascending ids; slots valid during the call): one round when the
        layer's experts fit their pool, more when misses were deferred (each round's slots are released after it).
        counts: the tokens routed to each expert, for the policies (SlotCache.access)."""
        keys = [layer * self.E + int(e) for e in experts]
        with self.cond:
            if self.proc is not None:
                self._collect()
            released, hits, loads, deferred, later = self.slots.access(layer, keys, counts)
            for k in released:
                self._lose(k)
            wait = [k for k in hits if not self.ready[k]]
            self.stats["late"] += len(wait)
            for k in wait:
                if self.job_seq[k] > 0:  # queued, not started: it goes before every prefetch now
                    if self.proc is not None:
                        self.proc.bump(int(self.job_seq[k]), int(self.slots.slot_of[k]), _DEMAND)
                    else:
                        self._push(_DEMAND, k, int(self.slots.slot_of[k]))
            self._issue(loads, lambda k: _DEMAND)
            self._issue(later, lambda k: float(k // self.E - layer), prefetch=True)
            self._release()  # a forecast made before this access reads after its demand loads
            wait += [k for k, _, _ in loads]
            group = hits + [k for k, _, _ in loads]
            first = sorted(set(hits) - set(wait)) if self.cfg.early and wait else []
            if first:  # the resident hits, computed while the misses are read (cfg.early); the rest once read
                slots = self.slots.slot_of[np.asarray(first, np.int64)].copy()
                group = list(wait)
        if first:
            self._run(first, slots, compute)
            with self.cond:
                for k in self.slots.unpin(first):
                    self._lose(k)
        while True:
            if wait:
                t0 = time.perf_counter()
                self._await(wait)
                self.stats["stall_s"] += time.perf_counter() - t0
                if self.error is not None:
                    raise self.error
            group = sorted(group)
            with self.lock:
                slots = self.slots.slot_of[np.asarray(group, np.int64)].copy()
            self._run(group, slots, compute)
            with self.cond:
                for k in self.slots.unpin(group):  # a staging slot given back (+bypass): its weights are gone
                    self._lose(k)
                if not deferred:
                    return
                loads, deferred = self.slots.next_round(deferred)
                self._issue(loads, lambda k: _DEMAND)
                group = wait = [k for k, _, _ in loads]

    def _run(self, keys: list[int], slots: np.ndarray, compute: Callable[[np.ndarray, np.ndarray], None]) -> None:
        compute(np.asarray(keys, np.int64) % self.E, slots)

    def held_experts(self, layer: int) -> tuple[np.ndarray, bool]:
        """(bool (E,) the experts of `layer` that hold a slot (resident or with a read under way), whether the
        layer's pool has no free slot)."""
        with self.lock:
            if self.proc is not None:
                self._collect()
            full = not self.slots.free[self.slots.pool_of(layer * self.E)]
            return self.slots.held[layer * self.E:(layer + 1) * self.E].copy(), full

    def resident_keys(self) -> np.ndarray:
        """Keys whose weights are in their slots now."""
        with self.lock:
            if self.proc is not None:
                self._collect()
            return np.flatnonzero(self.slots.held & self.ready)
