"""Shared fixtures: `small_trace` (a factory of small random Traces) and `assert_trace_equal`."""

from __future__ import annotations

import numpy as np
import pytest

from routecast.trace.spec import MoESpec
from routecast.trace.trace import COLUMNS, DECODE, PREFILL, Trace, make_columns


def pytest_configure(config: pytest.Config) -> None:
    import torch  # here, not at import: subprocesses that import this module for build_small_trace stay light

    torch.set_num_threads(1)  # the test machine's cores are shared


def server_schedule(R: int, P: int, D: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(request, position, phase, step) of R requests with P prompt and D decode tokens, in step order.

    Each request's prompt is one step (0..R-1); decode round d batches every request's d-th token (R + d).
    """
    req = np.repeat(np.arange(R), P + D)
    pos = np.tile(np.arange(P + D), R)
    phase = np.where(pos < P, PREFILL, DECODE)
    step = np.where(phase == PREFILL, req, R + pos - P)
    order = np.lexsort((req, step))
    return req[order], pos[order], phase[order], step[order]


def build_small_trace(num_requests: int = 4, prompt_len: int = 6, decode_len: int = 4, *, num_layers: int = 3,
                      num_experts: int = 8, top_k: int = 2, logits: bool = False, hidden: int = 0,
                      tasks: tuple[str, ...] = ("qa", "code"), dropped: float = 0.0, seed: int = 0) -> Trace:
    """A Trace of num_requests requests, each prompt_len prefill tokens then decode_len decode tokens.

    Each request is its own source document (id 100 + request). Steps follow a simple server: each request's prompt is one step (steps 0..R-1), then decode round d
    batches every request's d-th generated token (step R + d). Rows are in step order, then request.
    Routing: top_k of softmax(logits) with a skewed per-expert bias (hot experts exist, as in real MoE);
    `dropped` is the fraction of (token, layer, k) slots set to -1 with weight 0. hidden > 0 adds
    hidden_TLH float16 (T, L, hidden); logits=True adds logits_TLE float32.
    """
    rng = np.random.default_rng(seed)
    R, P, D, L, E, K = num_requests, prompt_len, decode_len, num_layers, num_experts, top_k
    req, pos, phase, step = server_schedule(R, P, D)
    T = req.size
    lg = (rng.standard_normal((T, L, E)) + rng.gamma(1.0, 1.5, size=(1, L, E))).astype(np.float32)
    ids = np.argsort(-lg, axis=-1, kind="stable")[..., :K]
    top = np.take_along_axis(lg, ids, axis=-1)
    w = np.exp(top - top.max(axis=-1, keepdims=True))
    w = (w / w.sum(axis=-1, keepdims=True)).astype(np.float32)
    ids = ids.astype(np.int16)
    if dropped:
        drop = rng.random(ids.shape) < dropped
        ids[drop], w[drop] = -1, 0.0
    tokens = make_columns(T, request=req, position=pos, token_id=rng.integers(0, 1000, T), phase=phase,
                          step=step, task=req % len(tasks) if tasks else np.full(T, -1), source=np.zeros(T),
                          arrival_s=req * 0.25, document=100 + req)
    return Trace(
        spec=MoESpec(num_layers=L, num_experts=E, top_k=K, hidden_size=hidden, name="tiny-moe"),
        tokens=tokens, experts_TLK=ids, weights_TLK=w, logits_TLE=lg if logits else None,
        hidden_TLH=rng.standard_normal((T, L, hidden)).astype(np.float16) if hidden else None,
        task_names=tasks, source_names=("synthetic",), provenance={"generator": "small_trace", "seed": seed},
    )


def _assert_trace_equal(a: Trace, b: Trace, *, check_provenance: bool = True) -> None:
    """Bit-identical comparison of two Traces (values and dtypes of every array)."""
    assert a.spec == b.spec
    assert (a.task_names, a.source_names) == (b.task_names, b.source_names)
    if check_provenance:
        assert a.provenance == b.provenance
    for c in COLUMNS:
        assert a.tokens[c].dtype == b.tokens[c].dtype, c
        np.testing.assert_array_equal(a.tokens[c], b.tokens[c], err_msg=c)
    for name in ("experts_TLK", "weights_TLK", "logits_TLE", "hidden_TLH"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape, name
            assert np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes(), name


@pytest.fixture
def small_trace():
    """Factory: small_trace(num_requests=4, prompt_len=6, decode_len=4, *, num_layers, num_experts, top_k,
    logits, hidden, tasks, dropped, seed) -> Trace (see build_small_trace)."""
    return build_small_trace


@pytest.fixture
def assert_trace_equal():
    """assert_trace_equal(a, b, *, check_provenance=True): bit-identical Trace comparison."""
    return _assert_trace_equal
