"""Replacement-policy objects shared by the Python replay reference and the offload runtime.

The numba replay kernel (kernel.py) runs the same policies in compiled code; these objects are their
Python form for the runtime (routecast/runtime/offload), which cannot call the kernel's loop. The
equivalence is tested: ``replay_demand`` over a trace's accesses gives the kernel's LRU hit count exactly.

Keys are ``layer * E + expert`` as in the kernel. Ranking (smallest is evicted first), ExpertFlow's PLEC
with real-time correction, as the kernel's ``_prio``:

1. a *mispredicted* key (forecast for a layer whose true routing did not use it): first victims;
2. a key with no forecast use left in the step: least recently used first (LRU fallback);
3. a key forecast for a layer still to come in this step: the farthest layer first.

With no forecast marks this is plain LRU. A prefetch may only evict a key that ranks below the key it
brings in (``victim(..., below=rank)``); a demand load may evict any unpinned key.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

NOT_PREDICTED = -1
Rank = tuple[int, int]


class BasePolicy(ABC):
    """What a cache policy object offers its driver (SlotCache in the runtime, cache/objreplay.py in the replay).

    Residency: ``admit(key)`` (key just got a slot; the access that missed counts as its first use),
    ``touch(key)`` (a hit), ``remove(key)`` (key left the fast tier: evicted or released), ``victim(pinned,
    below, incoming)`` (the resident key to evict, -1 if none may go; ``incoming`` is the key that needs the slot,
    -1 for none known). The driver calls, on a miss in a full pool: ``v = victim(...)``, ``remove(v)``,
    ``admit(key)``. Forecast hooks (no-ops unless a policy uses them): ``mark_predicted`` / ``mark_spent`` (PLEC
    marks within a step), ``begin_step(requests, forecast_LE, reuse_RLK)`` before a forward step, ``end_step(observed)``
    after it (observed: a StepUse of the step's routing per request, or None where the driver has none).
    The residency methods are abstract: a policy that lacks one cannot be made, rather than failing mid-replay.
    """

    name = "base"

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity

    @abstractmethod
    def __len__(self) -> int:
        """Keys resident now."""

    @abstractmethod
    def __contains__(self, key: int) -> bool:
        """Whether `key` is resident."""

    @abstractmethod
    def admit(self, key: int) -> None:
        """`key` just got a slot; the access that missed counts as its first use."""

    @abstractmethod
    def touch(self, key: int) -> None:
        """A hit on resident `key`."""

    @abstractmethod
    def remove(self, key: int) -> None:
        """`key` left the fast tier (evicted or released)."""

    @abstractmethod
    def victim(self, pinned: Callable[[int], bool], below: Rank | None = None, incoming: int = -1) -> int:
        """The resident key to evict (not `pinned`; ranked below `below` when given), -1 if none may go."""

    def keeps_out(self, incoming: int, victim: int) -> bool:
        """A demand miss of `incoming` in a full pool whose victim would be `victim`: True to read it through a
        staging slot and keep `victim` (NAME+bypass, zoo.BYPASSES); the others always evict."""
        return False

    def passed(self, key: int) -> None:
        """`key` was computed from a staging slot without being admitted (after keeps_out said so)."""
        return None

    def mark_predicted(self, keys: Iterable[int], layer_of: Callable[[int], int]) -> None:
        return None

    def mark_spent(self, keys: Iterable[int], used: set[int]) -> list[int]:
        return []

    def begin_step(self, requests: np.ndarray | None = None, forecast_LE: np.ndarray | None = None,
                   reuse_RLK: np.ndarray | None = None, upcoming: Sequence[np.ndarray] | None = None,
                   next_use: Mapping[int, np.ndarray] | None = None, tokens: np.ndarray | None = None) -> None:
        return None

    def routed(self, layer: int, keys: np.ndarray, counts: np.ndarray) -> None:
        """Layer `layer`'s routing of the running step, as its router gives it: its distinct keys and the tokens
        routed to each (fc-evict; a no-op for the others)."""
        return None

    def reuse_row(self, layer: int, logd_RK: np.ndarray) -> None:
        """A reuse probe's forecast of one layer for the step's requests (fc-evict; a no-op for the others)."""
        return None

    def end_step(self, observed: Any = None) -> None:
        return None

    def rank(self, key: int) -> Rank:
        """Every resident key ranks (1, 0) (unpredicted) unless the policy keeps forecast marks."""
        return 1, 0

    @staticmethod
    def refuses(below: Rank | None) -> bool:
        """A prefetch whose rank is no higher than an unpredicted key's may evict nothing (PLEC's rule)."""
        return below is not None and below <= (1, 0)


class ExpertPolicy(BasePolicy):
    """LRU over resident keys plus PLEC forecast marks; O(1) touch, victim found from the LRU end.

    ``rank(key)``: (class, value) with class 0 = mispredicted, 1 = unpredicted, 2 = predicted; within
    class 2 a nearer layer ranks higher. Only resident keys are tracked.
    """

    name = "lru"

    def __init__(self, capacity: int = 0) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[int, None] = OrderedDict()  # resident keys, least recent first
        self._predicted: dict[int, int] = {}  # key -> forecast layer (this step)
        self._mispredicted: OrderedDict[int, None] = OrderedDict()

    # ------------------------------------------------------------------ residency
    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: int) -> bool:
        return key in self._order

    def admit(self, key: int) -> None:
        """key became resident (counts as its most recent use)."""
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key: int) -> None:
        """key was used by an access: most recent; a use clears its mispredicted mark."""
        self._order.move_to_end(key)
        self._mispredicted.pop(key, None)

    def remove(self, key: int) -> None:
        """key left the fast tier."""
        self._order.pop(key, None)
        self._mispredicted.pop(key, None)

    # ------------------------------------------------------------------ forecast marks (PLEC)
    def mark_predicted(self, keys: Iterable[int], layer_of: Callable[[int], int]) -> None:
        """keys are forecast for this step (at layer_of(key)): protected from eviction by lower ranks."""
        for k in keys:
            self._predicted[int(k)] = layer_of(int(k))

    def mark_spent(self, keys: Iterable[int], used: set[int]) -> list[int]:
        """A layer's true routing arrived: its forecast keys are spent; resident ones not in `used` become
        mispredicted (first victims: real-time correction). Returns those mispredicted resident keys."""
        bad = []
        for k in keys:
            k = int(k)
            self._predicted.pop(k, None)
            if k not in used and k in self._order:
                self._mispredicted[k] = None
                bad.append(k)
        return bad

    def end_step(self, observed: Any = None) -> None:
        """The step finished: every forecast mark is dropped (marks never outlive their step)."""
        self._predicted.clear()
        self._mispredicted.clear()

    def predicted_layer(self, key: int) -> int:
        return self._predicted.get(key, NOT_PREDICTED)

    def rank(self, key: int) -> tuple[int, int]:
        """(class, -layer) of key: smaller ranks are evicted first (see the module docstring)."""
        if key in self._mispredicted:
            return 0, 0
        layer = self._predicted.get(key, NOT_PREDICTED)
        return (1, 0) if layer == NOT_PREDICTED else (2, -layer)

    # ------------------------------------------------------------------ victim choice
    def victim(self, pinned: Callable[[int], bool], below: Rank | None = None, incoming: int = -1) -> int:
        """The resident key to evict, or -1 if none may go. pinned(key): in use or in flight (never evicted).
        below: only a key ranking strictly below this rank (a prefetch's own rank) may go. incoming: unused."""
        for k in self._mispredicted:
            if not pinned(k):
                return k
        if below is not None and below <= (1, 0):
            return -1
        far, far_rank = -1, None
        for k in self._order:  # least recent first
            if pinned(k):
                continue
            if k not in self._predicted:
                return k
            r = self.rank(k)
            if far_rank is None or r < far_rank:
                far, far_rank = k, r
        if far >= 0 and (below is None or far_rank < below):
            return far
        return -1


def replay_demand(req_off: np.ndarray, req_key: np.ndarray, budget: int) -> tuple[int, int]:
    """Pure-Python pooled LRU over a kernel access list (replay.Accesses.req_off / req_key): hits are touched
    first, then each miss evicts the least recently used key, as the kernel does. -> (hits, misses)."""
    pol = ExpertPolicy()
    hits = misses = 0
    for a in range(len(req_off) - 1):
        keys = [int(k) for k in req_key[req_off[a]:req_off[a + 1]]]
        for k in keys:
            if k in pol:
                hits += 1
                pol.touch(k)
        for k in keys:
            if k in pol:
                continue
            misses += 1
            if len(pol) >= budget:
                pol.remove(pol.victim(lambda _k: False))
            pol.admit(k)
    return hits, misses
