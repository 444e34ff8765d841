"""PLEC's real-time correction on hand-made traces: where a demand load enters the prefetch queue.

x = one expert transfer (1 MiB over h100-sxm's 64 GB/s h2d link), c = one expert's compute (c << x).
"""

from __future__ import annotations

import numpy as np
import pytest

from routecast.cache.replay import ReplayConfig, build_accesses, compute_seconds, forecast_entries, run_policy
from routecast.sim.hardware import load_hardware
from routecast.trace import MoESpec, Trace, make_columns

HW = load_hardware("h100-sxm")
EB = 1 << 20
X = EB / HW.h2d_bandwidth
MODES = ("plec-correct", "plec-correct-eager", "plec-correct-fifo")


def one_step(experts_TLK: list, E: int) -> Trace:
    ids = np.asarray(experts_TLK, np.int16)
    T, L, k = ids.shape
    return Trace(spec=MoESpec(num_layers=L, num_experts=E, top_k=k, expert_bytes=EB),
                 tokens=make_columns(T, request=np.zeros(T, int), position=np.arange(T), step=np.zeros(T, int)),
                 experts_TLK=ids, weights_TLK=np.full(ids.shape, 1.0 / k, np.float32))


def replay_modes(trace: Trace, pred_LE: np.ndarray, budget: int, dense_us: float) -> tuple[dict, float]:
    acc = build_accesses(trace)
    fc = forecast_entries(acc, pred_LE[None])
    cfg = ReplayConfig(budget=budget, hardware=HW, dense_us=dense_us)
    c = float(compute_seconds(acc, cfg, EB)[0])
    return {n: run_policy(acc, n, cfg, forecast=fc, log=True, expert_bytes=EB) for n in MODES}, c


def test_link_bound_eager_priority_only_moves_the_wait():
    """Two tokens: layer 0 needs expert 0 (not predicted), layer 1 needs 2 and 3 (predicted, prefetched at t=0).

    The prefetch of 2 is on the link at the router (it finishes first). FIFO: expert 0 arrives at 3x, layer 1
    finds 2 and 3 on the device (hit 2/3) and ends at 3x + 3c. Eager: expert 0 at 2x, the prefetch of 3 is
    pushed to 3x, later than layer 1's router at 2x + c (hit 1/3, covered 2/3, end 3x + c): the same link time,
    the wait moved from a miss onto a prefetch. Slack-aware: a transfer (x) does not fit in the compute
    after the demand load (c), so it queues like FIFO.
    """
    rows, c = replay_modes(one_step([[[0], [2]], [[0], [3]]], 4), np.array([[0, 0, 0, 0], [0, 0, 1, 1]], bool), 3, 0.0)
    assert c < X
    fifo, eager, slack = rows["plec-correct-fifo"], rows["plec-correct-eager"], rows["plec-correct"]
    assert fifo["hit_ratio"] == pytest.approx(2 / 3) and eager["hit_ratio"] == pytest.approx(1 / 3)
    assert fifo["covered_ratio"] == eager["covered_ratio"] == pytest.approx(2 / 3)
    assert fifo["sim_s"] == pytest.approx(3 * X + 3 * c) and eager["sim_s"] == pytest.approx(3 * X + c)
    assert slack["hit_ratio"] == fifo["hit_ratio"] and slack["sim_s"] == fifo["sim_s"]
    assert all(r["demand_loads"] == 1 and r["prefetches"] == 2 for r in rows.values())


def test_slack_aware_priority_keeps_the_prefetches_in_time_and_most_of_the_gain():
    """Six tokens; layer 1 needs experts 2..7, all predicted and prefetched at t=0 (arriving x, 2x, .., 6x);
    layer 0 needs expert 0, a miss at its router (2.5x of non-expert time). Layer 1's router asks 2.5x after
    layer 0 ends, so two transfers fit between a demand load and it.

    FIFO: expert 0 arrives at 7x: layer 0 stalls 4.5x, every prefetch is in time (hit 6/7).
    Eager: expert 0 goes right after the transfer in progress (4x); the last prefetch arrives at 7x, after
    layer 1's router at 6.5x + c (hit 5/7). Slack-aware: it goes after the prefetch of expert 3 (5x), the
    latest position that keeps every prefetch in time: hit 6/7 and layer 0 stalls 2.5x, not 4.5x.
    """
    pred = np.zeros((2, 8), bool)
    pred[1, 2:] = True
    rows, c = replay_modes(one_step([[[0], [e]] for e in range(2, 8)], 8), pred, 8, 2.5 * X * 1e6)
    fifo, eager, slack = rows["plec-correct-fifo"], rows["plec-correct-eager"], rows["plec-correct"]
    assert fifo["hit_ratio"] == slack["hit_ratio"] == pytest.approx(6 / 7)
    assert eager["hit_ratio"] == pytest.approx(5 / 7)
    assert fifo["stall_s"] == pytest.approx(4.5 * X) and slack["stall_s"] == pytest.approx(2.5 * X)
    assert eager["stall_s"] < slack["stall_s"] < fifo["stall_s"]
    assert slack["sim_s"] == pytest.approx(fifo["sim_s"] - 2 * X)
