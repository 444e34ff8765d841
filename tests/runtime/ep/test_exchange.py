"""Two gloo ranks run exchange.moe_layer on tiny seeded experts for every plan kind: outputs equal the
single-process computation, measured bytes equal sim's prediction, a re-plan moves the implied weights, and a
rank killed mid-run makes the other one fail with an error (not hang). One spawn pair for all of it (~10 s)."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta

import numpy as np
import pytest

from tests.runtime.ep.ranks import spawn_ranks

E, H, I_, K, N, G = 8, 16, 12, 2, 40, 2


def _data():
    import torch

    g = torch.Generator().manual_seed(0)
    gu = torch.randn(E, 2 * I_, H, generator=g) / 4
    dn = torch.randn(E, H, I_, generator=g) / 4
    x = torch.randn(N, H, generator=g)
    rng = np.random.default_rng(0)
    p = np.array([0.4, 0.2, 0.1, 0.1, 0.08, 0.06, 0.04, 0.02])
    ids = np.stack([rng.choice(E, size=K, replace=False, p=p) for _ in range(N)])
    w = torch.rand(N, K, generator=g)
    return gu, dn, x, ids, w


def _src():
    """Tokens scattered over the ranks (not contiguous blocks): the token -> rank hook a token shuffle uses."""
    return np.random.default_rng(5).integers(0, G, N)


def _plans(ids, src):
    from routecast.place.slot_plans import eplb_plan, moegps_plan, probe_plans, static_plan

    load = np.bincount(ids.reshape(-1), minlength=E)[None]
    per_src = np.zeros((1, 1, G, E), np.int64)
    np.add.at(per_src[0, 0], (np.repeat(src, K), ids.reshape(-1)), 1)
    return {"static": static_plan(1, E, G), "eplb": eplb_plan(load, G, redundant_per_rank=1),
            "moe-gps": moegps_plan(load, G, redundant_per_rank=1), "probe": probe_plans(per_src)[0]}


def _child(rank: int, port: int, out: str, plans: dict) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from routecast.place.slots import hosted, weight_moves
    from routecast.runtime.ep.exchange import RankExperts, Router, moe_layer, move_weights
    from routecast.runtime.ep.results import predicted_bytes
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=G, timeout=timedelta(seconds=10))
    gu, dn, x, ids, w = _data()
    src = _src()
    mine = np.flatnonzero(src == rank)
    ref = torch.zeros(N, H)
    for k in range(K):
        for e in range(E):
            m = torch.from_numpy(ids[:, k] == e)
            gate, up = F.linear(x[m], gu[e]).chunk(2, dim=-1)
            ref[m] += F.linear(F.silu(gate) * up, dn[e]) * w[m, k:k + 1]
    res = {}
    for name, plan in plans.items():
        held = hosted(plan)[0, :, rank]
        store = RankExperts(rank=rank, world=G, layers=[{int(e): (gu[e], dn[e]) for e in np.flatnonzero(held)}],
                            act=F.silu, shared=[None])
        y, rec = moe_layer(store, plan, 0, x[mine], w[mine], Router(ids_NK=ids, src_N=src))
        sent, recv = predicted_bytes(plan, 0, ids, src, H * 4)
        res[name] = {"err": float((y - ref[mine]).abs().max()), "sent": rec.sent_bytes, "recv": rec.recv_bytes,
                     "pred_sent": int(sent[rank]), "pred_recv": int(recv[rank]), "items": rec.items,
                     "quota": int(plan.served_GE(0, np.bincount(ids.reshape(-1), minlength=E))[rank].sum())}
    # the drop-in experts module of `ep forward`: local ids only, the global routing is all-gathered
    from routecast.runtime.ep.forward import EPExperts

    held = hosted(plans["eplb"])[0, :, rank]
    store = RankExperts(rank=rank, world=G, layers=[{int(e): (gu[e], dn[e]) for e in np.flatnonzero(held)}],
                        act=F.silu, shared=[None])
    log = []
    y = EPExperts(store, plans["eplb"], 0, log)(x[mine], torch.from_numpy(ids[mine]), w[mine])
    res["module"] = {"err": float((y - ref[mine]).abs().max()), "ids_ok": log[0]["ids"] == ids[np.argsort(src, kind="stable")].tolist()}
    # a re-plan static -> probe: the weights arrive and equal the originals
    st = plans["static"]
    store = RankExperts(rank=rank, world=G, layers=[{int(e): (gu[e], dn[e]) for e in np.flatnonzero(hosted(st)[0, :, rank])}],
                        act=F.silu, shared=[None])
    mv = weight_moves(st, plans["probe"])
    b_in, b_out, _ = move_weights(store, st, plans["probe"], mv)
    want = set(np.flatnonzero(hosted(plans["probe"])[0, :, rank]).tolist())
    res["move"] = {"bytes_in": b_in, "expected_in": int((mv[:, 3] == rank).sum()) * (gu[0].numel() + dn[0].numel()) * 4,
                   "held_ok": set(store.layers[0]) == want,
                   "values_ok": all(bool(torch.equal(store.layers[0][e][0], gu[e])) for e in want)}
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(res, f)
    dist.barrier()
    if rank == 1:  # fault: this rank dies; rank 0's next collective must fail, not hang
        with open(f"{out}/killed", "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    t0 = time.time()
    try:
        moe_layer(store, plans["probe"], 0, x[mine], w[mine], Router(ids_NK=ids, src_N=src))
        msg = "no error"
    except Exception as e:  # noqa: BLE001
        msg = type(e).__name__
    with open(f"{out}/fault.json", "w") as f:
        json.dump({"error": msg, "seconds": time.time() - t0}, f)


def test_two_ranks_every_plan_and_a_dead_peer(tmp_path):
    from routecast.runtime.ep.launch import free_port

    port = free_port()
    plans = _plans(_data()[3], _src())  # planned here: the ranks need no planner (no numba import)
    procs, alive = spawn_ranks(_child, lambda r: (r, port, str(tmp_path), plans), G)
    assert not alive, "a rank hung"
    assert procs[0].exitcode == 0 and procs[1].exitcode == -signal.SIGKILL
    total_items = N * K
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(G)]
    for name in ("static", "eplb", "moe-gps", "probe"):
        for r in range(G):
            d = res[r][name]
            assert d["err"] < 1e-5, (name, r, d)
            assert (d["sent"], d["recv"]) == (d["pred_sent"], d["pred_recv"]), (name, r, d)
            assert d["items"] == d["quota"]
        assert sum(res[r][name]["items"] for r in range(G)) == total_items
    # balancing plans beat static on this skewed routing
    static_max = max(res[r]["static"]["items"] for r in range(G))
    assert max(res[r]["probe"]["items"] for r in range(G)) < static_max
    for r in range(G):
        assert res[r]["module"]["err"] < 1e-5 and res[r]["module"]["ids_ok"]
        m = res[r]["move"]
        assert m["bytes_in"] == m["expected_in"] and m["held_ok"] and m["values_ok"]
    assert sum(res[r]["move"]["bytes_in"] for r in range(G)) > 0
    fault = json.loads((tmp_path / "fault.json").read_text())
    assert fault["error"] != "no error" and fault["seconds"] < 30


def test_worker_refuses_a_bad_plan_before_any_collective(tmp_path, monkeypatch, capsys):
    from routecast.runtime.ep.worker import run

    np.savez(tmp_path / "plans.npz", slots_PLS=np.array([[[0, 1, 2]]]), share_PLS=np.ones((1, 1, 3)),
             plan_of_step=np.zeros(1, np.int64), num_ranks=2, num_experts=3, layer_ids=np.array([0]), method="static")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run({"plans": str(tmp_path / "plans.npz"), "out": str(tmp_path)}) == 2
    err = capsys.readouterr().err
    assert "3 slots per layer do not divide over 2 ranks" in err and err.count("\n") == 1


@pytest.mark.parametrize("slots,msg", [([[0, 0, 1, 1]], "expert 2 of layer 0 has no slot"),
                                       ([[0, 1, 2, 7]], "holds expert 7")])
def test_bad_plans_are_refused(slots, msg):
    from routecast.common.errors import ConfigError
    from routecast.place.slots import SlotPlan

    s = np.array(slots)
    with pytest.raises(ConfigError, match=msg):
        SlotPlan(slots_LS=s, share_LS=np.ones(s.shape), num_ranks=2, num_experts=3, layer_ids=(0,)).validate()


@pytest.mark.parametrize("nproc", [0, -1, 3])
def test_forward_refuses_a_bad_nproc_before_making_its_output(nproc, tmp_path):
    from routecast.common.errors import ConfigError
    from routecast.runtime.ep.forward import run_forward
    from routecast.trace.io import write_trace
    from tests.conftest import build_small_trace

    d = write_trace(build_small_trace(num_experts=8), tmp_path / "t")
    with pytest.raises(ConfigError, match=f"--nproc {nproc}: expected a positive divisor of the 8 experts"):
        run_forward(model="builtin", trace_dir=str(d), out=tmp_path / "out" / "static", nproc=nproc, requests=4, tokens=2)
    assert not (tmp_path / "out").exists()  # it used to make the plan's folder first
