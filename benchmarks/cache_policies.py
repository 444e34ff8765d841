"""Expert-cache policies at 25 / 50 / 75% of all experts: hit ratio, gap to Belady, bytes, stall, time per token.

Claim checked (issue 11): PLEC with real-time correction closes >= 60% of the LRU -> Belady hit-ratio gap at
a 50% budget on the fine-grained built-in trace; ExpertFlow reports +15-35 points of hit ratio over LRU.

Method: routecast.cache.cli.run_replay on each trace: the predictor (default conditional-token, the
MoE-GPS token table) is fitted on 80% of the source documents (seed 0; by request for a trace that records
no documents) and every policy is replayed on the held-out requests, the forecast of each step produced causally by the harness; 'plec (oracle)' replays PLEC on the
step's true routing (an upper bound for the forecast, not a predictor). Hit = the expert is on the device
when the router asks (a prefetch still in flight is not a hit; it is in 'covered' and its wait in the stall).
Gap closed = (hit - hit_LRU) / (hit_Belady - hit_LRU). Timing: h100-sxm profile (PCIe 5.0 h2d 64 GB/s),
each trace's expert size, no non-expert time (--dense-us 0). The three PLEC-with-correction rows differ only
in where a demand load enters the prefetch queue: plec-correct (ahead of the prefetches that can spare the
time), plec-correct-eager (ahead of every queued prefetch) and plec-correct-fifo (behind all of them).

Traces: --builtin DIR (capture: `routecast capture --model builtin --prompts corpus:test:160
--max-new-tokens 24 --out DIR --batch-size 16`), --fine DIR (the fine-grained built-in model's trace, when it
exists), and a synthetic preset at real geometry generated in-process (--synthetic, default mixtral-8x7b,
--synthetic-requests 300, seed 0).

More forecasts for PLEC: --plec-predictors A,B,... (predictor names, or folders written by `routecast predict
fit` or `benchmarks/expertflow_predictor.py --save-expertflow`, e.g. the trained ExpertFlow path predictor)
add rows `plec [LABEL]` and `plec-correct [LABEL]` on every trace of the predictor's geometry, each forecast
made once per trace, causally, on the same held-out requests (a folder fitted on this trace under another
split is refused: it would be scored on its own training requests).

Run: python benchmarks/cache_policies.py [--builtin DIR] [--fine DIR] [--synthetic mixtral-8x7b|'']
     [--plec-predictors expertflow-dir,...]
Writes out/bench/cache_policies.json; ends, per trace (a `trace NAME:` line first), with one line per policy
and budget: `POLICY budget B: hit X, gap_closed Y%`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

from routecast.cache.cli import _clean, format_rows, make_forecast, run_replay  # noqa: E402
from routecast.common.machine import machine_info  # noqa: E402
from routecast.predict.evaluate import heldout  # noqa: E402
from routecast.predict.store import load_predictor  # noqa: E402

POLICIES = ["lru", "lfu", "lfuda", "lru-layer", "semoe", "plec", "plec-correct", "plec-correct-eager", "plec-correct-fifo",
            "belady"]
BUDGETS = ["25%", "50%", "75%"]


def _label(name: str) -> str:
    return name if not Path(name).is_dir() else f"{load_predictor(name).name}:{Path(name).name}"


def _fits(name: str, trace) -> bool:
    """A predictor name fits every trace; a saved one only a trace of its geometry."""
    if not Path(name).is_dir():
        return True
    ps, ts = load_predictor(name).spec, trace.spec
    return (ps.num_layers, ps.num_experts, ps.top_k) == (ts.num_layers, ts.num_experts, ts.top_k)


def run_trace(name: str, trace, predictor: str, plec_predictors: list[str]) -> list[dict]:
    main_fc = make_forecast(trace, predictor)
    extra = []
    for p in plec_predictors:
        if _fits(p, trace):
            extra.append((_label(p), make_forecast(trace, p, quiet=False)))
        else:
            print(f"{name}: --plec-predictors {p} skipped (built for another model's geometry)")
    out = []
    for b in BUDGETS:
        res = run_replay(trace, budget=b, policies=POLICIES, forecast=main_fc)
        oracle = run_replay(heldout(trace, "document", 0.8, 0)[1], budget=b, policies=["plec-correct"],
                            predictor="oracle")
        rows = res["rows"]
        bel_hit = next(r for r in rows if r["policy"] == "belady")["hit_ratio"]
        orow = next(r for r in oracle["rows"] if r["policy"] == "plec-correct")
        bel = next(r for r in oracle["rows"] if r["policy"] == "belady")
        assert abs(bel["hit_ratio"] - bel_hit) < 1e-12
        rows.append(dict(orow, policy="plec-correct (oracle)", shown=True))
        for label, fc in extra:
            more = run_replay(trace, budget=b, policies=["plec", "plec-correct"], forecast=fc)
            assert abs(next(r for r in more["rows"] if r["policy"] == "belady")["hit_ratio"] - bel_hit) < 1e-12
            rows += [dict(r, policy=f"{r['policy']} [{label}]", shown=True, forecast=fc[3])
                     for r in more["rows"] if r["policy"] in ("plec", "plec-correct")]
        print(f"\n{name}, budget {b} ({res['settings']['budget_slots']} slots), forecast {res['settings']['predictor']}"
              + "".join(f"; [{label}] {fc[3]}" for label, fc in extra))
        print(format_rows(rows))
        out.append({"budget": b, "settings": res["settings"], "rows": rows})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--builtin", default=None, help="trace of the built-in model (8 experts)")
    ap.add_argument("--fine", default=None, help="trace of the fine-grained built-in model, if it exists")
    ap.add_argument("--synthetic", default="mixtral-8x7b", help="synthetic preset at real geometry ('' = none)")
    ap.add_argument("--synthetic-requests", type=int, default=300, help="requests of the synthetic trace")
    ap.add_argument("--predictor", default="conditional-token", help="forecast for PLEC (default conditional-token)")
    ap.add_argument("--plec-predictors", default="",
                    help="more forecasts for plec / plec-correct rows: names or saved predictor folders, comma-separated")
    ap.add_argument("--out", default="out/bench/cache_policies.json", help="JSON output")
    a = ap.parse_args()
    if not (a.builtin or a.fine or a.synthetic):
        ap.error("no trace: give --builtin DIR, --fine DIR or --synthetic PRESET")
    plec_predictors = [p.strip() for p in a.plec_predictors.split(",") if p.strip()]
    from routecast.trace.io import read_trace
    from routecast.trace.synth import generate
    from routecast.trace.synth_presets import preset_config

    traces = [] if not a.builtin else [("builtin", read_trace(a.builtin, mmap=False, load_hidden=False,
                                                              load_logits=False))]
    if a.synthetic:
        traces.append((f"{a.synthetic} (synthetic)",
                       generate(preset_config(a.synthetic, requests=a.synthetic_requests, seed=0))))
    if a.fine:
        traces.append(("builtin-fine", read_trace(a.fine, mmap=False, load_hidden=False, load_logits=False)))
    else:
        print("no --fine trace given: the fine-grained built-in model's rows are absent")
    results = {n: run_trace(n, t, a.predictor, plec_predictors) for n, t in traces}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(_clean({"machine": machine_info(), "results": results}), indent=1))
    print(f"\nmachine: {machine_info().get('cpu', '?')}; wrote {a.out}")
    for name, per_budget in results.items():
        print(f"trace {name}:")
        for entry in per_budget:
            for r in entry["rows"]:
                if not r.get("shown", True):
                    continue
                g = r["gap_closed"]
                gap = "n/a" if g is None or math.isnan(g) else f"{100 * g:.1f}%"
                print(f"{r['policy']} budget {entry['budget']}: hit {r['hit_ratio']:.3f}, gap_closed {gap}")


if __name__ == "__main__":
    main()
