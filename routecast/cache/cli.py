"""`routecast cache replay`: parse, run cache.forecasts.run_replay, print the table (time first), write JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from routecast.cache.forecasts import run_replay

_COLS = (("policy", "policy", "{}"), ("us_per_token", "µs/token", "{:.2f}"),
         ("time_gap_closed", "time gap closed", "{:.1%}"), ("hit_ratio", "hit", "{:.3f}"),
         ("bytes_per_token", "bytes/token", "{:.0f}"), ("pf_unused", "prefetch unused B/token", "{:.0f}"),
         ("demand_stall_share", "demand stall share", "{:.2f}"), ("gap_closed", "hit gap closed", "{:.1%}"))


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """Fixed-width table of replay rows (the ones marked 'shown'), in the rows' order (fastest first)."""
    def cell(r: dict[str, Any], k: str, f: str) -> str:
        tok = r["bytes_moved"] / r["bytes_per_token"] if r.get("bytes_per_token") else 0
        v = {"pf_unused": r.get("prefetch_bytes_unused", 0.0) / tok if tok else None}.get(k, r.get(k))
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f.format(v)

    cells = [[h for _, h, _ in _COLS]] + [[cell(r, k, f) for k, _, f in _COLS] for r in rows if r.get("shown", True)]
    w = [max(len(c[i]) for c in cells) for i in range(len(_COLS))]
    lines = ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(line)) for line in cells]
    lines.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(lines)


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        return None if not math.isfinite(v) else v
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def cache_replay_main(trace_path: str | Path, *, out: str | Path | None = None, as_json: bool = False,
                      **kw: Any) -> int:
    """`routecast cache replay TRACE --budget 50% --policies ...`: prints the table (or JSON), writes JSON."""
    from routecast.common.outputs import check_out_file, write_atomic
    from routecast.predict.evaluate import NEEDS_ROUTER_INPUTS
    from routecast.trace.io import read_trace

    if out:  # before any work: a directory or an unwritable place is refused, nothing left behind
        check_out_file(out, "--out")
    routers = kw.get("predictor") in NEEDS_ROUTER_INPUTS
    trace = read_trace(trace_path, load_hidden=routers or bool(kw.get("reuse_probe")), load_logits=routers)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)  # the temporary files go next to the output
    res = run_replay(trace, tmp_dir=Path(out).parent if out else None, **kw)
    text = json.dumps(_clean(res), indent=1)
    if out:
        write_atomic(out, text, "--out")
    if as_json:
        print(text)
    else:
        st = res["settings"]
        print(f"budget {st['budget_slots']} of {st['layers'] * st['experts']} experts ({st['budget_fraction']:.0%}), "
              f"{st['hardware']}, {st['replayed_tokens']} tokens replayed"
              + (f"; forecast: {st['predictor']}" if st["predictor"] else ""))
        print("ranked by simulated µs per token; time gap closed = (LRU µs - policy µs) / (LRU µs - Belady µs)")
        print(format_rows(res["rows"]))
        if out:
            print(f"wrote {out}")
    return 0
