"""serve-sim's per-task expert frequencies stream a lazy trace chunk by chunk (issue 10) and equal per-task counts."""

from __future__ import annotations

import numpy as np

import routecast.trace.trace as trace_mod
from routecast.serve.workload import task_expert_freq
from routecast.trace import lazy
from routecast.trace.io import read_trace, write_trace
from tests.trace.test_lazy import serving_trace


def test_task_expert_freq_streams_and_matches_per_task_counts(tmp_path, monkeypatch):
    tr = serving_trace(T=500, E=8, seed=2)
    tr.tokens["task"][tr.tokens["request"] % 5 == 0] = -1  # unknown tasks count with the last group
    write_trace(tr, tmp_path / "t", shard_tokens=64)
    monkeypatch.setattr(trace_mod, "CHUNK_ROWS", 11)
    before = lazy.MATERIALISED["count"]
    got = task_expert_freq(read_trace(tmp_path / "t"), 4, 6)
    assert lazy.MATERIALISED["count"] == before
    task = np.where(tr.tokens["task"] < 0, 3, tr.tokens["task"])
    for k in range(4):
        c = tr.counts_LE(task == k)
        np.testing.assert_allclose(got[k, :4], c / c.sum(1, keepdims=True), rtol=1e-15)
    np.testing.assert_array_equal(got[:, 4:], got[:, :2])  # a deeper profile repeats the trace's layers
