"""One rank of an expert-parallel MoE layer: its slots' expert weights, dispatch / compute / combine with
torch.distributed.all_to_all_single and split sizes, and the weight exchange a re-plan implies.

Legend: G ranks, E experts, K top-k, H hidden, I expert FFN width, n this rank's tokens, N all tokens of the
step, R rows this rank receives, M weight moves.

Every rank knows the step's whole routing (forced from a trace, so every plan sees the same work), hence the
global token -> slot assignment (place.slots.assign_items) and every split size without exchanging counts.
A rank's send buffer holds its items ordered by destination rank (then token order); it receives, from each
source rank in rank order, that rank's items for it in token order; the combine runs the same exchange backwards.
Only hidden rows travel (no routing weights): the source scales by its weights and sums over k.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from routecast.place.slots import SlotPlan, assign_items, hosted


@dataclass
class RankExperts:
    """The expert weights one rank holds: per MoE layer, expert -> (gate_up (2I, H), down (H, I)) fp32.

    act: the experts' activation (SiLU for both built-in models); shared: per layer the shared-expert module
    (replicated on every rank, as DP attention replicates it) or None.
    """

    rank: int
    world: int
    layers: list[dict[int, tuple[torch.Tensor, torch.Tensor]]]
    act: Any
    shared: list[Any]

    def expert_bytes(self) -> int:
        """Bytes of one routed expert (gate_up + down)."""
        for lay in self.layers:
            for gu, dn in lay.values():
                return gu.numel() * gu.element_size() + dn.numel() * dn.element_size()
        return 0

    def held_bytes(self) -> int:
        return sum(gu.numel() * gu.element_size() + dn.numel() * dn.element_size()
                   for lay in self.layers for gu, dn in lay.values())


def rank_experts(blocks: list[Any], plan: SlotPlan, rank: int, world: int) -> RankExperts:
    """Copy this rank's hosted experts out of transformers MoE blocks (fused `experts.gate_up_proj` [E, 2I, H] and
    `experts.down_proj` [E, H, I], the transformers-5 layout) -> RankExperts; the caller then drops the model."""
    held = hosted(plan)[:, :, rank]
    layers = []
    for lay, b in enumerate(blocks):
        gu, dn = b.experts.gate_up_proj.detach(), b.experts.down_proj.detach()
        layers.append({int(e): (gu[e].clone(), dn[e].clone()) for e in np.flatnonzero(held[lay])})
    shared = [next((b.block._modules[n] for n in ("shared_experts", "shared_expert") if n in b.block._modules), None)
              for b in blocks]
    return RankExperts(rank=rank, world=world, layers=layers, act=blocks[0].experts.act_fn, shared=shared)


@dataclass
class LayerRecord:
    """What one rank measured for one (step, layer): item counts, bytes and seconds.

    send_items_G / recv_items_G: dispatch split sizes (rows) to / from each rank (self included);
    sent_bytes / recv_bytes: dispatch bytes over the link (self excluded; the combine moves the same, reversed);
    items: rows this rank's experts processed (its load); t_dispatch, t_compute, t_combine: seconds.
    """

    send_items_G: list[int]
    recv_items_G: list[int]
    sent_bytes: int
    recv_bytes: int
    items: int
    t_dispatch: float
    t_compute: float
    t_combine: float


@dataclass
class Router:
    """The step's global routing and where its tokens live: ids (N, K) int64, src (N,) rank of each token."""

    ids_NK: np.ndarray
    src_N: np.ndarray
    cache: dict = field(default_factory=dict)


def _timed_a2a(out: torch.Tensor, inp: torch.Tensor, out_split: list[int], in_split: list[int], sync: bool) -> float:
    if sync:
        dist.barrier()
    t0 = time.perf_counter()
    dist.all_to_all_single(out, inp, output_split_sizes=out_split, input_split_sizes=in_split)
    return time.perf_counter() - t0


def moe_layer(store: RankExperts, plan: SlotPlan, lay: int, x_nH: torch.Tensor, w_nK: torch.Tensor, route: Router,
              *, sync: bool = True, shared: bool = True) -> tuple[torch.Tensor, LayerRecord]:
    """Routed experts (+ shared experts) of MoE layer `lay` for this rank's n tokens -> ((n, H) output, record).

    x_nH: this rank's tokens (the rows of route with src == rank, in order); w_nK: their routing weights;
    shared=False leaves the shared experts to the caller (the transformers block adds them itself).
    """
    G, r = store.world, store.rank
    K = route.ids_NK.shape[1]
    e_N = route.ids_NK.reshape(-1).astype(np.int64)
    src_N = np.repeat(route.src_N, K)
    slot_N = assign_items(e_N, src_N, plan, lay)
    rank_s = plan.rank_of_slot()
    dst_N = np.where(slot_N >= 0, rank_s[np.maximum(slot_N, 0)], -1)
    mine = np.flatnonzero(src_N == r)  # this rank's items, token order; item i of token i // K locally
    dst_mine = dst_N[mine]
    keep = np.flatnonzero(dst_mine >= 0)
    perm = keep[np.argsort(dst_mine[keep], kind="stable")]
    send = np.bincount(dst_mine[keep], minlength=G)
    into = np.flatnonzero(dst_N == r)
    into = into[np.argsort(src_N[into], kind="stable")]
    recv = np.bincount(src_N[into], minlength=G)
    H = x_nH.shape[1]
    send_buf = x_nH[torch.from_numpy(perm // K)]
    recv_buf = x_nH.new_empty((into.size, H))
    t_disp = _timed_a2a(recv_buf, send_buf, recv.tolist(), send.tolist(), sync)

    t0 = time.perf_counter()
    out_buf = torch.zeros_like(recv_buf)
    experts = store.layers[lay]
    e_rows = e_N[into]
    for e in np.unique(e_rows):
        rows = torch.from_numpy(np.flatnonzero(e_rows == e))
        gu, dn = experts[int(e)]
        gate, up = F.linear(recv_buf[rows], gu).chunk(2, dim=-1)
        out_buf[rows] = F.linear(store.act(gate) * up, dn)
    t_comp = time.perf_counter() - t0

    back = x_nH.new_empty((perm.size, H))
    t_comb = _timed_a2a(back, out_buf, send.tolist(), recv.tolist(), sync)
    item_out = x_nH.new_zeros((mine.size, H))
    item_out[torch.from_numpy(perm)] = back
    w_items = w_nK.reshape(-1, 1).to(x_nH.dtype)
    y = (item_out * w_items).reshape(-1, K, H).sum(dim=1)
    if shared and store.shared[lay] is not None:
        y = y + store.shared[lay](x_nH)
    row = H * x_nH.element_size()
    from_others = recv_buf[recv_rows_from_others(recv, r)]  # what crossed the link into this rank
    rec = LayerRecord(send_items_G=send.tolist(), recv_items_G=recv.tolist(), sent_bytes=int(send.sum() - send[r]) * row,
                      recv_bytes=from_others.numel() * from_others.element_size(), items=int(into.size),
                      t_dispatch=t_disp, t_compute=t_comp, t_combine=t_comb)
    return y, rec


def recv_rows_from_others(recv_G: np.ndarray, rank: int) -> torch.Tensor:
    """Row index of the receive buffer excluding the block this rank sent itself."""
    start = int(recv_G[:rank].sum())
    idx = np.concatenate([np.arange(start), np.arange(start + int(recv_G[rank]), int(recv_G.sum()))])
    return torch.from_numpy(idx.astype(np.int64))


def move_weights(store: RankExperts, old: SlotPlan, new: SlotPlan, moves_M4: np.ndarray, *, sync: bool = True
                 ) -> tuple[int, int, float]:
    """Exchange the copies `new` needs (rows (layer, expert, src, dst) from slot_plans.weight_moves) in one
    all_to_all_single, then keep exactly the experts `new` places on this rank -> (bytes in, bytes out, seconds)."""
    G, r = store.world, store.rank
    m = np.asarray(moves_M4, np.int64).reshape(-1, 4)
    out_rows = m[m[:, 2] == r]
    out_rows = out_rows[np.argsort(out_rows[:, 3], kind="stable")]
    in_rows = m[m[:, 3] == r]
    in_rows = in_rows[np.argsort(in_rows[:, 2], kind="stable")]
    per = store.expert_bytes() // 4
    if per == 0:
        raise RuntimeError(f"rank {r} holds no expert weights; expected every rank to host at least one expert")
    pieces = [torch.cat([store.layers[lay][e][0].reshape(-1), store.layers[lay][e][1].reshape(-1)])
              for lay, e, _, _ in out_rows]
    send_buf = torch.cat(pieces) if pieces else torch.empty(0)
    send = np.bincount(out_rows[:, 3], minlength=G) * per
    recv = np.bincount(in_rows[:, 2], minlength=G) * per
    recv_buf = torch.empty(int(recv.sum()))
    t = _timed_a2a(recv_buf, send_buf, recv.tolist(), send.tolist(), sync)
    gu0, dn0 = next(v for lay in store.layers for v in lay.values())
    gu_shape, dn_shape = gu0.shape, dn0.shape
    n_gu = int(np.prod(gu_shape))
    got = {}
    for i, (lay, e, _, _) in enumerate(in_rows):
        flat = recv_buf[i * per:(i + 1) * per]
        got[(int(lay), int(e))] = (flat[:n_gu].reshape(gu_shape).clone(), flat[n_gu:].reshape(dn_shape).clone())
    want = hosted(new)[:, :, r]
    for lay in range(new.num_layers):
        cur = store.layers[lay]
        store.layers[lay] = {int(e): cur[int(e)] if int(e) in cur else got[(lay, int(e))] for e in np.flatnonzero(want[lay])}
    return int(recv_buf.numel() * 4), int(send_buf.numel() * 4), t
