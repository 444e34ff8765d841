"""One round of SwiGLU experts of a decode token on the CPU, straight from bf16 slot pools (numba, cached on disk).

Legend: S slots of the fast tier, I the expert's FFN width, H the hidden size, R the experts of one round.

A decode token multiplies each of its experts' weights by one vector, so the work is a matrix-vector product bound
by the memory it streams. torch's bf16 CPU matmul at batch 1 streams the weights well below the memory's rate; this
loop widens each bf16 weight to fp32 by a 16-bit shift and accumulates in fp32, rows split over the threads
(`python benchmarks/expert_kernel.py`, three runs on this 2-core machine: 1.6-2.2x torch's speed on deepseek-v2-lite
experts, 1.2-2.0x on mixtral-8x7b's, as the memory's rate drifts). The geometry runs (geometry.py) compute their CPU rounds with it; a GPU round stays on torch.

The result is the fp32 SwiGLU of the bf16 weights and the fp32 input, row by row in a fixed order (deterministic,
whatever the thread count); torch's bf16 matmul rounds h to bf16 between the two products, so the two agree to
bf16 rounding, not bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch


def _swiglu_rows(gu_SNH: np.ndarray, dn_SHI: np.ndarray, slots_R: np.ndarray, w_R: np.ndarray, x_H: np.ndarray,
                 out_RH: np.ndarray) -> None:
    """out_RH[r] = w_R[r] * down[slot_r] @ (silu(gate[slot_r] @ x) * (up[slot_r] @ x)); pools as uint16 bf16 bits
    (gu_SNH: (S, 2I, H), gate rows first; dn_SHI: (S, H, I)). Rows split over the threads; each row's sum in order."""
    N, H = gu_SNH.shape[1], gu_SNH.shape[2]
    I = N // 2
    h, a = np.empty(N, np.float32), np.empty(I, np.float32)
    for j in range(slots_R.shape[0]):
        s = slots_R[j]
        for r in _prange(N):
            acc = np.float32(0.0)
            for c in range(H):  # bf16 bits << 16 are the fp32 of the same value
                acc += np.uint32(np.uint32(gu_SNH[s, r, c]) << np.uint32(16)).view(np.float32) * x_H[c]
            h[r] = acc
        for i in _prange(I):
            a[i] = h[i] / (np.float32(1.0) + np.exp(-h[i])) * h[I + i]
        w = np.float32(w_R[j])
        for r in _prange(H):
            acc = np.float32(0.0)
            for c in range(I):
                acc += np.uint32(np.uint32(dn_SHI[s, r, c]) << np.uint32(16)).view(np.float32) * a[c]
            out_RH[j, r] = w * acc


_prange = range
try:  # numba is a dependency; without it the torch path below runs (same figures' meaning, slower compute)
    from numba import njit, prange
except ImportError:  # pragma: no cover - depends on the environment
    njit = None
if njit is not None:
    _prange = prange
    _kernel = njit(parallel=True, fastmath=True, cache=True, nogil=True)(_swiglu_rows)
else:  # pragma: no cover
    _kernel = None


def bits(pool: torch.Tensor) -> np.ndarray:
    """A bf16 torch pool as uint16 numpy bits, sharing its memory (no copy)."""
    if pool.dtype != torch.bfloat16 or pool.device.type != "cpu":
        raise ValueError(f"expected a CPU bf16 pool; got {pool.dtype} on {pool.device}")
    return pool.view(torch.int16).numpy().view(np.uint16)


def swiglu_round(gu: torch.Tensor, dn: torch.Tensor, slots_R: np.ndarray, w_R: np.ndarray, x_H: np.ndarray,
                 out_RH: np.ndarray) -> None:
    """out_RH[r] (fp32) = slot r's SwiGLU of x_H (fp32, H) times w_R[r]; gu (S, 2I, H), dn (S, H, I) bf16 CPU pools.
    One row per expert, not a running sum: the caller adds a layer's rows in expert order, so its output does not
    depend on how the experts were split into rounds (hits first, then misses). numba's loop when installed, else
    torch per expert in fp32 (slower)."""
    slots = np.ascontiguousarray(slots_R, np.int64)
    w = np.ascontiguousarray(w_R, np.float32)
    if len(slots) != len(w):
        raise ValueError(f"{len(slots)} slots but {len(w)} weights")
    S, H = gu.shape[0], gu.shape[2]
    if len(slots) and not (0 <= slots.min() and slots.max() < S):  # the compiled loop checks no bounds
        raise ValueError(f"slot {int(slots.max() if slots.max() >= S else slots.min())} is outside the pool's 0..{S - 1}")
    for name, v, want in (("x_H", x_H, (H,)), ("out_RH", out_RH, (len(slots), H))):
        if v.shape != want or v.dtype != np.float32 or not v.flags.c_contiguous:
            raise ValueError(f"{name} is {v.dtype} {v.shape}; expected contiguous float32 {want}")
    if _kernel is not None:
        _kernel(bits(gu), bits(dn), slots, w, x_H, out_RH)
        return
    x, I = torch.from_numpy(x_H), dn.shape[2]  # numba missing
    for j, (s, wj) in enumerate(zip(slots.tolist(), w.tolist(), strict=True)):
        h = gu[s].float() @ x
        out_RH[j] = (wj * (dn[s].float() @ (torch.nn.functional.silu(h[:I]) * h[I:]))).numpy()


def torch_expert(gu: torch.Tensor, dn: torch.Tensor, s: int, w: float, x_1H: torch.Tensor) -> torch.Tensor:
    """Slot s's SwiGLU of x_1H (bf16, (1, H), on the pools' device) times w by torch's bf16 matmuls: (1, H) fp32 (the
    geometry's GPU rounds and its `--geometry-kernel torch`)."""
    I = dn.shape[2]
    h = x_1H @ gu[s].T  # (1, 2I)
    return w * ((torch.nn.functional.silu(h[:, :I]) * h[:, I:]) @ dn[s].T).float()


def reference(gu: torch.Tensor, dn: torch.Tensor, slots_R: np.ndarray, w_R: np.ndarray, x_H: np.ndarray) -> np.ndarray:
    """The same rows by torch in fp64 (tests, benchmarks/expert_kernel.py): (R, H) fp64."""
    x, I = torch.from_numpy(np.asarray(x_H, np.float64)), dn.shape[2]
    rows = [wj * (dn[s].double() @ (torch.nn.functional.silu(h[:I]) * h[I:]))
            for s, wj in zip(np.asarray(slots_R).tolist(), np.asarray(w_R, np.float64).tolist(), strict=True)
            for h in [gu[s].double() @ x]]
    return torch.stack(rows).numpy() if rows else np.zeros((0, dn.shape[1]))
