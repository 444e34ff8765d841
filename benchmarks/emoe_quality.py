"""eMoE on the built-in models: predictor accuracy vs p, task sensitivity, perplexity vs resident-expert budget.

Claims checked (issue 13, eMoE paper): the expert predictor reaches ~70% (its Table 2); tasks differ in their
tolerance to inaccurate routing (Observation 3); eMoE saves up to 80% of expert memory with accuracy kept
(§5.4), and reusing the predicted experts for the next p prompts barely moves perplexity (Figure 10).

1. Predictors (routecast/predict/emoe.py) on the captured traces (--builtin, --fine), fitted on 80% of the
   source documents (seed 0) and scored causally on the requests of the others: eMoE-A (`emoe`) and eMoE-L
   (`emoe-l`) invoked every p prompts, p = 1, 2, 5, 10, 20, 40, against MoE-GPS's distribution-only row;
   top-k accuracy, active-set F1 and distribution error (predict/metrics.py); task-extraction accuracy on the
   held-out prompts; the paper's Figure 9, the correlation of each prompt's expert distribution with the d-th
   next one (all requests of the trace in arrival order).
2. Sensitivity (runtime/emoe/profile.py): per task, next-token agreement and perplexity with the first j MoE
   layers routed at random, on --per-task windows of --seq-len tokens of the corpus test split (the shipped
   sample); layers insensitive while agreement >= 0.85.
3. Quality (runtime/emoe/quality.py): perplexity per domain on --per-task windows per task of the val split
   (never trained on) with 25 / 50 / 75% of each MoE layer's experts resident and fallback routing, for
   eMoE's choice, eMoE without its task-aware allocation (emoe-flat), random, LRU and an oracle, chosen again
   every prompt; then every p = 5, 20, 40 prompts at 50%.

Run: python benchmarks/emoe_quality.py [--quick] [--builtin DIR --fine DIR]   (default: the standard traces)
Writes out/bench/emoe_quality.json. One torch thread (--threads).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from routecast.common.bench import table, write_bench  # noqa: E402

PERIODS = (1, 2, 5, 10, 20, 40)


def predictor_rows(name: str, trace_dir: str, epochs: int) -> dict:
    from routecast.predict.emoe import extraction_accuracy, make_emoe, request_table
    from routecast.predict.evaluate import heldout_rows, make_predictor
    from routecast.predict.harness import run_harness
    from routecast.trace.io import read_trace

    tr = read_trace(trace_dir, load_hidden=False, load_logits=False).materialise()
    train, test, used = heldout_rows(tr, "document", 0.8, 0)
    rows = []

    def score(label: str, pred, p) -> None:
        t0 = time.perf_counter()
        r = run_harness(pred, tr, rows=test)
        m = {k: float(np.nanmean(v)) for k, v in r.metrics.items()}
        rows.append({"predictor": label, "p": p, "top_k_accuracy": m["top_k_accuracy"], "active_f1": m["active_f1"],
                     "distribution_error": m["distribution_error"], "us_per_token": r.us_per_token,
                     "eval_s": time.perf_counter() - t0})

    # The paper's Figure 9: correlation of a prompt's expert selection with its d-th successor (all requests in
    # arrival order; Pearson over the flattened (L, E) distributions), any task and same task.
    tab = request_table(tr)
    d_RX = tab["dist"].reshape(len(tab["dist"]), -1)
    z = (d_RX - d_RX.mean(1, keepdims=True)) / np.maximum(d_RX.std(1, keepdims=True), 1e-12)
    corr = {}
    for gap in PERIODS:
        c = (z[:-gap] * z[gap:]).mean(1)
        same = tab["task"][:-gap] == tab["task"][gap:]
        corr[gap] = {"any": float(c.mean()), "same_task": float(c[same].mean()) if same.any() else None,
                     "other_task": float(c[~same].mean()) if (~same).any() else None}
    base = make_predictor("distribution", tr.spec).fit_rows(tr, train)
    score("distribution (MoE-GPS)", base, "-")
    acc = None
    for label in ("emoe", "emoe-l"):
        pred = make_emoe(label, tr.spec, epochs=epochs).fit_rows(tr, train)
        for p in PERIODS:
            pred.period = p
            score(label, pred, p)
        acc = extraction_accuracy(pred.extractor, tr.select(test))
    return {"trace": trace_dir, "split": used, "train_tokens": int(train.sum()), "test_tokens": int(test.sum()),
            "test_requests": int(np.unique(tr.tokens["request"][test]).size),
            "task_extraction": {"accuracy": acc[0], "prompts": acc[1]}, "prompt_correlation": corr, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--builtin", default=None, help="trace of the built-in model (default: the standard trace "
                                                    "'builtin', captured on first use)")
    ap.add_argument("--fine", default=None, help="trace of builtin-fine (default: the standard trace 'fine')")
    ap.add_argument("--quick", action="store_true", help="4 windows per task, 60 epochs, budgets 25/50%% only, "
                                                          "reuse every 5 prompts only")
    ap.add_argument("--per-task", type=int, default=8, help="text windows per task (quality and profile)")
    ap.add_argument("--seq-len", type=int, default=64, help="tokens per window")
    ap.add_argument("--epochs", type=int, default=300, help="eMoE predictor training epochs")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: predict, profile, quality")
    ap.add_argument("--out", default="out/bench/emoe_quality.json", help="JSON output")
    a = ap.parse_args()
    from routecast.trace.standard import standard_trace

    a.builtin = a.builtin or standard_trace("builtin")
    a.fine = a.fine or standard_trace("fine")
    if a.quick:
        a.per_task, a.epochs = min(a.per_task, 4), min(a.epochs, 60)
    budgets, periods = ((0.25, 0.5), (5,)) if a.quick else ((0.25, 0.5, 0.75), (5, 20, 40))
    import torch

    from routecast.common.machine import machine_info
    from routecast.predict.emoe import EmoeConfig
    from routecast.runtime.emoe.profile import TextConfig, format_profile, profile_sensitivity, text_windows
    from routecast.runtime.emoe.quality import QualityConfig, format_quality, run_quality
    from routecast.trace.capture_inputs import load_model

    torch.set_num_threads(a.threads)
    skip = set(a.skip.split(","))
    out: dict = {"machine": machine_info(), "load_avg_start": os.getloadavg()}
    models = {"builtin": a.builtin, "builtin-fine": a.fine}
    if "predict" not in skip:
        out["predictors"] = {m: predictor_rows(m, d, a.epochs) for m, d in models.items()}
    text = dict(per_task=a.per_task, seq_len=a.seq_len)
    for m in models:
        if "profile" in skip and "quality" in skip:
            break
        model, tok = load_model(m)
        tasks, w, task_of, _ = text_windows(tok, TextConfig(split="test", seed=1, **text))
        prof = profile_sensitivity(model, tasks, w, task_of, progress=False)
        out.setdefault("profile", {})[m] = {**prof.as_dict(), "text": format_profile(prof)}
        if "quality" not in skip:
            t0 = time.perf_counter()
            cfg = QualityConfig(budgets=budgets, reuse_periods=periods, reuse_budget=0.5,
                                residency=("emoe", "emoe-flat", "random", "lru", "oracle"),
                                eval_text=TextConfig(split="val", **text),
                                warmup_text=TextConfig(split="test", seed=1, **text),
                                predictor=EmoeConfig(epochs=a.epochs))
            res = run_quality(model, tok, cfg, progress=False, profile=prof)
            res["wall_s"] = time.perf_counter() - t0
            res["text"] = format_quality(res)
            out.setdefault("quality", {})[m] = res
    out["load_avg_end"] = os.getloadavg()
    head, tables = [], []
    for m, res in out.get("predictors", {}).items():
        best = max(res["rows"], key=lambda r: r["top_k_accuracy"])
        head.append(f"[{m}] best predictor {best['predictor']} (p {best['p']}): top-k accuracy "
                    f"{best['top_k_accuracy']:.3f} on held-out documents (paper Table 2: ~70%)")
        tables.append(table(f"{m}: predictors every p prompts, held out by {res['split']}",
                            [{k: r[k] for k in ("predictor", "p", "top_k_accuracy", "active_f1", "distribution_error",
                                                "us_per_token")} for r in res["rows"]]))
    for m, q in out.get("quality", {}).items():
        full = q["full"]["ppl"]
        for r in q["rows"]:
            if r["choice"] == "emoe" and r["period"] == 1:
                head.append(f"[{m}] eMoE with {r['budget']:.0%} of experts resident: perplexity "
                            f"{r['ppl']:.2f} vs {full:.2f} full ({r['ppl'] / full - 1:+.1%})")
        tables.append(table(f"{m}: perplexity with a share of experts resident (val split)",
                            [{"budget": r["budget"], "p": r["period"], "choice": r["choice"], "ppl": r["ppl"],
                              "vs full": r["ppl"] / full - 1, "agreement": r["agreement"],
                              "fallback": r["fallback_share"]} for r in q["rows"]],
                            note=f"full model perplexity {full:.3f}"))
    write_bench("emoe_quality", title="eMoE: predictor accuracy vs p, task sensitivity, perplexity vs expert budget",
                headline=head, tables=tables, data=out, quick=a.quick, path=a.out)

    info = out["machine"]
    print(f"machine: {info.get('cpu', '?')}, load average {out['load_avg_start'][0]:.1f} -> {out['load_avg_end'][0]:.1f}")
    for m, res in out.get("predictors", {}).items():
        te = res["task_extraction"]
        print(f"\n[{m}] predictors, held out by {res['split']}: {res['test_requests']} requests, {res['test_tokens']} "
              f"tokens; task extraction accuracy {te['accuracy']:.3f} on {te['prompts']} prompts")
        print(f"{'predictor':<24} {'p':>3} {'top-k acc':>9} {'active F1':>9} {'dist err':>8} {'µs/token':>8}")
        for r in res["rows"]:
            print(f"{r['predictor']:<24} {r['p']!s:>3} {r['top_k_accuracy']:>9.3f} {r['active_f1']:>9.3f} "
                  f"{r['distribution_error']:>8.3f} {r['us_per_token']:>8.1f}")
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        print("correlation of a prompt's expert distribution with the d-th next prompt (any / same task / other task): "
              + "; ".join(f"d={d}: {fmt(c['any'])} / {fmt(c['same_task'])} / {fmt(c['other_task'])}"
                          for d, c in res["prompt_correlation"].items()))
    for m, p in out.get("profile", {}).items():
        print(f"\n[{m}] sensitivity\n{p['text']}")
    for m, q in out.get("quality", {}).items():
        print(f"\n[{m}] quality ({q['wall_s']:.0f} s)\n{q['text']}")
    print("\n".join(head))
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
