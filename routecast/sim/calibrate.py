"""`routecast calibrate`: measure this machine (or a CUDA GPU) and write a hardware profile TOML.

The cost model prices one active expert as floor + max(W / B(W), flops(n) / (eta(n) x peak)) + activation(n),
plus a fixed per-layer cost. Calibration measures each term on its own regime (every point the median over
interleaved repeats, so a burst of load from other processes hits every point of a sweep alike, and the faster of two
such sweeps, so a sustained burst that slows one whole sweep is not kept):
- expert call floor: an eager expert loop over tiny experts (W ~ 0 bytes) at one token each: the fixed
  dispatch cost of one expert call (op dispatch on a CPU; kernel launches and the host sync of the expert's
  token lookup on a GPU), which is what a one-token decode pays above the weight reads;
- weight-read bandwidth B(W): the same loop at one token over several expert sizes (distinct weights, caches
  flushed, so weights stream from memory as in a real layer): B(W) = W / (time - floor), a curve because
  small matrices do not reach the streaming bandwidth;
- peak FLOP/s: a large square GEMM;
- activation work: the gather, SiLU x up, scale and scatter-add of an expert call without its GEMMs, per
  value (n (3 hidden + 2 ffn) values per call), a larger share of a small expert's time than of a big one's;
- eta(tokens per expert): the loop at many token counts on one expert shape, with floor and activation work
  removed: eta(n) = flops(n) / ((time(n) - floor - activation(n)) x peak), from the counts where the expert is
  compute-bound (see `eta_curve`);
- moe_layer_us: the fixed per-layer router and dispatch bookkeeping (router GEMM, softmax, top-k, one-hot
  mask, hit list) at one token, plus the extra time of a cold pass's first expert.
The shapes timed are set per device kind (`cpu_plan`, `cuda_plan`) and differ from the shapes the
validation benchmark predicts (benchmarks/cost_model_validation.py), so its errors are out of sample.
Link figures are 0 (not applicable) on a CPU and for a single GPU (nothing to measure against).
"""

from __future__ import annotations

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


@dataclass(frozen=True, kw_only=True)
class CalibrationPlan:
    """What `calibrate` times on one kind of device. Shapes are (hidden, ffn) of SwiGLU experts.

    floor_shape: a tiny expert (weights ~0 bytes) timed at one token: the expert call floor.
    memory_shapes: expert sizes, increasing, timed at one token: the weight-read bandwidth curve.
    eta_shape, tokens: the expert shape and tokens-per-expert counts of the efficiency curve.
    experts, top_k: experts per timed layer pass (distinct weights) and routing slots per token.
    reps: interleaved repeats per point; passes: sweeps run one after the other, each point keeping its fastest
    pass median (a shared machine's load can slow a whole sweep of tens of seconds, which a median over
    interleaved repeats cannot undo, and load only ever adds time); gemm_m: side of the peak-FLOP/s GEMM; copy_numel: fp32 values copied
    for the copy bandwidth (recorded for reference; the cost model uses the weight-read curve).
    """

    floor_shape: tuple[int, int]
    memory_shapes: tuple[tuple[int, int], ...]
    eta_shape: tuple[int, int]
    tokens: tuple[int, ...]
    experts: int = 8
    top_k: int = 2
    reps: int = 11
    passes: int = 2
    gemm_m: int = 1536
    copy_numel: int = 1 << 24

    def __post_init__(self) -> None:
        sizes = [h * f for h, f in self.memory_shapes]
        if not sizes or any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
            raise ConfigError(f"CalibrationPlan.memory_shapes is {self.memory_shapes}; expected sizes in increasing order.")
        if not self.tokens or any(b <= a for a, b in zip(self.tokens, self.tokens[1:], strict=False)) or self.tokens[0] < 1:
            raise ConfigError(f"CalibrationPlan.tokens is {self.tokens}; expected positive, increasing counts.")


QUICK_TOKENS = (1, 4, 16, 64, 256, 1024)
FULL_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CUDA_TOKENS = tuple(2**i for i in range(15))  # 1 .. 16384 tokens per expert


def cpu_plan(quick: bool = False) -> CalibrationPlan:
    """Shapes for a CPU (fp32, one core: 0.3-31 MB experts, up to 1024 tokens per expert).

    None of them is a shape that benchmarks/cost_model_validation.py predicts (built-in 128x256, 384x1024,
    768x2048): the validation is out of sample.
    """
    if quick:
        return CalibrationPlan(floor_shape=(16, 16), memory_shapes=((96, 256), (256, 640), (640, 1792)),
                               eta_shape=(256, 640), tokens=QUICK_TOKENS, reps=5, passes=1, gemm_m=1024)
    return CalibrationPlan(
        floor_shape=(16, 16),
        memory_shapes=((96, 256), (160, 384), (256, 640), (384, 896), (512, 1280), (640, 1792), (896, 2048), (1024, 2560)),
        eta_shape=(256, 640), tokens=FULL_TOKENS, reps=11, gemm_m=1536,
    )


def cuda_plan(quick: bool = False) -> CalibrationPlan:
    """Shapes for a GPU (bf16: ~3-450 MB experts, up to 16384 tokens per expert).

    Chosen to bracket, and never to equal, the expert geometries the GPU validation predicts (Mixtral-8x7B
    4096x14336, DeepSeek-V3 7168x2048).
    """
    mem = ((512, 1024), (1024, 2816), (2048, 4096), (3072, 6144), (4096, 10240), (6144, 12288))
    if quick:
        return CalibrationPlan(floor_shape=(64, 64), memory_shapes=mem[::2], eta_shape=(3072, 6144),
                               tokens=CUDA_TOKENS[::2], reps=5, passes=1, gemm_m=8192, copy_numel=1 << 28)
    return CalibrationPlan(floor_shape=(64, 64), memory_shapes=mem, eta_shape=(3072, 6144), tokens=CUDA_TOKENS,
                           reps=11, gemm_m=8192, copy_numel=1 << 28)


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


def _expert_points(
    b: _Bench, points: Sequence[tuple[int, int, int]], E: int, K: int, flush
) -> tuple[np.ndarray, np.ndarray]:
    """(per-expert seconds (P,), first-expert excess seconds (P,)) of an eager expert loop at P points.

    points: (hidden, ffn, tokens per expert). Each point is a cold layer pass over E SwiGLU experts with
    distinct weights, running what an eager MoE block runs per expert: find its tokens, gather them,
    gate/up GEMM, SiLU x up, down GEMM, scale, scatter-add. Token t of a pass goes to expert t // n in routing
    slot 0; the other K - 1 slots hold the "no expert" id E, so every expert gets exactly n tokens. All
    points are timed in one interleaved sweep. Points that share a shape share its weights.
    """
    import torch
    import torch.nn.functional as F

    weights: dict[tuple[int, int], tuple[Any, Any]] = {}
    hit_all = torch.arange(E, device=b.device)[:, None]
    passes_all, passes_one = [], []
    for H, I_, n in points:
        if (H, I_) not in weights:
            weights[(H, I_)] = (b.rand(E, 2 * I_, H), b.rand(E, H, I_))
        w_gu, w_d = weights[(H, I_)]
        T = n * E
        x, w = b.rand(T, H), torch.rand(T, K, generator=b.gen).to(device=b.device, dtype=b.dtype)
        ids = torch.full((T, K), E, dtype=torch.long)
        ids[:, 0] = torch.arange(T) // n
        mask = F.one_hot(ids, num_classes=E + 1).permute(2, 1, 0).to(b.device)  # (E + 1, K, T) view
        out = torch.zeros(T, H, device=b.device, dtype=b.dtype)

        def layer_pass(hit, x=x, w=w, mask=mask, out=out, w_gu=w_gu, w_d=w_d) -> None:
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
    t_all, t_one = t[: len(points)], t[len(points) :]
    if E == 1:
        return t_all, np.zeros(len(points))
    # The first expert of a cold pass also pays for cold code paths and allocations: that share is per layer,
    # not per expert, so the per-expert time is the marginal cost of the other E - 1 experts and the excess
    # of the first one joins the fixed overhead. The floor guards against noise driving the difference to ~0.
    per_expert = np.maximum((t_all - t_one) / (E - 1), 0.25 * t_all / E)
    return per_expert, np.maximum(t_one - per_expert, 0.0)


def swiglu_bytes(hidden: int, ffn: int, dtype_bytes: int) -> int:
    """Weight bytes of one SwiGLU expert (gate, up, down: 3 x hidden x ffn values)."""
    return 3 * hidden * ffn * dtype_bytes


def bandwidth_curve(weight_bytes: Any, seconds: Any, floor_s: float) -> np.ndarray:
    """(S,) expert weight bytes, (S,) seconds per one-token expert call, floor seconds -> (S,) bytes/s.

    B(W) = W / (t - floor): the rate at which a call streams its weights once the fixed call cost is paid.
    A call measured at or below the floor (noise on a tiny expert) is capped at 20x the floor-free rate.
    """
    w, t = np.asarray(weight_bytes, np.float64), np.asarray(seconds, np.float64)
    return w / np.maximum(t - floor_s, 0.05 * t)


def eta_curve(
    tokens: Any, seconds: Any, floor_s: float, hidden: int, ffn: int, peak_flops: float, memory_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """(P,) tokens per expert, (P,) seconds per expert call -> (tokens kept (Q,), efficiency (Q,) >= 1e-4).

    The efficiency can exceed 1 when the experts' GEMMs outrun the square GEMM that measured peak_flops;
    `fit_curves` then raises the peak to the best rate measured.

    eta(n) = 6 n hidden ffn / ((t(n) - floor) x peak): SwiGLU FLOPs over the call's time net of its floor.
    One token, and any count whose net time is within 10% of memory_s (the expert's weight-read time), is
    memory-bound: its compute time is hidden under the weight reads and unknown, and taking the net time for
    compute would carry this shape's read rate to every other shape. Those counts are left out; the curve is flat below
    its first kept count (Hardware.eta), where the weight-read term sets the cost anyway. When every count
    is memory-bound the largest is kept (an upper bound on its compute time).
    """
    n, t = np.asarray(tokens, np.float64), np.asarray(seconds, np.float64)
    busy = np.maximum(t - floor_s, 0.05 * t)
    # One token per expert is a matrix-vector product (2 FLOPs per weight read): memory-bound on every device,
    # so it never sets eta, however close its noisy net time comes to the margin.
    keep = (busy > 1.1 * memory_s) & (n > 1)
    if not keep.any():
        keep[-1] = True
    eta = np.maximum(6.0 * n * hidden * ffn / (busy * peak_flops), 1e-4)
    return n[keep], eta[keep]


def activation_values(tokens: Any, hidden: int, ffn: int) -> np.ndarray:
    """Values an eager SwiGLU expert call touches outside its GEMMs, per call of n tokens: gather n x H, SiLU and
    product on n x I each, scale n x H, scatter-add n x H -> n (3 hidden + 2 ffn)."""
    return np.asarray(tokens, np.float64) * (3 * hidden + 2 * ffn)


def _activation_cost(b: _Bench, H: int, I_: int, flush, n_lo: int = 16, n_hi: int = 1024) -> float:
    """Seconds per value of an expert call's non-GEMM work (see `activation_values`), timed without the GEMMs.

    The slope between n_lo and n_hi tokens, so the fixed dispatch cost of these ops (part of the call floor)
    drops out.
    """
    import torch
    import torch.nn.functional as F

    fns = []
    for n in (n_lo, n_hi):
        x, gu, y, w = b.rand(2 * n, H), b.rand(n, 2 * I_), b.rand(n, H), b.rand(n, 1)
        idx = torch.arange(0, 2 * n, 2, device=b.device)  # every other token, as a routed subset
        out = torch.zeros(2 * n, H, device=b.device, dtype=b.dtype)

        def work(x=x, gu=gu, y=y, w=w, idx=idx, out=out) -> None:
            x[idx]
            gate, up = gu.chunk(2, dim=-1)
            F.silu(gate) * up
            out.index_add_(0, idx, y * w)

        fns.append(work)
    t = b.time(fns, flush)
    return max(float(t[1] - t[0]), 0.0) / float(activation_values(n_hi - n_lo, H, I_))


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


def plan_points(plan: CalibrationPlan, eta_shape: tuple[int, int]) -> list[tuple[int, int, int]]:
    """The (hidden, ffn, tokens per expert) points of one calibration sweep, in the order `fit_curves` reads:
    the floor point, the one-token weight-read points, then the efficiency points on `eta_shape`."""
    H, I_ = eta_shape
    return [(*plan.floor_shape, 1)] + [(h, f, 1) for h, f in plan.memory_shapes] + [(H, I_, n) for n in plan.tokens]


@dataclass(frozen=True, kw_only=True)
class FittedCurves:
    """What a calibration sweep yields for the cost model (SI units): see Hardware for each field."""

    expert_call_s: float
    weight_bytes: tuple[float, ...]
    weight_bandwidth: tuple[float, ...]
    eta_tokens: tuple[float, ...]
    eta_values: tuple[float, ...]
    moe_layer_s: float
    activation_s: float
    peak_flops: float


def fit_curves(
    plan: CalibrationPlan,
    eta_shape: tuple[int, int],
    per_expert_s: Any,
    first_excess_s: Any,
    prologue_s: float,
    peak_flops: float,
    dtype_bytes: int,
    activation_s: float = 0.0,
) -> FittedCurves:
    """Per-point seconds of the sweep `plan_points(plan, eta_shape)` -> the cost model's curves.

    per_expert_s, first_excess_s: (P,) seconds per expert call and first-expert excess at each point;
    prologue_s: the router preamble at one token; activation_s: seconds per non-GEMM activation value, removed
    from the efficiency points before eta is taken. Pure arithmetic (no timing), so the fit is testable with
    synthetic times, including for `cuda_plan` on a machine without a GPU.
    """
    t = np.asarray(per_expert_s, np.float64)
    S = len(plan.memory_shapes)
    if t.shape != (1 + S + len(plan.tokens),):
        raise ConfigError(f"per_expert_s has shape {t.shape}; expected ({1 + S + len(plan.tokens)},) for this plan.")
    floor = float(t[0])
    w_bytes = np.array([swiglu_bytes(h, f, dtype_bytes) for h, f in plan.memory_shapes], np.float64)
    bw = bandwidth_curve(w_bytes, t[1 : 1 + S], floor)
    # The eta shape's own weight-read time, from the curve just measured (it need not be one of its sizes).
    H, I_ = eta_shape
    w_eta = float(swiglu_bytes(H, I_, dtype_bytes))
    mem_s = w_eta / float(np.interp(np.log(w_eta), np.log(w_bytes), bw))
    act = activation_s * activation_values(plan.tokens, H, I_)
    eta_tokens, eta = eta_curve(plan.tokens, t[1 + S :] - act, floor, H, I_, peak_flops, mem_s)
    top = max(float(eta.max()), 1.0)  # the peak is the best FLOP rate measured, so eta stays in (0, 1]
    return FittedCurves(
        expert_call_s=floor,
        weight_bytes=tuple(float(w) for w in w_bytes),
        weight_bandwidth=tuple(float(v) for v in bw),
        eta_tokens=tuple(float(n) for n in eta_tokens),
        eta_values=tuple(float(v) for v in eta / top),
        moe_layer_s=float(prologue_s + np.median(np.asarray(first_excess_s, np.float64))),
        activation_s=float(activation_s),
        peak_flops=peak_flops * top,
    )


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
    plan: CalibrationPlan | None = None,
    seed: int = 0,
) -> Hardware:
    """Measure `device` ("cpu" | "cuda" | "cuda:N") with `threads` CPU threads and write a profile to out_toml.

    plan: what to time (default `cuda_plan(quick)` on a GPU, `cpu_plan(quick)` on a CPU); hidden, ffn,
    num_experts, top_k override its eta shape and layer size. quick: fewer points and repeats (a few seconds
    on a 2-core CPU). Returns the written profile, loaded back through `load_hardware` (so it is loadable).
    """
    import torch

    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ConfigError(f"threads is {threads!r}; expected a positive integer.")
    if device != "cpu" and not device.startswith("cuda"):
        raise ConfigError(f"device is {device!r}; expected 'cpu' or 'cuda[:N]'.")
    is_cuda = device.startswith("cuda")
    if is_cuda and not torch.cuda.is_available():
        raise ConfigError(f"device is {device!r} but torch sees no CUDA GPU; expected 'cpu' on this machine.")
    plan = plan or (cuda_plan(quick) if is_cuda else cpu_plan(quick))
    H, I_ = int(hidden or plan.eta_shape[0]), int(ffn or plan.eta_shape[1])
    E, K = int(num_experts or plan.experts), int(top_k or plan.top_k)
    if min(H, I_, E, K) < 1 or K > E:
        raise ConfigError(f"expert shape hidden={H}, ffn={I_}, experts={E}, top_k={K}; expected positive sizes, top_k <= experts.")
    out_toml = Path(out_toml)
    started = time.perf_counter()
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    dtype_bytes = 2 if is_cuda else 4  # bf16 on GPUs; fp32 beats bf16 on CPUs without AMX (ANCHORS.md)
    bench = _Bench(
        device=device,
        dtype=torch.bfloat16 if is_cuda else torch.float32,
        reps=plan.reps,
        sync=(lambda: torch.cuda.synchronize(device)) if is_cuda else (lambda: None),
        # Single-threaded CPU work is timed in thread CPU time so a busy shared machine does not inflate it.
        clock=cpu_clock if (not is_cuda and threads == 1) else time.perf_counter,
        gen=torch.Generator(device="cpu").manual_seed(seed),
    )
    # One interleaved sweep: the floor point, the one-token weight-read points, the efficiency points.
    points = plan_points(plan, (H, I_))
    try:
        with torch.no_grad():
            peak = _peak_flops(bench, plan.gemm_m)
            copy_bw = _copy_bandwidth(bench, plan.copy_numel)
            h2d = _h2d_bandwidth(bench, 1 << 26) if is_cuda else 0.0
            flush = cache_flusher(device)
            sweeps = [_expert_points(bench, points, E, K, flush) for _ in range(plan.passes)]
            per_expert = np.min([p for p, _ in sweeps], axis=0)
            excess = np.min([x for _, x in sweeps], axis=0)
            prologue = _router_prologue(bench, H, E, K, flush)
            act = _activation_cost(bench, H, I_, flush)
    finally:
        torch.set_num_threads(prev_threads)
    fit = fit_curves(plan, (H, I_), per_expert, excess, prologue, peak, dtype_bytes, activation_s=act)
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
        peak_flops=fit.peak_flops,
        mem_bandwidth=copy_bw,
        mem_derate=1.0,
        mem_capacity=capacity,
        nvlink_bandwidth=0.0,
        pcie_bandwidth=0.0,
        h2d_bandwidth=h2d,
        alpha=0.0,
        eta_tokens=fit.eta_tokens,
        eta_values=fit.eta_values,
        tile_m=0,
        moe_layer_overhead=fit.moe_layer_s,
        weight_bytes=fit.weight_bytes,
        weight_bandwidth=fit.weight_bandwidth,
        expert_call_overhead=fit.expert_call_s,
        activation_cost=fit.activation_s,
    )
    how = f"median of {bench.reps} interleaved repeats"
    shapes = ", ".join(f"{h}x{f}" for h, f in plan.memory_shapes)
    notes = {
        "description": f"measured {time.strftime('%Y-%m-%d %H:%M')} in {time.perf_counter() - started:.1f} s",
        "compute.peak_tflops": f"best of a {plan.gemm_m}^3 {hw.dtype} GEMM and the expert sweep, {how}",
        "memory.bandwidth_gbps": f"copy of {plan.copy_numel * 4 >> 20} MiB, read + write bytes, {how}",
        "memory.derate": "1.0: the bandwidth above is already an achieved figure",
        "memory.capacity_gb": "device memory" if is_cuda else "physical RAM",
        "memory.weight_mb": f"SwiGLU experts {shapes} ({hw.dtype})",
        "memory.weight_gbps": f"W / (one-token expert call - call floor), {E} per cold layer pass, {how}",
        "interconnect.nvlink_gbps": "not applicable: single device",
        "interconnect.pcie_gbps": "not applicable: single device",
        "interconnect.h2d_gbps": "pinned host->device copy" if is_cuda else "not applicable: CPU",
        "interconnect.alpha_us": "not applicable: single device",
        "gemm.tile_m": "no staircase measured",
        "gemm.eta": f"SwiGLU experts H={H} I={I_}, {E} per cold layer pass, eager expert loop, call floor and activation work removed, memory-bound counts left out, {how}",
        "overhead.moe_layer_us": "router + top-k + dispatch mask at 1 token + cold first-expert excess",
        "overhead.activation_ns": f"gather + SiLU x up + scale + scatter-add per value, {H}x{I_}, 16 vs 1024 tokens",
        "overhead.expert_call_us": f"one-token call of a {plan.floor_shape[0]}x{plan.floor_shape[1]} expert (weights ~0 bytes), {how}",
    }
    from routecast.common.outputs import write_atomic

    write_atomic(out_toml, hw.to_toml(notes), "--out")
    return load_hardware(out_toml)
