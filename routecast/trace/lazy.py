"""Lazy multi-shard routing arrays: a trace's shards memory-mapped one at a time, in order, never concatenated.

Shapes (legend in spec.py): a ShardedArray stands for one routing tensor of the whole trace, (T, ...) rows
stored as a sequence of shards (rows offsets_S[i] .. offsets_S[i+1] in shard i). Only one shard is mapped
at a time: moving to another shard drops the previous mapping (munmap releases its resident pages), so a
scan's resident memory is bounded by the largest shard, not by the trace, and so is its address space
(a cap below the trace's size is enough: tests/trace/test_lazy.py reads under RLIMIT_AS).

Each shard is checked the first time it is mapped: the value checks of Trace.validate (expert id range,
distinct top-k, finite weights, logits and hidden) always, then its CRC-32 against trace.json (when
recorded and verify=True). A matching CRC does not skip the value checks: it proves the bytes are those
trace.json describes, and trace.json can be edited along with the shard. A corrupt shard raises a
TraceError naming its file when a scan reaches it. Slices inside one shard are views;
slices across shards and index gathers are copies of only the rows asked for. Anything else (np.asarray,
arithmetic, reductions) materialises the whole tensor: it works for traces that fit in memory and fails loudly
under a memory cap. MATERIALISED counts every whole read, whatever its spelling: a materialisation, and any
index that reads at least all T rows at once (x[:], x[::-1], x[:, 0], an all-True mask, np.arange(T), ...),
since each holds the whole tensor (or a whole column of it) in memory; tests assert the streaming commands
never do it. Reading shard by shard (blocks, Trace.chunks) does not count.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import TraceError

# How many times a ShardedArray was read whole: materialised, or indexed for >= all of its rows in one call
# (tests check streaming paths keep it unchanged).
MATERIALISED = {"count": 0}
CRC_BLOCK = 16 << 20  # bytes per zlib.crc32 call: large enough to amortise the call, small enough to stay in cache


def crc32_of(buf: np.ndarray) -> int:
    """CRC-32 (zlib) of a uint8 buffer, computed block by block (no copy of the buffer)."""
    crc = 0
    for a in range(0, buf.size, CRC_BLOCK):
        crc = zlib.crc32(buf[a:a + CRC_BLOCK], crc)
    return crc


class ShardSource:
    """The shards of one trace directory: maps one shard at a time and checks each on first visit.

    load(i) -> (dict name -> array view of shard i, raw uint8 memmap); check(i, arrays, raw) raises a
    TraceError if shard i is corrupt (called once per shard per source).
    """

    def __init__(self, files: list[Path], rows: list[int], load: Callable[[int], tuple[dict, np.ndarray]],
                 check: Callable[[int, dict, np.ndarray], None]) -> None:
        self.files = files
        self.offsets = np.r_[0, np.cumsum(np.asarray(rows, np.int64))].astype(np.int64)
        self._load, self._check = load, check
        self._cur: tuple[int, dict[str, np.ndarray] | None] = (-1, None)
        self.checked: set[int] = set()

    @property
    def num_shards(self) -> int:
        return len(self.files)

    def shard(self, i: int) -> dict[str, np.ndarray]:
        """Arrays of shard i (views of its memory map); the previously mapped shard is released first."""
        if self._cur[0] == i:
            return self._cur[1]
        self._cur = (-1, None)  # drop our reference so its pages can go before the next shard is mapped
        arrays, raw = self._load(i)
        if i not in self.checked:
            self._check(i, arrays, raw)
            self.checked.add(i)
        del raw
        self._cur = (i, arrays)
        return arrays

    def release(self) -> None:
        self._cur = (-1, None)


class ShardedArray:
    """One routing tensor of a multi-shard trace, read lazily (see the module docstring).

    shape (T, ...), dtype: those of the whole tensor. Indexing with an int, a step-1 slice, an integer
    index array or a boolean mask over rows (optionally followed by indices of the other axes) reads only
    the rows asked for.
    """

    def __init__(self, source: ShardSource, name: str, tail: tuple[int, ...], dtype: np.dtype) -> None:
        self.source, self.name = source, name
        self.shape = (int(source.offsets[-1]), *tail)
        self.dtype = np.dtype(dtype)

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape)))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"ShardedArray({self.name}, shape={self.shape}, dtype={self.dtype}, shards={self.source.num_shards})"

    def blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """Yield (first row, view of one shard's rows) for every shard, in order."""
        off = self.source.offsets
        for i in range(self.source.num_shards):
            if off[i + 1] > off[i]:
                yield int(off[i]), self.source.shard(i)[self.name]

    def _rows(self, a: int, b: int) -> np.ndarray:
        off = self.source.offsets
        i = int(np.searchsorted(off, a, side="right")) - 1
        if b <= off[i + 1]:
            return self.source.shard(i)[self.name][a - off[i]:b - off[i]]
        parts = []
        while a < b:
            i = int(np.searchsorted(off, a, side="right")) - 1
            e = min(b, int(off[i + 1]))
            parts.append(np.array(self.source.shard(i)[self.name][a - off[i]:e - off[i]]))
            a = e
        return np.concatenate(parts)

    def _gather(self, idx: np.ndarray) -> np.ndarray:
        T = self.shape[0]
        idx = np.asarray(idx, np.int64)
        if idx.size and (idx.min() < -T or idx.max() >= T):
            raise IndexError(f"index out of range for {self.name} with {T} rows")
        idx = np.where(idx < 0, idx + T, idx)
        out = np.empty((idx.size, *self.shape[1:]), self.dtype)
        shard_of = np.searchsorted(self.source.offsets, idx, side="right") - 1
        order = np.argsort(shard_of, kind="stable")
        cuts = np.searchsorted(shard_of[order], np.arange(self.source.num_shards + 1))
        for i in range(self.source.num_shards):
            sel = order[cuts[i]:cuts[i + 1]]
            if sel.size:
                out[sel] = self.source.shard(i)[self.name][idx[sel] - self.source.offsets[i]]
        return out

    def __getitem__(self, key: Any) -> np.ndarray:
        rest: tuple = ()
        if isinstance(key, tuple):
            key, rest = (key[0], key[1:]) if key else (slice(None), ())
        if key is Ellipsis:
            key = slice(None)
        if isinstance(key, (int, np.integer)):
            k = int(key) + (self.shape[0] if key < 0 else 0)
            if not 0 <= k < self.shape[0]:
                raise IndexError(f"row {key} out of range for {self.name} with {self.shape[0]} rows")
            out = self._rows(k, k + 1)[0]
            return out[rest] if rest else out
        if isinstance(key, slice) and key.step in (None, 1):
            a, b, _ = key.indices(self.shape[0])
            out = self._rows(a, max(a, b)) if b > a else np.empty((0, *self.shape[1:]), self.dtype)
            rows = len(out)
        elif isinstance(key, slice):
            out = self._gather(np.arange(*key.indices(self.shape[0])))
            rows = len(out)
        else:
            k = np.asarray(key)
            if k.dtype == bool:
                if k.shape != (self.shape[0],):
                    raise IndexError(f"boolean index of shape {k.shape} for {self.name} with {self.shape[0]} rows")
                k = np.flatnonzero(k)
            elif k.dtype.kind not in "iu":
                raise IndexError(f"unsupported index {type(key).__name__} for {self.name}")
            out = self._gather(k.reshape(-1)).reshape(*k.shape, *self.shape[1:])
            rows = k.size
        if rows >= self.shape[0] > 0:  # every row in one read, however it was spelled: a whole read
            MATERIALISED["count"] += 1
        return out[(slice(None), *rest)] if rest else out

    def materialise(self) -> np.ndarray:
        """The whole tensor as one in-memory array (a full copy: only for traces that fit in memory)."""
        MATERIALISED["count"] += 1
        out = np.empty(self.shape, self.dtype)
        for a, blk in self.blocks():
            out[a:a + len(blk)] = blk
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.materialise()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __getattr__(self, name: str) -> Any:
        # ndarray methods (astype, min, reshape, ...) on the whole tensor: materialise, then delegate.
        if name.startswith("__") or name in ("source", "name", "shape", "dtype"):
            raise AttributeError(name)
        return getattr(self.materialise(), name)


def check_crc(file: Path, raw: np.ndarray, want: int | None) -> None:
    """Raise a TraceError unless the shard's bytes have the CRC-32 trace.json records (None: not recorded)."""
    if want is None:
        return
    got = crc32_of(raw)
    if got != want:
        raise TraceError(f"{file}: CRC-32 of its bytes is {got:08x}; expected {want:08x} as trace.json records "
                         "(the shard is corrupt: bits changed on disk or in transit).")
