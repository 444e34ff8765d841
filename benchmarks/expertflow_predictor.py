"""ExpertFlow's routing-path predictor vs its TLP/SLP baselines, the MoE-GPS predictors and PROBE's lookahead.

Claim checked (issue 11): the path predictor beats TLP and SLP by at least 30 points of batch-level accuracy
(ExpertFlow eq. 7) at batch 8 / 16 / 32 on the built-in trace (ExpertFlow Table 1: 73-87% vs 3-36%).

Method (routecast.predict.batch_eval): every predictor is fitted once on 80% of the trace's source
documents (seed 0; by request when the trace records none), plus --train-extra (a capture of the same model
on the corpus's train split, documents disjoint from the test: checked), and run causally on the held-out
requests: per-step metrics (means over layers) as in `predict eval`, then eq. 7 over decode batches of B
held-out requests (a batch's true path: the OR of its B tokens' experts at one decode index; predicted: the
OR of each predictor's per-token top-K; TLP predicts each token's previous token, i.e. the batch's previous
step). The lookahead (layer horizon) needs a trace captured with --hidden --logits and the model's routers
(--model builtin); it is left out otherwise, and fits on the trace's own training documents only.
µs/token is this machine's CPU time under whatever else runs on it.

The path predictor's size and training: --expertflow default | paper | [preset,]KEY=VALUE,... (fields of
routecast.predict.expertflow.ExpertFlowConfig; 'paper' is ExpertFlow §5.2's d_model 32, d_ff 2048, lr 1e-3,
batch 16); --save-expertflow DIR keeps the fitted path predictor (for `routecast cache replay --predictor DIR`
and benchmarks/cache_policies.py --predictors).

Run: python benchmarks/expertflow_predictor.py --trace DIR [--train-extra DIR[,DIR...]] [--model builtin]
     [--predictors a,b,...] [--expertflow paper,epochs=12] [--save-expertflow DIR]
Writes out/bench/expertflow_predictor.json; ends with one line per predictor:
`PREDICTOR: batch acc 8 / 16 / 32 = X / Y / Z`, one line per baseline `expertflow - BASE at 8/16/32: +P / +Q / +R
points`, and the ceiling: eq. 7 is a recall (at most 1), so no predictor leads a baseline by more than
100 - baseline points; a 30-point lead is reachable only where the baseline is at most 0.70.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402

from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.common.machine import machine_info  # noqa: E402
from routecast.predict.batch_eval import batch_accuracy_rows  # noqa: E402
from routecast.predict.evaluate import rows_to_json  # noqa: E402

SIZES = (8, 16, 32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=None, help="trace directory (default: the standard trace 'builtin', with "
                                                  "--model builtin)")
    ap.add_argument("--quick", action="store_true", help="2 training epochs for the neural predictors")
    ap.add_argument("--model", default=None, help="checkpoint for ffn embeddings and the lookahead (e.g. builtin)")
    ap.add_argument("--predictors", default="distribution,conditional-token,ffn,lookahead,tlp,slp,expertflow",
                    help="comma-separated predictor names")
    ap.add_argument("--train-extra", default=None,
                    help="other captures of the model on disjoint documents to train on (comma-separated folders)")
    ap.add_argument("--epochs", type=int, default=None, help="training epochs of the neural predictors (default: preset)")
    ap.add_argument("--expertflow", default="default",
                    help="path predictor config: default, paper, or [preset,]KEY=VALUE,... (ExpertFlowConfig fields)")
    ap.add_argument("--save-expertflow", default=None, help="folder to save the fitted path predictor in")
    ap.add_argument("--out", default="out/bench/expertflow_predictor.json", help="JSON output")
    a = ap.parse_args()
    import torch

    if a.trace is None:
        from routecast.trace.standard import standard_trace

        a.trace, a.model = standard_trace("builtin"), a.model or "builtin"
    if a.quick and a.epochs is None:
        a.epochs = 2

    torch.set_num_threads(1)
    from routecast.predict.expertflow import parse_config
    from routecast.trace.io import read_trace

    ef = parse_config(a.expertflow)
    if a.epochs is not None:
        ef = dataclasses.replace(ef, epochs=a.epochs)
    names = [n.strip() for n in a.predictors.split(",") if n.strip()]
    trace = read_trace(a.trace)
    if "lookahead" in names and (trace.hidden_TLH is None or a.model is None):
        names.remove("lookahead")
        print("lookahead left out: it needs a trace with router inputs (--hidden --logits) and --model")
    extra = [read_trace(d.strip()) for d in (a.train_extra or "").split(",") if d.strip()]
    rows = batch_accuracy_rows(trace, names, SIZES, model_dir=a.model, extra_train=extra, epochs=a.epochs,
                               expertflow=ef, save_expertflow=a.save_expertflow)
    if "expertflow" in names:
        keep = ("d_model", "d_ff", "heads", "enc_layers", "dec_layers", "epochs", "token_passes", "batch_size", "lr",
                "weight_decay", "bucket")
        print("expertflow config: " + ", ".join(f"{k} {getattr(ef, k)}" for k in keep)
              + ("" if a.save_expertflow is None else f"; saved to {a.save_expertflow}"))
    print(f"held-out: {rows[0]['test_requests']} requests (20% of the documents); eq. 7 over decode batches of B "
          f"requests (8 seeded groupings); load average {os.getloadavg()[0]:.1f}")
    head = ["predictor", "horizon", "train tokens", "fit s", "top-k acc", "recall@2k", "step batch acc", "µs/token",
            *[f"B={b}" for b in SIZES]]
    print("  ".join(f"{h:>14}" if i else f"{h:<20}" for i, h in enumerate(head)))
    for r in rows:
        cells = [r["predictor"], r["horizon"], str(r["train_tokens"]), f"{r['fit_s']:.0f}", f"{r['top_k_accuracy']:.3f}",
                 f"{r['recall_at_2k']:.3f}", f"{r['batch_level_accuracy']:.3f}", f"{r['us_per_token']:.1f}", *[f"{r[f'batch_{b}']:.3f}" for b in SIZES]]
        print("  ".join(f"{c:>14}" if i else f"{c:<20}" for i, c in enumerate(cells)))
    by = {r["predictor"]: r for r in rows}
    lines = [f"{r['predictor']}: batch acc 8 / 16 / 32 = " + " / ".join(f"{r[f'batch_{b}']:.3f}" for b in SIZES)
             for r in sorted(rows, key=lambda r: r["predictor"] != "expertflow")]
    if "expertflow" in by:
        for base in ("tlp", "slp"):
            if base in by:
                d = [100 * (by["expertflow"][f"batch_{b}"] - by[base][f"batch_{b}"]) for b in SIZES]
                lines.append(f"expertflow - {base} at 8/16/32: "
                             + " / ".join("n/a" if math.isnan(x) else f"{x:+.1f}" for x in d) + " points")
    for base in ("tlp", "slp"):  # eq. 7 is at most 1: no predictor can lead a baseline by more than this
        if base in by:
            acc = [by[base][f"batch_{b}"] for b in SIZES]
            room = " / ".join(f"{100 * (1 - x):+.1f}" for x in acc)
            ok = " / ".join("yes" if 1 - x >= 0.30 else "no" for x in acc)
            lines.append(f"room above {base} at 8/16/32 (100 - {base}): {room} points; a +30 lead possible: {ok}")
    js = json.loads(rows_to_json(rows))
    cols = ("predictor", "horizon", "train_tokens", "fit_s", "top_k_accuracy", "recall_at_2k", "batch_level_accuracy",
            "us_per_token", *[f"batch_{b}" for b in SIZES])
    write_bench("expertflow_predictor", title="ExpertFlow: batch-level accuracy (eq. 7) of the routing-path predictor",
                headline=lines, tables=[table("held-out 20% of the documents; eq. 7 over decode batches of B requests",
                                              [{c: r.get(c) for c in cols} for r in js])],
                data={"expertflow_config": dataclasses.asdict(ef), "train_extra": a.train_extra, "rows": js},
                quick=a.quick, path=a.out)
    print(f"\nmachine: {machine_info().get('cpu', '?')}; wrote {a.out}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
