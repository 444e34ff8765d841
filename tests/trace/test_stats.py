"""Routing statistics: golden values from the papers' definitions, brute-force agreement, properties."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routecast.common.errors import ConfigError
from routecast.trace import MoESpec, Trace, make_columns
from routecast.trace import stats as rs
from routecast.trace import stats_stream as ss
from routecast.trace.stats_bundle import format_stats, routing_stats


def make_trace(experts_TLK, num_experts: int, weights=None, task_names=(), **cols) -> Trace:
    ex = np.asarray(experts_TLK, dtype=np.int16)
    T, L, K = ex.shape
    spec = MoESpec(num_layers=L, num_experts=num_experts, top_k=K, name="test")
    w = np.ones(ex.shape, np.float32) if weights is None else np.asarray(weights, np.float32)
    return Trace(spec=spec, tokens=make_columns(T, **cols), experts_TLK=ex, weights_TLK=w, task_names=task_names)


def random_trace(seed: int, T: int = 300, L: int = 3, E: int = 8, K: int = 2, drop: float = 0.05) -> Trace:
    rng = np.random.default_rng(seed)
    ex = np.argsort(rng.random((T, L, E)), axis=-1)[..., :K].astype(np.int16)  # K distinct per token
    ex[rng.random(ex.shape) < drop] = -1
    step = np.sort(rng.integers(0, max(1, T // 20), T))
    req = np.arange(T) // 25
    o = rng.permutation(T)  # rows out of step order exercise the argsort path; each request stays causal
    return make_trace(ex[o], E, weights=rng.random(ex.shape), request=req[o], position=(np.arange(T) % 25)[o],
                      step=step[o], token_id=rng.integers(0, 20, T), task=req[o] % 2, task_names=("a", "b"))


def brute_counts(ex: np.ndarray, E: int) -> np.ndarray:
    T, L, K = ex.shape
    out = np.zeros((L, E), np.int64)
    for l in range(L):
        v = ex[:, l, :].ravel()
        np.add.at(out[l], v[v >= 0], 1)
    return out


# ---------------------------------------------------------------------------------------- golden values
def test_moegps_figure2_skewness_is_3():
    # MoE-GPS Figure 2: 4 experts, expert 1 takes 75% of the tokens -> 75 / 25 = 3.
    ex = np.r_[np.zeros(75), np.ones(9), np.full(8, 2), np.full(8, 3)].reshape(100, 1, 1)
    tr = make_trace(ex, 4, step=np.zeros(100))
    assert rs.skewness(tr.counts_LE())[0] == pytest.approx(3.0)
    s = rs.step_stats(tr, ep=4)
    assert s.skew_SL[0, 0] == pytest.approx(3.0)
    assert s.ir_SL[0, 0] == pytest.approx(3.0)  # one expert per rank: IR = skewness


def test_probe_ir_contiguous_sharding_by_hand():
    # E=8, ep=4: ranks hold {0,1},{2,3},{4,5},{6,7}; loads 8, 0, 2, 2 -> IR = 8 / 3.
    counts = np.array([4, 4, 0, 0, 1, 1, 1, 1])
    assert rs.rank_loads(counts, 4).tolist() == [8, 0, 2, 2]
    assert rs.imbalance_ratio(counts, 4) == pytest.approx(8 / 3)
    assert rs.skewness(counts) == pytest.approx(4 / 1.5)
    assert np.isnan(rs.skewness(np.zeros(8)))


def test_bad_ep_and_window_are_one_sentence_config_errors():
    tr = random_trace(0)
    with pytest.raises(ConfigError, match=r"ep is 3; expected a positive divisor of the number of experts 8\."):
        rs.step_stats(tr, ep=3)
    with pytest.raises(ConfigError, match=r"window is 0; expected a positive number of steps\."):
        rs.step_stats(tr, ep=2, window=0)
    with pytest.raises(ConfigError, match="seq_len is -4"):
        ss.sequence_skewness(tr, -4)


def test_entropy_and_popularity_bounds():
    c = np.array([[5, 5, 5, 5], [20, 0, 0, 0], [8, 4, 2, 2], [0, 0, 0, 0]])
    h = rs.entropy_bits(c)
    assert h[0] == pytest.approx(2.0) and h[1] == pytest.approx(0.0) and 0 < h[2] < 2 and np.isnan(h[3])
    pop = rs.popularity_curve(c[:3])
    assert np.allclose(pop.sum(1), 1.0) and (np.diff(pop, axis=1) <= 0).all()
    assert pop[2].tolist() == [0.5, 0.25, 0.125, 0.125]


def test_kurtosis_matches_definition_and_fixed_set_reference():
    from scipy.stats import kurtosis

    x = np.random.default_rng(1).random((5, 64))
    assert np.allclose(rs.pearson_kurtosis(x), kurtosis(x, axis=-1, fisher=True) + 3)
    # A token that always picks the same 6 of 64 experts (DeepSeek-MoE-16B geometry): s-MoE's ~8.8.
    row = np.r_[np.full(6, 10.0), np.zeros(58)]
    assert rs.pearson_kurtosis(row) == pytest.approx(rs.fixed_set_kurtosis(64, 6))
    assert rs.fixed_set_kurtosis(64, 6) == pytest.approx(8.77, abs=0.01)
    assert np.isnan(rs.pearson_kurtosis(np.full(8, 3.0)))


# ---------------------------------------------------------------------------------------- counts
@pytest.mark.parametrize("mask", [None, "bool", "index"])
def test_counts_LE_matches_brute_force_with_drops(mask):
    tr = random_trace(2, drop=0.2)
    m = None
    if mask == "bool":
        m = np.arange(tr.num_tokens) % 3 == 0
    elif mask == "index":
        m = np.array([5, 5, 17, 0])
    got = tr.counts_LE(m)
    want = brute_counts(tr.experts_TLK if m is None else tr.experts_TLK[m], 8)
    assert got.dtype == np.int64 and (got == want).all()
    assert (tr.counts_LE(np.zeros(tr.num_tokens, bool)) == 0).all()


@pytest.mark.parametrize(("chunk", "block"), [(1, 1 << 18), (3, 1 << 18), (7, 1 << 18), (1000, 1 << 18), (1000, 1)])
def test_iter_group_counts_streams_complete_groups(chunk, block, monkeypatch):
    monkeypatch.setattr(rs, "COUNT_BLOCK_ENTRIES", block)  # block=1: one group per chunk
    tr = random_trace(3, T=120)
    key = np.repeat(np.arange(12), [1, 30, 2, 2, 40, 1, 1, 10, 10, 10, 9, 4])  # groups span chunks
    vals, rank, order = rs.dense_ranks(key)
    assert order is None and vals.tolist() == list(range(12))
    seen = []
    for g0, c in rs.iter_group_counts(tr.experts_TLK, rank, 8, chunk_tokens=chunk):
        for i in range(len(c)):
            seen.append(g0 + i)
            assert (c[i] == brute_counts(tr.experts_TLK[key == g0 + i], 8)).all()
    assert seen == list(range(12))


def test_step_stats_agree_with_per_batch_brute_force():
    tr = random_trace(4, T=400)
    s = rs.step_stats(tr, ep=4, window=3)
    steps = [v for v, _ in tr.batches()]
    assert s.steps_S.tolist() == steps
    for i, (_, idx) in enumerate(tr.batches()):
        c = brute_counts(tr.experts_TLK[idx], 8)
        assert np.allclose(s.skew_SL[i], rs.skewness(c), equal_nan=True)
        assert np.allclose(s.ir_SL[i], rs.imbalance_ratio(c, 4), equal_nan=True)
        assert s.tokens_S[i] == len(idx)
    assert (s.counts_LE == brute_counts(tr.experts_TLK, 8)).all()


def test_drift_between_windows_and_trailing_window_left_out():
    # 5 steps of 4 tokens, window 2: windows {0,1} all expert 0, {2,3} all expert 1, step 4 is a tail.
    ex = np.r_[np.zeros(8), np.ones(8), np.full(4, 2)].reshape(20, 1, 1)
    tr = make_trace(ex, 4, step=np.arange(20) // 4)
    s = rs.step_stats(tr, ep=2, window=2)
    assert s.drift_WL.shape == (1, 1) and s.drift_WL[0, 0] == pytest.approx(2.0)
    same = make_trace(np.zeros((20, 1, 1)), 4, step=np.arange(20) // 4)
    assert rs.step_stats(same, ep=2, window=1).drift_WL.tolist() == [[0.0]] * 4


def test_sequence_skewness_cuts_requests_and_drops_short_tails():
    # One request of 1100 positions at seq_len 512: chunks of 512, 512 and a 76-token tail (left out).
    ex = (np.arange(1100) % 4).reshape(1100, 1, 1)
    ex[:512] = 0  # first sequence all on expert 0 -> skewness 4
    tr = make_trace(ex, 4, request=np.zeros(1100), position=np.arange(1100))
    out = ss.sequence_skewness(tr, 512)
    assert out.shape == (2, 1) and out[0, 0] == pytest.approx(4.0) and out[1, 0] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------- properties
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), ep=st.sampled_from([1, 2, 4, 8]), T=st.integers(1, 120))
def test_ratios_stay_in_their_bounds(seed, ep, T):
    tr = random_trace(seed, T=T, drop=0.1)
    s = rs.step_stats(tr, ep=ep)
    sk, ir = s.skew_SL[np.isfinite(s.skew_SL)], s.ir_SL[np.isfinite(s.ir_SL)]
    assert ((sk >= 1 - 1e-12) & (sk <= 8 + 1e-12)).all()
    assert ((ir >= 1 - 1e-12) & (ir <= ep + 1e-12)).all()
    h = rs.entropy_bits(s.counts_LE)
    assert ((h[np.isfinite(h)] >= -1e-12) & (h[np.isfinite(h)] <= 3 + 1e-12)).all()
    assert s.counts_LE.sum() == (tr.experts_TLK >= 0).sum()


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_transition_rows_are_distributions(seed):
    tr = random_trace(seed, T=50, L=4, drop=0.1)
    P = rs.transition_matrix(tr.experts_TLK, 8)
    assert P.shape == (3, 8, 8) and np.allclose(P.sum(-1), 1.0) and (P >= 0).all()


# ---------------------------------------------------------------------------------------- token level
def test_token_table_learns_a_deterministic_mapping():
    T, E = 400, 8
    tok = np.arange(T) % 30  # every request of 10 tokens holds one of three id ranges
    ex = np.stack([tok % E, (tok + 3) % E], axis=-1)[:, None, :]  # slot 0 is the top-1 (weight 1 vs 0.5)
    w = np.broadcast_to(np.array([1.0, 0.5]), ex.shape)
    tr = make_trace(ex, E, weights=w, token_id=tok, request=np.arange(T) // 10)
    fit, ev = rs.half_masks(tr, seed=0)
    assert fit.sum() == ev.sum() == 200 and not (fit & ev).any()
    part0 = tr.split(by="request", fractions=(0.5, 0.5), seed=0)[0]  # the same halves as Trace.split
    assert sorted(set(part0.request.tolist())) == sorted(set(tr.request[fit].tolist()))
    top1 = rs.top1_TL(tr.experts_TLK, tr.weights_TLK)
    assert (top1[:, 0] == tok % E).all()
    assert np.isin(tok[ev], tok[fit]).all()
    acc = rs.token_table_accuracy(tok[fit], top1[fit], tok[ev], top1[ev], tr.experts_TLK[ev], E)
    assert acc["table_top1"][0] == 1.0 and acc["table_hit"][0] == 1.0
    glob = np.bincount(top1[fit, 0], minlength=E).argmax()
    assert acc["global_top1"][0] == pytest.approx((top1[ev, 0] == glob).mean()) and acc["global_top1"][0] < 0.5
    # An id never seen in fit falls back to the global expert.
    miss = rs.token_table_accuracy(tok[fit], top1[fit], np.array([999]), np.array([[glob]]),
                                   np.array([[[glob, -1]]]), E)
    assert miss["table_top1"][0] == 1.0


def test_top1_ignores_dropped_slots():
    ex = np.array([[[3, -1]], [[-1, -1]]])
    w = np.array([[[0.1, 0.9]], [[0.5, 0.5]]])
    assert rs.top1_TL(ex.astype(np.int16), w).tolist() == [[3], [-1]]


def test_token_kurtosis_of_concentrated_tokens():
    T, E = 64, 16
    tok = np.arange(T) % 2
    # token 0 always picks experts {0, 1}; token 1 cycles through all experts (flat map -> low kurtosis).
    h = np.arange(T) // 2
    ex = np.where(tok[:, None] == 0, [0, 1], np.stack([h % E, (h + 8) % E], -1))
    ids, k = rs.token_kurtosis(tok, ex[:, None, :].astype(np.int16), E, min_count=4)
    assert ids.tolist() == [0, 1]
    assert k[0, 0] == pytest.approx(rs.fixed_set_kurtosis(E, 2))
    assert np.isnan(k[1, 0])  # each expert exactly 4 times: a constant map


def test_transition_predictor_follows_a_chain():
    T, E = 200, 8
    a = np.random.default_rng(6).integers(0, E, T)
    ex = np.stack([a, (a + 1) % E, (a + 2) % E], axis=1)[:, :, None]  # layer l+1 = layer l + 1
    P = rs.transition_matrix(ex.astype(np.int16), E)
    assert np.allclose(P[0][np.arange(E), (np.arange(E) + 1) % E], 1.0)
    acc = rs.transition_accuracy(P, ex.astype(np.int16), ex[:, :, 0].astype(np.int16))
    assert acc.tolist() == [1.0, 1.0]


def test_task_distances_disjoint_tasks_and_identical_halves():
    # task a always on expert 0, task b on expert 1; each task has 4 requests.
    T = 80
    req = np.arange(T) // 10
    task = req % 2
    tr = make_trace(task.reshape(T, 1, 1), 4, request=req, task=task, task_names=("a", "b"))
    d = ss.task_distances(tr, seed=0)
    assert d["tasks"] == ["a", "b"]
    assert d["l1_nnL"][0, 1, 0] == pytest.approx(2.0) and d["l1_nnL"][0, 0, 0] == 0.0
    assert np.allclose(d["half_l1_nL"], 0.0)


# ---------------------------------------------------------------------------------------- bundle + CLI
def test_routing_stats_is_json_and_formats():
    tr = random_trace(7, T=600, L=3)
    d = routing_stats(tr, ep=4, window=2, seq_len=50, max_tokens=200, max_step_rows=5)
    json.dumps(d, allow_nan=False)  # NaN must have become None
    assert d["steps"]["pool"] > 1 and len(d["steps"]["ir_SL"]) <= 5
    assert all(len(v) == 3 for v in d["per_layer"].values())
    assert d["per_layer"]["transition_top1"][0] is None
    assert d["token_sample"]["fit"] <= 100 and d["token_sample"]["scored"] <= 100
    assert d["overall"]["skewness"] == pytest.approx(np.mean(d["per_layer"]["skewness"]), abs=1e-5)
    text = format_stats(d)
    lines = text.splitlines()
    assert any(line.startswith("all ") for line in lines) and sum(line[:2] in ("0 ", "1 ", "2 ") for line in lines) == 3
    with pytest.raises(ConfigError, match="max_tokens is 1"):
        routing_stats(tr, max_tokens=1)


def test_routing_stats_sees_planted_token_and_task_structure():
    # Token id picks the expert 80% of the time; task 0 (ids 0-49) uses experts 0-3, task 1 (ids 50-99) 4-7.
    rng = np.random.default_rng(11)
    T, L, E = 4000, 2, 8
    req = np.arange(T) // 40
    task = req % 2
    tok = rng.integers(0, 50, T) + 50 * task
    planted = (tok[:, None] * 3 + np.arange(L)) % 4
    noise = rng.integers(0, 4, (T, L))
    ex = (np.where(rng.random((T, L)) < 0.8, planted, noise) + 4 * task[:, None])[..., None]
    tr = make_trace(ex, E, request=req, task=task, token_id=tok, step=np.arange(T) // 100, task_names=("a", "b"))
    d = routing_stats(tr, ep=2)
    o = d["overall"]
    assert o["table_top1"] > o["global_top1"] + 0.4 and o["table_top1"] > 0.75
    assert o["task_l1_mean"] > 1.9 and o["task_half_l1_mean"] < 0.2
    assert o["kurtosis_median"] > 2 * d["reference"]["kurtosis_fixed_set"] / 3


def test_grouped_choice_effect_separates_group_limit_and_bias():
    from routecast.trace.stats import grouped_choice_effect

    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    # E=4 in 2 groups of 2, one group eligible, top-2. Token 0: sigmoid scores 0.9 0.1 | 0.8 0.7 -> group 1
    # wins (1.5 > 1.0) and runs {2, 3}; unconstrained top-2 would be {0, 2}. Token 1: 0.9 0.8 | 0.1 0.2 runs
    # {0, 1}, the same as unconstrained. Layer 1: a bias of +0.9 on expert 3 makes token 1 run {0, 3}.
    s = np.array([[0.9, 0.1, 0.8, 0.7], [0.9, 0.8, 0.1, 0.2]])
    logits = np.stack([logit(s), logit(s)], axis=1)  # (T=2, L=2, E=4)
    ids = np.array([[[2, 3], [2, 3]], [[0, 1], [0, 3]]])
    bias = np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.9]])
    out = grouped_choice_effect(logits, ids, bias)
    assert out["group_changed"].tolist() == [0.5, 0.5]  # layer 1 token 1: {0, 3} is also the biased top-2
    assert out["bias_changed"].tolist() == [0.5, 1.0]
