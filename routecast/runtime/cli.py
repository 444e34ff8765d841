"""`routecast run`: greedy generation, all-resident or offloaded (--offload), with the run's figures.

    routecast run --model builtin-fine --offload --budget 50% --prefetch lookahead --prompts corpus:val:8

prints each request's generated text, then tokens/s, hit ratio, bytes loaded, stall share, the slow tier's read
mode (o_direct / fadvise), the prefetcher's counters and its share of the run; --out writes the generations as
JSONL (one line per request), --figures the figures as JSON; --policy picks the slots' replacement policy. --write-profile measures the slow tier's read
bandwidth and writes a hardware profile (a base profile with h2d_gbps = the measured figure) that
`routecast cache replay --hardware PROFILE` prices misses with.

    routecast run --offload --policy fc-evict --reuse-probe --fit-trace out/traces/fine

--reuse-probe has fc-evict also read the reuse probe (predict/reuse_probe.py) of each step's router inputs, fitted on
--fit-trace (a capture of the model with --hidden); its time is counted with fc-evict's forecasts. --token-table has
fc-evict also forecast each step from its input tokens (the prompt at a prefill, the last sampled token after) with a
token-id table fitted on --fit-trace, or on the built-in model's standard trace.

    routecast run --offload --geometry mixtral-8x7b --policy fc-evict --budget 50%

--geometry NAME runs the I/O-bound regime instead of the model (runtime/offload/geometry_run.py): MoE layers of that
production expert geometry with random bf16 weights on disk, driven by the routing of a captured trace (--routing,
default the standard 'fine' trace), the policy against --baseline (default lru), each beside the replay's prediction.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from routecast.common import numbers as N
from routecast.common.errors import ConfigError
from routecast.common.outputs import writes


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="generate with the model, optionally with experts offloaded to disk (--offload)")
    p.add_argument("--model", default="builtin-fine", help="builtin, builtin-fine or a Hugging Face MoE model folder")
    p.add_argument("--prompts", default="corpus:val:8", help="JSONL prompts file or corpus:SPLIT[:N] (default corpus:val:8)")
    p.add_argument("--max-new-tokens", type=N.positive(1 << 20), default=32, help="new tokens per request (default 32)")
    p.add_argument("--offload", action="store_true", help="keep at most --budget experts in memory, the rest on disk")
    p.add_argument("--budget", type=N.budget_text(), default="50%", help="fast-tier expert slots: '50%%' of all L*E, a count '96', or bytes '12MB'")
    p.add_argument("--prefetch", default="none", help="predictor driving prefetch: none, lookahead, expertflow or ffn")
    p.add_argument("--predictor", default=None, help="a saved predictor folder (`routecast predict fit`) for --prefetch")
    p.add_argument("--fit-trace", default=None, help="fit the --prefetch predictor (and --reuse-probe) on this trace of "
                   "the model")
    p.add_argument("--per-layer", action="store_true", help="split the slots evenly per layer (default one pool)")
    p.add_argument("--no-direct", action="store_true", help="read with posix_fadvise(DONTNEED) instead of O_DIRECT")
    p.add_argument("--loader-threads", type=N.loader_threads(), default=2,
                   help="background readers: reader processes, or threads with --reader threads (default 2)")
    p.add_argument("--reader", choices=("auto", "process", "threads"), default="auto",
                   help="who reads the experts from disk: child processes writing into shared slots (no GIL shared "
                        "with the forward), threads of this process, or auto (default: processes where they run, Linux)")
    p.add_argument("--prefetch-depth", type=N.positive(1024), default=1,
                   help="a forecast expert takes its slot and is read at most this many layers ahead (default 1)")
    p.add_argument("--prefetch-top", type=N.nonneg(1024), default=0,
                   help="confidence gate: each token prefetches only its N most likely experts (default 0 = top-k)")
    p.add_argument("--lookahead-first", type=N.integer(-1, 1024), default=-1,
                   help="--prefetch lookahead: experts per token forecast for the first MoE layer from its decoder "
                        "layer's input (-1, the default: half the top-k where a layer runs before it, none where its "
                        "input is the token embeddings; 0 = none)")
    p.add_argument("--prefetch-min-prob", type=N.real(0.0, 1.0), default=0.0,
                   help="confidence gate: prefetch only experts forecast with at least this probability (default 0)")
    p.add_argument("--fallback", action="store_true",
                   help="eMoE fallback: a token routed to an expert without a slot uses the best held expert instead of "
                        "loading it (once the pool is full); also runs all-resident and prints the greedy-token agreement")
    p.add_argument("--write-profile", default=None, help="measure the disk tier and write a hardware profile TOML here")
    p.add_argument("--hardware", default=None, help="base profile for --write-profile (e.g. out/hardware/calibrated-cpu.toml)")
    p.add_argument("--policy", default="lru", help="slot replacement policy: lru, lfu, arc, s3fifo, lirs or fc-evict "
                   "(cache/zoo.py, the replay's objects; default lru)")
    p.add_argument("--token-table", action="store_true",
                   help="--policy fc-evict also forecasts each step from its input tokens with a token-id table fitted on "
                   "--fit-trace (default: the built-in model's standard trace, captured into out/traces on first use); "
                   "off by default: on builtin-fine one user at a time it saved under 5%% of the reads and cost more "
                   "forecast time than they took")
    p.add_argument("--out", default=None, help="write the generations as JSONL here (one line per request: prompt, text, ids)")
    p.add_argument("--figures", default=None, help="write the run's figures as JSON here")
    p.add_argument("--batch-size", type=N.positive(4096), default=1,
                   help="requests generated together, left-padded (default 1); offloaded = the all-resident batch's tokens")
    p.add_argument("--threads", type=N.threads(), default=1, help="torch threads (default 1)")
    p.add_argument("--seed", type=N.seed(), default=0, help="seed for fitting a predictor (default 0)")
    g = p.add_argument_group("I/O-bound geometry (--offload --geometry NAME; --model and --prompts are not used)")
    g.add_argument("--geometry", default=None, help="deepseek-v2-lite or mixtral-8x7b: MoE layers of that expert geometry, "
                   "random bf16 weights on disk, the routing of --routing")
    g.add_argument("--routing", default=None, help="captured trace whose decode routing drives the layers (default the "
                   "standard 'fine' trace, captured into out/traces on first use)")
    g.add_argument("--geometry-layers", type=N.positive(1024), default=None,
                   help="MoE layers written (default 4; mixtral-8x7b 2: 4.4 / 5.6 GB)")
    g.add_argument("--geometry-tokens", type=N.positive(1 << 20), default=None, help="decode tokens timed (default 24)")
    g.add_argument("--geometry-warmup", type=N.nonneg(1 << 20), default=None,
                   help="decode tokens run untimed first, to warm the fast tier (default 16)")
    g.add_argument("--geometry-order", default=None, help="decode tokens in the trace's serving order (step: one token "
                   "of each request in flight in turn) or one request after the other (request)")
    g.add_argument("--baseline", default=None, help="policy run after --policy for the ratio (default lru; none = skip)")
    g.add_argument("--geometry-device", default=None, help="cuda (or cuda:N): every expert in pinned host memory, "
                   "misses copied to GPU slots on a CUDA stream of their own, experts computed on the GPU (no weights "
                   "file); default: the weights file on disk, experts computed on the CPU")
    g.add_argument("--weights-dir", default=None, help="where the random weights are written once (default out/geometry)")
    g.add_argument("--geometry-kernel", default=None, help="a CPU run's expert compute: numba (default: a bf16 loop, "
                   "runtime/offload/expert_kernel.py) or torch (bf16 matmul, 1.2-2.2x slower: benchmarks/expert_kernel.py)")
    g.add_argument("--reuse-probe", action="store_true",
                   help="--policy fc-evict also reads the reuse probe of the router inputs: fitted on --fit-trace (a model "
                   "run) or on the --routing trace's documents not driven (a --geometry run)")
    p.set_defaults(fn=cmd_run)


@writes("--out", "--figures", "--write-profile",
        inputs=("--model", "--prompts", "--predictor", "--fit-trace", "--hardware", "--routing"))
def cmd_run(a: argparse.Namespace) -> int:
    from routecast.runtime.offload.engine import PREFETCHERS

    if a.geometry is not None:
        return cmd_geometry(a)
    given = [f"--{k.replace('_', '-')}" for k in GEOMETRY_ONLY if getattr(a, k) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} {'acts' if len(given) == 1 else 'act'} on a --geometry run; expected "
                          "--offload --geometry NAME with it.")
    if a.prefetch not in PREFETCHERS:
        raise ConfigError(f"--prefetch is {a.prefetch!r}; expected one of {', '.join(PREFETCHERS)}.")
    if a.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens is {a.max_new_tokens}; expected at least 1.")
    if a.threads < 1 or a.loader_threads < 1 or a.prefetch_depth < 1 or a.batch_size < 1:
        raise ConfigError(f"--threads {a.threads} / --loader-threads {a.loader_threads} / --prefetch-depth "
                          f"{a.prefetch_depth} / --batch-size {a.batch_size}; expected at least 1 each.")
    if not a.offload and (a.prefetch != "none" or a.write_profile or a.fallback or a.reuse_probe):
        raise ConfigError("--prefetch, --fallback, --reuse-probe and --write-profile act on offloaded experts; expected "
                          "--offload with them.")
    from routecast.cache.zoo import is_fc_evict

    if a.token_table and not is_fc_evict(a.policy):
        raise ConfigError(f"--token-table acts on fc-evict's forecasts; --policy is {a.policy!r}: expected --policy "
                          "fc-evict with it.")
    if a.reuse_probe:
        from routecast.cache.zoo import check_reuse_policy

        check_reuse_policy(a.policy)
    if a.reuse_probe and not a.fit_trace:
        raise ConfigError("--reuse-probe is fitted on a trace of the model with router inputs; expected --fit-trace TRACE "
                          "(a capture with --hidden).")
    if a.write_profile and not a.hardware:
        raise ConfigError("--write-profile needs --hardware BASE.toml (e.g. from `routecast calibrate`) to take the compute figures from.")
    from routecast.common.outputs import check_out_file

    for flag, path in (("--out", a.out), ("--figures", a.figures), ("--write-profile", a.write_profile)):
        if path:
            check_out_file(path, flag)
    res = run_main(a)
    for g in res["generations"]:
        print(f"[{g['request']}] {g['prompt']!r} -> {g['text']!r}")
    print(format_figures(res))
    from routecast.common.outputs import write_atomic

    if a.out:
        write_atomic(a.out, "".join(json.dumps(g) + "\n" for g in res["generations"]), "--out")
        print(f"wrote {a.out}")
    if a.figures:
        write_atomic(a.figures, json.dumps({k: v for k, v in res.items() if k not in SKIP}, indent=1, default=float),
                     "--figures")
        print(f"wrote {a.figures}")
    return 0


SKIP = ("tokens", "log", "pred_sets", "logits", "generations", "uses", "reuse_steps", "next_uses")
GEOMETRY_ONLY = ("routing", "geometry_layers", "geometry_tokens", "geometry_warmup", "geometry_order", "baseline",
                 "weights_dir", "geometry_device", "geometry_kernel")


def cmd_geometry(a: argparse.Namespace) -> int:
    """`routecast run --offload --geometry NAME` (geometry_run.py)."""
    from routecast.common.outputs import check_out_file, write_atomic

    if not a.offload:
        raise ConfigError("--geometry runs offloaded expert layers; expected --offload with it.")
    bad = [f for f, on in (("--out", a.out), ("--fallback", a.fallback), ("--write-profile", a.write_profile),
                           ("--per-layer", a.per_layer), ("--predictor", a.predictor), ("--fit-trace", a.fit_trace),
                           ("--token-table", a.token_table),
                           ("--batch-size", a.batch_size != 1), ("--prefetch-depth", a.prefetch_depth != 1),
                           ("--prefetch-min-prob", a.prefetch_min_prob),
                           ("--lookahead-first", a.lookahead_first != -1), ("--reader", a.reader != "auto")) if on]
    if bad:
        raise ConfigError(f"{', '.join(bad)} {'acts' if len(bad) == 1 else 'act'} on a model run; a --geometry run takes --budget, --policy, --baseline, "
                          "--prefetch none|lookahead, --prefetch-top, --loader-threads, --no-direct, --routing and --figures.")
    disk = [f for f, on in (("--weights-dir", a.weights_dir), ("--no-direct", a.no_direct),
                            ("--geometry-kernel", a.geometry_kernel)) if on]
    if a.geometry_device is not None and disk:
        raise ConfigError(f"{', '.join(disk)} {'acts' if len(disk) == 1 else 'act'} on the weights file on disk; "
                          "--geometry-device keeps every expert in host memory: expected one or the other.")
    if a.figures:
        check_out_file(a.figures, "--figures")
    from routecast.runtime.offload.geometry_run import format_geometry, geometry_main

    def given(x, default):
        return default if x is None else x

    res = geometry_main(a.geometry, routing=a.routing, layers=a.geometry_layers, tokens=given(a.geometry_tokens, 24),
                        warmup=given(a.geometry_warmup, 16), budget=a.budget, policy=a.policy, prefetch=a.prefetch,
                        baseline=given(a.baseline, "lru"), loader_threads=a.loader_threads, direct=not a.no_direct,
                        weights_dir=given(a.weights_dir, "out/geometry"), order=given(a.geometry_order, "step"),
                        reuse_probe=bool(a.reuse_probe), device=a.geometry_device, prefetch_top=a.prefetch_top,
                        kernel=given(a.geometry_kernel, "numba"))
    print(format_geometry(res))
    if a.figures:
        write_atomic(a.figures, json.dumps(res, indent=1, default=float), "--figures")
        print(f"wrote {a.figures}")
    return 0


def run_main(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from routecast.cache.replay import parse_budget
    from routecast.runtime.offload.run import (
        check_prefetch_top,
        generations,
        load_run,
        make_predictor,
        run_config,
        write_profile,
    )
    from routecast.runtime.offload.store import check_runtime_policy

    torch.set_num_threads(a.threads)
    check_runtime_policy(a.policy)  # an unknown name is refused before the model loads
    model, tok, spec, requests = load_run(a.model, a.prompts, a.max_new_tokens, experts=not a.offload)
    ctx = getattr(model.config, "max_position_embeddings", None)
    if ctx and requests:  # generation past the model's positions never ends well: refuse before it starts
        longest = max(requests, key=lambda r: len(r[0]) + r[1])
        N.check_max_new_tokens(longest[1], int(ctx), len(longest[0]))
    if not a.offload:
        res = run_config(a.model, requests, budget=None, progress=True, threads=a.threads, batch_size=a.batch_size)
        return {**res, "generations": generations(tok, requests, res["tokens"])}
    check_prefetch_top(a.prefetch_top, spec.top_k)
    budget = parse_budget(a.budget, spec.num_layers * spec.num_experts, spec.expert_bytes)
    pred = make_predictor(a.prefetch, model, a.model, predictor_dir=a.predictor, fit_trace=a.fit_trace, seed=a.seed,
                          threads=a.threads)
    del model
    probe = None
    if a.reuse_probe:
        from routecast.predict.reuse_probe import fit_reuse_probe
        from routecast.trace.io import read_trace

        probe = fit_reuse_probe(read_trace(a.fit_trace, load_logits=False))
    table = None
    if a.token_table:
        from routecast.runtime.offload.run import token_table_for

        table = token_table_for(a.model, a.fit_trace)
        if table is None:
            raise ConfigError(f"--token-table: {a.model} has no standard trace to fit it on; expected --fit-trace "
                              "TRACE (a capture of the model).")
    kw = dict(per_layer=a.per_layer, direct=not a.no_direct, loader_threads=a.loader_threads, depth=a.prefetch_depth,
              fallback=a.fallback, prefetch_top=a.prefetch_top, prefetch_min_prob=a.prefetch_min_prob, policy=a.policy,
              reader=a.reader, lookahead_first=a.lookahead_first)
    res = run_config(a.model, requests, budget=budget, prefetch=a.prefetch, predictor=pred, cfg_kw=kw,
                     progress=True, threads=a.threads, batch_size=a.batch_size, reuse_probe=probe, token_table=table)
    if a.fallback:
        from routecast.runtime.offload.fallback import token_agreement

        ref = run_config(a.model, requests, budget=None, progress=True, threads=a.threads, batch_size=a.batch_size)
        res["agreement"] = token_agreement(ref["tokens"], res["tokens"])
    if a.write_profile:
        res["profile"] = write_profile(a.model, a.write_profile, a.hardware, direct=not a.no_direct)
    res["generations"] = generations(tok, requests, res["tokens"])
    return res


def format_figures(r: dict[str, Any]) -> str:
    """The run's figures as a few lines of text."""
    lines = [f"{r['config']}: {r['new_tokens']} new tokens ({r['prompt_tokens']} prompt tokens) in {r['wall_s']:.2f} s "
             f"= {r['tokens_per_s']:.2f} tokens/s"]
    if r["config"] != "all-resident":
        lines.append(f"policy {r['policy']}, budget {r['budget']} of {r['experts_total']} experts; hit ratio {r['hit_ratio']:.3f} "
                     f"(hits {r['hits']} of which late prefetches {r['late']}, misses {r['misses']}; on time "
                     f"{r['on_time_hit_ratio']:.3f}); "
                     f"bytes loaded {r['bytes_read'] / 1e6:.1f} MB in {r['reads']} {r['tier_mode']} reads; "
                     f"stall share {r['stall_share']:.1%}")
        if r["config"] != "none":
            lines.append(f"prefetch: issued {r['prefetch_issued']}, loaded {r['prefetch_loaded']}, useful "
                         f"{r['prefetch_useful']}, cancelled {r['prefetch_cancelled']}, dropped {r['prefetch_dropped']}, "
                         f"mispredicted evicted first {r['mispredicted']}; predictor {r['predict_s']:.3f} s = "
                         f"{r['predict_s'] / r['wall_s']:.1%} of the run (with handing its sets to the store "
                         f"{r['issue_s'] / r['wall_s']:.1%})")
    from routecast.cache.zoo import is_fc_evict

    if r["config"] == "none" and is_fc_evict(r.get("policy") or ""):
        used = ["request profiles"] + [n for k, n in (("token_table", "token table"), ("reuse_probe", "reuse probe"))
                                       if r.get(k)]
        lines.append(f"{r['policy']}'s forecasts ({', '.join(used)}): "
                     f"{r['predict_s']:.3f} s = {r['predict_s'] / r['wall_s']:.1%} of the run")
    if "rerouted" in r:
        lines.append(f"fallback: rerouted {r['rerouted']} of {r['routed_slots']} routed (token, k) slots "
                     f"({r['rerouted_share']:.1%}); greedy-token agreement with all-resident {r['agreement']:.3f}")
    if "profile" in r:
        p = r["profile"]
        lines.append(f"slow tier ({p['mode']}): {p['bandwidth_Bps'] / 1e9:.3f} GB/s per expert read "
                     f"(median {p['median_read_s'] * 1e6:.0f} us for {p['expert_bytes']} B); wrote {p['path']}")
    return "\n".join(lines)
