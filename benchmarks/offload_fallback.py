"""eMoE's fallback in the offload runtime: tokens/s, hit ratio and the quality cost at budgets 25 / 50 / 75%.

    PYTHONPATH=. python benchmarks/offload_fallback.py [--repeats 3] [--prompts corpus:val:8] [--ppl-prompts corpus:val:16]

Per budget (share of the L·E routed experts, one pool), CPU, experts read from disk (runtime/offload):
  lru                 no fallback: a miss loads on demand (greedy outputs identical to all-resident)
  fallback            a token routed to an expert without a slot uses the best held expert by router score
                      (trace/override.py's rule) once the pool is full; no prefetch: the cache then keeps what the
                      warm-up loaded
  fallback+lookahead  the same with PROBE's lookahead prefetching layer l+1 after layer l's router (the resident
                      set follows the forecasts)
Quality cost, against the all-resident model: greedy-token agreement (share of generated positions equal, on
--prompts) and teacher-forced perplexity on the held-out --ppl-prompts (every next token of each prompt scored in
one forward pass). The slot decisions are timing-free (cache/slots.py), so the rerouting, the tokens and the
perplexity are the same on every repeat; tokens/s is the median of --repeats interleaved rounds.
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
from routecast.runtime.offload.fallback import perplexity, token_agreement  # noqa: E402
from routecast.runtime.offload.run import (  # noqa: E402
    encode_prompts,
    load_run,
    make_predictor,
    offloaded_perplexity,
    run_config,
)
from routecast.trace.capture_inputs import load_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin-fine")
    ap.add_argument("--prompts", default="corpus:val:8", help="generation prompts (greedy agreement, tokens/s)")
    ap.add_argument("--ppl-prompts", default="corpus:val:16", help="held-out prompts scored teacher-forced")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--budgets", default="25,50,75", help="percent of all L*E experts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="out/bench_offload/fallback.json")
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
    L, E = spec.num_layers, spec.num_experts
    texts = [ids for ids, _ in encode_prompts(tok, load_prompts(a.ppl_prompts, tok), 1)]
    look = make_predictor("lookahead", model, a.model)
    ppl_full = perplexity(model, texts)
    del model

    configs: list[tuple[str, int | None, bool, object]] = [("all-resident", None, False, None)]
    for pct in [int(x) for x in a.budgets.split(",")]:
        b = int(round(pct / 100 * L * E))
        configs += [(f"lru@{pct}%", b, False, None), (f"fallback@{pct}%", b, True, None),
                    (f"fallback+lookahead@{pct}%", b, True, look)]
    runs: dict[str, list[dict]] = {c[0]: [] for c in configs}
    for rep in range(a.repeats):
        for label, budget, fb, pred in configs:
            r = run_config(a.model, requests, budget=budget, prefetch="none" if pred is None else "lookahead",
                           predictor=pred, cfg_kw={"fallback": fb} if budget is not None else None)
            loads.append(os.getloadavg()[0])
            runs[label].append(r)
            print(f"round {rep + 1}/{a.repeats} {label:26s} {r['tokens_per_s']:7.2f} tok/s  hit {r['hit_ratio']:.3f}",
                  flush=True)
    ref = runs["all-resident"][0]["tokens"]
    rows = []
    for label, budget, fb, pred in configs:
        rs = runs[label]
        tps = [r["tokens_per_s"] for r in rs]
        row = {"config": label, "budget": budget, "tokens_per_s": statistics.median(tps), "tokens_per_s_min": min(tps),
               "tokens_per_s_max": max(tps), "hit_ratio": rs[0].get("hit_ratio", 1.0),
               "agreement": token_agreement(ref, rs[0]["tokens"]),
               "same_every_repeat": all(r["tokens"] == rs[0]["tokens"] for r in rs),
               "rerouted_share": rs[0].get("rerouted_share", 0.0), "bytes_read": rs[0].get("bytes_read", 0)}
        if budget is None:
            row["perplexity"] = ppl_full
        else:
            p = offloaded_perplexity(a.model, texts, budget=budget, cfg_kw={"fallback": fb},
                                     predictor=pred)
            row.update(perplexity=p["perplexity"], ppl_rerouted_share=p.get("rerouted_share", 0.0))
        row["perplexity_change"] = row["perplexity"] / ppl_full - 1
        rows.append(row)
    out = {"machine": machine_info(), "load_avg": [min(loads), max(loads)], "settings": vars(a), "rows": rows,
           "scored_tokens": sum(len(t) - 1 for t in texts), "wall_s": time.time() - t_start}
    print_report(out)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=float))
    lo, hi = out["load_avg"]
    print(f"wrote {a.out} and", write_bench("offload_fallback", title="eMoE fallback in the offload runtime: speed and quality cost", quick=a.quick,
                                             headline=[f"median of {a.repeats} rounds; load average {lo:.1f}-{hi:.1f}"],
                                             tables=[table("eMoE fallback in the offload runtime: speed and quality cost", out["rows"])], data=out))


def print_report(out: dict) -> None:
    st, rows = out["settings"], out["rows"]
    ar = rows[0]["tokens_per_s"]
    lo, hi = out["load_avg"]
    print(f"\n{st['model']}, {st['prompts']} x {st['max_new_tokens']} new tokens, perplexity on {st['ppl_prompts']} "
          f"({out['scored_tokens']} scored tokens); median of {st['repeats']} rounds; load average {lo:.1f}-{hi:.1f} "
          f"on {out['machine']['cpus']} cores")
    print("config | tok/s | (min-max) | x all-resident | hit | rerouted | MB read | greedy agreement | perplexity | change | same every repeat")
    for r in rows:
        print(" | ".join([r["config"], f"{r['tokens_per_s']:.2f}", f"({r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f})",
                          f"{r['tokens_per_s'] / ar:.2f}", f"{r['hit_ratio']:.3f}", f"{r['rerouted_share']:.1%}",
                          f"{r['bytes_read'] / 1e6:.1f}", f"{r['agreement']:.3f}", f"{r['perplexity']:.3f}",
                          f"{r['perplexity_change']:+.1%}", str(r["same_every_repeat"])]))


if __name__ == "__main__":
    main()
