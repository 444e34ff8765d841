"""PROBE vs EPLB presentation: the throughput-over-steps figure and the demo report's PROBE section.

The numbers come from routecast.place.compare (compare_methods, summarize, throughput_series); this module only
draws and lays them out, so place/ never imports report/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from routecast.common.errors import ConfigError
from routecast.place.compare import compare_methods, summarize, throughput_series
from routecast.report.html import Section, figure, paragraph, table
from routecast.report.plots import save_figure
from routecast.sim.hardware import Hardware, load_hardware
from routecast.sim.models import ModelProfile, load_model
from routecast.trace.trace import Trace


def plot_throughput(res: dict[str, Any], png: str, *, shift_step: int = -1, title: str = "",
                    model_layers: int | None = None) -> str:
    """Throughput over steps per method (PROBE Figure 9 style) of a compare_methods result -> writes png, returns it."""
    fig = Figure(figsize=(7, 3.6))
    ax = fig.add_subplot()
    for name, y in throughput_series(res, model_layers=model_layers).items():
        ax.plot(np.arange(y.size), y / 1e3, label=name, lw=1.3)
    if shift_step >= 0:
        ax.axvline(shift_step, color="k", ls="--", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("simulated throughput (k tokens/s, MoE layers)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    return str(save_figure(fig, png))


def section_probe(trace: Trace, out_dir: str, *, ep: int = 8, hw: Hardware | None = None,
                  model: ModelProfile | None = None, shift_step: int = -1,
                  max_steps: int | None = None) -> tuple[Section, dict[str, Any]]:
    """Demo-report section: compare_methods on `trace` -> (Section, summary dict).

    hw defaults to h100-sxm; model to the sim profile with the trace's expert count (mixtral-8x7b for 8,
    deepseek-v2-lite for 64). max_steps: compare only the trace's first max_steps steps (None = all; the
    section text says when it cuts). Writes probe_vs_eplb.png into out_dir.
    """
    hw = hw or load_hardware("h100-sxm")
    if model is None:
        by_e = {8: "mixtral-8x7b", 64: "deepseek-v2-lite", 128: "gpt-oss-120b", 256: "deepseek-v3"}
        name = by_e.get(trace.spec.num_experts)
        if name is None:
            raise ConfigError(f"trace has {trace.spec.num_experts} experts; pass a model profile with that many.")
        model = load_model(name)
    steps = np.unique(trace.tokens["step"])
    cut = ""
    if max_steps is not None and steps.size > max_steps:
        trace = trace.select(trace.tokens["step"] <= steps[max_steps - 1])
        cut = f" Only the first {max_steps} of the trace's {steps.size} steps are compared (a demo setting, for time)."
    res = compare_methods(trace, ep=ep, hw=hw, model=model)
    rows = summarize(res, shift_step=shift_step)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    png = plot_throughput(res, str(Path(out_dir) / "probe_vs_eplb.png"), shift_step=shift_step,
                          title=f"{model.name} profile, EP {ep}, {hw.name}")
    sec = Section(key="probe", title="PROBE vs EPLB (simulated)")
    sec.parts.append(paragraph(
        f"Per step and layer of the trace ({res['settings']['steps']} steps), each method's per-rank assignment "
        f"is priced by the layer cost model on {hw.name} with the {model.name} profile at EP {ep}, including the "
        "part of its expert-weight transfers (PROBE's replicas every step, EPLB's rebalances) that its hiding "
        "window (the rank's expert compute of the previous layer plus this layer's attention) cannot hide. "
        "probe_pred plans on a causal layer-ahead forecast (this step's previous-layer routing through past "
        "steps' inter-layer transitions); probe_oracle on the actual loads." + cut))
    sec.parts.append(table(rows))
    sec.parts.append(figure(png, "Simulated throughput over steps (MoE layers only)."))
    return sec, {"rows": rows, "settings": res["settings"]}
