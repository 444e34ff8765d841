"""Offloaded inference on CPU, experts read from disk: tokens/s, hit ratio, bytes read, stall share per strategy.

    PYTHONPATH=. python benchmarks/offload.py --ffn DIR --expertflow DIR [--repeats 3] [--prompts corpus:val:8]

Configurations (one request at a time, greedy, the same prompts; every run loads a fresh model):
  all-resident        the unmodified model, every expert in memory (transformers' own grouped_mm forward)
  resident-path       offloaded engine at budget 100% (every expert stays once read): the engine's compute path
  on-demand           a store of K slots (one token's experts of one layer): every expert is read when its layer
                      needs it (almost nothing survives to its next use)
  lru                 budget B, LRU replacement, no prefetch
  <predictor>         budget B, LRU + PLEC prefetch driven by lookahead (PROBE, layer horizon), ffn (MoE-GPS) or
                      expertflow (routing-path predictor), with real-time correction
at budgets 25 / 50 / 75% of the L·E routed experts. Tokens/s is the median over --repeats runs (new tokens per
second of wall time, prefill included); every offloaded run's tokens are checked against all-resident's.

Replay vs runtime: the runtime's own access log (every (step, layer)'s distinct experts) and forecast sets are
replayed by cache/slots.py's replay_slots (the runtime's slot decisions, same policy object, same budget and
prefetch depth; a late prefetch is a hit, counted apart; its late count from a link of the measured tier speed),
and, for reference, by cache/'s kernel (lru; plec-correct with its own PLEC and link model: its on-time ratio).
Cost model: the kernel's timing on a profile = `routecast calibrate --quick` of this machine with h2d_gbps =
the measured disk tier (expert bytes / median read time), dense_us fitted so that the all-resident run is
priced exactly (its error is 0 by construction); every other configuration is a prediction.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from routecast.cache.replay import ReplayConfig, compute_seconds, forecast_entries, run_policy  # noqa: E402
from routecast.cache.slots import replay_slots  # noqa: E402
from routecast.common.machine import machine_info  # noqa: E402
from routecast.runtime.offload.run import accesses_from_log, encode_prompts, make_predictor, run_config  # noqa: E402
from routecast.sim.hardware import load_hardware  # noqa: E402
from routecast.trace.capture_arch import spec_from_model  # noqa: E402
from routecast.trace.capture_inputs import load_model, load_prompts  # noqa: E402


def load_avg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin-fine")
    ap.add_argument("--prompts", default="corpus:val:8")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--budgets", default="25,50,75", help="percent of all L*E experts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ffn", default=None, help="saved ffn predictor folder (routecast predict fit)")
    ap.add_argument("--expertflow", default=None, help="saved expertflow predictor folder")
    ap.add_argument("--hardware", default=None, help="calibrated CPU profile (default: run `routecast calibrate --quick`)")
    ap.add_argument("--scratch", default="out/bench_offload")
    ap.add_argument("--out", default="out/bench_offload/offload.json")
    ap.add_argument("--report", default=None, help="print the tables of a saved run's JSON and exit")
    a = ap.parse_args()
    if a.report:
        print_report(json.loads(Path(a.report).read_text()))
        return
    scratch = Path(a.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    loads = [load_avg()]

    model, tok = load_model(a.model)
    spec = spec_from_model(model)
    L, E = spec.num_layers, spec.num_experts
    requests = encode_prompts(tok, load_prompts(a.prompts, tok), a.max_new_tokens)
    predictors = {"lookahead": make_predictor("lookahead", model, a.model)}
    for name, d in (("ffn", a.ffn), ("expertflow", a.expertflow)):
        if d:
            predictors[name] = make_predictor(name, model, a.model, predictor_dir=d)
    del model

    # -- the disk tier's bandwidth -> the CPU profile the cost model and `cache replay` use
    base = a.hardware
    if base is None:
        base = str(scratch / "calibrated-cpu.toml")
        subprocess.run([sys.executable, "-m", "routecast.cli", "calibrate", "--quick", "--out", base], check=True,
                       cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True)
    from routecast.runtime.cli import write_profile

    prof_path = scratch / "offload-cpu-disk.toml"
    tier = write_profile(a.model, prof_path, base)
    hw = load_hardware(prof_path)
    print(f"slow tier ({tier['mode']}): {tier['expert_bytes']} B per expert, median read {tier['median_read_s'] * 1e6:.0f} µs "
          f"(p10 {tier['p10_read_s'] * 1e6:.0f}, p90 {tier['p90_read_s'] * 1e6:.0f}) = {tier['bandwidth_Bps'] / 1e9:.3f} GB/s; "
          f"profile {prof_path}")

    configs: list[tuple[str, int | None, str, object]] = [("all-resident", None, "none", None),
                                                           ("resident-path", L * E, "none", None),
                                                           ("on-demand", spec.top_k, "none", None)]
    for pct in [int(x) for x in a.budgets.split(",")]:
        b = int(round(pct / 100 * L * E))
        configs.append((f"lru@{pct}%", b, "none", None))
        for name, pred in predictors.items():
            configs.append((f"{name}@{pct}%", b, name, pred))

    runs: dict[str, list[dict]] = {c[0]: [] for c in configs}
    for rep in range(a.repeats):  # interleaved: every configuration once per round
        for label, budget, pf, pred in configs:
            r = run_config(a.model, requests, budget=budget, prefetch=pf, predictor=pred)
            loads.append(load_avg())
            runs[label].append(r)
            print(f"round {rep + 1}/{a.repeats} {label:18s} {r['tokens_per_s']:7.2f} tok/s  hit {r['hit_ratio']:.3f}", flush=True)

    ref_tokens = runs["all-resident"][0]["tokens"]
    rows = []
    acc = accesses_from_log(runs["lru@50%"][0]["log"] if "lru@50%" in runs else runs["on-demand"][0]["log"], L, E,
                            sum(len(ids) + len(t) for (ids, _), t in zip(requests, ref_tokens, strict=True)))
    eb = tier["expert_bytes"]
    comp = compute_seconds(acc, ReplayConfig(budget=1, hardware=hw), eb)
    allres_wall = statistics.median(r["wall_s"] for r in runs["all-resident"])
    dense_us = max(0.0, (allres_wall - comp.sum()) / acc.num_accesses * 1e6)
    for label, budget, pf, _pred in configs:
        rs = runs[label]
        tps = [r["tokens_per_s"] for r in rs]
        row = {"config": label, "budget": budget, "prefetch": pf, "tokens_per_s": statistics.median(tps),
               "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
               "identical": all(r["tokens"] == ref_tokens for r in rs),
               "new_tokens": rs[0]["new_tokens"]}
        if budget is None:
            row.update(hit_ratio=1.0, bytes_read=0, stall_share=0.0, replay_hit_ratio=None, late=0, replay_late=0,
                       kernel_hit_ratio=None, runtime_hit_ratio_run0=1.0,
                       model_tokens_per_s=row["new_tokens"] / (comp.sum() + dense_us * 1e-6 * acc.num_accesses))
        else:
            row.update(hit_ratio=statistics.median(r["hit_ratio"] for r in rs),
                       bytes_read=statistics.median(r["bytes_read"] for r in rs),
                       stall_share=statistics.median(r["stall_share"] for r in rs))
            r0 = rs[0]
            racc = accesses_from_log(r0["log"], L, E, acc.num_tokens)
            cfg = ReplayConfig(budget=budget, hardware=hw, dense_us=dense_us, plec_fallback="lru", plec_depth=L)
            if pf == "none":
                rep_row = run_policy(racc, "lru", cfg, expert_bytes=eb)
            else:
                fc = forecast_entries(racc, r0["pred_sets"])
                rep_row = run_policy(racc, "plec-correct", cfg, forecast=fc, layer_ahead=pf == "lookahead", expert_bytes=eb)
            slots = replay_slots(racc.req_off, racc.req_key, L, E, budget, pred_SLE=r0["pred_sets"],
                                 layer_ahead=pf == "lookahead", req_comp_s=compute_seconds(racc, cfg, eb),
                                 dense_s=dense_us * 1e-6, xfer_s=eb / hw.h2d_bandwidth, links=2)
            row.update(replay_hit_ratio=slots["hit_ratio"], replay_late=slots["late"], kernel_hit_ratio=rep_row["hit_ratio"],
                       kernel_covered_ratio=rep_row["covered_ratio"], runtime_hit_ratio_run0=r0["hit_ratio"],
                       late=statistics.median(r["late"] for r in rs), runtime_late_run0=r0["late"],
                       model_tokens_per_s=row["new_tokens"] / rep_row["sim_s"])
        row["model_error"] = row["model_tokens_per_s"] / row["tokens_per_s"] - 1
        rows.append(row)

    out = {"machine": machine_info(), "load_avg": [min(loads), max(loads)], "tier": tier, "profile": str(prof_path),
           "dense_us": dense_us, "settings": vars(a), "rows": rows, "wall_s": time.time() - t_start,
           "runs": {k: [{x: y for x, y in r.items() if x not in ("tokens", "log", "pred_sets")} for r in v]
                    for k, v in runs.items()}}
    print_report(out)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {a.out}")


def print_report(out: dict) -> None:
    """The result table and the last round's counters of a run (also `--report JSON` for a saved run)."""
    rows, tier, st = out["rows"], out["tier"], out["settings"]
    by = {r["config"]: r for r in rows}
    od = by["on-demand"]["tokens_per_s"]
    ar = by["all-resident"]["tokens_per_s"]
    lo, hi = out["load_avg"]
    print(f"\n{st['model']}, {st['prompts']} x {st['max_new_tokens']} new tokens, one request at a time; median of "
          f"{st['repeats']} interleaved rounds; load average {lo:.1f}-{hi:.1f} on {out['machine']['cpus']} cores; "
          f"tier {tier['mode']} {tier['bandwidth_Bps'] / 1e9:.3f} GB/s; dense {out['dense_us']:.0f} µs per layer")
    head = ("config", "tok/s", "(min-max)", "x on-demand", "x all-resident", "hit", "late", "replay hit (run 1)",
            "replay late", "kernel on-time", "MB read", "stall", "model tok/s", "model err", "identical")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([
            r["config"], f"{r['tokens_per_s']:.2f}", f"({r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f})",
            f"{r['tokens_per_s'] / od:.2f}", f"{r['tokens_per_s'] / ar:.2f}", f"{r['hit_ratio']:.3f}", f"{r.get('late', 0):.0f}",
            "-" if r["replay_hit_ratio"] is None else f"{r['replay_hit_ratio']:.3f} ({r['runtime_hit_ratio_run0']:.3f})",
            f"{r.get('replay_late', 0)}", "-" if r.get("kernel_hit_ratio") is None else f"{r['kernel_hit_ratio']:.3f}",
            f"{r['bytes_read'] / 1e6:.1f}", f"{r['stall_share']:.1%}", f"{r['model_tokens_per_s']:.2f}",
            f"{r['model_error']:+.1%}", str(r["identical"])]))
    print("\nlast round's counters: wall s | predictor s | stall s | reads | s inside reads (summed over threads) | "
          "prefetches issued / loaded / useful / cancelled / dropped")
    for k, v in out["runs"].items():
        r = v[-1]
        print(f"{k} | {r['wall_s']:.1f} | {r.get('predict_s', 0):.2f} | {r.get('stall_s', 0):.2f} | {r.get('reads', 0)} | "
              f"{r.get('read_s', 0):.2f} | {r.get('prefetch_issued', 0)} / {r.get('prefetch_loaded', 0)} / "
              f"{r.get('prefetch_useful', 0)} / {r.get('prefetch_cancelled', 0)} / {r.get('prefetch_dropped', 0)}")


if __name__ == "__main__":
    main()
