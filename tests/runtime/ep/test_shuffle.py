"""Speculative MoE's token shuffle in the EP runtime (runtime/ep/shuffle.py): a `schedule cocluster` plan becomes a
one-replica SlotPlan (rank g holds the plan's group g) and a per-layer token-rank table; sim's byte prediction for
it equals schedule's own; two gloo ranks running the trace's steps under it give the single-process outputs and
exactly the predicted bytes (one spawn pair, a few seconds)."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from tests.runtime.ep.ranks import spawn_ranks

G, H, I_ = 2, 16, 12


@pytest.fixture
def shuffled(small_trace, tmp_path):
    """(trace, CoclusterPlan, plan path) on a tiny 8-expert top-2 trace, smoe fitted at EP 2."""
    from routecast.schedule.ceo import CEOConfig
    from routecast.schedule.cocluster import cocluster

    t = small_trace(num_requests=6, prompt_len=8, decode_len=3, num_layers=2, num_experts=8, top_k=2, hidden=H, seed=3)
    plan = cocluster(t, G, "smoe", config=CEOConfig(seed=0))
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return t, plan, path


def test_plan_becomes_slots_and_token_ranks(shuffled):
    from routecast.place.slots import hosted
    from routecast.runtime.ep.results import predicted_bytes
    from routecast.runtime.ep.shuffle import expected, load_shuffle
    from routecast.runtime.ep.worker import layer_ranks, step_rows

    t, plan, path = shuffled
    cp, slots, tok_NL = load_shuffle(path, t, G)
    L, E = plan.expert_group_LE.shape
    onehot = plan.expert_group_LE[:, :, None] == np.arange(G)[None, None, :]
    assert np.array_equal(hosted(slots), onehot)  # rank g holds exactly the plan's group g, once
    assert tok_NL.shape == (t.num_tokens, L) and set(np.unique(tok_NL)) <= {0, 1}
    assert (tok_NL[:, 0] != tok_NL[:, 1]).any()  # s-TS's table is per layer: a token's rank changes between layers
    rows_of = step_rows(np.asarray(t.tokens["step"]), sorted(set(np.asarray(t.tokens["step"]).tolist())))
    sent = 0
    for rows in rows_of:
        src = layer_ranks(tok_NL, rows, G, L)
        ids = np.asarray(t.experts_TLK[rows]).astype(np.int64)
        for lay in range(L):
            sent += int(predicted_bytes(slots, lay, ids[:, lay], src[:, lay], H * 4)[0].sum())
    want = expected(cp, t, np.concatenate(rows_of))
    assert sent == want["a2a_sent_bytes"] > 0  # sim.a2a's runtime prediction == schedule's evaluate_plan
    assert want["lar"] > 0.5  # the shuffle localises more than plain EP's ~1/G on this routing


def test_bad_shuffle_plans_are_refused(shuffled, tmp_path):
    from routecast.runtime.ep.shuffle import load_shuffle

    t, plan, path = shuffled
    with pytest.raises(ConfigError, match="is for --ep 2; expected a plan made with --ep 4"):
        load_shuffle(path, t, 4)
    grouped = dataclasses.replace(t, spec=dataclasses.replace(t.spec, n_group=4, topk_group=2))
    eg = plan.expert_group_LE.copy()
    eg[:] = [0, 1, 0, 1, 0, 1, 0, 1]  # splits every router group of 2 experts across ranks
    bad = tmp_path / "split.json"
    bad.write_text(dataclasses.replace(plan, expert_group_LE=eg).to_json())
    with pytest.raises(ConfigError, match="moves experts between the router's 4 expert groups"):
        load_shuffle(bad, grouped, G)
    with pytest.raises(ConfigError, match="no such file"):
        load_shuffle(tmp_path / "none.json", t, G)
    junk = tmp_path / "junk.json"
    junk.write_text("{ not json")
    with pytest.raises(ConfigError, match="^--shuffle-plan .*junk.json is not valid JSON"):  # it said --plan
        load_shuffle(junk, t, G)


def _child(rank: int, port: int, out: str, t, slots, tok_NL) -> None:
    import os

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from routecast.place.slots import hosted
    from routecast.runtime.ep.exchange import RankExperts, Router, moe_layer
    from routecast.runtime.ep.results import predicted_bytes
    from routecast.runtime.ep.worker import layer_ranks, step_rows

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=G, timeout=timedelta(seconds=10))
    L, E = slots.num_layers, slots.num_experts
    g = torch.Generator().manual_seed(0)
    gu, dn = torch.randn(L, E, 2 * I_, H, generator=g) / 4, torch.randn(L, E, H, I_, generator=g) / 4
    held = hosted(slots)[:, :, rank]
    store = RankExperts(rank=rank, world=G, act=F.silu, shared=[None] * L,
                        layers=[{int(e): (gu[lay, e], dn[lay, e]) for e in np.flatnonzero(held[lay])} for lay in range(L)])
    steps = sorted(set(np.asarray(t.tokens["step"]).tolist()))
    worst, bytes_ok, cells = 0.0, True, 0
    for rows in step_rows(np.asarray(t.tokens["step"]), steps):
        src_NL = layer_ranks(tok_NL, rows, G, L)
        ids = np.asarray(t.experts_TLK[rows]).astype(np.int64)
        for lay in range(L):
            src = src_NL[:, lay]
            mine = rows[src == rank]
            x = torch.from_numpy(np.asarray(t.hidden_TLH[mine, lay], np.float32))
            w = torch.from_numpy(np.asarray(t.weights_TLK[mine, lay], np.float32))
            y, rec = moe_layer(store, slots, lay, x, w, Router(ids_NK=ids[:, lay], src_N=src))
            ref = torch.zeros_like(x)  # the single-process computation: every expert here
            for k in range(ids.shape[2]):
                for e in range(E):
                    m = torch.from_numpy(ids[src == rank, lay, k] == e)
                    gate, up = F.linear(x[m], gu[lay, e]).chunk(2, dim=-1)
                    ref[m] += F.linear(F.silu(gate) * up, dn[lay, e]) * w[m, k:k + 1]
            worst = max(worst, float((y - ref).abs().max()) if len(mine) else 0.0)
            sent, recv = predicted_bytes(slots, lay, ids[:, lay], src, H * 4)
            bytes_ok &= (rec.sent_bytes, rec.recv_bytes) == (int(sent[rank]), int(recv[rank]))
            cells += 1
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"err": worst, "bytes_ok": bool(bytes_ok), "cells": cells}, f)
    dist.destroy_process_group()


def test_two_ranks_run_the_shuffle_plan(shuffled, tmp_path):
    from routecast.runtime.ep.launch import free_port
    from routecast.runtime.ep.shuffle import load_shuffle

    t, _, path = shuffled
    _, slots, tok_NL = load_shuffle(path, t, G)
    port = free_port()
    procs, alive = spawn_ranks(_child, lambda r: (r, port, str(tmp_path), t, slots, tok_NL), G)
    assert not alive and all(p.exitcode == 0 for p in procs)
    for r in range(G):
        d = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert d["err"] < 1e-5 and d["bytes_ok"] and d["cells"] == 2 * len(set(np.asarray(t.tokens["step"]).tolist()))
