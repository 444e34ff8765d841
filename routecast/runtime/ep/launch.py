"""Build the plans, launch the ranks (ranks.py), collect what they measured, check it.

Legend: G ranks, L MoE layers, E experts, K top-k, T replayed steps, R repeats.

run_ep: plans for the replayed steps (place.slot_plans; EPLB and MoE-GPS from the whole trace's per-expert
counts, one-shot, as an engine's --init-expert-location from recorded statistics; PROBE per step from that
step's per-source-rank counts), a config file, G ranks of `python -m routecast.runtime.ep.worker CONFIG` in
one process group (ranks.py: the rendezvous on 127.0.0.1 by default, torn down on any failure), then per
(step, layer):
  outputs  every rank's rows against the single-process model's experts(x, ids, w) + shared_experts(x) (fp32);
  bytes    every rank's measured dispatch bytes against sim.a2a.ep_a2a_bytes of the same routing and plan;
  time     the slowest rank's measured all-to-all seconds (median over repeats) against the link profile.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.place.slot_plans import METHODS, eplb_plan, moegps_plan, probe_plans, static_plan
from routecast.place.slots import SlotPlan
from routecast.runtime.ep.ranks import LOOPBACK, run_ranks, start_ranks
from routecast.runtime.ep.worker import layer_ranks, step_rows

WORKER = "routecast.runtime.ep.worker"


def select_steps(trace: Any, first: int, count: int, min_tokens: int = 0) -> list[int]:
    """`count` step ids of the trace from position `first` on (in step order), skipping steps with < min_tokens."""
    u, c = np.unique(np.asarray(trace.tokens["step"]), return_counts=True)
    keep = u[c >= max(min_tokens, 1)]
    if count < 1 or first < 0 or first >= keep.size:
        raise ConfigError(f"--steps {count} from --first-step {first}: the trace has {keep.size} usable steps; "
                          "expected at least one step in range.")
    return [int(s) for s in keep[first:first + count]]


def _src_loads(trace: Any, rows_of: list[np.ndarray], G: int, tok_rank: np.ndarray | None) -> np.ndarray:
    """(T, L, G, E) items per (step, layer, source rank, expert)."""
    s = trace.spec
    out = np.zeros((len(rows_of), s.num_layers, G, s.num_experts), np.int64)
    for t, rows in enumerate(rows_of):
        ids = np.asarray(trace.experts_TLK[rows]).astype(np.int64)  # (n, L, K)
        n, L, K = ids.shape
        lay = np.broadcast_to(np.arange(L)[None, :, None], ids.shape)
        g = np.broadcast_to(layer_ranks(tok_rank, rows, G, L)[:, :, None], ids.shape)
        ok = ids >= 0
        np.add.at(out[t], (lay[ok], g[ok], ids[ok]), 1)
    return out


def build_plans(trace: Any, method: str, G: int, src_TLGE: np.ndarray, *, redundant_per_rank: int = 1,
                max_redundant: int = 3) -> tuple[list[SlotPlan], np.ndarray]:
    """(plans, plan_of_step (T,)) for `method` in slot_plans.METHODS."""
    s = trace.spec
    L, E, T = s.num_layers, s.num_experts, src_TLGE.shape[0]
    ids = tuple(s.layer_ids)
    if method == "static":
        return [static_plan(L, E, G, ids)], np.zeros(T, np.int64)
    if method in ("eplb", "moe-gps"):
        stats = trace.counts_LE()
        if method == "eplb":
            p = eplb_plan(stats, G, redundant_per_rank=redundant_per_rank, layer_ids=ids)
        else:
            p = moegps_plan(stats, G, redundant_per_rank=redundant_per_rank, layer_ids=ids)
        return [p], np.zeros(T, np.int64)
    if method == "probe":
        return probe_plans(src_TLGE, max_redundant=max_redundant, layer_ids=ids), np.arange(T)
    raise ConfigError(f"--plan {method!r} is not a method; expected one of {', '.join(METHODS)}.")


def save_plans(path: Path, plans: list[SlotPlan], plan_of_step: np.ndarray) -> None:
    """One npz: slots_PLS / share_PLS padded to the widest plan with empty slots (share 0)."""
    G = plans[0].num_ranks
    width = max(p.slots_per_rank for p in plans)
    L = plans[0].num_layers
    slots = np.full((len(plans), L, G, width), -1, np.int64)
    share = np.zeros((len(plans), L, G, width))
    for i, p in enumerate(plans):
        k = p.slots_per_rank
        slots[i, :, :, :k] = p.slots_LS.reshape(L, G, k)
        share[i, :, :, :k] = p.share_LS.reshape(L, G, k)
    np.savez(path, slots_PLS=slots.reshape(len(plans), L, G * width), share_PLS=share.reshape(len(plans), L, G * width),
             plan_of_step=plan_of_step, num_ranks=G, num_experts=plans[0].num_experts,
             layer_ids=np.asarray(plans[0].layer_ids), method=plans[0].method)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the in-process EP tests rendezvous on it)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def spawn_direct(nproc: int, config: Path, *, host: str = LOOPBACK) -> list[subprocess.Popen]:
    """Start the worker ranks and return at once (tests drive faults with these): ranks.start_ranks, one
    process group, the store on `host`; stop them with ranks.stop."""
    return start_ranks(WORKER, config, nproc, host=host)


def prepare(trace: Any, *, model: str, trace_dir: str, out: Path, method: str, nproc: int, steps: list[int],
            repeats: int = 1, sync: bool = True, save_outputs: bool = True, timeout_s: float = 20.0,
            threads: int = 1, backend: str = "gloo", redundant_per_rank: int = 1,
            token_ranks_path: str | None = None, kill: dict | None = None, slot_plan: SlotPlan | None = None
            ) -> tuple[Path, list[SlotPlan], np.ndarray]:
    """Plans + config for one run in `out` -> (config path, plans, plan_of_step); slot_plan: a ready plan used
    for every step instead of building `method`'s (the token shuffle's pre-grouped experts, shuffle.py)."""
    if nproc < 1 or trace.spec.num_experts % nproc:
        raise ConfigError(f"--nproc {nproc}: expected a positive divisor of the {trace.spec.num_experts} experts.")
    if token_ranks_path:
        from routecast.common.schemas import load_int_npy

        T, L = trace.num_tokens, trace.spec.num_layers
        tok_rank = load_int_npy(token_ranks_path, "--token-ranks", shapes=((T,), (T, L)), lo=0, hi=nproc - 1)
    else:
        tok_rank = None
    rows_of = step_rows(np.asarray(trace.tokens["step"]), steps)
    src = _src_loads(trace, rows_of, nproc, tok_rank)
    if slot_plan is not None:
        plans, pos = [slot_plan], np.zeros(len(steps), np.int64)
    else:
        plans, pos = build_plans(trace, method, nproc, src, redundant_per_rank=redundant_per_rank)
    out.mkdir(parents=True, exist_ok=True)
    save_plans(out / "plans.npz", plans, pos)
    cfg = {"model": model, "trace": trace_dir, "steps": steps, "plans": str(out / "plans.npz"), "out": str(out),
           "backend": backend, "timeout_s": timeout_s, "repeats": repeats, "sync": sync, "save_outputs": save_outputs,
           "threads": threads, "token_ranks": token_ranks_path, "kill": kill}
    path = out / "config.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path, plans, pos


def launch(config: Path, nproc: int, *, wall_s: float = 600.0, host: str = LOOPBACK) -> None:
    """Run the worker ranks on `config` and wait (ranks.run_ranks: ConfigError naming the failed rank and its cause;
    no rank outlives this call)."""
    run_ranks(WORKER, config, nproc, host=host, wall_s=wall_s, what="ep run")
