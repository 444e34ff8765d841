"""`routecast place compare`: static EP, EPLB and PROBE on a trace's own steps, each step priced by its regime.

The parser stays in routecast/cli.py (it shares the package's flag helpers, and hands in report/'s plot);
this module runs the command:
the per-method summary of place.compare (IR, skew, latency, bytes, planner time), then prefill, decode and
mixed steps apart with each method's saving against static EP and the bounds of both objectives
(place.regimes), the throughput plot, summary.json and regimes.json.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from routecast.common.errors import ConfigError


def profile_for(trace: Any, load_model: Any) -> Any:
    """The model profile a trace prices as when --model-profile is not given.

    A trace from the built-in model prices as that model; otherwise match the expert count. builtin-fine's
    98 KB experts would make every placement cost the same latency floor: it prices as DeepSeek-V2-Lite,
    the production model with its routed geometry (64 experts top-6), as the demo and benchmarks do.
    """
    name = "builtin" if trace.spec.name == "builtin" else {
        8: "mixtral-8x7b", 64: "deepseek-v2-lite", 128: "qwen3-235b-a22b", 256: "deepseek-v3"}.get(trace.spec.num_experts)
    if name is None:
        raise ConfigError(
            f"no model profile matches a trace with {trace.spec.num_experts} experts; pass --model-profile."
        )
    return load_model(name)


def compare_main(a: argparse.Namespace, plot_throughput: Callable[..., str]) -> int:
    """Run the command; plot_throughput: report.placement's plot (handed in by routecast/cli.py, as place/ sits
    below report/)."""
    from routecast.common.outputs import check_out_dir, os_error, write_atomic
    from routecast.place.compare import compare_methods, summarize
    from routecast.place.regimes import compare_regimes, regime_lines
    from routecast.sim.hardware import capacity_note, load_hardware
    from routecast.sim.models import load_model
    from routecast.trace.io import read_trace

    out = check_out_dir(a.out, "--out", overwrite=a.overwrite)
    trace = read_trace(a.trace, load_hidden=False)
    hw = load_hardware(a.hardware)
    model = load_model(a.model_profile) if a.model_profile else profile_for(trace, load_model)
    if model.num_experts != trace.spec.num_experts:
        raise ConfigError(f"--model-profile {model.name} has {model.num_experts} experts and --trace {a.trace} "
                          f"routes over {trace.spec.num_experts}; expected a profile with the trace's expert count.")
    if a.shift_step >= 0 and trace.num_tokens and a.shift_step > int(trace.step.max()):
        raise ConfigError(f"--shift-step {a.shift_step} is beyond the trace's last step {int(trace.step.max())}; "
                          "expected a step inside the trace (or -1 for no shift).")
    res = compare_methods(trace, ep=a.ep, hw=hw, model=model)
    rows = summarize(res, shift_step=a.shift_step, model_layers=model.num_layers)
    regimes = compare_regimes(res, trace, ep=a.ep, model=model, hw=hw)
    note = capacity_note(model, hw, a.ep)
    try:
        out.mkdir(parents=True, exist_ok=True)
        png = plot_throughput(res, str(out / "throughput.png"), shift_step=a.shift_step,
                              model_layers=model.num_layers)
    except OSError as e:
        raise os_error(e, "--out", out) from None
    write_atomic(out / "summary.json", json.dumps(rows, indent=2, default=float), "--out")
    write_atomic(out / "regimes.json", json.dumps(regimes, indent=2, default=float), "--out")
    if a.json:
        print(json.dumps(rows, indent=2, default=float))  # the summary rows; the regimes are in regimes.json
    else:
        cols = list(rows[0])
        print("  ".join(f"{c:>14}" for c in cols))
        for r in rows:
            print("  ".join(f"{v:>14.4g}" if isinstance(v, float) else f"{v!s:>14}" for v in r.values()))
        print("\n".join(regime_lines(regimes)))
    if note:
        print(f"note: {note}")
    print(f"wrote {png}, {out / 'summary.json'} and {out / 'regimes.json'}")
    return 0
