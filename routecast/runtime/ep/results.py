"""What the ranks measured, checked: outputs against the single-process model, bytes against sim/, time against
the link profile; and the per-plan summary the CLI and the benchmark print.

Legend: G ranks, L MoE layers, E experts, T replayed steps, R repeats, C (step, layer) cells.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.place.slots import SlotPlan
from routecast.sim.a2a import LinkProfile, ep_a2a_bytes


def collect(out: Path, nproc: int) -> list[dict[str, Any]]:
    """rank<r>.json of every rank."""
    try:
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    except FileNotFoundError as e:
        raise ConfigError(f"rank result {e.filename} is missing; expected every rank to finish.") from None


def check_outputs(model_dir: str, trace: Any, rows_of: list[np.ndarray], out: Path, nproc: int) -> dict[str, Any]:
    """Every saved (step, layer) of every rank against the single-process MoE block with the same routing (fp32).

    Reference: the transformers experts module (all E experts in one process) on the step's rows, plus the
    block's shared experts. Returns {'cells', 'max_abs_err', 'allclose'} (rtol 1e-4, atol 1e-5) and router_match:
    the share of tokens whose forced top-k set equals what the block's router picks on the same inputs.
    """
    import torch
    from transformers.utils import logging as hf_logging

    from routecast.trace.capture_arch import find_blocks
    from routecast.trace.capture_inputs import load_model

    hf_logging.disable_progress_bar()
    model, _ = load_model(model_dir)
    blocks = find_blocks(model)
    saved = [torch.load(out / f"rank{r}.pt") for r in range(nproc)]
    worst, ok, cells, same, rows_n = 0.0, True, 0, 0, 0
    with torch.no_grad():
        for key in saved[0]:
            i, lay = map(int, key.split(":"))
            rows = rows_of[i]
            x = torch.from_numpy(np.asarray(trace.hidden_TLH[rows, lay], np.float32))
            ids = torch.from_numpy(np.asarray(trace.experts_TLK[rows, lay]).astype(np.int64))
            w = torch.from_numpy(np.asarray(trace.weights_TLK[rows, lay], np.float32))
            b = blocks[lay]
            routed = b.router(x)  # the model's own router on the same inputs: does the forced routing match it?
            if isinstance(routed, tuple) and len(routed) == 3 and not routed[2].is_floating_point():
                same += int((routed[2].sort(dim=-1).values == ids.sort(dim=-1).values).all(dim=-1).sum())
                rows_n += ids.shape[0]
            ref = b.experts(x, ids, w)
            sh = next((b.block._modules[n] for n in ("shared_experts", "shared_expert") if n in b.block._modules), None)
            if sh is not None:
                ref = ref + sh(x)
            got = torch.full_like(ref, float("nan"))
            pos = {int(v): j for j, v in enumerate(rows)}
            for s in saved:
                part = s[key]
                got[[pos[int(v)] for v in part["rows"]]] = part["y"]
            err = float((got - ref).abs().max())
            worst = max(worst, err)
            ok &= bool(torch.allclose(got, ref, rtol=1e-4, atol=1e-5))
            cells += 1
    return {"cells": cells, "max_abs_err": worst, "allclose": ok,
            "router_match": None if rows_n == 0 else same / rows_n}


def predicted_bytes(plan: SlotPlan, lay: int, ids_nK: np.ndarray, src_n: np.ndarray, row_bytes: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """sim.a2a.ep_a2a_bytes for one (step, layer): per-source counts and the plan's quotas -> (sent_G, recv_G)."""
    G, E = plan.num_ranks, plan.num_experts
    K = ids_nK.shape[1]
    e = ids_nK.reshape(-1).astype(np.int64)
    g = np.repeat(src_n, K)
    ok = e >= 0
    local = np.zeros((G, E), np.int64)
    np.add.at(local, (g[ok], e[ok]), 1)
    return ep_a2a_bytes(local, plan.served_GE(lay, np.bincount(e[ok], minlength=E)), row_bytes)


def check_bytes(trace: Any, rows_of: list[np.ndarray], plans: list[SlotPlan], plan_of_step: np.ndarray,
                ranks: list[dict[str, Any]], src_of: list[np.ndarray]) -> dict[str, Any]:
    """Measured dispatch bytes of every rank, (step, layer) and repeat == sim's prediction? -> counts + totals, and
    the measured local activation rate lar (share of routed items processed on their token's rank, repeat 0).

    src_of: per step, the (n, L) rank of each row at each layer (worker.layer_ranks)."""
    H = trace.spec.hidden_size
    pred: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    items = 0
    for i, rows in enumerate(rows_of):
        ids = np.asarray(trace.experts_TLK[rows]).astype(np.int64)
        items += int((ids >= 0).sum())
        for lay in range(trace.spec.num_layers):
            pred[(i, lay)] = predicted_bytes(plans[int(plan_of_step[i])], lay, ids[:, lay], src_of[i][:, lay], H * 4)
    checked = mismatched = 0
    tot_meas = tot_pred = 0
    for rk in ranks:
        r = rk["rank"]
        for rec in rk["records"]:
            sent, recv = pred[(rec["step"], rec["layer"])]
            checked += 1
            bad = rec["sent_bytes"] != int(sent[r]) or rec["recv_bytes"] != int(recv[r])
            mismatched += int(bad)
            if rec["rep"] == 0:
                tot_meas += rec["sent_bytes"]
                tot_pred += int(sent[r])
    return {"checked": checked, "mismatched": mismatched, "equal": mismatched == 0,
            "measured_sent_bytes": tot_meas, "predicted_sent_bytes": tot_pred,
            "lar": 1.0 - tot_meas / (H * 4) / max(items, 1)}


def summarize(ranks: list[dict[str, Any]], link: LinkProfile | None) -> dict[str, Any]:
    """Per-plan figures over every (step, layer) cell: items per rank, bytes, measured and predicted all-to-all time.

    A cell's all-to-all time is the slowest rank's dispatch + combine; a2a_s sums the medians over repeats,
    a2a_min_s the minima (the least disturbed repeat on a shared machine); a2a_cell_ratio_p10_p50_p90: quantiles
    of measured / predicted over every (repeat, cell).
    """
    G = len(ranks)
    recs = [rk["records"] for rk in ranks]
    n = len(recs[0])
    reps = max(r["rep"] for r in recs[0]) + 1
    cells = n // reps
    items = np.array([[r["items"] for r in rr] for rr in recs], np.float64).reshape(G, reps, cells)[:, 0]
    sent = np.array([[r["sent_bytes"] for r in rr] for rr in recs], np.float64).reshape(G, reps, cells)[:, 0]
    recv = np.array([[r["recv_bytes"] for r in rr] for rr in recs], np.float64).reshape(G, reps, cells)[:, 0]
    def phase(name: str) -> np.ndarray:  # (R, C): the slowest rank per (repeat, cell)
        return np.array([[r[name] for r in rr] for rr in recs], np.float64).reshape(G, reps, cells).max(axis=0)
    a2a_rc = phase("t_dispatch") + phase("t_combine")
    a2a, a2a_min = np.median(a2a_rc, axis=0), a2a_rc.min(axis=0)
    comp = np.median(phase("t_compute"), axis=0)
    out: dict[str, Any] = {
        "ranks": G, "cells": cells, "repeats": reps,
        "max_items_per_rank": float(items.max(axis=0).sum()), "mean_items_per_rank": float(items.mean(axis=0).sum()),
        "a2a_bytes": int(sent.sum() * 2),  # dispatch + combine (the combine sends the same rows back)
        "a2a_s": float(a2a.sum()), "a2a_min_s": float(a2a_min.sum()), "compute_s": float(comp.sum()),
        "weight_bytes_moved": int(sum(w["bytes_in"] for rk in ranks for w in rk["weights"] if w["rep"] == 0)),
        "weight_moves": int(sum(w["moves"] for w in ranks[0]["weights"] if w["rep"] == 0)),
        "held_bytes_per_rank": [rk["held_bytes"] for rk in ranks],
    }
    out["ir_items"] = out["max_items_per_rank"] / max(out["mean_items_per_rank"], 1e-300)
    if link is not None:
        vol = np.maximum(sent, recv).max(axis=0)
        pred = 2.0 * link.time(vol)  # dispatch + combine, each alpha + V / B of the busiest rank
        ratio = a2a_rc / pred
        out["a2a_pred_s"] = float(pred.sum())
        out["a2a_rel_err"] = out["a2a_s"] / out["a2a_pred_s"] - 1.0
        out["a2a_min_rel_err"] = out["a2a_min_s"] / out["a2a_pred_s"] - 1.0
        out["a2a_cell_ratio_p10_p50_p90"] = [float(v) for v in np.percentile(ratio, [10, 50, 90])]
    return out
