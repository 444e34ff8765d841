"""Importers: routing logs written by other tools -> a Trace directory.

import_jsonl reads JSON-lines routing logs with one record per (token, MoE layer), as people write them
from vLLM / SGLang / HF forward hooks (plain or gzip-compressed), e.g.
  {"request": 3, "layer": 0, "token_idx": 5, "token_id": 1234, "experts": [7, 0], "gating_probs": [0.8, 0.2]}

Canonical fields (field_map={"name in the log": "canonical name"} renames; ALIASES below are tried too):
  request    int id >= 0, or string id (renumbered 0, 1, ... in order of first appearance)      required
  layer      MoE layer: the model layer index (kept as spec.layer_ids) or 0..L-1 with a spec  required
  position   the token's position in its request, 0..2**31-1                                    required
  experts    list of distinct expert ids in -1..32767 (-1 = dropped, may repeat; below E when E is
             given); shorter lists are padded with -1 to K                                      required
  weights    list of finite, non-negative routing weights, one per expert id (absent: 1/K each)
  token_id   int; phase "prefill"/"decode" or 0/1 (absent: prefill); step int >= 0 (absent: derived);
  task, source  string names or int indices; arrival_s  seconds (float)
  document   the request's source document: int id >= 0, or string id (renumbered in order of first
             appearance); absent: -1, unknown (a document split then falls back to the request split)
The names are resolved from the first record; every record must then carry every resolved field.
A value outside its range (an id that would wrap in its int16/int32 column, an int beyond int64) is refused
with the file, line, field, value and the allowed range; so is a truncated or damaged .gz file.

Streaming, in bounded memory: two passes with pyarrow's block-wise JSON reader. Pass 1 checks every
record and infers L (the distinct layer values), E (max expert id + 1 unless num_experts or spec), K (the
longest list unless top_k or spec) and task/source names. Pass 2 groups the records of each token and
writes through TraceWriter. ASSUMPTION: every record of a token lies within `window` records of the
token's first record. Hooks log a forward pass layer by layer, so a token's records span about
(tokens in the batch x L) records; the default window of 2**20 covers 8192-token batches of a 128-layer
model. A violation raises a TraceError naming the line. Memory is O(window + one JSON block + one shard
+ distinct string request ids), flat in the size of the file.

Rows are tokens in the order of their first record. step, when absent: consecutive prefill tokens of one
request (in row order) form one step, and every decode token is a step of its own.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from tqdm import tqdm

from routecast.common.errors import ConfigError, TraceError
from routecast.trace.io import TraceWriter, check_trace_out
from routecast.trace.spec import MAX_EXPERTS, MoESpec
from routecast.trace.trace import DECODE, PREFILL

REQUIRED = ("request", "layer", "position", "experts")
OPTIONAL = ("weights", "token_id", "phase", "step", "task", "source", "arrival_s", "document")
ALIASES: dict[str, tuple[str, ...]] = {
    "request": ("request_id", "req_id", "seq_id", "sequence_id", "req"),
    "layer": ("layer_id", "layer_idx", "moe_layer"),
    "position": ("token_idx", "token_index", "pos", "position_id", "token_pos"),
    "experts": ("expert_ids", "topk_ids", "topk_idx", "selected_experts", "expert_indices"),
    "weights": ("gating_probs", "topk_weights", "routing_weights", "expert_weights", "probs", "scores"),
    "token_id": ("token", "input_id"),
    "arrival_s": ("arrival", "arrival_time"),
    "document": ("document_id", "doc_id", "doc"),
}
_BLOCK = 4 << 20  # bytes of JSON per block: large enough for long lines, small against the window
_I32 = 2**31
_I64 = 2**63
_F32_MAX = float(np.finfo(np.float32).max)
_PHASES = {"prefill": PREFILL, "decode": DECODE}


# ---------------------------------------------------------------- fields
def _kinds(first: dict[str, Any], fields: dict[str, str]) -> dict[str, str]:
    """canonical -> value kind: int, float, str, ints, floats (request/phase/task/source may be str)."""
    kinds = {"request": "int", "layer": "int", "position": "int", "experts": "ints", "weights": "floats",
             "token_id": "int", "phase": "int", "step": "int", "task": "int", "source": "int",
             "arrival_s": "float", "document": "int"}
    for c in ("request", "phase", "task", "source", "document"):
        if c in fields and isinstance(first.get(fields[c]), str):
            kinds[c] = "str"
    return {c: kinds[c] for c in fields}


_ARROW = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "ints": pa.list_(pa.int64()),
          "floats": pa.list_(pa.float64())}
_EXPECT = {"int": "an integer", "float": "a number", "str": "a string", "ints": "a list of integers",
           "floats": "a list of numbers"}


def _resolve(first: dict[str, Any], field_map: dict[str, str] | None, where: str) -> dict[str, str]:
    """canonical name -> the key used in the log."""
    fm = dict(field_map or {})
    canon = REQUIRED + OPTIONAL
    for k, v in fm.items():
        if v not in canon:
            raise ConfigError(f"--map {k}={v} (field_map) names {v!r}; expected one of the canonical names "
                              f"{list(canon)}.")
    if len(set(fm.values())) != len(fm):
        raise ConfigError(f"field_map is {fm}; expected each canonical name at most once.")
    fields = {v: k for k, v in fm.items()}
    for c in canon:
        hit = next((k for k in (c, *ALIASES.get(c, ())) if k in first and k not in fm), None)
        if c not in fields and hit is not None:
            fields[c] = hit
    for c in canon:
        if (c in REQUIRED or c in fm.values()) and (c not in fields or fields[c] not in first):
            names = [fields[c]] if c in fields else [c, *ALIASES.get(c, ())]
            raise TraceError(f"{where}: field '{c}' is missing (looked for {names}); expected it in every "
                             f"record, or pass --map <name in your log>={c} (field_map= in Python).")
    return {c: k for c, k in fields.items() if k in first}


def _py_ok(v: Any, kind: str) -> bool:
    num = (int, float)
    return {"int": lambda: type(v) is int, "float": lambda: type(v) in num, "str": lambda: isinstance(v, str),
            "ints": lambda: isinstance(v, list) and all(type(x) is int for x in v),
            "floats": lambda: isinstance(v, list) and all(type(x) in num for x in v)}[kind]()


# ---------------------------------------------------------------- reading
def _schema(fields: dict[str, str], kinds: dict[str, str]) -> pa.Schema:
    return pa.schema([(k, _ARROW[kinds[c]]) for c, k in fields.items()])


def _json_error(src: Path, n: int, e: Exception) -> TraceError:
    return TraceError(f"{src} line {n}: not valid JSON ({e}); expected one JSON object per line.")


def _not_object(src: Path, n: int, rec: Any) -> TraceError:
    return TraceError(f"{src} line {n}: holds a JSON {type(rec).__name__}; expected one object per line.")


def _open_text(src: Path):
    with open(src, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(src, "rb") if gz else open(src, "rb")


def _first_record(src: Path) -> tuple[dict[str, Any], int]:
    with _open_text(src) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rec = json.loads(line)
                except ValueError as e:
                    raise _json_error(src, n, e) from None
                if not isinstance(rec, dict):
                    raise _not_object(src, n, rec)
                return rec, n
    raise TraceError(f"{src}: holds no records; expected JSON lines of routing records.")


def _batches(src: Path, schema: pa.Schema, bar: tqdm) -> Iterator[pa.RecordBatch]:
    """Record batches parsed from blocks of about _BLOCK bytes of whole lines.

    We cut the blocks ourselves: pyarrow's streaming open_json reads ahead without bound (measured: its
    memory pool peaked at 41 MB for a 32 MB log and 136 MB for a 128 MB one), which breaks flat memory.
    """
    opts = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    with open(src, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        f = gzip.GzipFile(fileobj=raw) if gz else raw
        tail = b""
        while True:
            buf = f.read(_BLOCK)
            data = tail + buf
            cut = len(data) if not buf else data.rfind(b"\n") + 1  # a line longer than a block keeps growing
            data, tail = data[:cut], data[cut:]
            if data.strip():
                yield from pj.read_json(pa.py_buffer(data), parse_options=opts).to_batches()
            bar.update(raw.tell() - bar.n)
            if not buf:
                return


def _line_of(src: Path, record: int) -> tuple[int, bytes]:
    """(1-based line number, line) of the record-th non-blank line (pyarrow skips blank lines too)."""
    with _open_text(src) as f:
        i = -1
        for n, line in enumerate(f, 1):
            if line.strip():
                i += 1
                if i == record:
                    return n, line
    return -1, b""


def _locate(src: Path, start: int, fields: dict[str, str], kinds: dict[str, str], ctx: dict) -> TraceError:
    """The error of the first bad record at or after record index start, as one sentence with its line."""
    with _open_text(src) as f:
        i = -1
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            i += 1
            if i < start:
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError) as e:
                return _json_error(src, n, e)
            if not isinstance(rec, dict):
                return _not_object(src, n, rec)
            for c, k in fields.items():
                if rec.get(k) is None:
                    return TraceError(f"{src} line {n}: field '{k}' is missing or null; expected "
                                      f"{_EXPECT[kinds[c]]} in every record (fields are resolved from the "
                                      "first record).")
                if not _py_ok(rec[k], kinds[c]):
                    return TraceError(f"{src} line {n}: field '{k}' is {rec[k]!r:.60}; expected "
                                      f"{_EXPECT[kinds[c]]}.")
                lo, hi, exp = _ranges(ctx.get("E")).get(c, (-_I64, _I64, "-2**63..2**63-1"))
                vals = rec[k] if isinstance(rec[k], list) else [rec[k]]
                if kinds[c] in ("int", "ints") and any(not lo <= v < hi for v in vals):
                    return TraceError(f"{src} line {n}: field '{k}' is {rec[k]!r:.60}; expected {exp}.")
                if kinds[c] in ("float", "floats") and any(type(v) is int and not -_I64 <= v < _I64 for v in vals):
                    return TraceError(f"{src} line {n}: field '{k}' is {rec[k]!r:.60}; expected {_EXPECT[kinds[c]]} "
                                      "within +-2**63 (write larger values with an exponent, e.g. 1e30).")
            try:
                row = pa.RecordBatch.from_pylist([{k: rec[k] for k in fields.values()}],
                                                 schema=_schema(fields, kinds))
            except (pa.ArrowException, OverflowError) as e:  # a value no column type can hold
                return TraceError(f"{src} line {n}: a value cannot be stored ({str(e)[:80]}); expected "
                                  "numbers that fit int64 / float64.")
            bad = _check(_columns(row, fields, kinds), ctx)
            if bad:
                return TraceError(f"{src} line {n}: {bad[1]}.")
    return TraceError(f"{src}: the JSON reader failed after record {start} but no bad line was found; "
                      "expected one JSON object per line.")


def _columns(batch: pa.RecordBatch, fields: dict[str, str], kinds: dict[str, str]) -> dict[str, Any]:
    """numpy views of a batch: scalar fields as arrays, list fields as (values, offsets); nulls flagged."""
    out: dict[str, Any] = {"_null": None}
    for c, k in fields.items():
        a = batch.column(k)
        if a.null_count or (kinds[c] in ("ints", "floats") and a.values.null_count):
            rows = np.flatnonzero(a.is_null().to_numpy(zero_copy_only=False))
            if not rows.size:  # a null inside a list: find its row through the offsets
                vals_null = np.flatnonzero(a.values.is_null().to_numpy(zero_copy_only=False))
                rows = np.searchsorted(a.offsets.to_numpy(), vals_null, side="right") - 1
            out["_null"] = (int(rows[0]), f"field '{k}' is missing or null; expected {_EXPECT[kinds[c]]}")
            return out
        if kinds[c] in ("ints", "floats"):
            out[c] = (a.values.to_numpy(), a.offsets.to_numpy())
        elif kinds[c] == "str":
            enc = pc.dictionary_encode(a)
            out[c] = (enc.indices.to_numpy(), enc.dictionary.to_pylist())
        else:
            out[c] = a.to_numpy()
    return out


def _first(mask: np.ndarray) -> int | None:
    i = np.flatnonzero(mask)
    return int(i[0]) if i.size else None


def _ranges(E: int | None) -> dict[str, tuple[int, int, str]]:
    """canonical int field -> (lo, hi exclusive, the allowed range in words); experts: each id in the list.

    Every bound fits the trace column it lands in (int16 expert ids, int32 positions, int64 requests), so
    no value can wrap on the cast; a log value beyond int64 is refused here too, before pyarrow sees it."""
    hi_e = MAX_EXPERTS if E is None else E
    return {"request": (0, _I64, "0..2**63-1"), "position": (0, _I32, "0..2**31-1"),
            "layer": (0, _I32, "0..2**31-1"), "step": (0, _I64, "0..2**63-1"), "token_id": (-1, _I32, "-1..2**31-1"),
            "task": (-1, 2**15, "-1..32767"), "source": (-1, 2**15, "-1..32767"),
            "phase": (0, 2, "0 (prefill) or 1 (decode)"), "document": (-1, 2**62, "-1 (unknown) or a document id >= 0"),
            "experts": (-1, hi_e, f"ids in -1..{hi_e - 1}" + (" (expert ids are int16)" if E is None else ""))}


def _check(cols: dict[str, Any], ctx: dict) -> tuple[int, str] | None:
    """First (row, problem) of a batch, or None: ranges, list lengths, distinct ids, finiteness, known names."""
    if cols["_null"]:
        return cols["_null"]
    f, K, E = ctx["fields"], ctx.get("K"), ctx.get("E")
    checks: list[tuple[str, Any, str]] = []
    ints = _ranges(E)
    for c, (lo, hi, exp) in ints.items():
        if c == "experts":
            continue
        if c in cols and not isinstance(cols[c], tuple):
            checks.append((c, (cols[c] < lo) | (cols[c] >= hi), exp))
    if "arrival_s" in cols:
        checks.append(("arrival_s", ~np.isfinite(cols["arrival_s"]), "finite seconds"))
    if "phase" in cols and isinstance(cols["phase"], tuple):
        idx, names = cols["phase"]
        ok = np.array([n in _PHASES for n in names], bool)
        checks.append(("phase", ~ok[idx], "'prefill' or 'decode'"))
    vals, off = cols["experts"]
    n_e = np.diff(off)
    row_of = np.repeat(np.arange(n_e.size), n_e)
    if K is not None:
        checks.append(("experts", n_e > K, f"at most top_k = {K} ids"))
    lo_e, hi_e, exp_e = ints["experts"]
    bad_id = (vals < lo_e) | (vals >= hi_e)
    checks.append(("experts", np.bincount(row_of[bad_id], minlength=n_e.size) > 0, exp_e))
    # the same expert twice in one record: sort (record, id) keys; -1 (dropped) may repeat
    key = np.sort(row_of * (2 * _I32) + vals)
    twice = (key[1:] == key[:-1]) & (key[1:] % (2 * _I32) != 2 * _I32 - 1)
    checks.append(("experts", np.bincount(key[1:][twice] // (2 * _I32), minlength=n_e.size) > 0,
                   "distinct ids (-1, a dropped slot, may repeat)"))
    if "weights" in cols:
        wv, woff = cols["weights"]
        checks.append(("weights", np.diff(woff) != n_e, "one weight per expert id"))
        bad_w = ~((wv >= 0) & (wv <= _F32_MAX))  # stored as float32: larger values would become inf; NaN fails
        fin = np.bincount(np.repeat(np.arange(n_e.size), np.diff(woff))[bad_w], minlength=n_e.size)
        checks.append(("weights", fin > 0, "finite, non-negative numbers up to 3.4e38 (float32)"))
    for c, mask, exp in checks:
        j = _first(mask)
        if j is not None:
            v = cols[c]
            shown = (v[0][v[1][j]:v[1][j + 1]].tolist() if c in ("experts", "weights")
                     else v[1][v[0][j]] if isinstance(v, tuple) else v[j].item())
            return j, f"field '{f[c]}' is {shown!r:.60}; expected {exp}"
    return None


# ---------------------------------------------------------------- pass 1: check and infer
def _scan(src: Path, fields: dict[str, str], kinds: dict[str, str], ctx: dict,
          progress: bool) -> dict[str, Any]:
    schema = _schema(fields, kinds)
    st: dict[str, Any] = {"records": 0, "layers": np.zeros(0, np.int64), "max_id": -1, "max_k": 0,
                          "task": {}, "source": {}, "task_max": -1, "source_max": -1}
    bar = tqdm(total=src.stat().st_size, unit="B", unit_scale=True, desc="import 1/2 check",
               disable=not progress)
    try:
        for batch in _batches(src, schema, bar):
            cols = _columns(batch, fields, kinds)
            bad = _check(cols, ctx)
            if bad:
                raise _locate(src, st["records"] + bad[0], fields, kinds, ctx)
            st["layers"] = np.union1d(st["layers"], cols["layer"])
            vals, off = cols["experts"]
            st["max_id"] = max(st["max_id"], int(vals.max()) if vals.size else -1)
            st["max_k"] = max(st["max_k"], int(np.diff(off).max()) if off.size > 1 else 0)
            for c in ("task", "source"):
                if c in cols and kinds[c] == "str":
                    for name in cols[c][1]:
                        st[c].setdefault(name, len(st[c]))
                elif c in cols and cols[c].size:
                    st[c + "_max"] = max(st[c + "_max"], int(cols[c].max()))
            st["records"] += batch.num_rows
    except pa.ArrowException:  # pyarrow says where only within a block: find the line ourselves
        raise _locate(src, st["records"], fields, kinds, ctx) from None
    finally:
        bar.close()
    return st


def _names(st: dict[str, Any], c: str) -> tuple[str, ...]:
    return tuple(st[c]) if st[c] else tuple(f"{c}{i}" for i in range(st[c + "_max"] + 1))


def _make_spec(src: Path, st: dict[str, Any], spec: MoESpec | None, num_experts: int | None,
               top_k: int | None) -> tuple[MoESpec, np.ndarray, np.ndarray]:
    """-> (spec, sorted layer values, their MoE-layer index) for mapping the log's layer field."""
    vals = st["layers"]
    if spec is not None:
        if num_experts not in (None, spec.num_experts) or top_k not in (None, spec.top_k):
            raise ConfigError(f"num_experts={num_experts}, top_k={top_k} contradict the spec "
                              f"({spec.num_experts}, {spec.top_k}); expected them unset or equal.")
        keys = np.array(spec.layer_ids, np.int64)
        if not np.isin(vals, keys).all():
            if vals.size and vals.max() < spec.num_layers:
                keys = np.arange(spec.num_layers)
            else:
                raise TraceError(f"{src}: field 'layer' holds {vals.tolist()[:8]}; expected spec.layer_ids "
                                 f"{list(spec.layer_ids)[:8]} or MoE-layer indices 0..{spec.num_layers - 1}.")
    else:
        if st["max_id"] < 0 and num_experts is None:
            raise TraceError(f"{src}: every expert id is -1; expected some routed expert, or pass "
                             "num_experts.")
        try:
            spec = MoESpec(num_layers=int(vals.size), num_experts=num_experts or st["max_id"] + 1,
                           top_k=top_k or max(st["max_k"], 1), layer_ids=tuple(vals.tolist()))
        except TraceError as e:
            raise TraceError(f"{src}: the inferred {e}") from None
        keys = vals
    order = np.argsort(keys, kind="stable")
    return spec, keys[order], order


# ---------------------------------------------------------------- pass 2: group records into tokens
_TOKEN_FIELDS = ("token_id", "phase", "step", "task", "source", "arrival_s", "document")


def _records(cols: dict[str, Any], kinds: dict[str, str], lut: tuple[np.ndarray, np.ndarray], K: int,
             maps: dict[str, dict[str, int]], first: int) -> dict[str, np.ndarray]:
    """Per-record arrays of one batch: request ids, MoE layer index, padded (n, K) experts and weights."""
    vals, off = cols["experts"]
    n = off.size - 1
    idx = off[:-1, None] + np.arange(K)
    have = np.arange(K) < np.diff(off)[:, None]
    take = np.minimum(idx, max(vals.size - 1, 0))
    rec = {"rec": np.arange(first, first + n, dtype=np.int64),
           "position": cols["position"],
           "l": lut[1][np.searchsorted(lut[0], cols["layer"])],
           "experts": np.where(have, vals[take] if vals.size else -1, -1).astype(np.int16)}
    if "weights" in cols:
        wv = cols["weights"][0]
        rec["weights"] = np.where(have, wv[take] if wv.size else 0.0, 0.0).astype(np.float32)
    else:  # a log of ids only: spread the weight evenly over the routed slots
        rec["weights"] = np.where(rec["experts"] >= 0, 1.0 / K, 0.0).astype(np.float32)
    for c in ("request", *_TOKEN_FIELDS):
        if c not in cols:
            continue
        if kinds[c] == "str":  # dictionary-encoded: map this batch's few distinct strings
            codes, names = cols[c]
            m = maps[c]
            look = np.array([m.setdefault(s, len(m)) if c in ("request", "document") else m[s] for s in names],
                            np.int64)
            rec[c] = look[codes] if names else np.zeros(n, np.int64)
        else:
            rec[c] = cols[c]
    return rec


def _line_error(src: Path, rec: int, what: str) -> TraceError:
    n, _ = _line_of(src, rec)
    return TraceError(f"{src} line {n}: {what}.")


def _split(src: Path, pend: dict[str, np.ndarray], L: int, K: int, window: int, seen: int,
           fields: dict[str, str], at_end: bool) -> tuple[dict | None, dict[str, np.ndarray]]:
    """Emit the complete tokens that precede the oldest incomplete one; -> (rows or None, still pending)."""
    o = np.lexsort((pend["rec"], pend["position"], pend["request"]))
    s = {k: v[o] for k, v in pend.items()}
    start = np.r_[True, (s["request"][1:] != s["request"][:-1]) | (s["position"][1:] != s["position"][:-1])]
    tok = np.cumsum(start) - 1
    ntok = int(tok[-1]) + 1
    first_rec = s["rec"][start]

    def tname(t: int) -> str:
        return f"token (request {s['request'][start][t]}, position {s['position'][start][t]})"

    slots = np.bincount(tok * L + s["l"], minlength=ntok * L)
    if (slots > 1).any():
        t, lay = divmod(int(np.flatnonzero(slots > 1)[0]), L)
        dup = s["rec"][(tok == t) & (s["l"] == lay)]
        first_line = _line_of(src, int(dup[0]))[0]
        raise _line_error(src, int(dup[1]), f"{tname(t)} has a second record for layer index {lay} (the "
                          f"first is on line {first_line}); expected one record per token per layer")
    for c in _TOKEN_FIELDS:
        if c in s:
            diff = np.flatnonzero(s[c] != s[c][start][tok])
            if diff.size:
                j = int(diff[0])
                raise _line_error(src, int(s["rec"][j]), f"field '{fields[c]}' is {s[c][j]} but "
                                  f"{s[c][start][tok[j]]} in the token's first record; expected one value "
                                  "per token")
    span = s["rec"] - first_rec[tok]  # checked on every token, so the outcome does not depend on block size
    if (span > window).any():
        j = int(np.flatnonzero(span > window)[0])
        first_line = _line_of(src, int(first_rec[tok[j]]))[0]
        raise _line_error(src, int(s["rec"][j]), f"{tname(int(tok[j]))} has this record {int(span[j])} "
                          f"records after its first (line {first_line}); expected every layer's record "
                          f"within window={window} records")
    complete = np.bincount(tok, minlength=ntok) == L
    by_first = np.argsort(first_rec, kind="stable")
    inc = np.flatnonzero(~complete[by_first])
    cut = int(inc[0]) if inc.size else ntok
    if inc.size and (at_end or seen - first_rec[by_first[cut]] > window):
        t = int(by_first[cut])
        have = np.unique(s["l"][tok == t]).tolist()
        why = "the file ends" if at_end else f"{window} more records (the window)"
        raise _line_error(src, int(first_rec[t]), f"{tname(t)} starts here but has only layer indices "
                          f"{have[:8]} of {L} when {why}; expected every layer's record within "
                          f"window={window} records")
    emit = by_first[:cut]
    if not emit.size:
        return None, pend
    rank = np.full(ntok, -1, np.int64)
    rank[emit] = np.arange(emit.size)
    rows = rank[tok]
    em = rows >= 0
    e = np.empty((emit.size, L, K), np.int16)
    w = np.empty((emit.size, L, K), np.float32)
    e[rows[em], s["l"][em]] = s["experts"][em]
    w[rows[em], s["l"][em]] = s["weights"][em]
    out = {c: s[c][start][emit] for c in ("request", "position", *_TOKEN_FIELDS) if c in s}
    out.update(experts=e, weights=w)
    return out, {k: v[~em] for k, v in s.items()}


def _derive_steps(req: np.ndarray, phase: np.ndarray, carry: list[int]) -> np.ndarray:
    """Consecutive prefill tokens of one request share a step; each decode token gets its own.

    carry = [last request, last phase, last step] of the previous rows (updated in place).
    """
    prev_r = np.r_[carry[0], req[:-1]]
    prev_p = np.r_[carry[1], phase[:-1]]
    new = (req != prev_r) | (phase == DECODE) | (prev_p == DECODE)
    steps = carry[2] + np.cumsum(new)
    carry[:] = [int(req[-1]), int(phase[-1]), int(steps[-1])]
    return steps


# ---------------------------------------------------------------- the importer
def import_jsonl(src: str | os.PathLike, out: str | os.PathLike, *, spec: MoESpec | None = None,
                 field_map: dict[str, str] | None = None, num_experts: int | None = None,
                 top_k: int | None = None, shard_tokens: int = 65536, progress: bool = True,
                 window: int = 1 << 20, overwrite: bool = False) -> Path:
    """Import a JSON-lines (or .jsonl.gz) routing log into the trace directory out; -> out.

    spec fixes L/E/K and the layer ids (else inferred); field_map renames log fields to canonical names;
    window bounds how far apart a token's records may be (see the module docstring). Bad records raise a
    TraceError naming the file, the line and the field; nothing is left at out when the import fails.
    """
    src = Path(src)
    if not src.is_file():
        raise TraceError(f"{src}: file does not exist; expected a JSON-lines routing log.")
    with open(src, "rb") as f:
        magic = f.read(2)
    if src.suffix.lower() in (".gz", ".gzip") and magic != b"\x1f\x8b":  # the content decides, the user is told
        print(f"note: {src} ends in {src.suffix} but is not gzip-compressed; read as plain JSON lines "
              "(assumed from its first two bytes).", file=sys.stderr)
    try:
        return _import(src, out, spec=spec, field_map=field_map, num_experts=num_experts, top_k=top_k,
                       shard_tokens=shard_tokens, progress=progress, window=window, overwrite=overwrite)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:  # the writer has been aborted on the way out
        why = "it ends before the end of the compressed stream" if isinstance(e, EOFError) else str(e)
        raise TraceError(f"{src}: is not a complete gzip file ({why}); expected a JSON-lines log, plain or "
                         "gzip-compressed.") from None


def _import(src: Path, out: str | os.PathLike, *, spec: MoESpec | None, field_map: dict[str, str] | None,
            num_experts: int | None, top_k: int | None, shard_tokens: int, progress: bool, window: int,
            overwrite: bool) -> Path:
    for name, v in (("num_experts", num_experts), ("top_k", top_k), ("window", window), ("shard_tokens", shard_tokens)):
        if v is not None and (type(v) is not int or v < 1):
            raise ConfigError(f"--{name.replace('_', '-')} is {v!r} ({name}= in Python); expected a positive integer.")
    if num_experts is not None and num_experts > MAX_EXPERTS:  # refuse before a whole pass over the log
        raise ConfigError(f"--num-experts is {num_experts}; expected at most {MAX_EXPERTS} (expert ids "
                          "are stored as int16).")
    o = Path(out)
    check_trace_out(o, overwrite=overwrite)  # fail before a whole pass over the log
    first, n = _first_record(src)
    fields = _resolve(first, field_map, f"{src} line {n}")
    kinds = _kinds(first, fields)
    ctx = {"fields": fields, "E": spec.num_experts if spec else num_experts,
           "K": spec.top_k if spec else top_k}
    st = _scan(src, fields, kinds, ctx, progress)
    spec, keys, order = _make_spec(src, st, spec, num_experts, top_k)
    L, K = spec.num_layers, spec.top_k
    maps = {"request": {}, "task": st["task"], "source": st["source"], "phase": dict(_PHASES), "document": {}}
    prov = {"importer": "jsonl", "source_file": str(src), "records": st["records"], "fields": fields,
            "window": window, "step": "from the log" if "step" in fields else
            "derived: consecutive prefill tokens of a request form one step, each decode token its own",
            "phase": "from the log" if "phase" in fields else "absent: all prefill",
            "weights": "from the log" if "weights" in fields else "absent: 1/K per routed slot",
            "request": "renumbered from strings in order of first appearance" if kinds["request"] == "str"
            else "from the log",
            "document": "absent: unknown (a document split falls back to the request split)"
            if "document" not in fields else "renumbered from strings in order of first appearance"
            if kinds["document"] == "str" else "from the log"}
    writer = TraceWriter(out, spec, task_names=_names(st, "task"), source_names=_names(st, "source"),
                         provenance=prov, shard_tokens=shard_tokens, overwrite=overwrite)
    schema = _schema(fields, kinds)
    bar = tqdm(total=src.stat().st_size, unit="B", unit_scale=True, desc="import 2/2 write",
               disable=not progress)
    pend: dict[str, np.ndarray] | None = None
    carry = [-1, DECODE, -1]
    seen = 0
    try:
        batches = _batches(src, schema, bar)
        while True:
            batch = next(batches, None)
            if batch is not None:
                recs = _records(_columns(batch, fields, kinds), kinds, (keys, order), K, maps, seen)
                seen += batch.num_rows
                pend = recs if pend is None else {k: np.concatenate([pend[k], recs[k]]) for k in recs}
            if pend is not None and pend["rec"].size:
                rows, pend = _split(src, pend, L, K, window, seen, fields, at_end=batch is None)
                if rows is not None:
                    phase = rows.get("phase", np.full(rows["request"].size, PREFILL))
                    step = rows["step"] if "step" in rows else _derive_steps(rows["request"], phase, carry)
                    tokens = {c: rows[c] for c in ("request", "position", *_TOKEN_FIELDS) if c in rows}
                    tokens.update(phase=phase, step=step)
                    writer.append(tokens, rows["experts"], rows["weights"])
            if batch is None:
                break
    except BaseException as e:
        writer.abort()
        if isinstance(e, pa.ArrowException):  # the file changed since pass 1 checked it
            raise _locate(src, seen, fields, kinds, ctx) from None
        raise
    finally:
        bar.close()
    return writer.close()
