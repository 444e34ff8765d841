"""Wall-clock timing helpers shared by benchmarks and in-run cost measurements."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall time of fn() over `repeat` calls, after one warm-up call (first calls allocate)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
