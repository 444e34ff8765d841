"""eMoE's fallback in the offload runtime: a token routed to an expert without a slot takes the best one with a slot.

``Fallback(model, blocks)`` keeps each MoE router's logits of the current forward (trace/override.py's router
hook and scores: the router's own choice score, sigmoid + correction bias for DeepSeek-V3-style routers) and
``reroute(layer, ids_TK, weights_TK, held_E)`` rewrites a layer's routing with override.fallback_routing: slots
whose expert holds a fast-tier slot keep it, the others take the best-scored held experts the token does not use
yet, weights renormalised over the new selection to the original total (eMoE §3.2.2). No expert is loaded for a
rerouted slot. While the layer's pool still has a free slot, or the layer holds fewer than top-k experts (a cold
cache), nothing is rerouted: its misses load on demand as without fallback (``cold_accesses``, their distinct
experts ``cold_experts``); the store never evicts a layer below top-k held experts (keep_per_layer). Rows with
every expert held are left bit-identical, so at a 100% budget (the pool never full) the outputs are the
all-resident model's.

The quality cost is measured, not hidden: ``rerouted`` / ``slots`` (share of routed (token, k) slots moved), and
run.py's greedy-token agreement and teacher-forced perplexity against the all-resident model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from routecast.trace.override import RoutingOverride, fallback_routing


class Fallback:
    """Router-logit hooks + the rerouting of one layer's (ids, weights); see the module docstring."""

    def __init__(self, model: nn.Module) -> None:
        self.ov = RoutingOverride(model)  # not installed: only its router hook and score function are used
        self.K = self.ov.spec.top_k
        self.hooks = [b.router.register_forward_hook(self.ov._router_hook(i)) for i, b in enumerate(self.ov.blocks)]
        self.rerouted = 0
        self.slots = 0
        self.cold_accesses = 0
        self.cold_experts = 0

    def reroute(self, layer: int, ids_TK: torch.Tensor, weights_TK: torch.Tensor, held_E: torch.Tensor,
                full: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """ids_TK int (T, K) and weights_TK float (T, K) of `layer`, held_E bool (E,) experts with a slot, full:
        the layer's pool has no free slot -> the rerouted (ids_TK, weights_TK) (the inputs themselves when nothing
        moves or the cache is cold)."""
        self.slots += ids_TK.numel()
        if not full or int(held_E.sum()) < self.K:
            self.cold_accesses += 1
            self.cold_experts += int(torch.unique(ids_TK[ids_TK >= 0]).numel())
            return ids_TK, weights_TK
        choice, prob = self.ov._scores(layer, ids_TK.shape[0])
        ids, w, moved = fallback_routing(ids_TK, weights_TK, choice, prob, held_E)
        self.rerouted += int(moved.sum())
        return ids, w

    def figures(self) -> dict[str, Any]:
        return {"rerouted": self.rerouted, "routed_slots": self.slots,
                "rerouted_share": self.rerouted / max(self.slots, 1), "cold_accesses": self.cold_accesses,
                "cold_experts": self.cold_experts}

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []


def token_agreement(ref: list[list[int]], got: list[list[int]]) -> float:
    """Share of generated positions (request by request, position by position) where `got` equals `ref`."""
    same = total = 0
    for a, b in zip(ref, got, strict=True):
        same += sum(x == y for x, y in zip(a, b, strict=False))
        total += max(len(a), len(b))
    return same / max(total, 1)


def perplexity(model: nn.Module, texts: list[list[int]], offloaded: Any = None) -> float:
    """Teacher-forced perplexity of `model` over token-id sequences (each one forward pass, every next token scored;
    through the offloaded engine when `offloaded` is given: each sequence is a new request)."""
    nll, n = 0.0, 0
    with torch.no_grad():
        for ids in texts:
            if len(ids) < 2:
                continue
            if offloaded is not None:
                offloaded.new_request()
            x = torch.tensor([ids], dtype=torch.long)
            logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, :-1].float()
            nll += float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
            n += len(ids) - 1
    return float(torch.exp(torch.tensor(nll / max(n, 1))))
