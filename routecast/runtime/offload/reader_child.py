"""The reader process: reads experts from the checkpoint into the store's shared slot pools, outside the compute
process (its own interpreter, so no GIL shared with the forward pass). Started by reader.ProcessReader as a script
(``python reader_child.py REQ_FD DONE_FD``, standard library only: it never imports routecast, torch or numpy).

Protocol (little-endian int64 records of 5 fields, pipes):
  in   (kind, seq, key, slot, prio_milli)   kind 1 = read expert `key` into slot `slot` at priority prio (lower first,
       then older seq); 2 = cancel `seq` (skipped if not started); 3 = bump `seq` to prio; 4 = stop
  out  (seq, status, a, b, c)               status 0 = read: a bytes requested, b ns spent, c requests read straight
       into the slot; 1 = cancelled before it started; 2 = truncated file: a bytes got of b; 3 = OSError: a = errno
The first message in is a length-prefixed JSON object: the layout (files, mode, per-key plans) and the pools (memfd,
size, slot stride per parameter). One read at a time: reads into one slot land in the order they were sent.
"""

from __future__ import annotations

import heapq
import json
import mmap
import os
import select
import struct
import sys
import time

REC = struct.Struct("<5q")
ALIGN = 4096
JOB, CANCEL, BUMP, STOP = 1, 2, 3, 4
DONE, SKIPPED, SHORT, OSERR = 0, 1, 2, 3


def _read_exact(fd: int, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


class Child:
    def __init__(self, spec: dict, done_fd: int) -> None:
        self.done_fd = done_fd
        self.mode = spec["mode"]
        flags = os.O_RDONLY | (os.O_DIRECT if self.mode == "o_direct" else 0)
        self.fds = [os.open(p, flags) for p in spec["files"]]
        self.plans = spec["plans"]  # key -> (file index, ((offset, n, need, ((inner, nbytes, param, at), ...)), ...))
        self.maps = [mmap.mmap(fd, size, flags=mmap.MAP_SHARED) for fd, size, _stride in spec["pools"]]
        self.views = [memoryview(m) for m in self.maps]
        self.addr = [_address(m) for m in self.maps]
        self.stride = [stride for _fd, _size, stride in spec["pools"]]
        self.buf = mmap.mmap(-1, max(ALIGN, -(-spec["max_request"] // ALIGN) * ALIGN))
        self.bview = memoryview(self.buf)

    def read(self, seq: int, key: int, slot: int) -> None:
        fi, requests = self.plans[key]
        fd = self.fds[fi]
        total = direct = 0
        t0 = time.perf_counter_ns()
        for off, n, need, copies in requests:
            if self.mode == "fadvise":
                os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)
            dest = None
            if len(copies) == 1 and copies[0][0] == 0 and copies[0][1] == n:
                _inner, nb, p, at = copies[0]
                start = slot * self.stride[p] + at
                if (self.addr[p] + start) % ALIGN == 0:
                    dest = self.views[p][start:start + nb]
            got = os.preadv(fd, [dest if dest is not None else self.bview[:n]], off)
            if got < need:
                self.send(seq, SHORT, got, n, 0)
                return
            total += n
            if dest is not None:
                direct += 1
                continue
            for inner, nb, p, at in copies:
                start = slot * self.stride[p] + at
                self.views[p][start:start + nb] = self.bview[inner:inner + nb]
        self.send(seq, DONE, total, time.perf_counter_ns() - t0, direct)

    def send(self, seq: int, status: int, a: int, b: int, c: int) -> None:
        os.write(self.done_fd, REC.pack(seq, status, a, b, c))


def _address(m: mmap.mmap) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def serve(req_fd: int, done_fd: int) -> None:
    (n,) = struct.unpack("<q", _read_exact(req_fd, 8))
    child = Child(json.loads(_read_exact(req_fd, n)), done_fd)
    os.set_blocking(req_fd, False)
    heap: list[tuple[int, int]] = []
    live: dict[int, tuple[int, int]] = {}  # seq -> (key, slot) of a read not started
    pending = b""
    while True:
        if not live:
            select.select([req_fd], [], [])
        try:
            data = os.read(req_fd, REC.size * 256)
        except BlockingIOError:
            data = None
        if data == b"":
            return  # the store closed its end
        if data:
            pending += data
            cut = len(pending) - len(pending) % REC.size
            for kind, seq, key, slot, prio in REC.iter_unpack(pending[:cut]):
                if kind == JOB:
                    live[seq] = (key, slot)
                    heapq.heappush(heap, (prio, seq))
                elif kind == CANCEL and seq in live:
                    del live[seq]
                    child.send(seq, SKIPPED, 0, 0, 0)
                elif kind == BUMP and seq in live:
                    heapq.heappush(heap, (prio, seq))
                elif kind == STOP:
                    return
            pending = pending[cut:]
        while heap:
            _prio, seq = heapq.heappop(heap)
            job = live.pop(seq, None)
            if job is None:
                continue  # cancelled, or an older entry of a bumped read
            try:
                child.read(seq, *job)
            except OSError as e:
                child.send(seq, OSERR, e.errno or 0, 0, 0)
            break  # read the pipe again before the next read: a demand load may have arrived


if __name__ == "__main__":
    try:
        serve(int(sys.argv[1]), int(sys.argv[2]))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass
