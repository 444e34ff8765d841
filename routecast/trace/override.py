"""Routing override in the real forward pass of a transformers-5 MoE model: resident experts + fallback, or random routing.

eMoE (§3.2.2) keeps only some experts of each MoE layer in device memory; "if the expert selected for a
token is not on the GPU, the token is routed to the next top-k expert that is on the GPU". This module
does that inside the model's own forward pass, on any architecture whose MoE block calls
``experts(hidden[T,H], ids[T,K], weights[T,K])`` (the TOPK adapters of ``capture_arch.py``: Mixtral,
Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3, GLM-4-MoE, GPT-OSS, PhiMoE, GraniteMoE, DBRX):

- a forward hook on each block's router keeps this call's router logits [T,E];
- a forward pre-hook on each block's ``experts`` rewrites (ids, weights) before the experts run.

Fallback, per token and layer (legend: T rows of the forward, E experts, K top-k): the slots whose expert is
resident keep it; each other slot takes the next-best resident expert that the token does not already use,
best by the router's own choice score (the logits; sigmoid(logits) + e_score_correction_bias for the
DeepSeek-V3 / GLM-4 routers, whose bias picks experts). The group limit of grouped routers is not applied
to substitutes (a token's groups may hold no resident expert). Weights are renormalised over the token's
new selection: w'_k = p(e'_k) / sum_j p(e'_j) * sum_j w_j, with p the router's gate probability (softmax of
the logits, or the sigmoid score), so the token's total gate mass is kept and, for routers that normalise
their top-k weights (Mixtral, DeepSeek-V3, ...), the result is exactly what the router returns when it may
pick only resident experts. Rows with every chosen expert resident are left bit-identical, so with every
expert resident the model's logits are exactly the original ones.

Random routing (task sensitivity profiling, eMoE §2.2.3): in the chosen layers each token's K experts are
replaced by K distinct experts drawn uniformly (seeded), its weights kept in slot order.

``desired()`` returns the routing the routers asked for (before any rewrite), per layer and forward: what a
predictor or an LRU policy observes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from routecast.common.errors import ConfigError
from routecast.trace.capture_arch import TOPK, adapter_for, find_blocks, read_experts_args, spec_from_model
from routecast.trace.spec import MoESpec


def _find_routing_args(args: tuple, kwargs: dict) -> tuple[str, Any, str, Any]:
    """Where ids and weights sit in an experts() call: (('a'|'k'), index or key) for each."""
    items = [("a", i, t) for i, t in enumerate(args)] + [("k", k, t) for k, t in kwargs.items()]
    tens = [(w, i, t) for w, i, t in items if isinstance(t, torch.Tensor)]
    ids = next(((w, i) for w, i, t in tens if not t.is_floating_point()), None)
    floats = [(w, i, t) for w, i, t in tens if t.is_floating_point()][1:]  # the first float is the hidden state
    if ids is None:
        raise ConfigError("experts(): no integer routing tensor among its arguments; expected (hidden, ids, weights).")
    n = dict(((w, i), t) for w, i, t in tens)[ids].shape[0]
    wt = next(((w, i) for w, i, t in floats if t.shape[0] == n), None)
    if wt is None:
        raise ConfigError(f"experts(): no routing-weight tensor with {n} rows; expected (hidden, ids, weights).")
    return ids[0], ids[1], wt[0], wt[1]


def fallback_routing(
    ids_TK: torch.Tensor, weights_TK: torch.Tensor, choice_TE: torch.Tensor, prob_TE: torch.Tensor,
    resident_E: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """eMoE fallback of one layer -> (ids_TK, weights_TK, rerouted_TK bool).

    ids_TK int: the router's top-k; weights_TK float: its weights; choice_TE float: the score the router ranks
    experts by; prob_TE float: the gate probability of every expert; resident_E bool with at least K set.
    Non-resident slots take the best-ranked resident experts the token does not use yet; rows with a rerouted
    slot get weights p(e') / sum p(e') * sum(w). Unchanged rows are returned bit-identical.
    """
    T, K = ids_TK.shape
    E = resident_E.shape[0]
    idx = ids_TK.long()
    keep = resident_E[idx.clamp(min=0)] & (idx >= 0)
    if bool(keep.all()):
        return ids_TK, weights_TK, ~keep
    used = torch.zeros(T, E + 1, dtype=torch.bool, device=ids_TK.device)
    used.scatter_(1, torch.where(keep, idx, E), True)
    cand = resident_E[None, :] & ~used[:, :E]
    ranked = choice_TE.float().masked_fill(~cand, float("-inf")).topk(K, dim=-1).indices  # best resident first
    slot = (torch.cumsum((~keep).long(), dim=1) - 1).clamp(min=0)  # j-th rerouted slot takes the j-th candidate
    new = torch.where(keep, idx, ranked.gather(1, slot))
    row = ~keep.all(dim=1, keepdim=True)
    p = prob_TE.float().gather(1, new)
    w = p / p.sum(dim=1, keepdim=True).clamp(min=1e-20) * weights_TK.float().sum(dim=1, keepdim=True)
    out_w = torch.where(row, w.to(weights_TK.dtype), weights_TK)
    return new.to(ids_TK.dtype), out_w, ~keep


class RoutingOverride:
    """Context manager rewriting the routing of an HF MoE model's forward passes.

    with RoutingOverride(model) as ov:
        ov.set_resident(resident_LE)          # bool (L, E): experts kept per MoE layer; None = all
        ov.set_random({0, 1}, seed=0)         # MoE layer indices routed at random (profiling)
        model(input_ids)
    ov.desired()   -> list over forwards of int64 (T, L, K): what the routers asked for
    ov.rerouted_L  -> int64 (L,): slots rerouted by the fallback since the last reset_counts()

    Layers are MoE layer indices 0..L-1 (spec.layer_ids maps them to model layers).
    """

    def __init__(self, model: nn.Module, *, record: bool = False) -> None:
        self.model = model
        self.adapter = adapter_for(model)
        if self.adapter.read != TOPK:
            raise ConfigError(
                f"model: routing override needs a router that hands (ids, weights) to its experts; "
                f"{type(model).__name__} routes by a {self.adapter.read} tensor (Switch / Llama 4 are not supported)."
            )
        self.blocks = find_blocks(model, self.adapter)
        self.spec: MoESpec = spec_from_model(model, self.blocks)
        self.record = bool(record)
        L, E = self.spec.num_layers, self.spec.num_experts
        self._resident: torch.Tensor | None = None
        self._random: frozenset[int] = frozenset()
        self._gen = torch.Generator().manual_seed(0)
        self._logits: list[torch.Tensor | None] = [None] * L
        self._desired: list[list[torch.Tensor]] = [[] for _ in range(L)]
        self._handles: list[Any] = []
        self.rerouted_L = np.zeros(L, np.int64)
        self.slots_L = np.zeros(L, np.int64)
        self._E = E

    # ------------------------------------------------------------------ configuration
    def set_resident(self, resident_LE: np.ndarray | torch.Tensor | None) -> None:
        """bool (L, E) resident experts per MoE layer (None: all resident, the model unchanged)."""
        if resident_LE is None:
            self._resident = None
            return
        r = torch.as_tensor(np.asarray(resident_LE), dtype=torch.bool)
        L, E, K = self.spec.num_layers, self.spec.num_experts, self.spec.top_k
        if tuple(r.shape) != (L, E):
            raise ConfigError(f"resident set has shape {tuple(r.shape)}; expected (L, E) = ({L}, {E}).")
        short = torch.nonzero(r.sum(1) < K).flatten().tolist()
        if short:
            raise ConfigError(f"resident set holds fewer than top-k = {K} experts in MoE layer(s) {short}; "
                              f"expected at least {K} per layer so every token keeps {K} experts.")
        self._resident = r

    def set_random(self, layers: set[int] | frozenset[int] | list[int], seed: int = 0) -> None:
        """Route MoE layers `layers` at random (uniform distinct experts, seeded), others as configured."""
        bad = [x for x in layers if not 0 <= int(x) < self.spec.num_layers]
        if bad:
            raise ConfigError(f"random layers {bad} are out of range; expected MoE layer indices 0..{self.spec.num_layers - 1}.")
        self._random = frozenset(int(x) for x in layers)
        self._gen = torch.Generator().manual_seed(int(seed))

    def reset_counts(self) -> None:
        self.rerouted_L[:] = 0
        self.slots_L[:] = 0

    def desired(self) -> list[np.ndarray]:
        """The routers' own choices of every forward since the last call, int64 (T, L, K) each; then forgets them."""
        n = len(self._desired[0])
        out = [torch.stack([self._desired[l][c] for l in range(self.spec.num_layers)], 1).numpy() for c in range(n)]
        self._desired = [[] for _ in range(self.spec.num_layers)]
        return out

    # ------------------------------------------------------------------ hooks
    def _router_hook(self, layer: int):
        at = self.adapter.logits_at

        def hook(_m: nn.Module, _args: tuple, out: Any) -> None:
            self._logits[layer] = out if at is None else out[at]

        return hook

    def _scores(self, layer: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(choice_TE, prob_TE) of this call's router logits."""
        lg = self._logits[layer]
        if lg is None:
            raise ConfigError(f"MoE layer {layer}: the experts ran before the router; expected router then experts.")
        lg = lg.reshape(T, -1).float()
        bias = getattr(self.blocks[layer].router, "e_score_correction_bias", None)
        if bias is not None:  # sigmoid routers: the bias picks experts, the sigmoid weighs them
            s = lg.sigmoid()
            return s + bias.float(), s
        return lg, lg.softmax(dim=-1)

    def _experts_hook(self, layer: int):
        def hook(_m: nn.Module, args: tuple, kwargs: dict):
            wi, ii, ww, wk = _find_routing_args(args, kwargs)
            a = list(args)
            get = lambda w, i: a[i] if w == "a" else kwargs[i]  # noqa: E731
            ids, wts = get(wi, ii), get(ww, wk)
            K = self.spec.top_k
            ids2, wts2 = ids.reshape(-1, K), wts.reshape(-1, K)
            if self.record:
                self._desired[layer].append(ids2.detach().long().clone().cpu())
            self.slots_L[layer] += ids2.numel()
            if layer in self._random:
                T = ids2.shape[0]
                new = torch.rand(T, self._E, generator=self._gen).argsort(dim=1)[:, :K].to(ids.dtype)
                new_w = wts2
                self.rerouted_L[layer] += int((new != ids2).sum())
            elif self._resident is not None:
                T = ids2.shape[0]
                choice, prob = self._scores(layer, T)
                new, new_w, moved = fallback_routing(ids2, wts2, choice, prob, self._resident[layer].to(ids.device))
                self.rerouted_L[layer] += int(moved.sum())
            else:
                return None
            new, new_w = new.reshape(ids.shape), new_w.reshape(wts.shape)
            if wi == "a":
                a[ii] = new
            else:
                kwargs[ii] = new
            if ww == "a":
                a[wk] = new_w
            else:
                kwargs[wk] = new_w
            return tuple(a), kwargs

        return hook

    def install(self) -> RoutingOverride:
        if self._handles:
            return self
        for i, b in enumerate(self.blocks):
            self._handles.append(b.router.register_forward_hook(self._router_hook(i)))
            self._handles.append(b.experts.register_forward_pre_hook(self._experts_hook(i), with_kwargs=True))
        return self

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._logits = [None] * self.spec.num_layers

    def __enter__(self) -> RoutingOverride:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.remove()


__all__ = ["RoutingOverride", "fallback_routing", "read_experts_args"]
