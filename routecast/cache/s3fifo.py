"""S3-FIFO (Yang et al., SOSP'23): three FIFO queues, quick demotion of keys used once, as a policy object.

S, a small FIFO (10% of the capacity), takes new keys; M, the main FIFO, takes keys promoted from S and keys
found in G, a ghost FIFO of keys recently evicted from S (no data, at most `capacity` entries). Each
resident key has a frequency counter, +1 per hit, capped at 3. Eviction (the paper's Algorithm 1): when S
holds at least 10% of the capacity, S's oldest key is examined: used more than once (freq > 1) it moves to
M's head, else it is evicted into G; otherwise M's oldest key is examined: freq > 0 gives it another round
at M's head with freq - 1, else it is evicted. The examination repeats until a key is evicted.

The driver protocol is policy.BasePolicy's: victim() performs those moves (residency does not change) and
returns the key to evict; remove(victim) evicts it (into G if it came from S). A key pinned by the driver
is passed over: it goes back to its queue's head with its counter unchanged; after a full round with no
evictable key victim returns -1.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

from routecast.cache.policy import BasePolicy, Rank


class S3FIFOPolicy(BasePolicy):
    """S3-FIFO over resident keys (see the module docstring). capacity: the pool's slots, at least 1.
    small_share: S's share of the capacity (0.1 in the paper)."""

    name = "s3fifo"

    def __init__(self, capacity: int, small_share: float = 0.1) -> None:
        super().__init__(max(int(capacity), 1))
        self.small_cap = max(1, math.ceil(small_share * self.capacity))
        self.s: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.m: OrderedDict[int, None] = OrderedDict()
        self.g: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.s) + len(self.m)

    def __contains__(self, key: int) -> bool:
        return key in self.freq

    def touch(self, key: int) -> None:
        self.freq[key] = min(self.freq[key] + 1, 3)

    def admit(self, key: int) -> None:
        """A miss: a key remembered in G enters M, any other enters S (frequency 0)."""
        if key in self.g:
            del self.g[key]
            self.m[key] = None
        else:
            self.s[key] = None
        self.freq[key] = 0

    def remove(self, key: int) -> None:
        if key in self.s:
            del self.s[key]
            self.g[key] = None
            while len(self.g) > self.capacity:
                self.g.popitem(last=False)
        else:
            self.m.pop(key, None)
        self.freq.pop(key, None)

    def victim(self, pinned: Callable[[int], bool], below: Rank | None = None, incoming: int = -1) -> int:
        if self.refuses(below):
            return -1
        passes = skipped_s = 0
        limit = 4 * (len(self) + 1)  # each key is promoted once and decremented at most 3 times per round
        while passes < limit and len(self):
            passes += 1
            if self.s and skipped_s < len(self.s) and (len(self.s) >= self.small_cap or not self.m):
                k = next(iter(self.s))
                if pinned(k):
                    skipped_s += 1  # every key of S pinned: M's turn
                    self.s.move_to_end(k)
                elif self.freq[k] > 1:
                    del self.s[k]
                    self.m[k] = None
                else:
                    return k
            else:
                if not self.m:
                    return -1  # every key of S is pinned and M is empty
                k = next(iter(self.m))
                if pinned(k):
                    self.m.move_to_end(k)
                elif self.freq[k] > 0:
                    self.freq[k] -= 1
                    self.m.move_to_end(k)
                else:
                    return k
        return -1
