"""`routecast stats TRACE`: read a trace, compute trace.stats_bundle.routing_stats, print a table or JSON,
write the --plot figure (report.plots.stats_figure). Presentation lives here, so trace/ never imports report/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from routecast.report.plots import stats_figure


def stats_main(
    trace_path: str | Path, *, ep: int = 8, window: int | None = None, as_json: bool = False,
    plot: str | Path | None = None, seq_len: int | None = None, out: TextIO | None = None,
) -> int:
    """Run `routecast stats`: read the trace, compute routing_stats, print table or JSON, write --plot PNG.

    Errors on bad input (missing trace, ep not dividing E, bad window) raise RoutecastError subclasses
    with one sentence; the CLI turns them into exit code 2. Returns 0 on success.
    """
    from routecast.trace.io import read_trace  # lazy: keeps `routecast --help` fast
    from routecast.trace.stats_bundle import format_stats, routing_stats

    stream = sys.stdout if out is None else out
    # Statistics read only the routing ids, weights and token columns: skip hidden states and logits.
    trace = read_trace(trace_path, load_hidden=False, load_logits=False)
    if trace.spec.n_group > 1 and "router_correction_bias_LE" in (trace.provenance or {}):
        # grouped routers whose correction bias the capture recorded: grp!= and bias!= need the logits
        trace = read_trace(trace_path, load_hidden=False, load_logits=True)
    d = routing_stats(trace, ep=ep, window=window, seq_len=seq_len)
    if plot is not None:
        stats_figure(d, plot)
    if as_json:
        stream.write(json.dumps(d, separators=(",", ":")) + "\n")
    else:
        stream.write(format_stats(d) + "\n")
        if plot is not None:
            stream.write(f"plot: {plot}\n")
    return 0
