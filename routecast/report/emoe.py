"""eMoE presentation: the quality-vs-budget figure and the demo report's eMoE section.

The numbers come from routecast.runtime.emoe.quality.run_quality (perplexity with a share of the experts resident
and fallback routing, on the real built-in model); this module draws and lays them out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from routecast.report.html import Section, figure, paragraph, preformatted, table
from routecast.report.plots import save_figure
from routecast.trace.trace import Trace

# Small settings so the section adds ~10 s to the demo: 4 prompts of 32 tokens per task (128 scored tokens per
# task), resident experts chosen again every 5 prompts (each forward runs 5 prompts at once).
DEMO_PER_TASK, DEMO_SEQ_LEN, DEMO_EPOCHS, DEMO_PERIOD = 4, 32, 80, 5
COLORS = {"emoe": "tab:blue", "random": "tab:gray", "lru": "tab:orange", "oracle": "tab:green"}


def plot_quality(res: dict[str, Any], png: str) -> str:
    """Overall perplexity vs share of experts resident, one line per residency choice (period 1) -> png."""
    fig = Figure(figsize=(6, 3.4))
    ax = fig.add_subplot()
    period = min(r["period"] for r in res["rows"])
    for choice in dict.fromkeys(r["choice"] for r in res["rows"]):
        pts = sorted((r["budget"], r["ppl"]) for r in res["rows"] if r["choice"] == choice and r["period"] == period)
        ax.plot([100 * b for b, _ in pts], [p for _, p in pts], "o-", label=choice, color=COLORS.get(choice))
    ax.axhline(res["full"]["ppl"], color="k", ls="--", lw=0.9, label="full model")
    ax.set_xlabel("experts resident per MoE layer (%)")
    ax.set_ylabel("perplexity (held-out text)")
    ax.set_title(f"{res['model']}: fallback to resident experts")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return str(save_figure(fig, png))


def section_emoe(trace: Trace, out_dir: str | Path) -> tuple[Section, dict[str, Any]]:
    """Demo-report section: profile + quality on the real model the trace was captured from (built-in only)."""
    from routecast.models.builtin import is_builtin_name
    from routecast.predict.emoe import EmoeConfig
    from routecast.runtime.emoe.profile import TextConfig
    from routecast.runtime.emoe.quality import QualityConfig, format_quality, run_quality
    from routecast.trace.capture_inputs import load_model

    sec = Section(key="emoe", title="eMoE: experts resident, fallback routing, quality (real model)")
    name = trace.spec.name
    if not is_builtin_name(name):
        sec.parts.append(paragraph(f"Not run: the trace comes from {name or 'a synthetic generator'}, and eMoE's "
                                   "quality needs the real model's forward pass (run the demo on a built-in model)."))
        return sec, {"skipped": f"no real model for {name!r}"}
    model, tok = load_model(name)
    small = dict(per_task=DEMO_PER_TASK, seq_len=DEMO_SEQ_LEN)
    cfg = QualityConfig(budgets=(0.25, 0.5, 0.75), residency=("emoe", "random", "lru", "oracle"), period=DEMO_PERIOD,
                        eval_text=TextConfig(split="val", **small), warmup_text=TextConfig(split="test", seed=1, **small),
                        predictor=EmoeConfig(epochs=DEMO_EPOCHS, d_model=32, heads=2, layers=1))
    res = run_quality(model, tok, cfg, progress=False)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    png = plot_quality(res, str(Path(out_dir) / "emoe_quality.png"))
    prof = res["profile"]
    full = res["full"]["ppl"]
    rows = [{"budget": f"{r['budget']:.0%}", "choice": r["choice"], "perplexity": round(r["ppl"], 2),
             "vs full": f"{r['ppl'] / full - 1:+.1%}", "agreement": round(r["agreement"], 3),
             "fallback share": round(r["fallback_share"], 3)} for r in res["rows"]]
    sens = [{"task": t, "insensitive input-side MoE layers": int(prof["insensitive_prefix"][n]),
             "similarity with all layers random": round(prof["agreement"][n][-1], 3)} for n, t in enumerate(prof["tasks"])]
    sec.parts.append(paragraph(
        f"The {name} model runs {res['eval']['tokens']} held-out tokens ({res['eval']['windows']} prompts of "
        f"{DEMO_SEQ_LEN} tokens, the corpus val split; small settings to keep the demo quick, resident experts "
        f"chosen again every {DEMO_PERIOD} prompts: `routecast emoe quality` uses 8 prompts of 64 tokens per task "
        "and every prompt) with only a share of each MoE layer's "
        "experts resident; a token routed to another expert falls back to its best resident one, weights "
        "renormalised. eMoE picks the experts by eq. 2 (its transformer's forecast per extracted task, "
        "routing-sensitive layers kept fuller); random, LRU and an oracle (the experts the full model uses on "
        f"the prompts to come) pick as many. Full model perplexity {full:.2f}; agreement = share of next-token "
        "choices equal to the full model's."))
    sec.parts.append(table(rows))
    sec.parts.append(figure(png, f"Perplexity vs experts resident, per residency choice (chosen every {DEMO_PERIOD} prompts)."))
    sec.parts.append(paragraph(
        f"Task sensitivity profile (the paper's §2.2.3, on the warm-up text): MoE layers nearest the input whose "
        f"random routing keeps similarity >= {prof['threshold']:.2f} are routing-insensitive for the task."))
    sec.parts.append(table(sens))
    sec.parts.append(preformatted(format_quality(res)))
    best = min((r for r in res["rows"] if r["choice"] == "emoe"), key=lambda r: r["budget"])
    return sec, {"full_ppl": full, "emoe_ppl_at_lowest_budget": best["ppl"], "lowest_budget": best["budget"],
                 "tokens": res["eval"]["tokens"], "rows": res["rows"], "sensitive": prof["sensitive"]}
