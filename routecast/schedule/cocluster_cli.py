"""CLI of s-MoE's co-clustering and expert pre-grouping: `routecast schedule cocluster`, `routecast permute-experts`.

Only argparse at import time (the `routecast` parser is built on every call); the work is imported lazily.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common import numbers as N
from routecast.common.outputs import writes

METHOD_HELP = ("auto (the best of smoe, metis, kmeans, hypergraph on a validation part of the training documents), "
               "smoe, metis, kmeans, hypergraph, random, sts (token shuffling only), none (plain EP)")
# Training tokens a plan is fitted on at most (a seeded sample of whole requests beyond): their routing is
# copied into memory, 243 MB at DeepSeek-V3 geometry (58 layers x top-8 int16), as predict fit's cap.
MAX_FIT_TOKENS = 262144
# Tokens `schedule rebatch` fits on and re-batches at most: it holds each held-out token's predicted and true
# paths (L x E booleans, 15 KB a token at DeepSeek-V3 geometry: 486 MB each at this cap).
MAX_REBATCH_TOKENS = 32768


def add_cocluster_flags(p: argparse.ArgumentParser) -> None:
    """Flags of `routecast schedule cocluster` (the `schedule` parser is shared with `rebatch`)."""
    p.add_argument("--ep", type=N.positive(4096), default=8, help="cocluster: EP ranks = co-clusters (default 8)")
    p.add_argument("--method", default="auto", help=f"cocluster: one of {METHOD_HELP} (default auto)")
    p.add_argument("--score", default=None, metavar="PLAN",
                   help="cocluster: score this saved plan on every token of the trace (LAR, all-to-all bytes, "
                        "imbalance) beside plain EP; fits nothing")
    p.add_argument("--plan", default=None, help="cocluster: plan file to write (default: next to --out, *-plan.json)")
    p.add_argument("--beta", type=N.real(1.0, 1e6), default=1.1, help="cocluster: token-load bound, x mean (the paper's 1.1)")
    p.add_argument("--rho", type=N.real(0.0, 1.0, lo_open=True), default=0.2, help="cocluster smoe: elite share per iteration (the paper's 0.2)")
    p.add_argument("--respect-groups", action="store_true",
                   help="cocluster: place whole router groups (needed to permute a grouped-router checkpoint)")
    p.add_argument("--in-sample", action="store_true", help="cocluster: fit on the whole trace (no held-out split)")
    p.add_argument("--max-tokens", type=N.nonneg(1 << 40), default=None,
                   help=f"bounds memory on large traces (0 = no cap): cocluster fits on a seeded sample of whole "
                        f"training requests of at most this many tokens (default {MAX_FIT_TOKENS}); rebatch fits on "
                        f"such a sample and re-batches the held-out tokens of the first steps up to it "
                        f"(default {MAX_REBATCH_TOKENS})")


def check_max_tokens(value: int | None, default: int) -> int | None:
    """--max-tokens as a cap: None -> default, 0 -> None (no cap); ConfigError for a negative value."""
    from routecast.common.errors import ConfigError

    if value is None:
        return default
    if type(value) is not int or value < 0:
        raise ConfigError(f"--max-tokens is {value!r}; expected a non-negative number of tokens (0 = no cap).")
    return value or None


def rebatch_max_tokens(value: int | None) -> int | None:
    """`schedule rebatch`'s --max-tokens cap (check_max_tokens with its own default)."""
    return check_max_tokens(value, MAX_REBATCH_TOKENS)


def cocluster_main(a: argparse.Namespace) -> int:
    """`routecast schedule cocluster TRACE --ep 8 --method smoe`: fit on the training documents, score on the
    held-out ones (and in sample), print the table, write the JSON and the plan file."""
    from routecast.common.errors import ConfigError
    from routecast.common.outputs import check_out_file, write_atomic
    from routecast.predict.evaluate import heldout_rows
    from routecast.schedule.ceo import CEOConfig
    from routecast.schedule.cocluster import METHODS, cocluster, evaluate_plan, fit_sample
    from routecast.schedule.cocluster_auto import auto_line, pick_method
    from routecast.trace.io import read_trace

    if a.score is not None:
        return score_main(a)
    if a.method not in (*METHODS, "auto"):
        raise ConfigError(f"--method is {a.method!r}; expected one of {', '.join(METHODS)}.")
    out = a.out if a.out != "out/schedule/rebatch.json" else "out/schedule/cocluster.json"
    plan_path = a.plan or str(Path(out).with_name(Path(out).stem + "-plan.json"))
    check_out_file(out, "--out")
    check_out_file(plan_path, "--plan")
    if not a.beta >= 1:
        raise ConfigError(f"--beta is {a.beta}; expected a number >= 1 (the token-load bound as a multiple of the mean).")
    if not 0 < a.rho <= 1:
        raise ConfigError(f"--rho is {a.rho}; expected a share in (0, 1].")
    max_tokens = check_max_tokens(a.max_tokens, MAX_FIT_TOKENS)
    cfg = CEOConfig(beta=a.beta, rho=a.rho, seed=a.seed)
    trace = read_trace(a.trace, load_hidden=False, load_logits=False)
    if type(a.ep) is not int or a.ep < 1 or trace.spec.num_experts % a.ep:
        raise ConfigError(f"--ep is {a.ep!r}; expected a positive divisor of the trace's {trace.spec.num_experts} experts.")
    if a.in_sample:
        train, test, used = np.ones(trace.num_tokens, bool), None, "none"
    else:
        train, test, used = heldout_rows(trace, a.split, 0.8, a.seed)
    # The fit holds its rows' routing: over --max-tokens it sees a sample of whole requests (and says so);
    # the scoring streams the trace a window of steps at a time, in sample on the fitted rows.
    fit_rows, note = fit_sample(trace, train, max_tokens, a.seed)
    auto = None
    method = a.method
    if method == "auto":
        method, auto = pick_method(trace, a.ep, train, config=cfg, max_tokens=max_tokens,
                                   respect_groups=a.respect_groups, progress=not a.quiet)
    del train
    rows = []
    for m in dict.fromkeys(("none", method)):
        plan = cocluster(trace, a.ep, m, rows=fit_rows, config=cfg, progress=not a.quiet, respect_groups=a.respect_groups)
        r = {"method": m, "fit_s": float(sum(plan.fit_s)), "in_sample": evaluate_plan(plan, trace, rows=fit_rows)}
        if test is not None:
            r["held_out"] = evaluate_plan(plan, trace, rows=test)
        rows.append(r)
    base = rows[0].get("held_out", rows[0]["in_sample"])["a2a_bytes"]
    res = {"settings": {"trace": str(a.trace), "ep": a.ep, "method": method, "asked": a.method, "auto": auto,
                        "split": used, "beta": a.beta,
                        "rho": a.rho, "seed": a.seed, "respect_groups": a.respect_groups, "plan": plan_path,
                        "max_tokens": max_tokens, "fit_tokens": int(fit_rows.sum()), "fit_note": note},
           "rows": rows}
    write_atomic(plan_path, plan.to_json(), "--plan")
    write_atomic(out, json.dumps(res, indent=1, default=float), "--out")
    if a.json:
        print(json.dumps(res, indent=1, default=float))
        return 0
    where = "held_out" if test is not None else "in_sample"
    print(f"{trace!r}; EP {a.ep}; fitted on {'all tokens' if test is None else f'80% of the {used}s'}, "
          f"scored on {'the same tokens' if test is None else 'the held-out rest'} (in-sample LAR in brackets)")
    if note:
        print(note)
    if auto is not None:
        print(auto_line(auto))
    print(f"{'method':<11} {'LAR':>6} {'(in)':>7} {'exp.imb':>8} {'tok.imb':>8} {'a2a MB/layer':>13} {'vs EP':>7} {'fit s':>7}")
    for r in rows:
        e = r[where]
        print(f"{r['method']:<11} {e['lar']:>6.3f} ({r['in_sample']['lar']:.3f}) {e['expert_imbalance']:>8.3f} "
              f"{e['token_imbalance']:>8.3f} {e['a2a_bytes'] / 1e6:>13.4f} {e['a2a_bytes'] / base - 1 if base else np.nan:>+7.1%} "
              f"{r['fit_s']:>7.2f}")
    print(f"wrote {out} and the plan {plan_path}")
    return 0


def score_main(a: argparse.Namespace) -> int:
    """`routecast schedule cocluster TRACE --score PLAN`: a saved plan on every token of another trace."""
    from routecast.common.outputs import check_out_file, write_atomic
    from routecast.schedule.cocluster import read_plan
    from routecast.schedule.cocluster_auto import score_plan
    from routecast.trace.io import read_trace

    out = a.out if a.out != "out/schedule/rebatch.json" else "out/schedule/cocluster-score.json"
    if a.plan is not None:
        from routecast.common.errors import ConfigError

        raise ConfigError(f"--plan {a.plan} is written by a fit and --score fits nothing; expected one of the two.")
    check_out_file(out, "--out")
    plan = read_plan(a.score, "--score")
    trace = read_trace(a.trace, load_hidden=False, load_logits=False)
    rows = score_plan(plan, trace)
    res = {"settings": {"trace": str(a.trace), "plan": str(a.score), "method": plan.method, "ep": plan.ep}, "rows": rows}
    write_atomic(out, json.dumps(res, indent=1, default=float), "--out")
    if a.json:
        print(json.dumps(res, indent=1, default=float))
        return 0
    print(f"{trace!r}; plan {a.score} ({plan.method}, EP {plan.ep}) scored on all {rows[0]['scored']['tokens']} tokens")
    base = rows[0]["scored"]["a2a_bytes"]
    print(f"{'method':<11} {'LAR':>6} {'exp.imb':>8} {'tok.imb':>8} {'a2a MB/layer':>13} {'vs EP':>7} {'seen':>6}")
    for r in rows:
        e = r["scored"]
        print(f"{r['method']:<11} {e['lar']:>6.3f} {e['expert_imbalance']:>8.3f} {e['token_imbalance']:>8.3f} "
              f"{e['a2a_bytes'] / 1e6:>13.4f} {e['a2a_bytes'] / base - 1 if base else np.nan:>+7.1%} "
              f"{e['seen_share']:>6.2f}")
    print(f"wrote {out}")
    return 0


def add_permute_parser(sub: Any) -> None:
    """`routecast permute-experts --model DIR --plan PLAN --out DIR2`."""
    p = sub.add_parser("permute-experts", help="s-MoE expert pre-grouping: write a checkpoint with experts permuted by a plan")
    p.add_argument("--model", required=True, help="checkpoint folder (safetensors), builtin or builtin-fine")
    p.add_argument("--plan", required=True, help="plan file written by `routecast schedule cocluster`")
    p.add_argument("--out", required=True, help="folder for the permuted checkpoint")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty --out, replacing its files")
    p.set_defaults(fn=permute_main)


@writes("--out", inputs=("--model", "--plan"))
def permute_main(a: argparse.Namespace) -> int:
    from routecast.schedule.cocluster import read_plan
    from routecast.schedule.permute import permute_checkpoint

    plan = read_plan(a.plan)
    out = permute_checkpoint(a.model, plan.expert_permutation_LE(), a.out, overwrite=a.overwrite)
    print(f"wrote {out}: experts and router rows of {plan.expert_group_LE.shape[0]} MoE layers permuted by "
          f"{a.plan} ({plan.method}, EP {plan.ep}); rank g holds slots g*{plan.expert_group_LE.shape[1] // plan.ep}..")
    return 0
