"""Fast-tier slot accounting decided from accesses and forecasts alone: one object for the runtime and the replay.

``SlotCache`` decides which experts hold the `budget` fast-tier slots; it never looks at a clock or a thread,
so the offload runtime (runtime/offload/store.py, which reads the weights on loader threads) and the Python
replay below (``replay_slots``) make the same decisions for the same accesses and forecasts. Keys are
``layer * E + expert``; slots are pooled across layers (ExpertFlow) or split evenly per layer (Cache-MoE).

Hit definition (both sides): a required (access, expert) pair is a **hit** when the expert holds a slot when its
layer's router asks: resident, or reserved by a prefetch issued earlier whose read may still be in flight. The
runtime waits for such a *late prefetch* (no second read; the wait is stall time, measured) and counts it
apart (``late``); whether a prefetch is late depends on timing, whether it is a hit does not. A **miss**
reserves a slot at that moment (a demand load).

Decisions, in call order:
- ``prefetch(layers, keys)``: forecast keys are marked (protected, PLEC) and every one without a slot reserves
  one at once, nearest layer first, evicting only a key that ranks below it (cache/policy.py); else dropped.
- ``access(layer, keys)``: real-time correction first: a forecast key of this layer that the routing does not
  use and that a prefetch reserved but nothing used yet is released (its read is cancelled), other unused
  forecast keys become first victims; then hits are touched, and misses reserve slots (any unpinned victim).
  All of the access's slot holders are pinned; misses that find every slot pinned (an access's union larger
  than its pool) are deferred: ``next_round`` serves them once the caller has computed and ``unpin``-ed the
  previous group.
- ``NAME+bypass`` (zoo.BYPASSES): the policies share the budget less zoo.STAGING slots; a demand miss in a full
  pool that the policy keeps out (``keeps_out(miss, victim)``) evicts nothing and holds a staging slot until the
  caller computes it (``unpin`` gives the slot back and returns the key); with the staging slots in use it is
  deferred to the next round, as cache/objreplay.py times it.
- ``end_step()``: the step's forecast marks are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from routecast.cache.policy import BasePolicy
from routecast.cache.reuse import StepUse
from routecast.cache.zoo import STAGING, bypasses, make_policy
from routecast.common.errors import ConfigError

Load = tuple[int, int, int]  # (key, slot, evicted key or -1)
STAGED = -2  # _take_slot's victim for a miss read into a staging slot (+bypass): nothing evicted


class SlotCache:
    """`budget` expert slots over L·E keys (see the module docstring). ``stats``: hits, misses, accesses,
    prefetch_issued / useful / cancelled / dropped, evictions, mispredicted, max_occupied."""

    def __init__(self, L: int, E: int, budget: int, per_layer: bool = False, depth: int = 1,
                 keep_per_layer: int = 0, policy: str = "lru") -> None:
        """keep_per_layer: a victim is never taken from a layer holding this many experts or fewer (eMoE's
        fallback needs top-k experts of every layer once warm); needs budget >= L * keep_per_layer.
        policy: the replacement policy object of each pool (cache/zoo.py: lru, lfu, arc, s3fifo, lirs, fc-evict)."""
        n_keys = L * E
        if budget > 0 and keep_per_layer * L > budget:
            raise ConfigError(f"budget is {budget} expert slots; the fallback keeps {keep_per_layer} per layer, "
                              f"expected at least {keep_per_layer * L}.")
        if depth < 1:
            raise ConfigError(f"prefetch depth is {depth}; expected at least 1 layer ahead.")
        if not isinstance(budget, int | np.integer) or budget < 1:
            raise ConfigError(f"budget is {budget!r} expert slots; expected at least 1.")
        if budget > n_keys:
            raise ConfigError(f"budget is {budget} expert slots; expected at most {n_keys} (all L·E experts).")
        if per_layer and budget < L:
            raise ConfigError(f"budget of {budget} slots leaves layers with none when split over {L} layers; "
                              f"expected at least {L} for per-layer pools.")
        self.L, self.E, self.budget, self.per_layer, self.depth = L, E, int(budget), per_layer, depth
        n_pools = L if per_layer else 1
        stage = STAGING if bypasses(policy) else 0
        if stage and (per_layer or self.budget <= stage + keep_per_layer * L):
            raise ConfigError(f"policy {policy}: +bypass keeps {stage} of the {self.budget} slots as staging for the "
                              "misses it does not admit; expected pooled slots (not per-layer) and a budget above that"
                              + (f" plus the fallback's {keep_per_layer * L}." if keep_per_layer else "."))
        base, extra = divmod(self.budget - stage, n_pools)
        self.capacity = [base + (i < extra) for i in range(n_pools)]  # the policies' slots, staging apart
        starts = np.concatenate([[0], np.cumsum(self.capacity)])
        self.free = [list(range(int(starts[i + 1]) - 1, int(starts[i]) - 1, -1)) for i in range(n_pools)]
        self.stage_free = list(range(self.budget - 1, self.budget - stage - 1, -1))  # the last `stage` slots
        self.staged = np.zeros(n_keys, bool)  # holds a staging slot until computed (unpin)
        self.bypass = stage > 0
        self.kept_out: set[int] = set()  # misses kept out, deferred until a staging slot frees
        self.policies: list[BasePolicy] = [make_policy(policy, c, L, E) for c in self.capacity]
        self.held = np.zeros(n_keys, bool)
        self.slot_of = np.full(n_keys, -1, np.int64)
        self.key_of = np.full(self.budget, -1, np.int64)
        self.pins = np.zeros(n_keys, np.int64)
        self.unused_prefetch = np.zeros(n_keys, bool)  # reserved by a prefetch, not used by an access yet
        self.forecast: dict[int, set[int]] = {}  # layer -> keys forecast for it in this step
        self.pending: dict[int, list[int]] = {}  # layer -> forecast keys whose slots are not reserved yet
        self.occupied = 0
        self.keep = keep_per_layer
        self.held_L = np.zeros(L, np.int64)
        self.stats: dict[str, Any] = dict(hits=0, misses=0, accesses=0, prefetch_issued=0, prefetch_useful=0,
                                          prefetch_cancelled=0, prefetch_dropped=0, evictions=0, mispredicted=0,
                                          max_occupied=0, bypassed=0)

    # ------------------------------------------------------------------ slots
    def pool_of(self, key: int) -> int:
        return key // self.E if self.per_layer else 0

    def _take_slot(self, key: int, below: tuple[int, int] | None, stage: bool = False) -> Load:
        """A free slot of key's pool, or the slot of the policy's victim (evicted now); slot -1 if none may go.
        stage (a demand miss under +bypass): when the policy keeps the key out (keeps_out(key, victim)), a staging
        slot and victim STAGED instead, nothing evicted (slot -1 while the staging slots are all in use: the key
        waits for one, kept out, as cache/objreplay.py has it)."""
        p = self.pool_of(key)
        if self.free[p]:
            return key, self.free[p].pop(), -1
        lk = key // self.E  # a key may replace one of its own layer: that layer's count stays

        def kept(k: int) -> bool:
            return self.pins[k] > 0 or (k // self.E != lk and self.held_L[k // self.E] <= self.keep)

        victim = self.policies[p].victim(kept, below, key)
        if victim < 0:
            return key, -1, -1
        if stage and self.policies[p].keeps_out(key, victim):
            self.policies[p].passed(key)
            self.stats["bypassed"] += 1
            return key, self.stage_free.pop() if self.stage_free else -1, STAGED
        slot = self._drop(victim)
        self.stats["evictions"] += 1
        return key, slot, victim

    def _drop(self, key: int) -> int:
        """key gives its slot up -> the slot."""
        slot = int(self.slot_of[key])
        self.policies[self.pool_of(key)].remove(key)
        self.held[key] = False
        self.held_L[key // self.E] -= 1
        self.unused_prefetch[key] = False
        self.key_of[self.slot_of[key]] = -1
        self.slot_of[key] = -1
        self.occupied -= 1
        return slot

    def _reserve(self, key: int, slot: int) -> None:
        self.held[key] = True
        self.held_L[key // self.E] += 1
        self.slot_of[key] = slot
        self.key_of[slot] = key
        self.policies[self.pool_of(key)].admit(key)
        self._occupy()

    def _occupy(self) -> None:
        self.occupied += 1
        assert self.occupied <= self.budget, f"{self.occupied} experts hold slots; the budget is {self.budget}"
        self.stats["max_occupied"] = max(self.stats["max_occupied"], self.occupied)

    def _stage(self, key: int, slot: int) -> None:
        """A miss the policy keeps out holds staging slot `slot` until computed (unpin gives it back)."""
        self.held[key] = self.staged[key] = True
        self.slot_of[key] = slot
        self.key_of[slot] = key
        self._occupy()

    # ------------------------------------------------------------------ decisions
    def prefetch(self, layers: Sequence[int], keys_by_layer: Sequence[np.ndarray], current_layer: int = -1,
                 running: Sequence[int] = ()) -> list[Load]:
        """Forecast `keys_by_layer[i]` (keys of layer layers[i]; nearest layer first) while layer current_layer runs:
        mark them all (PLEC protection); reserve slots for those of layers up to current_layer + depth now, the rest
        when layer (theirs - depth) is accessed -> the loads issued now, in order. running: the keys the running
        layer's router chose, when the forecast comes before its access (PROBE's lookahead inside the MoE block):
        never evicted by these reservations, as the layer is about to compute them."""
        for layer, keys in zip(layers, keys_by_layer, strict=True):
            ks = [int(k) for k in keys]
            self.forecast.setdefault(int(layer), set()).update(ks)
            self.policies[int(layer) if self.per_layer else 0].mark_predicted(ks, lambda k: k // self.E)
            self.pending.setdefault(int(layer), []).extend(ks)
        run = np.asarray(running, np.int64)
        self.pins[run] += 1
        try:
            return self._reserve_pending(current_layer + self.depth)
        finally:
            self.pins[run] -= 1

    def _reserve_pending(self, up_to: int) -> list[Load]:
        """Reserve slots for the pending forecast keys of layers <= up_to, nearest layer first."""
        loads: list[Load] = []
        for layer in sorted(x for x in self.pending if x <= up_to):
            for k in self.pending.pop(layer):
                if self.held[k] or k not in self.forecast.get(layer, ()):
                    continue
                load = self._take_slot(k, (2, -layer))
                if load[1] < 0:
                    self.stats["prefetch_dropped"] += 1
                    continue
                self._reserve(k, load[1])
                self.unused_prefetch[k] = True
                self.stats["prefetch_issued"] += 1
                loads.append(load)
        return loads

    def access(self, layer: int, keys: Sequence[int], counts: np.ndarray | None = None,
               ) -> tuple[list[int], list[int], list[Load], list[int], list[Load]]:
        """Layer `layer`'s router asks for `keys` (distinct) -> (released, hits, loads, deferred, prefetches): keys
        released by correction (their slots are free), the keys that hold a slot (hits), the misses' demand loads,
        the misses deferred until ``unpin`` of this group, and the pending forecast of layer + depth reserved after
        them. Hits and loaded keys are pinned. counts: the tokens routed to each key, handed to the policies first
        (BasePolicy.routed)."""
        if counts is not None:
            ks = np.asarray(keys, np.int64)
            for pol in self.policies:
                pol.routed(layer, ks, counts)
        used = {int(k) for k in keys}
        released = self._correct(layer, used)
        self.stats["accesses"] += 1
        hits = [int(k) for k in keys if self.held[k]]
        missing = [int(k) for k in keys if not self.held[k]]
        for k in hits:
            self.policies[self.pool_of(k)].touch(k)
            if self.unused_prefetch[k]:
                self.stats["prefetch_useful"] += 1
                self.unused_prefetch[k] = False
            self.pins[k] += 1
        self.stats["hits"] += len(hits)
        self.stats["misses"] += len(missing)
        loads, deferred = self.next_round(missing)
        return released, hits, loads, deferred, self._reserve_pending(layer + self.depth)

    def next_round(self, missing: Sequence[int]) -> tuple[list[Load], list[int]]:
        """Reserve slots for missing keys (demand: any unpinned victim) -> (loads, keys still without a slot)."""
        loads, deferred = [], []
        for k in missing:
            if k in self.kept_out:  # kept out in an earlier round: waits for a staging slot, not asked again
                load = (int(k), self.stage_free.pop(), STAGED) if self.stage_free else (int(k), -1, STAGED)
            else:
                load = self._take_slot(int(k), None, self.bypass)
            if load[1] < 0:
                if load[2] == STAGED:
                    self.kept_out.add(int(k))
                deferred.append(int(k))
                continue
            self.kept_out.discard(int(k))
            if load[2] == STAGED:
                self._stage(int(k), load[1])
                load = (load[0], load[1], -1)
            else:
                self._reserve(int(k), load[1])
            self.pins[k] += 1
            loads.append(load)
        if deferred and not loads and not self.pins.any():
            raise RuntimeError("slot cache: a miss found no slot although nothing is pinned")
        return loads, deferred

    def unpin(self, keys: Sequence[int]) -> list[int]:
        """The caller computed `keys`: they may be evicted again -> the keys that gave a staging slot back (+bypass:
        no longer held; the caller forgets their weights)."""
        out = []
        for k in keys:
            self.pins[k] -= 1
            if self.staged[k] and self.pins[k] == 0:
                slot = int(self.slot_of[k])
                self.held[k] = self.staged[k] = False
                self.key_of[slot], self.slot_of[k] = -1, -1
                self.occupied -= 1
                self.stage_free.append(slot)
                out.append(int(k))
        return out

    def _correct(self, layer: int, used: set[int]) -> list[int]:
        """Real-time correction: release unused prefetch reservations of `layer` that its routing does not use, mark
        the other wrong forecast keys that hold a slot as first victims. -> released keys."""
        keys = self.forecast.pop(layer, set())
        wrong = sorted(keys - used)
        released = [k for k in wrong if self.held[k] and self.unused_prefetch[k]]
        for k in released:
            self.free[self.pool_of(k)].append(self._drop(k))
        pol = self.policies[layer if self.per_layer else 0]
        self.stats["mispredicted"] += len(pol.mark_spent(keys, used))
        self.stats["prefetch_cancelled"] += len(released)
        return released

    def begin_step(self, requests: np.ndarray | None = None, forecast_LE: np.ndarray | None = None,
                   reuse_RLK: np.ndarray | None = None, upcoming: Sequence[np.ndarray] | None = None,
                   next_use: Mapping[int, np.ndarray] | None = None, tokens: np.ndarray | None = None) -> None:
        """A forward step starts: the policies that use them get its requests, forecast sets, reuse forecasts, the
        schedule's next steps, the requests' next-token forecasts and their tokens in the step (fc-evict;
        forecast_evict.ForecastEvictPolicy.begin_step)."""
        for pol in self.policies:
            pol.begin_step(requests, forecast_LE, reuse_RLK, upcoming, next_use, tokens)

    def reuse_row(self, layer: int, logd_RK: np.ndarray) -> None:
        """A reuse probe's row of `layer` for the step's requests (fc-evict: ForecastEvictPolicy.reuse_row)."""
        for pol in self.policies:
            pol.reuse_row(layer, logd_RK)

    def end_step(self, observed: StepUse | None = None) -> None:
        """The forward step finished: its forecast marks are dropped; observed (the step's routing per request)
        updates the policies' request profiles (fc-evict)."""
        self.forecast.clear()
        self.pending.clear()
        for pol in self.policies:
            pol.end_step(observed)

    def check(self) -> None:
        """Assert the slot accounting: held keys <= each pool's capacity (the budget), maps consistent."""
        held = np.flatnonzero(self.held)
        assert len(held) == self.occupied <= self.budget, f"{len(held)} experts hold slots; budget {self.budget}"
        assert len(held) + sum(len(f) for f in self.free) + len(self.stage_free) == self.budget, "slot leak"
        assert np.all(self.key_of[self.slot_of[held]] == held), "slot map mismatch"
        if self.per_layer:
            per = np.bincount(held // self.E, minlength=self.L)
            assert np.all(per <= np.asarray(self.capacity)), f"per-layer occupancy {per} over {self.capacity}"
        for p, pol in enumerate(self.policies):
            assert len(pol) == sum(1 for k in held if self.pool_of(int(k)) == p and not self.staged[k]), \
                "policy out of sync"
            assert len(pol) <= self.capacity[p], f"pool {p} holds {len(pol)} experts; capacity {self.capacity[p]}"


def replay_slots(req_off: np.ndarray, req_key: np.ndarray, L: int, E: int, budget: int, *, per_layer: bool = False,
                 pred_SLE: np.ndarray | None = None, layer_ahead: bool = False, req_comp_s: np.ndarray | None = None,
                 dense_s: float = 0.0, xfer_s: float = 0.0, links: int = 1, depth: int = 1,
                 keep_per_layer: int = 0, policy: str = "lru", requests_S: np.ndarray | None = None,
                 uses: Sequence[StepUse] | None = None, reuse: Sequence[np.ndarray] | None = None,
                 upcoming: Sequence[Sequence[np.ndarray]] | None = None,
                 next_use: Sequence[Mapping[int, np.ndarray]] | None = None,
                 req_count: np.ndarray | None = None) -> dict[str, Any]:
    """Replay accesses (req_off (A+1,), req_key (N,) keys of each access, A = steps·L, step-major) through a
    SlotCache the way the offload runtime drives it -> stats + hit_ratio, late, stall_s, sim_s.

    pred_SLE: bool (S, L, E) forecast sets (engine.pred_sets): request horizon (default) = every layer's set is
    prefetched before layer 0 of its step; layer_ahead = layer l+1's set after layer l's router (PROBE), and layer 0's
    set, if any, at the start of its step (runtime/offload/inblock.py's first-layer forecast).
    Timing (only for the late count and the stall, never for a decision): each access spends dense_s before its
    router, each required expert req_comp_s (N,) seconds of compute; reads take xfer_s on one of `links` readers,
    demand loads and late prefetches first, then prefetches nearest layer first, as the runtime's loader threads.
    depth, keep_per_layer, policy: as SlotCache (the runtime's OffloadConfig; top-k when it runs the fallback).
    requests_S (S,) the request of each step and uses (S StepUse) its routing: given, they reach the policies at
    begin_step / end_step as in the runtime (fc-evict's request profiles); reuse (S arrays (1, L, L·E)): each step's
    reuse probe forecast for its request, given to begin_step with it; upcoming (S): each step's schedule of the
    steps after it (fc-evict's begin_step(upcoming=...)), given with requests_S; next_use (S): each step's requests'
    next-token forecasts (begin_step(next_use=...): the waiting ones' with upcoming, the running one's own input
    tokens'), given with requests_S; each step's token count (begin_step(tokens=...)) is its StepUse's, with uses.
    req_count (N,): the tokens routed to each required key, handed to the policies with the access (SlotCache.access
    counts: fc-evict folds a prefill's routing layer by layer), as the runtime does.
    """
    import heapq

    A = len(req_off) - 1
    if A % L:
        raise ConfigError(f"the accesses are {A}, not a whole number of {L}-layer steps.")
    S = A // L
    if pred_SLE is not None and pred_SLE.shape != (S, L, E):
        raise ConfigError(f"forecast sets have shape {pred_SLE.shape}; expected ({S}, {L}, {E}).")
    comp = np.zeros(len(req_key)) if req_comp_s is None else np.asarray(req_comp_s, np.float64)
    sc = SlotCache(L, E, budget, per_layer, depth, keep_per_layer, policy)
    ready_t = np.zeros(L * E)  # when the current holder's read ends (inf: queued, not started)
    lid = np.zeros(L * E, np.int64)
    jobs: list[tuple[float, int, int, int, float]] = []  # (priority, seq, key, load id, issue time)
    free_t = [0.0] * links
    seq = 0
    late = stall = 0.0
    n_late = 0

    def push(prio: float, key: int, t: float, new: bool) -> None:
        nonlocal seq
        seq += 1
        if new:
            lid[key] += 1
        ready_t[key] = np.inf
        heapq.heappush(jobs, (prio, seq, key, int(lid[key]), t))

    def start_next(until: float) -> bool:
        """Start the next queued read if a reader starts it before `until`; False if none does."""
        while jobs:
            prio, s_, key, lk, t_is = jobs[0]
            if lk != lid[key] or ready_t[key] != np.inf or not sc.held[key]:
                heapq.heappop(jobs)  # stale: evicted, released or already started under a newer priority
                continue
            i = int(np.argmin(free_t))
            start = max(free_t[i], t_is)
            if start >= until:
                return False
            heapq.heappop(jobs)
            ready_t[key] = free_t[i] = start + xfer_s
            return True
        return False

    def issue(loads: list[Load], prio_of, t: float) -> None:
        for key, _slot, victim in loads:
            if victim >= 0:
                lid[victim] += 1
            push(prio_of(key), key, t, True)

    def wait_for(keys: list[int]) -> float:
        while any(ready_t[k] == np.inf for k in keys):
            if not start_next(np.inf):
                raise RuntimeError("replay: a needed read is not queued")
        return max((ready_t[k] for k in keys), default=0.0)

    if uses is not None and len(uses) != S:
        raise ConfigError(f"{len(uses)} step uses for {S} steps; expected one per step.")
    if upcoming is not None and (requests_S is None or len(upcoming) != S):
        raise ConfigError(f"schedules for {len(upcoming)} steps of {S}; expected one per step, with requests_S.")
    if next_use is not None and (requests_S is None or len(next_use) != S):
        raise ConfigError(f"next-token forecasts for {len(next_use)} steps of {S}; expected one per step, with "
                          "requests_S.")
    if req_count is not None and np.shape(req_count) != np.shape(req_key):
        raise ConfigError(f"routed token counts have shape {np.shape(req_count)}; expected {np.shape(req_key)}, one "
                          "per required key.")
    if reuse is not None and (requests_S is None or len(reuse) != S):
        raise ConfigError(f"reuse forecasts for {len(reuse)} steps of {S}; expected one per step, with requests_S.")
    t = 0.0
    for s in range(S):
        if requests_S is not None:
            sc.begin_step(np.asarray(requests_S[s:s + 1], np.int64), None, None if reuse is None else reuse[s],
                          None if upcoming is None else upcoming[s], None if next_use is None else next_use[s],
                          None if uses is None else uses[s].tokens)
        if pred_SLE is not None and not layer_ahead:
            issue(sc.prefetch(range(L), [lay * E + np.flatnonzero(pred_SLE[s, lay]) for lay in range(L)], -1),
                  lambda k: float(k // E + 1), t)
        elif pred_SLE is not None and pred_SLE[s, 0].any():  # layer 0's own forecast, before its decoder layer
            issue(sc.prefetch([0], [np.flatnonzero(pred_SLE[s, 0])], -1), lambda k: 1.0, t)
        for lay in range(L):
            a = s * L + lay
            tr = t + dense_s
            if pred_SLE is not None and layer_ahead and lay + 1 < L:
                issue(sc.prefetch([lay + 1], [(lay + 1) * E + np.flatnonzero(pred_SLE[s, lay + 1])], lay,
                                  req_key[req_off[a]:req_off[a + 1]]),
                      lambda k: 1.0, tr)
            while start_next(tr):
                pass
            keys = req_key[req_off[a]:req_off[a + 1]]
            c_of = dict(zip(keys.tolist(), comp[req_off[a]:req_off[a + 1]].tolist(), strict=True))
            released, hits, loads, deferred, later = sc.access(
                lay, keys.tolist(), None if req_count is None else req_count[req_off[a]:req_off[a + 1]])
            for k in released:
                lid[k] += 1
            waits = [k for k in hits if ready_t[k] > tr]
            n_late += len(waits)
            for k in waits:
                if ready_t[k] == np.inf:  # queued, not started: it goes before every prefetch now
                    push(-1.0, k, tr, False)
            issue(loads, lambda k: -1.0, tr)
            issue(later, lambda k, lay=lay: float(k // E - lay), tr)
            ready = [k for k in hits if ready_t[k] <= tr]
            waits += [k for k, _, _ in loads]
            end = max(tr + sum(c_of[k] for k in ready), wait_for(waits)) + sum(c_of[k] for k in waits)
            sc.unpin(ready + waits)
            while deferred:
                loads, deferred = sc.next_round(deferred)
                issue(loads, lambda k: -1.0, end)
                got = [k for k, _, _ in loads]
                end = max(end, wait_for(got)) + sum(c_of[k] for k in got)
                sc.unpin(got)
            stall += end - tr - sum(c_of.values())
            t = end
        sc.end_step(None if uses is None else uses[s])
    st = dict(sc.stats)
    asked = st["hits"] + st["misses"]
    late = n_late
    st.update(hit_ratio=st["hits"] / max(asked, 1), late=late, on_time_hit_ratio=(st["hits"] - late) / max(asked, 1),
              stall_s=stall, sim_s=t, loads=st["misses"] + st["prefetch_issued"])
    return st
