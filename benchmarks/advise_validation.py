"""Does the advisor's order hold when the strategies run for real? Every configuration this CPU can measure.

Claim: on the configurations this machine runs for real, the advisor's top choice is the measured best (or within
the measurement's noise) in N of M configurations, and its predicted order agrees with the measured order
(Kendall tau, scipy). Targets: N/M >= 0.8, tau >= 0.7. No GPU is lent to this task: the GPU cost model is not
validated here (benchmarks/cost_model_validation.py --device cuda does that on a GPU).

Configurations (the built-in fine model, builtin-fine: DeepSeek-V3 architecture, 64 experts top-6):
- offload: the CPU offload runtime (routecast/runtime/offload, experts read from disk) at budgets 25 / 50 / 75% of
  the L x E experts, one configuration per budget, with each policy the runtime runs: on-demand LRU (one pool),
  per-layer LRU, and LRU + PROBE lookahead prefetch with real-time correction (its frozen-gate prior, no fitting).
  Measured: tokens/s of greedy generation (median of --repeats fresh runs; prompts corpus:val). Predicted: the
  advisor's cache replay (advise.offload's path: cache.replay on the fine trace's held-out rows) of lru,
  lru-layer and plec-correct driven by the same lookahead prior's forecast, priced on this machine's calibrated
  profile (`routecast calibrate --quick`) whose host-to-device figure is the measured disk tier
  (`routecast run --write-profile`); lower µs/token = faster.
- EP: the gloo EP runtime (routecast/runtime/ep, `routecast ep run`) at EP 2 and EP 4 with each plan (static,
  eplb, moe-gps, probe) on the same replayed steps of the fine trace. Measured: all-to-all + expert compute seconds
  (slowest rank per step and layer, median over repeats, summed). Predicted: the advisor's cost model on the same
  steps (advise.placement's pricing: sim.cost.layer_cost, PROBE's options) with each plan's slots and shares
  (the runtime's plans.npz), on the calibrated profile with the all-to-all link of sim/links/gloo-cpu-ep<G>.toml.
Noise: a configuration counts when the top choice's measured median is the best, or the best's median lies
within the top choice's measured min-max range over the repeats. tau: Kendall tau between predicted and measured
figures within each configuration, averaged over configurations (and pooled as ranks).

    PYTHONPATH=. python benchmarks/advise_validation.py [--quick] [--repeats 3] [--hardware PROFILE.toml]
Writes out/bench/advise_validation.json (common.bench.write_bench).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routecast.common.bench import table, write_bench  # noqa: E402

BUDGETS = (0.25, 0.5, 0.75)
OFFLOAD_ARMS = {"lru": dict(prefetch="none", per_layer=False), "lru-layer": dict(prefetch="none", per_layer=True),
                "plec-correct": dict(prefetch="lookahead", per_layer=False)}
EP_PLANS = ("static", "eplb", "moe-gps", "probe")


def _profile(args: argparse.Namespace, work: Path) -> Path:
    """This machine's calibrated profile with h2d = the disk tier of builtin-fine's experts."""
    from routecast.runtime.offload.run import write_profile
    from routecast.sim.calibrate import calibrate

    base = Path(args.hardware) if args.hardware else work / "cpu.toml"
    if not args.hardware and not base.is_file():
        calibrate(base, device="cpu", threads=1, quick=True)
    prof = work / "cpu-disk.toml"
    write_profile("builtin-fine", prof, base)
    return prof


def offload_configs(args: argparse.Namespace, prof: Path, trace_dir: Path) -> list[dict[str, Any]]:
    """One configuration per budget: measured tokens/s and the advisor's predicted µs/token per arm."""
    import torch

    from routecast.cache.forecasts import forecast_sets
    from routecast.cache.replay import ReplayConfig, replay
    from routecast.predict.lookahead import LookaheadPredictor
    from routecast.runtime.offload.run import load_run, run_config
    from routecast.sim.hardware import load_hardware
    from routecast.trace.capture_arch import spec_from_model
    from routecast.trace.io import read_trace

    torch.set_num_threads(1)
    model, _, spec, requests = load_run("builtin-fine", args.prompts, args.max_new_tokens)
    trace = read_trace(trace_dir)
    (train, test), _, _ = trace.heldout_masks("document", (0.8, 0.2), seed=0)
    prior = LookaheadPredictor.from_model(model, spec_from_model(model))
    sets, ahead = forecast_sets(prior, trace, rows=test)
    hw = load_hardware(prof)
    L, E = spec.num_layers, spec.num_experts
    out = []
    for b in BUDGETS:
        slots = int(round(b * L * E))
        cfg = ReplayConfig(budget=slots, hardware=hw, expert_bytes=spec.expert_bytes)
        rows = {r["policy"]: r for r in replay(trace, list(OFFLOAD_ARMS), cfg, pred_SLE=sets, layer_ahead=ahead,
                                               mask=test)}
        meas: dict[str, list[float]] = {k: [] for k in OFFLOAD_ARMS}
        for _ in range(args.repeats):  # interleaved arms, a fresh model and store every run
            for arm, kw in OFFLOAD_ARMS.items():
                pred = None
                if kw["prefetch"] != "none":
                    pred = LookaheadPredictor.from_model(model, spec_from_model(model))
                r = run_config("builtin-fine", requests, budget=slots, prefetch=kw["prefetch"], predictor=pred,
                               cfg_kw={"per_layer": kw["per_layer"]}, threads=1)
                meas[arm].append(1e6 / r["tokens_per_s"])  # µs per generated token, lower = faster
        out.append({"config": f"offload {b:.0%}", "predicted": {k: rows[k]["us_per_token"] for k in OFFLOAD_ARMS},
                    "measured": meas, "unit": "µs per new token (measured) / µs per token (replay)"})
        print(f"offload {b:.0%}: predicted " + ", ".join(f"{k} {v:.1f}" for k, v in out[-1]["predicted"].items())
              + " | measured " + ", ".join(f"{k} {np.median(v):.0f}" for k, v in meas.items()), flush=True)
    return out


def _predict_ep(trace: Any, run_dir: Path, ranks: int, hw: Any, steps: list[int]) -> float:
    """The advisor's cost model on the runtime's own plans and steps -> predicted seconds (sum over cells)."""
    from routecast.place.compare import step_work
    from routecast.place.slots import SlotPlan
    from routecast.sim.cost import layer_cost, probe_options
    from routecast.sim.models import load_model

    m = load_model("builtin-fine")
    z = np.load(run_dir / "plans.npz")
    s = trace.spec
    L, E = s.num_layers, s.num_experts
    plans = [SlotPlan(slots_LS=z["slots_PLS"][i], share_LS=z["share_PLS"][i], num_ranks=ranks, num_experts=E,
                      layer_ids=tuple(s.layer_ids)) for i in range(z["slots_PLS"].shape[0])]
    total = 0.0
    step_col = np.asarray(trace.tokens["step"])
    for i, st in enumerate(steps):
        rows = np.flatnonzero(step_col == st)
        sub = trace.select(np.isin(step_col, [st]))
        ex = np.asarray(trace.experts_TLK[rows], np.int64)
        plan = plans[int(z["plan_of_step"][i])]
        counts = np.zeros((L, ranks, E))
        for lay in range(L):
            e = ex[:, lay][ex[:, lay] >= 0]
            counts[lay] = plan.served_GE(lay, np.bincount(e, minlength=E))
        w = step_work(sub)
        wl = type(w)(batch=np.repeat(w.batch, L), seq_len=np.repeat(w.seq_len, L),
                     context_len=np.repeat(w.context_len, L))
        c = layer_cost(counts, model=m, hw=hw, work=wl, opts=dataclasses.replace(probe_options("nvlink"), roofline="rank"))
        total += float((c.dispatch + c.ffn + c.combine).sum())
    return total


def ep_configs(args: argparse.Namespace, prof: Path, trace_dir: Path, work: Path) -> list[dict[str, Any]]:
    from routecast.runtime.ep.run import run_plans
    from routecast.sim.a2a import load_link
    from routecast.sim.hardware import load_hardware
    from routecast.trace.io import read_trace

    trace = read_trace(trace_dir, load_hidden=False, load_logits=False)
    out = []
    for G in (2, 4):
        link = load_link(f"gloo-cpu-ep{G}")
        hw = dataclasses.replace(load_hardware(prof), nvlink_bandwidth=link.bandwidth, alpha=link.alpha)
        meas: dict[str, list[float]] = {p: [] for p in EP_PLANS}
        pred: dict[str, float] = {}
        for rep in range(args.repeats):  # one repeat per launch so the plans interleave
            res = run_plans(model="builtin-fine", trace_dir=str(trace_dir), out=work / f"ep{G}", nproc=G,
                            plans=list(EP_PLANS), steps=args.ep_steps, repeats=1, check=False, overwrite=True,
                            quiet=True, timeout_s=120.0)
            for p in EP_PLANS:
                s = res["plans"][p]
                meas[p].append((s["a2a_s"] + s["compute_s"]) * 1e6)
                if rep == 0:
                    pred[p] = _predict_ep(trace, work / f"ep{G}" / p, G, hw, list(res["settings"]["steps"])) * 1e6
        out.append({"config": f"EP {G}", "predicted": pred, "measured": meas,
                    "unit": "µs of all-to-all + expert compute over the replayed steps"})
        print(f"EP {G}: predicted " + ", ".join(f"{k} {v:.0f}" for k, v in pred.items()) + " | measured "
              + ", ".join(f"{k} {np.median(v):.0f}" for k, v in meas.items()), flush=True)
    return out


def score(cfgs: list[dict[str, Any]]) -> tuple[int, int, float, list[dict[str, Any]]]:
    """(configurations whose top choice is measured best or within noise, M, mean Kendall tau, table rows)."""
    from scipy.stats import kendalltau

    hits, taus, rows = 0, [], []
    for c in cfgs:
        arms = list(c["predicted"])
        p = np.array([c["predicted"][a] for a in arms])
        med = np.array([np.median(c["measured"][a]) for a in arms])
        top, best = arms[int(np.argmin(p))], arms[int(np.argmin(med))]
        lo, hi = min(c["measured"][top]), max(c["measured"][top])
        ok = top == best or lo <= float(med.min()) <= hi
        tau = float(kendalltau(p, med).statistic)
        hits += ok
        taus.append(tau if np.isfinite(tau) else 0.0)
        rows.append({"configuration": c["config"], "advisor top choice": top, "measured best": best,
                     "top or within noise": ok, "kendall tau": tau,
                     "predicted order": " < ".join(np.array(arms)[np.argsort(p)]),
                     "measured order": " < ".join(np.array(arms)[np.argsort(med)])})
    return hits, len(cfgs), float(np.mean(taus)) if taus else float("nan"), rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompts, tokens, steps and repeats (make bench)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per arm (default 3; 2 with --quick)")
    ap.add_argument("--hardware", default=None, help="calibrated CPU profile (default: calibrate --quick here)")
    ap.add_argument("--prompts", default=None, help="offload prompts (default corpus:val:6; corpus:val:2 quick)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per request (default 24; 12 quick)")
    ap.add_argument("--ep-steps", type=int, default=None, help="EP steps replayed (default 6; 3 quick)")
    ap.add_argument("--only", default="offload,ep", help="configuration families (default offload,ep); a subset "
                                                             "writes advise_validation-FAMILY.json")
    ap.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                    help="score the configurations measured by earlier --only runs together (no new runs)")
    args = ap.parse_args()
    if args.combine:
        cfgs = [c for f in args.combine for c in json.loads(Path(f).read_text())["data"]["configurations"]]
        return report(cfgs, args, time.time(), "advise_validation", {"combined": args.combine})
    q = args.quick
    args.repeats = args.repeats or (2 if q else 3)
    args.prompts = args.prompts or ("corpus:val:2" if q else "corpus:val:6")
    args.max_new_tokens = args.max_new_tokens or (12 if q else 24)
    args.ep_steps = args.ep_steps or (3 if q else 6)
    from routecast.trace.standard import standard_trace

    work = Path("out/bench/advise_validation")
    work.mkdir(parents=True, exist_ok=True)
    trace_dir = standard_trace("fine")
    t0 = time.time()
    prof = _profile(args, work)
    cfgs: list[dict[str, Any]] = []
    fams = args.only.split(",")
    if "offload" in fams:
        cfgs += offload_configs(args, prof, trace_dir)
    if "ep" in fams:
        cfgs += ep_configs(args, prof, trace_dir, work)
    name = "advise_validation" if set(fams) >= {"offload", "ep"} else "advise_validation-" + "-".join(fams)
    return report(cfgs, args, t0, name, {"profile": str(prof)})


def report(cfgs: list[dict[str, Any]], args: argparse.Namespace, t0: float, name: str, extra: dict[str, Any]) -> int:
    """Score, print the claim lines and write the benchmark JSON."""
    n, m, tau, rows = score(cfgs)
    load = os.getloadavg()
    head = [f"advisor top choice measured best (or within noise) in {n} of {m} configurations",
            f"Kendall tau (predicted vs measured order, mean over configurations) {tau:.2f}",
            "targets: N/M >= 0.8, tau >= 0.7; no GPU is lent to this task: the GPU cost model is not validated here",
            f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (2 shared cores); {time.time() - t0:.0f} s"]
    for r in rows:
        print(json.dumps(r, default=float))
    print("\n".join(head))
    write_bench(name, title="The advisor's order against measured runs on this CPU", headline=head,
                tables=[table("per configuration", rows)],
                data={"configurations": cfgs, "n": n, "m": m, "tau": tau, **extra}, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
