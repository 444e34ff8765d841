"""`routecast run --offload --geometry NAME`: one policy, and a baseline, on a production expert geometry.

    routecast run --offload --geometry mixtral-8x7b --policy fc-evict --budget 50%
    routecast run --offload --geometry deepseek-v2-lite --routing out/traces/fine --prefetch lookahead --policy lfu
    routecast run --offload --geometry deepseek-v2-lite --prefetch lookahead --prefetch-top 3 --policy fc-evict
    routecast run --offload --geometry mixtral-8x7b --policy fc-evict --reuse-probe --geometry-order request
    routecast run --offload --geometry mixtral-8x7b --geometry-layers 8 --geometry-device cuda --policy lirs

The layers of geometry.py (random bf16 weights written once under --weights-dir, real routing of a captured trace,
the standard 'fine' one by default; with --geometry-device cuda, every expert in pinned host memory copied to GPU
slots and computed there, gpu.py) run `--geometry-warmup` decode tokens untimed, then `--geometry-tokens` timed,
through the offload runtime's ExpertStore with the chosen policy (and PROBE's lookahead prefetch with
--prefetch lookahead, gated to each token's N most likely experts with --prefetch-top N; and fc-evict reading the
reuse probe with --reuse-probe); then the same with the baseline
policy (default lru). Per run: seconds per token, hit
ratio, expert reads, read time per expert, and the replay's prediction (geometry.replay_geometry, one link at the
read time measured right before the runs) beside the measured time; the eviction bound (LRU, LFU, Belady misses
on the same routing). One round each: `python benchmarks/offload.py --geometry NAME` runs every policy in
interleaved rounds and gives medians with their spread.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from routecast.cache.zoo import is_fc_evict
from routecast.common.errors import ConfigError
from routecast.runtime.offload.geometry import (
    KERNELS,
    WEIGHT_NOTE,
    Geometry,
    GeometryRun,
    eviction_bound,
    geometry,
    replay_geometry,
    run_geometry,
    write_weights,
)
from routecast.runtime.offload.geometry_routing import check_order, trace_routing
from routecast.runtime.offload.gpu import PinnedTier, check_device, check_host_memory, device_name
from routecast.runtime.offload.store import RUNTIME_POLICIES, check_runtime_policy
from routecast.runtime.offload.tier import measure_concurrency

FIG_KEYS = ("s_per_token", "hit_ratio", "hits", "misses", "reads", "bytes_read", "read_s_per_expert",
            "compute_s_per_expert", "stall_s", "late", "prefetch_issued", "prefetch_useful", "predict_s", "wall_s")


def geometry_main(name: str | Geometry, *, routing: str | Path | None = None, layers: int | None = None, tokens: int = 24,
                  warmup: int = 16, budget: str = "50%", policy: str = "lru", prefetch: str = "none",
                  baseline: str = "lru", loader_threads: int = 2, direct: bool = True,
                  weights_dir: str | Path = "out/geometry", order: str = "step",
                  reuse_probe: bool = False, device: str | None = None, prefetch_top: int = 0,
                  kernel: str = "numba") -> dict[str, Any]:
    """One geometry run of `policy` (+ lookahead prefetch) and one of `baseline` ('none': skipped) -> {'geometry',
    'budget', 'runs': {label: figures + replay}, 'bound', 'tier_read_s', 'x_baseline', ...}. name: a GEOMETRIES
    name, or a Geometry (tests: a tiny one; `layers` is then its own). order: the decode tokens' order
    (geometry_routing.trace_routing: 'step' or 'request'). reuse_probe: `policy` (fc-evict) reads the reuse probe
    (geometry_routing.trace_routing). device: 'cuda' (or 'cuda:N', 'cpu'): every expert in pinned host memory,
    copied to slots on that device and computed there (gpu.PinnedTier; no weights file); None: the weights file on
    disk, computed on the CPU. prefetch_top: the lookahead prefetches only each token's N most likely experts per
    layer (geometry.prefetch_sets; 0 = its whole top-k). kernel: a CPU run's expert compute (geometry.KERNELS:
    numba's bf16 loop, expert_kernel.py, or torch's matmul). Every flag is checked before the weights are written or the
    trace is read."""
    from routecast.cache.replay import parse_budget
    from routecast.cache.zoo import check_reuse_policy
    from routecast.trace.standard import standard_trace

    geom = name if isinstance(name, Geometry) else geometry(name, layers)
    check_runtime_policy(policy)
    if baseline != "none" and baseline not in RUNTIME_POLICIES:
        raise ConfigError(f"--baseline is {baseline!r}; expected none or one of {', '.join(RUNTIME_POLICIES)}.")
    if prefetch not in ("none", "lookahead"):
        raise ConfigError(f"--prefetch is {prefetch!r} with --geometry; expected none or lookahead (PROBE's gates on the "
                          "trace's recorded router inputs: the geometry has no model to fit a predictor on).")
    if prefetch_top and prefetch != "lookahead":
        raise ConfigError(f"--prefetch-top {prefetch_top} gates the lookahead's prefetch; --prefetch is {prefetch!r}: "
                          "expected --prefetch lookahead with it.")
    from routecast.runtime.offload.run import check_prefetch_top

    check_prefetch_top(prefetch_top, geom.top_k)
    if tokens < 1 or warmup < 0:
        raise ConfigError(f"--geometry-tokens {tokens} / --geometry-warmup {warmup}: expected at least 1 timed token and "
                          "0 or more warm-up tokens.")
    check_order(order)
    if kernel not in KERNELS:
        raise ConfigError(f"--geometry-kernel is {kernel!r}; expected one of {', '.join(KERNELS)}.")
    if device is not None:
        check_device(device)
        check_host_memory(geom)
    if reuse_probe:
        check_reuse_policy(policy)
    if loader_threads < 1:
        raise ConfigError(f"--loader-threads is {loader_threads}; expected at least 1.")
    n_keys = geom.layers * geom.experts
    slots = parse_budget(budget, n_keys, geom.expert_bytes)
    trace = Path(routing) if routing is not None else standard_trace("fine")
    if not (trace / "trace.json").is_file():
        raise ConfigError(f"--routing {trace}: no trace there; expected a folder written by `routecast trace capture`.")
    pf = prefetch == "lookahead"
    route = trace_routing(trace, geom, warmup + tokens, forecast=pf, order=order, reuse_probe=reuse_probe,
                          token_table=is_fc_evict(policy))
    print(f"{geom.name} geometry: {geom.layers} MoE layers (scaled to this disk; --geometry-layers) x {geom.experts} "
          f"experts top-{geom.top_k}, {geom.expert_bytes / 1e6:.1f} MB per expert; budget {slots} of {n_keys} experts; "
          f"{WEIGHT_NOTE}; routing: {warmup} warm-up + {tokens} timed decode tokens of {trace} in {order} order, "
          f"geometry layer g <- trace layer g mod {route['trace_layers']}", flush=True)
    if is_fc_evict(policy):
        print("fc-evict reads the token table's forecast of each known input token (conditional-token, fitted on the "
              "trace's other documents)" if "token_use" in route else "fc-evict runs without token forecasts: no other "
              "document in the trace to fit the token table on", flush=True)
    t0 = time.perf_counter()
    shared = path = None
    if device is not None:
        shared = PinnedTier(geom, device)
        print(f"{device_name(shared.device)}: every expert in host memory ({shared.mode}, "
              f"{n_keys * geom.expert_bytes / 1e9:.1f} GB) in {time.perf_counter() - t0:.0f} s", flush=True)
    else:
        path = write_weights(weights_dir, geom)
        if time.perf_counter() - t0 > 1.0:
            print(f"wrote {path} ({path.stat().st_size / 1e9:.1f} GB, once: later runs reuse it)", flush=True)
    probe = GeometryRun(path, geom, budget=loader_threads, loader_threads=1, direct=direct, tier=shared)
    try:
        read_s = measure_concurrency(probe.tier, [probe.store.slot_dests(i) for i in range(loader_threads)],
                                     threads=(loader_threads,), reads=max(8, 2 * loader_threads))[loader_threads]
    finally:
        probe.close()
    mode = shared.mode if shared is not None else "o_direct" if direct else "fadvise"
    print(f"tier: {read_s * 1e3:.1f} ms per expert read with {loader_threads} in flight "
          f"({mode}; the replay prices each read with it)", flush=True)
    gate = f" top{prefetch_top}" if prefetch_top else ""
    configs = [(f"{f'lookahead{gate}+' if pf else ''}{policy}{'+probe' if reuse_probe else ''}", policy, pf, reuse_probe)]
    if baseline != "none" and (baseline, False, False) != (policy, pf, reuse_probe):
        configs.append((baseline, baseline, False, False))
    runs: dict[str, dict[str, Any]] = {}
    for label, pol, p, ru in configs:
        r = run_geometry(path, geom, route, budget=slots, policy=pol, prefetch=p, warmup=warmup,
                         loader_threads=loader_threads, direct=direct, reuse=ru, tier=shared,
                         pred_top=prefetch_top if p else 0, kernel=kernel)
        rep = replay_geometry(r, geom, route, xfer_s=read_s)
        runs[label] = {**{k: r[k] for k in FIG_KEYS if k in r}, "policy": pol, "prefetch": p, "reuse_probe": ru,
                       "replay_s_per_token": rep["s_per_token"], "replay_hit_ratio": rep["hit_ratio"],
                       "measured_vs_replay": r["s_per_token"] / rep["s_per_token"] - 1}
        print(format_run(label, runs[label]), flush=True)
    out = {"geometry": vars(geom) | {"expert_bytes": geom.expert_bytes}, "budget": slots, "experts_total": n_keys,
           "trace": str(trace), "order": order, "warmup": warmup, "tokens": tokens, "tier_read_s": read_s, "note": WEIGHT_NOTE,
           "loader_threads": loader_threads, "prefetch_top": prefetch_top, "runs": runs, "bound": eviction_bound(geom, route, slots),
           "load_average": os.getloadavg()[0], "device": device_name(shared.device) if shared is not None else "cpu",
           "tier_mode": mode, "kernel": "torch" if shared is not None else kernel}
    first, *rest = runs
    out["x_baseline"] = runs[rest[0]]["s_per_token"] / runs[first]["s_per_token"] if rest else None
    return out


def format_run(label: str, r: dict[str, Any]) -> str:
    return (f"{label}: {r['s_per_token']:.3f} s/token ({1 / r['s_per_token']:.2f} tokens/s); hit ratio {r['hit_ratio']:.3f} "
            f"({r['misses']} misses); {r['reads']} reads, {r['bytes_read'] / 1e9:.2f} GB, {r['read_s_per_expert'] * 1e3:.1f} "
            f"ms per read; stall {r['stall_s']:.2f} s; replay predicts {r['replay_s_per_token']:.3f} s/token "
            f"(measured {r['measured_vs_replay']:+.1%})")


def format_geometry(res: dict[str, Any]) -> str:
    """The closing lines of a geometry run: the ratio to the baseline and the eviction bound."""
    g, b = res["geometry"], res["bound"]
    labels = list(res["runs"])
    lines = []
    if res["x_baseline"] is not None:
        lines.append(f"{labels[0]} {res['x_baseline']:.2f}x {labels[1]} tokens/s at budget {res['budget']} of "
                     f"{res['experts_total']} experts (one round each; `python benchmarks/offload.py --geometry "
                     f"{g['name']}` gives medians over interleaved rounds)")
    lines.append(f"eviction bound on the same {res['warmup'] + res['tokens']} tokens (no I/O): misses LRU {b['lru']:.0f}, "
                 f"LFU {b['lfu']:.0f}, Belady {b['belady']:.0f}: no eviction rule reads less than "
                 f"{b['belady'] / max(b['lru'], 1):.2f}x LRU's experts")
    on = f"the CPU (no GPU; {res['kernel']} kernel)" if res["device"] == "cpu" else res["device"]
    lines.append(f"{res['note']}; load average {res['load_average']:.1f}; experts computed on {on} ({res['tier_mode']})")
    return "\n".join(lines)
