"""Planner speed: PROBE Algorithm 2 (routecast.place.probe) vs the EPLB baseline (routecast.place.eplb).

Claim: on one CPU core the PROBE planner plans a layer in <= 1 ms for 128 experts on EP 8 and for 256 experts
on EP 32, and at least 10 x faster than routecast's EPLB baseline on the same loads. The planner's loop
(Algorithm 2 lines 4-18), the initial locality-first assignment, the value checks and the result arrays run as
one call of scalar code compiled by numba (cache=True) when numba is installed; only shape checks and the
Plan's construction are Python. The EPLB baseline is batched over layers: its
greedy loops run once per slot for all layers together, so per layer it is far cheaper than the per-call
numbers ANCHORS.md gives for the original (torch) and vLLM's numpy port.

Method: per case, one step's routing counts per (layer, source rank, expert) are drawn once (seed 0): expert
popularity log-normal (sigma 1) per layer with a +-50% jitter per (source rank, expert), counts Poisson with
mean tokens_per_rank x top-k x popularity. Both planners get identical loads: PROBE the (L, G, E) counts
with the static sharding as baseline and a hiding window of 3 transfers per rank (its full budget of 3
redundant experts, so the loop runs its most iterations); EPLB their sum over ranks with the case's slot
count (the ANCHORS.md geometries). Two modes, each timed in the calling thread's CPU time, repeats
interleaved (PROBE, EPLB, PROBE, ...), median reported: "batched" plans all L layers in one call (median
per call / L); "one layer per call" plans the first 8 layers one call each (the PROBE runtime plans layer
l+1 while layer l runs), where the fixed cost of each call is not shared between layers. The first call's
JIT cost is reported separately (compile into an empty cache in a fresh process, then a fresh process
loading the cache) and excluded from the timings. The table also shows the max/mean rank load of each
result on that same step (in sample for both) and the sharded start.

Run: python benchmarks/planner_speed.py [--reps N]
Writes out/bench/planner_speed.json; ends with one line per case:
`CASE: planner X ms, EPLB baseline Y ms, R x faster` (per layer; R = EPLB / planner, below 1 when the planner
is the slower one, which the line then says), with the inter-quartile range of the per-repeat ratio.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core, as the claim says

import argparse  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.common.machine import cpu_name  # noqa: E402
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


_JIT_PROBE = """
import time
t0 = time.perf_counter()
import numpy as np
from routecast.place.probe import plan_layers, token_costs
plan_layers(np.array([[[5, 1], [3, 0]]]), np.eye(2, dtype=bool), costs=token_costs(), hide_window_s=np.inf)
print(time.perf_counter() - t0)
"""


def jit_seconds() -> dict[str, object]:
    """Seconds of import + first plan in a fresh process: compiling into an empty cache, then from the cache."""
    try:
        import numba
    except ImportError:
        return {"numba": None}
    out: dict[str, object] = {"numba": numba.__version__}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        for key in ("first_call_compile_s", "first_call_cached_s"):
            run = subprocess.run([sys.executable, "-c", _JIT_PROBE], env=env, capture_output=True, text=True, check=True)
            out[key] = float(run.stdout.strip().splitlines()[-1])
    return out


def step_loads(rng: np.random.Generator, L: int, G: int, E: int, K: int, tokens_per_rank: int) -> np.ndarray:
    """(L, G, E) int64 routing counts of one step: log-normal popularity, per-rank jitter, Poisson counts."""
    pop = rng.lognormal(0.0, 1.0, size=(L, 1, E)) * rng.uniform(0.5, 1.5, size=(L, G, E))
    pop /= pop.sum(axis=2, keepdims=True)
    return rng.poisson(pop * tokens_per_rank * K).astype(np.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="timed calls of each planner per case (median reported)")
    ap.add_argument("--out", default="out/bench", help="output directory")
    ap.add_argument("--quick", action="store_true", help="3 repeats instead of --reps")
    args = ap.parse_args()
    if args.quick:
        args.reps = min(args.reps, 3)
    rng = np.random.default_rng(0)
    rows = []
    jit = jit_seconds()
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores (1 used), numpy {np.__version__}, "
          f"Python {platform.python_version()}, numba {jit['numba']}")
    if jit["numba"]:
        print(f"first call in a fresh process (import + JIT, excluded below): {jit['first_call_compile_s']:.1f} s "
              f"compiling into an empty cache, {jit['first_call_cached_s']:.2f} s loading the cache")
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
        for _ in range(max(1, args.reps // 3)):
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
            "speedup": e_ms / p_ms, "speedup_q25_q75": np.percentile(np.divide(t_eplb, t_probe), [25, 75]).tolist(),
            "probe_ms_one_layer_call": p1_ms, "eplb_ms_one_layer_call": e1_ms,
            "speedup_one_layer_call_q25_q75": np.percentile(np.divide(one_eplb, one_probe), [25, 75]).tolist(),
            "speedup_one_layer_call": e1_ms / p1_ms, "ir_start": ir_start, "ir_probe": ir_probe,
            "ir_eplb_in_sample": ir_eplb,
            "probe_mean_iterations": iters, "probe_new_replicas": int(plan.replicas_LEG.sum()),
            "probe_times_s": t_probe, "eplb_times_s": t_eplb,
            "anchor_eplb_ms_per_call": {"torch": ANCHOR_MS[case][0], "numpy_port": ANCHOR_MS[case][1]},
        })
    doc = {"jit": jit, "reps": args.reps, "timer": "time.thread_time, median of interleaved repeats", "cases": rows}
    head = []
    for r in rows:
        for mode, p_key, e_key, q_key in (
                ("batched", "probe_ms_per_layer", "eplb_ms_per_layer", "speedup_q25_q75"),
                ("one layer per call", "probe_ms_one_layer_call", "eplb_ms_one_layer_call",
                 "speedup_one_layer_call_q25_q75")):
            x = r[e_key] / r[p_key]
            slower = f" (the planner is {1 / x:.1f} x slower)" if x < 1 else ""
            lo, hi = r[q_key]
            head.append(f"{r['case']} ({mode}): planner {r[p_key]:.3f} ms, EPLB baseline {r[e_key]:.3f} ms, "
                        f"{x:.2f} x faster{slower}; per-repeat ratio q25-q75 {lo:.2f}-{hi:.2f}")
    cols = ("case", "layers", "ranks", "experts", "probe_ms_per_layer", "eplb_ms_per_layer", "speedup",
            "probe_ms_one_layer_call", "eplb_ms_one_layer_call", "ir_start", "ir_probe", "ir_eplb_in_sample")
    write_bench("planner_speed", title="PROBE's planner against the EPLB baseline: time per layer and imbalance",
                headline=head, tables=[table(f"median of {args.reps} interleaved calls (thread CPU time)",
                                             [{c: r[c] for c in cols} for r in rows],
                                             note="target: <= 1 ms per layer on one core, >= 10 x faster than EPLB")],
                data=doc, quick=args.quick, path=Path(args.out) / "planner_speed.json")
    for r in rows:
        torch_ms, numpy_ms = ANCHOR_MS[r["case"]]
        print(f"{r['case']}: ANCHORS EPLB per call {torch_ms} ms (torch) / {numpy_ms} ms (vLLM numpy port) "
              f"for {r['layers']} layers; routecast EPLB {r['eplb_ms_per_call']:.1f} ms")
    print("target: <= 1 ms per layer on one core and >= 10 x faster than EPLB; batched = one call for all L "
          "layers / L")
    print("\n".join(head))

if __name__ == "__main__":
    main()
