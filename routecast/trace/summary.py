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
from routecast.trace.io import (
    TRACE_JSON,
    WRITER_JSON,
    _load_json,
    _read_meta,
    _shard_files,
    _trace_dir,
    _unfinished,
    read_shard,
    read_trace,
    verify_trace,
)
from routecast.trace.trace import DECODE, PREFILL, Trace


def _counts(col: np.ndarray, names: tuple[str, ...]) -> dict[str, int]:
    n = np.bincount(col.astype(np.int64) + 1, minlength=len(names) + 1)
    return {name: int(c) for name, c in zip(("(unknown)", *names), n, strict=True) if c}


def inspect_trace(path: str | os.PathLike) -> dict[str, Any]:
    """Summary of a trace directory for `routecast inspect`; never raises on a damaged trace.

    Keys: path, state ('finished' | 'unfinished' | 'missing'), valid (read_trace would succeed), error
    (one sentence or None), bytes_on_disk, spec, provenance, task_names, source_names, tensors, shards
    [{file, rows, bytes}], num_tokens, num_requests, num_steps, tokens_by_phase / _task / _source.
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
    except OSError as e:
        info["error"] = f"{d}: cannot be read ({e.strerror or e}); expected a readable trace directory."
    return info
