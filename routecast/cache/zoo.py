"""The policy objects by name: one definition per policy, driven by the runtime (SlotCache) and the replay.

Names: lru (policy.ExpertPolicy: LRU with PLEC's forecast marks), lfu, arc, s3fifo, lirs, fc-evict
(forecast_evict.ForecastEvictPolicy). ``NAME+admit`` in the replay adds cost-aware prefetch admission
(forecast_evict.PrefetchAdmission) to any of them; ``lfu+bypass`` and ``fc-evict+bypass`` keep `STAGING` slots of
the budget for the demand misses their keeps_out would rather not admit (objreplay.py). lru and lfu also run in
the numba kernel (kernel.py); tests/cache/test_zoo.py checks that both forms make the same decisions and give
the same time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from routecast.cache.arc import ARCPolicy
from routecast.cache.forecast_evict import ForecastEvictPolicy
from routecast.cache.lirs import LIRSPolicy
from routecast.cache.policy import BasePolicy, ExpertPolicy, Rank
from routecast.cache.s3fifo import S3FIFOPolicy
from routecast.common.errors import ConfigError


class LFUPolicy(BasePolicy):
    """LFU as the kernel runs it: use counts kept across evictions, ties to the least recently used key.
    K: the number of keys (L·E)."""

    name = "lfu"

    def __init__(self, capacity: int, K: int) -> None:
        super().__init__(capacity)
        self.res = np.zeros(K, bool)
        self.cnt = np.zeros(K)
        self.last = np.zeros(K)
        self.tick = 0.0
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def __contains__(self, key: int) -> bool:
        return bool(self.res[key])

    def touch(self, key: int) -> None:
        self.cnt[key] += 1.0
        self.last[key] = self.tick
        self.tick += 1.0

    def admit(self, key: int) -> None:
        self.res[key] = True
        self.n += 1
        self.touch(key)

    def remove(self, key: int) -> None:
        if self.res[key]:
            self.res[key] = False
            self.n -= 1

    def keeps_out(self, incoming: int, victim: int) -> bool:
        """TinyLFU's admission rule (Einziger et al., 2017) on LFU's exact counts: read the miss without admitting it
        unless, counting this use, it was used more often than the victim (ties keep the resident)."""
        return bool(self.cnt[incoming] + 1.0 <= self.cnt[victim])

    def passed(self, key: int) -> None:
        self.touch(key)

    def victim(self, pinned: Callable[[int], bool], below: Rank | None = None, incoming: int = -1) -> int:
        if self.refuses(below):
            return -1
        keys = np.flatnonzero(self.res)
        for k in keys[np.lexsort((self.last[keys], self.cnt[keys]))].tolist():
            if not pinned(k):
                return k
        return -1


DESCRIBE = {
    "lru": "least recently used (policy object; the kernel's lru makes the same decisions)",
    "lfu": "least frequently used, counts kept across evictions, recency ties (policy object)",
    "arc": "ARC (Megiddo & Modha, FAST'03): recency and frequency lists with ghost-driven adaptation",
    "s3fifo": "S3-FIFO (Yang et al., SOSP'23): small, main and ghost FIFO queues, quick demotion",
    "lirs": "LIRS (Jiang & Zhang, SIGMETRICS'02): evict by inter-reference recency",
    "fc-evict": "forecast-guided eviction: farthest predicted next use (this step's forecast + request profiles), "
                "no prefetch",
}
ADMIT = "+admit"
BYPASS = "+bypass"
BYPASSES = ("lfu", "fc-evict")  # the objects whose keeps_out can decline a demand miss a slot
STAGING = 1  # slots of the budget a +bypass policy keeps for misses it reads without admitting


def split_name(name: str) -> tuple[str, bool]:
    """'arc+admit' -> ('arc', True): the base policy object and whether prefetch admission is on; a +bypass before
    +admit (bypasses()) is part of the name, not of the base ('fc-evict+bypass+admit' -> ('fc-evict', True))."""
    base, admit = (name[: -len(ADMIT)], True) if name.endswith(ADMIT) else (name, False)
    if base.endswith(BYPASS) and base[: -len(BYPASS)] in BYPASSES:
        base = base[: -len(BYPASS)]
    if base not in DESCRIBE:
        raise ConfigError(f"policy {name!r} is unknown; expected one of {', '.join(DESCRIBE)} (optionally +admit; "
                          f"{' and '.join(BYPASSES)} also +bypass, before +admit).")
    return base, admit


def is_fc_evict(name: str) -> bool:
    """fc-evict with or without +bypass / +admit: the policy that keeps request profiles and reads forecasts."""
    return name.removesuffix(ADMIT).removesuffix(BYPASS) == "fc-evict"


def bypasses(name: str) -> bool:
    """Whether `name` (a valid policy object name) reads misses its policy keeps out through the staging slot."""
    return name.removesuffix(ADMIT).endswith(BYPASS)


def check_reuse_policy(policy: str) -> None:
    """--reuse-probe's refusal, shared by every command that takes it: only fc-evict reads the reuse probe."""
    if split_name(policy)[0] != "fc-evict":
        raise ConfigError(f"--reuse-probe with --policy {policy}: the reuse probe is read by fc-evict only; expected "
                          "--policy fc-evict.")


def describe(name: str) -> str:
    base, admit = split_name(name)
    return (DESCRIBE[base] + ("; a miss it ranks below its victim is read into a staging slot and not kept"
                              if bypasses(name) else "")
            + ("; prefetch only when the stall saved beats the bytes' cost" if admit else ""))


def uses_forecast(name: str) -> bool:
    base, admit = split_name(name)
    return admit or base == "fc-evict"


def make_policy(name: str, capacity: int, L: int, E: int) -> BasePolicy:
    """A fresh policy object for one pool of `capacity` slots over L·E keys (name without +admit)."""
    base, _ = split_name(name)
    if base == "lru":
        return ExpertPolicy(capacity)
    if base == "lfu":
        return LFUPolicy(capacity, L * E)
    if base == "arc":
        return ARCPolicy(capacity)
    if base == "s3fifo":
        return S3FIFOPolicy(capacity)
    if base == "lirs":
        return LIRSPolicy(capacity)
    return ForecastEvictPolicy(capacity, L, E)
