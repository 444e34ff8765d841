"""PROBE vs EPLB vs static EP on per-step routing, simulated on 8 H100 (NVSwitch): PROBE §6 (Figures 7-9).

Claim checked (issue targets): PROBE driven by a causal forecast beats windowed EPLB on mean simulated
MoE-layer latency after an abrupt task shift and stays within 5% of PROBE with perfect knowledge (oracle).

Method: routecast.place.compare.compare_methods on each workload (see that module for the methods, the
forecast and the latency model). Workloads, all at EP 8 on h100-sxm with probe_options (DP attention,
deduplicated all-to-all):
  <preset>-shift  synthetic preset (gpt-oss-120b, qwen3-235b) with its first `--layers` MoE layers,
                  decode-heavy continuous batching (token budget and running requests = the preset's token
                  budget; 16-token prompts, outputs of ~1.5 x the step count, so about one request per
                  budget token decodes at once), drift (log-normal, sigma 0.15 per 32 steps) and an abrupt
                  shift at step 200: every popularity is mixed 30/70 with a fresh draw and requests
                  admitted from then are 'chinese' instead of 'code'; ~500 steps;
  <preset>-prefill the same preset, 2048-token prompts with one output token (prefill only), ~40 steps;
  repeat          gpt-oss-120b geometry, one task, 4 token ids each preferring one expert strongly
                  (the same few tokens repeated: one very hot expert per layer), ~150 steps;
  trace           --trace DIR (e.g. the built-in model's trace; 8 experts -> mixtral-8x7b profile,
                  one expert per rank at EP 8). With --model (builtin or a model directory) and a trace
                  captured with --hidden --logits, compare_lookahead: the later half of the requests is
                  held out and planned twice, probe_lookahead (PROBE's lookahead predictor fitted on the
                  earlier half) and probe_transition (the transition forecast, warmed on the earlier half).
  trace-shift     with --shift-tasks A,B: the same trace reordered as traffic from tasks A, B first, then from
                  the others (Trace.shift_by_task), all of it planned (causal transition forecast); the shift
                  step is where the others start.
  trace-shift-lookahead  with --model too: compare_lookahead on that reordered trace; the predictor trains on
                  the earlier documents (the first tasks' when they hold more than --train-fraction of them), so
                  it forecasts traffic from tasks it never saw.
Trace workloads price on --trace-model (default by expert count: 8 -> mixtral-8x7b, 64 -> deepseek-v2-lite,
the production model with builtin-fine's routing geometry). EPLB runs hierarchically with --eplb-groups
expert groups (default: the trace's n_group) on --eplb-nodes nodes (default: one per 8 ranks); its slots
are E + ep x --eplb-redundant.
Every method's expert-weight moves are charged (PROBE's replicas each step, EPLB's rebalances): the part of a
rank's transfer time beyond its hiding window (its expert compute of the previous layer plus this layer's
attention) adds to the layer (exposed_us: mean per layer over all steps), and PROBE's replica budget is that
window, not a fixed count (--window-transfers N restores a fixed N transfers per rank, still charged).
Decode throughput = tokens / (model MoE layers x mean simulated MoE-layer latency) over the
decode-dominated steps; prefill speedup = static latency / method latency over prefill-dominated steps.

Run: python benchmarks/probe_vs_eplb.py [--trace DIR [--model builtin|builtin-fine] [--shift-tasks A,B]
     [--trace-only]] [--ep 8] [--eplb-redundant 2] [--link pcie] [--window-transfers N] [--quick]
Writes out/bench/probe_vs_eplb/{results.json, table.txt, <workload>.png}.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import time
from pathlib import Path

import numpy as np

from routecast.common.bench import table, write_bench
from routecast.common.machine import cpu_name
from routecast.place.compare import compare_lookahead, compare_methods, split_requests, summarize
from routecast.report.placement import plot_throughput
from routecast.sim.hardware import load_hardware
from routecast.sim.models import load_model
from routecast.trace.io import read_trace
from routecast.trace.synth import generate
from routecast.trace.synth_presets import PRESETS

SIM_MODEL = {"gpt-oss-120b": "gpt-oss-120b", "qwen3-235b": "qwen3-235b-a22b"}
COLUMNS = ("method", "IR", "skew", "moe_us_before", "moe_us_after", "decode_vs_eplb", "prefill_speedup",
           "exposed_us", "MB_per_step", "planner_ms_per_step", "planner_ms_per_call")


def workloads(quick: bool, layers: int, seed: int) -> list[tuple[str, str, dict, int]]:
    """(name, preset, SynthConfig overrides, shift step) of each synthetic workload."""
    steps, shift, pre_steps, rep_steps = (60, 25, 8, 30) if quick else (500, 200, 40, 150)
    out = []
    for preset in (("gpt-oss-120b",) if quick else ("gpt-oss-120b", "qwen3-235b")):
        budget = 512 if quick else PRESETS[preset]().token_budget
        base = {"num_layers": layers, "token_budget": budget, "max_running": budget, "seed": seed}
        out.append((f"{preset}-shift", preset, {
            **base, "num_tokens": steps * budget, "prompt_len": (16.0,), "output_len": (1.5 * steps,),
            "prompt_sigma": 0.3, "output_sigma": 0.3, "task_mix": (0.0, 1.0, 0.0), "shift_task_mix": (1.0, 0.0, 0.0),
            "shift_step": shift, "shift_strength": 0.7, "drift_sigma": 0.15, "drift_window": 32}, shift))
        out.append((f"{preset}-prefill", preset, {
            **base, "num_tokens": pre_steps * budget, "prompt_len": (2048.0,), "output_len": (1.0,),
            "prompt_sigma": 0.3, "output_sigma": 0.0}, -1))
    budget = 512 if quick else 4096
    out.append(("repeat", "gpt-oss-120b", {
        "num_layers": layers, "token_budget": budget, "max_running": budget, "seed": seed,
        "num_tokens": rep_steps * budget, "task_mix": (0.0, 0.0, 1.0), "vocab_size": 4, "token_fanout": 1,
        "token_strength": 6.0, "token_depth_decay": 0.0, "prompt_len": (16.0,), "output_len": (1.5 * rep_steps,)},
        -1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=None, help="trace directory to add as a workload (e.g. the built-in model's)")
    ap.add_argument("--trace-model", default=None, help="sim model profile for --trace (default by expert count)")
    ap.add_argument("--model", default=None,
                    help="model of --trace (builtin, builtin-fine or a directory): adds the lookahead forecast arm "
                         "(needs a trace with hidden states and logits)")
    ap.add_argument("--train-fraction", type=float, default=0.5,
                    help="with --model: share of the trace's requests (earliest first) that train the "
                         "predictor")
    ap.add_argument("--epochs", type=int, default=8, help="with --model: lookahead distillation epochs")
    ap.add_argument("--layers", type=int, default=8, help="MoE layers of each synthetic preset to simulate")
    ap.add_argument("--ep", type=int, default=8, help="expert-parallel ranks")
    ap.add_argument("--hardware", default="h100-sxm", help="sim hardware profile")
    ap.add_argument("--seed", type=int, default=0, help="synthetic trace seed")
    ap.add_argument("--eplb-redundant", type=int, default=2, help="EPLB extra slots per rank (slots = E + ep x this)")
    ap.add_argument("--eplb-groups", type=int, default=None,
                    help="EPLB expert groups for its hierarchical mode (default: the trace's n_group; synthetic: 1)")
    ap.add_argument("--eplb-nodes", type=int, default=None, help="EPLB nodes (default: one per 8 ranks)")
    ap.add_argument("--shift-tasks", default=None,
                    help="with --trace: also run the trace as traffic from these tasks (comma-separated) first, "
                         "then from the others")
    ap.add_argument("--trace-only", action="store_true", help="with --trace: skip the synthetic workloads")
    ap.add_argument("--window-transfers", type=int, default=None,
                    help="PROBE budget as a fixed number of expert transfers per rank per layer (default: the "
                         "computed hiding window); transfers are charged either way")
    ap.add_argument("--link", default="nvlink", choices=("nvlink", "pcie"),
                    help="link between the EP ranks (all-to-all and expert-weight transfers)")
    ap.add_argument("--quick", action="store_true", help="tiny workloads (seconds; for tests)")
    ap.add_argument("--out", default="out/bench/probe_vs_eplb", help="folder of the table and the PNGs")
    ap.add_argument("--json", default="out/bench/probe_vs_eplb.json", help="benchmark JSON output")
    args = ap.parse_args()
    hw = load_hardware(args.hardware)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": cpu_name(), "cores": os.cpu_count(), "numpy": np.__version__, "python": platform.python_version(),
               "simulated": f"{args.ep} x {hw.name} ({hw.name} profile: {args.link} per direction "
                            f"{hw.link_bandwidth(args.link) / 1e9:.0f} GB/s)"}
    print(f"machine: {machine['cpu']}, {machine['cores']} cores; simulated: {machine['simulated']}")
    jobs = []
    synthetic = [] if (args.trace_only and args.trace) else workloads(args.quick, 4 if args.quick else args.layers, args.seed)
    for name, preset, over, shift in synthetic:
        jobs.append((name, lambda p=preset, o=over: generate(dataclasses.replace(PRESETS[p](), **o)),
                     SIM_MODEL[preset], shift, PRESETS[preset]().num_layers))
    if args.trace:
        def _read(d=args.trace, full=args.model is not None):
            return read_trace(d, load_hidden=full, load_logits=full)
        jobs.append(("trace", _read, args.trace_model, -1, None))
        if args.shift_tasks:
            first = [t.strip() for t in args.shift_tasks.split(",") if t.strip()]
            jobs.append(("trace-shift", lambda f=first: _read().shift_by_task(f), args.trace_model, None, None))
            if args.model:
                jobs.append(("trace-shift-lookahead", lambda f=first: _read().shift_by_task(f), args.trace_model,
                             None, None))
    doc = {"machine": machine, "workloads": {}}
    kw = {"eplb_redundant": args.eplb_redundant}
    lines, all_verdicts, tables = [], [], []
    for name, make, model_name, shift, model_layers in jobs:
        t0 = time.perf_counter()
        trace = make()
        if shift is None:  # trace-shift: (reordered trace, first step of the later tasks)
            trace, shift = trace
            if name == "trace-shift-lookahead":  # held-out part only: count its steps from the first tasks
                held = split_requests(trace, args.train_fraction)[1]
                first = np.isin(held.tokens["task"], [held.task_names.index(t) for t in args.shift_tasks.split(",")])
                shift = int(np.unique(held.tokens["step"][first]).size)
        if model_name is None:
            model_name = {8: "mixtral-8x7b", 64: "deepseek-v2-lite", 128: "gpt-oss-120b",
                          256: "deepseek-v3"}[trace.spec.num_experts]
        model = load_model(model_name)
        groups = args.eplb_groups or (trace.spec.n_group if name.startswith("trace") else 1)
        kw["eplb_groups"], kw["eplb_nodes"] = groups, args.eplb_nodes or max(1, args.ep // 8)
        if name in ("trace", "trace-shift-lookahead") and args.model and trace.hidden_TLH is not None and trace.logits_TLE is not None:
            res = compare_lookahead(trace, args.model, ep=args.ep, hw=hw, model=model,
                                    train_fraction=args.train_fraction, epochs=args.epochs, seed=args.seed,
                                    window_transfers=args.window_transfers, link=args.link, **kw)
        else:
            res = compare_methods(trace, ep=args.ep, hw=hw, model=model, window_transfers=args.window_transfers,
                                  link=args.link, **kw)
        rows = summarize(res, shift_step=shift, model_layers=model_layers)
        png = plot_throughput(res, str(out / f"{name}.png"), shift_step=shift, model_layers=model_layers,
                              title=f"{name}: {model_name} profile, EP {args.ep}, {hw.name}")
        secs = time.perf_counter() - t0
        head = (f"== {name}: {res['settings']['steps']} steps x {res['settings']['layers']} layers, "
                f"{int(res['tokens_T'].mean())} tokens/step, {model_name} on {args.ep} x {hw.name}, "
                f"shift at {shift}, EPLB {res['settings']['experts'] + args.ep * args.eplb_redundant} slots "
                f"({kw['eplb_groups']} groups on {kw['eplb_nodes']} nodes), {secs:.0f} s")
        lines.append(head)
        lines.append(" ".join(f"{c:>19}" if i == 0 else f"{c:>13}" for i, c in enumerate(COLUMNS)))
        for r in rows:
            lines.append(" ".join(f"{r['method']:>19}" if i == 0 else
                                  (f"{r[c]:>13.3f}" if c in r else f"{'':>13}") for i, c in enumerate(COLUMNS)))
        by = {r["method"]: r for r in rows}
        ora, ew, st = by["probe_oracle"], by["eplb_window"], by["static"]
        col = "moe_us_after" if shift >= 0 else "moe_us_before"
        arms = [m for m in res["methods"] if m.startswith("probe_") and m != "probe_oracle"]
        err = res["settings"].get("forecast_error", {})
        verdicts = []
        for arm in arms:
            pr = by[arm]
            gap = pr[col] / ora[col] - 1.0
            fe = f", forecast error {err[arm]:.3f}" if arm in err else ""
            beats = "beats" if pr[col] < ew[col] else "LOSES to"
            vs_static = "beats" if pr[col] < st[col] * (1 - 1e-9) else "does NOT beat"
            verdicts.append(f"{name}: {arm} {pr[col]:.1f} us vs eplb_window {ew[col]:.1f} us ({beats} EPLB), "
                            f"static {st[col]:.1f} us ({vs_static} static EP), "
                            f"{gap * 100:+.1f}% vs oracle ({'within' if gap <= 0.05 else 'OUTSIDE'} 5%) "
                            f"[{col}]{fe}")
        verdict = "\n".join(verdicts)
        lines.extend(verdicts)
        all_verdicts.extend(verdicts)
        tables.append(table(head.removeprefix("== "), rows))
        for ln in lines[-len(rows) - 2 - len(verdicts):]:
            print(ln)
        doc["workloads"][name] = {"rows": rows, "settings": res["settings"], "shift_step": shift, "png": png,
                                  "seconds": secs, "verdict": verdict,
                                  "throughput_T": {k: (res["tokens_T"] / (m["moe_s_TL"].mean(axis=1)
                                                                          * (model_layers or res["settings"]["layers"])))
                                                   .tolist() for k, m in res["methods"].items()}}
    (out / "table.txt").write_text("\n".join(lines) + "\n")
    write_bench("probe_vs_eplb", title="PROBE against EPLB and static EP on the simulator: MoE-layer time per step",
                headline=all_verdicts, tables=tables, data=doc, quick=args.quick, path=args.json)
    print(f"wrote {args.json}, {out / 'table.txt'} and one PNG per workload")


if __name__ == "__main__":
    main()
