"""Trace shards on disk: safetensors routing shards, their header parser, and durable file operations.

A shard `routing-NNNNN.safetensors` holds a contiguous row range: experts_TLK int16, weights_TLK float32,
optional logits_TLE float32 and hidden_TLH float16/float32, plus the range's token columns ("token.<name>")
and the spec in the header metadata, so it is self-describing. Reads parse the header here and return
np.memmap views (safetensors' own numpy loader copies). Writes go to a temp file, are fsynced, renamed,
and the directory is fsynced. io.py builds the directory format and the TraceWriter on top of this.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import TraceError
from routecast.common.outputs import fix_mode
from routecast.trace.spec import MoESpec
from routecast.trace.trace import COLUMNS

SCHEMA_VERSION = 2
# Versions read: 1 lacks the per-token 'document' column (read as -1, unknown); 2 added it.
READ_VERSIONS = (1, 2)
ADDED_IN_V2 = ("document",)
TRACE_JSON, TOKENS_PARQUET, WRITER_JSON, LOCK_FILE = "trace.json", "tokens.parquet", "_writer.json", ".lock"
_SHARD_RE = re.compile(r"routing-(\d{5,})\.safetensors")
_TMP_RE = re.compile(r"\..+\.tmp-\d+")
_TOK = "token."
_ROUTING = ("experts_TLK", "weights_TLK", "logits_TLE", "hidden_TLH")
_MAX_HEADER = 100 << 20  # a real header is a few KB; a larger length field means corruption
_ST_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
              "F16": "float16", "F32": "float32", "F64": "float64"}
_NP_TO_ST = {v: k for k, v in _ST_DTYPES.items()}
_HIDDEN_DTYPES = ("float16", "float32")


def _nonneg(v: Any) -> bool:
    return type(v) is int and v >= 0


def _strs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _shard_name(i: int) -> str:
    return f"routing-{i:05d}.safetensors"


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _lay(v: Any) -> str:
    """How an optional tensor shows in a layout: absent, present, or the hidden dtype and width."""
    return "absent" if not v else "present" if v is True else f"{v['dtype']} with H = {v['dim']}"


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.generic, np.ndarray)):
        return o.tolist()
    if isinstance(o, (Path, tuple)):
        return str(o) if isinstance(o, Path) else list(o)
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


def _dumps(obj: Any, what: str) -> bytes:
    try:
        return json.dumps(obj, indent=1, default=_json_default, allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        msg = f"{what} cannot be stored as JSON ({e}); expected JSON-serialisable values."
        raise TraceError(msg) from None


def _oserr(f: Path, e: OSError, what: str) -> TraceError:
    return TraceError(f"{f}: cannot be read ({e.strerror or e}); expected {what}.")


# ---------------------------------------------------------------- durable file-system steps
def _fsync(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)  # fsync acts on the inode, so a fresh descriptor flushes files and dirs
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes | Callable[[Path], None]) -> None:
    """Write bytes (or call data(tmp)) to a temp file beside path, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data) if isinstance(data, bytes) else data(tmp)
        fix_mode(tmp)  # safetensors creates 0600 files; a trace must be readable as the umask allows
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync(path.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directories with renameat2(RENAME_EXCHANGE); False where the OS lacks it."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0  # AT_FDCWD, RENAME_EXCHANGE


def _replace_dir(new: Path, dst: Path) -> None:
    """Put the finished trace `new` at `dst`; the old dst survives until new is in place."""
    if not dst.exists() or not any(dst.iterdir()):
        os.replace(new, dst)
    elif _exchange(new, dst):
        shutil.rmtree(new)  # holds the previous trace now
    else:  # two renames: a crash between them leaves the old trace at .<name>.old (read_trace says so)
        old = dst.with_name(f".{dst.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
        os.replace(new, dst)
        shutil.rmtree(old)
    _fsync(dst.parent)


def _shard_files(d: Path) -> list[Path]:
    """Committed shards of d in index order; a gap in the numbering is damage, not a crash leftover."""
    found = sorted((int(m.group(1)), p) for p in d.iterdir() if (m := _SHARD_RE.fullmatch(p.name)))
    for i, (idx, p) in enumerate(found):
        if idx != i:
            raise TraceError(f"{p}: shard index is {idx}; expected {i} (shards are numbered without gaps).")
    return [p for _, p in found]


# ---------------------------------------------------------------- safetensors shards
def _read_header(file: Path) -> tuple[dict[str, tuple[np.dtype, tuple[int, ...], int, int]], dict, int, int]:
    """Parse a safetensors header -> (name -> (dtype, shape, begin, end), metadata, data start, size)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            raw = f.read(n) if 2 <= n <= min(size - 8, _MAX_HEADER) else None
    except OSError as e:
        raise _oserr(file, e, "a readable safetensors shard") from None
    if raw is None:
        raise TraceError(f"{file}: header length field is {n} in a {size}-byte file; expected a safetensors "
                         "shard (the file is truncated or not safetensors).")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        msg = f"{file}: safetensors header is not valid JSON; expected a safetensors shard."
        raise TraceError(msg) from None
    if not isinstance(header, dict):
        raise TraceError(f"{file}: safetensors header is {type(header).__name__}; expected a JSON object.")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise TraceError(f"{file}: header field '__metadata__' is {_short(meta)}; expected a string map.")
    entries = {}
    for name, ent in header.items():
        shape, offs = (ent.get("shape"), ent.get("data_offsets")) if isinstance(ent, dict) else (None, None)
        ints = [x for x in (shape or []) + (offs or []) if type(x) is int and x >= 0]
        if (not isinstance(ent, dict) or ent.get("dtype") not in _ST_DTYPES or not isinstance(shape, list)
                or not isinstance(offs, list) or len(offs) != 2 or len(ints) != len(shape) + 2
                or offs[0] > offs[1]):
            raise TraceError(f"{file}: header entry '{name}' is {_short(ent)}; expected dtype, shape and "
                             "data_offsets.")
        dt = np.dtype(_ST_DTYPES[ent["dtype"]])
        if offs[1] - offs[0] != int(np.prod(shape)) * dt.itemsize:
            raise TraceError(f"{file}: tensor '{name}' spans {offs[1] - offs[0]} bytes; expected "
                             f"{int(np.prod(shape)) * dt.itemsize} for shape {tuple(shape)} {dt}.")
        entries[name] = (dt, tuple(shape), offs[0], offs[1])
    end = 8 + n + max((e[3] for e in entries.values()), default=0)
    if end != size:
        raise TraceError(f"{file}: file is {size} bytes; expected {end} from its header (truncated or "
                         "padded).")
    return entries, meta, 8 + n, size


def _shard_identity(file: Path, meta: dict) -> tuple[MoESpec, tuple[str, ...], tuple[str, ...]]:
    """The spec and task/source names a shard's header metadata records."""
    try:
        spec_d, tasks, sources = (json.loads(meta[k]) for k in ("spec", "task_names", "source_names"))
    except (KeyError, ValueError, RecursionError):
        raise TraceError(f"{file}: header metadata lacks a valid 'spec', 'task_names' or 'source_names'; "
                         "expected a shard written by TraceWriter.") from None
    for key, names in (("task_names", tasks), ("source_names", sources)):
        if not _strs(names):
            raise TraceError(f"{file}: metadata field '{key}' is {_short(names)}; expected a list of "
                             "strings.")
    return MoESpec.from_dict(spec_d, where=f"{file} metadata field 'spec'"), tuple(tasks), tuple(sources)


def _load_shard(file: Path, spec: MoESpec | None, *, rows: int | None = None, nbytes: int | None = None,
                layout: dict | None = None, mmap: bool = True, want: set[str] | None = None
                ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Check one shard against spec (and trace.json's rows, bytes, layout); map its tensors.

    Returns (arrays for the names in want, or all; info: layout, rows, bytes, and spec, task_names,
    source_names from the header when spec is None).
    """
    entries, meta, start, size = _read_header(file)
    info: dict[str, Any] = {}
    if spec is None:
        spec, info["task_names"], info["source_names"] = _shard_identity(file, meta)
        info["spec"] = spec
    if "experts_TLK" not in entries or len(entries["experts_TLK"][1]) != 3:
        raise TraceError(f"{file}: tensor 'experts_TLK' is missing or not 3-d; expected shape (T, L, K).")
    n = entries["experts_TLK"][1][0] if rows is None else rows
    L, K, E = spec.num_layers, spec.top_k, spec.num_experts
    expect = {"experts_TLK": (("int16",), (n, L, K)), "weights_TLK": (("float32",), (n, L, K)),
              **{_TOK + c: ((str(dt),), (n,)) for c, dt in COLUMNS.items()}}
    if "logits_TLE" in entries:
        expect["logits_TLE"] = (("float32",), (n, L, E))
    if "hidden_TLH" in entries:
        hs = entries["hidden_TLH"][1]
        expect["hidden_TLH"] = (_HIDDEN_DTYPES, (n, L, spec.hidden_size or (hs[2] if len(hs) == 3 else -1)))
    for name in entries:
        if name not in expect:
            raise TraceError(f"{file}: holds unexpected tensor '{name}'; expected only {sorted(expect)}.")
    v1_fill = [] if meta.get("schema_version") != "1" else [_TOK + c for c in ADDED_IN_V2 if _TOK + c not in entries]
    for name, (dts, shape) in expect.items():
        if name in v1_fill:
            continue  # a schema-1 shard predates the column; filled with -1 (unknown) below
        if name not in entries:
            raise TraceError(f"{file}: tensor '{name}' is missing; expected it in every routing shard.")
        dt, sh = entries[name][:2]
        if str(dt) not in dts:
            raise TraceError(f"{file}: tensor '{name}' has dtype {dt}; expected {' or '.join(dts)}.")
        if sh != shape or (name == "hidden_TLH" and sh[2] < 1):
            why = " (rows as trace.json records)" if rows is not None else ""
            raise TraceError(f"{file}: tensor '{name}' has shape {sh}; expected {shape}{why}.")
    hid = entries.get("hidden_TLH")
    lay = {"logits_TLE": "logits_TLE" in entries,
           "hidden_TLH": hid and {"dtype": str(hid[0]), "dim": hid[1][2]}}
    for key in ("logits_TLE", "hidden_TLH") if layout is not None else ():
        if lay[key] != layout.get(key):
            raise TraceError(f"{file}: tensor '{key}' is {_lay(lay[key])}; expected {_lay(layout.get(key))} "
                             "as trace.json's 'tensors' records.")
    if nbytes is not None and nbytes != size:
        raise TraceError(f"{file}: file is {size} bytes; expected {nbytes} as trace.json records (replaced "
                         "or damaged).")
    info.update(layout=lay, rows=n, bytes=size)
    try:
        if mmap:
            raw = np.memmap(file, dtype=np.uint8, mode="r")
        else:
            with open(file, "rb") as f:
                raw = np.frombuffer(bytearray(f.read()), dtype=np.uint8)  # one writable buffer, no 2nd copy
    except OSError as e:
        raise _oserr(file, e, "a readable routing shard") from None
    if raw.size != size:
        raise TraceError(f"{file}: file changed size while being read; expected {size} bytes.")
    info["raw"] = raw  # the whole file's bytes (a memory map or a buffer), for the CRC check
    out = {k: raw[start + a: start + b].view(dt).reshape(sh)
           for k, (dt, sh, a, b) in entries.items() if want is None or k in want}
    out.update({k: np.full(n, -1, COLUMNS[k[len(_TOK):]]) for k in v1_fill if want is None or k in want})
    return out, info


def _write_shard(file: Path, spec: MoESpec, task_names: tuple[str, ...], source_names: tuple[str, ...],
                 arrays: dict[str, np.ndarray]) -> int:
    """Write one shard durably; returns the CRC-32 of its bytes (recorded in trace.json, checked on read).

    The safetensors layout (8-byte header length, JSON header padded to 8 bytes, tensors back to back) is
    written tensor by tensor from the arrays themselves, widest dtype first so every tensor stays aligned,
    and the CRC is taken over the same buffers as they are written: no serialised copy of the shard.
    """
    meta = {"format": "routecast-trace-shard", "schema_version": str(SCHEMA_VERSION),
            "spec": json.dumps(spec.to_dict()), "task_names": json.dumps(list(task_names)),
            "source_names": json.dumps(list(source_names))}
    arrs = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    order = sorted(arrs, key=lambda k: (-arrs[k].dtype.itemsize, k))
    header: dict[str, Any] = {}
    off = 0
    for k in order:
        a = arrs[k]
        header[k] = {"dtype": _NP_TO_ST[a.dtype.name], "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    head = len(h).to_bytes(8, "little") + h
    crc = zlib.crc32(head)

    def write(tmp: Path) -> None:
        nonlocal crc
        with open(tmp, "wb") as f:
            f.write(head)
            for k in order:
                buf = memoryview(arrs[k].reshape(-1).view(np.uint8))
                crc = zlib.crc32(buf, crc)
                f.write(buf)

    _atomic_write(file, write)
    return crc


# ---------------------------------------------------------------- trace.json and tokens.parquet
