"""`routecast ep run | calibrate`: expert parallelism on torch.distributed (gloo on CPU) from the command line."""

from __future__ import annotations

import argparse
import json

from routecast.common import numbers as N
from routecast.common.outputs import writes
from routecast.place.slots import METHODS


@writes("--out", inputs=("--model", "--trace", "--token-ranks", "--shuffle-plan", "--link"))
def cmd_ep(a: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(a.threads)
    if a.action == "calibrate":
        from routecast.common.outputs import check_out_file
        from routecast.runtime.ep.calibrate import calibrate_link

        out = check_out_file(a.out or f"out/ep/gloo-cpu-ep{a.nproc}.toml", "--out")
        prof, pts = calibrate_link(out, nproc=a.nproc, repeats=a.repeats, host=a.master_addr)
        for p in pts:
            print(f"{p['volume']:>9d} B  {p['seconds'] * 1e6:9.1f} us  (p10 {p['p10'] * 1e6:.1f}, p90 {p['p90'] * 1e6:.1f})")
        print(f"alpha {prof.alpha * 1e6:.1f} us, bandwidth {prof.bandwidth / 1e9:.3f} GB/s per direction -> {out}")
        return 0
    from routecast.common.errors import ConfigError
    from routecast.runtime.ep.run import format_table, run_plans, shuffle_line

    if not a.trace:
        raise ConfigError("--trace is missing; expected a trace folder captured with --hidden (routecast capture).")
    if a.action == "forward":
        from routecast.common.outputs import check_out_dir
        from routecast.runtime.ep.forward import run_forward

        out = check_out_dir(a.out or "out/ep-forward", "--out", overwrite=a.overwrite)
        for plan in [p for p in a.plans.split(",") if p]:
            r = run_forward(model=a.model, trace_dir=a.trace, out=out / plan, nproc=a.nproc, method=plan,
                            requests=a.requests, tokens=a.tokens, redundant_per_rank=a.redundant, timeout_s=a.timeout,
                            host=a.master_addr)
            print(json.dumps(r) if a.json else
                  f"{plan}: EP {r['nproc']} whole-model forward of {r['sequences']} x {r['tokens']} tokens: logits "
                  f"allclose {r['allclose']} (max abs err {r['logits_max_abs_err']:.1e}), bytes == sim {r['bytes_equal']} "
                  f"({r['cells_checked']} rank-layers), a2a {r['a2a_bytes'] / 1e6:.2f} MB, expert weights held per rank "
                  f"{max(r['held_bytes_per_rank']) / 1e6:.1f} MB")
        return 0

    res = run_plans(model=a.model, trace_dir=a.trace, out=a.out or "out/ep", nproc=a.nproc,
                    plans=[p for p in a.plans.split(",") if p], steps=a.steps, first_step=a.first_step,
                    min_tokens=a.min_tokens, repeats=a.repeats, link=a.link, check=not a.no_check, timeout_s=a.timeout,
                    threads=a.threads, redundant_per_rank=a.redundant, overwrite=a.overwrite,
                    token_ranks_path=a.token_ranks, shuffle_plan=a.shuffle_plan, quiet=True, host=a.master_addr)
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    st = res["settings"]
    print(f"EP {st['nproc']} (gloo): {len(st['steps'])} steps, {st['tokens']} tokens, {st['repeats']} repeats, "
          f"link {st['link']}")
    print(format_table(res))
    if "shuffle" in res["plans"]:
        print(shuffle_line(res))
    print(f"ranks started per plan (one process group, rendezvous on {st['master_addr']}): {st['ranks']}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `ep` subcommand (routecast/cli.py calls this)."""
    p = sub.add_parser("ep", help="expert parallelism: run a trace's MoE layers on G ranks (one process group) under each plan")
    p.add_argument("action", choices=("run", "forward", "calibrate"),
                   help="run: replay trace steps through the real MoE layers per plan; forward: the whole model with "
                        "EP MoE layers and its own router on the trace's prompts, logits vs one process; calibrate: "
                        "measure the gloo all-to-all and fit alpha + V / B")
    p.add_argument("--nproc", type=N.nproc(), default=2, help="ranks, one process each (default 2)")
    p.add_argument("--model", default="builtin-fine", help="checkpoint folder or built-in name (default builtin-fine)")
    p.add_argument("--trace", default=None, help="run: trace captured from --model with --hidden")
    p.add_argument("--plans", default=",".join(m for m in METHODS),
                   help=f"run: comma-separated plans among {', '.join(METHODS)} (default all)")
    p.add_argument("--requests", type=N.positive(4096), default=8, help="forward: sequences (default 8)")
    p.add_argument("--tokens", type=N.positive(1 << 16), default=32, help="forward: prompt tokens per sequence (default 32)")
    p.add_argument("--steps", type=N.positive(1 << 20), default=8, help="run: trace steps to replay (default 8)")
    p.add_argument("--first-step", type=N.nonneg(1 << 40), default=0, help="run: index of the first replayed step (default 0)")
    p.add_argument("--min-tokens", type=N.nonneg(1 << 30), default=0, help="run: skip steps with fewer tokens (default 0)")
    p.add_argument("--repeats", type=N.positive(1000), default=3, help="times each step is replayed; times are medians (default 3)")
    p.add_argument("--redundant", type=N.nonneg(4096), default=1, help="run: EPLB / MoE-GPS redundant slots per rank (default 1)")
    p.add_argument("--link", default=None, help="run: link profile (name in routecast/sim/links or .toml) for the "
                                                 "predicted all-to-all time (default: none)")
    p.add_argument("--token-ranks", default=None, help="run: .npy with the rank of every trace row (a token shuffle); "
                                                       "default: each step's rows in --nproc contiguous blocks")
    p.add_argument("--shuffle-plan", default=None,
                   help="run: plan file from `routecast schedule cocluster --ep NPROC` (use --respect-groups for a "
                        "grouped router); adds the plan 'shuffle': experts pre-grouped by its permutation, every "
                        "token on its cluster's rank per layer (Speculative MoE)")
    p.add_argument("--timeout", type=N.real(0.0, 86400.0, lo_open=True), default=20.0, help="collective timeout per rank, s (default 20)")
    p.add_argument("--no-check", action="store_true", help="run: skip the comparison with the single-process model")
    p.add_argument("--out", default=None, help="output folder (run, default out/ep) or .toml (calibrate)")
    p.add_argument("--json", action="store_true", help="run: print JSON")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty --out (routecast's files only)")
    p.add_argument("--threads", type=N.threads(), default=1, help="torch CPU threads per rank (default 1)")
    p.add_argument("--master-addr", default="127.0.0.1",
                   help="address the ranks' rendezvous store and gloo listen on (default 127.0.0.1: this machine "
                        "only; another address exposes an unauthenticated port on that interface)")
    p.set_defaults(fn=cmd_ep)
