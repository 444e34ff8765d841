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
  <predictor> <gate>  the same with a confidence gate (--gate topN,pX): each token prefetches only its N most likely
                      experts / those of forecast probability >= X (OffloadConfig.prefetch_top / prefetch_min_prob)
at budgets 25 / 50 / 75% of the L·E routed experts. Tokens/s is the median over --repeats runs (new tokens per
second of wall time, prefill included); every offloaded run's tokens are checked against all-resident's.

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
import json
import os
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
from routecast.runtime.offload.run import (  # noqa: E402
    accesses_from_log,
    load_run,
    make_predictor,
    run_config,
)
from routecast.sim.hardware import load_hardware  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin-fine")
    ap.add_argument("--prompts", default="corpus:val:8")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--budgets", default="25,50,75", help="percent of all L*E experts")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (>= 2: the first half fits the cost model)")
    ap.add_argument("--ffn", default=None, help="saved ffn predictor folder (routecast predict fit)")
    ap.add_argument("--expertflow", default=None, help="saved expertflow predictor folder")
    ap.add_argument("--hardware", default=None, help="calibrated CPU profile (default: run `routecast calibrate --quick`)")
    ap.add_argument("--scratch", default="out/bench_offload")
    ap.add_argument("--out", default="out/bench_offload/offload.json")
    ap.add_argument("--gate", default="", help="extra confidence-gated prefetch rows, comma-separated: 'pX' = a token "
                    "prefetches only experts of forecast probability >= X, 'topN' = only its N highest (e.g. p0.1,top3)")
    ap.add_argument("--switch-ms", type=float, default=None,
                    help="GIL switch interval while loader threads run (default: run.py's SWITCH_S)")
    ap.add_argument("--report", default=None, help="print the tables of a saved run's JSON and exit")
    a = ap.parse_args()
    if a.report:
        print_report(json.loads(Path(a.report).read_text()))
        return
    if a.repeats < 2:
        raise SystemExit("--repeats must be at least 2: the first half of the rounds fits the cost model's terms.")
    scratch = Path(a.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    loads = [os.getloadavg()[0]]

    model, tok, spec, requests = load_run(a.model, a.prompts, a.max_new_tokens)
    L, E = spec.num_layers, spec.num_experts
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

    gates = parse_gates(a.gate)
    configs: list[tuple[str, int | None, str, object, dict]] = [("all-resident", None, "none", None, {}),
                                                                 ("resident-path", L * E, "none", None, {}),
                                                                 ("on-demand", spec.top_k, "none", None, {})]
    for pct in [int(x) for x in a.budgets.split(",")]:
        b = int(round(pct / 100 * L * E))
        configs.append((f"lru@{pct}%", b, "none", None, {}))
        for name, pred in predictors.items():
            configs.append((f"{name}@{pct}%", b, name, pred, {}))
            configs += [(f"{name} {g}@{pct}%", b, name, pred, kw) for g, kw in gates.items()]
    switch = {} if a.switch_ms is None else {"switch_s": a.switch_ms / 1e3}

    runs: dict[str, list[dict]] = {c[0]: [] for c in configs}
    for rep in range(a.repeats):  # interleaved: every configuration once per round
        for label, budget, pf, pred, kw in configs:
            r = run_config(a.model, requests, budget=budget, prefetch=pf, predictor=pred, preload=label == "resident-path",
                           cfg_kw=kw or None, **switch)
            loads.append(os.getloadavg()[0])
            runs[label].append(r)
            print(f"round {rep + 1}/{a.repeats} {label:18s} {r['tokens_per_s']:7.2f} tok/s  hit {r['hit_ratio']:.3f}", flush=True)

    ref_tokens = runs["all-resident"][0]["tokens"]
    num_tokens = sum(len(ids) + len(t) for (ids, _), t in zip(requests, ref_tokens, strict=True))
    model = fit_terms(runs, L, E, num_tokens, tier["expert_bytes"], hw)
    rows = []
    for label, budget, pf, _pred, _kw in configs:
        rs = runs[label]
        ev = rs[model["fit_rounds"]:]  # the rounds the model is judged on (the first ones fitted it)
        tps = [r["tokens_per_s"] for r in rs]
        row = {"config": label, "budget": budget, "prefetch": pf, "tokens_per_s": statistics.median(tps),
               "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
               "identical": all(r["tokens"] == ref_tokens for r in rs), "new_tokens": rs[0]["new_tokens"],
               "predict_s": statistics.median(r.get("predict_s", 0.0) for r in rs),
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
                                     dense_s=max(0.0, model["dense_us"]) * 1e-6, xfer_s=eb / hw.h2d_bandwidth, links=2)
                row.update(replay_hit_ratio=slots["hit_ratio"], replay_late=slots["late"])
        row.update(price(model, rs, label, budget, pf, L, E, num_tokens, tier["expert_bytes"], hw))
        row["model_error"] = row["model_tokens_per_s"] / row["eval_tokens_per_s"] - 1
        row["kernel_error"] = row["kernel_tokens_per_s"] / row["eval_tokens_per_s"] - 1
        rows.append(row)

    out = {"machine": machine_info(), "load_avg": [min(loads), max(loads)], "tier": tier, "profile": str(prof_path),
           "dense_us": model["dense_us"], "cost_terms": model, "settings": vars(a), "rows": rows, "wall_s": time.time() - t_start,
           "runs": {k: [{x: y for x, y in r.items() if x not in ("tokens", "log", "pred_sets")} for r in v]
                    for k, v in runs.items()}}
    print_report(out)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {a.out}")


def parse_gates(text: str) -> dict[str, dict]:
    """'p0.1,top3' -> {'p0.1': {'prefetch_min_prob': 0.1}, 'top3': {'prefetch_top': 3}} (OffloadConfig fields)."""
    out = {}
    for g in filter(None, (x.strip() for x in text.split(","))):
        try:
            kw = {"prefetch_top": int(g[3:])} if g.startswith("top") else {"prefetch_min_prob": float(g[1:])}
        except ValueError:
            kw = None
        if kw is None or not (g.startswith("top") or g.startswith("p")):
            raise SystemExit(f"--gate {g!r}: expected 'pX' (a probability) or 'topN' (a count).")
        out[g] = kw
    return out


def _kernel(r0: dict, budget: int, pf: str, L: int, E: int, num_tokens: int, eb: int, hw, dense_us: float) -> dict:
    """The replay kernel's pricing of run r0's own access log under its policy (lru, or plec-correct with the
    run's forecast sets)."""
    racc = accesses_from_log(r0["log"], L, E, num_tokens)
    cfg = ReplayConfig(budget=budget, hardware=hw, dense_us=max(0.0, dense_us), plec_fallback="lru", plec_depth=L)
    if pf == "none":
        return run_policy(racc, "lru", cfg, expert_bytes=eb)
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
          eb: int, hw) -> dict:
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
    k_plain = _kernel(r0, budget, pf, L, E, num_tokens, eb, hw, model["dense_us"])
    k = _kernel(r0, budget, pf, L, E, num_tokens, eb, hw, model["dense_us"] + model["engine_us"])
    reads = k["demand_loads"] + k["prefetches"]
    pred_s = statistics.median(r.get("predict_s", 0.0) for r in rs[:model["fit_rounds"]])
    terms = {"kernel_s": k["sim_s"], "predictor_s": pred_s, "reads_s": model["read_us"] * 1e-6 * reads}
    sim = sum(terms.values())
    return {"kernel_hit_ratio": k["hit_ratio"], "kernel_covered_ratio": k["covered_ratio"],
            "kernel_tokens_per_s": n_new / k_plain["sim_s"], "model_tokens_per_s": n_new / sim, "model_terms_s": terms}


def print_report(out: dict) -> None:
    """The result table and the last round's counters of a run (also `--report JSON` for a saved run)."""
    rows, tier, st = out["rows"], out["tier"], out["settings"]
    by = {r["config"]: r for r in rows}
    od = by["on-demand"]["tokens_per_s"]
    ar = by["all-resident"]["tokens_per_s"]
    lo, hi = out["load_avg"]
    m = out["cost_terms"]
    print(f"\n{st['model']}, {st['prompts']} x {st['max_new_tokens']} new tokens, one request at a time; median of "
          f"{st['repeats']} interleaved rounds (min-max); load average {lo:.1f}-{hi:.1f} on {out['machine']['cpus']} cores; "
          f"tier {tier['mode']} {tier['bandwidth_Bps'] / 1e9:.3f} GB/s")
    print(f"cost model terms (fitted on rounds 1..{m['fit_rounds']}): dense {m['dense_us']:.0f} µs per layer, engine {m['engine_us']:+.0f} µs "
          f"per layer, {m['read_us']:.0f} µs of compute thread per read, each configuration's predictor seconds; "
          f"errors against the median of rounds {m['fit_rounds'] + 1}..{st['repeats']}")
    head = ("config", "tok/s", "(min-max)", "x on-demand", "x all-resident", "hit", "late", "replay hit (run 1)",
            "replay late", "kernel on-time", "MB read", "stall", "predictor s", "model tok/s", "model err", "kernel err",
            "identical")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([
            r["config"], f"{r['tokens_per_s']:.2f}", f"({r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f})",
            f"{r['tokens_per_s'] / od:.2f}", f"{r['tokens_per_s'] / ar:.2f}", f"{r['hit_ratio']:.3f}", f"{r.get('late', 0):.0f}",
            "-" if r["replay_hit_ratio"] is None else f"{r['replay_hit_ratio']:.3f} ({r['runtime_hit_ratio_run0']:.3f})",
            f"{r.get('replay_late', 0)}", "-" if r.get("kernel_hit_ratio") is None else f"{r['kernel_hit_ratio']:.3f}",
            f"{r['bytes_read'] / 1e6:.1f}", f"{r['stall_share']:.1%}", f"{r['predict_s']:.2f}",
            f"{r['model_tokens_per_s']:.2f}", f"{r['model_error']:+.1%}", f"{r['kernel_error']:+.1%}", str(r["identical"])]))
    priced = [r for r in rows if r["budget"] is not None and r["config"] != "resident-path"]  # not fitted on
    errs, kerrs = [abs(r["model_error"]) for r in priced], [abs(r["kernel_error"]) for r in priced]
    if errs:
        print(f"offloaded configurations other than the fitted ones: median |model err| {statistics.median(errs):.1%} (max {max(errs):.1%}); "
              f"kernel alone {statistics.median(kerrs):.1%} (max {max(kerrs):.1%})")
    print("\nlast round's counters: wall s | predictor s | stall s | reads | s inside reads (summed over threads) | "
          "prefetches issued / loaded / useful / cancelled / dropped")
    for k, v in out["runs"].items():
        r = v[-1]
        print(f"{k} | {r['wall_s']:.1f} | {r.get('predict_s', 0):.2f} | {r.get('stall_s', 0):.2f} | {r.get('reads', 0)} | "
              f"{r.get('read_s', 0):.2f} | {r.get('prefetch_issued', 0)} / {r.get('prefetch_loaded', 0)} / "
              f"{r.get('prefetch_useful', 0)} / {r.get('prefetch_cancelled', 0)} / {r.get('prefetch_dropped', 0)}")


if __name__ == "__main__":
    main()
