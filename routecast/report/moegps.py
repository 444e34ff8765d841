"""MoE-GPS in the report: Figures 4, 6 and 7 as PNGs, and the demo section (predictors, fits, advice).

    plot_figure6(grid, path)                    stacked latency per strategy and accuracy, per skewness group
    plot_figure7(skewness, gbps, values, path)  dist-only saving - best token-to-expert saving, per bandwidth
    plot_accuracy_overhead(points, ...)         Figure 4's two panels for measured (and reference) predictors
    section_moegps(trace, out_dir)              -> (Section, summary dict) for `routecast demo`

Figures use matplotlib's object API on the Agg canvas (no pyplot state), like report/plots.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from routecast.advise.moegps import (
    FIG7_GBPS,
    PARTS,
    Grid,
    advise,
    figure7,
    moe_gps_setting,
    sweep,
    trace_skewness,
)
from routecast.common.errors import ConfigError
from routecast.report.html import Section, figure, paragraph, table
from routecast.report.plots import save_figure
from routecast.sim.fits import (
    FIG4_ESTIMATE,
    ExponentialFit,
    PolynomialFit,
    measure_predictors,
    measured_overhead_curve,
    paper_overhead_curve,
)

if TYPE_CHECKING:
    from routecast.trace.trace import Trace

DPI = 110
COLORS = {"attention": "#4c72b0", "attention_comm": "#9dbbe0", "ffn": "#dd8452", "ffn_comm": "#f3c29b",
          "overhead": "#55a868", "replication": "#c44e52"}
LABELS = {"attention": "Attn layers", "attention_comm": "Attn comm", "ffn": "FFN", "ffn_comm": "FFN comm",
          "overhead": "Overhead", "replication": "Replica transfer"}
FIG6_SKEWS = (1.0, 1.4, 1.8, 2.2)
FIG7_SKEWS = (1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2)
# (model profile, hardware, gpus, link) the demo asks the advisor about.
ADVICE_PAIRS = (("mixtral-8x7b", "a100-sxm-80gb", 4, "nvlink"), ("mixtral-8x7b", "a100-sxm-80gb", 4, "pcie"),
                ("deepseek-v3", "h100-sxm", 8, "nvlink"))
# The LSTM is left out of the demo: its harness pass alone takes tens of seconds on one core.
DEMO_PREDICTORS = ("distribution", "probability", "conditional-token", "conditional-position", "ffn")


def plot_figure6(grid: Grid, path: str | Path, *, title: str = "", clip: float = 1.6) -> Path:
    """Grid (S skewness x A accuracies) -> PNG of MoE-GPS Figure 6 (b)/(d) at path. Returns the path.

    Per skewness group: no prediction, distribution-only, then token-to-expert at each accuracy, stacked by
    component and normalised to that group's no-prediction latency; a line joins the token bars (the U) and
    a red triangle marks its bottom. Bars above `clip` are cut at the axis and labelled with their value.
    """
    S, A = grid.token["total"].shape
    if S == 0 or A == 0:
        raise ConfigError("plot_figure6: grid has no skewness or no accuracy; expected a sweep() result.")
    nb, gap = A + 2, 1.5
    base = grid.none["total"][:, None]
    parts = [p for p in PARTS if p != "replication" or np.any(grid.token[p] > 0) or np.any(grid.distribution[p] > 0)]
    x = np.arange(S)[:, None] * (nb + gap) + np.arange(nb)[None, :]  # (S, nb)
    fig = Figure(figsize=(max(8.0, 0.26 * x.size), 4.8))
    ax = fig.add_subplot()
    bottom = np.zeros((S, nb))
    for p in parts:
        v = np.concatenate([grid.none[p][:, None], grid.distribution[p][:, None], grid.token[p]], axis=1) / base
        ax.bar(x.ravel(), v.ravel(), bottom=bottom.ravel(), width=0.85, color=COLORS[p], label=LABELS[p])
        bottom += v
    top = min(float(bottom.max()), clip) * 1.06
    for s in range(S):
        ax.plot(x[s, 2:], np.minimum(bottom[s, 2:], top), color="black", linewidth=1.0)
        b = 2 + int(grid.best_token[s])
        ax.plot(x[s, b], bottom[s, b] + 0.02 * top, marker="v", color="red", markersize=6)
        for j in np.flatnonzero(bottom[s] > top):
            ax.text(x[s, j], top * 0.97, f"{bottom[s, j]:.1f}", rotation=90, ha="center", va="top", fontsize=6)
    ax.set_ylim(0, top)
    ax.axhline(1.0, color="gray", linewidth=0.7, linestyle=":")
    ticks = ["none", "dist"] + [f"{a:.2f}" if j in (0, A - 1) else "" for j, a in enumerate(grid.accuracies)]
    ax.set_xticks(x.ravel(), ticks * S, rotation=90, fontsize=7)
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for s in range(S):
        ax.text(x[s].mean(), 1.01, f"skewness {grid.skewness[s]:.1f}", transform=trans, ha="center", va="bottom",
                fontsize=8)
    ax.set_ylabel("latency / no-prediction latency")
    ax.set_title(title, pad=16)
    ax.legend(loc="lower left", fontsize=7, ncol=len(parts), framealpha=0.9)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_figure7(skewness: Sequence[float], gbps: Sequence[float], values_BS: Any, path: str | Path, *,
                 title: str = "") -> Path:
    """values_BS (B, S): dist-only saving - best token saving per bandwidth (GB/s) and skewness -> PNG at path."""
    v = np.asarray(values_BS, dtype=np.float64)
    s = np.asarray(skewness, dtype=np.float64)
    if v.shape != (len(gbps), s.size):
        raise ConfigError(f"plot_figure7: values have shape {v.shape}; expected ({len(gbps)}, {s.size}) = "
                          "(bandwidths, skewness values).")
    fig = Figure(figsize=(8, 4.2))
    ax = fig.add_subplot()
    w = 0.8 / len(gbps)
    for i, g in enumerate(gbps):
        ax.bar(np.arange(s.size) + (i - (len(gbps) - 1) / 2) * w, 100 * v[i], width=w, label=f"{g:g} GB/s")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(s.size), [f"{x:.1f}" for x in s])
    ax.set_xlabel("skewness")
    ax.set_ylabel("dist-only - token-to-expert saving (%)")
    ax.set_title(title or "above 0: distribution-only wins")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_accuracy_overhead(points: Sequence[tuple[str, float, float, float]], path: str | Path, *,
                           overhead_fit: ExponentialFit | None = None, perf_fit: PolynomialFit | None = None,
                           reference: Sequence[tuple[str, float, float]] = (), title: str = "") -> Path:
    """Figure 4's panels: points (name, accuracy, overhead fraction, normalised performance) with the
    exponential overhead fit and the polynomial performance fit; `reference` points drawn in grey."""
    fig = Figure(figsize=(10, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    grid = np.linspace(0.0, 1.0, 101)
    acc = np.array([p[1] for p in points], dtype=np.float64)
    # Fits are drawn solid over the measured accuracies only; the overhead fit continues dashed (extrapolation).
    inside = np.linspace(acc.min(), acc.max(), 50) if acc.size else grid
    if reference:
        ref = np.array([(a, o) for _, a, o in reference], dtype=np.float64)
        ax1.scatter(ref[:, 0], 100 * ref[:, 1], color="lightgray", edgecolor="gray", s=25,
                    label="MoE-GPS Fig. 4 (estimated)")
    for name, a, o, _ in points:
        ax1.scatter(a, 100 * o, s=30)
        ax1.annotate(name, (a, 100 * o), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if overhead_fit is not None:
        ax1.plot(grid, 100 * overhead_fit(grid), color="black", linewidth=0.8, linestyle="--")
        ax1.plot(inside, 100 * overhead_fit(inside), color="black", linewidth=1.5,
                 label=f"{overhead_fit.a:.2g}·exp({overhead_fit.b:.2f}·acc), r²={overhead_fit.r2:.2f}")
    ax1.set_yscale("log")
    ax1.set_xlabel("top-k accuracy")
    ax1.set_ylabel("overhead (% of forward)")
    ax1.legend(fontsize=7)
    for name, a, _, p in points:
        ax2.scatter(a, p, s=30)
        ax2.annotate(name, (a, p), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if perf_fit is not None:
        ax2.plot(inside, perf_fit(inside), color="black", linewidth=1.5,
                 label=f"degree {perf_fit.deg}, r²={perf_fit.r2:.2f}")
        ax2.legend(fontsize=7)
    ax2.set_xlabel("top-k accuracy")
    ax2.set_ylabel("performance (perfect free predictor = 1)")
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def section_moegps(trace: Trace, out_dir: str | Path, *, predictors: Sequence[str] = DEMO_PREDICTORS,
                   epochs: int = 3, seed: int = 0) -> tuple[Section, dict[str, Any]]:
    """The MoE-GPS demo section: our predictors on the trace, their fits, the advisor on real pairs, Figs 6/7.

    Predictors are fitted on 80% of the source documents (of the requests when the trace records none) and
    scored causally on the requests of the rest (routecast.predict); the
    FFN trains `epochs` epochs and the LSTM is skipped, which keeps this under a minute on one core.
    """
    out = Path(out_dir) / "moegps"
    meas = measure_predictors(trace, predictors, epochs=epochs, seed=seed)
    skew, skew_src = trace_skewness(trace, 512)
    curve = measured_overhead_curve(meas, skew)
    rows = [{"predictor": r["predictor"], "strategy": r["strategy"], "top-k acc": r["top_k_accuracy"],
             "µs/token": r["us_per_token"], "overhead % of forward": 100 * r["overhead_frac"],
             "dist err (test set)": r["distribution_error_total"]} for r in meas.rows]
    advice = [advise(model_profile=m, hardware=h, gpus=g, link=link, predictor_rows=meas, skewness=skew)
              for m, h, g, link in ADVICE_PAIRS]
    adv_rows = [{"model": a.inputs["model"], "hardware": f"{a.inputs['gpus']} x {a.inputs['hardware']}",
                 "link": a.inputs["link"], "pick": a.best.label, "µs/layer": a.best.total_us,
                 "vs none %": 100 * (a.best.total_us / a.baseline.total_us - 1), "comm share %": 100 * a.comm_share,
                 "ideal-placement pick": a.other_placement["label"]} for a in advice]
    # Figure 4 analogue on the measured token predictors, performance simulated for Mixtral on 4 A100 NVLink.
    mix = advice[0]
    oracle = mix.fits["oracle_us"]
    pts = []
    for o in mix.options:
        if o.label.endswith("(measured)"):
            name = o.label.split(": ", 1)[1].removesuffix(" (measured)")
            pts.append((name, o.accuracy, o.overhead_frac, oracle / o.total_us))
    pfit = mix.fits.get("performance_measured")
    pf = PolynomialFit(coef=tuple(pfit["coef"]), r2=pfit["r2"], n=pfit["n"]) if pfit else None
    ref = [(n, a, o) for s in FIG4_ESTIMATE.values() for n, a, o in s]
    png4 = plot_accuracy_overhead(pts, out / "fig4_measured.png", overhead_fit=curve.fits[0], perf_fit=pf,
                                  reference=ref, title=f"our predictors on this trace (skewness {skew:.2f}); performance: Mixtral-8x7B, "
                                        "4 x A100 NVLink, replicas")
    # Figures 6 and 7 price token-to-expert with the overhead curve measured on this trace (same at every skewness).
    figs, headline = [], {}
    for link, tag in (("nvlink", "6b"), ("pcie", "6d")):
        g = sweep(moe_gps_setting(link), skewness=FIG6_SKEWS, overhead=curve)
        figs.append(figure(plot_figure6(g, out / f"fig{tag}.png", title=f"Figure {tag}: Mixtral-8x7B, 4 x A100, "
                                        f"{link}, paper setting, measured overheads"),
                           f"MoE-GPS Figure {tag} regenerated (paper setting, our measured predictor overheads)"))
        headline[link] = {"speedup_at_1.4": float(g.speedup[1]), "best_token_acc": float(g.accuracies[g.best_token[1]])}
    what_if = float(sweep(moe_gps_setting("nvlink"), skewness=[1.4], overhead=paper_overhead_curve()).speedup[0])
    f7 = {}
    for strict in (False, True):
        v = figure7(moe_gps_setting("nvlink", strict=strict), bandwidths=[b * 1e9 for b in FIG7_GBPS],
                    skewness=FIG7_SKEWS, overhead=curve)
        key = "strict" if strict else "paper"
        f7[key] = v
        name = "fig7_strict.png" if strict else "fig7.png"
        figs.append(figure(plot_figure7(FIG7_SKEWS, FIG7_GBPS, v, out / name,
                                        title=f"Figure 7 ({key} model)"), f"MoE-GPS Figure 7, {key} model"))
    fit = curve.fits[0]
    parts = [
        paragraph(f"Predictors {', '.join(predictors)} on {meas.split} (FFN trained {epochs} epochs; the LSTM is "
                  f"skipped to keep this section under a minute). Overhead = predictor µs/token over the model's "
                  f"forward µs/token measured in the same run ({meas.forward_us_per_token:.1f} µs/token at "
                  f"{meas.forward_tokens} tokens; {meas.forward_source})."),
        table(rows),
        paragraph(f"Trace skewness {skew:.2f} ({skew_src}). Overhead fit over the Pareto-efficient token predictors: "
                  f"{fit.a:.3g}·exp({fit.b:.2f}·acc), r² {fit.r2:.2f} on {fit.n} points."),
        figure(png4, "Figure 4 analogue: measured accuracy vs overhead and simulated performance (grey, what-if only: "
                     "the paper's points as we estimate them; the figure itself is not in our copy of the paper)"),
        table(adv_rows),
        *[paragraph(f"{a.inputs['model']}, {a.inputs['gpus']} x {a.inputs['hardware']}, {a.inputs['link']}: "
                    f"{a.explanation}") for a in advice],
        paragraph(f"Reproduction (paper setting: 600 / 64 GB/s link, idealised duplication; token-to-expert overhead "
                  f"from the predictors measured above): at skewness 1.4 on NVLink the best token-to-expert "
                  f"configuration (accuracy {headline['nvlink']['best_token_acc']:.2f}) gives a speedup of "
                  f"distribution-only = token time / distribution time - 1 = {headline['nvlink']['speedup_at_1.4']:+.0%} "
                  f"(MoE-GPS: 23%). What-if, not measured: with the curve fitted to our hand-written estimate of "
                  f"MoE-GPS Figure 4's points it would be {what_if:+.0%}. The strict model (per-direction links, "
                  "replicas that re-read their weights) is in fig7_strict; benchmarks/moe_gps_figures.py has every "
                  "number and the sensitivity to the overhead curve."),
        *figs,
    ]
    summary = {"skewness": skew, "skewness_source": skew_src, "forward_us_per_token": meas.forward_us_per_token,
               "predictors": {r["predictor"]: {"acc": r["top_k_accuracy"], "overhead": r["overhead_frac"]}
                              for r in meas.rows},
               "dist_error": meas.dist_error(), "overhead_fit": fit.as_dict(),
               "advice": {f"{a.inputs['model']}/{a.inputs['hardware']}/{a.inputs['link']}": a.best.label
                          for a in advice},
               "headline_speedup_nvlink_1.4": headline["nvlink"]["speedup_at_1.4"],
               "what_if_estimated_fig4_speedup_nvlink_1.4": what_if,
               "figure7": {k: v.tolist() for k, v in f7.items()}}
    return Section("moegps", "MoE-GPS: which prediction strategy pays", parts), summary
