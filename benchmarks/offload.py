"""Offloaded inference on CPU, experts read from disk: tokens/s, hit ratio, bytes read, stall share per strategy.

    python benchmarks/offload.py [--quick]                       # builtin-fine, CPU, experts on disk
    python benchmarks/offload.py --geometry deepseek-v2-lite     # the I/O-bound regime (main_geometry below)

Geometry mode: MoE layers of a production expert geometry (deepseek-v2-lite, mixtral-8x7b) with random bf16 weights
written once to out/geometry/, driven by the real routing of the standard 'fine' trace (runtime/offload/
geometry.py); --geometry-warmup tokens fill the fast tier untimed, then --geometry-tokens are timed; every demand
policy, fc-evict reading the reuse probe (fc-evict+probe), and lookahead prefetch with the --geometry-prefetch
policies, at each budget, the loader threads at the
fastest measured count of reads in flight (1/2/4; --geometry-threads); each run's measured s/token against the
replay's prediction (replay_slots, one link at the read time measured before every run (median), the run's compute);
out/bench/offload_geometry_NAME.json. With --geometry-device cuda the slow tier is pinned host memory copied to GPU
slots on a CUDA stream of its own and the experts compute on the GPU (runtime/offload/gpu.py; an all-resident row
gives the floor); --save-routing / --routing-file carry the routing to a machine that has no trace:

    python benchmarks/offload.py --geometry mixtral-8x7b --geometry-layers 8 --save-routing out/mixtral8.npz
    python benchmarks/offload.py --geometry mixtral-8x7b --geometry-layers 8 --geometry-device cuda --routing-file out/mixtral8.npz

Runs from a fresh clone with no arguments: ffn is fitted on first use on the standard 'fine' trace into
--scratch/predictors; writes out/bench/offload.json (common/bench.py). Python API for one configuration:
routecast.runtime.offload.run.run_config (tokens/s + figures; docs/stages/runtime.md).

Configurations (one request at a time, greedy, the same prompts; every offloaded run loads the model without its
routed experts, runtime/offload/load.py):
  all-resident        the unmodified model, every expert in memory (transformers' own grouped_mm forward)
  resident-path       offloaded engine at budget 100% (every expert stays once read): the engine's compute path
  on-demand           a store of K slots (one token's experts of one layer): every expert is read when its layer
                      needs it (almost nothing survives to its next use)
  POLICY              budget B, a demand replacement policy of cache/policy.py (the replay's own objects), no prefetch
                      (fc-evict folds a prefill's routing into the next step's forecast layer by layer: routed())
  fc-evict+tokens     (--token-table) fc-evict also reading the token table of the model's standard trace
                      (run.token_table_for: each step's forecast from its input tokens, the prompt at a prefill)
  fc-evict+probe      fc-evict also reading the reuse probe of each step's router inputs (predict/reuse_probe.py),
                      fitted on the standard trace of the model (builtin / builtin-fine: corpus test prompts; the
                      runs use val prompts)
  <predictor>         budget B, LRU + PLEC prefetch driven by lookahead (PROBE, layer horizon), ffn (MoE-GPS) or
                      expertflow (routing-path predictor), with real-time correction
  <pred>+<policy>      the same prefetch with another demand policy than LRU (--combine, default lookahead+fc-evict,
                      ffn+lfu, ffn+lirs)
  <predictor> <gate>  the same with a confidence gate (--gate topN,pX): each token prefetches only its N most likely
                      experts / those of forecast probability >= X (OffloadConfig.prefetch_top / prefetch_min_prob)
at budgets 25 / 50 / 75% of the L·E routed experts. Tokens/s is the median over --repeats interleaved rounds (new
tokens per second of wall time, prefill included); x LRU is the median of each round's ratio to that round's LRU
run at the same budget. Every run's logits (every generation step) are compared with all-resident's (allclose).

Replay vs runtime: the runtime's own access log (every (step, layer)'s distinct experts) and forecast sets are
replayed by cache/slots.py's replay_slots (the runtime's slot decisions, same policy object, same budget and
prefetch depth; a late prefetch is a hit, counted apart; its late count from a link of the measured tier speed),
and, for reference, by cache/'s kernel (lru; plec-correct with its own PLEC and link model: its on-time ratio).
Cost model: the kernel's timing on a profile = `routecast calibrate --quick` of this machine with h2d_gbps =
the measured disk tier (expert bytes / median read time), plus measured terms, all fitted on the first half of
the rounds (F = repeats // 2) and compared with the median of the other rounds (so no configuration is priced
from the runs it is judged on; medians over the fit rounds, as one round on a loaded machine can be 2x off):
  dense_us    non-expert time per layer: all-resident wall minus the kernel's expert compute
  engine_us   the offloaded engine's own time per layer (bookkeeping, compact copy): resident-path (budget
              100%, preloaded) wall minus all-resident's in the same round, per access (signed: the compact
              path can be cheaper than transformers' all-expert grouped_mm)
  predictor   the configuration's own predictor seconds (predict + prefetch sets + observe), serial
  read_us     compute-thread time per expert read (waking a loader, GIL hand-over, copy): fitted so that the
              on-demand run is priced exactly, applied to the kernel's predicted reads of every configuration
`model err` = model / measured - 1 with these terms; `kernel err` = the kernel alone with the fitted dense_us.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its helper modules (offload_report.py, offload_geometry.py)

from offload_report import ceiling, cost_model_error, headline, print_report, time_split  # noqa: E402, F401

from routecast.cache.replay import ReplayConfig, compute_seconds, forecast_entries, run_policy  # noqa: E402
from routecast.cache.slots import replay_slots  # noqa: E402
from routecast.cache.zoo import is_fc_evict  # noqa: E402
from routecast.common.bench import read_bench, round_order, table, write_bench  # noqa: E402
from routecast.common.errors import ConfigError  # noqa: E402
from routecast.common.machine import machine_info  # noqa: E402
from routecast.runtime.offload.run import (  # noqa: E402
    accesses_from_log,
    load_run,
    logits_match,
    make_predictor,
    replay_feed,
    run_config,
    token_table_for,
)
from routecast.runtime.offload.store import RUNTIME_POLICIES  # noqa: E402
from routecast.sim.hardware import load_hardware  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin-fine")
    ap.add_argument("--prompts", default=None, help="prompts (default corpus:val:8; --quick corpus:val:3)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 32 (--quick 16)")
    ap.add_argument("--budgets", default=None, help="percent of all L*E experts (default 25,50,75; --quick 25,50)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="interleaved rounds (default 5, --quick 2; >= 2: the first half fits the cost model)")
    ap.add_argument("--predictors", default=None, help="prefetch predictors (default lookahead,ffn; --quick lookahead); "
                    "ffn / expertflow are fitted on first use on the standard 'fine' trace into --scratch")
    ap.add_argument("--policies", default=None, help="demand replacement policies (default: every cache/zoo.py policy object)")
    ap.add_argument("--hardware", default=None, help="calibrated CPU profile (default: run `routecast calibrate --quick`)")
    ap.add_argument("--scratch", default="out/bench_offload")
    ap.add_argument("--combine", default=None, help="prefetch predictors run with another demand policy than LRU, "
                    "comma-separated PRED+POLICY (default lookahead+fc-evict,ffn+lfu,ffn+lirs; --quick none)")
    ap.add_argument("--gate", default="", help="extra confidence-gated prefetch rows, comma-separated: 'pX' = a token "
                    "prefetches only experts of forecast probability >= X, 'topN' = only its N highest (e.g. p0.1,top3)")
    ap.add_argument("--token-table", action="store_true", help="also fc-evict+tokens rows: fc-evict reading the "
                    "token table of the model's standard trace (each step's forecast from its input tokens)")
    ap.add_argument("--reader", default="auto", choices=("auto", "process", "threads"),
                    help="who reads the experts: reader processes (runtime/offload/reader.py; 'auto', the default, "
                    "where they run) or loader threads of the compute process; unless 'threads', every budget also "
                    "gets an 'lru [threads]' row")
    ap.add_argument("--switch-ms", type=float, default=None,
                    help="GIL switch interval while loader threads run (default: run.py's SWITCH_S)")
    ap.add_argument("--geometry", default=None, help="I/O-bound mode: deepseek-v2-lite or mixtral-8x7b expert geometry, "
                    "random bf16 weights on disk, the routing of the standard 'fine' trace (see geometry.py)")
    ap.add_argument("--geometry-layers", type=int, default=None, help="MoE layers written (default 4 / mixtral 2)")
    ap.add_argument("--geometry-tokens", type=int, default=None, help="decode tokens timed (default 24, --quick 8)")
    ap.add_argument("--geometry-warmup", type=int, default=None,
                    help="decode tokens run untimed first to warm the fast tier (default 16, --quick 8)")
    ap.add_argument("--geometry-prefetch", default=None,
                    help="demand policies combined with lookahead prefetch (default lru,fc-evict,lfu; '' none)")
    ap.add_argument("--geometry-order", default="step", help="decode tokens in the trace's serving order (step) or "
                    "one request after the other (request); geometry.trace_routing")
    ap.add_argument("--geometry-wait-all", action="store_true",
                    help="geometry mode: a layer computes only once every expert it needs is in its slot (the timing "
                    "before StoreConfig.early: resident experts no longer computed while the misses are read)")
    ap.add_argument("--geometry-kernel", default="numba", choices=("numba", "torch"),
                    help="geometry mode on the CPU: each round's expert compute, numba's bf16 loop "
                    "(runtime/offload/expert_kernel.py) or torch's bf16 matmul (1.2-2.2x slower: benchmarks/expert_kernel.py)")
    ap.add_argument("--geometry-threads", type=int, default=None,
                    help="loader threads (reads in flight) in geometry mode (default: the fastest of 1/2/4, measured)")
    ap.add_argument("--geometry-device", default=None,
                    help="geometry mode on a GPU: cuda (or cuda:N) keeps every expert in pinned host memory and copies "
                    "misses to GPU slots on a CUDA stream of its own; experts computed there (runtime/offload/gpu.py)")
    ap.add_argument("--geometry-minutes", type=float, default=None, help="geometry mode: start no round that would end "
                    "past this many minutes from the start (whole rounds only; the output says how many ran)")
    ap.add_argument("--routing-file", default=None, help="geometry mode: read the routing (and its forecasts) from a file "
                    "written by --save-routing instead of the standard trace (a machine without the trace)")
    ap.add_argument("--save-routing", default=None, help="geometry mode: write the routing of --geometry's layers to "
                    "this .npz and exit (for --routing-file on another machine)")
    ap.add_argument("--geometry-replay", default=None, metavar="READ_MS,COMPUTE_MS",
                    help="geometry mode: no run; the replay's table with reads of READ_MS (one link) and COMPUTE_MS per "
                    "expert, fc-evict also without the server's schedule (a what-if, e.g. with a GPU run's measured times)")
    ap.add_argument("--quick", action="store_true", help="a reduced run (make bench)")
    ap.add_argument("--report", default=None, help="print the tables of a saved run's JSON and exit")
    a = ap.parse_args()
    if a.report:  # a saved out/bench/offload.json: its tables, the headline recomputed from its rows
        try:
            out = read_bench(a.report)["data"]
            out["headline"] = headline(out)
            print_report(out)
        except ConfigError as e:
            print(f"benchmarks/offload.py: --report {e}", file=sys.stderr)
            raise SystemExit(2) from None
        except (KeyError, TypeError, AttributeError, ValueError, ZeroDivisionError) as e:
            print(f"benchmarks/offload.py: --report {a.report} is not a saved run of this benchmark's non-geometry "
                  f"mode ({type(e).__name__}: {e}).", file=sys.stderr)
            raise SystemExit(2) from None
        return
    try:
        gates = parse_gates(a.gate)
    except ConfigError as e:
        print(f"benchmarks/offload.py: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if a.geometry:
        from offload_geometry import main_geometry  # benchmarks/ (sys.path[0] when run as a script)

        try:
            main_geometry(a, gates)
        except (ConfigError, OSError) as e:  # bad flags or inputs: one sentence, exit 2 (as routecast's own commands)
            print(f"benchmarks/offload.py: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        return
    q = a.quick
    a.prompts = a.prompts or ("corpus:val:3" if q else "corpus:val:8")
    a.max_new_tokens = a.max_new_tokens or (16 if q else 32)
    a.budgets = a.budgets or ("25,50" if q else "25,50,75")
    a.repeats = a.repeats or (2 if q else 5)
    a.predictors = a.predictors or ("lookahead" if q else "lookahead,ffn")
    if a.repeats < 2:
        raise SystemExit("--repeats must be at least 2: the first half of the rounds fits the cost model's terms.")
    scratch = Path(a.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    loads = [os.getloadavg()[0]]

    model, tok, spec, requests = load_run(a.model, a.prompts, a.max_new_tokens, experts=False)
    L, E = spec.num_layers, spec.num_experts
    predictors = {n: fitted_predictor(n, model, a.model, scratch) for n in a.predictors.split(",") if n}
    del model
    policies = a.policies.split(",") if a.policies else list(RUNTIME_POLICIES)
    fcs = [p for p in policies if is_fc_evict(p)]  # each also runs reading the reuse probe (and the token table)
    probe = reuse_probe_for(a.model) if fcs else None
    table = token_table_for(a.model) if a.token_table and fcs else None

    # -- the disk tier's bandwidth -> the CPU profile the cost model and `cache replay` use
    base = a.hardware
    if base is None:
        base = str(scratch / "calibrated-cpu.toml")
        if not Path(base).is_file():
            subprocess.run([sys.executable, "-m", "routecast.cli", "calibrate", "--quick", "--out", base], check=True,
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
    from routecast.runtime.offload.run import write_profile

    prof_path = scratch / "offload-cpu-disk.toml"
    prof_path.unlink(missing_ok=True)
    tier = write_profile(a.model, prof_path, base)
    hw = load_hardware(prof_path)
    print(f"slow tier ({tier['mode']}): {tier['expert_bytes']} B per expert, median read {tier['median_read_s'] * 1e6:.0f} µs "
          f"(p10 {tier['p10_read_s'] * 1e6:.0f}, p90 {tier['p90_read_s'] * 1e6:.0f}) = {tier['bandwidth_Bps'] / 1e9:.3f} GB/s; "
          f"profile {prof_path}")

    combos = [tuple(c.split("+", 1)) for c in (a.combine if a.combine is not None else
                                               ("" if q else "lookahead+fc-evict,ffn+lfu,ffn+lirs")).split(",") if c]
    for name, pol in combos:
        if name not in predictors or pol not in RUNTIME_POLICIES:
            raise SystemExit(f"--combine {name}+{pol}: expected PRED+POLICY with PRED in --predictors "
                             f"({', '.join(predictors)}) and POLICY one of {', '.join(RUNTIME_POLICIES)}.")
    configs: list[tuple[str, int | None, str, object, dict]] = [("all-resident", None, "none", None, {}),
                                                                 ("resident-path", L * E, "none", None, {}),
                                                                 ("on-demand", spec.top_k, "none", None, {})]
    for pct in [int(x) for x in a.budgets.split(",")]:
        b = int(round(pct / 100 * L * E))
        configs += [(f"{pol}@{pct}%", b, "none", None, {"policy": pol}) for pol in policies]
        if a.reader != "threads":
            configs.append((f"lru [threads]@{pct}%", b, "none", None, {"policy": "lru", "reader": "threads"}))
        if probe is not None:
            configs += [(f"{p}+probe@{pct}%", b, "none", None, {"policy": p, "reuse_probe": probe}) for p in fcs]
        if table is not None:
            configs += [(f"{p}+tokens@{pct}%", b, "none", None, {"policy": p, "token_table": table}) for p in fcs]
        for name, pred in predictors.items():
            configs.append((f"{name}@{pct}%", b, name, pred, {}))
            if name == "lookahead":  # without its first-layer forecast (runtime/offload/inblock.py): what that adds
                configs.append((f"lookahead [no layer 0]@{pct}%", b, name, pred, {"lookahead_first": 0}))
            configs += [(f"{name} {g}@{pct}%", b, name, pred, kw) for g, kw in gates.items()]
        for name, pol in combos:
            configs.append((f"{name}+{pol}@{pct}%", b, name, predictors[name], {"policy": pol}))
    switch = {} if a.switch_ms is None else {"switch_s": a.switch_ms / 1e3}

    runs: dict[str, list[dict]] = {c[0]: [] for c in configs}
    ref_logits = None
    for rep in range(a.repeats):  # interleaved: every configuration once per round
        for label, budget, pf, pred, kw in round_order(configs, rep, keep=1):  # all-resident first: the reference
            cfg_kw = {"reader": a.reader, **{k: v for k, v in kw.items() if k not in ("reuse_probe", "token_table")}}
            r = run_config(a.model, requests, budget=budget, prefetch=pf, predictor=pred, preload=label == "resident-path",
                           cfg_kw=cfg_kw or None, logits=True, reuse_probe=kw.get("reuse_probe"), keep_feed=True,
                           token_table=kw.get("token_table"), **switch)
            if ref_logits is None:
                ref_logits = r["logits"]
            r["logits_allclose"], r["logits_max_diff"] = logits_match(ref_logits, r.pop("logits"))
            loads.append(os.getloadavg()[0])
            runs[label].append(r)
            print(f"round {rep + 1}/{a.repeats} {label:18s} {r['tokens_per_s']:7.2f} tok/s  hit {r['hit_ratio']:.3f}  "
                  f"logits allclose {r['logits_allclose']}", flush=True)
    out = summarise(a, runs, configs, requests, tier, hw, prof_path, L, E, loads, t_start)
    print_report(out)
    write_bench("offload", title="Offloaded inference on CPU (experts read from disk with O_DIRECT)",
                headline=out["headline"], tables=out["tables"], data=out, quick=q)
    print("wrote out/bench/offload.json")


def reuse_probe_for(model_name: str):
    """fc-evict's reuse probe for a built-in model, fitted on its standard trace (captured on first use); None for
    another model (no standard trace of it: run `routecast run --reuse-probe --fit-trace` instead)."""
    from routecast.predict.reuse_probe import fit_reuse_probe
    from routecast.trace.io import read_trace
    from routecast.trace.standard import captured_name_of, standard_trace

    std = captured_name_of(model_name)
    if std is None:
        print(f"no reuse probe row: {model_name} has no standard trace to fit it on", flush=True)
        return None

    return fit_reuse_probe(read_trace(standard_trace(std), load_logits=False))


def fitted_predictor(name: str, model, model_name: str, scratch: Path):
    """The prefetch predictor `name`: lookahead from the model's own gates; a fitted one (ffn, expertflow) fitted
    on first use on the standard 'fine' trace and saved under scratch/predictors/NAME (loaded after)."""
    if name == "lookahead":
        return make_predictor("lookahead", model, model_name)
    d = scratch / "predictors" / name
    from routecast.predict.store import is_predictor_dir

    if not is_predictor_dir(d):
        from routecast.predict.evaluate import NEEDS_ROUTER_INPUTS, fit_or_load
        from routecast.predict.store import save_predictor
        from routecast.trace.io import read_trace
        from routecast.trace.standard import standard_trace

        path = standard_trace("fine")
        need = name in NEEDS_ROUTER_INPUTS
        trace = read_trace(path, load_hidden=need, load_logits=need)
        print(f"fitting {name} on {path} (first use; saved to {d})", flush=True)
        save_predictor(fit_or_load(name, trace, model=model_name, seed=0, threads=1, quiet=True), d,
                       fitted_on={"trace": str(path)})
    return make_predictor(name, model, model_name, predictor_dir=d)


def summarise(a, runs, configs, requests, tier, hw, prof_path, L, E, loads, t_start) -> dict:
    """Rows (medians over rounds, min-max, per-round ratios to the same budget's LRU), cost-model errors, headline."""
    ref_tokens = runs["all-resident"][0]["tokens"]
    num_tokens = sum(len(ids) + len(t) for (ids, _), t in zip(requests, ref_tokens, strict=True))
    model = fit_terms(runs, L, E, num_tokens, tier["expert_bytes"], hw)
    rows = []
    for label, budget, pf, _pred, kw in configs:
        rs = runs[label]
        ev = rs[model["fit_rounds"]:]  # the rounds the model is judged on (the first ones fitted it)
        tps = [r["tokens_per_s"] for r in rs]
        pct = label.rsplit("@", 1)[1] if "@" in label else None
        lru = runs.get(f"lru@{pct}") if pct else None
        ratios = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(rs, lru, strict=True)] if lru else []
        row = {"config": label, "budget": budget, "prefetch": pf, "policy": kw.get("policy", "lru"),
               "tokens_per_s": statistics.median(tps), "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
               "x_lru": statistics.median(ratios) if ratios else None, "x_lru_min": min(ratios) if ratios else None,
               "x_lru_max": max(ratios) if ratios else None,
               "identical": all(r["tokens"] == ref_tokens for r in rs),
               "logits_allclose": all(r["logits_allclose"] for r in rs),
               "logits_max_diff": max(r["logits_max_diff"] for r in rs), "new_tokens": rs[0]["new_tokens"],
               "predict_s": statistics.median(r.get("predict_s", 0.0) for r in rs),
               "predictor_share": statistics.median(r.get("predict_s", 0.0) / r["wall_s"] for r in rs),
               "eval_tokens_per_s": statistics.median(r["tokens_per_s"] for r in ev)}
        if budget is None:
            row.update(hit_ratio=1.0, bytes_read=0, stall_share=0.0, replay_hit_ratio=None, late=0, replay_late=0,
                       runtime_hit_ratio_run0=1.0)
        else:
            r0, eb = rs[0], tier["expert_bytes"]
            row.update(hit_ratio=statistics.median(r["hit_ratio"] for r in rs),
                       bytes_read=statistics.median(r["bytes_read"] for r in rs),
                       stall_share=statistics.median(r["stall_share"] for r in rs),
                       late=statistics.median(r["late"] for r in rs), runtime_late_run0=r0["late"],
                       runtime_hit_ratio_run0=r0["hit_ratio"], replay_hit_ratio=None, replay_late=0)
            if label != "resident-path":  # (preloaded: a cold-start replay would not be the same run)
                racc = accesses_from_log(r0["log"], L, E, num_tokens)
                cfg = ReplayConfig(budget=budget, hardware=hw, dense_us=max(0.0, model["dense_us"]))
                slots = replay_slots(racc.req_off, racc.req_key, L, E, budget, pred_SLE=r0["pred_sets"],
                                     layer_ahead=pf == "lookahead", req_comp_s=compute_seconds(racc, cfg, eb),
                                     dense_s=max(0.0, model["dense_us"]) * 1e-6, xfer_s=eb / hw.h2d_bandwidth, links=2,
                                     policy=row["policy"], **replay_feed(r0))
                row.update(replay_hit_ratio=slots["hit_ratio"], replay_late=slots["late"])
        row.update(price(model, rs, label, budget, pf, L, E, num_tokens, tier["expert_bytes"], hw, row["policy"]))
        row["model_error"] = None if row["model_tokens_per_s"] is None else row["model_tokens_per_s"] / row["eval_tokens_per_s"] - 1
        row["kernel_error"] = None if row["kernel_tokens_per_s"] is None else row["kernel_tokens_per_s"] / row["eval_tokens_per_s"] - 1
        rows.append(row)
    out = {"machine": machine_info(), "load_avg": [min(loads), max(loads)], "tier": tier, "profile": str(prof_path),
           "dense_us": model["dense_us"], "cost_terms": model, "settings": vars(a), "rows": rows, "wall_s": time.time() - t_start,
           "runs": {k: [{x: y for x, y in r.items() if x not in ("tokens", "log", "pred_sets", "uses", "reuse_steps",
                                                          "next_uses")}
                    for r in v]
                    for k, v in runs.items()}}
    out["belady"] = {b: belady_ceiling(runs, b, L, E, num_tokens, tier["expert_bytes"], hw, model["dense_us"])
                     for b in sorted({c[0].rsplit("@", 1)[1] for c in configs if "@" in c[0]})}
    out["headline"] = headline(out)
    cols = ("config", "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max", "x_lru", "x_lru_min", "x_lru_max",
            "hit_ratio", "stall_share", "predictor_share", "logits_allclose", "model_error")
    out["tables"] = [table(f"{a.model}: tokens/s per configuration (median of {a.repeats} interleaved rounds, min-max; "
                           "x_lru = median of per-round ratios to LRU at the same budget)",
                           [{c: r[c] for c in cols} for r in rows]),
                     table("where the time goes (s per run, median of rounds): inside the layers' expert accesses "
                           "(prefill / decode steps: waiting for reads, computing the experts, the store) and outside "
                           "them (attention, dense layers, the forecasts, and whatever the loader threads take from the "
                           "compute thread)", time_split(runs, configs))]
    return out


def parse_gates(text: str) -> dict[str, dict]:
    """'p0.1,top3' -> {'p0.1': {'prefetch_min_prob': 0.1}, 'top3': {'prefetch_top': 3}} (OffloadConfig fields), or
    one sentence (ConfigError) for a gate that is neither a probability in [0, 1) nor a count of at least 1."""
    out = {}
    for g in filter(None, (x.strip() for x in text.split(","))):
        try:
            kw = {"prefetch_top": int(g[3:])} if g.startswith("top") else {"prefetch_min_prob": float(g[1:])}
        except ValueError:
            kw = None
        ok = kw is not None and (g.startswith("top") and kw["prefetch_top"] >= 1
                                 or g.startswith("p") and 0.0 <= kw.get("prefetch_min_prob", -1.0) < 1.0)
        if not ok:
            raise ConfigError(f"--gate {g!r}: expected 'pX' (a probability in [0, 1)) or 'topN' (a count of at least 1).")
        out[g] = kw
    return out


def _kernel(r0: dict, budget: int, pf: str, L: int, E: int, num_tokens: int, eb: int, hw, dense_us: float,
            policy: str = "lru") -> dict:
    """The replay kernel's pricing of run r0's own access log under its policy (the demand policy, or plec-correct
    with the run's forecast sets)."""
    racc = accesses_from_log(r0["log"], L, E, num_tokens)
    cfg = ReplayConfig(budget=budget, hardware=hw, dense_us=max(0.0, dense_us), plec_fallback="lru", plec_depth=L)
    if pf == "none":
        return run_policy(racc, policy, cfg, expert_bytes=eb)
    fc = forecast_entries(racc, r0["pred_sets"])
    return run_policy(racc, "plec-correct", cfg, forecast=fc, layer_ahead=pf == "lookahead", expert_bytes=eb)


def fit_terms(runs: dict[str, list[dict]], L: int, E: int, num_tokens: int, eb: int, hw) -> dict[str, float]:
    """The cost model's measured terms from the first F = repeats // 2 rounds (see the module docstring)."""
    F = max(1, len(runs["all-resident"]) // 2)
    ar, rp, od = (runs[c][:F] for c in ("all-resident", "resident-path", "on-demand"))
    acc = accesses_from_log(od[0]["log"], L, E, num_tokens)
    comp = compute_seconds(acc, ReplayConfig(budget=1, hardware=hw), eb)
    ar_wall = statistics.median(r["wall_s"] for r in ar)
    dense_us = (ar_wall - comp.sum()) / acc.num_accesses * 1e6
    engine_us = statistics.median(b["wall_s"] - a["wall_s"] for a, b in zip(ar, rp, strict=True)) / acc.num_accesses * 1e6
    k = _kernel(od[0], od[0]["budget"], "none", L, E, num_tokens, eb, hw, dense_us + engine_us)
    reads = k["demand_loads"] + k["prefetches"]
    read_us = (statistics.median(r["wall_s"] for r in od) - k["sim_s"]) / max(reads, 1) * 1e6
    return {"dense_us": dense_us, "engine_us": engine_us, "read_us": read_us, "accesses": acc.num_accesses,
            "comp_s": float(comp.sum()), "fit_rounds": F,
            "fitted_on": f"rounds 1..{F}: all-resident (dense_us), resident-path (engine_us), on-demand (read_us)"}


def price(model: dict, rs: list[dict], label: str, budget: int | None, pf: str, L: int, E: int, num_tokens: int,
          eb: int, hw, policy: str = "lru") -> dict:
    """Model tokens/s of one configuration from the fitted terms, its round-1 access log and its predictor
    seconds (median over the fit rounds)."""
    r0 = rs[0]
    n_new = r0["new_tokens"]
    if budget is None:  # all-resident: expert compute + dense per layer
        sim = model["dense_us"] * 1e-6 * model["accesses"] + model["comp_s"]  # = the fit rounds' median wall
        return {"kernel_hit_ratio": None, "kernel_tokens_per_s": n_new / sim, "model_tokens_per_s": n_new / sim,
                "model_terms_s": {"kernel_s": sim}}
    if label == "resident-path":  # preloaded: no reads; (dense + engine) per layer + compute, fitted like all-resident
        sim = (model["dense_us"] + model["engine_us"]) * 1e-6 * model["accesses"] + model["comp_s"]
        kern = model["dense_us"] * 1e-6 * model["accesses"] + model["comp_s"]
        return {"kernel_hit_ratio": None, "kernel_tokens_per_s": n_new / kern,
                "model_tokens_per_s": n_new / sim, "model_terms_s": {"kernel_s": sim}}
    try:
        k_plain = _kernel(r0, budget, pf, L, E, num_tokens, eb, hw, model["dense_us"], policy)
        k = _kernel(r0, budget, pf, L, E, num_tokens, eb, hw, model["dense_us"] + model["engine_us"], policy)
    except ConfigError:  # a policy the replay kernel does not run
        return {"kernel_hit_ratio": None, "kernel_tokens_per_s": None, "model_tokens_per_s": None, "model_terms_s": {}}
    reads = k["demand_loads"] + k["prefetches"]
    pred_s = statistics.median(r.get("predict_s", 0.0) for r in rs[:model["fit_rounds"]])
    terms = {"kernel_s": k["sim_s"], "predictor_s": pred_s, "reads_s": model["read_us"] * 1e-6 * reads}
    sim = sum(terms.values())
    return {"kernel_hit_ratio": k["hit_ratio"], "kernel_covered_ratio": k["covered_ratio"],
            "kernel_tokens_per_s": n_new / k_plain["sim_s"], "model_tokens_per_s": n_new / sim, "model_terms_s": terms}


def belady_ceiling(runs: dict[str, list[dict]], b: str, L: int, E: int, num_tokens: int, eb: int, hw,
                   dense_us: float) -> dict | None:
    """What clairvoyant eviction (Belady MIN, no prefetch, no predictor time) would give at budget b in this runtime:
    per round, the resident-path wall plus Belady's reads at LRU's measured cost per read, where that cost is
    (LRU wall - resident-path wall) / LRU's reads in the same round (stall, waking a loader, the copy, everything a
    miss costs here) and Belady's reads are LRU's times the replay kernel's Belady/LRU demand loads on LRU's own
    access log (demand policies route alike: the logits are equal). -> {x_lru median/min/max, belady/lru load
    ratio, µs per read (median)} or None without resident-path and LRU rounds."""
    res, lru = runs.get("resident-path"), runs.get(f"lru@{b}")
    if not res or not lru or len(res) != len(lru):
        return None
    budget = lru[0]["budget"]
    loads = {p: _kernel(lru[0], budget, "none", L, E, num_tokens, eb, hw, dense_us, p)["demand_loads"]
             for p in ("lru", "belady")}
    frac = loads["belady"] / max(loads["lru"], 1)
    x, per = [], []
    for lr, rp in zip(lru, res, strict=True):
        c = max(lr["wall_s"] - rp["wall_s"], 0.0) / max(lr["reads"], 1)
        per.append(c)
        x.append(lr["wall_s"] / (rp["wall_s"] + c * frac * lr["reads"]))
    return {"x_lru": statistics.median(x), "x_lru_min": min(x), "x_lru_max": max(x), "load_ratio": frac,
            "us_per_read": statistics.median(per) * 1e6}


if __name__ == "__main__":
    main()
