"""Expert reads in child processes: the store's loader without a GIL shared with the compute thread.

A loader thread of the compute process takes the GIL to pop its job, again when its read returns, and again to
mark the slot ready; each hand-over waits for the forward pass to give the GIL up. benchmarks/reader_interference.py
times the built-in model's forwards while a store prefetches in the background: the reads cost the forward less
from a reader process than from a loader thread (docs/results/reader_interference.md), though not nothing on a
2-vCPU machine, where any work beside the forward slows it. So here the reads run in
``reader_child.py`` processes (standard library only) that write straight into the slot pools, which live in
shared memory (one memfd per fused parameter, mapped by both sides).

Each child keeps its own priority queue (demand loads first, then prefetches nearest layer first) and reads one
expert at a time; slot s belongs to child s % procs, so the reads into one slot land in the order they were sent
and a slot is never written by two reads at once. The compute thread sends jobs, cancellations and bumps (a late
prefetch jumps the queue) over a pipe and collects completions from another when it needs a slot's weights
(``poll``). Only ``tier.DiskTier`` has a child side (``DiskTier.child_spec``); the GPU tier keeps its threads.
"""

from __future__ import annotations

import json
import mmap
import os
import select
import struct
import subprocess
import sys
from pathlib import Path

import torch

from routecast.common.errors import ConfigError
from routecast.runtime.offload import reader_child as C

CHILD = Path(C.__file__)


def process_reader_fits(tier) -> bool:
    """Whether reader processes can serve `tier`: it reads from disk (a child side) and memfd_create exists."""
    return hasattr(tier, "child_spec") and hasattr(os, "memfd_create")


class ProcessReader:
    """`procs` reader processes over `tier` (a DiskTier); make the slot pools with ``pool`` before ``start``."""

    def __init__(self, tier, procs: int) -> None:
        if not hasattr(tier, "child_spec"):
            raise ConfigError(f"reader 'process' needs a tier read from disk; {type(tier).__name__} has no child side "
                              "(expected reader 'threads').")
        if not hasattr(os, "memfd_create"):
            raise ConfigError("reader 'process' needs os.memfd_create (Linux); expected reader 'threads' here.")
        self.tier, self.procs = tier, procs
        self.pool_fds: list[tuple[int, int, int]] = []  # (memfd, bytes, slot stride) per fused parameter
        self._maps: list[mmap.mmap] = []
        self.kids: list[subprocess.Popen] = []
        self.req: list[int] = []
        self.done: dict[int, int] = {}  # done fd -> child index
        self.pending: dict[int, bytes] = {}
        self.out: list[bytearray] = []  # per child: records not yet written (flush)

    def pool(self, n: int, shape: tuple[int, ...], dt: torch.dtype) -> torch.Tensor:
        """[n, *shape] of dt in shared memory (page-aligned, faulted in now), which the children read into."""
        stride = int(torch.Size(shape).numel()) * torch.empty((), dtype=dt).element_size()
        nbytes = max(n * stride, 1)
        fd = os.memfd_create(f"routecast-slots-{len(self.pool_fds)}")
        os.ftruncate(fd, nbytes)
        buf = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        self._maps.append(buf)
        self.pool_fds.append((fd, nbytes, stride))
        return torch.frombuffer(buf, dtype=torch.uint8, count=n * stride).view(dt).view(n, *shape)

    def start(self, params: list[str]) -> None:
        """Start the children; `params`: the fused parameters in the order their pools were made."""
        spec = dict(self.tier.child_spec(params), pools=self.pool_fds)
        blob = json.dumps(spec).encode()
        for i in range(self.procs):
            req_r, req_w = os.pipe()
            done_r, done_w = os.pipe()
            fds = (req_r, done_w, *[fd for fd, _, _ in self.pool_fds])
            kid = subprocess.Popen([sys.executable, "-S", str(CHILD), str(req_r), str(done_w)], pass_fds=fds,
                                   stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
            os.close(req_r)
            os.close(done_w)
            os.write(req_w, struct.pack("<q", len(blob)) + blob)
            self.kids.append(kid)
            self.req.append(req_w)
            self.out.append(bytearray())
            os.set_blocking(done_r, False)
            self.done[done_r] = i
            self.pending[done_r] = b""

    def _send(self, slot: int, kind: int, seq: int, key: int = 0, prio: float = 0.0) -> None:
        """Queue a record for slot's child; it is written at the next flush (one write per child and call)."""
        self.out[slot % self.procs] += C.REC.pack(kind, seq, key, slot, round(prio * 1000))

    def flush(self) -> None:
        """Write the queued records (in the order they were queued, per child)."""
        for i, buf in enumerate(self.out):
            if buf:
                view = memoryview(buf)
                try:
                    while view:  # a blocking pipe write may still return short (a signal)
                        view = view[os.write(self.req[i], view):]
                except BrokenPipeError:
                    self._died(i)
                finally:
                    view.release()
                buf.clear()

    def submit(self, seq: int, key: int, slot: int, prio: float) -> None:
        self._send(slot, C.JOB, seq, key, prio)

    def cancel(self, seq: int, slot: int) -> None:
        self._send(slot, C.CANCEL, seq)

    def bump(self, seq: int, slot: int, prio: float) -> None:
        self._send(slot, C.BUMP, seq, prio=prio)

    def poll(self, block: bool) -> list[tuple[int, int, int, int, int]]:
        """Completions so far, (seq, status, a, b, c) each (reader_child.py); block: wait for at least one."""
        self.flush()
        out: list[tuple[int, int, int, int, int]] = []
        while True:
            for fd in self.done:
                try:
                    data = os.read(fd, C.REC.size * 512)
                except BlockingIOError:
                    continue
                if not data:
                    self._died(self.done[fd])
                buf = self.pending[fd] + data
                cut = len(buf) - len(buf) % C.REC.size
                out.extend(C.REC.iter_unpack(buf[:cut]))
                self.pending[fd] = buf[cut:]
            if out or not block:
                return out
            select.select(list(self.done), [], [], 1.0)

    def _died(self, i: int) -> None:
        kid = self.kids[i]
        kid.wait(timeout=5)
        err = kid.stderr.read().decode(errors="replace").strip().splitlines() if kid.stderr else []
        raise RuntimeError(f"expert reader process {i} exited with code {kid.returncode}"
                           + (f": {err[-1]}" if err else "") + "; expected it to run until the store closes.")

    def close(self) -> None:
        for fd in self.req:
            try:
                os.write(fd, C.REC.pack(C.STOP, 0, 0, 0, 0))
            except OSError:
                pass
            os.close(fd)
        for kid in self.kids:
            try:
                kid.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kid.kill()
                kid.wait()
            if kid.stderr:
                kid.stderr.close()
        for fd in self.done:
            os.close(fd)
        for fd, _, _ in self.pool_fds:
            os.close(fd)
        self.req, self.kids, self.done, self.pool_fds = [], [], {}, []
