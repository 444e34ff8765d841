"""The reuse probe: distances against brute force, a planted signal found, causality per layer, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routecast.cache.objreplay import step_uses
from routecast.common.errors import ConfigError
from routecast.predict.reuse_probe import fit_reuse_probe, probe_steps, reuse_distances
from routecast.trace import MoESpec, Trace, make_columns


def brute_distances(req, pos, ex, E, cap):
    n, L, _ = ex.shape
    out = np.full((n, L * E), float(cap))
    for i in range(n):
        for j in range(i + 1, n):
            if req[j] != req[i]:
                continue
            for lay in range(L):
                for e in ex[j, lay]:
                    if e >= 0:
                        k = lay * E + e
                        out[i, k] = min(out[i, k], min(pos[j] - pos[i], cap))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 30), L=st.integers(1, 3), E=st.integers(2, 6),
       cap=st.integers(2, 12), drop=st.floats(0.0, 0.6))
def test_reuse_distances_equal_brute_force(seed, n, L, E, cap, drop):
    rng = np.random.default_rng(seed)
    req = np.sort(rng.integers(0, 4, n))
    pos = np.concatenate([np.cumsum(rng.integers(1, 3, (req == r).sum())) for r in np.unique(req)])
    ex = rng.integers(0, E, (n, L, 2))
    ex[rng.random(ex.shape) < drop] = -1
    got = reuse_distances(req, pos, ex, E, cap)
    np.testing.assert_array_equal(got, brute_distances(req, pos, ex, E, cap))


def planted_trace(seed: int, requests: int = 12, length: int = 40, L: int = 2, E: int = 8, hidden: bool = True) -> Trace:
    """Each token's router inputs at layer 0 name the expert its request's next token uses at every layer."""
    rng = np.random.default_rng(seed)
    T = requests * length
    nxt = rng.integers(0, E, (requests, length + 1))
    ex = np.repeat(nxt[:, :length, None], L, axis=2).reshape(T, L)[..., None].astype(np.int16)
    h = np.zeros((T, L, E), np.float32)
    h[np.arange(T), 0, nxt[:, 1:].reshape(T)] = 1.0  # the next token's expert
    h[:, 1:] = rng.normal(size=(T, L - 1, E))  # noise at later layers
    req = np.repeat(np.arange(requests), length)
    pos = np.tile(np.arange(length), requests)
    step = pos + 2 * req  # requests overlap in steps, as under continuous batching
    return Trace(spec=MoESpec(num_layers=L, num_experts=E, top_k=1, hidden_size=E, expert_bytes=1 << 10),
                 tokens=make_columns(T, request=req, position=pos, step=step), experts_TLK=ex,
                 weights_TLK=np.ones(ex.shape, np.float32), hidden_TLH=h if hidden else None)


@pytest.mark.parametrize("target", ["log", "inv-sqrt"])
def test_probe_finds_a_planted_next_expert_on_held_out_requests(target):
    tr = planted_trace(0)
    train = np.asarray(tr.tokens["request"]) < 8
    probe = fit_reuse_probe(tr, train, cap=16, target=target)
    test = ~train & (np.asarray(tr.tokens["position"]) < 39)  # a last token has no next one
    logd = probe.predict(np.asarray(tr.hidden_TLH)[test])
    E = tr.spec.num_experts
    want = np.asarray(tr.experts_TLK)[np.flatnonzero(test) + 1, 0, 0]
    assert (logd[:, 0, :E].argmin(1) == want).mean() > 0.9
    assert logd.min() >= 0 and logd.max() <= np.log(16) + 1e-6


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), layer=st.integers(0, 2), target=st.sampled_from(["log", "inv-sqrt"]))
def test_row_l_reads_router_inputs_up_to_layer_l_only(seed, layer, target):
    tr = planted_trace(seed, requests=4, length=10, L=3, E=4)
    probe = fit_reuse_probe(tr, cap=8, target=target)
    h = np.asarray(tr.hidden_TLH).copy()
    before = probe.predict(h)
    h[:, layer + 1:] += np.random.default_rng(seed).normal(size=h[:, layer + 1:].shape).astype(np.float32)
    after = probe.predict(h)
    np.testing.assert_array_equal(before[:, :layer + 1], after[:, :layer + 1])


def test_probe_steps_follow_the_replays_steps_and_requests():
    tr = planted_trace(1)
    rows = np.asarray(tr.tokens["request"]) % 3 == 0
    probe = fit_reuse_probe(tr, ~rows)
    got = probe_steps(probe, tr, rows)
    _, uses = step_uses(tr.select(rows))
    assert len(got) == len(uses)
    L, E = tr.spec.num_layers, tr.spec.num_experts
    for g, u in zip(got, uses, strict=True):
        assert g.shape == (len(u.requests), L, L * E)
    # a request's row comes from its last token in the step: here the only one, so equal to predict on it
    idx = np.flatnonzero(rows & (np.asarray(tr.step) == 0))
    np.testing.assert_array_equal(got[0], probe.predict(np.asarray(tr.hidden_TLH)[idx]))
    assert probe_steps(probe, tr, np.zeros(tr.num_tokens, bool)) == []


def test_refusals_name_what_is_wrong():
    with pytest.raises(ConfigError, match="no router inputs"):
        fit_reuse_probe(planted_trace(0, hidden=False))
    tr = planted_trace(0)
    with pytest.raises(ConfigError, match="expected cap >= 2"):
        fit_reuse_probe(tr, cap=1)
    with pytest.raises(ConfigError, match="expected cap >= 2 tokens and lam > 0"):
        fit_reuse_probe(tr, lam=float("nan"))
    with pytest.raises(ConfigError, match="at least 2"):
        fit_reuse_probe(tr, np.zeros(tr.num_tokens, bool))
    with pytest.raises(ConfigError, match="target 'sqrt'; expected one of log, inv-sqrt"):
        fit_reuse_probe(tr, target="sqrt")
    from routecast.predict.reuse_probe import ReuseProbe
    with pytest.raises(ConfigError, match="target 'sqrt'; expected one of log, inv-sqrt"):
        ReuseProbe(weights=(), cap=8, num_layers=0, num_experts=1, hidden_size=1, target="sqrt")
    probe = fit_reuse_probe(tr)
    with pytest.raises(ConfigError, match="the shape it was fitted on"):
        probe.predict(np.zeros((3, 2, 5)))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), chunk=st.integers(1, 200))
def test_chunked_fit_equals_one_chunk(seed, chunk):
    """Summing the normal equations over chunks of whole requests gives the weights of one pass (a reuse never
    crosses a request, so no distance changes at a cut)."""
    tr = planted_trace(seed, requests=6, length=12, L=2, E=4)
    rows = np.random.default_rng(seed).random(tr.num_tokens) < 0.8
    one = fit_reuse_probe(tr, rows, cap=8, chunk_rows=10**9)
    many = fit_reuse_probe(tr, rows, cap=8, chunk_rows=chunk)
    for a, b in zip(one.weights, many.weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), B=st.integers(1, 3), L=st.integers(1, 4), H=st.integers(1, 12),
       E=st.integers(1, 6), prefill=st.booleans(), target=st.sampled_from(["log", "inv-sqrt"]))
def test_runtime_probe_row_equals_predict(seed, B, L, H, E, prefill, target):
    """probe_row (the runtime's compiled row: the bias row first, layers written into x as they run) gives
    ReuseProbe.predict's rows, for decode (contiguous) and prefill (strided last-token) views of the router inputs."""
    from routecast.predict.reuse_probe import ReuseProbe, probe_row

    rng = np.random.default_rng(seed)
    K = L * E
    mid = 1.5 if target == "log" else 0.4  # outputs around the middle of each target's range, both clips reached
    scale = 0.3 if target == "log" else 0.1
    ws = tuple(rng.normal(0, scale, ((li + 1) * H + 1, K)) + np.r_[np.zeros((li + 1) * H), mid][:, None]
               for li in range(L))
    probe = ReuseProbe(weights=ws, cap=32, num_layers=L, num_experts=E, hidden_size=H, target=target)
    hid = rng.normal(0, 1, (B, L, H))
    want = probe.predict(hid)
    x = np.ones((B, 1 + L * H), np.float32)
    for li in range(L):
        w = np.ascontiguousarray(np.vstack([ws[li][-1:], ws[li][:-1]]), np.float32)
        seq = np.zeros((B, 3 if prefill else 1, H), np.float32)
        seq[:, -1] = hid[:, li]
        got = probe_row(x, seq[:, -1], w, li, float(np.log(32)), target == "inv-sqrt")
        np.testing.assert_allclose(got, want[:, li], atol=2e-4)


def test_adapting_probe_with_weight_zero_is_the_fixed_probe():
    from routecast.predict.reuse_probe import adapting_probe_steps
    tr = planted_trace(1)
    rows = np.asarray(tr.tokens["request"]) % 3 == 0
    got = adapting_probe_steps(tr, ~rows, rows, weight=0.0)  # defaults: inv-sqrt, cap 256
    want = probe_steps(fit_reuse_probe(tr, ~rows, cap=256, target="inv-sqrt"), tr, rows)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="expected weight >= 0"):
        adapting_probe_steps(tr, ~rows, rows, weight=float("nan"))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), cut=st.integers(1, 60), every=st.integers(1, 8))
def test_adapting_probe_reads_no_later_routing(seed, cut, every):
    """The forecast for step s is unchanged when the routing of steps >= s is rewritten (it learns only from
    rows whose distances the replay has seen in full)."""
    from routecast.predict.reuse_probe import adapting_probe_steps
    tr = planted_trace(seed, requests=9, length=16, L=2, E=4)
    rows = np.asarray(tr.tokens["request"]) % 3 == 0
    before = adapting_probe_steps(tr, ~rows, rows, weight=4.0, every=every, cap=4)
    step = np.asarray(tr.step)
    ex = np.asarray(tr.experts_TLK).copy()
    late = (step >= cut) & rows  # the replayed rows only: the training rows are fitted before the replay
    ex[late] = np.random.default_rng(seed).integers(0, 4, ex[late].shape)
    tr2 = Trace(spec=tr.spec, tokens=tr.tokens, experts_TLK=ex, weights_TLK=tr.weights_TLK, hidden_TLH=tr.hidden_TLH)
    after = adapting_probe_steps(tr2, ~rows, rows, weight=4.0, every=every, cap=4)
    steps = np.unique(step[rows])
    for s, a, b in zip(steps, before, after, strict=True):
        if s <= cut:
            np.testing.assert_array_equal(a, b)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), every=st.integers(1, 8), cap=st.integers(2, 6))
def test_causal_joins_gives_each_row_once_after_its_distances_are_known(seed, every, cap):
    """Every replayed row joins at most once, never before a step after the one in which its request reached
    position p + cap (or ended), and with the distances reuse_distances gives it over its whole request."""
    from routecast.predict.reuse_probe import causal_joins, reuse_distances
    tr = planted_trace(seed, requests=9, length=16, L=2, E=4)
    rows = np.asarray(tr.tokens["request"]) % 3 == 0
    req, pos, step = (np.asarray(tr.tokens["request"]), np.asarray(tr.tokens["position"]), np.asarray(tr.step))
    idx = np.flatnonzero(rows)
    o = np.lexsort((pos[idx], req[idx]))
    idx = idx[o]
    full = dict(zip(idx.tolist(), reuse_distances(req[idx], pos[idx], np.asarray(tr.experts_TLK)[idx], 4, cap),
                    strict=True))
    seen, steps = set(), []
    for last, joins in causal_joins(tr, rows, cap=cap, every=every):
        now = int(step[last[0]])
        assert (step[last] == now).all()
        steps.append(now)
        if joins is None:
            continue
        ids, d = joins
        assert len(ids) >= every and not seen & set(ids.tolist())
        seen |= set(ids.tolist())
        for t, dt in zip(ids.tolist(), d, strict=True):
            np.testing.assert_array_equal(dt, full[t])
            mine = (req == req[t]) & rows
            later = mine & (pos >= pos[t] + cap)
            known = step[later].min() if later.any() else step[mine].max()
            assert known < now
    assert steps == sorted(set(step[rows].tolist()))
