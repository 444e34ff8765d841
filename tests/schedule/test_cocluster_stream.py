"""s-MoE co-clustering on traces larger than memory (issue 10): the scoring streams windows of whole steps and
gives what the whole trace gives; the fit sees a seeded sample of whole requests capped by --max-tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest

import routecast.trace.trace as trace_mod
from routecast.schedule.cocluster import cocluster, evaluate_plan, fit_sample
from routecast.trace import lazy
from routecast.trace.io import read_trace, write_trace
from tests.schedule.test_cocluster import FAST, planted


@pytest.fixture
def on_disk(tmp_path):
    tr = planted(T=600, L=3, noise=0.2)
    write_trace(tr, tmp_path / "t", shard_tokens=50)  # 12 shards; steps of 16 rows cross shard boundaries
    return tr, read_trace(tmp_path / "t")


@pytest.mark.parametrize("method", ["smoe", "hypergraph", "none"])
def test_lazy_trace_in_tiny_windows_scores_as_the_whole_trace(on_disk, monkeypatch, method):
    tr, lz = on_disk
    rows = np.random.default_rng(0).random(tr.num_tokens) < 0.7
    ref_plan = cocluster(tr, 4, method, rows=rows, config=FAST)
    ref = [evaluate_plan(ref_plan, tr, rows=r) for r in (rows, ~rows, None)]
    monkeypatch.setattr(trace_mod, "CHUNK_ROWS", 7)  # windows of whole steps, cut far inside each shard
    before = lazy.MATERIALISED["count"]
    plan = cocluster(lz, 4, method, rows=rows, config=FAST)
    assert np.array_equal(plan.expert_group_LE, ref_plan.expert_group_LE)
    assert np.array_equal(plan.token_group_LU, ref_plan.token_group_LU)
    got = [evaluate_plan(plan, lz, rows=r) for r in (rows, ~rows, None)]
    assert lazy.MATERIALISED["count"] == before  # nothing loaded the whole routing
    assert json.dumps(got) == json.dumps(ref)
    assert got[2]["tokens"] == tr.num_tokens and got[0]["tokens"] == int(rows.sum())


def test_fit_sample_takes_whole_requests_up_to_the_cap(on_disk, monkeypatch):
    tr, lz = on_disk
    monkeypatch.setattr(trace_mod, "CHUNK_ROWS", 13)
    rows = tr.tokens["request"] % 4 != 0
    same, note = fit_sample(lz, rows, 10**6)
    assert note == "" and np.array_equal(same, rows)
    m, note = fit_sample(lz, rows, 200, seed=1)
    req = tr.tokens["request"]
    assert m.sum() <= 200 and not (m & ~rows).any() and f"{int(m.sum())} of {int(rows.sum())}" in note
    for r in np.unique(req[m]):  # every sampled request whole (its training rows all in)
        assert m[(req == r) & rows].all()
    assert np.array_equal(fit_sample(tr, rows, 200, seed=1)[0], m)  # seeded, and the same in memory
    assert not np.array_equal(fit_sample(tr, rows, 200, seed=2)[0], m)
    one, _ = fit_sample(lz, None, 10)  # a request longer than the cap: its first 10 rows
    assert one.sum() == 10 and len(np.unique(req[one])) == 1


def test_cli_max_tokens_says_it_sampled(tmp_path, capsys):
    from routecast.cli import main

    write_trace(planted(T=800), tmp_path / "tr", shard_tokens=100)
    out = tmp_path / "cc.json"
    args = ["schedule", "cocluster", str(tmp_path / "tr"), "--ep", "4", "--method", "sts", "--quiet", "--split",
            "request", "--out", str(out)]
    assert main([*args, "--max-tokens", "200"]) == 0
    text = capsys.readouterr().out
    assert "fitted on a seeded sample of" in text and "--max-tokens 200" in text
    s = json.loads(out.read_text())["settings"]
    assert s["max_tokens"] == 200 and 0 < s["fit_tokens"] <= 200
    assert main([*args, "--max-tokens", "-1"]) == 2
    assert "--max-tokens" in capsys.readouterr().err


def test_rebatch_max_tokens_fits_a_sample_and_rebatches_a_window_of_whole_steps(tmp_path, capsys):
    from routecast.cli import main
    from tests.schedule.test_rebatch import two_kinds

    tr = two_kinds(steps=10, per_step=40)  # 40 requests of 10 decode tokens, one per step
    d = write_trace(tr, tmp_path / "t", shard_tokens=64)
    out = tmp_path / "r.json"
    args = ["schedule", "rebatch", str(d), "--predictor", "probability", "--policy", "lru", "--split", "request",
            "--out", str(out)]
    assert main([*args, "--max-tokens", "50"]) == 0
    text = capsys.readouterr().out
    res = json.loads(out.read_text())["settings"]
    # 8 held-out requests hold 8 tokens a step: 6 whole steps fit in 50 tokens; the fit sees 5 of the 32 requests
    assert res["test_tokens"] == 48 and res["max_tokens"] == 50
    assert "first 6 of 10 steps (48 of 80 tokens; --max-tokens 50)" in text
    assert "fitted on a seeded sample of 50 of 320 training tokens (5 whole requests" in text
    assert main([*args, "--max-tokens", "0", "--overwrite"]) == 0 and json.loads(out.read_text())["settings"]["test_tokens"] == 80
