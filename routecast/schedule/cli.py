"""`routecast schedule rebatch`: arrival-order vs path-clustered half-batches of each decode step.

The predictor (any name or saved folder; 'oracle' = the true paths) is fitted on train_fraction of the
documents (by request when the trace records none); the held-out requests are re-batched both ways with its causal per-token paths. The result holds
both traces (for the cache replay that prices them, done by the caller) and the activated experts per batch
(eq. 5's terms, on the true routing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from routecast.predict.batch_eval import token_sets
from routecast.predict.evaluate import fit_or_load, heldout_rows
from routecast.predict.forecast import multi_hot
from routecast.schedule.cocluster import fit_sample
from routecast.schedule.rebatch import METHODS, activated_experts, check_min_tokens, rebatch
from routecast.trace import Trace
from routecast.trace.stats import column_chunks, masked_value_counts


def step_sets(trace: Trace, paths_TLE: np.ndarray) -> np.ndarray:
    """Union of the tokens' predicted paths per step of `trace`: bool (S, L, E) in step order."""
    _, sidx = np.unique(trace.step, return_inverse=True)
    out = np.zeros((sidx.max() + 1 if len(sidx) else 0, *paths_TLE.shape[1:]), bool)
    np.logical_or.at(out, sidx, paths_TLE)
    return out


def step_window(trace: Trace, rows: np.ndarray, max_tokens: int | None) -> tuple[np.ndarray, str]:
    """bool (T,) `rows` limited to the first steps (in step order) holding at most max_tokens of them (at least
    one step; None: no cap), and a one-sentence note when it cut ("" otherwise). Whole steps are kept, so every
    kept step is re-batched as it ran; the token columns are read a chunk at a time."""
    n = int(np.count_nonzero(rows))
    if max_tokens is None or n <= max_tokens:
        return rows, ""
    steps, per = masked_value_counts(trace, "step", rows)
    k = max(1, int(np.count_nonzero(np.cumsum(per) <= max_tokens)))
    out = np.zeros_like(rows)
    for a, c in column_chunks(trace):
        b = a + len(c["step"])
        out[a:b] = rows[a:b] & (c["step"] <= steps[k - 1])
    return out, (f"re-batched the held-out tokens of the first {k} of {steps.size} steps ({int(out.sum())} of {n} "
                 f"tokens; --max-tokens {max_tokens})")


def run_rebatch(trace: Trace, *, predictor: str = "conditional-token", model: str | None = None,
                train_fraction: float = 0.8, seed: int = 0, split: str = "document", min_tokens: int = 4,
                threads: int = 1, quiet: bool = True, max_tokens: int | None = None) -> dict[str, Any]:
    """{'settings', 'arms': {method: {'trace', 'pred_SLE', 'activated_mean', 'activated_total', 'batches'}}}.

    max_tokens (None: no cap) bounds memory on a large trace: the predictor is fitted on a seeded sample of
    whole training requests of at most that many tokens, and the held-out tokens of the first steps up to it
    are re-batched (settings['notes'] says so); only those rows are copied into memory.
    """
    check_min_tokens(min_tokens)  # before the predictor is fitted
    train_m, test_m, used = heldout_rows(trace, split, train_fraction, seed)
    train_m, fit_note = fit_sample(trace, train_m, max_tokens, seed)
    test_m, test_note = step_window(trace, test_m, max_tokens)
    train, test = trace.select(train_m), trace.select(test_m)
    del train_m, test_m
    if predictor == "oracle":
        paths = multi_hot(test.experts_TLK, test.spec.num_experts)
    else:
        paths = token_sets(fit_or_load(predictor, train, model=model, seed=seed, threads=threads, quiet=quiet), test)
    arms = {}
    for m in METHODS:
        t = rebatch(test, paths, m, seed=seed, min_tokens=min_tokens)
        ae = activated_experts(t)
        arms[m] = {"trace": t, "pred_SLE": step_sets(t, paths), "activated_mean": float(ae.mean()),
                   "activated_total": int(ae.sum()), "batches": int(len(ae))}
    notes = [x for x in (fit_note, test_note) if x]
    return {"settings": {"predictor": predictor, "split": used, "test_tokens": test.num_tokens, "min_tokens": min_tokens,
                         "max_tokens": max_tokens, "notes": notes},
            "arms": arms}


def rebatch_main(a: Any) -> int:
    """`routecast schedule rebatch TRACE`: arrival order vs path-clustered batches, priced by a cache replay;
    prints the table and writes --out (checked before any work)."""
    import json

    import torch

    from routecast.cache.cli import _clean
    from routecast.cache.replay import ReplayConfig, parse_budget, replay
    from routecast.common.outputs import check_out_file, write_json
    from routecast.schedule.cocluster_cli import rebatch_max_tokens
    from routecast.sim.hardware import load_hardware
    from routecast.trace.io import read_trace

    check_out_file(a.out, "--out")
    torch.set_num_threads(a.threads)
    s = (trace := read_trace(a.trace, load_hidden=False, load_logits=False)).spec
    eb = a.expert_bytes or s.expert_bytes
    cfg = ReplayConfig(budget=parse_budget(a.budget, s.num_layers * s.num_experts, eb),
                       hardware=load_hardware(a.hardware), expert_bytes=eb)
    res = run_rebatch(trace, predictor=a.predictor, model=a.model, seed=a.seed, split=a.split, min_tokens=a.min_tokens,
                      threads=a.threads, quiet=a.quiet, max_tokens=rebatch_max_tokens(a.max_tokens))
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
