"""Replay speed: (token, layer) events per second of the compiled cache kernel, vs a pure-Python LRU.

Claim: the numba kernel (routecast.cache.kernel, cache=True) replays >= 1 M (token, layer) events/s on one
core for every policy, SE-MoE included on the DeepSeek-V3 geometry (it prefetches all 256 experts of the next
layer at every access: ~256 evictions and prefetches per access). Baseline in the same run: a plain Python replay (OrderedDict LRU over the same
accesses, hits first, no timing model); its demand-load count must equal the kernel's LRU count, which
cross-checks the kernel. Events = tokens x MoE layers of the replayed trace. Access building (numpy, once
per trace) is timed separately. Each policy's kernel time is the calling thread's CPU time (the machine is
shared; wall time moved 8x between repeats), median of --reps runs after a warm-up call (the JIT cost is
excluded; with cache=True it is paid once per machine); the Python baseline is timed the same way.

Traces: synthetic presets generated in-process (seed 0): mixtral-8x7b (32 x 8, 300 requests) and
deepseek-v3 (58 x 256, 10 requests); a captured trace with --trace DIR.

Windowed replay (what `routecast cache replay` runs: the kernel carries its state from one window of steps
to the next) is timed the same way with --window-steps steps per kernel call, and each policy's result is
checked bit-identical to the one-call replay.

Run: python benchmarks/cache_replay_speed.py [--reps 3] [--trace DIR] [--window-steps 16]
Writes out/bench/cache_replay_speed.json; ends with one line per trace:
`TRACE: kernel LRU X M events/s, Python LRU Y M events/s, R x; slowest policy P Z M events/s; windowed ...`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402
from collections import OrderedDict  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from routecast.cache.replay import (  # noqa: E402
    POLICIES,
    ReplayConfig,
    build_accesses,
    forecast_entries,
    run_policy,
    true_sets,
)
from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.common.machine import machine_info  # noqa: E402
from routecast.sim.hardware import load_hardware  # noqa: E402
from routecast.trace import Trace  # noqa: E402


def python_lru(acc, budget: int) -> int:
    """Demand loads of a pooled LRU with hits-first accesses, in plain Python (the baseline)."""
    cache: OrderedDict[int, None] = OrderedDict()
    loads = 0
    off, keys = acc.req_off.tolist(), acc.req_key.tolist()
    for a in range(acc.num_accesses):
        req = keys[off[a]:off[a + 1]]
        hits = {k for k in req if k in cache}
        for k in sorted(hits):
            cache.move_to_end(k)
        for k in req:
            if k in hits:  # computed already, even if a later miss of this access evicts it
                continue
            loads += 1
            if len(cache) >= budget:
                cache.popitem(last=False)
            cache[k] = None
    return loads


def _same(a: dict, b: dict) -> bool:
    """Two run_policy rows equal in every field but the timing."""
    return all(k in ("replay_s", "events_per_s") or a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)


def bench(name: str, trace: Trace, reps: int, window_steps: int) -> dict:
    t0 = time.perf_counter()
    acc = build_accesses(trace)
    build_s = time.perf_counter() - t0
    events = trace.num_tokens * trace.spec.num_layers
    budget = acc.L * acc.E // 2
    cfg = ReplayConfig(budget=budget, hardware=load_hardware("h100-sxm"))
    fc = forecast_entries(acc, true_sets(acc))
    eb = trace.spec.expert_bytes or 1
    per = {}
    loads = {}
    for pol in POLICIES:
        if POLICIES[pol].per_layer and budget < acc.L:
            continue
        run_policy(acc, pol, cfg, forecast=fc, expert_bytes=eb)  # warm-up (JIT or cache load)
        ts = []
        for _ in range(reps):
            r = run_policy(acc, pol, cfg, forecast=fc, expert_bytes=eb)
            ts.append(r["replay_s"])
        wts, same = [], True
        for _ in range(reps):
            w = run_policy(acc, pol, cfg, forecast=fc, expert_bytes=eb, window_steps=window_steps)
            wts.append(w["replay_s"])
            same = same and _same(w, r)
        per[pol] = {"median_s": float(np.median(ts)), "min_s": float(min(ts)), "max_s": float(max(ts)),
                    "events_per_s": events / float(np.median(ts)),
                    "windowed_events_per_s": events / float(np.median(wts)), "windowed_identical": same}
        loads[pol] = r["demand_loads"]
    t0 = time.thread_time()
    py_loads = python_lru(acc, budget)
    py_s = time.thread_time() - t0
    slowest = min(per, key=lambda p: per[p]["events_per_s"])
    wslow = min(per, key=lambda p: per[p]["windowed_events_per_s"])
    return {"trace": name, "tokens": trace.num_tokens, "layers": acc.L, "experts": acc.E, "events": events,
            "accesses": acc.num_accesses, "budget": budget, "build_accesses_s": build_s, "policies": per,
            "python_lru_s": py_s, "python_lru_events_per_s": events / py_s, "python_lru_loads": py_loads,
            "kernel_lru_loads": loads["lru"], "lru_loads_agree": py_loads == loads["lru"], "slowest": slowest,
            "slowest_events_per_s": per[slowest]["events_per_s"], "window_steps": window_steps,
            "windowed_slowest": wslow, "windowed_slowest_events_per_s": per[wslow]["windowed_events_per_s"],
            "windowed_identical": all(v["windowed_identical"] for v in per.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="timed repeats per policy (median reported)")
    ap.add_argument("--trace", default=None, help="also time a captured trace directory")
    ap.add_argument("--window-steps", type=int, default=16, help="steps per kernel call of the windowed replay")
    ap.add_argument("--out", default="out/bench/cache_replay_speed.json", help="JSON output")
    ap.add_argument("--quick", action="store_true", help="1 repeat, the mixtral-8x7b trace only (100 requests)")
    a = ap.parse_args()
    if a.quick:
        a.reps = 1
    from routecast.trace.synth import generate
    from routecast.trace.synth_presets import preset_config

    traces = [("mixtral-8x7b (synthetic)", generate(preset_config("mixtral-8x7b", requests=100 if a.quick else 300,
                                                                            seed=0)))]
    if not a.quick:
        traces.append(("deepseek-v3 (synthetic)", generate(preset_config("deepseek-v3", requests=10, seed=0))))
    if a.trace:
        from routecast.trace.io import read_trace

        traces.append((Path(a.trace).name, read_trace(a.trace, mmap=False, load_hidden=False, load_logits=False)))
    results = [bench(n, t, a.reps, a.window_steps) for n, t in traces]
    print(f"{'trace':<26} {'policy':<13} {'M events/s':>11} {'spread (min..max s)':>22} {'windowed':>9} {'same':>5}")
    for r in results:
        for p, v in r["policies"].items():
            print(f"{r['trace']:<26} {p:<13} {v['events_per_s'] / 1e6:>11.2f} {v['min_s']:>10.4f}..{v['max_s']:.4f} "
                  f"{v['windowed_events_per_s'] / 1e6:>9.2f} {'yes' if v['windowed_identical'] else 'NO':>5}")
        print(f"{r['trace']:<26} {'python LRU':<13} {r['python_lru_events_per_s'] / 1e6:>11.2f}"
              f"   (LRU demand loads: kernel {r['kernel_lru_loads']}, Python {r['python_lru_loads']})")
    head = []
    for r in results:
        lru = r["policies"]["lru"]["events_per_s"]
        head.append(f"{r['trace']}: kernel LRU {lru / 1e6:.2f} M events/s, Python LRU {r['python_lru_events_per_s'] / 1e6:.2f} "
              f"M events/s, {lru / r['python_lru_events_per_s']:.1f} x; slowest policy {r['slowest']} "
              f"{r['slowest_events_per_s'] / 1e6:.2f} M events/s; windowed ({r['window_steps']} steps a call) slowest "
              f"{r['windowed_slowest']} {r['windowed_slowest_events_per_s'] / 1e6:.2f} M events/s, bit-identical to one "
              f"call: {'yes' if r['windowed_identical'] else 'NO'}")
    rows = [{"trace": r["trace"], "policy": p, "M events/s": v["events_per_s"] / 1e6,
             "windowed M events/s": v["windowed_events_per_s"] / 1e6, "windowed identical": v["windowed_identical"]}
            for r in results for p, v in r["policies"].items()]
    rows += [{"trace": r["trace"], "policy": "python LRU", "M events/s": r["python_lru_events_per_s"] / 1e6}
             for r in results]
    write_bench("cache_replay_speed", title="Cache replay kernel speed against a Python LRU", headline=head,
                tables=[table(f"replay speed, median of {a.reps} runs (thread CPU time)", rows)],
                data={"results": results}, quick=a.quick, path=a.out)
    print(f"machine: {machine_info().get('cpu', '?')}; wrote {a.out}")
    print("\n".join(head))


if __name__ == "__main__":
    main()
