"""ARC, the adaptive replacement cache (Megiddo & Modha, FAST'03), as a policy object over integer keys.

Four LRU lists over keys (least recent first): T1 (resident, seen once recently), T2 (resident, seen at
least twice), B1 and B2 (ghosts: keys recently evicted from T1 and T2, no data). The target size p of T1
adapts: a miss that finds its key in B1 grows p by max(|B2|/|B1|, 1) (recency would have helped), one in B2
shrinks it by max(|B1|/|B2|, 1) (frequency would have). REPLACE evicts T1's least recent key when
|T1| > p, or |T1| = p and the incoming key is in B2, else T2's. Ghost lists are trimmed so that
|T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c (c = capacity, the pool's slots).

The driver protocol is policy.BasePolicy's: on a miss in a full pool victim(pinned, incoming=key), then
remove(victim) (the victim joins B1 or B2), then admit(key) (p adapts if key was a ghost). Keys pinned by
the driver (in use, in flight) are skipped: the next least recent key of the same list goes, then the other
list. With no pins the decisions are ARC's, checked against the paper's rules in tests/cache/test_zoo.py.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from routecast.cache.policy import BasePolicy, Rank


class ARCPolicy(BasePolicy):
    """ARC over resident keys (see the module docstring). capacity: the pool's slots (c), at least 1."""

    name = "arc"

    def __init__(self, capacity: int) -> None:
        super().__init__(max(int(capacity), 1))
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def __contains__(self, key: int) -> bool:
        return key in self.t1 or key in self.t2

    def touch(self, key: int) -> None:
        """A hit: the key moves to T2's most recent end."""
        self.t1.pop(key, None)
        self.t2[key] = None
        self.t2.move_to_end(key)

    def _adapted_p(self, key: int) -> float:
        c = self.capacity
        if key in self.b1:
            return min(float(c), self.p + max(len(self.b2) / len(self.b1), 1.0))
        if key in self.b2:
            return max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
        return self.p

    def victim(self, pinned: Callable[[int], bool], below: Rank | None = None, incoming: int = -1) -> int:
        """REPLACE(incoming, p) with p adapted as the miss on `incoming` will adapt it (committed by admit)."""
        if self.refuses(below):
            return -1
        p = self._adapted_p(incoming)
        from_t1 = len(self.t1) >= 1 and (len(self.t1) > p or (incoming in self.b2 and len(self.t1) == p))
        for lst in ((self.t1, self.t2) if from_t1 else (self.t2, self.t1)):
            for k in lst:
                if not pinned(k):
                    return k
        return -1

    def remove(self, key: int) -> None:
        """key left the fast tier: it becomes a ghost of the list it was in (most recent end)."""
        if key in self.t1:
            del self.t1[key]
            self.b1[key] = None
        elif key in self.t2:
            del self.t2[key]
            self.b2[key] = None
        self._trim()

    def admit(self, key: int) -> None:
        """key got a slot after a miss: a ghost hit adapts p and enters T2, a new key enters T1."""
        if key in self.b1 or key in self.b2:
            self.p = self._adapted_p(key)
            self.b1.pop(key, None)
            self.b2.pop(key, None)
            self.t2[key] = None
        else:
            self.t1[key] = None
        self._trim()

    def _trim(self) -> None:
        c = self.capacity
        while self.b1 and len(self.t1) + len(self.b1) > c:
            self.b1.popitem(last=False)
        while self.b2 and len(self) + len(self.b1) + len(self.b2) > 2 * c:
            self.b2.popitem(last=False)
