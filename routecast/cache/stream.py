"""The replay's input, window by window: accesses, Belady's next use and forecast sets of a trace of any size.

Legend as in kernel.py: a window is W = S_w·L accesses of S_w whole steps, N_w required entries; K = L·E.

A trace is replayed in windows of whole steps (Trace.step_chunks, about `rows` rows each): each window's
accesses are built, replayed under every policy (the kernel carries each policy's cache from one window to
the next) and dropped, so memory is bounded by the window, not by the trace. Two things look beyond a window:

- Belady's next use of a key can be any later window. A first pass over the trace records, per window, the
  first access of every key in it (one K-row of float64 per window, written to a file in a temporary
  directory); a backward pass over that file (no trace read) turns each row into the first access of every
  key *after* its window. The replay pass then resolves a key's next use inside its window directly and the
  last one from that row. The trace is read twice; memory holds two K-rows.
- A forecast (PLEC) is one predicted set per step and layer: PackedSets keeps them bit-packed in a file
  (L·E/8 bytes a step), written step by step by the causal harness, read back window by window.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from routecast.cache.kernel import NEVER
from routecast.trace import Trace
from routecast.trace.stats_kernels import add_group_counts

# Rows per window when the accesses are built: a window of small decode steps (16 tokens each) holds
# 1,024 steps x L x E int32 counts, 61 MB at DeepSeek-V3 geometry.
ACCESS_ROWS = 16384


@dataclass(frozen=True)
class AccessWindow:
    """One window's accesses, window-local: step_ids (S_w,) the trace's step numbers; req_off (W+1,),
    req_key (N_w,) int64 keys layer·E + expert, ascending within an access; req_tokens (N_w,) int64 tokens
    routed to the key; num_tokens: the window's tokens."""

    step_ids: np.ndarray
    req_off: np.ndarray
    req_key: np.ndarray
    req_tokens: np.ndarray
    num_tokens: int


def access_windows(trace: Trace, rows: int | None = ACCESS_ROWS, mask: np.ndarray | None = None,
                   ) -> Iterator[AccessWindow]:
    """The trace's accesses window by window, in step order: per (step, layer) the distinct experts and
    their token counts (ExpertFlow eq. 7's union), counted by a compiled kernel.

    rows: rows per window (Trace.step_chunks: whole steps, one shard of a lazy trace mapped at a time).
    mask: bool (T,) rows to keep (e.g. the held-out requests; a step keeps only its masked tokens).
    A window holds (steps in it, L, E) int32 counts, never (T, L, K) index arrays.
    """
    L, E = trace.spec.num_layers, trace.spec.num_experts
    for a, ch in trace.step_chunks(rows):
        if mask is not None:
            m = mask[a:a + ch.num_tokens]
            if not m.any():
                continue
            if not m.all():
                ch = ch.select(m)
        step_ids, sidx = np.unique(np.asarray(ch.tokens["step"]), return_inverse=True)
        c = add_group_counts(np.asarray(ch.experts_TLK), sidx, np.zeros((step_ids.size, L, E), np.int32))
        flat = np.flatnonzero(c)  # increasing: step, then layer, then expert order
        acc = flat // E
        yield AccessWindow(step_ids=step_ids, req_off=np.searchsorted(acc, np.arange(step_ids.size * L + 1)).astype(np.int64),
                           req_key=(acc % L) * E + flat % E, req_tokens=c.ravel()[flat].astype(np.int64),
                           num_tokens=ch.num_tokens)


def _by_key(win: AccessWindow, a0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, keys, global accesses) of the window's entries sorted by key, then access."""
    acc = np.repeat(np.arange(a0, a0 + len(win.req_off) - 1, dtype=np.int64), np.diff(win.req_off))
    order = np.lexsort((acc, win.req_key))
    return order, win.req_key[order], acc[order]


def first_use(win: AccessWindow, a0: int, K: int) -> np.ndarray:
    """(K,) float64: the first global access of each key in the window (NEVER where it is not used)."""
    _, ks, ac = _by_key(win, a0)
    out = np.full(K, NEVER)
    first = np.ones(len(ks), bool)
    first[1:] = ks[1:] != ks[:-1]
    out[ks[first]] = ac[first]
    return out


def next_use(win: AccessWindow, a0: int, after_K: np.ndarray) -> np.ndarray:
    """(N_w,) float64 global index of the next access needing each entry's key: the next one in the window,
    else after_K[key] (the key's first access after the window, NEVER if none)."""
    order, ks, ac = _by_key(win, a0)
    nx = after_K[ks].astype(np.float64)
    same = ks[1:] == ks[:-1]
    nx[:-1][same] = ac[1:][same]
    out = np.empty(len(ks), np.float64)
    out[order] = nx
    return out


class NextUseFile:
    """Belady's next use across windows, in a file of one K-row (float64) per window (see the module
    docstring): add() each window's first_use in order, finish(), then after(w) for each window in order."""

    def __init__(self, path: str | Path, K: int) -> None:
        self.K = K
        self.rows = 0
        self._f = open(path, "w+b")  # noqa: SIM115 - closed by close(), the file lives as long as the replay

    def add(self, first_K: np.ndarray) -> None:
        self._f.write(np.ascontiguousarray(first_K, np.float64).tobytes())
        self.rows += 1

    def finish(self) -> None:
        """Backward pass: row w becomes each key's first access in windows > w."""
        after = np.full(self.K, NEVER)
        for w in range(self.rows - 1, -1, -1):
            first = self._row(w)
            self._f.seek(w * self.K * 8)
            self._f.write(after.tobytes())
            after = np.where(first < NEVER, first, after)
        self._f.flush()

    def after(self, w: int) -> np.ndarray:
        return self._row(w)

    def _row(self, w: int) -> np.ndarray:
        self._f.seek(w * self.K * 8)
        return np.frombuffer(self._f.read(self.K * 8), np.float64).copy()

    def close(self) -> None:
        self._f.close()


class PackedSets:
    """Forecast batch sets bool (S, L, E) bit-packed in a file, one row of ceil(L·E/8) bytes per step:
    ``sets[i] = set_LE`` writes step i, ``sets[a:b]`` reads steps a..b-1 as bool (b-a, L, E). Stands in for
    an in-memory (S, L, E) array where the forecast of a whole trace would not fit."""

    def __init__(self, path: str | Path, S: int, L: int, E: int) -> None:
        self.shape = (S, L, E)
        self._row = (L * E + 7) // 8
        self._f = open(path, "w+b")  # noqa: SIM115 - closed by close()
        self._f.truncate(S * self._row)  # unwritten steps read as empty sets

    def __setitem__(self, i: int, set_LE: np.ndarray) -> None:
        self._f.seek(int(i) * self._row)
        self._f.write(np.packbits(np.asarray(set_LE, bool).ravel()).tobytes())

    def __getitem__(self, sl: slice) -> np.ndarray:
        a, b, _ = sl.indices(self.shape[0])
        b = max(a, b)
        self._f.seek(a * self._row)
        raw = np.frombuffer(self._f.read((b - a) * self._row), np.uint8).reshape(b - a, self._row)
        L, E = self.shape[1:]
        return np.unpackbits(raw, axis=1, count=L * E).astype(bool).reshape(b - a, L, E)

    def close(self) -> None:
        self._f.close()


def forecast_window(pred_sLE: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Predicted sets bool (S_w, L, E) -> window-local (pred_off (W+1,), pred_key (M,)) in access order."""
    S, L, E = pred_sLE.shape
    s_i, l_i, e_i = np.nonzero(pred_sLE)
    a = s_i.astype(np.int64) * L + l_i
    return np.searchsorted(a, np.arange(S * L + 1)).astype(np.int64), l_i.astype(np.int64) * E + e_i
