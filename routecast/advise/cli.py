"""`routecast advise`: the parser and the handler (argparse only at import time; the work is imported lazily).

    routecast advise --trace DIR | --preset NAME  --model-profile M --hardware H --gpus N [--ep N] [--memory-gb G]
                     [--link nvlink|pcie] [--rate R] [--slo-ttft-ms X --slo-tpot-ms Y] [--json] [--out DIR] [--html F]

prints one ranked table of every strategy of the five systems on the trace (advise.run), the strategies that
do not apply with the reason, and the two-sentence verdict; --out writes the artifacts (advise.artifacts).
Without --trace and --preset, or with --moe-gps, it answers MoE-GPS's own question (advise.moegps: no prediction
/ distribution-only / token-to-expert duplication at a skewness), with that mode's flags.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from routecast.common import numbers as N
from routecast.common.errors import ConfigError

FAMILY_HELP = "placement,shuffle,cache,scheduler"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("advise", help="rank every strategy of the five systems for a model, hardware and workload")
    p.add_argument("--model-profile", required=True, help="model profile name (sim/models/*.toml), builtin-fine or a config path")
    p.add_argument("--hardware", required=True, help="hardware profile name (sim/hardware/*.toml) or TOML path")
    p.add_argument("--gpus", type=N.positive(1 << 16), required=True, help="GPUs (devices) of the deployment")
    p.add_argument("--ep", type=N.positive(1 << 16), default=None, help="expert-parallel degree (default: --gpus)")
    p.add_argument("--memory-gb", type=N.real(0.0, 1e6, lo_open=True), default=None, help="memory per GPU, GB (default: the profile's capacity)")
    p.add_argument("--link", choices=("nvlink", "pcie"), default="nvlink", help="GPU-GPU link (default nvlink)")
    p.add_argument("--trace", default=None, help="trace directory (captured, imported or synthetic)")
    p.add_argument("--preset", default=None, help="synthetic preset trace made on first use (e.g. mixtral-8x7b)")
    p.add_argument("--requests", type=N.positive(100_000), default=None, help="--preset: requests to synthesise (default 64)")
    p.add_argument("--rate", type=N.real(0.0, 1e7, lo_open=True), default=None, help="requests/s offered to the schedulers (default 70%% of capacity)")
    p.add_argument("--slo-ttft-ms", default="5x", help="TTFT SLO in ms, or 'Nx' the unloaded latency (default 5x)")
    p.add_argument("--slo-tpot-ms", default="5x", help="TPOT SLO in ms, or 'Nx' the unloaded latency (default 5x)")
    p.add_argument("--only", default=FAMILY_HELP, help=f"strategy families to price (default {FAMILY_HELP})")
    p.add_argument("--shuffle-methods", default="smoe,metis,sts", help="partitioners tried for Speculative MoE")
    p.add_argument("--predictor", default="conditional-token", help="predictor driving PLEC prefetch in the cache replay")
    p.add_argument("--emoe-quality", default=None, help="JSON of `routecast emoe quality`: eMoE's perplexity cost")
    p.add_argument("--out", default=None, help="folder for the deploy artifacts (SGLang file, plans, commands)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out, replacing the advisor's files (others are kept)")
    p.add_argument("--html", default=None, help="write the HTML report (verdict first) to this file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--seed", type=N.seed(), default=0, help="random seed (default 0)")
    p.add_argument("--threads", type=N.threads(), default=1, help="torch CPU threads (default 1)")
    g = p.add_argument_group("MoE-GPS mode (no --trace/--preset, or --moe-gps)")
    g.add_argument("--moe-gps", action="store_true", help="answer MoE-GPS's question only (its table and flags)")
    g.add_argument("--seq", type=N.positive(1 << 24), default=512, help="sequence length (default 512)")
    g.add_argument("--batch", type=N.positive(1 << 20), default=1, help="batch size (default 1)")
    g.add_argument("--placement", choices=("replicas", "ideal"), default="replicas",
                   help="replicas: every copy re-reads its weights (default); ideal: MoE-GPS's each-rank-at-mean")
    g.add_argument("--error-model", choices=("optimistic", "typical", "pessimistic"), default="typical",
                   help="how prediction errors land on ranks (MoE-GPS §3.3; default typical)")
    g.add_argument("--skewness", type=N.real(1.0, 1e4), default=None, help="override the skewness (default: trace's, else 1.4)")
    g.add_argument("--link-gbps", type=N.real(0.0, 1e6, lo_open=True), default=None, help="override the per-direction link bandwidth, GB/s")
    g.add_argument("--predictors", default="distribution,probability,conditional-token,conditional-position,ffn",
                   help="predictors to measure on --trace (comma list)")
    g.add_argument("--epochs", type=N.positive(10000), default=3, help="training epochs for neural predictors (default 3)")
    g.add_argument("--model", default=None, help="checkpoint for embeddings and forward timing: DIR, builtin, builtin-fine or none")
    p.set_defaults(fn=advise_cli)


def slo_value(text: str, flag: str) -> str:
    """'--slo-ttft-ms 200' -> '0.2' (seconds), 'Nx' kept; ConfigError naming the flag otherwise."""
    s = str(text).strip().lower()
    if s.endswith("x"):
        return s
    try:
        ms = float(s)
    except ValueError:
        raise ConfigError(f"{flag} is {text!r}; expected milliseconds (e.g. 200) or a multiple of the unloaded "
                          "latency (e.g. 5x).") from None
    if not (math.isfinite(ms) and ms > 0):
        raise ConfigError(f"{flag} is {text!r}; expected a positive finite number of milliseconds.")
    return repr(ms / 1e3)


def advise_cli(a: argparse.Namespace, html_writer: Any = None) -> int:
    """The handler; html_writer(path, verdict) writes --html (report/ sits above this stage, so cli.py passes it)."""
    if a.threads is None or a.threads < 1:
        raise ConfigError(f"--threads is {a.threads}; expected a positive integer.")
    if a.moe_gps or (a.trace is None and a.preset is None):
        import torch

        from routecast.advise.moegps import advise_main as moegps_main

        torch.set_num_threads(a.threads)
        return moegps_main(
            model_profile=a.model_profile, hardware=a.hardware, gpus=a.gpus, link=a.link, trace=a.trace, seq=a.seq,
            batch=a.batch, as_json=a.json, placement=a.placement, error_model=a.error_model, skewness=a.skewness,
            link_gbps=a.link_gbps, predictors=a.predictors, epochs=a.epochs, model_dir=a.model, seed=a.seed,
        )
    return advise_main(a, html_writer)


def advise_main(a: argparse.Namespace, html_writer: Any = None) -> int:
    """The full advisor (module docstring): table or JSON on stdout, artifacts under --out, HTML to --html."""
    from routecast.common.outputs import check_out_dir, check_out_file, claim

    if a.trace is not None and a.preset is not None:
        raise ConfigError("--trace and --preset are both given; expected one of them.")
    if a.requests is not None and (a.preset is None or a.requests < 1):
        raise ConfigError(f"--requests is {a.requests}; expected a positive count, with --preset.")
    fams = tuple(f.strip() for f in str(a.only).split(",") if f.strip())
    methods = tuple(m.strip() for m in str(a.shuffle_methods).split(",") if m.strip())
    ttft, tpot = slo_value(a.slo_ttft_ms, "--slo-ttft-ms"), slo_value(a.slo_tpot_ms, "--slo-tpot-ms")
    if a.out:
        check_out_dir(a.out, "--out", overwrite=a.overwrite)
        claim(a.out, "--out", "dir")
    if a.html:
        check_out_file(a.html, "--html")
        claim(a.html, "--html")
        if html_writer is None:
            raise ConfigError("--html needs the report writer; expected `routecast advise` from the command line.")
    from routecast.advise.run import advise_trace, make_deployment
    from routecast.trace.io import read_trace

    dep = make_deployment(model_profile=a.model_profile, hardware=a.hardware, gpus=a.gpus, ep=a.ep,
                          memory_gb=a.memory_gb, link=a.link, rate=a.rate, slo_ttft=ttft, slo_tpot=tpot)
    if a.preset is not None:
        from routecast.trace.standard import standard_trace

        path = standard_trace(a.preset, requests=a.requests, progress=False)
    else:
        path = a.trace
    import torch

    torch.set_num_threads(a.threads)
    trace = read_trace(path, load_hidden=False, load_logits=False)
    v, extras = advise_trace(trace, dep, model_ref=a.model_profile, hw_ref=a.hardware, families=fams,
                             shuffle_methods=methods or None, predictor=a.predictor, emoe_quality=a.emoe_quality,
                             seed=a.seed, trace_path=path)
    files: dict[str, str] = {}
    if a.out:
        from routecast.advise.artifacts import write_artifacts

        files = write_artifacts(a.out, v, model=dep.model, plans=extras["plans"], shuffle=extras["shuffle"],
                                serve_conf=extras["serve"], model_ref=a.model_profile, trace_ref=str(path))
    if a.html:
        html_writer(a.html, v)
        files["html"] = str(a.html)
    if a.json:
        from routecast.common.bench import _clean

        print(json.dumps(_clean({**v.as_dict(), "artifacts": files}), indent=1, allow_nan=False))
    else:
        print(v.text())
        for k, f in files.items():
            print(f"wrote {k}: {f}")
    return 0
