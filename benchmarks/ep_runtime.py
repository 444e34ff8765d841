"""Expert parallelism for real: the fine-grained built-in model's trace replayed through its MoE layers on EP 2 and
EP 4 gloo ranks (one process group started by routecast, CPU), per plan (static EP, EPLB, PROBE; MoE-GPS with --plans).

Every plan replays the same steps with the routing forced from the trace (same tokens per rank). Per plan:
items processed per rank (sum over (step, layer) of the busiest rank's and of the mean rank's), IR = their ratio,
all-to-all bytes (dispatch + combine), whether every rank's measured bytes equal sim.a2a's prediction (every
(step, layer, rank, repeat)), the all-to-all time (slowest rank per cell, median over repeats, summed) against
the calibrated link profile (routecast/sim/links/gloo-cpu-ep<G>.toml: alpha + V / B), expert compute time,
weight bytes moved by re-plans, and the output check against the single-process model (fp32 allclose).
Two workloads: 'prefill' (the first prefill steps, ~1,200-1,700 tokens each) and 'decode' (16-token steps).
Times on this shared 2-core machine are noisy (4 ranks on 2 cores share them): quote the ratios.
--shuffle-plan 'DIR/plan-ep{ep}.json' adds Speculative MoE's token shuffle (plans from `routecast schedule cocluster
--ep G --respect-groups`, {ep} replaced by G): its measured LAR and bytes against static EP's and against schedule's
prediction on the same rows.

  PYTHONPATH=. python benchmarks/ep_runtime.py [--ep 2,4] [--plans static,eplb,probe] [--repeats 3]
      [--prefill-steps 4] [--decode-steps 12] [--shuffle-plan PATTERN] [--out out/bench/ep_runtime] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.common.machine import machine_info  # noqa: E402
from routecast.runtime.ep.run import format_table, run_plans, shuffle_line  # noqa: E402
from routecast.sim.a2a import LINK_DIR  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=None, help="trace of builtin-fine captured with --hidden (default: the "
                                                  "standard trace 'fine', captured on first use)")
    ap.add_argument("--model", default="builtin-fine", help="model the trace was captured from")
    ap.add_argument("--ep", default="2,4", help="comma-separated rank counts (default 2,4)")
    ap.add_argument("--plans", default="static,eplb,probe", help="plans (default static,eplb,probe)")
    ap.add_argument("--repeats", type=int, default=3, help="replays of every step; times are medians (default 3)")
    ap.add_argument("--prefill-steps", type=int, default=4, help="prefill steps replayed (default 4)")
    ap.add_argument("--decode-steps", type=int, default=12, help="decode steps replayed (default 12)")
    ap.add_argument("--shuffle-plan", default=None, help="cocluster plan file per EP size, '{ep}' replaced by G")
    ap.add_argument("--out", default="out/bench/ep_runtime", help="folder of the per-run files")
    ap.add_argument("--json", default="out/bench/ep_runtime.json", help="benchmark JSON output")
    ap.add_argument("--quick", action="store_true", help="EP 2 only, 2 prefill + 4 decode steps, 1 repeat")
    a = ap.parse_args()
    if a.quick:
        a.ep, a.prefill_steps, a.decode_steps, a.repeats = "2", min(a.prefill_steps, 2), min(a.decode_steps, 4), 1
    if a.trace is None:
        from routecast.trace.standard import standard_trace

        a.trace = str(standard_trace("fine"))
    head, rows = [], []
    plans = a.plans.split(",")
    work = {"prefill": {"first_step": 0, "steps": a.prefill_steps, "min_tokens": 17},
            "decode": {"first_step": 1, "steps": a.decode_steps, "min_tokens": 0}}
    results = {}
    t0 = time.monotonic()
    for ep in (int(x) for x in a.ep.split(",")):
        link = LINK_DIR / f"gloo-cpu-ep{ep}.toml"
        for name, w in work.items():
            if not w["steps"]:
                continue
            load0 = os.getloadavg()[0]
            res = run_plans(model=a.model, trace_dir=a.trace, out=Path(a.out) / f"ep{ep}-{name}", nproc=ep, plans=plans,
                            repeats=a.repeats, link=link if link.is_file() else None, overwrite=True, quiet=True,
                            shuffle_plan=a.shuffle_plan.replace("{ep}", str(ep)) if a.shuffle_plan else None, **w)
            res["settings"]["load_before"] = load0
            res["settings"]["load_after"] = os.getloadavg()[0]
            st = res["settings"]
            print(f"\nEP {ep}, {name}: {len(st['steps'])} steps, {st['tokens']} tokens, {a.repeats} repeats, link "
                  f"{st['link']}, load {load0:.1f} -> {st['load_after']:.1f}")
            print(format_table(res))
            if "shuffle" in res["plans"]:
                print(shuffle_line(res))
            base = res["plans"].get("static")
            if base:
                line = f"EP {ep} {name} vs static: " + "; ".join(
                    f"{p}: a2a bytes x{s['a2a_bytes'] / max(base['a2a_bytes'], 1):.3f}, a2a time "
                    f"x{s['a2a_s'] / base['a2a_s']:.2f}, busiest-rank items x{s['max_items_per_rank'] / base['max_items_per_rank']:.3f}"
                    for p, s in res["plans"].items() if p != "static")
                print(line)
                head.append(line)
            for p, s in res["plans"].items():
                rows.append({"EP": ep, "workload": name, "plan": p, "busiest-rank items": s["max_items_per_rank"],
                             "a2a bytes": s["a2a_bytes"], "a2a s": s["a2a_s"],
                             **({"vs static: a2a time": s["a2a_s"] / base["a2a_s"]} if base else {})})
            results[f"ep{ep}-{name}"] = res
    out = write_bench("ep_runtime", title="Expert parallelism for real: static EP, EPLB and PROBE plans on gloo ranks",
                      headline=head, tables=[table("per plan, summed over the replayed steps and layers", rows)],
                      data={"results": results}, quick=a.quick, path=a.json)
    m = machine_info()
    print(f"\nmachine: {m['cpu']}, {m['cpus']} cores, torch {m.get('torch', '?')}, gloo on CPU; {time.monotonic() - t0:.0f} s; "
          f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
