"""cache/slots.py: the timing-free slot accounting (bad input, worked examples of late prefetch and correction)."""

from __future__ import annotations

import numpy as np
import pytest

from routecast.cache.slots import SlotCache, replay_slots
from routecast.common.errors import ConfigError


def test_bad_budgets_are_one_sentence() -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        SlotCache(2, 4, 0)
    with pytest.raises(ConfigError, match="at most 8"):
        SlotCache(2, 4, 9)
    with pytest.raises(ConfigError, match="expected at least 4"):
        SlotCache(2, 4, 3, keep_per_layer=2)


def test_a_prefetch_in_flight_is_a_late_hit_with_its_wait_as_stall() -> None:
    # 2 layers x 4 experts; each step routes layer 0 -> expert 0, layer 1 -> expert 1; the lookahead forecasts {1}
    L, E, S = 2, 4, 2
    keys = np.array([0, E + 1] * S)
    off = np.arange(2 * S + 1)
    pred = np.zeros((S, L, E), bool)
    pred[:, 1, 1] = True
    r = replay_slots(off, keys, L, E, 4, pred_SLE=pred, layer_ahead=True, req_comp_s=np.full(2 * S, 0.1), dense_s=0.5,
                     xfer_s=1.0)
    # step 0: expert 0 misses (read 0.5..1.5), the prefetch of E+1 issued at 0.5 reads 1.5..2.5 on the one link:
    # layer 1's router asks at 1.6 + 0.5 = 2.1, so it is a hit that waits 0.4 (late); step 1: both on time
    assert (r["hits"], r["misses"], r["late"], r["prefetch_issued"], r["prefetch_useful"]) == (3, 1, 1, 1, 1)
    assert r["hit_ratio"] == pytest.approx(0.75) and r["on_time_hit_ratio"] == pytest.approx(0.5)
    assert r["stall_s"] == pytest.approx(1.0 + 0.4)  # the demand read, then the late prefetch's wait


def test_correction_releases_an_unused_wrong_prefetch() -> None:
    sc = SlotCache(2, 4, 2)
    loads = sc.prefetch([1], [np.array([5, 6])], current_layer=0)
    assert [k for k, _, _ in loads] == [5, 6] and sc.occupied == 2
    released, hits, loads, deferred, later = sc.access(1, [6, 7])
    assert released == [5] and hits == [6] and [k for k, _, _ in loads] == [7] and not deferred and not later
    assert sc.stats["prefetch_cancelled"] == 1 and sc.stats["prefetch_useful"] == 1
    sc.check()
