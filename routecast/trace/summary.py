"""`routecast inspect`: a summary of a trace directory, finished or not, that never raises on a damaged one.

Reads through trace/io.py (metadata, shards, CRC-32 and value checks) and counts tokens per phase, task
and source.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import TraceError
from routecast.trace.checks import value_problems
from routecast.trace.io import (
    TRACE_JSON,
    WRITER_JSON,
    _load_json,
    _load_shard,
    _read_meta,
    _shard_files,
    _trace_dir,
    _unfinished,
    read_shard,
    read_trace,
    verify_trace,
)
from routecast.trace.lazy import crc32_of
from routecast.trace.trace import DECODE, PREFILL, Trace


def _counts(col: np.ndarray, names: tuple[str, ...]) -> dict[str, int]:
    n = np.bincount(col.astype(np.int64) + 1, minlength=len(names) + 1)
    return {name: int(c) for name, c in zip(("(unknown)", *names), n, strict=True) if c}


def inspect_trace(path: str | os.PathLike) -> dict[str, Any]:
    """Summary of a trace directory for `routecast inspect`; never raises on a damaged trace.

    Keys: path, state ('finished' | 'unfinished' | 'missing'), valid (read_trace would succeed), error
    (one sentence or None), bytes_on_disk, spec, provenance, task_names, source_names, tensors, shards
    [{file, rows, bytes}], problems (only when a finished trace fails: every bad-value kind per shard, see
    shard_problems), num_tokens, num_requests, num_steps, tokens_by_phase / _task / _source.
    """
    d = Path(path)
    info: dict[str, Any] = {"path": str(d), "state": "missing", "valid": False, "error": None}
    try:
        d = _trace_dir(d)
        info["bytes_on_disk"] = sum(p.stat().st_size for p in d.iterdir() if p.is_file())
        if (d / TRACE_JSON).is_file() or not ((d / WRITER_JSON).is_file() or _shard_files(d)):
            info["state"] = "finished"
            m, spec = _read_meta(d)
            info.update(spec=spec.to_dict(), **{k: m[k] for k in ("provenance", "task_names", "source_names",
                                                                   "tensors", "shards")})
            trace = read_trace(d, verify=True)
            # inspect always checks every shard: CRC-32 against trace.json and the value checks
            info["shards_verified"] = verify_trace(trace)
            info["checksums"] = "crc32" if all("crc32" in s for s in m["shards"]) else "not recorded (older trace)"
        else:
            info["state"], info["error"] = "unfinished", _unfinished(d / TRACE_JSON)
            if (d / WRITER_JSON).is_file():
                r = _load_json(d / WRITER_JSON)
                info.update({k: r.get(k) for k in ("spec", "provenance", "task_names", "source_names")})
            files = _shard_files(d)
            parts = [read_shard(f) for f in files]
            info["shards"] = [{"file": f.name, "rows": p.num_tokens, "bytes": f.stat().st_size}
                              for f, p in zip(files, parts, strict=True)]
            info["num_tokens"] = sum(p.num_tokens for p in parts)
            if not parts:
                return info
            trace = Trace.concat(parts)
            info.update(spec=trace.spec.to_dict(), task_names=list(trace.task_names),
                        source_names=list(trace.source_names))
        tok = trace.tokens
        info.update(num_tokens=trace.num_tokens, num_requests=int(np.unique(tok["request"]).size),
                    num_steps=int(np.unique(tok["step"]).size),
                    tokens_by_phase={"prefill": int((tok["phase"] == PREFILL).sum()),
                                     "decode": int((tok["phase"] == DECODE).sum())},
                    tokens_by_task=_counts(tok["task"], trace.task_names),
                    tokens_by_source=_counts(tok["source"], trace.source_names),
                    valid=info["state"] == "finished")
    except TraceError as e:
        info["error"] = str(e)
        if info["state"] == "finished" and "shards" in info:
            info["problems"] = shard_problems(d)
    except OSError as e:
        info["error"] = f"{d}: cannot be read ({e.strerror or e}); expected a readable trace directory."
    return info


def shard_problems(d: Path) -> list[dict[str, Any]]:
    """Every bad-value kind in every shard of a finished trace directory d, whatever its CRC-32 says.

    -> [{file, kind, field, rows, first_row, layer, value}] with kind 'out-of-range', 'duplicate',
    'non-finite' or 'negative' (checks.value_problems), or 'checksum' (bytes differ from trace.json's CRC-32).
    A shard whose header or size is wrong is left out (the error already names it).
    """
    m, spec = _read_meta(d)
    out: list[dict[str, Any]] = []
    for s in m["shards"]:
        f = d / s["file"]
        try:
            arrays, info = _load_shard(f, spec, rows=s["rows"], nbytes=s["bytes"], layout=m["tensors"])
        except (TraceError, OSError):
            continue
        floats = {k: arrays[k] for k in ("logits_TLE", "hidden_TLH") if k in arrays}
        found = value_problems(arrays["experts_TLK"], arrays["weights_TLK"], spec.num_experts, floats)
        if s.get("crc32") is not None and crc32_of(info["raw"]) != s["crc32"]:
            found.append({"kind": "checksum", "field": "CRC-32", "rows": None, "first_row": None})
        out += [{"file": str(f), **p} for p in found]
    return out


def inspect_lines(info: dict[str, Any]) -> list[str]:
    """The text form of inspect_trace's summary: one 'key: value' line per field, one line per problem.

    Long arrays (e.g. the routers' correction bias) print as their shape; the error is left out (the CLI
    prints it on stderr)."""
    lines = []
    for k, v in info.items():
        if k == "problems":
            for q in v:
                n = "" if q["rows"] is None else f" in {q['rows']} row(s)"
                at = "" if q["first_row"] is None else f", first at token row {q['first_row']}" + (
                    "" if q.get("layer") is None else f" layer {q['layer']}") + f" (value {q['value']})"
                lines.append(f"{'problem':>16}: {q['file']}: {q['kind']} {q['field']}{n}{at}")
            continue
        if isinstance(v, dict):
            v = {kk: f"<{np.shape(vv)} array; see --json>" if isinstance(vv, list) and np.size(vv) > 16 else vv
                 for kk, vv in v.items()}
        if k != "error":
            lines.append(f"{k:>16}: {v}")
    return lines
