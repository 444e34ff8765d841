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

Run: python benchmarks/expertflow_predictor.py --trace DIR [--train-extra DIR] [--model builtin] [--predictors a,b,...]
Writes out/bench/expertflow_predictor.json; ends with one line per predictor:
`PREDICTOR: batch acc 8 / 16 / 32 = X / Y / Z` and one line per baseline `expertflow - BASE at 8/16/32: +P / +Q / +R points`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

from routecast.common.machine import machine_info  # noqa: E402
from routecast.predict.batch_eval import batch_accuracy_rows  # noqa: E402
from routecast.predict.evaluate import rows_to_json  # noqa: E402

SIZES = (8, 16, 32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True, help="trace directory (the built-in model's capture)")
    ap.add_argument("--model", default=None, help="checkpoint for ffn embeddings and the lookahead (e.g. builtin)")
    ap.add_argument("--predictors", default="distribution,conditional-token,ffn,lookahead,tlp,slp,expertflow",
                    help="comma-separated predictor names")
    ap.add_argument("--train-extra", default=None, help="another capture of the model on disjoint documents to train on")
    ap.add_argument("--epochs", type=int, default=None, help="training epochs of the neural predictors (default: preset)")
    ap.add_argument("--out", default="out/bench/expertflow_predictor.json", help="JSON output")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from routecast.trace.io import read_trace

    names = [n.strip() for n in a.predictors.split(",") if n.strip()]
    trace = read_trace(a.trace)
    if "lookahead" in names and (trace.hidden_TLH is None or a.model is None):
        names.remove("lookahead")
        print("lookahead left out: it needs a trace with router inputs (--hidden --logits) and --model")
    extra = None if a.train_extra is None else read_trace(a.train_extra)
    rows = batch_accuracy_rows(trace, names, SIZES, model_dir=a.model, extra_train=extra, epochs=a.epochs)
    print(f"held-out: {rows[0]['test_requests']} requests (20% of the documents); eq. 7 over decode batches of B "
          f"requests (8 seeded groupings); load average {os.getloadavg()[0]:.1f}")
    head = ["predictor", "horizon", "train tokens", "fit s", "top-k acc", "recall@2k", "step batch acc", "µs/token",
            *[f"B={b}" for b in SIZES]]
    print("  ".join(f"{h:>14}" if i else f"{h:<20}" for i, h in enumerate(head)))
    for r in rows:
        cells = [r["predictor"], r["horizon"], str(r["train_tokens"]), f"{r['fit_s']:.0f}", f"{r['top_k_accuracy']:.3f}",
                 f"{r['recall_at_2k']:.3f}", f"{r['batch_level_accuracy']:.3f}", f"{r['us_per_token']:.1f}", *[f"{r[f'batch_{b}']:.3f}" for b in SIZES]]
        print("  ".join(f"{c:>14}" if i else f"{c:<20}" for i, c in enumerate(cells)))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"machine": machine_info(), "rows": json.loads(rows_to_json(rows))}, indent=1))
    print(f"\nmachine: {machine_info().get('cpu', '?')}; wrote {a.out}")
    by = {r["predictor"]: r for r in rows}
    for r in rows:
        print(f"{r['predictor']}: batch acc 8 / 16 / 32 = " + " / ".join(f"{r[f'batch_{b}']:.3f}" for b in SIZES))
    if "expertflow" in by:
        for base in ("tlp", "slp"):
            if base in by:
                d = [100 * (by["expertflow"][f"batch_{b}"] - by[base][f"batch_{b}"]) for b in SIZES]
                print(f"expertflow - {base} at 8/16/32: " + " / ".join("n/a" if math.isnan(x) else f"{x:+.1f}" for x in d)
                      + " points")
    if "tlp" in by:  # eq. 7 is at most 1: no predictor can beat TLP by more than this
        room = [100 * (1 - by["tlp"][f"batch_{b}"]) for b in SIZES]
        print("room above TLP at 8/16/32 (100 - TLP): " + " / ".join(f"{x:+.1f}" for x in room) + " points")


if __name__ == "__main__":
    main()
