"""Planner speed: PROBE Algorithm 2 (routecast.place.probe) vs the EPLB baseline (routecast.place.eplb).

Claim: on one CPU core the PROBE planner plans a layer in <= 1 ms for 128 experts on EP 8 and for 256 experts
on EP 32. For scale it is timed against routecast's EPLB baseline on the same loads in the same run. Both are
batched over layers; EPLB's greedy loops run once per slot for all layers together, so this EPLB is far faster
than the per-layer numbers ANCHORS.md gives for the original (torch) and vLLM's numpy port; PROBE's loop runs
up to k_max = 16 moves per layer, each a handful of small array operations.

Method: per case, one step's routing counts per (layer, source rank, expert) are drawn once (seed 0): expert
popularity log-normal (sigma 1) per layer with a +-50% jitter per (source rank, expert), counts Poisson with
mean tokens_per_rank x top-k x popularity. Both planners get identical loads: PROBE the (L, G, E) counts
with the static sharding as baseline and a hiding window of 3 transfers per rank (its full budget of 3
redundant experts, so the loop runs its most iterations); EPLB their sum over ranks with the case's slot
count (the ANCHORS.md geometries). Each call plans all L layers (both are batched over layers); repeats are
interleaved (PROBE, EPLB, PROBE, ...), each timed in the calling thread's CPU time; the median per call is
divided by L. A second measurement plans one layer per call (the PROBE runtime plans layer l+1 while layer l
runs, one layer at a time): median over calls on the first 8 layers, interleaved the same way; there the
fixed cost of each numpy call is not shared between layers. The table also shows the max/mean rank load of each result on that same step (in sample for
both) and the sharded start.

Run: python benchmarks/planner_speed.py [--reps N]
Writes out/bench/planner_speed.json; ends with one line per case:
`CASE: planner X ms, EPLB baseline Y ms, R x faster` (per layer; R = EPLB / planner, below 1 when the planner
is the slower one, which the line then says).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core, as the claim says

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from routecast.place.duplication import sharded_placement  # noqa: E402
from routecast.place.eplb import placement_ir, rebalance_experts  # noqa: E402
from routecast.place.probe import plan_layers, planner_costs  # noqa: E402
from routecast.sim.hardware import load_hardware  # noqa: E402
from routecast.sim.models import load_model  # noqa: E402

# ANCHORS.md, EPLB per call (all layers) on a machine like ours: original torch / vLLM numpy port, in ms.
ANCHOR_MS = {"128 experts / EP 8": (558, "63-84"), "256 experts / EP 32": ("700-5600", "82-123")}

# (case, model profile, hardware, MoE layers, EP ranks, EPLB slots, EPLB groups, EPLB nodes, tokens per rank)
CASES = [
    ("128 experts / EP 8", "qwen3-235b-a22b", "h100-sxm", 94, 8, 144, 1, 1, 1024),
    ("256 experts / EP 32", "deepseek-v3", "h100-sxm", 58, 32, 288, 8, 4, 1024),
]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def step_loads(rng: np.random.Generator, L: int, G: int, E: int, K: int, tokens_per_rank: int) -> np.ndarray:
    """(L, G, E) int64 routing counts of one step: log-normal popularity, per-rank jitter, Poisson counts."""
    pop = rng.lognormal(0.0, 1.0, size=(L, 1, E)) * rng.uniform(0.5, 1.5, size=(L, G, E))
    pop /= pop.sum(axis=2, keepdims=True)
    return rng.poisson(pop * tokens_per_rank * K).astype(np.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="timed calls of each planner per case (median reported)")
    ap.add_argument("--out", default="out/bench", help="output directory")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    print(f"machine: {_cpu_name()}, {os.cpu_count()} cores (1 used), numpy {np.__version__}, "
          f"Python {platform.python_version()}")
    print(f"{'case':<20} {'L':>3} {'G':>3} {'E':>4} {'slots':>5} {'PROBE ms/layer':>15} {'EPLB ms/layer':>14} "
          f"{'x':>5} {'1-layer PROBE':>14} {'1-layer EPLB':>13} {'IR start':>9} {'IR PROBE':>9} {'IR EPLB':>8} "
          f"{'iters':>6}")
    for case, model_name, hw_name, L, G, slots, groups, nodes, tpr in CASES:
        model, hw = load_model(model_name), load_hardware(hw_name)
        E, K = model.num_experts, model.top_k
        x = step_loads(rng, L, G, E, K, tpr)
        w = x.sum(axis=1)
        P0 = sharded_placement(E, G)
        costs = planner_costs(model, hw)
        window = 3 * costs.transfer_s

        def probe_call(x=x, P0=P0, costs=costs, window=window):
            return plan_layers(x, P0, costs=costs, hide_window_s=window)

        def eplb_call(w=w, slots=slots, groups=groups, nodes=nodes, G=G):
            return rebalance_experts(w, slots, groups, nodes, G)

        plan, (phy2log, _, _) = probe_call(), eplb_call()  # warm-up, and the results shown
        t_probe, t_eplb = [], []
        for _ in range(args.reps):
            for fn, acc in ((probe_call, t_probe), (eplb_call, t_eplb)):
                c0 = time.thread_time()
                fn()
                acc.append(time.thread_time() - c0)
        p_ms, e_ms = np.median(t_probe) / L * 1e3, np.median(t_eplb) / L * 1e3
        one_probe, one_eplb = [], []
        for _ in range(max(1, args.reps // 5)):
            for lay in range(min(8, L)):
                c0 = time.thread_time()
                plan_layers(x[lay:lay + 1], P0, costs=costs, hide_window_s=window)
                c1 = time.thread_time()
                rebalance_experts(w[lay:lay + 1], slots, groups, nodes, G)
                one_probe.append(c1 - c0)
                one_eplb.append(time.thread_time() - c1)
        p1_ms, e1_ms = float(np.median(one_probe) * 1e3), float(np.median(one_eplb) * 1e3)
        ir_start, ir_probe = float(plan.start_ir_L.mean()), float(plan.ir_L.mean())
        ir_eplb = float(placement_ir(w, phy2log, G).mean())
        iters = float(plan.iterations_L.mean())
        print(f"{case:<20} {L:>3} {G:>3} {E:>4} {slots:>5} {p_ms:>15.3f} {e_ms:>14.3f} {e_ms / p_ms:>5.2f} "
              f"{p1_ms:>14.3f} {e1_ms:>13.3f} {ir_start:>9.3f} {ir_probe:>9.3f} {ir_eplb:>8.3f} {iters:>6.1f}")
        rows.append({
            "case": case, "model": model_name, "hardware": hw_name, "layers": L, "ranks": G, "experts": E,
            "top_k": K, "tokens_per_rank": tpr, "eplb_slots": slots, "eplb_groups": groups, "eplb_nodes": nodes,
            "hide_window_s": window, "probe_ms_per_layer": p_ms, "eplb_ms_per_layer": e_ms,
            "probe_ms_per_call": float(np.median(t_probe) * 1e3), "eplb_ms_per_call": float(np.median(t_eplb) * 1e3),
            "speedup": e_ms / p_ms, "probe_ms_one_layer_call": p1_ms, "eplb_ms_one_layer_call": e1_ms, "ir_start": ir_start, "ir_probe": ir_probe, "ir_eplb_in_sample": ir_eplb,
            "probe_mean_iterations": iters, "probe_new_replicas": int(plan.replicas_LEG.sum()),
            "probe_times_s": t_probe, "eplb_times_s": t_eplb,
            "anchor_eplb_ms_per_call": {"torch": ANCHOR_MS[case][0], "numpy_port": ANCHOR_MS[case][1]},
        })
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
                       "numpy": np.__version__, "python": platform.python_version()},
           "reps": args.reps, "timer": "time.thread_time, median of interleaved repeats", "cases": rows}
    (out / "planner_speed.json").write_text(json.dumps(doc, indent=2))
    for r in rows:
        torch_ms, numpy_ms = ANCHOR_MS[r["case"]]
        print(f"{r['case']}: ANCHORS EPLB per call {torch_ms} ms (torch) / {numpy_ms} ms (vLLM numpy port) "
              f"for {r['layers']} layers; routecast EPLB {r['eplb_ms_per_call']:.1f} ms")
    print("target: <= 1 ms per layer on one core; per layer = one call for all L layers / L")
    for r in rows:
        slower = f" (the planner is {1 / r['speedup']:.1f} x slower)" if r["speedup"] < 1 else ""
        print(f"{r['case']}: planner {r['probe_ms_per_layer']:.3f} ms, EPLB baseline {r['eplb_ms_per_layer']:.3f} ms, "
              f"{r['speedup']:.2f} x faster{slower}; one layer per call: planner {r['probe_ms_one_layer_call']:.2f} ms, "
              f"EPLB {r['eplb_ms_one_layer_call']:.2f} ms")


if __name__ == "__main__":
    main()
