"""`routecast calibrate`: measure this machine (or a CUDA GPU) and write a hardware profile TOML.

What is measured (each the median over interleaved repeats, so a burst of load from other processes hits
every point of a sweep alike instead of bending the curve):
- peak FLOP/s: a large square GEMM;
- memory bandwidth: a large tensor copy (bytes read + bytes written per second);
- eta(tokens per expert): one MoE layer's worth of SwiGLU experts (distinct weights, so the weights stream
  from memory as in a real layer), each running what an eager expert loop runs for its n tokens: find the
  tokens, gather them, gate/up GEMM, SiLU x up, down GEMM, scale, scatter-add. eta(n) = FLOPs(n) /
  (time per expert x peak), so the per-expert dispatch cost a real layer pays is part of the curve;
- moe_layer_us: the fixed per-layer router and dispatch bookkeeping (router GEMM, softmax, top-k, one-hot
  mask, hit list) at one token.
Link figures are 0 (not applicable) on a CPU and for a single GPU (nothing to measure against).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.common.machine import cpu_name
from routecast.sim.hardware import Hardware, load_hardware
from routecast.sim.models import BUILTIN_CONFIG

QUICK_TOKENS = (1, 4, 16, 64, 256, 1024)
FULL_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
DEFAULT_SHAPE = {"hidden": 256, "ffn": 512, "experts": 8, "top_k": 2}


def expert_shape() -> dict[str, int]:
    """hidden, ffn, experts, top_k of the built-in model when its config exists, else DEFAULT_SHAPE."""
    if BUILTIN_CONFIG.is_file():
        cfg = json.loads(BUILTIN_CONFIG.read_text())
        return {
            "hidden": int(cfg["hidden_size"]),
            "ffn": int(cfg["intermediate_size"]),
            "experts": int(cfg["num_local_experts"]),
            "top_k": int(cfg["num_experts_per_tok"]),
        }
    return dict(DEFAULT_SHAPE)


def median_times(
    fns: Sequence[Callable[[], object]],
    reps: int,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
    flush: Callable[[], object] | None = None,
) -> np.ndarray:
    """(len(fns),) median seconds per call; calls are interleaved round-robin across `reps` rounds.

    `flush` (untimed) runs before every timed call: evicting the caches makes every call start cold, as a
    layer does inside a model forward, instead of depending on what the previous call left behind.
    `clock`: time.perf_counter (wall) by default; `cpu_clock()` for single-threaded CPU work on a shared
    machine, where the wall clock also counts the time other processes hold the core.
    """
    for f in fns:  # warm-up: allocator, caches, lazy kernel selection
        f()
    sync()
    ts = np.empty((reps, len(fns)))
    for r in range(reps):
        for i, f in enumerate(fns):
            if flush is not None:
                flush()
            sync()
            t0 = clock()
            f()
            sync()
            ts[r, i] = clock() - t0
    return np.median(ts, axis=0)


def cache_flusher(device: str = "cpu", nbytes: int = 64 << 20) -> Callable[[], None]:
    """A callable that overwrites `nbytes` (default 64 MiB: twice this CPU's 32 MiB L3, above an H100's
    50 MB L2) of `device` memory, evicting whatever the caches held."""
    import torch

    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device)

    def flush() -> None:
        buf.add_(1.0)

    return flush


def cpu_clock() -> float:
    """Seconds of CPU time of the calling thread. With one torch thread all work runs on the caller, so this
    is the time the work took, minus the time the OS gave the core to other processes."""
    return time.thread_time()


@dataclass(frozen=True)
class _Bench:
    """Where and how to time: device, dtype, repeats, synchronisation, clock, a seeded generator."""

    device: str
    dtype: Any
    reps: int
    sync: Callable[[], None]
    clock: Callable[[], float]
    gen: Any

    def rand(self, *size: int):
        import torch

        return (torch.randn(*size, generator=self.gen) * 0.02).to(device=self.device, dtype=self.dtype)

    def time(self, fns: Sequence[Callable[[], object]], flush: Callable[[], object] | None = None, reps: int = 0):
        return median_times(fns, reps or self.reps, self.sync, self.clock, flush)


def _peak_flops(b: _Bench, m: int) -> float:
    """FLOP/s of an m x m x m GEMM."""
    x, y = b.rand(m, m), b.rand(m, m)
    return 2.0 * m**3 / float(b.time([lambda: x @ y])[0])


def _copy_bandwidth(b: _Bench, numel: int) -> float:
    """Bytes/s (read + write) of copying `numel` fp32 values on the device."""
    import torch

    src = torch.ones(numel, device=b.device, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2.0 * numel * 4 / float(b.time([lambda: dst.copy_(src)])[0])


def _h2d_bandwidth(b: _Bench, numel: int) -> float:
    """Bytes/s of a pinned host-to-device copy of `numel` fp32 values."""
    import torch

    host = torch.ones(numel, dtype=torch.float32).pin_memory()
    dev = torch.empty(numel, device=b.device, dtype=torch.float32)
    return numel * 4 / float(b.time([lambda: dev.copy_(host, non_blocking=True)])[0])


def _expert_curve(b: _Bench, tokens: Sequence[int], H: int, I_: int, E: int, K: int, flush) -> tuple[np.ndarray, float]:
    """(per-expert seconds at each token count (P,), first-expert excess seconds) of an eager expert loop.

    Token t of a pass goes to expert t // n in routing slot 0; the other K - 1 slots hold the "no expert" id E,
    so every one of the E experts (distinct weights) gets exactly n tokens.
    """
    import torch
    import torch.nn.functional as F

    w_gu, w_d = b.rand(E, 2 * I_, H), b.rand(E, H, I_)
    hit_all = torch.arange(E, device=b.device)[:, None]
    passes_all, passes_one = [], []
    for n in tokens:
        T = n * E
        x, w = b.rand(T, H), torch.rand(T, K, generator=b.gen).to(device=b.device, dtype=b.dtype)
        ids = torch.full((T, K), E, dtype=torch.long)
        ids[:, 0] = torch.arange(T) // n
        mask = F.one_hot(ids, num_classes=E + 1).permute(2, 1, 0).to(b.device)  # (E + 1, K, T) view
        out = torch.zeros(T, H, device=b.device, dtype=b.dtype)

        def layer_pass(hit, x=x, w=w, mask=mask, out=out) -> None:
            for row in hit:
                e = row[0]
                if e == E:
                    continue
                pos, idx = torch.where(mask[e])
                gate, up = F.linear(x[idx], w_gu[e]).chunk(2, dim=-1)
                y = F.linear(F.silu(gate) * up, w_d[e]) * w[idx, pos, None]
                out.index_add_(0, idx, y.to(out.dtype))

        passes_all.append(lambda f=layer_pass: f(hit_all))
        passes_one.append(lambda f=layer_pass: f(hit_all[:1]))
    t = b.time(passes_all + passes_one, flush)
    t_all, t_one = t[: len(tokens)], t[len(tokens) :]
    if E == 1:
        return t_all, 0.0
    # The first expert of a cold pass also pays for cold code paths and allocations: that share is per layer,
    # not per expert, so the curve uses the marginal cost of the other E - 1 experts and the excess of the
    # first one joins the fixed overhead. The floor guards against noise driving the difference to ~0.
    per_expert = np.maximum((t_all - t_one) / (E - 1), 0.25 * t_all / E)
    return per_expert, float(np.median(np.maximum(t_one - per_expert, 0.0)))


def _router_prologue(b: _Bench, H: int, E: int, K: int, flush) -> float:
    """Seconds to route one token and build the dispatch mask and hit list (an eager MoE layer's preamble)."""
    import torch
    import torch.nn.functional as F

    x, w = b.rand(1, H), b.rand(E, H)

    def prologue() -> None:
        probs = F.linear(x, w).softmax(dim=-1)
        val, ids = probs.topk(K, dim=-1)
        val = val / val.sum(dim=-1, keepdim=True)
        torch.zeros_like(x)
        onehot = F.one_hot(ids, num_classes=E + 1).permute(2, 1, 0)
        for _ in torch.greater(onehot.sum(dim=(-1, -2)), 0).nonzero():
            pass

    return float(b.time([prologue], flush, reps=3 * b.reps)[0])


def calibrate(
    out_toml: str | Path,
    *,
    device: str = "cpu",
    threads: int = 1,
    quick: bool = False,
    hidden: int | None = None,
    ffn: int | None = None,
    num_experts: int | None = None,
    top_k: int | None = None,
    seed: int = 0,
) -> Hardware:
    """Measure `device` ("cpu" | "cuda" | "cuda:N") with `threads` CPU threads and write a profile to out_toml.

    hidden, ffn, num_experts, top_k: the expert shape of the eta sweep (default: the built-in model's, see
    `expert_shape`). quick: fewer token counts and repeats (a few seconds on a 2-core CPU).
    Returns the written profile, loaded back through `load_hardware` (so it is known to be loadable).
    """
    import torch

    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ConfigError(f"threads is {threads!r}; expected a positive integer.")
    if device != "cpu" and not device.startswith("cuda"):
        raise ConfigError(f"device is {device!r}; expected 'cpu' or 'cuda[:N]'.")
    is_cuda = device.startswith("cuda")
    if is_cuda and not torch.cuda.is_available():
        raise ConfigError(f"device is {device!r} but torch sees no CUDA GPU; expected 'cpu' on this machine.")
    shape = expert_shape()
    H, I_ = int(hidden or shape["hidden"]), int(ffn or shape["ffn"])
    E, K = int(num_experts or shape["experts"]), int(top_k or shape["top_k"])
    if min(H, I_, E, K) < 1 or K > E:
        raise ConfigError(f"expert shape hidden={H}, ffn={I_}, experts={E}, top_k={K}; expected positive sizes, top_k <= experts.")
    out_toml = Path(out_toml)
    started = time.perf_counter()
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    bench = _Bench(
        device=device,
        dtype=torch.bfloat16 if is_cuda else torch.float32,  # fp32 beats bf16 on CPUs without AMX (ANCHORS.md)
        reps=5 if quick else 11,
        sync=(lambda: torch.cuda.synchronize(device)) if is_cuda else (lambda: None),
        # Single-threaded CPU work is timed in thread CPU time so a busy shared machine does not inflate it.
        clock=cpu_clock if (not is_cuda and threads == 1) else time.perf_counter,
        gen=torch.Generator(device="cpu").manual_seed(seed),
    )
    gemm_m = 8192 if is_cuda else (1024 if quick else 1536)
    copy_numel = (1 << 28) if is_cuda else (1 << 24)
    tokens = QUICK_TOKENS if quick else FULL_TOKENS
    try:
        with torch.no_grad():
            peak = _peak_flops(bench, gemm_m)
            bandwidth = _copy_bandwidth(bench, copy_numel)
            h2d = _h2d_bandwidth(bench, 1 << 26) if is_cuda else 0.0
            flush = cache_flusher(device)
            per_expert, first_excess = _expert_curve(bench, tokens, H, I_, E, K, flush)
            overhead = _router_prologue(bench, H, E, K, flush) + first_excess
    finally:
        torch.set_num_threads(prev_threads)
    eta = np.clip(6.0 * np.asarray(tokens, np.float64) * H * I_ / (per_expert * peak), 1e-4, 1.0)
    if is_cuda:
        props = torch.cuda.get_device_properties(device)
        capacity, desc = float(props.total_memory), props.name
    else:
        capacity, desc = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), cpu_name()
    hw = Hardware(
        name=f"calibrated-{'cuda' if is_cuda else 'cpu'}",
        kind="gpu" if is_cuda else "cpu",
        description=f"{desc}, {threads} thread(s), measured by routecast calibrate",
        dtype="bf16" if is_cuda else "fp32",
        peak_flops=peak,
        mem_bandwidth=bandwidth,
        mem_derate=1.0,
        mem_capacity=capacity,
        nvlink_bandwidth=0.0,
        pcie_bandwidth=0.0,
        h2d_bandwidth=h2d,
        alpha=0.0,
        eta_tokens=tuple(float(t) for t in tokens),
        eta_values=tuple(float(v) for v in eta),
        tile_m=0,
        moe_layer_overhead=overhead,
    )
    how = f"median of {bench.reps} interleaved repeats"
    notes = {
        "description": f"measured {time.strftime('%Y-%m-%d %H:%M')} in {time.perf_counter() - started:.1f} s",
        "compute.peak_tflops": f"{gemm_m}^3 {hw.dtype} GEMM, {how}",
        "memory.bandwidth_gbps": f"copy of {copy_numel * 4 >> 20} MiB, read + write bytes, {how}",
        "memory.derate": "1.0: the bandwidth above is already an achieved figure",
        "memory.capacity_gb": "device memory" if is_cuda else "physical RAM",
        "interconnect.nvlink_gbps": "not applicable: single device",
        "interconnect.pcie_gbps": "not applicable: single device",
        "interconnect.h2d_gbps": "pinned host->device copy" if is_cuda else "not applicable: CPU",
        "interconnect.alpha_us": "not applicable: single device",
        "gemm.tile_m": "no staircase measured",
        "gemm.eta": f"SwiGLU experts H={H} I={I_}, {E} per cold layer pass, eager expert loop, {how}",
        "overhead.moe_layer_us": "router + top-k + dispatch mask at 1 token + cold first-expert excess",
    }
    out_toml.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_toml.with_suffix(".toml.tmp")
    tmp.write_text(hw.to_toml(notes))
    os.replace(tmp, out_toml)
    return load_hardware(out_toml)
