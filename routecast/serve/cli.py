"""`routecast serve-sim`: parses the flags, runs serve/sweep.py's rate sweep, prints a table and writes JSON.

    parse_fraction, parse_rates                                     flag values -> numbers (ConfigError otherwise)
    format_rows(rows) -> str                                        the fixed-width table
    add_parser(sub); serve_sim_main(args)                           the subcommand
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from routecast.common import numbers as N
from routecast.common.errors import ConfigError
from routecast.common.outputs import writes
from routecast.serve.engine import MISS_MODES, EngineConfig
from routecast.serve.loop import SLO, parse_slo
from routecast.serve.sched import SCHEDULERS
from routecast.serve.sweep import sweep, under_slo
from routecast.serve.workload import ARRIVALS, MIN_RATE, Requests

COLUMNS = ("scheduler", "rate", "throughput_tok_s", "goodput_tok_s", "slo_attainment", "ttft_p50_s", "ttft_p90_s",
           "tpot_p50_s", "tpot_p90_s", "e2e_mean_s", "e2e_p90_s", "tbt_p90_s")


def parse_fraction(text: str | float, flag: str) -> float:
    """'50%' or '0.5' -> 0.5; one sentence for anything else (NaN, inf, out of range)."""
    raw = str(text).strip().lower()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(%?)", raw)
    if not m:
        raise ConfigError(f"{flag} is {text!r}; expected a fraction ('0.5') or a percentage ('50%').")
    v = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
    if not (math.isfinite(v) and 0 < v <= 1):
        raise ConfigError(f"{flag} is {text!r}; expected a value in (0, 1] (or (0%, 100%]).")
    return v


def parse_rates(text: str, flag: str = "--rates") -> list[float]:
    """'1,2,4' -> [1.0, 2.0, 4.0]; each finite and > 0."""
    out = []
    for part in str(text).split(","):
        try:
            v = float(part)
        except ValueError:
            raise ConfigError(f"{flag} holds {part!r}; expected comma-separated arrival rates in requests/s.") from None
        if not (math.isfinite(v) and v >= MIN_RATE):
            raise ConfigError(f"{flag} holds {part!r}; expected finite arrival rates >= {MIN_RATE:g} requests/s.")
        out.append(v)
    if not out:
        raise ConfigError(f"{flag} is empty; expected at least one arrival rate.")
    return out


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table of the rows (times in ms)."""
    head = (f"{'scheduler':<9} {'rate':>7} {'tok/s':>8} {'good/s':>8} {'SLO%':>6} {'TTFT50':>8} {'TTFT90':>8} "
            f"{'TPOT50':>7} {'TPOT90':>7} {'E2Emean':>8} {'E2E90':>8} {'TBT90':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ms = {k: 1e3 * r[k] for k in COLUMNS if k.endswith("_s")}
        lines.append(
            f"{r['scheduler']:<9} {r['rate']:>7.3g} {r['throughput_tok_s']:>8.1f} {r['goodput_tok_s']:>8.1f} "
            f"{100 * r['slo_attainment']:>6.1f} {ms['ttft_p50_s']:>8.1f} {ms['ttft_p90_s']:>8.1f} "
            f"{ms['tpot_p50_s']:>7.2f} {ms['tpot_p90_s']:>7.2f} {ms['e2e_mean_s']:>8.0f} {ms['e2e_p90_s']:>8.0f} "
            f"{ms['tbt_p90_s']:>7.2f}")
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    """Register `serve-sim` on the routecast subparsers."""
    p = sub.add_parser("serve-sim", help="serving simulation: TTFT, TPOT, SLO attainment per request scheduler")
    p.add_argument("--model-profile", default="mixtral-8x7b", help="model profile name or .toml (default mixtral-8x7b)")
    p.add_argument("--hardware", default="h100-sxm", help="hardware profile name or .toml (default h100-sxm)")
    p.add_argument("--scheduler", default="emoe",
                   help=f"one or more of {','.join(SCHEDULERS)}, comma-separated (default emoe)")
    p.add_argument("--rate", type=N.real(MIN_RATE, 1e9), default=None, help="arrival rate in requests/s (default 8)")
    p.add_argument("--rates", default=None, help="sweep: comma-separated rates (replaces --rate)")
    p.add_argument("--requests", type=N.count_by_memory(4096, what='requests'), default=1000, help="simulated requests per run (default 1000)")
    p.add_argument("--seed", type=N.seed(), default=0, help="seed of the arrivals, lengths and routing draws (default 0)")
    p.add_argument("--arrival", choices=ARRIVALS, default="poisson", help="arrival process (default poisson)")
    p.add_argument("--cv", type=N.real(0.01, 100.0), default=1.0, help="coefficient of variation of gamma gaps (default 1)")
    p.add_argument("--trace", default=None, help="replay a trace's requests (lengths, order) scaled to each rate")
    p.add_argument("--slo-ttft", default="5x", help="TTFT SLO: seconds or a multiple of the idle latency (default 5x)")
    p.add_argument("--slo-tpot", default="5x", help="TPOT SLO: seconds or a multiple of the idle latency (default 5x)")
    p.add_argument("--budget", type=N.budget_text(allow_bytes=False), default="100%", help="resident share of each layer's experts (default 100%%)")
    p.add_argument("--miss", choices=MISS_MODES, default="fallback",
                   help="a token whose expert is not resident: fallback (eMoE) or load it on demand (default fallback)")
    p.add_argument("--period", type=N.positive(1 << 20), default=40, help="eMoE reloads the predicted experts every P prompts (default 40)")
    p.add_argument("--lar", type=N.real(0.0, 1.0), default=None, help="local activation rate of the all-to-all (default 1/G)")
    p.add_argument("--gpus", type=N.positive(1 << 16), default=None, help="GPUs of the engine (default: smallest power of two that fits)")
    p.add_argument("--link", choices=("nvlink", "pcie"), default="nvlink", help="GPU-GPU link (default nvlink)")
    p.add_argument("--link-gbps", type=N.real(0.0, 1e6, lo_open=True), default=None,
                   help="override the link's per-direction bandwidth in GB/s (e.g. 20.8: a UPI hop)")
    p.add_argument("--skewness", type=N.real(1.0, 1e4), default=1.4, help="hot expert load / mean (MoE-GPS; default 1.4)")
    p.add_argument("--max-seqs", type=N.positive(1 << 20), default=256, help="running sequences at most (default 256)")
    p.add_argument("--token-budget", type=N.positive(1 << 24), default=4096, help="tokens per step at most (default 4096)")
    p.add_argument("--slo-target", type=N.fraction(), default=0.9, help="attainment for throughput under SLO (default 0.9)")
    p.add_argument("--out", default="out/serve_sim.json", help="JSON output (default out/serve_sim.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=serve_sim_main)


@writes("--out", inputs=("--model-profile", "--hardware", "--trace"))
def serve_sim_main(a: argparse.Namespace) -> int:
    from routecast.common.outputs import check_out_file, write_atomic

    scheds = [s.strip() for s in str(a.scheduler).split(",") if s.strip()]
    for s in scheds or [""]:
        if s not in SCHEDULERS:
            raise ConfigError(f"--scheduler {s!r} is unknown; expected one or more of {list(SCHEDULERS)}.")
    rates = parse_rates(a.rates) if a.rates is not None else parse_rates(str(a.rate if a.rate is not None else 8.0), "--rate")
    if not isinstance(a.requests, int) or a.requests < 1:
        raise ConfigError(f"--requests is {a.requests}; expected a positive integer.")
    if not isinstance(a.period, int) or a.period < 1:
        raise ConfigError(f"--period is {a.period}; expected a positive number of prompts.")
    if a.gpus is not None and a.gpus < 1:  # EngineConfig's 0 means automatic: leaving --gpus out says that
        raise ConfigError(f"--gpus is {a.gpus}; expected a positive number of GPUs (leave it out for the smallest that fits).")
    if not (math.isfinite(a.slo_target) and 0 < a.slo_target <= 1):
        raise ConfigError(f"--slo-target is {a.slo_target}; expected a fraction in (0, 1].")
    for flag, v in (("--lar", a.lar), ("--cv", a.cv), ("--skewness", a.skewness), ("--link-gbps", a.link_gbps)):
        if v is not None and not math.isfinite(v):
            raise ConfigError(f"{flag} is {v}; expected a finite number.")
    parse_slo(a.slo_ttft, "--slo-ttft")
    parse_slo(a.slo_tpot, "--slo-tpot")
    check_out_file(a.out, "--out")
    cfg = EngineConfig(model=a.model_profile, hardware=a.hardware, gpus=a.gpus or 0, link=a.link, link_gbps=a.link_gbps,
                       budget=parse_fraction(a.budget, "--budget"), miss=a.miss, lar=a.lar, skewness=a.skewness,
                       max_seqs=a.max_seqs, token_budget=a.token_budget, seed=a.seed)
    trace_req, freq, freq_note = None, None, "synthetic"
    if a.trace:
        from routecast.serve.workload import task_expert_freq
        from routecast.sim.models import load_model
        from routecast.trace.io import read_trace

        tr = read_trace(a.trace)
        trace_req = Requests.from_trace(tr)
        prof = load_model(a.model_profile)
        if tr.spec.num_experts == prof.num_experts:  # the loader can use the trace's own per-task routing
            freq = task_expert_freq(tr, len(trace_req.task_names), prof.num_moe_layers)
            freq_note = f"from {a.trace}"
    slo = SLO(ttft=a.slo_ttft, tpot=a.slo_tpot)
    engine, rows = sweep(cfg, scheds, rates, requests=a.requests, seed=a.seed, slo=slo, period=a.period,
                         arrival=a.arrival, cv=a.cv, trace_requests=trace_req, task_freq=freq, progress=not a.quiet)
    link = cfg.link if cfg.link_gbps is None else f"{cfg.link} at {cfg.link_gbps:g} GB/s"
    print(f"{engine.model.name} on {engine.gpus} x {engine.hw.name} ({link}), budget {cfg.budget:.0%} "
          f"({engine.resident_per_layer}/{engine.model.num_experts} experts per layer), KV {engine.kv_capacity} tokens, "
          f"LAR {cfg.lar if cfg.lar is not None else 1 / engine.gpus:.3g}, SLO TTFT {a.slo_ttft} TPOT {a.slo_tpot}"
          + (f", per-task expert frequencies {freq_note}" if cfg.budget < 1 else ""))
    print(format_rows(rows))
    best = under_slo(rows, a.slo_target)
    if len(rates) > 1:
        print(f"throughput under SLO (attainment >= {a.slo_target:.0%}): "
              + ", ".join(f"{k} {v:.1f} tok/s" for k, v in best.items()))
    doc = {"config": {**asdict(cfg), "requests": a.requests, "arrival": a.arrival, "cv": a.cv, "period": a.period,
                      "slo_ttft": a.slo_ttft, "slo_tpot": a.slo_tpot, "trace": a.trace, "task_freq": freq_note},
           "engine": {"gpus": engine.gpus, "kv_capacity_tokens": engine.kv_capacity,
                      "weight_gb": engine.weight_bytes / 1e9, "resident_per_layer": engine.resident_per_layer},
           "rows": rows, "throughput_under_slo": best}
    write_atomic(a.out, json.dumps(doc, indent=2), "--out")
    print(f"wrote {a.out}")
    return 0
