"""Expert placement judged step by step in its regime: decode batches of 16, 64 and 256 requests, EP 4 / 8 / 16.

Claim checked (issue 22): in decode steps (weight-read bound) balancing the experts each rank reads beats
balancing its tokens; target at batch 16 and EP 8: the best method >= 5% faster than static EP, or the
printed bound shows why no placement can be; at batch 256 the best method within 2% of its bound.

Method: the standard "fine" trace (builtin-fine: DeepSeek-V3 architecture, 64 experts top-6, 160 requests
over 34 documents, router inputs captured), priced as DeepSeek-V2-Lite (the production model with that
routed geometry) on H100 SXM over NVLink (routecast.place.regimes: sim.cost with the rank roofline, DP
attention, deduplicated all-to-all, every weight move charged against its hiding window). Held out by
document, 5 splits (split k holds out every fifth document from the k-th). Per split, PROBE's lookahead
predictor (predict.lookahead) is fitted on the training documents; per decode batch B, trace.decode_batches
replays the training documents' routing as B concurrent requests (continuous batching) for the plans and
the held-out documents' routing for the steps that are priced; the forecast of every held-out step is the
lookahead predictor's (layer-ahead, from each token's router input). Every method gets the same slots:
E / G + 1 per rank (72 at EP 8). Figures are medians over the splits of the mean MoE-layer time.
Also, at EP 8: the captured trace as it ran (prefill steps of 16 prompts, decode steps of 1-16 tokens)
and a batch-16 replay with admitted prompts (mixed steps), to show the regimes apart.

Run: python benchmarks/placement_regimes.py [--quick] [--splits 5] [--steps 64]
Writes out/bench/placement_regimes.json.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from routecast.common.bench import table, write_bench
from routecast.place.compare import lookahead_counts
from routecast.place.regimes import evaluate, regime_table
from routecast.predict.lookahead import LookaheadConfig, LookaheadPredictor
from routecast.sim.hardware import load_hardware
from routecast.sim.models import load_model
from routecast.trace.decode_batches import decode_batches
from routecast.trace.io import read_trace
from routecast.trace.standard import standard_trace

ORACLES = ("probe_oracle", "coact_step_oracle")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 splits, fewer steps, 2 predictor epochs (make bench)")
    ap.add_argument("--splits", type=int, default=5, help="document folds held out in turn (default 5)")
    ap.add_argument("--steps", type=int, default=64, help="held-out decode steps per batch size (default 64)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    splits = 2 if a.quick else a.splits
    steps, train_steps, epochs = (24, 48, 2) if a.quick else (a.steps, 2 * a.steps, 8)
    batches, eps = (16, 64, 256), (4, 8, 16)
    hw, model = load_hardware("h100-sxm"), load_model("deepseek-v2-lite")
    trace = read_trace(standard_trace("fine"), load_hidden=True)
    docs = np.unique(trace.tokens["document"])
    us: dict[tuple, list[float]] = {}
    regime_rows: list[dict] = []
    for k in range(splits):
        held_mask = np.isin(trace.tokens["document"], docs[k::5])
        train, held = trace.select(~held_mask), trace.select(held_mask)
        t0 = time.monotonic()
        pred = LookaheadPredictor.from_model("builtin-fine", trace.spec,
                                             config=LookaheadConfig(epochs=epochs, seed=k)).fit(train)
        print(f"split {k}: {np.unique(train.tokens['document']).size} training / "
              f"{np.unique(held.tokens['document']).size} held-out documents, predictor fitted in "
              f"{time.monotonic() - t0:.0f} s", file=sys.stderr)
        for B in batches:
            tr_b = decode_batches(train, batch=B, steps=train_steps, seed=10 + k)
            ho_b = decode_batches(held, batch=B, steps=steps, seed=20 + k)
            fc = lookahead_counts(pred, ho_b)
            for ep in eps:
                r = evaluate(tr_b, ho_b, ep=ep, replicas_per_rank=1, hw=hw, model=model, forecast_TLE=fc, seed=k)
                for name, v in r["moe_s_TL"].items():
                    us.setdefault((name, ep, B), []).append(float(v.mean()) * 1e6)
                for name, v in r["bounds"].items():
                    us.setdefault((f"bound_{name}", ep, B), []).append(float(v.mean()) * 1e6)
        if k == 0:  # the regimes apart, EP 8: the capture as it ran, and a replay with admitted prompts
            for wl, (tr_w, ho_w, fc_w) in {
                "captured": (train, held, lookahead_counts(pred, held)),
                "batch16+prompts": (*(x := (decode_batches(train, batch=16, steps=train_steps, seed=30, prefill=True),
                                            decode_batches(held, batch=16, steps=steps, seed=31, prefill=True))),
                                    lookahead_counts(pred, x[1])),
            }.items():
                r = evaluate(tr_w, ho_w, ep=8, replicas_per_rank=1, hw=hw, model=model, forecast_TLE=fc_w, seed=k)
                regime_rows += [{"workload": wl, **row} for row in regime_table(r)]
    rows, lines = [], []
    for (name, ep, B), v in sorted(us.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        st = np.asarray(us[("static", ep, B)])
        sav = 100.0 * (st - np.asarray(v)) / st
        rows.append({"method": name, "ep": ep, "batch": B, "us": float(np.median(v)),
                     "vs_static_pct": float(np.median(sav)), "min_pct": float(sav.min()), "max_pct": float(sav.max())})
    for r in rows:
        line = f"{r['method']} ep {r['ep']} batch {r['batch']} decode: us {r['us']:.2f}, vs static {r['vs_static_pct']:+.2f}%"
        print(line)
        lines.append(line)
    head = []
    methods = [r for r in rows if not r["method"].startswith("bound_")]
    for ep, B in ((8, 16), (8, 256)):
        cand = [r for r in methods if r["ep"] == ep and r["batch"] == B]
        best = max(cand, key=lambda r: r["vs_static_pct"])
        causal = max((r for r in cand if r["method"] not in ORACLES), key=lambda r: r["vs_static_pct"])
        bound = next(r for r in rows if r["method"] == "bound_bound" and r["ep"] == ep and r["batch"] == B)
        head.append(f"best decode ep {ep} batch {B}: {best['method']} vs static {best['vs_static_pct']:+.2f}%"
                    f" (best causal: {causal['method']} {causal['vs_static_pct']:+.2f}%; bound {bound['vs_static_pct']:+.2f}%,"
                    f" best is {100 * (best['us'] / bound['us'] - 1):.2f}% above it)")
    for h in head:
        print(h)
    for r in regime_rows:
        print(f"{r['workload']} ep 8 {r['regime']} ({r['steps']} steps) {r['method']}: us {r['us']:.2f}, "
              f"vs static {r['vs_static_pct']:+.2f}%")
    write_bench("placement_regimes", title="Expert placement by step regime: decode batches 16-256, EP 4-16",
                headline=head, quick=a.quick,
                tables=[table("Decode MoE-layer time per method, EP and batch (median over document splits)", rows,
                              note=f"{splits} document splits; DeepSeek-V2-Lite on H100 SXM, NVLink; E/G + 1 slots a rank"),
                        table("Regimes apart at EP 8 (split 0)", regime_rows)],
                data={"splits": splits, "steps": steps, "train_steps": train_steps, "lookahead_epochs": epochs,
                      "per_split_us": {f"{n} ep {e} batch {b}": v for (n, e, b), v in us.items()}, "lines": lines})
    return 0


if __name__ == "__main__":
    sys.exit(main())
