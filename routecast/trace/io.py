"""On-disk Trace format: a directory of trace.json, tokens.parquet and safetensors routing shards.

Layout (schema_version 2; version 1, without the per-token 'document' column, is still read: its
documents read as -1, unknown):
  trace.json                    spec, provenance, task/source names, num_tokens, tensor layout, shard list
  tokens.parquet                every row's COLUMNS (exact dtypes, page checksums), in row order
  routing-00000.safetensors...  a contiguous row range: experts_TLK int16, weights_TLK float32, optional
                                logits_TLE float32 and hidden_TLH float16/float32, plus the range's token
                                columns ("token.<name>") and the spec in the header metadata, so a shard
                                is self-describing and durable on its own (resume needs nothing else)
  _writer.json                  present only while a TraceWriter writes: the resume record

Reading memory-maps shards with our own header parser and np.memmap views: measured, safetensors'
safe_open(framework="numpy").get_tensor copies (RSS grew by 98 MB for a 49 MB tensor). A single shard
is zero-copy (read-only views whose base is the memmap); several shards become lazy ShardedArrays (lazy.py)
that map one shard at a time and are never concatenated. Only read_trace(mmap=False) concatenates them (one
writable copy per tensor).
Durability: every file is written to a temp file beside it, fsynced, renamed, and its directory
fsynced; trace.json is written last and is the commit point of a finished trace.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from routecast.common.errors import ConfigError, TraceError
from routecast.trace.lazy import ShardedArray, ShardSource, check_crc, crc32_of
from routecast.trace.shards import (
    _HIDDEN_DTYPES,
    _ROUTING,
    _SHARD_RE,
    _TMP_RE,
    _TOK,
    ADDED_IN_V2,
    LOCK_FILE,
    READ_VERSIONS,
    SCHEMA_VERSION,
    TOKENS_PARQUET,
    TRACE_JSON,
    WRITER_JSON,
    _atomic_write,
    _dumps,
    _fsync,
    _lay,
    _load_shard,
    _nonneg,
    _oserr,
    _replace_dir,
    _shard_files,
    _shard_name,
    _short,
    _strs,
    _write_shard,
)
from routecast.trace.spec import MoESpec
from routecast.trace.trace import COLUMNS, Trace, make_columns


def _load_json(file: Path) -> dict:
    try:
        obj = json.loads(file.read_bytes())
    except OSError as e:
        raise _oserr(file, e, "a readable JSON file") from None
    except (ValueError, RecursionError) as e:
        raise TraceError(f"{file}: is not valid JSON ({str(e)[:80]}); expected a JSON object.") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{file}: holds a JSON {type(obj).__name__}; expected a JSON object.")
    return obj


def _unfinished(f: Path) -> str:
    return (f"{f}: file is missing because the trace was never finished (its writer was interrupted); "
            "expected a finished trace (rerun the same `routecast capture` to resume it, or the same `synth` / "
            "`import` with --overwrite to redo it; in Python: TraceWriter(..., resume=True) and close()).")


def is_trace_file(name: str) -> bool:
    """True for the names a TraceWriter creates in a trace directory (shards, metadata, temp files, lock)."""
    return (name in (TRACE_JSON, TOKENS_PARQUET, WRITER_JSON, LOCK_FILE) or bool(_SHARD_RE.fullmatch(name))
            or bool(_TMP_RE.fullmatch(name)))


def check_trace_out(path: str | os.PathLike, *, overwrite: bool = False, resume: bool = False,
                    flag: str = "--out") -> Path:
    """Refuse a trace output the writer would refuse, before any work: a regular file, an unwritable
    place, a non-empty directory without overwrite (or resume of a trace), and with overwrite a directory
    holding files a TraceWriter did not write (replacing it would delete them). -> Path.
    """
    from routecast.common.outputs import check_out_dir, claim

    p = claim(path, flag, "dir")  # inputs, links, duplicates: before the resume shortcuts below
    partial = p.with_name(f".{p.name}.partial")
    if resume and partial.is_dir():
        return p  # an interrupted overwrite: the writer continues it
    busy = p.is_dir() and any(p.iterdir())
    if busy and resume and all(is_trace_file(q.name) for q in p.iterdir()):
        return p
    if busy and not overwrite and (p / WRITER_JSON).is_file() and not (p / TRACE_JSON).is_file():
        raise TraceError(f"{flag} {p} holds an unfinished trace (its writer was interrupted); expected a new or "
                         "empty directory (rerun with --overwrite to redo it, or `routecast capture` without "
                         "--no-resume to continue a capture).")
    return check_out_dir(p, flag, overwrite=overwrite, owned=is_trace_file, replaces_dir=True)


def _hidden_ok(h: Any) -> bool:
    return h is None or (isinstance(h, dict) and h.get("dtype") in _HIDDEN_DTYPES
                         and type(h.get("dim")) is int and h["dim"] >= 1)


_META_FIELDS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("schema_version", lambda v: type(v) is int and v in READ_VERSIONS,
     f"one of {list(READ_VERSIONS)} (the versions this routecast reads)"),
    ("spec", lambda v: isinstance(v, dict), "a JSON object"),
    ("num_tokens", _nonneg, "a non-negative integer"),
    ("task_names", _strs, "a list of strings"),
    ("source_names", _strs, "a list of strings"),
    ("provenance", lambda v: isinstance(v, dict), "a JSON object"),
    ("tensors", lambda v: isinstance(v, dict) and isinstance(v.get("logits_TLE"), bool)
     and _hidden_ok(v.get("hidden_TLH", 0)), "{'logits_TLE': bool, 'hidden_TLH': null or {dtype, dim}}"),
    ("shards", lambda v: isinstance(v, list) and all(
        isinstance(s, dict) and s.get("file") == _shard_name(i) and _nonneg(s.get("rows"))
        and _nonneg(s.get("bytes")) and (s.get("crc32") is None or (_nonneg(s["crc32"]) and s["crc32"] < 1 << 32))
        for i, s in enumerate(v)),
     "a list of {file: routing-NNNNN.safetensors numbered from 0, rows, bytes, crc32 (optional)}"),
)


def _read_meta(d: Path) -> tuple[dict, MoESpec]:
    """Load and check trace.json of trace directory d -> (meta dict, spec)."""
    f = d / TRACE_JSON
    if not f.is_file():
        if (d / WRITER_JSON).exists() or any(_SHARD_RE.fullmatch(p.name) for p in d.iterdir()):
            raise TraceError(_unfinished(f))
        raise TraceError(f"{f}: file is missing; expected the trace's metadata file.")
    m = _load_json(f)
    for key, ok, expected in _META_FIELDS:
        if key not in m:
            raise TraceError(f"{f}: field '{key}' is missing; expected {expected}.")
        if not ok(m[key]):
            raise TraceError(f"{f}: field '{key}' is {_short(m[key])}; expected {expected}.")
    spec = MoESpec.from_dict(m["spec"], where=f"{f} field 'spec'")
    rows = sum(s["rows"] for s in m["shards"])
    if rows != m["num_tokens"]:
        raise TraceError(f"{f}: field 'shards' holds {rows} rows; expected num_tokens = {m['num_tokens']}.")
    return m, spec


def _write_tokens(file: Path, chunks: Iterable[dict[str, np.ndarray]]) -> None:
    """tokens.parquet from column chunks, one row group each, so memory stays at one chunk."""
    schema = pa.schema([(c, pa.from_numpy_dtype(dt)) for c, dt in COLUMNS.items()])

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema, compression="zstd", write_page_checksum=True) as pw:
            for cols in chunks:
                pw.write_table(pa.table({c: pa.array(cols[c]) for c in COLUMNS}, schema=schema))

    _atomic_write(file, write)


def _read_tokens(file: Path, T: int, version: int = SCHEMA_VERSION) -> dict[str, np.ndarray]:
    if not file.is_file():
        raise TraceError(f"{file}: file is missing; expected the trace's token columns.")
    try:
        table = pq.read_table(file, page_checksum_verification=True)
    except Exception as e:  # pyarrow raises many types on damaged input; each means "not our Parquet"
        msg = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
        msg = f"{file}: cannot be parsed as Parquet ({msg}); expected the trace's token columns."
        raise TraceError(msg) from None
    # A schema-1 file predates the 'document' column: it reads as -1 (unknown document).
    absent = [c for c in ADDED_IN_V2 if c not in table.column_names] if version == 1 else []
    if sorted(table.column_names) != sorted(c for c in COLUMNS if c not in absent):
        raise TraceError(f"{file}: columns are {table.column_names}; expected exactly {list(COLUMNS)}.")
    out = {c: np.full(table.num_rows, -1, COLUMNS[c]) for c in absent}
    for c, dt in COLUMNS.items():
        if c in absent:
            continue
        col = table.column(c)
        try:
            have = np.dtype(col.type.to_pandas_dtype())
        except (NotImplementedError, TypeError):  # an Arrow type with no numpy dtype (struct, dictionary)
            have = col.type  # never equal to a numpy dtype: refused below under its Arrow name
        if have != dt:
            raise TraceError(f"{file}: token column '{c}' has dtype {have}; expected {dt}.")
        if col.null_count:
            raise TraceError(f"{file}: token column '{c}' holds {col.null_count} nulls; expected none.")
        out[c] = col.to_numpy()
    if table.num_rows != T:
        raise TraceError(f"{file}: token columns have {table.num_rows} rows; expected num_tokens = {T} "
                         "from trace.json.")
    return out


# ---------------------------------------------------------------- reading
def _trace_dir(path: str | os.PathLike) -> Path:
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise TraceError(f"{d}: is a file, not a trace directory; expected a directory written by write_trace.")
    if not d.is_dir():
        old = d.with_name(f".{d.name}.old")
        hint = f" (an interrupted overwrite left the previous trace in {old})" if old.is_dir() else ""
        raise TraceError(f"{d}: trace directory does not exist{hint}; expected a directory written by "
                         "write_trace.")
    return d


def _validate_parts(d: Path, m: dict, spec: MoESpec, tokens: dict, parts: list[dict]) -> None:
    """Re-run Trace.validate per file so the error names the file at fault (only after a failure)."""
    T = m["num_tokens"]
    tiny = MoESpec(num_layers=1, num_experts=1, top_k=1)  # the token checks do not depend on the routing
    Trace.validate(SimpleNamespace(spec=tiny, tokens=tokens, experts_TLK=np.zeros((T, 1, 1), np.int16),
                                   weights_TLK=np.zeros((T, 1, 1), np.float32), logits_TLE=None,
                                   hidden_TLH=None, task_names=tuple(m["task_names"]),
                                   source_names=tuple(m["source_names"])), where=str(d / TOKENS_PARQUET))
    for s, p in zip(m["shards"], parts, strict=False):  # parts: [] checks the token columns only
        Trace.validate(SimpleNamespace(spec=spec, tokens=make_columns(s["rows"]), task_names=(),
                                       source_names=(), **{k: p.get(k) for k in _ROUTING}),
                       where=str(d / s["file"]))


def _routing_tails(spec: MoESpec, lay: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape after the row axis, dtype) of every routing tensor the layout holds."""
    L, K, E, hid = spec.num_layers, spec.top_k, spec.num_experts, lay["hidden_TLH"]
    out = {"experts_TLK": ((L, K), "int16"), "weights_TLK": ((L, K), "float32")}
    if lay["logits_TLE"]:
        out["logits_TLE"] = ((L, E), "float32")
    if hid:
        out["hidden_TLH"] = ((L, hid["dim"]), hid["dtype"])
    return out


def read_trace(path: str | os.PathLike, *, mmap: bool = True, load_hidden: bool = True,
               load_logits: bool = True, verify: bool = True) -> Trace:
    """Read and validate a trace directory.

    mmap=True: routing tensors are read-only memory-mapped views. A single-shard trace gives numpy views
    of its shard; a multi-shard trace gives lazy ShardedArrays (lazy.py) that map one shard at a time and
    are never concatenated, so a trace larger than memory can be scanned (Trace.chunks / step_chunks).
    mmap=False reads every shard into writable memory (one array per tensor).
    verify=True checks each shard's CRC-32 against trace.json (when recorded) as it is first read: one
    extra pass over the bytes at ~1 GB/s (benchmarks/stats_throughput.py states the cost). The value
    checks (id ranges, distinct top-k, finite weights, logits and hidden) always run on every shard read,
    whether or not its CRC matches (benchmarks/trace_checks.py states their cost). load_hidden / load_logits=False leave hidden_TLH /
    logits_TLE None (their bytes are never read). Every defect raises a TraceError naming the file and field.
    """
    d = _trace_dir(path)
    m, spec = _read_meta(d)
    tokens = _read_tokens(d / TOKENS_PARQUET, m["num_tokens"], m["schema_version"])
    lay = m["tensors"]
    want = {"experts_TLK", "weights_TLK"}
    want |= {"logits_TLE"} if load_logits and lay["logits_TLE"] else set()
    want |= {"hidden_TLH"} if load_hidden and lay["hidden_TLH"] else set()
    shards = m["shards"]
    stray = sorted({p.name for p in d.iterdir() if _SHARD_RE.fullmatch(p.name)} - {s["file"] for s in shards})
    if stray:  # a copied or leftover shard would be silently ignored: the user meant something else
        raise TraceError(f"{d / stray[0]}: routing shard not listed in {TRACE_JSON}; expected only the "
                         f"{len(shards)} shard(s) it lists (move the extra file out of the trace directory).")
    names = dict(task_names=tuple(m["task_names"]), source_names=tuple(m["source_names"]))

    def load(i: int) -> tuple[dict, np.ndarray]:
        s = shards[i]
        arrays, info = _load_shard(d / s["file"], spec, rows=s["rows"], nbytes=s["bytes"], layout=lay,
                                   mmap=mmap, want=want)
        return arrays, info["raw"]

    def check(i: int, arrays: dict, raw: np.ndarray) -> None:
        f = d / shards[i]["file"]
        want = shards[i].get("crc32") if verify else None
        # The value checks run whatever the checksum says: a CRC that matches proves the bytes are the ones
        # trace.json describes, not that they are valid (trace.json can be edited along with a shard).
        # They run first: an id out of range says more than a checksum mismatch.
        Trace.validate(SimpleNamespace(spec=spec, tokens=make_columns(shards[i]["rows"]), task_names=(),
                                       source_names=(), **{k: arrays.get(k) for k in _ROUTING}), where=str(f))
        check_crc(f, raw, want)

    if len(shards) > 1 and mmap:
        src = ShardSource([d / s["file"] for s in shards], [s["rows"] for s in shards], load, check)
        for i in range(len(shards)):  # headers only: shapes, dtypes, sizes, layout, before any scan
            _read_shard_header(d / shards[i]["file"], spec, shards[i], lay)
        arrays = {k: ShardedArray(src, k, tail, np.dtype(dt))
                  for k, (tail, dt) in _routing_tails(spec, lay).items() if k in want}
        try:
            return Trace(spec=spec, tokens=tokens, **arrays, **names, provenance=m["provenance"])
        except TraceError as e:
            _validate_parts(d, m, spec, tokens, [])
            raise TraceError(f"{d}: {e}") from None
    parts = [load(i) for i in range(len(shards))]
    L, K, E, hid = spec.num_layers, spec.top_k, spec.num_experts, lay["hidden_TLH"]
    empty = {"experts_TLK": np.zeros((0, L, K), np.int16), "weights_TLK": np.zeros((0, L, K), np.float32),
             "logits_TLE": np.zeros((0, L, E), np.float32),
             "hidden_TLH": np.zeros((0, L, hid["dim"]), hid["dtype"]) if hid else None}
    arrays = {k: (parts[0][0][k] if len(parts) == 1 else np.concatenate([p[k] for p, _ in parts]))
              if parts else empty[k] for k in want}
    try:
        trace = Trace(spec=spec, tokens=tokens, **arrays, **names, provenance=m["provenance"])
    except TraceError as e:
        _validate_parts(d, m, spec, tokens, [p for p, _ in parts])
        raise TraceError(f"{d}: {e}") from None
    for i, (_, raw) in enumerate(parts):
        check_crc(d / shards[i]["file"], raw, shards[i].get("crc32") if verify else None)
    return trace


def _read_shard_header(f: Path, spec: MoESpec, s: dict, lay: dict) -> None:
    """Check one shard's header against trace.json (shapes, dtypes, rows, bytes, layout); maps nothing."""
    _load_shard(f, spec, rows=s["rows"], nbytes=s["bytes"], layout=lay, mmap=True, want=set())


def verify_trace(trace: Trace) -> int:
    """Visit every shard of a lazy trace (CRC-32 and value checks on first visit); -> shards checked.

    A trace in memory was checked when it was read; it counts as one.
    """
    if not trace.is_lazy:
        return 1
    src = trace.experts_TLK.source
    for i in range(src.num_shards):
        src.shard(i)
    src.release()
    return src.num_shards


def read_shard(path: str | os.PathLike, *, mmap: bool = True) -> Trace:
    """Read one routing shard alone (spec and names from its header, token columns from the shard).

    Works on unfinished traces: every committed shard of an interrupted TraceWriter reads back this way.
    """
    f = Path(path)
    arrays, info = _load_shard(f, None, mmap=mmap)
    fields = dict(spec=info["spec"], tokens={c: arrays[_TOK + c] for c in COLUMNS},
                  task_names=info["task_names"], source_names=info["source_names"],
                  **{k: arrays.get(k) for k in _ROUTING})
    Trace.validate(SimpleNamespace(**fields), where=str(f))
    return Trace(**fields, provenance={"shard": f.name})


# ---------------------------------------------------------------- writing
class TraceWriter:
    """Write a Trace shard by shard, durably, so that an interrupted capture resumes where it stopped.

    append() buffers rows and commits them as one shard once >= shard_tokens rows are buffered (an
    append's rows never span two shards); flush() commits now; close() writes tokens.parquet, then
    trace.json. resume=True continues an unfinished (or finished) trace at path: committed shards are
    validated and kept, temp leftovers dropped, numbering continues; committed_requests() says which
    requests to skip. A request is whole on disk only if flush() ran after its last row, so flush at
    request boundaries. overwrite=True replaces a non-empty path only once the new trace is complete:
    it is written to the sibling .<name>.partial and swapped in by close(). As a context manager:
    close() on normal exit; on an exception the committed shards stay for resume=True.
    """

    def __init__(self, path: str | os.PathLike, spec: MoESpec, *, task_names: tuple[str, ...] = (),
                 source_names: tuple[str, ...] = (), provenance: dict[str, Any] | None = None,
                 shard_tokens: int = 65536, resume: bool = False, overwrite: bool = False) -> None:
        if not isinstance(spec, MoESpec):
            raise TraceError(f"TraceWriter: spec is {type(spec).__name__}; expected a MoESpec.")
        if type(shard_tokens) is not int or shard_tokens < 1:
            raise ConfigError(f"TraceWriter: shard_tokens is {shard_tokens!r}; expected a positive integer.")
        for what, names in (("task_names", task_names), ("source_names", source_names)):
            if isinstance(names, str) or not all(isinstance(x, str) for x in names):
                raise TraceError(f"TraceWriter: {what} is {_short(names)}; expected a sequence of strings.")
        self.path, self.spec, self.shard_tokens = Path(path), spec, shard_tokens
        self.task_names, self.source_names = tuple(task_names), tuple(source_names)
        self.provenance = None if provenance is None else dict(provenance)
        _dumps(self.provenance, "TraceWriter: provenance")
        self._buf: list[dict[str, np.ndarray]] = []
        self._buf_rows = 0
        self._shards: list[dict[str, Any]] = []
        self._requests: list[np.ndarray] = []
        self._layout: dict[str, Any] | None = None
        self._closed = False
        self._work = self._choose_dir(resume, overwrite)
        self._fresh = not self._work.is_dir() or not any(self._work.iterdir())
        self._work.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = os.open(self._work / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise TraceError(f"{self._work}: another TraceWriter is writing this trace; expected one "
                                 "writer at a time.") from None
            if resume:
                self._resume()
            self._resumed = len(self._shards)
            self.provenance = self.provenance if self.provenance is not None else {}
            if not (self._work / WRITER_JSON).is_file():
                _atomic_write(self._work / WRITER_JSON, _dumps(self._record(), "TraceWriter: provenance"))
        except BaseException:
            self._release()  # a refused writer must not keep the directory locked
            raise

    def _choose_dir(self, resume: bool, overwrite: bool) -> Path:
        p = self.path
        partial = p.with_name(f".{p.name}.partial")
        if p.exists() and not p.is_dir():
            raise TraceError(f"{p}: exists and is not a directory; expected a trace directory path.")
        if resume and partial.is_dir():
            return partial  # an overwrite that was interrupted: continue it
        busy = p.is_dir() and any(p.iterdir())
        is_trace = busy and ((p / TRACE_JSON).exists() or (p / WRITER_JSON).exists()
                             or any(_SHARD_RE.fullmatch(q.name) for q in p.iterdir()))
        if not busy or (resume and is_trace):
            return p
        if not overwrite:
            raise TraceError(f"{p}: directory exists and is not empty; expected a new or empty path (pass "
                             "--overwrite (overwrite=True in Python) to replace it once the new trace is "
                             "complete).")
        foreign = sorted(q.name for q in p.iterdir() if not is_trace_file(q.name))
        if foreign:  # the swap at close() would delete them
            raise TraceError(f"{p}: holds {foreign[0]!r}, which is not part of a routecast trace; expected a "
                             "trace directory to overwrite (move the file away: --overwrite never deletes "
                             "files routecast did not write).")
        if partial.is_dir() and any(not is_trace_file(q.name) for q in partial.iterdir()):
            raise TraceError(f"{partial} holds files that are not part of a routecast trace; expected it to be a "
                             "trace writer's own unfinished work (move it away: routecast never deletes it).")
        shutil.rmtree(partial, ignore_errors=True)
        return partial

    def _record(self) -> dict[str, Any]:
        return {"format": "routecast-trace-writer", "schema_version": SCHEMA_VERSION,
                "target": str(self.path), "spec": self.spec.to_dict(), "task_names": list(self.task_names),
                "source_names": list(self.source_names), "provenance": self.provenance}

    def _resume(self) -> None:
        w = self._work
        for p in w.iterdir():
            if _TMP_RE.fullmatch(p.name) and p.is_file():
                p.unlink()  # a file whose write was cut off before its rename
        rec = next((w / n for n in (WRITER_JSON, TRACE_JSON) if (w / n).is_file()), None)
        mine = (self.spec, self.task_names, self.source_names)
        if rec is not None:
            r = _load_json(rec)
            have = (MoESpec.from_dict(r.get("spec"), where=f"{rec} field 'spec'"),
                    tuple(r.get("task_names") or ()), tuple(r.get("source_names") or ()))
            for key, h, m in zip(("spec", "task_names", "source_names"), have, mine, strict=True):
                if h != m:
                    raise TraceError(f"{rec}: field '{key}' is {_short(h)}; expected {_short(m)} as passed "
                                     "to TraceWriter (resume needs the same model and names).")
            if self.provenance is None and isinstance(r.get("provenance"), dict):
                self.provenance = r["provenance"]
        for f in _shard_files(w):
            arrays, info = _load_shard(f, None)
            if (info["spec"], info["task_names"], info["source_names"]) != mine:
                raise TraceError(f"{f}: metadata 'spec' or names differ from those passed to TraceWriter; "
                                 "expected the same model and names to resume.")
            tokens = {c: arrays[_TOK + c] for c in COLUMNS}
            Trace.validate(SimpleNamespace(spec=self.spec, tokens=tokens, task_names=self.task_names,
                                           source_names=self.source_names,
                                           **{k: arrays.get(k) for k in _ROUTING}), where=str(f))
            self._check_layout(info["layout"], str(f))
            self._shards.append({"file": f.name, "rows": info["rows"], "bytes": info["bytes"],
                                 "crc32": crc32_of(info["raw"])})
            self._requests.append(np.unique(tokens["request"]))

    def _check_layout(self, lay: dict[str, Any], where: str) -> None:
        self._layout = self._layout or lay
        for key in ("logits_TLE", "hidden_TLH"):
            if lay[key] != self._layout[key]:
                raise TraceError(f"{where}: tensor '{key}' is {_lay(lay[key])}; expected "
                                 f"{_lay(self._layout[key])} like the rows before (one layout per trace).")

    @property
    def num_tokens(self) -> int:
        """Rows committed (including those found on resume) plus rows buffered."""
        return sum(s["rows"] for s in self._shards) + self._buf_rows

    def committed_requests(self) -> np.ndarray:
        """Sorted unique request ids (int64) with rows in committed shards."""
        return np.unique(np.concatenate(self._requests)) if self._requests else np.zeros(0, np.int64)

    def append(self, tokens: dict[str, np.ndarray], experts_TLK: np.ndarray, weights_TLK: np.ndarray,
               logits_TLE: np.ndarray | None = None, hidden_TLH: np.ndarray | None = None, *,
               copy: bool = True) -> None:
        """Buffer n rows: experts_TLK (n, L, K) ints, weights_TLK (n, L, K), logits_TLE (n, L, E) and
        hidden_TLH (n, L, H) floats; tokens: any subset of COLUMNS, each (n,) (make_columns fills the rest).

        Copies its inputs (the caller may reuse buffers) unless copy=False (the caller hands the arrays
        over and does not change them); stores int16 / float32 / float32 / float16 or float32. Commits a
        shard once >= shard_tokens rows are buffered.
        """
        where, E = "TraceWriter.append", self.spec.num_experts
        if self._closed:
            raise TraceError(f"{where}: the writer of {self.path} is closed; expected append before close().")
        e = np.asarray(experts_TLK)
        if e.ndim != 3 or not isinstance(tokens, dict):
            raise TraceError(f"{where}: experts_TLK has shape {e.shape} and tokens is a "
                             f"{type(tokens).__name__}; expected (n, {self.spec.num_layers}, "
                             f"{self.spec.top_k}) and a dict of columns.")
        if e.dtype != np.int16:  # check before the cast so that a large id cannot wrap into range
            bad = e.dtype if e.dtype.kind not in "iu" else e.min() if e.size and e.min() < -1 else \
                e.max() if e.size and e.max() >= E else None
            if bad is not None:
                raise TraceError(f"{where}: experts_TLK holds {bad}; expected integer ids -1..{E - 1}.")
            e = e.astype(np.int16)

        def as_float(a: Any, keep: tuple[str, ...] = ("float32",)) -> np.ndarray | None:
            a = None if a is None else np.asarray(a)
            return a if a is None or a.dtype.kind != "f" or str(a.dtype) in keep else a.astype(np.float32)

        fields = dict(spec=self.spec, tokens=make_columns(e.shape[0], **tokens), experts_TLK=e,
                      weights_TLK=as_float(weights_TLK), logits_TLE=as_float(logits_TLE),
                      hidden_TLH=as_float(hidden_TLH, _HIDDEN_DTYPES), task_names=self.task_names,
                      source_names=self.source_names)
        Trace.validate(SimpleNamespace(**fields), where=where)
        h = fields["hidden_TLH"]
        hid = None if h is None else {"dtype": str(h.dtype), "dim": h.shape[2]}
        self._check_layout({"logits_TLE": logits_TLE is not None, "hidden_TLH": hid}, where)
        if e.shape[0]:
            row = {_TOK + c: np.array(v, copy=copy) for c, v in fields["tokens"].items()}
            row.update({k: np.array(fields[k], copy=copy) for k in _ROUTING if fields[k] is not None})
            self._buf.append(row)
            self._buf_rows += e.shape[0]
        if self._buf_rows >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        """Commit the buffered rows as one shard now (temp file, fsync, rename, fsync the directory)."""
        if not self._buf:
            return
        arrays = (self._buf[0] if len(self._buf) == 1 else
                  {k: np.concatenate([b[k] for b in self._buf]) for k in self._buf[0]})
        f = self._work / _shard_name(len(self._shards))
        crc = _write_shard(f, self.spec, self.task_names, self.source_names, arrays)
        self._shards.append({"file": f.name, "rows": self._buf_rows, "bytes": f.stat().st_size, "crc32": crc})
        self._requests.append(np.unique(arrays[_TOK + "request"]))
        self._buf, self._buf_rows = [], 0

    def close(self) -> Path:
        """Flush, write tokens.parquet then trace.json (the commit point), swap in when overwriting."""
        if self._closed:
            return self.path
        self.flush()
        want = {_TOK + c for c in COLUMNS}  # the token columns come back from the shards, one at a time
        _write_tokens(self._work / TOKENS_PARQUET, ({c: a[_TOK + c] for c in COLUMNS} for a in (
            _load_shard(self._work / s["file"], self.spec, want=want)[0] for s in self._shards)))
        meta = {"format": "routecast-trace", "schema_version": SCHEMA_VERSION, "spec": self.spec.to_dict(),
                "num_tokens": sum(s["rows"] for s in self._shards), "task_names": list(self.task_names),
                "source_names": list(self.source_names), "provenance": self.provenance,
                "tensors": self._layout or {"logits_TLE": False, "hidden_TLH": None},
                "columns": {c: str(dt) for c, dt in COLUMNS.items()}, "shards": self._shards}
        _atomic_write(self._work / TRACE_JSON, _dumps(meta, "TraceWriter: provenance"))
        for name in (WRITER_JSON, LOCK_FILE):
            (self._work / name).unlink(missing_ok=True)
        _fsync(self._work)
        self._release()
        if self._work != self.path:
            _replace_dir(self._work, self.path)
        self._closed = True
        return self.path

    def abort(self) -> None:
        """Discard what this writer wrote: its directory if it started it, else this session's shards."""
        self._release()
        self._closed = True
        if self._fresh:
            shutil.rmtree(self._work, ignore_errors=True)
        for s in () if self._fresh else self._shards[self._resumed:]:
            (self._work / s["file"]).unlink(missing_ok=True)
        if not self._fresh and (self._work / TRACE_JSON).is_file():  # a finished trace: as it was before
            for name in (WRITER_JSON, LOCK_FILE):
                (self._work / name).unlink(missing_ok=True)

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:  # keep the committed shards and _writer.json for resume; the buffer is dropped
            self._release()
            self._closed = True


def write_trace(trace: Trace, path: str | os.PathLike, *, shard_tokens: int = 262144,
                overwrite: bool = False) -> Path:
    """Write trace to the directory path in shards of shard_tokens rows; -> path."""
    with TraceWriter(path, trace.spec, task_names=trace.task_names, source_names=trace.source_names,
                     provenance=trace.provenance, shard_tokens=shard_tokens, overwrite=overwrite) as w:
        for a in range(0, max(trace.num_tokens, 1), shard_tokens):  # an empty trace still records its layout
            sl = slice(a, a + shard_tokens)
            w.append({k: v[sl] for k, v in trace.tokens.items()},
                     **{k: None if getattr(trace, k) is None else getattr(trace, k)[sl] for k in _ROUTING})
    return Path(path)
