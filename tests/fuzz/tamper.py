"""Tampered traces for tests and the bad-input sweep: change routing values in a committed shard, in place,
and record the new CRC-32 in trace.json so the checksum matches (what an edit of both files would leave).

Only the bytes of one tensor change; the file keeps its size and header, so every structural check passes
and only the value checks can catch it.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

_DT = {"I16": np.int16, "F32": np.float32, "F16": np.float16}


def tamper_shard(trace_dir: str | Path, shard: int, tensor: str, edit: Callable[[np.ndarray], None]) -> Path:
    """Apply edit (in place, on a writable copy of `tensor` of shard number `shard`), write the bytes back
    and update that shard's crc32 in trace.json to match. -> the shard file."""
    d = Path(trace_dir)
    meta = json.loads((d / "trace.json").read_text())
    f = d / meta["shards"][shard]["file"]
    raw = bytearray(f.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    ent = json.loads(raw[8 : 8 + n])[tensor]
    a, b = (8 + n + o for o in ent["data_offsets"])
    arr = np.frombuffer(bytes(raw[a:b]), _DT[ent["dtype"]]).reshape(ent["shape"]).copy()
    edit(arr)
    raw[a:b] = arr.tobytes()
    f.write_bytes(bytes(raw))
    meta["shards"][shard]["crc32"] = zlib.crc32(bytes(raw))
    (d / "trace.json").write_text(json.dumps(meta, indent=1))
    return f


def set_value(t: int, layer: int, k: int, value: float) -> Callable[[np.ndarray], None]:
    """An edit that sets one (token row, layer, slot) value of a (T, L, K) tensor."""

    def edit(a: np.ndarray) -> None:
        a[t, layer, k] = value

    return edit


def duplicate_first(t: int, layer: int) -> Callable[[np.ndarray], None]:
    """An edit that copies a token's first expert id into its second top-k slot (a duplicate id)."""

    def edit(a: np.ndarray) -> None:
        a[t, layer, 1] = a[t, layer, 0]

    return edit
