"""One expert-parallel rank, started by ranks.run_ranks (or launch.spawn_direct): `python -m routecast.runtime.ep.worker CONFIG`.

Legend: G ranks, L MoE layers, S slots, P distinct plans, T replayed steps.

CONFIG (JSON, written by launch.py): model (checkpoint folder or built-in name), trace (folder with hidden_TLH),
steps (trace step ids to replay, in order), plans (npz: slots_PLS, share_PLS, plan_of_step (T,), num_ranks,
num_experts, layer_ids, method), out (folder for rank<r>.json / rank<r>.pt), backend ("gloo" | "nccl"),
timeout_s (collective and rendezvous timeout), repeats, sync (barrier before each all-to-all so its time is the
transfer, not the wait for a slower rank), save_outputs, threads, token_ranks (optional .npy: rank of every
trace row (N,), or of every row at every MoE layer (N, L): a token shuffle such as Speculative MoE's, see
shuffle.py; default: each step's rows in G contiguous blocks), kill (optional {"rank", "step", "mode": "kill" | "hang"}: fault injection for the tests).

Each rank loads the model, copies out the experts its first plan hosts and drops the rest, then replays every
step: per MoE layer the router inputs (trace hidden_TLH) and routing (experts_TLK, weights_TLK) of its own
tokens go through exchange.moe_layer. A plan change between steps first exchanges the implied weights.
A collective that fails (a peer died, a timeout) ends the rank with one sentence on stderr and exit code 3.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np


def load_plans(path: str | Path) -> tuple[list[Any], np.ndarray]:
    """npz written by launch.save_plans -> (list of SlotPlan, plan_of_step (T,) int64)."""
    from routecast.place.slots import SlotPlan

    z = np.load(path)
    plans = [SlotPlan(slots_LS=z["slots_PLS"][p], share_LS=z["share_PLS"][p], num_ranks=int(z["num_ranks"]),
                      num_experts=int(z["num_experts"]), layer_ids=tuple(int(i) for i in z["layer_ids"]),
                      method=str(z["method"])) for p in range(z["slots_PLS"].shape[0])]
    return plans, z["plan_of_step"].astype(np.int64)


def step_rows(step_col: np.ndarray, steps: list[int]) -> list[np.ndarray]:
    """Rows of every requested step, in trace order."""
    order = np.argsort(step_col, kind="stable")
    s = step_col[order]
    return [order[np.searchsorted(s, v, "left"):np.searchsorted(s, v, "right")] for v in steps]


def token_ranks(n: int, world: int) -> np.ndarray:
    """Default token placement: the step's n rows in `world` contiguous blocks (DP attention over sequences)."""
    return (np.arange(n) * world) // max(n, 1)


def layer_ranks(tok_rank: np.ndarray | None, rows: np.ndarray, world: int, num_layers: int) -> np.ndarray:
    """(n, L) rank of each of a step's rows at each MoE layer: from the token-rank table ((N,) or (N, L)) or the
    default contiguous blocks."""
    if tok_rank is None:
        src = token_ranks(rows.size, world)
    else:
        src = np.asarray(tok_rank)[rows].astype(np.int64)
    return np.broadcast_to(src[:, None], (rows.size, num_layers)) if src.ndim == 1 else src


def fault(mode: str, out: Path, rank: int) -> None:
    """Fault injection for the tests: 'kill' SIGKILLs this rank, 'hang' stops it forever (its peers must time
    out); the moment is written to out/fault-rank<r> first."""
    (out / f"fault-rank{rank}").write_text(repr(time.time()))
    if mode == "hang":
        while True:
            time.sleep(3600)
    os.kill(os.getpid(), signal.SIGKILL)


def _fail(rank: int, what: str, t0: float, e: BaseException) -> int:
    msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    print(f"routecast ep: rank {rank}: {what} failed after {time.monotonic() - t0:.1f} s ({type(e).__name__}: {msg}); "
          "a peer rank has exited or timed out, so this rank stops.", file=sys.stderr, flush=True)
    return 3


def run(cfg: dict[str, Any]) -> int:
    import torch
    import torch.distributed as dist

    from routecast.common.errors import ConfigError
    from routecast.place.slots import weight_moves
    from routecast.runtime.ep.exchange import Router, moe_layer, move_weights, rank_experts
    from routecast.runtime.ep.ranks import init_group
    from routecast.trace.capture_arch import find_blocks
    from routecast.trace.capture_inputs import load_model
    from routecast.trace.io import read_trace

    torch.set_num_threads(int(cfg.get("threads", 1)))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    t0 = time.monotonic()
    backend = cfg.get("backend", "gloo")
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}") if backend == "nccl" else torch.device("cpu")
    try:  # a bad plan is refused before any collective
        plans, plan_of_step = load_plans(cfg["plans"])
        for p in plans:
            p.validate(f"plan {cfg['plans']}")
        if plans[0].num_ranks != world:
            raise ConfigError(f"plan {cfg['plans']} is for {plans[0].num_ranks} ranks; expected {world} "
                              "(--nproc).")
    except ConfigError as e:
        print(f"routecast ep: rank {rank}: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        init_group(backend, float(cfg.get("timeout_s", 20)))
    except Exception as e:  # noqa: BLE001 - any rendezvous failure is reported the same way
        return _fail(rank, "rendezvous", t0, e)
    model, _ = load_model(cfg["model"])
    blocks = find_blocks(model)
    store = rank_experts(blocks, plans[int(plan_of_step[0])], rank, world)
    for lay in store.layers:
        for e, (gu, dn) in list(lay.items()):
            lay[e] = (gu.to(dev), dn.to(dev))
    store.shared = [None if m is None else m.to(dev) for m in store.shared]
    del model, blocks
    gc.collect()
    trace = read_trace(cfg["trace"], verify=False)
    if trace.hidden_TLH is None:
        print(f"routecast ep: rank {rank}: trace {cfg['trace']} has no hidden_TLH; expected a capture with --hidden.",
              file=sys.stderr)
        dist.destroy_process_group()
        return 2
    rows_of = step_rows(np.asarray(trace.tokens["step"]), list(cfg["steps"]))
    tok_rank = np.load(cfg["token_ranks"]) if cfg.get("token_ranks") else None
    kill = cfg.get("kill") or {}
    records, weights, outputs = [], [], {}
    cur = int(plan_of_step[0])
    sync = bool(cfg.get("sync", True))
    what = "setup"
    try:
        with torch.no_grad():
            for rep in range(int(cfg.get("repeats", 1))):
                for i, rows in enumerate(rows_of):
                    if kill and int(kill["rank"]) == rank and int(kill["step"]) == i and rep == 0:
                        fault(kill.get("mode", "kill"), Path(cfg["out"]), rank)
                    p = int(plan_of_step[i])
                    if p != cur:
                        what = f"weight exchange before step {i}"
                        mv = weight_moves(plans[cur], plans[p])
                        b_in, b_out, t = move_weights(store, plans[cur], plans[p], mv, sync=sync)
                        weights.append({"rep": rep, "step": i, "bytes_in": b_in, "bytes_out": b_out, "seconds": t,
                                        "moves": int(len(mv))})
                        cur = p
                    src_NL = layer_ranks(tok_rank, rows, world, plans[p].num_layers)
                    ids = np.asarray(trace.experts_TLK[rows]).astype(np.int64)
                    for lay in range(plans[p].num_layers):
                        what = f"step {i} layer {lay}"
                        src = src_NL[:, lay]
                        mine = rows[src == rank]
                        x = torch.from_numpy(np.asarray(trace.hidden_TLH[mine, lay], np.float32)).to(dev)
                        w = torch.from_numpy(np.asarray(trace.weights_TLK[mine, lay], np.float32)).to(dev)
                        y, rec = moe_layer(store, plans[p], lay, x, w, Router(ids_NK=ids[:, lay], src_N=src), sync=sync)
                        records.append({"rep": rep, "step": i, "layer": lay, **asdict(rec)})
                        if rep == 0 and cfg.get("save_outputs"):
                            outputs[(i, lay)] = (mine, y.cpu())
            what = "final barrier"
            dist.barrier()
    except Exception as e:  # noqa: BLE001 - gloo/NCCL raise several types for a dead peer or a timeout
        return _fail(rank, what, t0, e)
    out = Path(cfg["out"])
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world": world, "records": records, "weights": weights,
        "held_bytes": store.held_bytes(), "expert_bytes": store.expert_bytes(), "seconds": time.monotonic() - t0}))
    if cfg.get("save_outputs"):
        torch.save({f"{i}:{lay}": {"rows": torch.from_numpy(m), "y": y} for (i, lay), (m, y) in outputs.items()},
                   out / f"rank{rank}.pt")
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(Path(argv[0]).read_text())
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
