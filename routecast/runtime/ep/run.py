"""`routecast ep run`: replay trace steps through the real MoE layers on G ranks (ranks.py) under each plan, check
outputs and bytes, compare time with the link profile, and print one row per plan.

Legend: G ranks, T replayed steps, R repeats.

Each plan gets its own launch of the ranks on the same steps (same routing, same tokens per rank), into
OUT/<plan>/ (plans.npz, config.json, rank<r>.json, rank<r>.pt); OUT/summary.json holds every figure.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.common.outputs import check_out_dir, names_matcher, write_atomic
from routecast.place.slots import METHODS
from routecast.runtime.ep.launch import WORKER, launch, prepare, select_steps
from routecast.runtime.ep.ranks import LOOPBACK, rank_command
from routecast.runtime.ep.results import check_bytes, check_outputs, collect, summarize
from routecast.runtime.ep.shuffle import NAME as SHUFFLE
from routecast.runtime.ep.shuffle import expected, load_shuffle
from routecast.runtime.ep.worker import layer_ranks, step_rows
from routecast.sim.a2a import LinkProfile, load_link

OWNED = names_matcher(["summary.json", *METHODS, SHUFFLE])


def run_plans(*, model: str, trace_dir: str, out: str | Path, nproc: int, plans: list[str], steps: int = 8,
              first_step: int = 0, min_tokens: int = 0, repeats: int = 3, link: str | LinkProfile | None = None,
              check: bool = True, timeout_s: float = 20.0, threads: int = 1, redundant_per_rank: int = 1,
              overwrite: bool = False, token_ranks_path: str | None = None, shuffle_plan: str | None = None,
              quiet: bool = False, host: str = LOOPBACK) -> dict[str, Any]:
    """Every plan in `plans` on the same replayed steps -> {'settings', 'plans': {name: summary}}.

    shuffle_plan: a `schedule cocluster` plan file; adds the plan 'shuffle' (its pre-grouped experts and token
    shuffle, shuffle.py) to `plans`, with schedule's own predicted LAR and bytes for the replayed rows alongside."""
    from routecast.trace.io import read_trace

    if shuffle_plan and SHUFFLE not in plans:
        plans = [*plans, SHUFFLE]
    bad = [p for p in plans if p not in METHODS and not (p == SHUFFLE and shuffle_plan)]
    if bad or not plans:
        raise ConfigError(f"--plans {','.join(plans) or '(none)'}: {bad[0] if bad else 'empty'} is not a plan; "
                          f"expected a comma-separated subset of {', '.join(METHODS)} ({SHUFFLE} with --shuffle-plan).")
    if repeats < 1 or timeout_s <= 0:
        raise ConfigError(f"--repeats {repeats} and --timeout {timeout_s}; expected repeats >= 1 and a timeout > 0 s.")
    out = check_out_dir(out, "--out", overwrite=overwrite, owned=OWNED)
    prof = load_link(link) if isinstance(link, (str, Path)) else link
    if prof is not None and prof.ranks != nproc:
        raise ConfigError(f"--link {prof.name} was measured on {prof.ranks} ranks; expected one for --nproc {nproc}.")
    trace = read_trace(trace_dir, verify=False)
    if trace.hidden_TLH is None:
        raise ConfigError(f"--trace {trace_dir} has no hidden_TLH; expected a capture made with --hidden.")
    ids = select_steps(trace, first_step, steps, min_tokens)
    rows_of = step_rows(np.asarray(trace.tokens["step"]), ids)
    L = trace.spec.num_layers
    if token_ranks_path:
        from routecast.common.schemas import load_int_npy

        T = trace.num_tokens
        tok = load_int_npy(token_ranks_path, "--token-ranks", shapes=((T,), (T, L)), lo=0, hi=nproc - 1)
    else:
        tok = None
    src_of = [layer_ranks(tok, r, nproc, L) for r in rows_of]
    shuf = load_shuffle(shuffle_plan, trace, nproc) if shuffle_plan else None
    res: dict[str, Any] = {"settings": {
        "model": model, "trace": str(trace_dir), "nproc": nproc, "steps": ids, "tokens": int(sum(r.size for r in rows_of)),
        "repeats": repeats, "link": None if prof is None else prof.name, "backend": "gloo",
        "ranks": f"{nproc} x " + " ".join(rank_command(WORKER, out / "PLAN" / "config.json")),
        "master_addr": host}, "plans": {}}
    for name in plans:
        d = out / name
        tok_path, slot_plan, src = token_ranks_path, None, src_of
        if name == SHUFFLE:
            d.mkdir(parents=True, exist_ok=True)
            tok_path, slot_plan = str(d / "token-ranks.npy"), shuf[1]
            np.save(tok_path, shuf[2])
            src = [layer_ranks(shuf[2], r, nproc, L) for r in rows_of]
        cfg, pl, pos = prepare(trace, model=model, trace_dir=trace_dir, out=d, method=name, nproc=nproc, steps=ids,
                               repeats=repeats, save_outputs=check, timeout_s=timeout_s, threads=threads,
                               redundant_per_rank=redundant_per_rank, token_ranks_path=tok_path, slot_plan=slot_plan)
        t0 = time.monotonic()
        launch(cfg, nproc, host=host)
        ranks = collect(d, nproc)
        s = summarize(ranks, prof)
        s["wall_s"] = time.monotonic() - t0
        s["bytes"] = check_bytes(trace, rows_of, pl, pos, ranks, src)
        if name == SHUFFLE:
            s["schedule_predicted"] = expected(shuf[0], trace, np.concatenate(rows_of))
        if check:
            s["outputs"] = check_outputs(model, trace, rows_of, d, nproc)
        res["plans"][name] = s
        if not quiet:
            print(format_row(name, s), flush=True)
    write_atomic(out / "summary.json", json.dumps(res, indent=1), "--out")
    return res


HEADER = ("plan", "max/mean items", "IR", "LAR", "a2a MB", "a2a ms median/min", "pred ms", "err median/min",
          "cell ratio p10/p50", "compute ms", "moved MB", "held MB/rank", "bytes==sim", "allclose (max err), router match")


def format_row(name: str, s: dict[str, Any]) -> str:
    pred = s.get("a2a_pred_s")
    out = s.get("outputs", {})
    cells = (name, f"{s['max_items_per_rank']:.0f}/{s['mean_items_per_rank']:.0f}", f"{s['ir_items']:.3f}",
             f"{s['bytes']['lar']:.3f}",
             f"{s['a2a_bytes'] / 1e6:.2f}", f"{s['a2a_s'] * 1e3:.1f}/{s['a2a_min_s'] * 1e3:.1f}",
             "-" if pred is None else f"{pred * 1e3:.1f}",
             "-" if pred is None else f"{s['a2a_rel_err']:+.0%}/{s['a2a_min_rel_err']:+.0%}",
             "-" if pred is None else "{:.2f}/{:.2f}".format(*s["a2a_cell_ratio_p10_p50_p90"][:2]),
             f"{s['compute_s'] * 1e3:.1f}",
             f"{s['weight_bytes_moved'] / 1e6:.2f}", f"{max(s['held_bytes_per_rank']) / 1e6:.1f}",
             str(s["bytes"]["equal"]),
             "-" if not out else f"{out['allclose']} ({out['max_abs_err']:.1e})"
             + ("" if out.get("router_match") is None else f", router {out['router_match']:.0%}"))
    return " | ".join(cells)


def format_table(res: dict[str, Any]) -> str:
    lines = [" | ".join(HEADER), " | ".join("---" for _ in HEADER)]
    lines += [format_row(n, s) for n, s in res["plans"].items()]
    return "\n".join(lines)


def shuffle_line(res: dict[str, Any]) -> str:
    """One line: the token shuffle's measured LAR and bytes against static EP's and schedule's prediction."""
    s = res["plans"][SHUFFLE]
    b, pr = s["bytes"], s["schedule_predicted"]
    line = (f"shuffle: measured LAR {b['lar']:.3f}, dispatch {b['measured_sent_bytes'] / 1e6:.3f} MB; schedule "
            f"cocluster predicts LAR {pr['lar']:.3f}, {pr['a2a_sent_bytes'] / 1e6:.3f} MB on the same rows "
            f"(equal: {pr['a2a_sent_bytes'] == b['measured_sent_bytes']})")
    base = res["plans"].get("static")
    if base:
        line += (f"; vs static LAR {base['bytes']['lar']:.3f}: a2a bytes "
                 f"x{b['measured_sent_bytes'] / max(base['bytes']['measured_sent_bytes'], 1):.3f}")
    return line
