"""Serving-simulation figures and the demo report's serving section (numbers from the serving simulator, routecast.serve).

    plot_rates(rows, png, title)      mean end-to-end latency and SLO attainment vs arrival rate, per scheduler
    plot_lar(rows, png, title)        throughput under SLO vs local activation rate (Speculative MoE end to end)
    section_serving(trace, out)       demo: the trace's request lengths on the Mixtral-8x7B profile, 4 schedulers
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from routecast.report.html import Section, figure, paragraph, table
from routecast.report.plots import save_figure

STYLE = {"fcfs": ("tab:gray", "s"), "vllm": ("tab:red", "v"), "fastgen": ("tab:blue", "o"), "emoe": ("tab:green", "D")}


def plot_rates(rows: Sequence[dict[str, Any]], png: str | Path, *, title: str = "", label_key: str = "scheduler") -> str:
    """Two panels over arrival rate: mean E2E latency (log) and SLO attainment, one line per rows[label_key]."""
    fig = Figure(figsize=(8, 3.4))
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for name in dict.fromkeys(r[label_key] for r in rows):
        rs = sorted((r for r in rows if r[label_key] == name), key=lambda r: r["rate"])
        color, marker = STYLE.get(str(name).split("@")[0], (None, "."))
        if "@" in str(name):
            color = "tab:olive"
        x = [r["rate"] for r in rs]
        ax1.plot(x, [r["e2e_mean_s"] for r in rs], marker=marker, color=color, label=name, lw=1.2, ms=4)
        ax2.plot(x, [100 * r["slo_attainment"] for r in rs], marker=marker, color=color, label=name, lw=1.2, ms=4)
    ax1.set_yscale("log")
    ax1.set_xlabel("arrival rate (requests/s)")
    ax1.set_ylabel("mean end-to-end latency (s)")
    ax2.set_xlabel("arrival rate (requests/s)")
    ax2.set_ylabel("SLO attainment (%)")
    ax2.set_ylim(-3, 103)
    ax1.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return str(save_figure(fig, png))


def plot_lar(rows: Sequence[dict[str, Any]], png: str | Path, *, title: str = "") -> str:
    """Throughput under SLO (tokens/s) vs LAR, one line per rows['setting']."""
    fig = Figure(figsize=(5, 3.4))
    ax = fig.add_subplot()
    for name in dict.fromkeys(r["setting"] for r in rows):
        rs = sorted((r for r in rows if r["setting"] == name), key=lambda r: r["lar"])
        ax.plot([r["lar"] for r in rs], [r["throughput_under_slo"] for r in rs], marker="o", label=name, lw=1.2, ms=4)
    ax.set_xlabel("local activation rate (LAR)")
    ax.set_ylabel("throughput under SLO (tokens/s)")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return str(save_figure(fig, png))


def section_serving(trace: Any, out: Path, *, requests: int = 800, seed: int = 0) -> tuple[Section, dict[str, Any]]:
    """Demo section: the trace's requests (prompt / output lengths, tasks) resampled to `requests` Poisson arrivals,
    served on the Mixtral-8x7B profile on H100s by each scheduler at six rates up to the engine's capacity."""
    from routecast.serve.engine import EngineConfig, build_engine
    from routecast.serve.loop import simulate
    from routecast.serve.sched import SCHEDULERS, make_scheduler
    from routecast.serve.sweep import capacity_rps, under_slo
    from routecast.serve.workload import Requests, resample

    base = Requests.from_trace(trace)
    # Every prompt must fit one step's token budget (4096 by default); a trace with longer prompts (a synthetic
    # DeepSeek-V3 one reaches ~9k tokens) gets the next power of two above its longest prompt, said in the text.
    budget = max(4096, 1 << int(base.prompt.max()).bit_length())
    engine = build_engine(EngineConfig(model="mixtral-8x7b", hardware="h100-sxm", samples=4, seed=seed,
                                       token_budget=budget))
    cap = capacity_rps(engine, resample(base, requests, 1.0, seed=seed))
    rates = [round(float(f * cap), 3) for f in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)]
    rows = []
    for rate in rates:
        req = resample(base, requests, rate, seed=seed)
        for s in SCHEDULERS:
            m = simulate(engine, req, make_scheduler(s)).metrics()
            rows.append({"scheduler": s, "rate": rate, **m})
    png = plot_rates(rows, Path(out) / "serving.png",
                     title=f"{engine.model.name} profile on {engine.gpus} x {engine.hw.name}, trace request lengths")
    best = under_slo(rows, 0.9)
    at = [r for r in rows if r["rate"] == rates[3]]
    e2e = {r["scheduler"]: r["e2e_mean_s"] for r in at}
    summary = {"capacity_rps": cap, "throughput_under_slo": best,
               "e2e_mean_s_at_capacity": e2e, "requests": requests}
    keep = ("scheduler", "rate", "throughput_tok_s", "slo_attainment", "ttft_p90_s", "tpot_p90_s", "e2e_mean_s",
            "tbt_p90_s")
    sec = Section("serving", "Serving simulation: request schedulers", [
        paragraph(f"The demo trace's {base.n} requests (their prompt and output lengths and tasks) resampled to "
                  f"{requests} Poisson arrivals per rate (small setting for the demo; `routecast serve-sim` and "
                  f"`benchmarks/serve_sim.py` run more), served on the {engine.model.name} profile on {engine.gpus} x "
                  f"{engine.hw.name} by FCFS (request-level batches), vLLM-style continuous batching (prefill-only "
                  f"steps), FastGen-style mixed steps and eMoE's Algorithm 1 on mixed steps. SLO: 5x each request's "
                  f"idle TTFT and TPOT. Capacity ~{cap:.1f} requests/s. Token budget {budget} per step"
                  f"{' (raised to fit the longest prompt)' if budget > 4096 else ''}."),
        figure(png, "Mean end-to-end latency and SLO attainment vs arrival rate"),
        table([{k: r[k] for k in keep} for r in rows if r["rate"] in (rates[2], rates[3], rates[4])]),
        paragraph("Throughput under SLO (>= 90% attainment), tokens/s: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in best.items()) + "."),
    ])
    return sec, summary
