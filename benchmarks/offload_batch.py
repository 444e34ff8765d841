"""Batched offloaded generation: tokens/s vs batch size, outputs checked against all-resident batched generation.

    PYTHONPATH=. python benchmarks/offload_batch.py [--batch-sizes 1,2,4,8] [--budget 50] [--repeats 3]

builtin-fine from disk (runtime/offload), greedy, left-padded batches of --prompts (as `routecast capture` pads):
all-resident, LRU and PROBE's lookahead prefetch at --budget % of the L·E routed experts. A batch's step needs the
union of its rows' experts per layer, so the hit ratio and the bytes read per token change with the batch size.
Each offloaded run's tokens are compared with the all-resident run of the same batch size (padding changes the
numerics, so batch sizes are not compared with each other). Tokens/s: median of --repeats interleaved rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.common.machine import machine_info  # noqa: E402
from routecast.runtime.offload.run import load_run, make_predictor, run_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin-fine")
    ap.add_argument("--prompts", default="corpus:val:8")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--budget", type=int, default=50, help="percent of all L*E experts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="out/bench_offload/batch.json")
    ap.add_argument("--quick", action="store_true", help="a reduced run (make bench): 2 prompts x 8 tokens, 1 round")
    a = ap.parse_args()
    if a.quick:
        a.prompts, a.max_new_tokens, a.repeats = "corpus:val:2", 8, 1
        for k, v in (("batch_sizes", "1,2"), ("budgets", "50"), ("ppl_prompts", "corpus:val:2")):
            if hasattr(a, k):
                setattr(a, k, v)
    t_start = time.time()
    loads = [os.getloadavg()[0]]
    model, tok, spec, requests = load_run(a.model, a.prompts, a.max_new_tokens)
    budget = int(round(a.budget / 100 * spec.num_layers * spec.num_experts))
    look = make_predictor("lookahead", model, a.model)
    del model
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    configs = [(bs, label, b, pf, pred) for bs in sizes for label, b, pf, pred in
               (("all-resident", None, "none", None), ("lru", budget, "none", None), ("lookahead", budget, "lookahead", look))]
    runs: dict[tuple[int, str], list[dict]] = {(c[0], c[1]): [] for c in configs}
    for rep in range(a.repeats):
        for bs, label, b, pf, pred in configs:
            r = run_config(a.model, requests, budget=b, prefetch=pf, predictor=pred, batch_size=bs)
            loads.append(os.getloadavg()[0])
            runs[(bs, label)].append(r)
            print(f"round {rep + 1}/{a.repeats} batch {bs} {label:12s} {r['tokens_per_s']:7.2f} tok/s  hit {r['hit_ratio']:.3f}",
                  flush=True)
    rows = []
    for (bs, label), rs in runs.items():
        ref = runs[(bs, "all-resident")][0]["tokens"]
        tps = [r["tokens_per_s"] for r in rs]
        rows.append({"batch_size": bs, "config": label, "tokens_per_s": statistics.median(tps), "min": min(tps),
                     "max": max(tps), "hit_ratio": rs[0]["hit_ratio"], "late": statistics.median(r.get("late", 0) for r in rs),
                     "bytes_read": rs[0].get("bytes_read", 0), "new_tokens": rs[0]["new_tokens"],
                     "stall_share": statistics.median(r.get("stall_share", 0.0) for r in rs),
                     "identical": all(r["tokens"] == ref for r in rs)})
    out = {"machine": machine_info(), "load_avg": [min(loads), max(loads)], "settings": vars(a), "budget_slots": budget,
           "rows": rows, "wall_s": time.time() - t_start}
    lo, hi = out["load_avg"]
    print(f"\n{a.model}, {a.prompts} x {a.max_new_tokens} new tokens, budget {a.budget}% ({budget} slots); median of "
          f"{a.repeats} rounds; load average {lo:.1f}-{hi:.1f} on {out['machine']['cpus']} cores")
    print("batch | config | tok/s | (min-max) | x all-resident (same batch) | hit | late | MB read per token | stall | identical")
    for r in rows:
        ar = next(x["tokens_per_s"] for x in rows if x["batch_size"] == r["batch_size"] and x["config"] == "all-resident")
        print(" | ".join([str(r["batch_size"]), r["config"], f"{r['tokens_per_s']:.2f}", f"({r['min']:.1f}-{r['max']:.1f})",
                          f"{r['tokens_per_s'] / ar:.2f}", f"{r['hit_ratio']:.3f}", f"{r['late']:.0f}",
                          f"{r['bytes_read'] / 1e6 / max(r['new_tokens'], 1):.3f}", f"{r['stall_share']:.1%}",
                          str(r["identical"])]))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=float))
    lo, hi = out["load_avg"]
    print(f"wrote {a.out} and", write_bench("offload_batch", title="Batched offloaded generation (left-padded) vs all-resident", quick=a.quick,
                                             headline=[f"median of {a.repeats} rounds; load average {lo:.1f}-{hi:.1f}"],
                                             tables=[table("Batched offloaded generation (left-padded) vs all-resident", out["rows"])], data=out))


if __name__ == "__main__":
    main()
