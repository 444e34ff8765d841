"""Speed of the serving simulation (routecast.serve.loop.simulate): simulated requests per minute on one core.

Claim: at least 100,000 simulated requests per minute of CPU time on one core.

Method: Mixtral-8x7B on 2 x H100 (the default engine), eMoE's five tasks, Poisson arrivals at --rate requests/s
(default 32: the engine runs ~70 sequences at a time and meets its SLOs), --requests requests (default 100,000),
every scheduler on the same arrivals. Timed: the event loop only (the engine's price tables are built once, not
timed; their build time is printed). CPU time of this process (time.process_time, single-threaded numpy) is the
figure; wall time is shown beside it, it also counts the time other jobs on a shared machine hold the core.
Prints the load average before and after.

Run: python benchmarks/serve_sim_speed.py [--requests N] [--rate R] [--reps K]
Writes out/bench/serve_sim_speed.json; the last line is the headline.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.common.machine import machine_info  # noqa: E402
from routecast.serve.engine import EngineConfig, build_engine  # noqa: E402
from routecast.serve.loop import simulate  # noqa: E402
from routecast.serve.sched import SCHEDULERS, make_scheduler  # noqa: E402
from routecast.serve.workload import emoe_tasks, make_requests  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000, help="simulated requests per run (default 100000)")
    ap.add_argument("--rate", type=float, default=32.0, help="arrival rate, requests/s (default 32)")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per scheduler (median reported)")
    ap.add_argument("--out", default="out/bench", help="output directory")
    ap.add_argument("--quick", action="store_true", help="10,000 requests, 1 timed run per scheduler")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.reps = min(args.requests, 10_000), 1
    info = machine_info()
    load0 = os.getloadavg()
    print(f"machine: {info['cpu']}, {info['cpus']} cores (1 used), numpy {info['numpy']}, load {load0[0]:.1f}")
    c0 = time.process_time()
    engine = build_engine(EngineConfig(model="mixtral-8x7b", hardware="h100-sxm"))
    build_s = time.process_time() - c0
    req = make_requests(emoe_tasks(), args.requests, args.rate, seed=0)
    print(f"engine: {engine.model.name} on {engine.gpus} x {engine.hw.name}, tables built in {build_s:.2f} s CPU; "
          f"{req.n} requests at {args.rate} req/s ({float(req.arrival[-1]):.0f} s simulated)")
    print(f"{'scheduler':<9} {'cpu s':>8} {'wall s':>8} {'events':>9} {'req/min (cpu)':>14} {'req/min (wall)':>15} "
          f"{'SLO %':>6}")
    rows = []
    for s in SCHEDULERS:
        cpu, wall = [], []
        for _ in range(args.reps):
            c, w = time.process_time(), time.perf_counter()
            res = simulate(engine, req, make_scheduler(s))
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
        m = res.metrics()
        row = {"scheduler": s, "cpu_s": float(np.median(cpu)), "wall_s": float(np.median(wall)), "cpu_all": cpu,
               "wall_all": wall, "events": res.events, "requests": req.n,
               "req_per_min_cpu": 60 * req.n / float(np.median(cpu)),
               "req_per_min_wall": 60 * req.n / float(np.median(wall)), "slo_attainment": m["slo_attainment"]}
        rows.append(row)
        print(f"{s:<9} {row['cpu_s']:>8.2f} {row['wall_s']:>8.2f} {res.events:>9} {row['req_per_min_cpu']:>14,.0f} "
              f"{row['req_per_min_wall']:>15,.0f} {100 * m['slo_attainment']:>6.1f}")
    load1 = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"machine": info, "load_before": load0, "load_after": load1, "rate": args.rate, "requests": req.n,
           "build_cpu_s": build_s, "rows": rows}
    slow = min(rows, key=lambda r: r["req_per_min_cpu"])
    head = [f"slowest scheduler ({slow['scheduler']}): {slow['req_per_min_cpu']:,.0f} simulated requests per CPU "
            f"minute ({slow['req_per_min_wall']:,.0f} per wall minute)"]
    write_bench("serve_sim_speed", title="Serving simulator speed: simulated requests per CPU minute", headline=head,
                tables=[table(f"{req.n} requests at {args.rate} req/s, median of {args.reps} runs",
                              [{k: v for k, v in r.items() if k not in ("cpu_all", "wall_all")} for r in rows])],
                data=doc, quick=args.quick, path=out / "serve_sim_speed.json")
    print(f"load average {load0[0]:.1f} -> {load1[0]:.1f}; wrote {out / 'serve_sim_speed.json'}")
    print(head[0])


if __name__ == "__main__":
    main()
