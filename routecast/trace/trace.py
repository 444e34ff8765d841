"""Trace: the routing of T token-positions through L MoE layers, held as column arrays.

Shapes (legend in spec.py): experts_TLK int16 (-1 = dropped by a capacity limit),
weights_TLK float32, logits_TLE float32 (optional), hidden_TLH float16/float32 (optional, router input).
Per-token columns (all length T): request int64, position int32, token_id int32, phase int8
(PREFILL=0, DECODE=1), step int64 (forward-pass index: same step = one batch), task int16 (index into
task_names, -1 unknown), source int16 (index into source_names, -1 unknown), arrival_s float64,
document int64 (id of the text the request's prompt came from, -1 unknown: requests that share a
document share text, so held-out requests must not share one with training requests; see split).

Invariants, checked by validate() on every construction, TraceWriter.append and read (routecast/trace/checks.py;
routing scans run in chunks, so memory-mapped shards are paged through once). Errors (TraceError, one sentence):
  spec       num_experts <= 32768 (int16 ids); num_layers x num_experts <= 2**24; layer_ids distinct
             non-negative integers (spec.py)
  tokens     request, position, step >= 0; token_id >= -1; document >= -1; phase 0/1; task/source index a
             name or -1; arrival_s finite; within a request each position once, and steps never decrease
             along its positions (a token cannot run before the token it follows)
  routing    ids in -1..E-1; no expert twice in one token's top-k at a layer; weights finite and >= 0
  tensors    logits_TLE and hidden_TLH finite
Documented allowances (accepted as they are):
  rows in any order (consumers group by step and by request: batches(), requests()); -1 (a slot dropped by
  a capacity limit) repeated in a top-k, with any finite non-negative weight; weights that do not sum to 1
  (routers renormalise differently, DeepSeek-V3 scales by routed_scaling_factor); gaps in step, request and
  position numbering; arrival_s of any sign.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from routecast.common.errors import TraceError
from routecast.trace.checks import check_finite, check_ids_and_weights, check_nonneg, check_request_order
from routecast.trace.lazy import ShardedArray
from routecast.trace.spec import MoESpec

PREFILL, DECODE = 0, 1
PHASES = ("prefill", "decode")

# name -> dtype of every per-token column; the order is the on-disk order.
COLUMNS: dict[str, np.dtype] = {
    "request": np.dtype(np.int64),
    "position": np.dtype(np.int32),
    "token_id": np.dtype(np.int32),
    "phase": np.dtype(np.int8),
    "step": np.dtype(np.int64),
    "task": np.dtype(np.int16),
    "source": np.dtype(np.int16),
    "arrival_s": np.dtype(np.float64),
    "document": np.dtype(np.int64),
}
# Rows of routing a streaming pass reads at a time (Trace.chunks / step_chunks default): 64 MB of routing
# ids at DeepSeek-V3 geometry. Tests shrink it to exercise the chunk boundaries.
CHUNK_ROWS = 65536
_DEFAULTS = {"token_id": -1, "phase": PREFILL, "task": -1, "source": -1, "arrival_s": 0.0, "document": -1}
SPLITS = ("document", "request", "task")
# Printed where a document split was asked of a trace that records no documents and the request split is used.
NO_DOCUMENTS_NOTE = ("note: this trace records no source document per request (written before schema 2, or by a "
                     "producer that gave none), so held-out requests may share text with training requests; "
                     "splitting by request instead of by document.")


def make_columns(num_tokens: int, **cols: Any) -> dict[str, np.ndarray]:
    """Per-token column dict with every COLUMNS entry, cast to its dtype; missing ones get defaults.

    `request`, `position` and `step` default to 0, arange(T) and arange(T) only when T allows no doubt
    (a single request processed one token per step); pass them explicitly for real traces.
    """
    out: dict[str, np.ndarray] = {}
    unknown = sorted(set(cols) - set(COLUMNS))
    if unknown:
        raise TraceError(f"unknown token column(s) {unknown}; expected some of {list(COLUMNS)}.")
    for name, dt in COLUMNS.items():
        v = cols.get(name)
        if v is None:
            if name == "request":
                v = np.zeros(num_tokens)
            elif name in ("position", "step"):
                v = np.arange(num_tokens)
            else:
                v = np.full(num_tokens, _DEFAULTS[name])
        a = np.asarray(v)
        if a.shape != (num_tokens,):
            raise TraceError(f"token column '{name}' has shape {a.shape}; expected ({num_tokens},).")
        out[name] = a.astype(dt, copy=False)
    return out


@dataclass(eq=False)
class Trace:
    """Routing of T token-positions through L MoE layers (see the module docstring for shapes)."""

    spec: MoESpec
    tokens: dict[str, np.ndarray]
    experts_TLK: np.ndarray
    weights_TLK: np.ndarray
    logits_TLE: np.ndarray | None = None
    hidden_TLH: np.ndarray | None = None
    task_names: tuple[str, ...] = ()
    source_names: tuple[str, ...] = ()
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.task_names = tuple(self.task_names)
        self.source_names = tuple(self.source_names)
        self.validate()

    # ---------------------------------------------------------------- validation
    def validate(self, where: str = "trace") -> None:
        """Check shapes, dtypes, id ranges and finiteness; raise TraceError naming `where` and the field."""
        s = self.spec
        e = self.experts_TLK
        # A lazy multi-shard array is checked shard by shard when a scan first maps it (lazy.py): here
        # only its shape and dtype, so opening a trace larger than memory reads no routing bytes.
        lazy = isinstance(e, ShardedArray)
        if not isinstance(e, (np.ndarray, ShardedArray)) or e.ndim != 3 or e.shape[1:] != (s.num_layers, s.top_k):
            shape = getattr(e, "shape", None)
            raise TraceError(f"{where}: experts_TLK has shape {shape}; expected (T, {s.num_layers}, {s.top_k}).")
        if e.dtype != np.int16:
            raise TraceError(f"{where}: experts_TLK has dtype {e.dtype}; expected int16.")
        T = e.shape[0]
        if set(self.tokens) != set(COLUMNS):
            raise TraceError(
                f"{where}: token columns are {sorted(self.tokens)}; expected exactly {sorted(COLUMNS)}."
            )
        for name, dt in COLUMNS.items():
            col = self.tokens[name]
            if not isinstance(col, np.ndarray) or col.shape != (T,):
                raise TraceError(f"{where}: token column '{name}' has shape {getattr(col, 'shape', None)}; expected ({T},).")
            if col.dtype != dt:
                raise TraceError(f"{where}: token column '{name}' has dtype {col.dtype}; expected {dt}.")
        w = self.weights_TLK
        if not isinstance(w, (np.ndarray, ShardedArray)) or w.shape != e.shape:
            raise TraceError(f"{where}: weights_TLK has shape {getattr(w, 'shape', None)}; expected {e.shape}.")
        if w.dtype.kind != "f":
            raise TraceError(f"{where}: weights_TLK has dtype {w.dtype}; expected a float dtype.")
        if T:
            tok = self.tokens
            for name in ("request", "position", "step"):
                check_nonneg(tok[name], name, where)
            check_nonneg(tok["token_id"], "token_id", where, lo=-1)
            col = tok["phase"]
            if col.min() < 0 or col.max() > 1:
                bad = int(col.min()) if col.min() < 0 else int(col.max())
                raise TraceError(f"{where}: token column 'phase' holds {bad}; expected 0 (prefill) or 1 (decode).")
            for name, names in (("task", self.task_names), ("source", self.source_names)):
                col = tok[name]
                lo, hi = int(col.min()), int(col.max())
                if lo < -1 or hi >= len(names):
                    raise TraceError(
                        f"{where}: token column '{name}' holds {lo if lo < -1 else hi} but {len(names)} "
                        f"{name} name(s) are defined; expected -1..{len(names) - 1}."
                    )
            if int(tok["document"].min()) < -1:
                raise TraceError(f"{where}: token column 'document' holds {int(tok['document'].min())}; "
                                 "expected -1 (unknown) or a document id >= 0.")
            if not np.isfinite(tok["arrival_s"]).all():
                raise TraceError(f"{where}: token column 'arrival_s' holds NaN or inf; expected finite seconds.")
            check_request_order(tok["request"], tok["position"], tok["step"], where)
            if not lazy:
                check_ids_and_weights(e, w, s.num_experts, where)
        if self.logits_TLE is not None:
            lg = self.logits_TLE
            if lg.shape != (T, s.num_layers, s.num_experts) or lg.dtype.kind != "f":
                raise TraceError(
                    f"{where}: logits_TLE has shape {lg.shape} dtype {lg.dtype}; expected float ({T}, {s.num_layers}, {s.num_experts})."
                )
            if not lazy:
                check_finite(lg, "logits_TLE", where, "finite router logits")
        if self.hidden_TLH is not None:
            h = self.hidden_TLH
            if h.ndim != 3 or h.shape[:2] != (T, s.num_layers) or h.dtype.kind != "f":
                raise TraceError(
                    f"{where}: hidden_TLH has shape {h.shape} dtype {h.dtype}; expected float ({T}, {s.num_layers}, H)."
                )
            if s.hidden_size and h.shape[2] != s.hidden_size:
                raise TraceError(f"{where}: hidden_TLH has H = {h.shape[2]}; expected hidden_size = {s.hidden_size}.")
            if not lazy:
                check_finite(h, "hidden_TLH", where, "finite router inputs")

    # ---------------------------------------------------------------- basics
    @property
    def num_tokens(self) -> int:
        return int(self.experts_TLK.shape[0])

    def __len__(self) -> int:
        return self.num_tokens

    def __getattr__(self, name: str) -> np.ndarray:
        # Token columns read as attributes: trace.request, trace.step, ...
        tokens = self.__dict__.get("tokens")
        if tokens is not None and name in tokens:
            return tokens[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        s = self.spec
        extra = [n for n in ("logits_TLE", "hidden_TLH") if getattr(self, n) is not None]
        return (
            f"Trace({s.name or 'moe'}: T={self.num_tokens}, L={s.num_layers}, E={s.num_experts}, K={s.top_k}, "
            f"requests={len(np.unique(self.tokens['request']))}, steps={len(np.unique(self.tokens['step']))}"
            + (f", +{'+'.join(extra)}" if extra else "")
            + ")"
        )

    # ---------------------------------------------------------------- vectorised views
    def counts_LE(self, mask: np.ndarray | None = None) -> np.ndarray:
        """counts_LE[l, e] = number of (token, k) slots routed to expert e at layer l, over tokens in mask.

        mask: bool (T,) or integer index array; None = all tokens. Dropped slots (-1) are not counted.
        Returns int64 (L, E).
        """
        s = self.spec
        E1 = s.num_experts + 1
        # key = 1 + e + l*(E+1): a dropped slot (-1) lands in a sink column, so no compaction pass; the
        # int16 -> int64 widening happens inside np.add into a reused buffer of `chunk` tokens that stays
        # in cache (measured ~1.5x faster than widening and counting the whole array at once). The rows are
        # read `chunk` at a time (the mask applied per chunk), so a lazy trace is never read whole.
        offs_L1 = np.arange(s.num_layers, dtype=np.int64)[:, None] * E1 + 1
        chunk = max(1, min(1024, CHUNK_ROWS))
        ex = self.experts_TLK
        if mask is None:
            parts = (ex[t0 : t0 + chunk] for t0 in range(0, len(ex), chunk))
        elif np.asarray(mask).dtype == bool:
            m = np.asarray(mask)
            if m.shape != (len(ex),):
                raise IndexError(f"boolean mask of shape {m.shape} for a trace of {len(ex)} tokens")
            parts = (ex[t0 : t0 + chunk][m[t0 : t0 + chunk]] for t0 in range(0, len(ex), chunk))
        else:
            idx = np.asarray(mask)
            parts = (ex[idx[i0 : i0 + chunk]] for i0 in range(0, len(idx), chunk))
        buf = np.empty((chunk, s.num_layers, s.top_k), np.int64)
        flat = np.zeros(s.num_layers * E1 + 1, np.int64)
        for ids in parts:
            b = buf[: len(ids)]
            np.add(ids, offs_L1, out=b)
            flat += np.bincount(b.reshape(-1), minlength=flat.size)
        return flat[1:].reshape(s.num_layers, E1)[:, : s.num_experts].copy()

    def paths_TLE(self, packed: bool = True) -> np.ndarray:
        """Multi-hot routing paths: bool (T, L, E), or packed along E as uint8 (T, L, ceil(E/8)).

        Dropped slots (-1) set no bit. Packed bits follow np.packbits (big-endian within a byte).
        """
        s = self.spec
        T = self.num_tokens
        hot = np.zeros((T, s.num_layers, s.num_experts + 1), dtype=bool)
        ids = self.experts_TLK.astype(np.int64)
        ids[ids < 0] = s.num_experts  # sink column for dropped slots
        t_idx = np.arange(T)[:, None, None]
        l_idx = np.arange(s.num_layers)[None, :, None]
        hot[t_idx, l_idx, ids] = True
        hot = hot[:, :, : s.num_experts]
        return np.packbits(hot, axis=-1) if packed else hot

    def _groups(self, key: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        order = np.argsort(key, kind="stable")
        vals, starts = np.unique(key[order], return_index=True)
        yield from zip(vals.tolist(), np.split(order, starts[1:]), strict=True)

    def batches(self) -> Iterator[tuple[int, np.ndarray]]:
        """Yield (step, token indices) in increasing step order; indices keep trace order within a step."""
        if self.num_tokens:
            yield from self._groups(self.tokens["step"])

    def requests(self) -> Iterator[tuple[int, np.ndarray]]:
        """Yield (request id, token indices) in increasing request-id order, trace order within a request."""
        if self.num_tokens:
            yield from self._groups(self.tokens["request"])

    # ---------------------------------------------------------------- streaming
    @property
    def is_lazy(self) -> bool:
        """True when the routing tensors are lazy multi-shard arrays (a trace read from several shards)."""
        return isinstance(self.experts_TLK, ShardedArray)

    def _rows(self, a: int, b: int) -> Trace:
        """Rows a..b as a Trace of views (no validation: the rows of a valid trace are valid)."""
        t = object.__new__(Trace)
        t.__dict__.update(
            spec=self.spec, tokens={k: v[a:b] for k, v in self.tokens.items()},
            experts_TLK=self.experts_TLK[a:b], weights_TLK=self.weights_TLK[a:b],
            logits_TLE=None if self.logits_TLE is None else self.logits_TLE[a:b],
            hidden_TLH=None if self.hidden_TLH is None else self.hidden_TLH[a:b],
            task_names=self.task_names, source_names=self.source_names, provenance=self.provenance)
        return t

    def chunks(self, rows: int | None = None) -> Iterator[tuple[int, Trace]]:
        """Yield (first row, Trace of at most `rows` consecutive rows) over the trace, in row order.

        rows: default CHUNK_ROWS. Chunks never cross a shard boundary of a lazy trace, so each is a view
        of one memory-mapped shard and memory stays bounded by `rows` (or the shard), not by the trace.
        """
        rows = CHUNK_ROWS if rows is None else rows
        if rows < 1:
            raise TraceError(f"chunks: rows is {rows}; expected a positive number of rows.")
        T = self.num_tokens
        cuts = self.experts_TLK.source.offsets.tolist() if self.is_lazy else [0, T]
        for a0, b0 in zip(cuts[:-1], cuts[1:], strict=True):
            for a in range(a0, b0, rows):
                yield a, self._rows(a, min(b0, a + rows))

    def steps_sorted(self) -> bool:
        """True when step values never decrease in row order (every step is one contiguous row range)."""
        st = self.tokens["step"]
        return bool((st[1:] >= st[:-1]).all())

    def step_chunks(self, rows: int | None = None) -> Iterator[tuple[int, Trace]]:
        """Yield (first row, Trace of whole consecutive steps) covering the trace in row order.

        Each chunk holds about `rows` rows (default CHUNK_ROWS; more when a step is larger) and ends at
        a step boundary; a step cut by a shard boundary is copied into one piece. Needs steps_sorted(); otherwise the trace
        comes as one chunk (its steps regrouped by the caller; a lazy trace is then materialised).
        """
        T = self.num_tokens
        if not self.steps_sorted():
            yield 0, self if not self.is_lazy else self.materialise()
            return
        st = self.tokens["step"]
        held = None  # first row of a step that started in an earlier chunk and is not finished yet
        for a, ch in self.chunks(rows):
            b = a + ch.num_tokens
            del ch  # no view of this shard may outlive the loop body: the next shard is mapped before it is dropped
            if held is not None:
                end = a + int(np.searchsorted(st[a:b], st[a - 1], side="right"))  # where the held step ends
                if end == b and b < T:
                    continue  # the step goes on into the next chunk too
                yield held, self._copy_rows(held, end)
                held, a = None, end
                if a == b:
                    continue
            if b == T:
                yield a, self._rows(a, b)
                return
            cut = a + int(np.searchsorted(st[a:b], st[b], side="left"))  # the step running past b starts here
            if cut > a:
                yield a, self._rows(a, cut)
            held = cut if cut < b else None

    def _copy_rows(self, a: int, b: int) -> Trace:
        """Rows a..b that may span shards, copied into memory (only the rows asked for)."""
        if not self.is_lazy:
            return self._rows(a, b)
        t = self._rows(a, a)
        t.__dict__.update({k: getattr(self, k)[a:b] for k in ("experts_TLK", "weights_TLK", "logits_TLE",
                                                               "hidden_TLH") if getattr(self, k) is not None})
        t.tokens = {k: v[a:b] for k, v in self.tokens.items()}
        return t

    def materialise(self) -> Trace:
        """This trace with every routing tensor in memory (a copy of a lazy trace; self if already in memory)."""
        if not self.is_lazy:
            return self
        t = self._rows(0, self.num_tokens)
        for k in ("experts_TLK", "weights_TLK", "logits_TLE", "hidden_TLH"):
            a = getattr(self, k)
            if a is not None:
                setattr(t, k, a.materialise())
        return t

    def select(self, mask: np.ndarray | Sequence[int]) -> Trace:
        """A new Trace holding only the tokens in mask (bool (T,) or integer indices), in that order."""
        m = np.asarray(mask)
        if m.dtype == bool and m.shape != (self.num_tokens,):
            raise TraceError(f"select: mask has shape {m.shape}; expected ({self.num_tokens},).")
        if m.dtype != bool and m.size and (m.dtype.kind not in "iu" or m.min() < -self.num_tokens or m.max() >= self.num_tokens):
            raise TraceError(f"select: index out of range for a trace of {self.num_tokens} tokens.")
        return Trace(
            spec=self.spec,
            tokens={k: v[m] for k, v in self.tokens.items()},
            experts_TLK=self.experts_TLK[m],
            weights_TLK=self.weights_TLK[m],
            logits_TLE=None if self.logits_TLE is None else self.logits_TLE[m],
            hidden_TLH=None if self.hidden_TLH is None else self.hidden_TLH[m],
            task_names=self.task_names,
            source_names=self.source_names,
            provenance=dict(self.provenance),
        )

    @property
    def has_documents(self) -> bool:
        """True when every token records its source document (document >= 0), so split(by="document") works."""
        return bool(self.num_tokens) and int(self.tokens["document"].min()) >= 0

    def split(
        self, by: str = "document", fractions: Sequence[float] = (0.8, 0.2), seed: int = 0
    ) -> tuple[Trace, ...]:
        """Split into len(fractions) traces by whole documents, requests or tasks, shuffled with seed.

        by="document": each source document goes wholly to one part, and with it every request whose prompt
        came from it (held-out text: no part shares a document with another); needs every token's document
        (has_documents) and one document per request, else TraceError;
        by="request": each request goes wholly to one part (held-out requests, same tasks; requests cut from
        one document land on both sides);
        by="task": each task goes wholly to one part (held-out tasks, for shift experiments).
        Parts get round(fraction * groups) groups (the last part takes the rest); order inside a part
        follows the trace. Each part is copied into memory: split_masks gives the same parts as row masks.
        """
        return tuple(self.select(m) for m in self.split_masks(by, fractions, seed))

    def split_masks(
        self, by: str = "document", fractions: Sequence[float] = (0.8, 0.2), seed: int = 0
    ) -> tuple[np.ndarray, ...]:
        """The parts of split() as bool (T,) row masks (reads only the token columns, copies no routing)."""
        if by not in SPLITS:
            raise TraceError(f"split: by is {by!r}; expected one of {', '.join(repr(x) for x in SPLITS)}.")
        fr = np.asarray(fractions, dtype=float)
        if fr.ndim != 1 or fr.size < 1 or (fr < 0).any() or not np.isclose(fr.sum(), 1.0):
            raise TraceError(f"split: fractions are {list(fractions)}; expected non-negative numbers summing to 1.")
        key = self.tokens[by]
        if by == "document":
            self.check_documents()
        groups = np.unique(key)
        perm = np.random.default_rng(seed).permutation(groups)
        bounds = np.round(np.cumsum(fr) * len(groups)).astype(int)
        bounds[-1] = len(groups)
        parts = np.split(perm, bounds[:-1])
        return tuple(np.isin(key, p) for p in parts)

    def shift_by_task(self, first: Sequence[str]) -> tuple[Trace, int]:
        """Traffic from the tasks in `first`, then from the others: -> (reordered trace, first step of the others).

        Each part keeps its own steps and batches (a step holds only its part's tokens); the second part's
        steps and request ids are moved after the first's, so step order and request-id order both put
        the `first` tasks before the rest. The returned index counts distinct steps (as step_loads does).
        """
        unknown = [t for t in first if t not in self.task_names]
        if unknown or not first:
            raise TraceError(f"shift_by_task: tasks {unknown or list(first)} are not in the trace; "
                             f"expected some of {list(self.task_names)}.")
        ids = [self.task_names.index(t) for t in first]
        in_first = np.isin(self.tokens["task"], ids)
        if in_first.all() or not in_first.any():
            raise TraceError(f"shift_by_task: tasks {list(first)} hold {'all' if in_first.any() else 'none'} of "
                             "the tokens; expected a shift between two non-empty parts.")
        a, b = self.select(in_first), self.select(~in_first)
        b.tokens["step"] = b.tokens["step"] + (a.tokens["step"].max() + 1 - b.tokens["step"].min())
        b.tokens["request"] = b.tokens["request"] + (a.tokens["request"].max() + 1 - b.tokens["request"].min())
        return Trace.concat([a, b]), int(np.unique(a.tokens["step"]).size)

    def check_documents(self) -> None:
        """Raise TraceError unless every request records exactly one source document (a document split's needs)."""
        doc, req = self.tokens["document"], self.tokens["request"]
        unknown = np.unique(req[doc < 0])
        if unknown.size:
            raise TraceError(
                f"split: {unknown.size} of {np.unique(req).size} requests record no source document (document "
                "-1: a trace written before schema 2, or a producer that did not give one); expected every "
                "request's document for a document split (use by='request', or --split request)."
            )
        # One document per request: a request spread over two documents would be cut in two by the split.
        order = np.lexsort((doc, req))
        r, d = req[order], doc[order]
        bad = (r[1:] == r[:-1]) & (d[1:] != d[:-1])
        if bad.any():
            raise TraceError(f"split: request {int(r[1:][bad][0])} records several documents; expected one "
                             "document per request.")

    def heldout_split(self, by: str = "document", fractions: Sequence[float] = (0.8, 0.2), seed: int = 0,
                      ) -> tuple[tuple[Trace, ...], str, str | None]:
        """split(by, fractions, seed) where a predictor is fitted and scored -> (parts, split used, note).

        by="document" on a trace that records no documents (has_documents False) falls back to the split by
        request; note then says so in one sentence (callers print it), else note is None.
        """
        masks, used, note = self.heldout_masks(by, fractions, seed)
        return tuple(self.select(m) for m in masks), used, note

    def heldout_masks(self, by: str = "document", fractions: Sequence[float] = (0.8, 0.2), seed: int = 0,
                      ) -> tuple[tuple[np.ndarray, ...], str, str | None]:
        """heldout_split as bool (T,) row masks: what streaming fits and scores use (no routing copied)."""
        if by == "document" and not self.has_documents:
            return self.split_masks("request", fractions, seed), "request", NO_DOCUMENTS_NOTE
        return self.split_masks(by, fractions, seed), by, None

    @classmethod
    def concat(cls, traces: Sequence[Trace]) -> Trace:
        """Concatenate traces of one spec and one set of task/source names (optional tensors kept if all have them)."""
        if not traces:
            raise TraceError("concat: no traces given; expected at least one.")
        first = traces[0]
        for i, t in enumerate(traces[1:], 1):
            if t.spec != first.spec or t.task_names != first.task_names or t.source_names != first.source_names:
                raise TraceError(f"concat: trace {i} has a different spec or task/source names than trace 0.")

        def cat(name: str) -> np.ndarray | None:
            arrs = [getattr(t, name) for t in traces]
            return None if any(a is None for a in arrs) else np.concatenate(arrs)

        return cls(
            spec=first.spec,
            tokens={k: np.concatenate([t.tokens[k] for t in traces]) for k in COLUMNS},
            experts_TLK=np.concatenate([t.experts_TLK for t in traces]),
            weights_TLK=np.concatenate([t.weights_TLK for t in traces]),
            logits_TLE=cat("logits_TLE"),
            hidden_TLH=cat("hidden_TLH"),
            task_names=first.task_names,
            source_names=first.source_names,
            provenance=dict(first.provenance),
        )
