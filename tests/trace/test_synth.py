"""Synthetic traces: exactness of the sampler, invariants, batching, knobs, presets and calibration."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.common.errors import ConfigError
from routecast.trace import synth as S
from routecast.trace.synth import SynthConfig, generate
from routecast.trace.synth_presets import (
    CALIBRATION,
    PRESETS,
    calibrate_preset_table,
    next_layer_accuracy,
    preset_config,
    synth_to_disk,
    token_table_accuracy,
    with_overrides,
)
from routecast.trace.trace import DECODE, PREFILL

SMALL = SynthConfig(num_layers=3, num_experts=16, top_k=2, num_tokens=6000, token_strength=2.0,
                    request_strength=1.0, layer_strength=1.5, task_names=("a", "b"), task_divergence=0.5,
                    drift_sigma=0.2, drift_window=8, prompt_len=(200.0, 40.0), prompt_sigma=0.5,
                    output_len=(30.0, 5.0), output_sigma=0.5, token_budget=1024, max_running=48)


# ---------------------------------------------------------------- the sampler is dense Gumbel-top-k
@pytest.mark.parametrize("grouped", [False, True])
def test_lazy_sampler_matches_dense_gumbel_top_k(grouped):
    # One layer, one token id, no requests' bonuses: every token has the same scores, so the empirical
    # distribution of its routing must match dense Gumbel-top-k on the reconstructed scores.
    cfg = SynthConfig(num_layers=1, num_experts=16, top_k=3, n_group=4 if grouped else 1,
                      topk_group=2 if grouped else 1, num_tokens=60000, vocab_size=1, token_strength=2.5,
                      token_fanout=3, popularity_alpha=1.2, prompt_len=(1000.0,), output_len=(0.0,),
                      token_budget=4096, seed=3)
    tr = generate(cfg)
    streams = np.random.SeedSequence(cfg.seed).spawn(6)
    ctx = S._Contexts(cfg, {"step": tr.step, "task": tr.task}, np.random.default_rng(streams[2]),
                      np.random.default_rng(streams[3]))
    score = ctx.layer(0)["logp"].reshape(-1, 16)[0].astype(np.float64)
    bonus_ids = S._token_start(cfg, tr.token_id[:1], streams[5].generate_state(2, dtype=np.uint32)[0])[0]
    np.add.at(score, bonus_ids, 2.5 * S._profile(3))
    rng = np.random.default_rng(0)
    n = 200000
    noisy = score + rng.gumbel(size=(n, 16))
    if grouped:
        gm = np.log(np.exp(score).reshape(4, 4).sum(1)) + rng.gumbel(size=(n, 4))
        keep = np.zeros((n, 4), bool)
        keep[np.arange(n)[:, None], np.argsort(-gm, axis=1)[:, :2]] = True
        noisy = np.where(np.repeat(keep, 4, axis=1), noisy, -np.inf)
    ref = np.argsort(-noisy, axis=1)[:, :3]
    got = tr.experts_TLK[:, 0].astype(np.int64)
    for k in range(3):  # distribution of the k-th expert (by weight), and of the set
        f_ref = np.bincount(ref[:, k], minlength=16) / n
        f_got = np.bincount(got[:, k], minlength=16) / got.shape[0]
        assert np.abs(f_ref - f_got).max() < 0.008
    sel = np.take_along_axis(noisy, ref, axis=1)
    w = np.exp(sel - sel[:, :1])
    w /= w.sum(axis=1, keepdims=True)
    assert abs(w[:, 0].mean() - tr.weights_TLK[:, 0, 0].mean()) < 0.005


# ---------------------------------------------------------------- invariants and determinism
def test_determinism_and_seed():
    a, b = generate(SMALL), generate(SMALL)
    assert np.array_equal(a.experts_TLK, b.experts_TLK) and np.array_equal(a.weights_TLK, b.weights_TLK)
    assert all(np.array_equal(a.tokens[k], b.tokens[k]) for k in a.tokens)
    c = generate(dataclasses.replace(SMALL, seed=1))
    assert not np.array_equal(a.experts_TLK[:1000], c.experts_TLK[:1000])


def _check_routing(tr):
    e, w = tr.experts_TLK, tr.weights_TLK
    assert e.min() >= 0 and e.max() < tr.spec.num_experts
    s = np.sort(e, axis=-1)
    assert not (s[..., 1:] == s[..., :-1]).any(), "an expert repeats inside a token's top-k"
    assert np.allclose(w.sum(-1), 1.0, atol=1e-5)
    assert (np.diff(w, axis=-1) <= 1e-7).all(), "experts are ordered by weight, descending"


def test_routing_invariants_grouped():
    cfg = SynthConfig(num_layers=4, num_experts=64, top_k=6, n_group=8, topk_group=3, num_tokens=4000,
                      token_strength=3.0, token_fanout=6, request_strength=1.0, layer_strength=1.0,
                      popularity_alpha=1.5, prompt_len=(300.0,), output_len=(20.0,), token_budget=1024)
    tr = generate(cfg)
    _check_routing(tr)
    groups = np.sort(tr.experts_TLK // 8, axis=-1)
    n_groups = 1 + (np.diff(groups, axis=-1) > 0).sum(-1)
    assert n_groups.max() <= 3, "group-limited routing uses at most topk_group groups"
    _check_routing(generate(SMALL))


@settings(max_examples=25, deadline=None)
@given(E=st.sampled_from([1, 4, 8, 16]), k=st.integers(1, 8), g=st.sampled_from([1, 2, 4]), tg=st.integers(1, 4),
       alpha=st.floats(0, 8), dirichlet=st.booleans(), tok=st.floats(0, 60), lay=st.floats(0, 60),
       req=st.floats(0, 60), fan=st.integers(1, 9), seed=st.integers(0, 1000))
def test_routing_invariants_hold_for_extreme_knobs(E, k, g, tg, alpha, dirichlet, tok, lay, req, fan, seed):
    k, g = min(k, E), min(g, E)
    tg = min(tg, g)
    if tg * (E // g) < k:
        tg = g
    cfg = SynthConfig(num_layers=3, num_experts=E, top_k=k, n_group=g, topk_group=tg, num_tokens=600,
                      popularity="dirichlet" if dirichlet else "zipf", popularity_alpha=max(alpha, 1e-3),
                      token_strength=tok, token_fanout=fan, layer_strength=lay, layer_fanout=fan,
                      request_strength=req, request_fanout=fan, prompt_len=(50.0,), output_len=(5.0,),
                      token_budget=128, seed=seed)
    tr = generate(cfg)
    _check_routing(tr)
    assert np.isfinite(tr.weights_TLK).all()


# ---------------------------------------------------------------- batching
def _check_batching(tr, cfg):
    req, pos, step, ph = (tr.tokens[k] for k in ("request", "position", "step", "phase"))
    key = req.astype(np.int64) * 1_000_000 + pos
    assert np.unique(key).size == key.size, "a (request, position) is in more than one step"
    assert (np.diff(step) >= 0).all(), "tokens are in processing order"
    counts = np.bincount(step)
    assert counts.max() <= cfg.token_budget
    for r, idx in tr.requests():
        p = pos[idx]
        order = np.argsort(p)
        assert np.array_equal(p[order], np.arange(p.size)), f"request {r} has a gap"
        s, f = step[idx][order], ph[idx][order]
        assert (np.diff(s) >= 0).all() and (np.diff(f) >= 0).all(), "prefill before decode, steps in order"
        dec = s[f == DECODE]
        assert (np.diff(dec) == 1).all(), "one decode token per step"
        if dec.size:
            assert dec[0] == s[f == PREFILL].max() + 1
    # at most max_running requests have tokens in one step
    pairs = np.unique(step.astype(np.int64) * 1_000_000 + req)
    assert np.bincount(pairs // 1_000_000).max() <= cfg.max_running


@settings(max_examples=12, deadline=None)
@given(budget=st.integers(16, 600), running=st.integers(1, 40), p=st.floats(1, 300), o=st.floats(0, 60),
       rate=st.sampled_from([float("inf"), 50.0, 2000.0]), seed=st.integers(0, 100))
def test_batching_conserves_tokens(budget, running, p, o, rate, seed):
    cfg = SynthConfig(num_layers=1, num_experts=4, top_k=1, num_requests=25, prompt_len=(p,), prompt_sigma=0.7,
                      output_len=(o,), output_sigma=0.7, token_budget=budget, max_running=running,
                      arrival_rate=rate, seed=seed)
    tr = generate(cfg)
    _check_batching(tr, cfg)
    # every request runs to completion in num_requests mode, and arrivals come in request order
    assert np.unique(tr.request).size == 25
    first = np.unique(tr.request, return_index=True)[1]
    assert (np.diff(tr.arrival_s[first]) >= 0).all()


def test_token_budget_mode_stops_at_target():
    tr = generate(SMALL)
    _check_batching(tr, SMALL)
    last = tr.step.max()
    assert tr.num_tokens >= SMALL.num_tokens > tr.num_tokens - (tr.step == last).sum()
    assert set(np.unique(tr.phase)) == {PREFILL, DECODE}


# ---------------------------------------------------------------- knobs change what they should
def _window_l1(tr, window):
    w = tr.step // window
    n = w.max() + 1
    c = np.stack([tr.counts_LE(w == i) for i in range(n)]).astype(float)
    p = c / c.sum(-1, keepdims=True)
    return np.abs(np.diff(p, axis=0)).sum(-1).mean(), p


def test_drift_sigma_grows_window_l1():
    base = dataclasses.replace(SMALL, num_tokens=30000, token_budget=256, drift_window=10, layer_strength=0.0,
                               token_strength=0.0, request_strength=0.0, task_divergence=0.0)
    l1 = [_window_l1(generate(dataclasses.replace(base, drift_sigma=s)), 10)[0] for s in (0.0, 0.3, 0.8)]
    assert l1[0] + 0.05 < l1[1] and l1[1] + 0.1 < l1[2], l1


def test_shift_jumps_at_its_step():
    cfg = dataclasses.replace(SMALL, num_tokens=30000, token_budget=256, drift_sigma=0.0, shift_step=60,
                              shift_task_mix=(0.0, 1.0), task_stickiness=0.8)
    tr = generate(cfg)
    _, p = _window_l1(tr, 20)  # windows of 20 steps: 0-19, 20-39, 40-59 | 60-79, ...
    before = np.abs(p[2] - p[1]).sum(-1).mean()
    across = np.abs(p[3] - p[2]).sum(-1).mean()
    assert across > 3 * before, (before, across)
    first = np.unique(tr.request, return_index=True)[1]  # a request's first token: its admission step
    late = tr.step[first] >= 60
    assert late.any() and (tr.task[first][late] == 1).all() and (tr.task[first][~late] == 0).any()


def test_token_affinity_raises_token_table_accuracy():
    base = dataclasses.replace(SMALL, num_tokens=20000, vocab_size=500, layer_strength=0.0, request_strength=0.0)
    lo = token_table_accuracy(generate(dataclasses.replace(base, token_strength=0.0)))
    hi = token_table_accuracy(generate(dataclasses.replace(base, token_strength=4.0)))
    assert hi > lo + 0.25, (lo, hi)


def test_layer_affinity_raises_next_layer_accuracy():
    base = dataclasses.replace(SMALL, num_tokens=20000, token_strength=0.0, request_strength=0.0)
    lo = next_layer_accuracy(generate(dataclasses.replace(base, layer_strength=0.0)))
    hi = next_layer_accuracy(generate(dataclasses.replace(base, layer_strength=4.0)))
    assert hi > lo + 0.25, (lo, hi)


# ---------------------------------------------------------------- presets and calibration
def test_preset_geometry():
    spec = {n: f().spec() for n, f in PRESETS.items()}
    assert (spec["mixtral-8x7b"].num_layers, spec["mixtral-8x7b"].num_experts, spec["mixtral-8x7b"].top_k) == (32, 8, 2)
    assert spec["mixtral-8x7b"].expert_bytes == 3 * 4096 * 14336 * 2
    d = spec["deepseek-v3"]
    assert (d.num_layers, d.num_experts, d.top_k, d.n_group, d.topk_group, d.hidden_size) == (58, 256, 8, 8, 4, 7168)
    assert d.layer_ids == tuple(range(3, 61)) and d.num_shared_experts == 1
    assert (spec["qwen3-235b"].num_layers, spec["qwen3-235b"].top_k, spec["qwen3-235b"].num_experts) == (94, 8, 128)
    g = spec["gpt-oss-120b"]
    assert (g.num_layers, g.num_experts, g.top_k, g.hidden_size) == (36, 128, 4, 2880)
    s = spec["switch-128"]
    assert (s.num_layers, s.num_experts, s.top_k, s.hidden_size) == (12, 128, 1, 768)
    assert s.layer_ids == (1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23)
    assert {c.preset for c in CALIBRATION} == set(PRESETS), "every preset states a statistic"
    for name, f in PRESETS.items():
        doc = f.__doc__ or ""
        assert "Reproduces" in doc, f"{name} does not document the statistic it reproduces"


def test_every_preset_within_10pct_of_its_statistic():
    rows = calibrate_preset_table()
    assert len(rows) == len(CALIBRATION)
    bad = [r for r in rows if not r["within_10pct"]]
    assert not bad, bad


# ---------------------------------------------------------------- configuration errors and the CLI path
def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"SynthConfig.top_k is 9"):
        SynthConfig(top_k=9)
    with pytest.raises(ConfigError, match="task_sharpness"):
        SynthConfig(task_names=("a", "b", "c"), task_sharpness=(1.0, 2.0))
    with pytest.raises(ConfigError, match="topk_group"):
        SynthConfig(num_experts=16, top_k=8, n_group=4, topk_group=1)
    with pytest.raises(ConfigError, match="unknown knob 'bogus'.*drift_sigma"):
        with_overrides(SMALL, {"bogus": "1"})
    with pytest.raises(ConfigError, match="top_k = '2.5'"):
        with_overrides(SMALL, {"top_k": "2.5"})
    with pytest.raises(ConfigError, match="--preset is 'nope'.*mixtral-8x7b"):
        preset_config("nope")
    with pytest.raises(ConfigError, match="--tokens"):
        preset_config("mixtral-8x7b", tokens=10, requests=3)


def test_overrides_parse_to_field_types():
    cfg = with_overrides(SMALL, {"drift_sigma": "0.5", "task_names": "x,y", "prompt_len": "10,20",
                                 "num_tokens": "1e4", "arrival_rate": "inf"})
    assert cfg.drift_sigma == 0.5 and cfg.task_names == ("x", "y") and cfg.prompt_len == (10.0, 20.0)
    assert cfg.num_tokens == 10000 and cfg.arrival_rate == float("inf")


def test_synth_to_disk_round_trip(tmp_path):
    from routecast.trace.io import read_trace

    path = synth_to_disk("switch-128", tmp_path / "t", tokens=3000, seed=2, overrides={"drift_sigma": "0.1"})
    back = read_trace(path)
    ref = generate(preset_config("switch-128", tokens=3000, seed=2, overrides={"drift_sigma": "0.1"}))
    assert np.array_equal(np.asarray(back.experts_TLK), ref.experts_TLK)
    assert back.provenance["preset"] == "switch-128" and back.task_names == ref.task_names


@pytest.mark.slow
def test_deepseek_v3_two_million_records_in_seconds():
    cfg = preset_config("deepseek-v3", tokens=35000)
    t0 = time.process_time()
    tr = generate(cfg)
    secs = time.process_time() - t0
    assert tr.num_tokens * tr.spec.num_layers >= 2_000_000
    _check_routing(tr)
    assert secs < 30, secs
