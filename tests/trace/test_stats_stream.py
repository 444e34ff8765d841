"""Chunked routing statistics (issue 10): identical to whole-trace computations at any chunk size."""

from __future__ import annotations

import numpy as np
import pytest

import routecast.trace.trace as trace_mod
from routecast.trace import lazy
from routecast.trace import stats as rs
from routecast.trace import stats_stream as ss
from routecast.trace.io import read_trace, write_trace
from routecast.trace.stats_bundle import routing_stats
from tests.trace.test_lazy import serving_trace


@pytest.fixture(params=[5, 23, 10**9], ids=["chunk5", "chunk23", "whole"])
def chunk_rows(request, monkeypatch):
    monkeypatch.setattr(trace_mod, "CHUNK_ROWS", request.param)
    return request.param


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    tr = serving_trace(T=900, seed=4)
    d = tmp_path_factory.mktemp("s") / "t"
    write_trace(tr, d, shard_tokens=64)
    return tr, d


def brute_sequence_skewness(tr, seq_len):
    E, L = tr.spec.num_experts, tr.spec.num_layers
    req, chunk = tr.tokens["request"], tr.tokens["position"] // seq_len
    rows = []
    for r in np.unique(req):
        for c in np.unique(chunk[req == r]):
            m = (req == r) & (chunk == c)
            if m.sum() < max(1, seq_len // 2):
                continue
            cnt = np.stack([np.bincount(v[v >= 0], minlength=E) for v in tr.experts_TLK[m].transpose(1, 0, 2)
                            .reshape(L, -1)])
            rows.append(cnt.max(-1) * E / cnt.sum(-1))
    return np.array(rows).reshape(-1, L)


def test_routing_stats_same_at_every_chunk_size_and_never_loads_the_trace(traces, chunk_rows):
    tr, d = traces
    lz = read_trace(d)
    before = lazy.MATERIALISED["count"]
    kw = dict(ep=4, window=3, seq_len=20, max_tokens=300)
    got = routing_stats(lz, **kw)
    assert lazy.MATERIALISED["count"] == before
    trace_mod.CHUNK_ROWS = 10**9  # the reference: the in-memory trace as one chunk
    assert got == routing_stats(tr, **kw)


def test_sequence_skewness_matches_a_direct_count(traces, chunk_rows):
    tr, d = traces
    for seq_len in (7, 20, 64):
        want = brute_sequence_skewness(tr, seq_len)
        np.testing.assert_allclose(ss.sequence_skewness(read_trace(d), seq_len), want, rtol=1e-12)
        np.testing.assert_allclose(ss.sequence_skewness(tr, seq_len), want, rtol=1e-12)


def test_half_sample_is_sample_indices_of_half_masks(traces, chunk_rows):
    tr, d = traces
    nodoc = tr.select(np.arange(tr.num_tokens))
    nodoc.tokens["document"][:] = -1
    one = tr.select(tr.tokens["request"] == 3)
    for t in (tr, read_trace(d), nodoc, one):
        for cap in (5, 100, 10**6):
            fit_m, ev_m = rs.half_masks(t, seed=2)
            rng = np.random.default_rng(9)
            want = []
            for m in (fit_m, ev_m):  # the whole-mask formulation half_sample replaces
                idx = np.flatnonzero(m)
                want.append(idx if len(idx) <= cap else np.sort(rng.choice(idx, cap, replace=False)))
            got = ss.half_sample(t, cap, np.random.default_rng(9), seed=2)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w)


def test_task_distances_match_direct_counts(traces, chunk_rows):
    tr, d = traces
    got = ss.task_distances(read_trace(d), seed=1)
    assert got["tasks"] == ["a", "b", "c"]
    E = tr.spec.num_experts
    whole = np.stack([np.stack([np.bincount(v[v >= 0], minlength=E) for v in tr.experts_TLK[tr.tokens["task"] == t]
                                .transpose(1, 0, 2).reshape(tr.spec.num_layers, -1)]) for t in range(3)])
    np.testing.assert_allclose(got["l1_nnL"], rs.l1_distance(whole[:, None], whole[None]), rtol=1e-12)
    assert np.isfinite(got["half_l1_nL"]).all() and (got["half_l1_nL"] > 0).all()


def test_step_stats_of_unsorted_rows_equal_the_streamed_sorted_ones(traces, chunk_rows):
    tr, d = traces
    streamed = rs.step_stats(read_trace(d), ep=4, window=5)
    shuffled = tr.select(np.random.default_rng(0).permutation(tr.num_tokens))
    assert not rs.step_runs(shuffled)[0] and rs.step_runs(tr) == (True, len(np.unique(tr.tokens["step"])))
    ref = rs.step_stats(shuffled, ep=4, window=5)
    for f in ("steps_S", "tokens_S", "skew_SL", "ir_SL", "counts_LE", "drift_WL"):
        np.testing.assert_array_equal(getattr(streamed, f), getattr(ref, f), err_msg=f)


def test_grouped_choice_counts_sum_over_chunks():
    rng = np.random.default_rng(3)
    T, L, E, K = 200, 3, 16, 4
    logits = rng.normal(size=(T, L, E))
    ex = np.sort(np.argsort(-logits, axis=-1)[..., :K], axis=-1).astype(np.int16)
    moved = rng.random((T, L)) < 0.3
    ex[moved, 0] = (ex[moved, 0] + 1) % E  # some executed sets differ from the top-K
    ex[5, 1, 2] = -1
    bias = rng.normal(size=(L, E)) * 0.5
    whole = rs.grouped_choice_effect(logits, ex, bias)
    parts = [rs.grouped_choice_counts(logits[a:a + 37], ex[a:a + 37], bias) for a in range(0, T, 37)]
    summed = rs.grouped_choice_shares({k: sum(p[k] for p in parts) for k in parts[0]})
    for k in whole:
        np.testing.assert_array_equal(summed[k], whole[k])
