"""Speculative MoE: co-clustering LAR / imbalance / all-to-all bytes, simulated layer speedup, predictor accuracy,
co-clustering time (routecast.schedule.cocluster, routecast.predict.smoe, routecast.sim.comm).

Claims checked: the paper's Algorithm 1 (CEO co-clustering, beta 1.1, rho 0.2) beats METIS and 2-D balanced
k-means on LAR (its Fig. 6), raises LAR by 43-61 points over plain EP (its Fig. 5: DeepSeek-V2 0.12 -> 0.54,
Mixtral 0.21 -> 0.82), its predictor reaches ~89% accuracy, and the co-clustering of a DeepSeek-V3-sized layer
(256 experts, 100k tokens) takes <= 10 s on one core.

Method. Traces: the fine trace (builtin-fine capture, 64 experts top-6, 5 MoE layers, 19,876 tokens) at EP 4/8;
a synthetic deepseek-v3 preset trace (`--ds-requests` requests, its first `--ds-layers` MoE layers, 256 experts
top-8) at EP 8/16/32. Each trace is split by document 80/20 (seed 0; synthetic requests are their own
documents); every method is fitted on the training 80% and scored twice: in sample (on the same 80%) and held
out (on the other 20%, token ids never profiled stay on their home rank). Methods: smoe (Algorithm 1), smoe-paper
(its token sampler as printed), smoe-groups (Algorithm 1 placing whole router groups, --respect-groups: what a
permuted grouped-router checkpoint can realise; only where the groups divide over the ranks), metis, kmeans (2-D balanced), hypergraph (Mt-KaHyPar, km1), random, sts (token
shuffling alone, experts contiguous), none (plain EP). All are held to the same balance: E/G experts per rank,
token load <= beta x mean (+ one token). a2a bytes: routed assignments whose expert is on another rank x hidden x
2 bytes, per layer (dispatch; the combine returns the same), -Z% against plain EP on the same tokens.
Simulated layer speedup: sim/comm.a2a_for_lar on the deepseek-v3 profile, h100-sxm, 16 x 512 prefill tokens,
over NVLink and PCIe: plain EP (TP all-reduce, its LAR) vs the method (s-TS reduce-scatter, its held-out LAR).
End to end: throughput under SLO on the serving simulator (routecast/serve/; fastgen scheduling, eMoE's
tasks, Poisson, SLO 5x the idle plain-EP latency, >= 90% attainment, bisection on the rate) at plain EP's LAR and at
the held-out LARs measured here at the same EP (deepseek-v2 EP 8 over a 20.8 GB/s link; deepseek-v3 EP 32, NVLink).
Predictor: `smoe` (token table with embedding fallback + device 2-gram, Algorithm 2) in the causal harness on
the fine trace's held-out documents, expert top-k accuracy and device accuracy with the smoe plan's groups at
EP 8. Time: Algorithm 1 on one layer of a synthetic deepseek-v3 trace of `--scale-tokens` tokens at EP 32, one
thread, median of `--reps` runs (numba compiled before timing).

Run: python benchmarks/smoe.py [--quick]   (writes out/bench/smoe.json; last lines
`METHOD EP n: LAR X, imbalance Y, a2a bytes -Z%` on the fine trace's held-out documents)
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.schedule.ceo import CEOConfig, paper_preset  # noqa: E402
from routecast.schedule.cocluster import cocluster, evaluate_plan  # noqa: E402
from routecast.trace import Trace  # noqa: E402

METHODS = ("none", "random", "sts", "kmeans", "metis", "hypergraph", "smoe-paper", "smoe", "smoe-groups")


def first_layers(trace: Trace, n: int) -> Trace:
    """The trace restricted to its first n MoE layers (in memory)."""
    n = min(n, trace.spec.num_layers)
    spec = dataclasses.replace(trace.spec, num_layers=n, layer_ids=trace.spec.layer_ids[:n])
    return Trace(spec=spec, tokens={k: np.asarray(v) for k, v in trace.tokens.items()},
                 experts_TLK=np.ascontiguousarray(trace.experts_TLK[:, :n]),
                 weights_TLK=np.ascontiguousarray(trace.weights_TLK[:, :n]), task_names=trace.task_names,
                 source_names=trace.source_names, provenance=dict(trace.provenance))


def run_case(name: str, trace: Trace, eps: tuple[int, ...], methods: tuple[str, ...]) -> list[dict]:
    (train, test), used, _ = trace.heldout_masks("document", (0.8, 0.2), seed=0)
    rows = []
    for ep in eps:
        base: dict[str, float] = {}
        for m in methods:
            groups = m == "smoe-groups"
            if groups and (trace.spec.n_group <= 1 or trace.spec.n_group % ep):
                continue  # whole router groups cannot fill ep ranks evenly
            cfg = paper_preset() if m == "smoe-paper" else CEOConfig()
            t0 = time.perf_counter()
            plan = cocluster(trace, ep, "smoe" if m.startswith("smoe") else m, rows=train, config=cfg,
                             respect_groups=groups)
            fit = time.perf_counter() - t0
            ins, held = evaluate_plan(plan, trace, rows=train), evaluate_plan(plan, trace, rows=test)
            if m == "none":
                base = {"in": ins["a2a_bytes"], "held": held["a2a_bytes"]}
            r = {"trace": name, "ep": ep, "method": m, "fit_s": fit, "split": used, "in_sample": _slim(ins),
                 "held_out": _slim(held), "a2a_change_in": ins["a2a_bytes"] / base["in"] - 1,
                 "a2a_change_held": held["a2a_bytes"] / base["held"] - 1}
            rows.append(r)
            print(f"{name:<12} EP{ep:<3} {m:<11} LAR {held['lar']:.3f} (in {ins['lar']:.3f})  exp.imb "
                  f"{held['expert_imbalance']:.3f}  tok.imb {held['token_imbalance']:.3f}  a2a "
                  f"{r['a2a_change_held']:+.1%} (in {r['a2a_change_in']:+.1%})  dedup {held['a2a_bytes_dedup'] / 1e6:.3f} MB"
                  f"  fit {fit:.2f}s", flush=True)
    return rows


def _slim(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "per_layer"} | {"lar_per_layer": d["per_layer"]["lar"]}


def simulate(rows: list[dict]) -> list[dict]:
    from routecast.sim.comm import a2a_for_lar
    from routecast.sim.cost import Workload
    from routecast.sim.hardware import load_hardware
    from routecast.sim.models import load_model

    model, hw, work = load_model("deepseek-v3"), load_hardware("h100-sxm"), Workload(batch=16, seq_len=512)
    out = []
    for (trace, ep), grp in _group(rows).items():
        base = next(r for r in grp if r["method"] == "none")["held_out"]["lar"]
        for link in ("nvlink", "pcie"):
            ep_cost = a2a_for_lar(base, model=model, hw=hw, ep=ep, work=work, link=link, scatter="allreduce")
            for r in grp:
                lar = r["held_out"]["lar"]
                sc = "allreduce" if r["method"] == "none" else "reduce_scatter"
                c = a2a_for_lar(lar, model=model, hw=hw, ep=ep, work=work, link=link, scatter=sc)
                out.append({"trace": trace, "ep": ep, "method": r["method"], "link": link, "lar": lar,
                            "a2a_bytes_per_rank": float(c["a2a_bytes_per_rank"][0]),
                            "layer_us": float(c["layer_s"][0] * 1e6),
                            "speedup": float(ep_cost["layer_s"][0] / c["layer_s"][0])})
    return out


def _group(rows: list[dict]) -> dict:
    g: dict = {}
    for r in rows:
        g.setdefault((r["trace"], r["ep"]), []).append(r)
    return g


# (profile, hardware, GPUs, link, GB/s override, which measured LARs): the serving simulator's settings
# (benchmarks/serve_sim.py part B); s-MoE's GPU-Server-B crosses a 20.8 GB/s UPI hop.
E2E_SETUPS = [("deepseek-v2", "h100-sxm", 8, "pcie", 20.8), ("deepseek-v3", "h100-sxm", 32, "nvlink", None)]


def end_to_end(rows: list[dict], requests: int, seed: int = 0) -> list[dict]:
    """Throughput under SLO (fastgen serving, SLO 5x the idle plain-EP latency, attainment >= 90%, bisection on
    the Poisson rate) at plain EP's 1/G and at the held-out LARs this benchmark measured at the same EP."""
    from routecast.serve.engine import EngineConfig, build_engine
    from routecast.serve.loop import simulate
    from routecast.serve.sched import make_scheduler
    from routecast.serve.sweep import capacity_rps
    from routecast.serve.workload import emoe_tasks, make_requests

    out = []
    for model, hw, G, link, gbps in E2E_SETUPS:
        plain = build_engine(EngineConfig(model=model, hardware=hw, gpus=G, link=link, link_gbps=gbps))
        cap = capacity_rps(plain, make_requests(emoe_tasks(), min(requests, 1500), 1.0, seed=seed))
        lars = [("plain EP", None)] + [(f"{r['trace']} {r['method']}", r["held_out"]["lar"]) for r in rows
                                       if r["ep"] == G and r["method"] in ("sts", "smoe", "hypergraph")]
        base = None
        for label, lar in lars:
            eng = plain if lar is None else build_engine(
                EngineConfig(model=model, hardware=hw, gpus=G, link=link, link_gbps=gbps, lar=lar))
            lo, hi, thr = 0.0, 2.0 * cap, 0.0
            for _ in range(8):
                mid = (lo + hi) / 2
                m = simulate(eng, make_requests(emoe_tasks(), requests, mid, seed=seed), make_scheduler("fastgen"),
                             slo_engine=plain).metrics()
                if m["slo_attainment"] >= 0.9:
                    lo, thr = mid, m["throughput_tok_s"]
                else:
                    hi = mid
            base = thr if base is None else base
            r = {"setting": f"{model} EP{G} {hw} {link}" + (f" {gbps:g}GB/s" if gbps else ""), "lar_from": label,
                 "lar": 1.0 / G if lar is None else lar, "throughput_under_slo": thr, "gain": thr / base if base else 0.0}
            out.append(r)
            print(f"end to end {r['setting']}: LAR {r['lar']:.3f} ({label}): {thr:.1f} tok/s under SLO, "
                  f"{r['gain']:.3f}x plain EP", flush=True)
    return out


def predictor(fine: Trace) -> dict:
    from routecast.predict.evaluate import _embeddings_for, heldout_rows
    from routecast.predict.harness import run_harness
    from routecast.predict.smoe import SMoEConfig, SMoEPredictor, device_scores

    train, test, _ = heldout_rows(fine, "document", 0.8, 0)
    emb, src = _embeddings_for(["smoe"], fine, None)
    plan = cocluster(fine, 8, "smoe", rows=train)
    out = {}
    for label, groups in (("contiguous EP 8", None), ("smoe plan EP 8", plan.expert_group_LE)):
        for emb_label, e in (("embeddings", emb), ("no embeddings", None)):
            p = SMoEPredictor(fine.spec, SMoEConfig(ep=8), embeddings=e, embedding_source=src, group_LE=groups)
            p.fit_rows(fine, train)
            res = run_harness(p, fine, rows=test, collect=True)
            dev = device_scores(res.forecasts, fine.select(test), p.group_LE, 8)
            key = f"{label}, {emb_label}"
            out[key] = {"top_k_accuracy": float(np.mean(res.metrics["top_k_accuracy"])),
                        "top_k_per_layer": res.metrics["top_k_accuracy"], **dev, "us_per_token": res.us_per_token}
            print(f"predictor smoe ({key}): expert top-k acc {out[key]['top_k_accuracy']:.3f}, device acc "
                  f"{dev['device_accuracy']:.3f}, speculative LAR {dev['speculative_lar']:.3f}, "
                  f"{res.us_per_token:.1f} µs/token", flush=True)
    return out


def scale_time(tokens: int, reps: int) -> dict:
    from routecast.trace.synth import generate
    from routecast.trace.synth_presets import preset_config

    tr = first_layers(generate(preset_config("deepseek-v3", tokens=tokens, seed=1)), 1)
    cocluster(first_layers(tr, 1).select(np.arange(min(2000, tr.num_tokens))), 32, "smoe")  # compile
    times, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        plan = cocluster(tr, 32, "smoe")
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    r = {"tokens": tr.num_tokens, "distinct_tokens": int(plan.meta["distinct_tokens"]), "experts": tr.spec.num_experts,
         "ep": 32, "seconds": times, "median_s": float(np.median(times)), "cpu_seconds": cpu,
         "median_cpu_s": float(np.median(cpu)), "load": os.getloadavg()[0]}
    print(f"Algorithm 1 time, one layer of {tr.num_tokens} tokens ({r['distinct_tokens']} distinct ids), 256 experts, "
          f"EP 32, 1 thread: median {r['median_cpu_s']:.2f} s CPU, {r['median_s']:.2f} s wall of {reps} (wall range "
          f"{min(times):.2f}-{max(times):.2f}; load {r['load']:.1f})", flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fine", default=None, help="fine trace directory (default: the standard trace 'fine', "
                                                 "captured on first use)")
    ap.add_argument("--ds-preset", default="deepseek-v3", help="synthetic preset of the second case (default deepseek-v3)")
    ap.add_argument("--ds-requests", type=int, default=20, help="requests of the synthetic trace")
    ap.add_argument("--ds-layers", type=int, default=2, help="MoE layers of it co-clustered")
    ap.add_argument("--scale-tokens", type=int, default=100_000, help="tokens of the timing case")
    ap.add_argument("--reps", type=int, default=3, help="repeats of the timing case (0: skip it)")
    ap.add_argument("--quick", action="store_true", help="fine trace only, no synthetic cases, no timing case, "
                                                          "400 requests per serving simulation")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset (none is always run first)")
    ap.add_argument("--scale-only", action="store_true", help="only the timing case (writes --out too)")
    ap.add_argument("--e2e-from", default=None,
                    help="only the end-to-end serving part, at the LARs of a previous run's JSON (writes --out)")
    ap.add_argument("--e2e-requests", type=int, default=1500, help="requests per serving simulation (default 1500)")
    ap.add_argument("--out", default="out/bench/smoe.json", help="JSON output")
    a = ap.parse_args()
    from routecast.trace.io import read_trace
    from routecast.trace.synth import generate
    from routecast.trace.synth_presets import preset_config

    t_start = time.perf_counter()
    if a.quick:
        a.e2e_requests = min(a.e2e_requests, 400)
    print(f"load: {os.getloadavg()[0]:.1f} (1-min) on {os.cpu_count()} cores", flush=True)
    if a.e2e_from:
        prev = json.loads(Path(a.e2e_from).read_text())
        prev = prev.get("data", prev)  # write_bench keeps the rows under data
        e2e = end_to_end(prev["rows"], a.e2e_requests)
        write_bench("smoe", title="Speculative MoE: end-to-end serving at measured LARs",
                    headline=[f"end to end at the LARs of {a.e2e_from}"], data={"from": a.e2e_from, "end_to_end": e2e},
                    quick=a.quick, path=a.out)
        return
    if a.scale_only:
        sc = scale_time(a.scale_tokens, a.reps)
        write_bench("smoe", title="Speculative MoE: Algorithm 1 time on one DeepSeek-V3-sized layer",
                    headline=[f"Algorithm 1, {sc['tokens']} tokens, 256 experts, EP 32, 1 thread: median "
                              f"{sc['median_cpu_s']:.2f} s CPU, {sc['median_s']:.2f} s wall"],
                    data={"scale": sc}, quick=a.quick, path=a.out)
        return
    if a.fine is None:
        from routecast.trace.standard import standard_trace

        a.fine = standard_trace("fine")
    fine = read_trace(a.fine, load_hidden=False, load_logits=False).materialise()
    methods = tuple(dict.fromkeys(["none", *[m for m in a.methods.split(",") if m in METHODS]]))
    rows = run_case("fine", fine, (4, 8), methods)
    res: dict = {}
    if not a.quick:
        ds = first_layers(generate(preset_config(a.ds_preset, requests=a.ds_requests, seed=0)), a.ds_layers)
        print(f"synthetic {a.ds_preset}: {ds!r} ({a.ds_requests} requests, first {a.ds_layers} MoE layers)", flush=True)
        res["ds_trace"] = {"preset": a.ds_preset, "tokens": ds.num_tokens, "requests": a.ds_requests, "layers": a.ds_layers}
        rows += run_case(a.ds_preset, ds, (8, 16, 32), methods)
    res["rows"] = rows
    res["simulated"] = sim = simulate(rows)
    for s in sim:
        if s["method"] in ("smoe", "hypergraph", "sts"):
            print(f"simulated layer {s['trace']} EP{s['ep']} {s['method']} {s['link']}: LAR {s['lar']:.3f}, a2a "
                  f"{s['a2a_bytes_per_rank'] / 1e6:.2f} MB/rank, {s['layer_us']:.0f} µs, {s['speedup']:.3f}x vs plain EP")
    res["end_to_end"] = end_to_end(rows, a.e2e_requests)
    res["predictor"] = predictor(fine)
    if not a.quick and a.reps > 0:
        res["scale"] = scale_time(a.scale_tokens, a.reps)
    res["load_end"] = os.getloadavg()[0]
    res["total_s"] = time.perf_counter() - t_start
    head = []
    for r in rows:
        if r["method"] == "smoe":
            b = next(x for x in rows if x["trace"] == r["trace"] and x["ep"] == r["ep"] and x["method"] == "none")
            head.append(f"smoe held-out LAR, {r['trace']} EP {r['ep']}: plain EP {b['held_out']['lar']:.3f} -> "
                        f"{r['held_out']['lar']:.3f} "
                        f"({(r['held_out']['lar'] - b['held_out']['lar']) * 100:+.1f} points; in sample "
                        f"{(r['in_sample']['lar'] - b['in_sample']['lar']) * 100:+.1f})")
    head.append("paper (Fig. 5): LAR +43 points (DeepSeek-V2, 0.12 -> 0.54), +61 (Mixtral, 0.21 -> 0.82)")
    head.append("held-out documents of the fine trace (fit on the other 80%):")
    for r in rows:
        if r["trace"] == "fine":
            h = r["held_out"]
            head.append(f"{r['method']} EP {r['ep']}: LAR {h['lar']:.3f}, imbalance {h['expert_imbalance']:.3f}, "
                        f"a2a bytes {r['a2a_change_held'] * 100:+.1f}%")
    held = [{"trace": r["trace"], "EP": r["ep"], "method": r["method"], "LAR held out": r["held_out"]["lar"],
             "LAR in sample": r["in_sample"]["lar"], "imbalance held out": r["held_out"]["expert_imbalance"],
             "a2a bytes vs plain EP": r["a2a_change_held"]} for r in rows]
    simt = [{"trace": s["trace"], "EP": s["ep"], "method": s["method"], "link": s["link"], "LAR": s["lar"],
             "layer µs": s["layer_us"], "speedup vs plain EP": s["speedup"]} for s in sim]
    p = write_bench("smoe", title="Speculative MoE: co-clustering LAR, all-to-all bytes and simulated speedup",
                    headline=[h.strip() for h in head],
                    tables=[table("co-clustering: fit on 80% of the documents, scored in sample and held out", held),
                            table("simulated MoE layer (sim/comm) at the held-out LAR", simt),
                            table("end to end: throughput under SLO on the serving simulator", res["end_to_end"]),
                            table("smoe predictor on held-out documents (fine trace, EP 8)",
                                  [{"setting": k, "top-k acc": v["top_k_accuracy"],
                                    "device acc": v["device_accuracy"], "speculative LAR": v["speculative_lar"],
                                    "µs/token": v["us_per_token"]} for k, v in res["predictor"].items()])],
                    data=res, quick=a.quick, path=a.out)
    print("\n".join(head))
    print(f"wrote {p} ({res['total_s']:.0f} s, load {res['load_end']:.1f} at the end)")

if __name__ == "__main__":
    main()
