"""LIRS (Jiang & Zhang, SIGMETRICS'02): evict by inter-reference recency, as a policy object over integer keys.

Keys are LIR (low inter-reference recency: kept) or HIR. L_lirs = capacity - L_hirs LIR keys are resident;
the L_hirs slots (1% of the capacity, at least 1) hold resident HIR keys. Stack S orders keys by recency
(LIR keys, resident HIR keys and non-resident HIR keys still in S); queue Q holds the resident HIR keys,
the victims, oldest first. Stack pruning removes HIR keys from S's bottom until a LIR key is there.
The paper's cases:

- hit on a LIR key: to S's top; prune if it was the bottom;
- hit on a resident HIR key: to S's top; if it was in S it turns LIR (removed from Q) and S's bottom LIR key
  turns HIR to Q's end, then prune; if it was not in S it stays HIR and moves to Q's end;
- miss (the victim, Q's front, was evicted first; its S entry stays, non-resident): the key goes to S's top;
  while fewer than L_lirs keys are LIR it becomes LIR; else if it was in S it turns LIR (S's bottom LIR key
  turns HIR to Q's end, prune); otherwise it is a resident HIR key at Q's end.

Non-resident HIR entries of S are capped at 2·capacity (oldest dropped), so memory stays O(capacity).
Driver protocol: policy.BasePolicy's. A pinned key is skipped: the next key of Q, then (Q all pinned or
empty) the LIR key nearest S's bottom.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

from routecast.cache.policy import BasePolicy, Rank


class LIRSPolicy(BasePolicy):
    """LIRS over resident keys (see the module docstring). capacity: the pool's slots, at least 1.
    hir_share: resident HIR slots as a share of the capacity (1% in the paper; at least one slot)."""

    name = "lirs"

    def __init__(self, capacity: int, hir_share: float = 0.01) -> None:
        super().__init__(max(int(capacity), 1))
        self.l_hirs = max(1, math.ceil(hir_share * self.capacity)) if self.capacity > 1 else 0
        self.l_lirs = self.capacity - self.l_hirs
        self.stack: OrderedDict[int, None] = OrderedDict()  # bottom (least recent) first
        self.queue: OrderedDict[int, None] = OrderedDict()  # resident HIR keys, front first
        self.lir: set[int] = set()
        self.resident: set[int] = set()

    def __len__(self) -> int:
        return len(self.resident)

    def __contains__(self, key: int) -> bool:
        return key in self.resident

    def _to_top(self, key: int) -> None:
        self.stack.pop(key, None)
        self.stack[key] = None

    def _prune(self) -> None:
        while self.stack:
            k = next(iter(self.stack))
            if k in self.lir:
                return
            del self.stack[k]

    def _demote_bottom(self) -> None:
        """S's bottom LIR key turns HIR (resident: to Q's end); then prune."""
        for k in self.stack:
            if k in self.lir:
                self.lir.discard(k)
                del self.stack[k]
                self.queue[k] = None
                break
        self._prune()

    def touch(self, key: int) -> None:
        if key in self.lir:
            self._to_top(key)
            self._prune()
            return
        if key in self.stack:  # resident HIR with a recent enough previous use: becomes LIR
            self._to_top(key)
            self.queue.pop(key, None)
            self.lir.add(key)
            self._demote_bottom()
        else:
            self._to_top(key)
            self.queue.pop(key, None)
            self.queue[key] = None

    def admit(self, key: int) -> None:
        self.resident.add(key)
        in_stack = key in self.stack
        self._to_top(key)
        if len(self.lir) < self.l_lirs:
            self.lir.add(key)
        elif in_stack:
            self.lir.add(key)
            self._demote_bottom()
        else:
            self.queue[key] = None
        self._cap_ghosts()

    def remove(self, key: int) -> None:
        """key left the fast tier: a HIR key stays in S as non-resident; a LIR key (evicted only when every
        queued key is pinned) leaves S, and S is pruned."""
        self.resident.discard(key)
        self.queue.pop(key, None)
        if key in self.lir:
            self.lir.discard(key)
            self.stack.pop(key, None)
            self._prune()

    def victim(self, pinned: Callable[[int], bool], below: Rank | None = None, incoming: int = -1) -> int:
        if self.refuses(below):
            return -1
        for k in self.queue:
            if not pinned(k):
                return k
        for k in self.stack:
            if k in self.lir and not pinned(k):
                return k
        return -1

    def _cap_ghosts(self) -> None:
        ghosts = len(self.stack) - len(self.lir) - sum(1 for k in self.queue if k in self.stack)
        if ghosts <= 2 * self.capacity:
            return
        for k in list(self.stack):
            if ghosts <= 2 * self.capacity:
                break
            if k not in self.resident:
                del self.stack[k]
                ghosts -= 1
        self._prune()
