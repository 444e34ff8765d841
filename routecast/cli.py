"""The `routecast` command: one subcommand per stage; each handler imports its stage lazily.

Errors meant for the user (RoutecastError) print one line on stderr and exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from routecast.common import numbers as N
from routecast.common.errors import ConfigError, RoutecastError, TraceError
from routecast.common.outputs import NAME_RESOLVERS, add_overwrite_flags, writes
from routecast.place.export_cli import run_export
from routecast.runtime.ep.cli import add_parser as add_ep_parser
from routecast.schedule import cocluster_cli


def _threads(n: int) -> None:
    # 1 thread is fastest for small forwards on the 2-core machines this was measured on.
    import torch

    torch.set_num_threads(n)


def _add_threads(p: argparse.ArgumentParser, default: int = 1) -> None:
    p.add_argument(
        "--threads", type=N.threads(), default=default, help=f"torch CPU threads (default {default}; 1 was fastest measured)"
    )


def _add_replay_flags(p: argparse.ArgumentParser, out: str) -> None:
    """Flags shared by `cache replay` and `schedule rebatch`."""
    p.add_argument("--hardware", default="h100-sxm", help="hardware profile: its h2d link moves experts (default h100-sxm)")
    p.add_argument("--expert-bytes", type=N.nonneg(1 << 40), default=0, help="bytes per expert (default: the trace's spec)")
    p.add_argument("--model", default=None, help="checkpoint for neural/lookahead predictors (DIR, builtin, none)")
    p.add_argument("--seed", type=N.seed(), default=0, help="seed of the held-out split and the predictor (default 0)")
    p.add_argument("--split", choices=("document", "request"), default="document",
                   help="hold out whole documents (default; by request when the trace records none) or requests")
    p.add_argument("--out", default=out, help=f"JSON output (default {out})")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_threads(p)


# ------------------------------------------------------------------ handlers
@writes("--out", inputs=("--model",))
def cmd_demo(a: argparse.Namespace) -> int:
    from routecast.demo import run_demo

    _threads(a.threads)
    run_demo(out_dir=a.out, synthetic=a.synthetic, requests=a.requests, seed=a.seed, overwrite=a.overwrite,
             model=a.model)
    return 0


@writes("--out")
def cmd_synth(a: argparse.Namespace) -> int:
    from routecast.trace.synth_presets import calibrate_preset_table, parse_set_args, synth_to_disk

    if a.calibrate:
        for r in calibrate_preset_table(seed=a.seed):
            flag = "ok" if r["within_10pct"] else "OFF"
            print(f"{r['preset']:<22} {r['statistic']:<44} target {r['target']:<8.4g} measured {r['measured']:<8.4g} {flag}")
        return 0
    if not a.preset or not a.out:
        raise ConfigError("synth needs --preset and --out (or --calibrate to print the preset calibration table).")
    overrides = parse_set_args(a.set or [])
    path = synth_to_disk(
        a.preset, a.out, tokens=a.tokens, requests=a.requests, seed=a.seed, overrides=overrides or None,
        overwrite=a.overwrite,
    )
    print(f"wrote {path}")
    return 0


@writes("--plot", inputs=("trace",))
def cmd_stats(a: argparse.Namespace) -> int:
    from routecast.common.outputs import check_out_file
    from routecast.report.stats import stats_main

    if a.plot is not None:
        check_out_file(a.plot, "--plot")  # before the statistics pass, not after it

    return stats_main(a.trace, ep=a.ep, window=a.window, as_json=a.json, plot=a.plot, seq_len=a.seq_len)


@writes("--out", inputs=("src", "--spec"))
def cmd_import(a: argparse.Namespace) -> int:
    from routecast.trace.importers import import_jsonl

    field_map = {}
    for kv in a.map or []:
        if "=" not in kv:
            raise ConfigError(f"--map {kv!r} is not of the form their_name=canonical_name.")
        k, v = kv.split("=", 1)
        field_map[k.strip()] = v.strip()
    path = import_jsonl(
        a.src,
        a.out,
        field_map=field_map or None,
        num_experts=a.num_experts,
        top_k=a.top_k,
        spec=_load_spec(a.spec) if a.spec else None,
        window=a.window,
        shard_tokens=a.shard_tokens,
        overwrite=a.overwrite,
        progress=not a.quiet,
    )
    print(f"wrote {path}")
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    from routecast.trace.summary import inspect_lines, inspect_trace

    info = inspect_trace(a.trace)
    print(json.dumps(info, indent=2, default=str) if a.json else "\n".join(inspect_lines(info)))
    if info.get("valid"):
        return 0
    # Like every other command: the reason on stderr, exit code 2 (the summary above stays on stdout).
    raise TraceError(info.get("error") or f"{a.trace}: trace is not valid; expected a finished trace.")


def _load_spec(path: str):
    from routecast.trace.spec import MoESpec

    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--spec {path!r} could not be read as JSON ({e}).") from None
    return MoESpec.from_dict(d, where=path)


@writes("--out", inputs=("--model", "--prompts"))
def cmd_capture(a: argparse.Namespace) -> int:
    from routecast.trace.capture import capture_to_disk

    path = capture_to_disk(
        a.model, a.prompts, a.out, max_new_tokens=a.max_new_tokens, batch_size=a.batch_size,
        hidden=a.hidden, logits=a.logits, threads=a.threads, resume=not a.no_resume, progress=not a.quiet,
        overwrite=a.overwrite, device=a.device,
    )
    print(f"wrote {path}")
    return 0


@writes("--out")
def cmd_calibrate(a: argparse.Namespace) -> int:
    from routecast.common.outputs import check_out_file
    from routecast.sim.calibrate import calibrate

    out = a.out or f"out/hardware/calibrated-{a.device.replace(':', '')}.toml"
    check_out_file(out, "--out")  # before minutes of measuring, not after
    hw = calibrate(out, device=a.device, threads=a.threads, quick=a.quick)
    print(f"wrote {out}: {hw.name}")
    return 0


@writes("--out", "--html", inputs=("--trace", "--hardware", "--model-profile", "--emoe-quality", "--predictor"))
def cmd_advise(a: argparse.Namespace) -> int:
    from routecast.advise.cli import advise_cli
    from routecast.report.advise import write_html

    return advise_cli(a, html_writer=write_html)


@writes("--out", inputs=("trace", "--model", "--train-extra", "--predictors"))
def cmd_predict(a: argparse.Namespace) -> int:
    from routecast.predict.evaluate import predict_eval_main, predict_fit_main

    if a.action == "eval":
        if a.out:  # eval prints (or --json); only fit saves a predictor
            raise ConfigError(f"--out {a.out} saves a fitted predictor; expected it with `predict fit`, not eval.")
        return predict_eval_main(
            a.trace, a.predictors, model=a.model, as_json=a.json, train_fraction=a.train_fraction, seed=a.seed,
            threads=a.threads, epochs=a.epochs, quiet=a.quiet, split=a.split, train_extra=a.train_extra,
            score_all=a.score_all)
    if a.split not in ("document", "request", "none"):
        raise ConfigError(f"--split is {a.split!r}; expected document, request or none for predict fit.")
    if not a.out or not a.predictor:
        raise ConfigError("predict fit needs --predictor NAME and --out DIR.")
    from routecast.common.outputs import check_out_dir

    check_out_dir(a.out, "--out", overwrite=a.overwrite)
    return predict_fit_main(
        a.trace, a.predictor, a.out, model=a.model, seed=a.seed, threads=a.threads, epochs=a.epochs, quiet=a.quiet,
        split=a.split, train_fraction=a.train_fraction, train_extra=a.train_extra,
    )


@writes("--out", inputs=("--trace", "--hardware", "--model-profile"))
def cmd_place_compare(a: argparse.Namespace) -> int:
    from routecast.place.compare_cli import compare_main
    from routecast.report.placement import plot_throughput

    _threads(a.threads)
    return compare_main(a, plot_throughput)


@writes("--out")
def cmd_train_builtin(a: argparse.Namespace) -> int:
    from routecast.models.train import main as train_main

    return train_main(a.args)


@writes("--out", inputs=("trace", "--model", "--predictor", "--hardware"))
def cmd_cache(a: argparse.Namespace) -> int:
    from routecast.cache.cli import cache_replay_main

    _threads(a.threads)
    return cache_replay_main(
        a.trace, out=a.out, as_json=a.json, budget=a.budget, policies=a.policies, predictor=a.predictor,
        hardware=a.hardware, dense_us=a.dense_us, plec_fallback=a.plec_fallback, plec_depth=a.plec_depth,
        expert_bytes=a.expert_bytes, model=a.model, train_fraction=a.train_fraction, seed=a.seed, split=a.split,
        threads=a.threads, quiet=a.quiet, score_all=a.score_all, reuse_probe=a.reuse_probe,
        probe_adapt=a.probe_adapt,
    )


@writes("--out", "--plan", inputs=("trace", "--model", "--predictor", "--hardware", "--score"))
def cmd_schedule(a: argparse.Namespace) -> int:
    if a.action == "cocluster":
        return cocluster_cli.cocluster_main(a)
    for flag, v in (("--plan", a.plan), ("--score", getattr(a, "score", None))):
        if v:  # cocluster's flags: rebatch would ignore them (and a --plan would silently not be written)
            raise ConfigError(f"{flag} {v} belongs to `schedule cocluster`; expected no {flag} with `schedule rebatch`.")
    from routecast.cache.cli import _clean
    from routecast.cache.replay import ReplayConfig, parse_budget, replay
    from routecast.common.outputs import check_out_file, write_json
    from routecast.schedule.rebatch import run_rebatch
    from routecast.sim.hardware import load_hardware
    from routecast.trace.io import read_trace
    _threads(a.threads)
    check_out_file(a.out, "--out")  # before the work, not after it
    s = (trace := read_trace(a.trace, load_hidden=False, load_logits=False)).spec
    eb = a.expert_bytes or s.expert_bytes
    cfg = ReplayConfig(budget=parse_budget(a.budget, s.num_layers * s.num_experts, eb),
                       hardware=load_hardware(a.hardware), expert_bytes=eb)
    res = run_rebatch(trace, predictor=a.predictor, model=a.model, seed=a.seed, split=a.split, min_tokens=a.min_tokens,
                      threads=a.threads, quiet=a.quiet, max_tokens=cocluster_cli.rebatch_max_tokens(a.max_tokens))
    rows = []
    for method, arm in res["arms"].items():
        r = next(x for x in replay(arm["trace"], [a.policy], cfg, pred_SLE=arm["pred_SLE"]) if x["policy"] == a.policy)
        rows.append({"method": method, "batches": arm["batches"], "activated_per_batch": arm["activated_mean"],
                     "activated_total": arm["activated_total"], "hit_ratio": r["hit_ratio"],
                     "us_per_token": r["us_per_token"], "stall_s": r["stall_s"]})
    speedup = rows[0]["us_per_token"] / rows[1]["us_per_token"]
    out = {"settings": {**res["settings"], "policy": a.policy, "budget_slots": cfg.budget, "hardware": a.hardware},
           "rows": rows, "speedup_clustered": speedup}
    write_json(a.out, _clean(out), "--out")
    if a.json:
        print(json.dumps(_clean(out), indent=1))
        return 0
    print(f"{res['settings']['test_tokens']} held-out tokens, paths from {a.predictor}; {a.policy} at {cfg.budget} slots on {a.hardware}"
          + "".join("\n" + note for note in res["settings"]["notes"]))
    print(f"{'method':<10} {'batches':>8} {'experts/batch':>14} {'eq.5 total':>11} {'hit':>6} {'µs/token':>9}")
    for r in rows:
        print(f"{r['method']:<10} {r['batches']:>8} {r['activated_per_batch']:>14.2f} {r['activated_total']:>11} "
              f"{r['hit_ratio']:>6.3f} {r['us_per_token']:>9.2f}")
    print(f"clustered vs arrival order: {speedup:.3f}x simulated time per token; wrote {a.out}")
    return 0


@writes("--out", "--sample-out")
def cmd_corpus(a: argparse.Namespace) -> int:
    from routecast.models.corpus import main as corpus_main

    return corpus_main(a.args)


# ------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    ap = N.Parser(
        prog="routecast",
        description="Predict Mixture-of-Experts routing and act on it (replication, offloading, scheduling).",
    )
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND", required=True)

    p = sub.add_parser("demo", help="run the main job end to end and write out/demo/report.html")
    p.add_argument("--out", default="out/demo", help="output directory (default out/demo)")
    p.add_argument(
        "--synthetic",
        metavar="PRESET",
        default=None,
        help="use a synthetic preset trace instead of capturing the built-in model",
    )
    p.add_argument("--model", choices=("builtin", "builtin-fine"), default="builtin",
                   help="built-in model to capture (default builtin: Mixtral, 8 experts; builtin-fine: DeepSeek-V3, 64)")
    p.add_argument("--requests", type=N.positive(4096), default=None,
                   help="number of requests to capture/generate (default: 80 builtin, 48 builtin-fine, 16 synthetic)")
    p.add_argument("--seed", type=N.seed(), default=0, help="random seed (default 0)")
    _add_threads(p)
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser("synth", help="generate a synthetic trace from a preset")
    p.add_argument("--preset", default=None, help="preset name, e.g. mixtral-8x7b, mixtral-8x7b:sst2, deepseek-v3")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tokens", type=N.count_by_memory(4096, what='tokens'), default=None, help="stop at the step where N tokens are reached")
    g.add_argument("--requests", type=N.count_by_memory(1 << 20, what='requests'), default=None, help="run N requests to completion")
    p.add_argument("--seed", type=N.seed(), default=0, help="random seed (default 0)")
    p.add_argument(
        "--set", action="append", metavar="KNOB=VALUE",
        help="override a SynthConfig field (repeatable; tuples comma-separated, inf allowed)",
    )
    p.add_argument("--out", default=None, help="output trace directory")
    p.add_argument("--calibrate", action="store_true", help="print each preset's paper statistic vs measured")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a trace routecast wrote at --out (or an unfinished one) once the new one is complete")
    p.set_defaults(fn=cmd_synth)

    p = sub.add_parser("stats", help="routing statistics of a trace (skewness, IR, entropy, predictability)")
    p.add_argument("trace", help="trace directory")
    p.add_argument("--ep", type=N.positive(4096), default=8, help="expert-parallel ranks for the imbalance ratio (default 8)")
    p.add_argument("--window", type=N.positive(1 << 30), default=None, help="steps per window for drift (default: auto)")
    p.add_argument(
        "--seq-len", type=N.positive(1 << 24), default=None, help="also report skewness per sequence of this many tokens (MoE-GPS: 512)"
    )
    p.add_argument("--json", action="store_true", help="print the statistics as JSON instead of a table")
    p.add_argument(
        "--plot", default=None, metavar="PNG", help="also write a 2x2 figure (load, IR over steps, transitions, popularity)"
    )
    p.set_defaults(fn=cmd_stats)

    p = sub.add_parser("import", help="import a JSON-lines routing log (e.g. from vLLM hooks) as a trace")
    p.add_argument("src", help="input .jsonl or .jsonl.gz, one record per token per layer")
    p.add_argument("--out", required=True, help="output trace directory")
    p.add_argument(
        "--map",
        action="append",
        metavar="THEIRS=OURS",
        help="map an input field name to a canonical one (request, layer, position, token_id, experts, "
        "weights, phase, step, task, arrival_s); repeatable",
    )
    p.add_argument("--num-experts", type=N.integer(1, 32768, why='int16 expert ids'), default=None, help="experts per layer (default: max id + 1)")
    p.add_argument("--top-k", type=N.positive(1024), default=None, help="experts per token (default: from the data)")
    p.add_argument("--spec", default=None, metavar="JSON", help="a MoESpec as JSON (fixes layers, experts, top-k)")
    p.add_argument(
        "--window", type=N.count_by_memory(256, what='records'), default=1 << 20, help="records within which all of a token's layer records appear"
    )
    p.add_argument("--shard-tokens", type=N.positive(1 << 24), default=65536, help="tokens per safetensors shard (default 65536)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out once the import completes")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_import)

    p = sub.add_parser("inspect", help="print a trace's spec, provenance, counts and validation status")
    p.add_argument("trace", help="trace directory")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(fn=cmd_inspect)

    p = sub.add_parser("capture", help="capture routing from a Hugging Face MoE model (prefill + every decode step)")
    p.add_argument("--model", default="builtin",
                   help="checkpoint directory, 'builtin' (default: Mixtral, 8 experts) or 'builtin-fine' (DeepSeek-V3, 64)")
    p.add_argument(
        "--prompts", required=True, help="prompts .jsonl ({prompt, task?, max_new_tokens?, arrival_s?}) or corpus:NAME[:N]"
    )
    p.add_argument("--max-new-tokens", type=N.positive(1 << 20), default=32, help="decode steps per request (default 32)")
    p.add_argument("--batch-size", type=N.positive(4096), default=8, help="requests per generate() batch (default 8)")
    p.add_argument("--out", required=True, help="output trace directory")
    p.add_argument("--hidden", action="store_true", help="also record each MoE layer's router input (hidden_TLH)")
    p.add_argument("--logits", action="store_true", help="also record router logits (logits_TLE)")
    p.add_argument("--no-resume", action="store_true", help="refuse to continue an interrupted capture at --out")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a trace routecast wrote at --out once the new capture is complete")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]: where the model runs")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_threads(p)
    p.set_defaults(fn=cmd_capture)

    p = sub.add_parser("calibrate", help="measure this machine (expert call floor, weight-read bandwidth, activation work, GEMM efficiency, peak) into a hardware TOML")
    p.add_argument("--out", default=None, help="output TOML (default out/hardware/calibrated-<device>.toml)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (< 20 s)")
    _add_threads(p)
    p.set_defaults(fn=cmd_calibrate)

    from routecast.advise.cli import add_parser as add_advise_parser  # light: argparse only

    add_advise_parser(sub)
    sub.choices["advise"].set_defaults(fn=cmd_advise)

    p = sub.add_parser("predict", help="evaluate (eval) or fit and save (fit) routing predictors on a trace")
    p.add_argument("action", choices=("eval", "fit"), help="eval: score predictors causally; fit: train and save one")
    p.add_argument("trace", help="trace directory")
    p.add_argument("--predictors", default="distribution,probability,conditional-token,conditional-position,ffn,lstm",
                   help="eval: comma list of names (also: lookahead, needs --hidden --logits traces) or saved predictor dirs")
    p.add_argument("--score-all", action="store_true", help="eval: score saved predictors from another trace on all rows")
    p.add_argument("--predictor", default=None, help="fit: the predictor name to train")
    p.add_argument("--out", default=None, help="fit: output directory (safetensors + json)")
    p.add_argument("--model", default=None, help="checkpoint for input embeddings: DIR, builtin, builtin-fine or none")
    p.add_argument("--split", default="document",
                   help="held-out split: document (default; requests from one source document stay on one side; "
                        "falls back to request, with a note, on traces that record no documents), request, or "
                        "for fit: none (fit on the whole trace)")
    p.add_argument("--train-fraction", type=N.fraction(hi_open=True), default=0.8,
                   help="share of documents (or requests) to fit on (default 0.8)")
    p.add_argument("--epochs", type=N.positive(10000), default=None, help="training epochs for ffn/lstm (default: preset)")
    p.add_argument("--train-extra", default=None, help="eval (one DIR), fit (DIR[,DIR...]): traces of the same model "
                   "on documents disjoint from the held-out ones (e.g. corpus:train), added to every predictor's training")
    p.add_argument("--seed", type=N.seed(), default=0, help="random seed (default 0)")
    p.add_argument("--json", action="store_true", help="eval: print JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_threads(p)
    p.set_defaults(fn=cmd_predict)

    p = sub.add_parser("place", help="expert placement: compare static EP, EPLB and PROBE on a trace")
    p.add_argument("action", choices=("compare", "export"), help="compare: per-step IR and simulated latency per "
                   "method; export: a plan as SGLang JSON (see `routecast place export --help`)")
    p.add_argument("--trace", required=True, help="trace directory")
    p.add_argument("--ep", type=N.positive(4096), default=8, help="expert-parallel ranks (default 8)")
    p.add_argument("--hardware", default="h100-sxm", help="hardware profile (default h100-sxm)")
    p.add_argument("--model-profile", default=None, help="model profile for the cost model (default: by trace)")
    p.add_argument("--shift-step", type=N.integer(-1, 1 << 40), default=-1, help="report before/after this step (default: no shift)")
    p.add_argument("--out", default="out/place", help="output directory for the plot and JSON (default out/place)")
    p.add_argument("--json", action="store_true", help="print JSON")
    _add_threads(p)
    p.set_defaults(fn=cmd_place_compare)

    p = sub.add_parser("cache", help="expert caching: replay a trace through cache/prefetch policies")
    p.add_argument("action", choices=("replay",), help="replay: hit ratio, bytes moved, stall, gap to Belady per policy")
    p.add_argument("trace", help="trace directory")
    p.add_argument("--budget", type=N.budget_text(), default="50%", help="device expert slots: '50%%' of all L*E, a count '96', or bytes '12GB'")
    p.add_argument("--policies", default="lru,lfu,lfuda,arc,s3fifo,lirs,plec-correct,fc-evict,belady",
                   help="comma-separated: lru, lfu, lfuda, lru-layer, semoe, plec*, belady, arc, s3fifo, lirs, fc-evict, NAME+admit")
    p.add_argument("--score-all", action="store_true", help="score a --predictor folder from another trace on all rows")
    p.add_argument("--predictor", default=None,
                   help="forecast for plec: a predictor name, a saved predictor folder, or 'oracle' (default conditional-token)")
    p.add_argument("--dense-us", type=N.real(0.0, 1e9), default=0.0, help="non-expert time per layer before the router, µs (default 0)")
    p.add_argument("--plec-fallback", choices=("lfu", "lru"), default="lfu",
                   help="how PLEC ranks experts with no predicted use left in the step (default lfu)")
    p.add_argument("--plec-depth", type=N.positive(1024), default=1, help="layers ahead PLEC prefetches (default 1)")
    p.add_argument("--train-fraction", type=N.fraction(hi_open=True), default=0.8, help="share of requests the predictor is fitted on")
    p.add_argument("--reuse-probe", action="store_true",
                   help="fc-evict also reads a probe of the router inputs fitted on the same rows (a trace with hidden states)")
    p.add_argument("--probe-adapt", type=N.real(0.0, 1e6), default=None, metavar="W",
                   help="with --reuse-probe: a replayed row joins the probe's fit with weight W once its distances "
                        "are all seen (default 16; 0 = the probe stays as fitted)")
    _add_replay_flags(p, "out/cache/replay.json")
    p.set_defaults(fn=cmd_cache)

    p = sub.add_parser("schedule", help="token scheduling: ExpertFlow re-batching; s-MoE token-expert co-clustering")
    p.add_argument("action", choices=("rebatch", "cocluster"),
                   help="rebatch: arrival-order vs path-clustered half-batches; cocluster: s-MoE token-expert co-clustering")
    p.add_argument("trace", help="trace directory")
    p.add_argument("--predictor", default="conditional-token",
                   help="paths from a predictor name, a saved predictor folder, or 'oracle' (default conditional-token)")
    p.add_argument("--budget", type=N.budget_text(), default="50%", help="cache budget for pricing the batches ('50%%', a count, or bytes)")
    p.add_argument("--policy", default="plec-correct", help="cache policy that prices the batches (default plec-correct)")
    p.add_argument("--min-tokens", type=N.nonneg(1 << 30), default=4, help="decode steps with fewer tokens stay one batch (default 4)")
    _add_replay_flags(p, "out/schedule/rebatch.json")
    cocluster_cli.add_cocluster_flags(p)
    p.set_defaults(fn=cmd_schedule)
    cocluster_cli.add_permute_parser(sub)

    from routecast.runtime.emoe.cli import add_parser as add_emoe_parser  # light: argparse only

    add_emoe_parser(sub)
    add_ep_parser(sub)  # routecast/runtime/ep/cli.py

    from routecast.runtime.cli import add_parser as add_run_parser

    add_run_parser(sub)

    p = sub.add_parser(
        "train-builtin", add_help=False, help="train the built-in MoE model (see `routecast train-builtin --help`)"
    )
    p.add_argument("args", nargs=argparse.REMAINDER,
                   help="--out DIR [--overwrite] [--minutes 40] [--steps N] [--seed 0] [--corpus DIR]")
    p.set_defaults(fn=cmd_train_builtin)

    p = sub.add_parser("corpus", add_help=False, help="build the multi-domain corpus (see `routecast corpus build --help`)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="build --out DIR --gensim-wheel WHL [--sample-out DIR] ...")
    p.set_defaults(fn=cmd_corpus)

    from routecast.serve.cli import add_parser as add_serve_sim  # parser + handler live in serve/
    add_serve_sim(sub)
    return N.annotate_help(add_overwrite_flags(ap))


NAME_RESOLVERS.append("routecast.sim.hardware:named_file")  # built-in model and shipped profile names
_FORWARDED = {"train-builtin": cmd_train_builtin, "corpus": cmd_corpus}


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    bad = next((i for i, x in enumerate(argv) if "\0" in str(x)), None)
    if bad is not None:  # no shell passes one; a caller of main() can, and no path or name may hold it
        print(f"routecast: error: argument {bad + 1} ({str(argv[bad])[:40]!r}) holds a NUL byte; expected text "
              "without one.", file=sys.stderr)
        return 2
    if argv[:2] == ["place", "export"]:  # routecast/place/export_cli.py owns its flags
        a = argparse.Namespace(cmd="place export", fn=run_export, args=argv[2:])
    elif argv and argv[0] in _FORWARDED:
        # These commands own their flags; forward everything after the name (argparse.REMAINDER drops --help).
        a = argparse.Namespace(cmd=argv[0], fn=_FORWARDED[argv[0]], args=argv[1:])
    else:
        try:
            a = ap.parse_args(argv)
        except N.UsageError as e:  # one sentence, like every other refusal (not argparse's usage block)
            print(f"{e.prog}: error: {e}", file=sys.stderr)
            return 2
    try:
        return int(a.fn(a) or 0)
    except RoutecastError as e:
        print(f"routecast {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"routecast {a.cmd}: error: file not found: {Path(e.filename or '?')}.", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a read-only place, a vanished directory met after the up-front checks
        where = " and ".join(str(f) for f in (e.filename, e.filename2) if f) or "a file"
        print(f"routecast {a.cmd}: error: {where}: {e.strerror or e}; expected readable inputs and writable "
              "outputs with free space.", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"routecast {a.cmd}: error: the input needs more memory than this machine has; expected sizes "
              "that fit (check the numbers of experts, tokens and requests).", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        how = {"capture": "completed shards are kept and the same command resumes",
               "synth": "rerun it with --overwrite to redo it (it is seeded)",
               "import": "rerun it with --overwrite to redo it"}.get(a.cmd, "outputs already written are kept")
        print(f"routecast {a.cmd}: interrupted; {how}.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
