"""The GPU tier: every expert in pinned host memory, copied into device slots on a CUDA stream of its own.

This is the layout of the offloading runtimes users run on one GPU (MoE-Infinity, mixtral-offloading): the
experts that do not fit the GPU sit in page-locked host memory, and a miss is a host-to-device copy over PCIe.
``PinnedTier(geom, device)`` is a slow tier for runtime/offload/store.py's ExpertStore, as DiskTier is:

- ``host[param][layer]`` [E, *shape] bf16, page-locked when the device is CUDA. **The weights are random**, drawn
  as geometry.py's are (random sign and mantissa, exponent fixed), generated on the device chunk by chunk and
  copied to the host once (no file: nothing is written to disk).
- ``pool(n, shape, dtype)`` makes the store's slot pools on the device, so the MoE computes from its slots there.
- ``read_into(key, dests)`` copies one expert's tensors into its slot on the calling loader thread's own CUDA
  stream (one stream per thread, never the compute stream) and waits for that stream only: the store marks the
  slot ready when the bytes are on the device, while the compute stream goes on with the experts already there.
  The compute side synchronises its own stream after each expert (geometry.GeometryRun), so a slot is never
  overwritten while a kernel still reads it.

On a machine without CUDA (``device='cpu'``: the tests) the same object keeps the weights in ordinary memory and a
read is a plain copy, so every line but the stream handling runs in CI. Counters as DiskTier's: bytes_read, reads,
read_s (seconds inside read_into, summed over threads); ``mode`` says which copy runs.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from routecast.common.errors import ConfigError
from routecast.common.machine import available_memory

_CHUNK = 1 << 27  # elements generated on the device per piece of a host tensor (256 MB of bf16)


def _fill_random(dst: torch.Tensor, gen: torch.Generator, device: torch.device) -> None:
    """dst (bf16, host) <- random bf16 bit patterns as geometry._random_bf16 draws them: sign and 7-bit mantissa
    random, exponent 2^-7 (|w| in [2^-7, 2^-6)), drawn on `device` piece by piece."""
    flat = dst.view(-1).view(torch.int16)
    for a in range(0, flat.numel(), _CHUNK):
        n = min(_CHUNK, flat.numel() - a)
        bits = torch.randint(-(1 << 15), 1 << 15, (n,), dtype=torch.int32, device=device, generator=gen)
        bits = (bits & 0x807F) | 0x3C00  # 0 .. 0xBC7F: the int16 of the same 16 bits, without relying on a wrap
        flat[a:a + n].copy_(torch.where(bits >= 1 << 15, bits - (1 << 16), bits).to(torch.int16))


def check_device(device: str | torch.device) -> torch.device:
    """--geometry-device: cpu, cuda or cuda:N of a GPU this machine has -> the torch device; one sentence otherwise."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        d = None
    if d is None or d.type not in ("cuda", "cpu"):
        raise ConfigError(f"--geometry-device is {device!r}; expected cuda, cuda:N or cpu.")
    if d.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ConfigError(f"--geometry-device is {device}; this machine has no CUDA device: expected cpu, or a GPU.")
        if d.index is not None and d.index >= n:
            raise ConfigError(f"--geometry-device is {device}; this machine has {n} CUDA device(s): expected cuda:0.."
                              f"cuda:{n - 1}.")
    return d


def check_host_memory(geom) -> None:
    """Every expert of `geom` must fit 80% of the memory available now: refused in one sentence before anything is
    read or allocated, rather than the OOM killer mid-run."""
    need, have = geom.layers * geom.experts * geom.expert_bytes, available_memory()
    if need > 0.8 * have:
        raise ConfigError(f"--geometry {geom.name} with {geom.layers} layers holds {need / 1e9:.1f} GB of experts in "
                          f"host memory; {have / 1e9:.1f} GB are available: expected fewer --geometry-layers.")


class TierLayout:
    """What ExpertStore reads of a tier's layout: layers, experts, fused params {name: (shape, dtype)}, bytes."""

    def __init__(self, num_layers: int, num_experts: int, params: dict[str, tuple[tuple[int, ...], torch.dtype]]):
        self.num_layers, self.num_experts, self.params = num_layers, num_experts, params
        self.expert_bytes = sum(int(np.prod(s)) * torch.empty((), dtype=d).element_size() for s, d in params.values())


class PinnedTier:
    """Experts of `geom` in (pinned) host memory, copied to `device` slots (module docstring)."""

    accepts_bytes = False

    def __init__(self, geom, device: str | torch.device = "cuda", *, seed: int = 0) -> None:
        self.device = check_device(device)
        cuda = self.device.type == "cuda"
        E, params = geom.experts, geom.params
        self.layout = TierLayout(geom.layers, E, params)
        check_host_memory(geom)
        self.mode = "pinned->cuda" if cuda else "memory->cpu"
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.host: dict[str, list[torch.Tensor]] = {p: [] for p in params}
        for _li in range(geom.layers):
            for p, (shape, dt) in params.items():
                t = torch.empty((E, *shape), dtype=dt, pin_memory=cuda)
                _fill_random(t, gen, self.device)
                self.host[p].append(t)
        self._local = threading.local()
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.reads = 0
        self.read_s = 0.0
        self.direct_reads = 0

    def pool(self, n: int, shape: tuple[int, ...], dt: torch.dtype) -> torch.Tensor:
        """The store's slot pool [n, *shape] on the device; a pool larger than the device's free memory is refused."""
        need = n * int(np.prod(shape)) * torch.empty((), dtype=dt).element_size()
        free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else available_memory()
        if need > free:
            raise ConfigError(f"--budget: {n} expert slots need {need / 1e9:.1f} GB on {self.device}; {free / 1e9:.1f} GB "
                              "are free: expected a smaller --budget or fewer --geometry-layers.")
        return torch.empty((n, *shape), dtype=dt, device=self.device)

    def _stream(self):
        s = getattr(self._local, "stream", None)
        if s is None and self.device.type == "cuda":
            s = self._local.stream = torch.cuda.Stream(device=self.device)
        return s

    def read_into(self, key: int, dests: dict[str, torch.Tensor]) -> int:
        """Copy expert `key` (layer * E + expert) into dests[param] (its slot's device tensors) and wait until the
        bytes are there -> bytes copied."""
        layer, e = divmod(int(key), self.layout.num_experts)
        stream = self._stream()
        t0 = time.perf_counter()
        total = 0
        if stream is None:
            for p, d in dests.items():
                d.copy_(self.host[p][layer][e])
                total += d.numel() * d.element_size()
        else:
            with torch.cuda.stream(stream):
                for p, d in dests.items():
                    d.copy_(self.host[p][layer][e], non_blocking=True)
                    total += d.numel() * d.element_size()
            stream.synchronize()
        dt = time.perf_counter() - t0
        with self._lock:
            self.bytes_read += total
            self.reads += 1
            self.read_s += dt
        return total

    def close(self) -> None:
        """Nothing to release per run: the host tensors live as long as the tier (one tier serves many runs)."""

    def release(self) -> None:
        """Drop the host tensors (pinned memory back to the system)."""
        self.host = {p: [] for p in self.host}


def device_name(device: str | torch.device) -> str:
    """The accelerator's name as the driver gives it ('cpu' for the CPU)."""
    d = torch.device(device)
    return torch.cuda.get_device_name(d) if d.type == "cuda" else "cpu"


def sync(device: torch.device) -> None:
    """Wait for the compute (current) stream of `device` only: never for the loader streams' copies."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
