"""Throughput of the vectorised layer cost model (routecast.sim.cost.layer_cost).

Claim: one call prices a batch of C configurations; on one CPU core it evaluates >= 100,000 MoE layers per
second for the MoE-GPS Figure 6 setting (Mixtral-8x7B, 4 x A100 NVLink, batch 1 x 512 tokens).

Method: per row, draw C per-expert load vectors (Dirichlet, seed 0), place them with contiguous sharding on G
ranks (not timed), then time `layer_cost` over the whole (C, G, E) batch: median of --reps calls, in the
calling thread's CPU time (single-threaded numpy; the wall time is shown too, it also counts the time other
processes on a shared machine hold the core). Evaluations/s = C / median time.

Run: python benchmarks/cost_model_speed.py [--reps N] [--scale F]
Writes out/bench/cost_model_speed.json; the last line is the headline `N layer evaluations/s`.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core, as the claim says

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.common.machine import cpu_name  # noqa: E402
from routecast.sim.cost import layer_cost, moe_gps_options, prefill, probe_options  # noqa: E402
from routecast.sim.hardware import load_hardware  # noqa: E402
from routecast.sim.models import load_model  # noqa: E402
from routecast.sim.scenarios import sharded_counts  # noqa: E402

# (label, model, hardware, ranks, configurations, options preset, tokens)
ROWS = [
    ("MoE-GPS Fig.6", "mixtral-8x7b", "a100-sxm-80gb", 4, 100_000, "moe-gps", 512),
    ("Mixtral EP8", "mixtral-8x7b", "h100-sxm", 8, 100_000, "moe-gps", 512),
    ("OLMoE EP8", "olmoe-1b-7b", "a100-sxm-80gb", 8, 10_000, "moe-gps", 2048),
    ("GPT-OSS EP8", "gpt-oss-120b", "h800", 8, 10_000, "probe", 8192),
    ("DeepSeek-V3 EP32", "deepseek-v3", "h800", 32, 1_000, "probe", 16384),
]
HEADLINE = 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="timed calls per row (median reported)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every row's C (e.g. 0.1 for a smoke run)")
    ap.add_argument("--out", default="out/bench", help="output directory")
    ap.add_argument("--quick", action="store_true", help="3 repeats, every row's C x 0.2")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.scale = min(args.reps, 3), args.scale * 0.2
    rng = np.random.default_rng(0)
    results = []
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores (1 used), numpy {np.__version__}, {platform.python_version()}")
    print(f"{'row':<18} {'model':<14} {'hardware':<14} {'G':>3} {'E':>4} {'C':>7} {'cpu ms':>9} {'wall ms':>9} "
          f"{'evals/s':>10} {'(rank,expert)/s':>15}")
    for label, model_name, hw_name, G, C, preset, tokens in ROWS:
        C = max(1, int(C * args.scale))
        model, hw = load_model(model_name), load_hardware(hw_name)
        E, K = model.num_experts, model.top_k
        loads = rng.dirichlet(np.full(E, 0.5), size=C) * tokens * K
        counts = sharded_counts(loads, G)
        opts = moe_gps_options("nvlink") if preset == "moe-gps" else probe_options("nvlink")
        work = prefill(1, tokens)
        layer_cost(counts[: min(C, 100)], model=model, hw=hw, work=work, opts=opts)  # warm-up
        cpu, wall = [], []
        for _ in range(args.reps):
            c0, w0 = time.thread_time(), time.perf_counter()
            res = layer_cost(counts, model=model, hw=hw, work=work, opts=opts)
            cpu.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - w0)
        t_cpu, t_wall = float(np.median(cpu)), float(np.median(wall))
        rate = C / t_cpu
        print(f"{label:<18} {model_name:<14} {hw_name:<14} {G:>3} {E:>4} {C:>7} {t_cpu * 1e3:>9.1f} {t_wall * 1e3:>9.1f} "
              f"{rate:>10,.0f} {rate * G * E:>15,.0f}")
        results.append({
            "row": label, "model": model_name, "hardware": hw_name, "ranks": G, "experts": E, "configs": C,
            "tokens": tokens, "options": preset, "cpu_s": t_cpu, "wall_s": t_wall, "evals_per_s": rate,
            "mean_total_us": float(res.total.mean() * 1e6),
        })
    h = results[HEADLINE]
    head = [f"{h['evals_per_s']:.0f} layer evaluations/s: {h['row']} ({h['model']} on {h['ranks']} x "
            f"{h['hardware']}, C = {h['configs']}), target >= 100,000"]
    write_bench("cost_model_speed", title="Cost model speed: vectorised layer evaluations per second",
                headline=head, tables=[table(f"median of {args.reps} calls per row, one thread (CPU time)", results)],
                data={"reps": args.reps, "scale": args.scale}, quick=args.quick,
                path=Path(args.out) / "cost_model_speed.json")
    print("\n".join(head))


if __name__ == "__main__":
    main()
