"""The slow tier on a CPU-only machine: the checkpoint's safetensors file on disk, read per expert.

Each routed expert (MoE layer l, expert e) is a set of byte ranges of the checkpoint: slices of fused
``experts.<param>`` tensors [E, ...] when the file stores them fused, or the per-expert tensors
(``experts.<e>.gate_proj / up_proj / down_proj`` or Mixtral's ``w1 / w3 / w2``) that transformers 5 fuses on
load (gate_up_proj[e] = cat(gate, up) along dim 0, down_proj[e] = down). ``ExpertLayout`` finds them from
the file headers and the loaded model's fused tensors, and checks the bytes against the model's values.

Reads bypass the page cache so that a miss costs what the disk costs: the file is opened with O_DIRECT and
read into page-aligned buffers at 4 KiB-aligned offsets (mode "o_direct"); a piece that fills a whole aligned
request is read straight into its slot (the store's pools are page-aligned) with no copy; where the filesystem refuses
O_DIRECT (tmpfs, some overlays), each read is preceded by posix_fadvise(DONTNEED) over its range, which
drops those clean pages from the cache (mode "fadvise"). ``DiskTier.mode`` says which one runs.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from routecast.common.errors import ConfigError

ALIGN = 4096
MERGE_GAP = 1 << 16  # pieces of one expert closer than this are read in one request
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
# fused model parameter -> per-expert checkpoint tensors concatenated along dim 0 (alternative names)
_PIECES = {
    "gate_up_proj": (("gate_proj", "w1"), ("up_proj", "w3")),
    "down_proj": (("down_proj", "w2"),),
    "up_proj": (("up_proj", "w3"),),
}
_BLOCK_ALIASES = (("mlp", "block_sparse_moe"),)


@dataclass(frozen=True)
class Piece:
    """One contiguous byte range of the file -> rows [row0, row0 + rows) of a fused param's expert slice."""

    param: str
    file_offset: int
    nbytes: int
    dtype: torch.dtype
    row0: int
    rows: int


@dataclass(frozen=True)
class ReadPlan:
    """What one expert needs: aligned requests (offset, length) and where each piece lies in them."""

    requests: tuple[tuple[int, int], ...]
    pieces: tuple[tuple[int, int, Piece], ...]  # (request index, offset inside the request, piece)
    nbytes: int  # useful bytes (the expert's weights as stored)
    need: tuple[int, ...] = ()  # per request: the bytes its pieces need (a shorter read is a truncated file)
    copies: tuple[tuple[tuple[int, int, str, int], ...], ...] = ()  # per request: (offset inside, nbytes, param,
    # byte offset inside the param's expert slice) of each piece, for byte-array destinations


def read_header(path: Path) -> tuple[dict, int]:
    """(safetensors header dict, byte offset of the data section) of path."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ConfigError(f"{path}: too short for a safetensors file; expected an 8-byte header length.")
        (n,) = struct.unpack("<Q", raw)
        try:
            head = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise ConfigError(f"{path}: the safetensors header is not JSON; expected a safetensors checkpoint.") from None
    head.pop("__metadata__", None)
    return head, 8 + n


class ExpertLayout:
    """Where every (layer, expert) of a model lives in its safetensors checkpoint.

    block_paths: the MoE blocks' module paths in MoE-layer order (``model.layers.1.mlp``); params:
    fused expert parameter name -> (shape per expert, dtype) from the loaded model. Raises ConfigError
    naming the tensor when the checkpoint does not hold an expert's weights in a known layout.
    """

    def __init__(self, files: list[Path], block_paths: list[str], params: dict[str, tuple[tuple[int, ...], torch.dtype]],
                 num_experts: int) -> None:
        self.files = files
        self.params = params
        self.num_layers, self.num_experts = len(block_paths), num_experts
        index: dict[str, tuple[int, dict, int]] = {}
        for fi, p in enumerate(files):
            head, base = read_header(p)
            for name, meta in head.items():
                index[name] = (fi, meta, base)
        self.file_of = np.zeros(self.num_layers * num_experts, np.int64)
        self.plans: list[ReadPlan] = []
        for li, bp in enumerate(block_paths):
            for e in range(num_experts):
                fi, pieces = self._find(index, bp, e)
                self.file_of[li * num_experts + e] = fi
                self.plans.append(_plan(pieces))
        self.expert_bytes = self.plans[0].nbytes

    def _find(self, index: dict, block_path: str, e: int) -> tuple[int, list[Piece]]:
        prefixes = [block_path] + [block_path.replace(f".{a}", f".{b}") for a, b in _BLOCK_ALIASES if f".{a}" in block_path]
        pieces: list[Piece] = []
        files = set()
        for param, (shape, _dt) in self.params.items():
            got = None
            for pre in prefixes:
                got = _fused(index, f"{pre}.experts.{param}", e, self.num_experts, param, shape) or \
                    _split(index, f"{pre}.experts.{e}", param, shape)
                if got:
                    break
            if not got:
                raise ConfigError(
                    f"checkpoint: expert {e} of {block_path} has no tensor for '{param}' (looked for "
                    f"{block_path}.experts.{param} and {block_path}.experts.{e}.<name>.weight); expected a "
                    "transformers MoE checkpoint with fused or per-expert weights.")
            for fi, pc in got:
                files.add(fi)
                pieces.append(pc)
        if len(files) != 1:
            raise ConfigError(f"checkpoint: expert {e} of {block_path} is split over several files; expected one file per expert.")
        return files.pop(), pieces


def _fused(index: dict, name: str, e: int, E: int, param: str, shape: tuple[int, ...]) -> list | None:
    if name not in index:
        return None
    fi, meta, base = index[name]
    if tuple(meta["shape"]) != (E, *shape):
        raise ConfigError(f"checkpoint: {name} has shape {meta['shape']}; expected {[E, *shape]}.")
    dt = _dtype(name, meta)
    per = int(np.prod(shape)) * torch.empty((), dtype=dt).element_size()
    start = base + meta["data_offsets"][0] + e * per
    return [(fi, Piece(param, start, per, dt, 0, shape[0]))]


def _split(index: dict, pre: str, param: str, shape: tuple[int, ...]) -> list | None:
    alts = _PIECES.get(param)
    if alts is None:
        return None
    out, row = [], 0
    for names in alts:
        hit = next((f"{pre}.{n}.weight" for n in names if f"{pre}.{n}.weight" in index), None)
        if hit is None:
            return None
        fi, meta, base = index[hit]
        dt = _dtype(hit, meta)
        rows = int(meta["shape"][0])
        if tuple(meta["shape"][1:]) != tuple(shape[1:]):
            raise ConfigError(f"checkpoint: {hit} has shape {meta['shape']}; expected [rows, {', '.join(map(str, shape[1:]))}].")
        a, b = meta["data_offsets"]
        out.append((fi, Piece(param, base + a, b - a, dt, row, rows)))
        row += rows
    if row != shape[0]:
        raise ConfigError(f"checkpoint: {pre}.* pieces of '{param}' hold {row} rows; expected {shape[0]}.")
    return out


def _dtype(name: str, meta: dict) -> torch.dtype:
    dt = _DTYPES.get(meta.get("dtype"))
    if dt is None:
        raise ConfigError(f"checkpoint: {name} has dtype {meta.get('dtype')!r}; expected one of {', '.join(_DTYPES)}.")
    return dt


def _plan(pieces: list[Piece]) -> ReadPlan:
    """Merge the pieces of one expert into aligned read requests (pieces closer than MERGE_GAP share one)."""
    order = sorted(pieces, key=lambda p: p.file_offset)
    groups: list[list[Piece]] = [[order[0]]]
    for p in order[1:]:
        last = groups[-1][-1]
        if p.file_offset - (last.file_offset + last.nbytes) <= MERGE_GAP:
            groups[-1].append(p)
        else:
            groups.append([p])
    requests, placed = [], []
    for gi, g in enumerate(groups):
        lo = g[0].file_offset // ALIGN * ALIGN
        hi = -(-(g[-1].file_offset + g[-1].nbytes) // ALIGN) * ALIGN
        requests.append((lo, hi - lo))
        placed.extend((gi, p.file_offset - lo, p) for p in g)
    need = tuple(max(inner + pc.nbytes for rj, inner, pc in placed if rj == ri) for ri in range(len(requests)))
    copies = tuple(tuple((inner, pc.nbytes, pc.param, pc.row0 * (pc.nbytes // pc.rows)) for rj, inner, pc in placed
                         if rj == ri) for ri in range(len(requests)))
    return ReadPlan(tuple(requests), tuple(placed), sum(p.nbytes for p in pieces), need, copies)


class DiskTier:
    """Reads experts from the checkpoint, bypassing the page cache (mode 'o_direct' or 'fadvise').

    direct: True = O_DIRECT if the filesystem accepts it (else fadvise), False = fadvise only.
    Thread-safe: each thread reads into its own page-aligned buffer. Counters: bytes_read (bytes
    requested from the device, aligned), reads, read_s (seconds inside the reads, summed over threads).
    ``accepts_bytes``: read_into also takes flat uint8 numpy views of the destinations (the store's slots), copied
    with numpy slice assignment: a loader thread then holds the GIL for far less time than with torch calls.
    """

    accepts_bytes = True

    def __init__(self, layout: ExpertLayout, *, direct: bool = True) -> None:
        self.layout = layout
        self.fds: list[int] = []
        self.mode = "o_direct" if direct and hasattr(os, "O_DIRECT") else "fadvise"
        for p in layout.files:
            fd = None
            if self.mode == "o_direct":
                try:
                    fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
                    self._probe(fd)
                except OSError:
                    if fd is not None:
                        os.close(fd)
                    fd = None
                    self.mode = "fadvise"
            if fd is None:
                fd = os.open(p, os.O_RDONLY)
            self.fds.append(fd)
        if self.mode == "fadvise":  # a file opened before the fallback may still carry O_DIRECT: reopen
            for i, p in enumerate(layout.files):
                os.close(self.fds[i])
                self.fds[i] = os.open(p, os.O_RDONLY)
        self.max_request = max(n for pl in layout.plans for _, n in pl.requests)
        self._local = threading.local()
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.reads = 0
        self.read_s = 0.0
        self.direct_reads = 0  # requests read straight into a slot (no copy)

    @staticmethod
    def _direct_dest(plan: ReadPlan, ri: int, n: int, dests: dict) -> memoryview | None:
        """The slot bytes request ri can be read into directly (one piece filling the whole aligned request, a
        byte-array destination starting on a page), or None (read into the thread's buffer and copy)."""
        cp = plan.copies[ri] if plan.copies else ()
        if len(cp) != 1 or cp[0][0] != 0 or cp[0][1] != n:
            return None
        _inner, nb, param, at = cp[0]
        d = dests.get(param)
        if not isinstance(d, np.ndarray) or (d.ctypes.data + at) % ALIGN:
            return None
        return memoryview(d[at:at + nb])

    @staticmethod
    def _probe(fd: int) -> None:
        buf = mmap.mmap(-1, ALIGN)
        try:
            os.preadv(fd, [buf], 0)
        finally:
            buf.close()

    def _buffer(self) -> mmap.mmap:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = mmap.mmap(-1, -(-self.max_request // ALIGN) * ALIGN)  # page-aligned
            self._local.arr = np.frombuffer(buf, np.uint8)
        return buf

    def child_spec(self, params: list[str]) -> dict:
        """What a reader process needs to read every expert (reader.py): the files, the mode, and per key its file
        index and its requests (offset, length, bytes needed, pieces (offset inside, bytes, index of the param in
        `params`, byte offset inside the param's expert slice))."""
        index = {p: i for i, p in enumerate(params)}
        lay = self.layout
        plans = [(int(lay.file_of[k]), tuple((off, n, plan.need[ri], tuple((inner, nb, index[p], at)
                                                                          for inner, nb, p, at in plan.copies[ri]))
                                             for ri, (off, n) in enumerate(plan.requests)))
                 for k, plan in enumerate(lay.plans)]
        return {"files": [str(p) for p in lay.files], "mode": self.mode, "plans": plans,
                "max_request": self.max_request}

    def add_read(self, nbytes: int, seconds: float, direct: int) -> None:
        """Count one expert read done elsewhere (a reader process) in this tier's counters."""
        with self._lock:
            self.bytes_read += nbytes
            self.reads += 1
            self.read_s += seconds
            self.direct_reads += direct

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def read_into(self, key: int, dests: dict[str, torch.Tensor | np.ndarray]) -> int:
        """Read expert `key` (layer * E + expert) into dests[param] (the slot's tensors, or flat uint8 numpy views of
        their bytes); -> bytes requested."""
        plan = self.layout.plans[key]
        fd = self.fds[int(self.layout.file_of[key])]
        buf = self._buffer()
        total = n_direct = 0
        t0 = time.perf_counter()
        for ri, (off, n) in enumerate(plan.requests):
            if self.mode == "fadvise":
                os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)
            direct = self._direct_dest(plan, ri, n, dests)
            view = memoryview(buf)[:n] if direct is None else direct
            got = os.preadv(fd, [view], off)
            view.release()
            if got < plan.need[ri]:  # only the file's last page may come back short
                raise ConfigError(f"checkpoint: read of expert {key} returned {got} of {n} bytes; the file is truncated.")
            total += n
            if direct is not None:  # read straight into the slot
                n_direct += 1
                continue
            if all(isinstance(d, np.ndarray) for d in dests.values()):
                arr = self._local.arr
                for inner, nb, param, at in plan.copies[ri]:
                    dests[param][at:at + nb] = arr[inner:inner + nb]
                continue
            for rj, inner, pc in plan.pieces:
                if rj != ri:
                    continue
                src = torch.frombuffer(buf, dtype=pc.dtype, count=pc.nbytes // pc.dtype.itemsize, offset=inner)
                dst = dests[pc.param]
                dst[pc.row0:pc.row0 + pc.rows].copy_(src.view(pc.rows, *dst.shape[1:]))
        dt = time.perf_counter() - t0
        with self._lock:
            self.bytes_read += total
            self.reads += 1
            self.read_s += dt
            self.direct_reads += n_direct
        return total


def measure_bandwidth(tier: DiskTier, *, reads: int = 64, seed: int = 0) -> dict[str, float]:
    """Time `reads` expert reads at random keys (median of per-read times) -> bytes/s of one expert-sized read.

    The figure that prices a miss: expert bytes / median seconds per expert read (latency included).
    """
    L, E = tier.layout.num_layers, tier.layout.num_experts
    keys = np.random.default_rng(seed).integers(0, L * E, size=reads)
    dests = {p: torch.empty(shape, dtype=dt) for p, (shape, dt) in tier.layout.params.items()}
    times = []
    for k in keys.tolist():
        t0 = time.perf_counter()
        tier.read_into(int(k), dests)
        times.append(time.perf_counter() - t0)
    med = float(np.median(times))
    eb = tier.layout.expert_bytes
    return {"mode": tier.mode, "reads": reads, "expert_bytes": eb, "median_read_s": med,
            "p10_read_s": float(np.percentile(times, 10)), "p90_read_s": float(np.percentile(times, 90)),
            "bandwidth_Bps": eb / med}


def measure_concurrency(tier: DiskTier, dests: list[dict], *, threads: tuple[int, ...] = (1, 2, 4), reads: int = 24,
                        seed: int = 0) -> dict[int, float]:
    """Seconds per expert read with `n` reads in flight, for each n in `threads`: n threads read `reads` random
    experts between them, thread i into dests[i] (slots of a store: page-aligned, faulted in, as the runtime's);
    -> {n: wall seconds / reads}. A disk that serves parallel reads faster shows falling values; this machine's
    virtual disk may not, so the geometry benchmark runs its loaders at the fastest n and prices the replay's link
    with that n's figure."""
    if len(dests) < max(threads):
        raise ValueError(f"measure_concurrency: {len(dests)} destinations for up to {max(threads)} threads")
    L, E = tier.layout.num_layers, tier.layout.num_experts
    out = {}
    for n in threads:
        per = max(1, reads // n)
        keys = np.random.default_rng(seed + n).integers(0, L * E, size=(n, per))

        def work(row: np.ndarray, dest: dict) -> None:
            for k in row.tolist():
                tier.read_into(int(k), dest)

        pool = [threading.Thread(target=work, args=(keys[i], dests[i])) for i in range(n)]
        t0 = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        out[n] = (time.perf_counter() - t0) / (per * n)
    return out
