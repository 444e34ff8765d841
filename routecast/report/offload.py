"""Demo-report section: offloaded inference of the trace's model, tokens/s vs budget per strategy.

Small settings (the demo must stay quick): 1 validation-split prompt x 8 new tokens, one request at a time,
one run per configuration, budgets 25 / 50 / 75% of the routed experts, strategies LRU without prefetch,
LRU + PROBE-lookahead prefetch (the untrained frozen-gate prior: no fitting in the demo) and LRU + eMoE's
fallback (runtime/offload/fallback.py: its greedy-token agreement with all-resident is its quality cost), plus
the all-resident model. The figures come from routecast.runtime.offload.run; this module lays them out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from routecast.report.html import Section, figure, paragraph, table
from routecast.report.plots import save_figure
from routecast.trace.trace import Trace

BUDGETS = (25, 50, 75)
STRATEGIES = ("none", "lookahead")
ROUNDS = 3  # interleaved rounds; the plot shows their median and min-max


def offload_sweep(model: str, *, prompts: str = "corpus:val:1", max_new_tokens: int = 8,
                  budgets: tuple[int, ...] = BUDGETS, strategies: tuple[str, ...] = STRATEGIES,
                  rounds: int = ROUNDS) -> list[dict[str, Any]]:
    """`rounds` interleaved rounds of one run per (strategy, budget %) plus all-resident and the fallback -> rows:
    strategy, budget_pct, tokens_per_s (median over the rounds), tokens_per_s_min / _max, hit_ratio, mb_read,
    stall_share, rerouted (fallback's share of routed slots), agreement (share of generated tokens equal to
    all-resident's), identical (every round)."""
    import statistics

    from routecast.runtime.offload.fallback import token_agreement
    from routecast.runtime.offload.run import encode_prompts, make_predictor, run_config
    from routecast.trace.capture_arch import spec_from_model
    from routecast.trace.capture_inputs import load_model, load_prompts

    m, tok = load_model(model)
    spec = spec_from_model(m)
    reqs = encode_prompts(tok, load_prompts(prompts, tok), max_new_tokens)
    preds = {s: make_predictor(s, m, model) for s in strategies}
    run_config(model, reqs[:1], budget=None, loaded=(m, tok))  # warm-up: the first generate pays one-off set-up
    configs = [("all-resident", 100, None)] + [(s, pct, max(1, int(round(pct / 100 * spec.num_layers * spec.num_experts))))
                                                for s in (*strategies, "fallback") for pct in budgets]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {(s, p): [] for s, p, _ in configs}
    for _ in range(rounds):  # interleaved: a load spike hits one run of each configuration, not one configuration
        for s, pct, b in configs:
            fb = s == "fallback"
            runs[(s, pct)].append(run_config(model, reqs, budget=b, prefetch="none" if fb or b is None else s,
                                             predictor=None if fb or b is None else preds[s], loaded=(m, tok),
                                             cfg_kw=None if b is None else {"verify": False, "fallback": fb}))
    ref = runs[("all-resident", 100)][0]
    rows = []
    for s, pct, b in configs:
        rs = runs[(s, pct)]
        tps = [r["tokens_per_s"] for r in rs]
        name = ("all-resident" if b is None else "lru + eMoE fallback" if s == "fallback" else "lru" if s == "none"
                else f"lru + {s} prefetch")
        rows.append({"strategy": name, "budget_pct": pct, "tokens_per_s": statistics.median(tps),
                     "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
                     "hit_ratio": statistics.median(r["hit_ratio"] for r in rs),
                     "mb_read": statistics.median(r["bytes_read"] for r in rs) / 1e6,
                     "stall_share": statistics.median(r["stall_share"] for r in rs),
                     "tier": rs[0].get("tier_mode", "-"), "rerouted": rs[0].get("rerouted_share", 0.0),
                     "agreement": token_agreement(ref["tokens"], rs[0]["tokens"]),
                     "identical": all(r["tokens"] == ref["tokens"] for r in rs)})
    return rows


def plot_sweep(rows: list[dict[str, Any]], png: str | Path) -> str:
    fig = Figure(figsize=(6, 3.4))
    ax = fig.add_subplot()
    for name in dict.fromkeys(r["strategy"] for r in rows if r["strategy"] != "all-resident"):
        pts = [r for r in rows if r["strategy"] == name]
        x, y = [r["budget_pct"] for r in pts], [r["tokens_per_s"] for r in pts]
        err = [[r["tokens_per_s"] - r["tokens_per_s_min"] for r in pts], [r["tokens_per_s_max"] - r["tokens_per_s"] for r in pts]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=name)
    ref = next(r["tokens_per_s"] for r in rows if r["strategy"] == "all-resident")
    ax.axhline(ref, color="k", ls="--", lw=0.8, label="all-resident")
    ax.set_xlabel("budget (% of routed experts in memory)")
    ax.set_ylabel("tokens/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return str(save_figure(fig, str(png)))


def section_offload(trace: Trace, out_dir: str | Path) -> tuple[Section, dict[str, Any]]:
    """The section for the demo: runs the trace's model (a built-in one) offloaded; a synthetic trace has no model."""
    model = str((trace.provenance or {}).get("model", ""))
    sec = Section(key="offload", title="Offloaded inference (measured on this machine)")
    if model.lower() not in ("builtin", "builtin-fine"):
        sec.parts.append(paragraph(f"Not run: the trace was not captured from a built-in model ({model or 'synthetic'}), "
                                   "so there is no checkpoint to offload."))
        return sec, {"skipped": True}
    rows = offload_sweep(model)
    png = plot_sweep(rows, Path(out_dir) / "offload.png")
    tier = next((r["tier"] for r in rows if "tier" in r), "")
    sec.parts.append(paragraph(
        f"{model} generating greedily with at most the given share of its routed experts in memory; the others are "
        f"read from its safetensors file on demand ({tier} reads, so the page cache does not hide the disk). Small "
        f"demo settings: 1 prompt x 8 new tokens, median of {ROUNDS} interleaved rounds (bars: min-max), one loaded "
        "model reused (noisy on a shared machine); prefetch uses PROBE's "
        "untrained lookahead (the next layer's router applied to this layer's router input). 'identical' compares "
        "the generated tokens with the all-resident model's; the eMoE fallback routes a token to the best expert in "
        "memory instead of loading a missing one, and its 'agreement' (share of generated tokens equal to "
        "all-resident's) and 'rerouted' share are its quality cost. benchmarks/offload.py and "
        "benchmarks/offload_fallback.py measure the full tables."))
    sec.parts.append(table(rows))
    sec.parts.append(figure(png, f"Tokens/s vs memory budget per strategy (median of {ROUNDS} rounds, min-max)."))
    return sec, {"rows": rows}
