"""The CPU expert kernel: each row of numba's bf16 SwiGLU round equals an fp64 torch reference (and so does its
fallback without numba) over generated shapes, slots (repeats included) and weights; bad pools, slots and buffers
are refused before the compiled loop runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.runtime.offload import expert_kernel
from routecast.runtime.offload.expert_kernel import bits, reference, swiglu_round


def pools(seed: int, S: int, H: int, I: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(S, 2 * I, H, generator=g) * 0.1).bfloat16(), (torch.randn(S, H, I, generator=g) * 0.1).bfloat16()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 5), st.integers(1, 40), st.integers(1, 24), st.integers(0, 6),
       st.booleans())
def test_each_row_equals_the_fp64_reference(seed: int, S: int, H: int, I: int, R: int, fallback: bool) -> None:
    rng = np.random.default_rng(seed)
    gu, dn = pools(seed, S, H, I)
    slots = rng.integers(0, S, R)  # a slot may repeat: each entry adds its own weighted output
    w = rng.random(R).astype(np.float32)
    x = rng.standard_normal(H).astype(np.float32)
    out = np.full((R, H), np.nan, np.float32)  # every row is written
    want = reference(gu, dn, slots, w, x)
    assert want.shape == (R, H)
    if fallback:
        saved, expert_kernel._kernel = expert_kernel._kernel, None
        try:
            swiglu_round(gu, dn, slots, w, x, out)
        finally:
            expert_kernel._kernel = saved
    else:
        swiglu_round(gu, dn, slots, w, x, out)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max(initial=0)))


def test_the_kernel_is_compiled_and_deterministic() -> None:
    assert expert_kernel._kernel is not None  # numba is a dependency: the compiled loop, not the fallback
    gu, dn = pools(1, 3, 64, 32)
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    a, b = np.zeros((2, 64), np.float32), np.zeros((2, 64), np.float32)
    swiglu_round(gu, dn, np.array([2, 0]), np.array([0.7, 0.3]), x, a)
    swiglu_round(gu, dn, np.array([2, 0]), np.array([0.7, 0.3]), x, b)
    assert np.array_equal(a, b) and np.abs(a).max() > 0


def test_bad_pools_and_lengths_are_refused() -> None:
    gu, dn = pools(0, 2, 8, 4)
    with pytest.raises(ValueError, match="expected a CPU bf16 pool; got torch.float32"):
        bits(gu.float())
    with pytest.raises(ValueError, match="2 slots but 1 weights"):
        swiglu_round(gu, dn, np.array([0, 1]), np.array([1.0]), np.zeros(8, np.float32), np.zeros((2, 8), np.float32))
    with pytest.raises(ValueError, match="slot 2 is outside the pool's 0..1"):
        swiglu_round(gu, dn, np.array([2]), np.array([1.0]), np.zeros(8, np.float32), np.zeros((1, 8), np.float32))
    with pytest.raises(ValueError, match=r"x_H is float64 \(8,\); expected contiguous float32 \(8,\)"):
        swiglu_round(gu, dn, np.array([1]), np.array([1.0]), np.zeros(8), np.zeros((1, 8), np.float32))
    with pytest.raises(ValueError, match=r"out_RH is float32 \(8,\); expected contiguous float32 \(1, 8\)"):
        swiglu_round(gu, dn, np.array([1]), np.array([1.0]), np.zeros(8, np.float32), np.zeros(8, np.float32))
