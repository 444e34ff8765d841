"""The whole model forward with expert-parallel MoE layers: `routecast ep forward`.

Legend: G ranks, B sequences, P tokens per sequence, K top-k, H hidden.

Every rank holds the non-expert weights (data-parallel attention) and, per MoE block, an EPExperts module in place
of the transformers experts module: only its slots' expert weights, the model's own router choosing the experts.
Rank r runs sequences r, r + G, ... (B >= G); each MoE layer all-gathers the ranks' top-k ids (the global
routing every rank needs to assign tokens to replicas without another exchange of counts), then dispatches and
combines with exchange.moe_layer. The logits are compared with the single-process model on the same B x P
tokens (each request's first P prompt tokens in the trace), and each rank's measured dispatch bytes with sim's
prediction for the routing the ranks chose. Plans: static, EPLB and MoE-GPS from the trace's counts (PROBE plans
each step from that step's loads, which a live forward only knows after routing: not run here).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from routecast.common.errors import ConfigError
from routecast.place.slots import SlotPlan
from routecast.runtime.ep.exchange import RankExperts, Router, moe_layer


class EPExperts(nn.Module):
    """Drop-in for a transformers-5 experts module: forward(hidden (n, H), top_k_index (n, K), top_k_weights (n, K))."""

    def __init__(self, store: RankExperts, plan: SlotPlan, lay: int, log: list[dict[str, Any]]):
        super().__init__()
        self.store, self.plan, self.lay, self.log = store, plan, lay, log

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        G = self.store.world
        ids = top_k_index.reshape(hidden.shape[0], -1).long()
        n, K = ids.shape
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(G)]
        dist.all_gather(counts, torch.tensor([n]))
        cnt = [int(c) for c in counts]
        pad = torch.full((max(cnt), K), -1, dtype=torch.long)
        pad[:n] = ids
        parts = [torch.empty_like(pad) for _ in range(G)]
        dist.all_gather(parts, pad)
        ids_all = torch.cat([p[:c] for p, c in zip(parts, cnt, strict=True)]).numpy()
        src = np.repeat(np.arange(G), cnt)
        y, rec = moe_layer(self.store, self.plan, self.lay, hidden, top_k_weights.reshape(n, K), Router(ids_NK=ids_all, src_N=src),
                           sync=False, shared=False)
        self.log.append({"layer": self.lay, "ids": ids_all.tolist(), "src": src.tolist(), **asdict(rec)})
        return y


def _worker(cfg: dict[str, Any]) -> int:
    import torch.distributed as dist

    from routecast.runtime.ep.exchange import rank_experts
    from routecast.runtime.ep.ranks import init_group
    from routecast.runtime.ep.worker import load_plans
    from routecast.trace.capture_arch import find_blocks
    from routecast.trace.capture_inputs import load_model

    torch.set_num_threads(int(cfg.get("threads", 1)))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    plans, _ = load_plans(cfg["plans"])
    plan = plans[0].validate(f"plan {cfg['plans']}")
    init_group("gloo", float(cfg.get("timeout_s", 20)))
    model, _ = load_model(cfg["model"])
    blocks = find_blocks(model)
    store = rank_experts(blocks, plan, rank, world)
    log: list[dict[str, Any]] = []
    for lay, b in enumerate(blocks):
        b.block.experts = EPExperts(store, plan, lay, log)  # the full expert tensors go with the old module
    del blocks
    gc.collect()
    tokens = np.load(cfg["tokens"])[rank::world]
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(tokens)).logits
    out = Path(cfg["out"])
    torch.save(logits, out / f"logits{rank}.pt")
    (out / f"forward{rank}.json").write_text(json.dumps({"held_bytes": store.held_bytes(), "layers": log}))
    dist.destroy_process_group()
    return 0


def prompt_tokens(trace: Any, requests: int, tokens: int) -> np.ndarray:
    """(B, P) int64: the first P prompt tokens of the first B requests whose prompt has at least P tokens."""
    t = trace.tokens
    pre = np.flatnonzero(np.asarray(t["phase"]) == 0)
    req, pos, tok = (np.asarray(t[k])[pre] for k in ("request", "position", "token_id"))
    rows = []
    for r in np.unique(req):
        m = req == r
        if m.sum() >= tokens:
            rows.append(tok[m][np.argsort(pos[m], kind="stable")][:tokens])
        if len(rows) == requests:
            break
    if len(rows) < requests:
        raise ConfigError(f"--requests {requests} --tokens {tokens}: the trace has {len(rows)} prompts of at least "
                          f"{tokens} tokens; expected {requests}.")
    return np.stack(rows).astype(np.int64)


def run_forward(*, model: str, trace_dir: str, out: str | Path, nproc: int, method: str = "eplb", requests: int = 8,
                tokens: int = 32, redundant_per_rank: int = 1, timeout_s: float = 20.0,
                host: str = "127.0.0.1") -> dict[str, Any]:
    """Launch the G ranks (ranks.run_ranks, store on `host`), compare logits and bytes -> summary dict."""
    from routecast.runtime.ep.launch import save_plans
    from routecast.runtime.ep.ranks import run_ranks
    from routecast.runtime.ep.results import predicted_bytes
    from routecast.trace.capture_inputs import load_model
    from routecast.trace.io import read_trace

    if method not in ("static", "eplb", "moe-gps"):
        raise ConfigError(f"--plan {method!r}; expected static, eplb or moe-gps for a live forward (PROBE plans per step).")
    if requests < nproc or tokens < 1:
        raise ConfigError(f"--requests {requests} --tokens {tokens}; expected at least one sequence per rank ({nproc}).")
    trace = read_trace(trace_dir, verify=False)
    if nproc < 1 or trace.spec.num_experts % nproc:  # before the output folder is made
        raise ConfigError(f"--nproc {nproc}: expected a positive divisor of the {trace.spec.num_experts} experts.")
    ids = prompt_tokens(trace, requests, tokens)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from routecast.runtime.ep.launch import build_plans

    s = trace.spec
    plans, pos = build_plans(trace, method, nproc, np.zeros((1, s.num_layers, nproc, s.num_experts), np.int64),
                             redundant_per_rank=redundant_per_rank)
    save_plans(out / "plans.npz", plans, pos)
    np.save(out / "tokens.npy", ids)
    cfg = out / "forward.json"
    cfg.write_text(json.dumps({"model": model, "plans": str(out / "plans.npz"), "tokens": str(out / "tokens.npy"),
                               "out": str(out), "timeout_s": timeout_s}))
    run_ranks("routecast.runtime.ep.forward", cfg, nproc, host=host, wall_s=600.0, what="ep forward")
    ref_model, _ = load_model(model)
    with torch.no_grad():
        ref = ref_model(input_ids=torch.from_numpy(ids)).logits
    worst, ok, equal, checked = 0.0, True, True, 0
    sent_total = 0
    logs = [json.loads((out / f"forward{r}.json").read_text()) for r in range(nproc)]
    for r in range(nproc):
        got = torch.load(out / f"logits{r}.pt")
        worst = max(worst, float((got - ref[r::nproc]).abs().max()))
        ok &= bool(torch.allclose(got, ref[r::nproc], rtol=1e-4, atol=1e-4))
        for rec in logs[r]["layers"]:
            ps, pr = predicted_bytes(plans[0], rec["layer"], np.asarray(rec["ids"]), np.asarray(rec["src"]),
                                     s.hidden_size * 4)
            equal &= rec["sent_bytes"] == int(ps[r]) and rec["recv_bytes"] == int(pr[r])
            sent_total += rec["sent_bytes"]
            checked += 1
    return {"plan": method, "nproc": nproc, "sequences": requests, "tokens": tokens, "logits_max_abs_err": worst,
            "allclose": ok, "bytes_equal": equal, "cells_checked": checked, "a2a_bytes": 2 * sent_total,
            "held_bytes_per_rank": [lg["held_bytes"] for lg in logs]}


if __name__ == "__main__":
    sys.exit(_worker(json.loads(Path(sys.argv[1]).read_text())))
