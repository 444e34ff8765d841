"""`benchmarks/offload.py --geometry NAME`: the I/O-bound table (a helper module of offload.py, not a script).

MoE layers of a production expert geometry with random bf16 weights on disk, driven by the real routing of the
standard 'fine' trace (runtime/offload/geometry.py): every demand policy, fc-evict reading the reuse probe
(fc-evict+probe; the probe fitted on the trace's documents that are not driven) and lookahead prefetch with the
--geometry-prefetch policies at each budget, after a warm-up; the loader threads at the fastest measured count of
reads in flight; each run's s/token against the replay's prediction (replay_slots, one link at the read time
measured before every run (median), the run's compute); the eviction bound (cache kernel: LRU, LFU, Belady misses)
over BOUND_TOKENS decode tokens (or all of a --routing-file's, when fewer); out/bench/offload_geometry_NAME.json.
"""

from __future__ import annotations

import math
import os
import statistics
import time

from routecast.cache.zoo import is_fc_evict
from routecast.common.bench import round_order, table, write_bench
from routecast.common.errors import ConfigError
from routecast.runtime.offload.store import RUNTIME_POLICIES


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


BOUND_TOKENS = 400  # decode tokens of the eviction bound (a replay: no I/O, a second)
MOE_INFINITY_S = 0.735  # MoE-Infinity's s per token for Mixtral-8x7B on an A5000 (24 GB, PCIe 4.0): issue 21's reference
# (printed beside the Mixtral geometry only: it is that model's figure)


def gpu_lines(geom, tier: dict, rows: list[dict], budgets: list[int]) -> list[str]:
    """The GPU table's closing lines: the copy speed, and s per token scaled to the model's every MoE layer beside
    MoE-Infinity's figure (a what-if: another GPU and link, and the layer count scaled, as the line says)."""
    from routecast.sim.models import load_model

    full = load_model(geom.name).num_moe_layers
    by = {r["config"]: r for r in rows}
    how = ("pinned host memory -> GPU slots on each loader's own CUDA stream" if tier["mode"] == "pinned->cuda" else
           "host memory -> CPU slots (--geometry-device cpu: the GPU path's code without a GPU)")
    lines = [f"{tier['device']}: {how}, {tier['bandwidth_Bps'] / 1e9:.1f} GB/s per expert copy ({tier['median_read_s'] * 1e3:.2f} ms for "
             f"{geom.expert_bytes / 1e6:.0f} MB, {tier['loader_threads']} in flight)"]
    scale = full / geom.layers
    shown = [("on-demand", by.get("on-demand")), ("all-resident", by.get("all-resident"))]
    for pct in budgets:
        at = [r for r in rows if r["config"].endswith(f"@{pct}%")]
        shown.append((f"LRU@{pct}%", by.get(f"lru@{pct}%")))
        best = max((r for r in at if r["prediction"]), key=lambda r: r["x_lru_tokens_per_s"], default=None)
        shown.append((f"best predictive@{pct}% ({best['config'].rsplit('@', 1)[0]})" if best else "", best))
    parts = [f"{k} {r['s_per_token'] * scale:.3f}" for k, r in shown if r is not None]
    ref = (f"; MoE-Infinity reports {MOE_INFINITY_S} s per token on an A5000 (24 GB: about a quarter of the experts; "
           "PCIe 4.0) - another GPU and link, not a measurement of it here") if geom.name == "mixtral-8x7b" else ""
    lines.append(f"scaled to {geom.name}'s {full} MoE layers (x{scale:g}, a what-if: measured on {geom.layers}), s per "
                 f"token: {', '.join(parts)}{ref}")
    return lines


def best_at(rows: list[dict], pct: int, key: str) -> tuple[dict, dict]:
    """The fastest prediction-driven row and the fastest row without prediction at budget pct% (by `key`, x LRU)."""
    at = [r for r in rows if r["config"].endswith(f"@{pct}%")]
    return (max((r for r in at if r["prediction"]), key=lambda r: r[key]),
            max((r for r in at if not r["prediction"]), key=lambda r: r[key]))


def geometry_configs(geom, budgets: list[int], policies: list[str], combined: list[str], probed: bool,
                     floor: bool, tops: dict[str, int] | None = None) -> list[tuple[str, int, str, bool, bool, int]]:
    """(label, slots, policy, lookahead prefetch, reuse probe, prefetch top) of every run: on-demand, the all-resident
    floor (floor: a GPU run), then per budget each policy, fc-evict reading the reuse probe (probed) and lookahead with
    `combined`, whole and gated to each of `tops` ({'top3': 3}: each token's 3 most likely experts per layer)."""
    n = geom.layers * geom.experts
    configs = [("on-demand", geom.top_k, "lru", False, False, 0)] + (
        [("all-resident", n, "lru", False, False, 0)] if floor else [])
    for pct in budgets:
        b = max(geom.top_k, int(round(pct / 100 * n)))
        configs += [(f"{pol}@{pct}%", b, pol, False, False, 0) for pol in policies]
        configs += [(f"{pol}+probe@{pct}%", b, pol, False, True, 0) for pol in policies if probed and is_fc_evict(pol)]
        for pol in combined:
            configs += [(f"lookahead+{pol}@{pct}%", b, pol, True, False, 0)]
            configs += [(f"lookahead {g}+{pol}@{pct}%", b, pol, True, False, top) for g, top in (tops or {}).items()]
    return configs


def geometry_tops(gates: dict[str, dict], geom) -> dict[str, int]:
    """--gate's parsed rows (benchmarks/offload.py parse_gates) -> {'topN': N} for the geometry's gated lookahead rows;
    a probability gate, or N outside 1..top-k - 1, is one sentence (the geometry's forecast keeps ranks only)."""
    tops = {}
    for g, kw in gates.items():
        top = kw.get("prefetch_top")
        if top is None:
            raise ConfigError(f"--gate {g}: the geometry's lookahead keeps each forecast's rank, not its probability; "
                              "expected topN gates in geometry mode.")
        if not 1 <= top < geom.top_k:
            raise ConfigError(f"--gate {g}: {geom.name} routes top-{geom.top_k}; expected topN with N from 1 to "
                              f"{geom.top_k - 1} (top{geom.top_k} is the whole forecast, the ungated row).")
        tops[g] = top
    return tops


def parse_replay(text: str) -> tuple[float, float]:
    """--geometry-replay READ_MS,COMPUTE_MS -> (read ms, compute ms), or one sentence (checked before any trace is read)."""
    try:
        read_ms, comp_ms = (float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--geometry-replay is {text!r}; expected READ_MS,COMPUTE_MS (two numbers: milliseconds per "
                          "expert read and per expert computed).") from None
    if not (read_ms > 0 and comp_ms >= 0 and math.isfinite(read_ms + comp_ms)):
        raise ConfigError(f"--geometry-replay is {text!r}; expected a positive read time and a compute time of 0 or "
                          "more (finite milliseconds).")
    return read_ms, comp_ms


def replay_table(a, geom, routing, configs: list[tuple], budgets: list[int], warm: int, tokens: int,
                 read_ms: float, comp_ms: float) -> None:
    """--geometry-replay READ_MS,COMPUTE_MS: no run; the replay's s per token for every configuration with reads of
    READ_MS on one link and COMPUTE_MS per expert (a what-if for a device measured elsewhere, e.g. a GPU run's JSON:
    tier.replay_read_s and the rows' compute_s_per_expert), fc-evict rows also without the server's schedule and
    without the waiting requests' next-token forecasts -> out/bench/offload_geometry_NAME[-order]-replay.json."""
    import numpy as np

    from routecast.runtime.offload.geometry import WEIGHT_NOTE, prefetch_sets, replay_geometry, routing_log

    log = routing_log(routing)
    none = np.zeros_like(routing["pred"])
    step = a.geometry_order == "step"
    tok = step and "token_use" in routing
    rows, lru, sets = [], {}, {}
    for label, b, pol, pf, ru, top in configs:
        if pf and top not in sets:  # each gate's sets once
            sets[top] = np.array(prefetch_sets(routing, top), bool)
            sets[top][:, 0] = False  # GeometryRun never forecasts layer 0
        fig = {"log": log, "pred_sets": sets[top] if pf else none, "compute_s_per_expert": comp_ms / 1e3, "policy": pol,
               "budget": b, "prefetch": pf, "reuse": ru, "warmup": warm}
        rep = replay_geometry(fig, geom, routing, xfer_s=read_ms / 1e3)
        fc = is_fc_evict(pol) and step
        alone = replay_geometry(fig, geom, routing, xfer_s=read_ms / 1e3, schedule=False) if fc else None
        no_tok = replay_geometry(fig, geom, routing, xfer_s=read_ms / 1e3, next_tokens=False) if fc and tok else None
        pct = label.rsplit("@", 1)[1] if "@" in label else None
        if pol == "lru" and not pf and pct:
            lru[pct] = rep["s_per_token"]
        rows.append({"config": label, "budget": b, "prediction": pf or is_fc_evict(pol),
                     "replay_s_per_token": rep["s_per_token"], "replay_hit_ratio": rep["hit_ratio"],
                     "without_next_tokens_s_per_token": no_tok["s_per_token"] if no_tok else None,
                     "without_next_tokens_hit_ratio": no_tok["hit_ratio"] if no_tok else None,
                     "without_schedule_s_per_token": alone["s_per_token"] if alone else None,
                     "without_schedule_hit_ratio": alone["hit_ratio"] if alone else None, "pct": pct})
    for r in rows:
        base = lru.get(r.pop("pct"))
        r["x_lru"] = base / r["replay_s_per_token"] if base else None
        for k in ("without_next_tokens", "without_schedule"):
            r[f"{k}_x_lru"] = base / r[f"{k}_s_per_token"] if base and r[f"{k}_s_per_token"] else None
    print(" | ".join(("config", "replay s/token", "hit", "x LRU", "without next tokens: s/token", "hit", "x LRU",
                      "without the schedule: s/token", "hit", "x LRU")))
    for r in rows:
        print(" | ".join((r["config"], f"{r['replay_s_per_token']:.4f}", f"{r['replay_hit_ratio']:.3f}",
                          _f(r["x_lru"], ".2f"), *(_f(r[f"{k}_{c}"], f) for k in ("without_next_tokens",
                                                                                "without_schedule")
                                                   for c, f in (("s_per_token", ".4f"), ("hit_ratio", ".3f"),
                                                                ("x_lru", ".2f"))))))
    head = [f"replay only (no run): {geom.name} geometry, {geom.layers} MoE layers, {warm} warm-up + {tokens} tokens in "
            f"{a.geometry_order} order, reads {read_ms:g} ms on one link, compute {comp_ms:g} ms per expert; {WEIGHT_NOTE}"]
    for pct in budgets:
        best, plain = best_at(rows, pct, "x_lru")
        at = [r for r in rows if r["config"].endswith(f"@{pct}%")]
        alone = [r["without_schedule_x_lru"] for r in at if r["without_schedule_x_lru"] is not None]
        no_tok = [r["without_next_tokens_x_lru"] for r in at if r["without_next_tokens_x_lru"] is not None]
        head.append(f"budget {pct}%: best prediction-driven {best['config'].rsplit('@', 1)[0]} {best['x_lru']:.2f}x LRU "
                    f"tokens/s, best without prediction {plain['config'].rsplit('@', 1)[0]} {plain['x_lru']:.2f}x"
                    + (f"; fc-evict rows without the next-token forecasts at most {max(no_tok):.2f}x" if no_tok else "")
                    + (f"; without the server's schedule at most {max(alone):.2f}x" if alone else ""))
    for line in head:
        print(line)
    name = f"offload_geometry_{geom.name}" + ("" if step else f"-{a.geometry_order}") + "-replay"
    write_bench(name, title=f"The replay's I/O-bound table: {geom.name} geometry, {a.geometry_order} order, "
                f"{read_ms:g} ms reads, {comp_ms:g} ms compute", headline=head, quick=a.quick,
                tables=[table(f"replayed s per token ({geom.name} geometry, real routing)", rows)],
                data={"geometry": vars(geom) | {"expert_bytes": geom.expert_bytes}, "read_ms": read_ms,
                      "compute_ms": comp_ms, "tokens": tokens, "warmup": warm, "order": a.geometry_order, "rows": rows})
    print(f"wrote out/bench/{name}.json")


def main_geometry(a, gates: dict[str, dict]) -> None:
    """The I/O-bound table: s per token per policy and budget on the geometry's random-weight layers driven by the
    'fine' trace's routing after a warm-up, with the replay's prediction (geometry.replay_geometry: replay_slots
    with the measured tier and compute). gates: --gate parsed (geometry_tops: topN rows of the lookahead)."""
    from routecast.common.outputs import check_out_file
    from routecast.runtime.offload.geometry import (
        WEIGHT_NOTE,
        WEIGHTS_DIR,
        GeometryRun,
        eviction_bound,
        geometry,
        replay_geometry,
        run_geometry,
        write_weights,
    )
    from routecast.runtime.offload.geometry_routing import (
        check_order,
        first_tokens,
        load_routing,
        save_routing,
        trace_routing,
    )
    from routecast.runtime.offload.gpu import PinnedTier, check_device, check_host_memory, device_name
    from routecast.runtime.offload.tier import measure_bandwidth, measure_concurrency
    from routecast.trace.standard import standard_trace

    q = a.quick
    def given(x, default):  # 0 is a value the checks below refuse, not "use the default"
        return default if x is None else x

    geom = geometry(a.geometry, a.geometry_layers)
    tokens = given(a.geometry_tokens, 8 if q else 24)
    warm = given(a.geometry_warmup, 8 if q else 16)
    repeats = given(a.repeats, 1 if q else 3)
    text = a.budgets or ("50" if q else "25,50,75")
    budgets = [int(x) for x in text.split(",") if x.strip().isdigit()]
    if len(budgets) != len(text.split(",")) or not all(1 <= b <= 100 for b in budgets):
        raise ConfigError(f"--budgets {text!r}: expected comma-separated whole percents of the experts, 1 to 100.")
    policies = a.policies.split(",") if a.policies else list(RUNTIME_POLICIES)
    combined = [c for c in ("lru,fc-evict,lfu" if a.geometry_prefetch is None else a.geometry_prefetch).split(",") if c]
    for pol in {*policies, *combined} - set(RUNTIME_POLICIES):  # refused before any weights are written
        raise ConfigError(f"--policies / --geometry-prefetch name {pol!r}; expected some of {', '.join(RUNTIME_POLICIES)}.")
    check_order(a.geometry_order)
    tops = geometry_tops(gates, geom)
    if tops and not combined:
        raise ConfigError("--gate gates the lookahead's prefetch; --geometry-prefetch is '': expected the demand "
                          "policies to combine it with.")
    replay_ms = None  # --geometry-replay: (read, compute) milliseconds; nothing runs
    if a.geometry_replay is not None:
        if a.geometry_device is not None or a.save_routing is not None:
            raise ConfigError("--geometry-replay runs nothing and writes no routing: expected neither --geometry-device "
                              "nor --save-routing with it.")
        if "lru" not in policies:
            raise ConfigError("--geometry-replay gives each row against LRU's: expected lru among --policies.")
        replay_ms = parse_replay(a.geometry_replay)
    if a.geometry_threads is not None and not 1 <= a.geometry_threads <= 16:
        raise ConfigError(f"--geometry-threads is {a.geometry_threads}; expected 1 to 16 loader threads.")
    if a.geometry_device is not None:
        check_device(a.geometry_device)
        check_host_memory(geom)
    if a.save_routing is not None:  # checked before the trace is read; never also the file it would read
        if a.routing_file is not None:
            raise ConfigError("--save-routing writes the routing computed from the trace and --routing-file reads one; "
                              "expected one or the other.")
        check_out_file(a.save_routing, "--save-routing")
    if a.geometry_minutes is not None and not a.geometry_minutes > 0:
        raise ConfigError(f"--geometry-minutes is {a.geometry_minutes}; expected a positive number of minutes.")
    if tokens < 1 or warm < 0 or repeats < 1:
        raise ConfigError(f"--geometry-tokens {tokens} / --geometry-warmup {warm} / --repeats {repeats}: expected at least "
                         "1 timed token, 0 or more warm-up tokens and at least 1 round.")
    t_start, loads = time.time(), [os.getloadavg()[0]]
    probed = any(is_fc_evict(p) for p in policies)  # fc-evict also runs reading the reuse probe (fitted on the documents not driven)
    if a.routing_file is not None:  # computed where the trace is (--save-routing), with the forecasts' measured seconds
        long = load_routing(a.routing_file, geom)
        trace = long["trace"]
        if long.get("order") != a.geometry_order:
            raise ConfigError(f"--routing-file {a.routing_file} holds the tokens in {long.get('order')} order; "
                              f"--geometry-order is {a.geometry_order}: expected the same.")
        if long["tokens"] < warm + tokens or (probed and "reuse" not in long):
            raise ConfigError(f"--routing-file {a.routing_file}: {long['tokens']} tokens"
                              f"{'' if 'reuse' in long else ', no reuse forecasts'}; expected {warm + tokens} or more"
                              f"{' with reuse forecasts (fc-evict runs)' if probed else ''}.")
    else:
        trace = standard_trace("fine")
        long = trace_routing(trace, geom, max(BOUND_TOKENS, warm + tokens), order=a.geometry_order,
                             reuse_probe=probed)  # one read for both
    if a.save_routing is not None:
        save_routing(a.save_routing, long, geom)
        print(f"wrote {a.save_routing}: {long['tokens']} decode tokens of {trace} mapped to {geom.name} "
              f"({geom.layers} layers); --routing-file reads it")
        return
    routing = first_tokens(long, warm + tokens)
    if replay_ms is not None:
        replay_table(a, geom, routing, geometry_configs(geom, budgets, policies, combined, probed, floor=False, tops=tops),
                     budgets, warm, tokens, *replay_ms)
        return
    gpu = a.geometry_device is not None
    flight = (1, 2) if gpu else (1, 2, 4)
    if gpu:  # every expert in pinned host memory, copied to GPU slots: no weights file
        t0 = time.perf_counter()
        shared = PinnedTier(geom, a.geometry_device)
        print(f"{device_name(shared.device)}: {geom.layers * geom.experts} random experts in host memory ({shared.mode}) "
              f"({geom.layers * geom.experts * geom.expert_bytes / 1e9:.1f} GB) in {time.perf_counter() - t0:.0f} s",
              flush=True)
        path = None
    else:
        shared, path = None, write_weights(WEIGHTS_DIR, geom)
    probe = GeometryRun(path, geom, budget=max(geom.top_k, *flight, a.geometry_threads or 1), tier=shared)
    conc = measure_concurrency(probe.tier, [probe.store.slot_dests(i) for i in range(max(flight))], threads=flight,
                               reads=8 if q else 16)
    threads = given(a.geometry_threads, min(conc, key=conc.get))
    if gpu:
        tier = {"mode": shared.mode, "expert_bytes": geom.expert_bytes, "median_read_s": conc[threads],
                "bandwidth_Bps": geom.expert_bytes / conc[threads], "device": device_name(shared.device)}
    else:
        tier = measure_bandwidth(probe.tier, reads=8 if q else 16)
    tier.update(concurrency={str(k): v for k, v in conc.items()}, loader_threads=threads)
    print("reads in flight -> seconds per expert read: " + ", ".join(f"{k}: {v * 1e3:.1f} ms" for k, v in conc.items())
          + f"; loader threads {threads} ({'--geometry-threads' if a.geometry_threads else 'the fastest'}); the tier is timed "
          "again right before every run, and the replay is priced with the median of those times",
          flush=True)
    n = geom.layers * geom.experts
    print(f"{geom.name} geometry: {geom.layers} MoE layers (of the model's; scaled to this disk and time) x {geom.experts} "
          f"experts top-{geom.top_k}, {geom.expert_bytes / 1e6:.1f} MB per expert; {WEIGHT_NOTE}; {warm} warm-up + "
          f"{tokens} timed decode tokens of {trace} in {a.geometry_order} order, geometry layer g <- trace layer g mod "
          f"{routing['trace_layers']}; "
          f"tier {tier['mode']} {tier['bandwidth_Bps'] / 1e6:.0f} MB/s per read (median {tier['median_read_s'] * 1e3:.1f} ms); "
          f"experts computed {'on the GPU (torch)' if gpu else f'on the CPU by the {a.geometry_kernel} kernel'}",
          flush=True)
    bounds = {}
    n_bound = min(BOUND_TOKENS, long["tokens"])  # a --routing-file may hold only the tokens driven
    for pct in budgets:
        m = bounds[pct] = eviction_bound(geom, first_tokens(long, n_bound), max(geom.top_k, int(round(pct / 100 * n))))
        print(f"eviction bound at {pct}% (cache kernel over {n_bound} decode tokens, no I/O): misses LRU "
              f"{m['lru']:.0f}, LFU {m['lfu']:.0f}, Belady {m['belady']:.0f}: no eviction rule reads less than "
              f"{m['belady'] / m['lru']:.2f}x LRU's bytes", flush=True)
    configs = geometry_configs(geom, budgets, policies, combined, probed, floor=gpu, tops=tops)
    runs: dict[str, list[dict]] = {c[0]: [] for c in configs}
    stop = None if a.geometry_minutes is None else t_start + 60 * a.geometry_minutes
    done, t_round = 0, 0.0
    for rep in range(repeats):
        if rep and stop is not None and time.time() + t_round > stop:  # whole rounds only: every config as often
            print(f"--geometry-minutes {a.geometry_minutes:g}: another round would end past it; {rep} of {repeats} "
                  "rounds run", flush=True)
            break
        t_round, done = time.time(), rep + 1
        for label, b, pol, pf, ru, top in round_order(configs, rep):  # seeded per round: no fixed place in the rounds
            # the tier's speed right before each run (this disk drifts by tens of percent within minutes): the replay
            # is priced with the median over all runs (a few reads per run alone are too noisy to price that run)
            near = measure_concurrency(probe.tier, [probe.store.slot_dests(i) for i in range(threads)],
                                       threads=(threads,), reads=max(4, threads), seed=len(loads))[threads]
            r = run_geometry(path, geom, routing, budget=b, policy=pol, prefetch=pf, warmup=warm, loader_threads=threads,
                             reuse=ru, tier=shared, early=not a.geometry_wait_all, pred_top=top, kernel=a.geometry_kernel)
            r["tier_read_s"] = near
            loads.append(os.getloadavg()[0])
            runs[label].append(r)
            print(f"round {rep + 1}/{repeats} {label:22s} {r['s_per_token']:.4f} s/token hit {r['hit_ratio']:.3f}", flush=True)
        t_round = time.time() - t_round
    probe.close()
    if shared is not None:
        shared.release()
    near = statistics.median(r["tier_read_s"] for rs in runs.values() for r in rs)  # the tier during these runs
    tier["replay_read_s"] = near
    print(f"tier during the runs: {near * 1e3:.1f} ms per expert read (median of the reads timed before each run)")
    rows = []
    for label, b, pol, pf, _ru, _top in configs:
        rs = runs[label]
        r0 = dict(rs[0], compute_s_per_expert=statistics.median(r["compute_s_per_expert"] for r in rs))
        # all-resident preloads every expert: nothing for the replay to predict beyond the compute measured
        rep_ = replay_geometry(r0, geom, routing, xfer_s=near) if b < n else {"s_per_token": None, "hit_ratio": None}
        spt = [r["s_per_token"] for r in rs]
        pct = label.rsplit("@", 1)[1] if "@" in label else None
        lru = runs.get(f"lru@{pct}") if pct else None
        ratios = [y["s_per_token"] / x["s_per_token"] for x, y in zip(rs, lru, strict=True)] if lru else []
        rows.append({"config": label, "budget": b, "prediction": pf or is_fc_evict(pol),
                     "s_per_token": statistics.median(spt), "s_min": min(spt), "s_max": max(spt),
                     "x_lru_tokens_per_s": statistics.median(ratios) if ratios else None,
                     "x_lru_min": min(ratios) if ratios else None, "x_lru_max": max(ratios) if ratios else None,
                     "hit_ratio": statistics.median(r["hit_ratio"] for r in rs), "replay_s_per_token": rep_["s_per_token"],
                     "replay_hit_ratio": rep_["hit_ratio"],
                     "measured_vs_replay": statistics.median(spt) / rep_["s_per_token"] - 1 if rep_["s_per_token"] else None,
                     "predictor_share": statistics.median(r["predict_s"] / r["wall_s"] for r in rs),
                     "read_s_per_expert": statistics.median(r["read_s_per_expert"] for r in rs),
                     "reads_per_token": statistics.median(r["reads"] / r["timed_tokens"] for r in rs),
                     "replay_read_s": near,
                     "compute_s_per_expert": r0["compute_s_per_expert"]})
    print(" | ".join(("config", "s/token", "(min-max)", "x LRU tok/s", "(min-max)", "hit", "reads/token", "replay s/token",
                      "replay hit", "measured vs replay", "predictor share")))
    for r in rows:
        print(" | ".join((r["config"], f"{r['s_per_token']:.4f}", f"({r['s_min']:.4f}-{r['s_max']:.4f})",
                          _f(r["x_lru_tokens_per_s"], ".2f"),
                          f"({_f(r['x_lru_min'], '.2f')}-{_f(r['x_lru_max'], '.2f')})", f"{r['hit_ratio']:.3f}",
                          f"{r['reads_per_token']:.1f}", _f(r["replay_s_per_token"], ".4f"), _f(r["replay_hit_ratio"], ".3f"),
                          _f(r["measured_vs_replay"], "+.1%"), f"{r['predictor_share']:.2%}")))
    lo, hi = min(loads), max(loads)
    when = ("each layer computed once all its experts were in (--geometry-wait-all)" if a.geometry_wait_all else
            "each layer's resident experts computed while its misses were read")
    head = [f"{geom.name} geometry, {geom.layers} MoE layers, {warm} warm-up + {tokens} timed tokens in {a.geometry_order} "
            f"order; {WEIGHT_NOTE}; {when}"]
    for pct in budgets:
        best, plain = best_at(rows, pct, "x_lru_tokens_per_s")
        head.append(f"budget {pct}%: best prediction-driven {best['config'].rsplit('@', 1)[0]} "
                    f"{best['x_lru_tokens_per_s']:.2f}x LRU tokens/s ({best['x_lru_min']:.2f}-{best['x_lru_max']:.2f}), "
                    f"best without prediction {plain['config'].rsplit('@', 1)[0]} {plain['x_lru_tokens_per_s']:.2f}x; "
                    f"measured {best['measured_vs_replay']:+.1%} vs the replay's prediction "
                    f"({best['replay_s_per_token']:.4f} s/token); Belady reads {bounds[pct]['belady'] / bounds[pct]['lru']:.2f}x "
                    "LRU's experts on the same routing")
    if gpu:
        head += gpu_lines(geom, tier, rows, budgets)
    asked = "" if done == repeats else f" (of {repeats} asked: --geometry-minutes)"
    where = f"on {tier['device']}" if gpu else f"on the CPU (no GPU) by the {a.geometry_kernel} kernel"
    head.append(f"median of {done} interleaved rounds{asked}; load average {lo:.1f}-{hi:.1f}; experts computed {where}")
    for line in head:
        print(line)
    name = f"offload_geometry_{geom.name}" + ("" if a.geometry_order == "step" else f"-{a.geometry_order}") + (
        f"-{shared.device.type}" if gpu else "")
    on = f", {tier['device']} ({tier['mode']})" if gpu else ""
    at = f", budget {','.join(map(str, budgets))}%" if a.budgets else ""
    write_bench(name, title=f"Offloading in the I/O-bound regime: {geom.name} geometry, {a.geometry_order} order{on}{at}",
                headline=head, quick=q, tables=[table(f"s per token ({geom.name} geometry, random weights, real routing)", rows)],
                data={"geometry": vars(geom) | {"expert_bytes": geom.expert_bytes}, "tier": tier, "tokens": tokens,
                      "warmup": warm, "order": a.geometry_order, "eviction_bound": {str(k): v for k, v in bounds.items()},
                      "eviction_bound_tokens": n_bound,
                      "routing": {k: v for k, v in routing.items() if k in ("trace", "trace_layers", "predict_s",
                                                                            "reuse_s", "reuse_train_tokens")},
                      "rounds": done, "early": not a.geometry_wait_all, "kernel": a.geometry_kernel, "rows": rows, "wall_s": time.time() - t_start})
    print(f"wrote out/bench/{name}.json")
