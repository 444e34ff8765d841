"""Offloaded MoE inference: a transformers-5 MoE model whose routed experts live in an ExpertStore.

``OffloadedModel(model, model_dir, cfg, predictor)`` finds the MoE blocks with the capture adapters
(trace/capture_arch.py), maps every expert to its bytes in the checkpoint (tier.ExpertLayout), checks
those bytes against the loaded weights, frees the fused expert tensors and replaces each experts
module's forward: the router's choice is turned into one store access (the layer's distinct experts),
and the experts run from the store's slot pools through the model's own experts implementation.

Exactness: as each group of a layer's experts becomes ready in the store (hits at once, misses when
read), it is copied from its slots into a compact [n, ...] buffer in ascending expert order (n = the
layer's distinct experts; one buffer per fused param, kept between layers and grown to the largest n seen,
filled by index_select from the pinned slots, so a layer allocates nothing; the layer's
bookkeeping is numpy on its ids: bincount for the distinct experts, a rank table for the remap); the
model's own experts function (eager, grouped_mm or batched_mm, as its
config says) then runs once on that buffer with the ids remapped monotonically (expert -> rank), so every
GEMM row, every reduction and the accumulation order are the model's. Tested: greedy generations are
token-for-token identical to the all-resident model on both built-in models. The buffer is compute
scratch of one layer's active experts (like ExpertFlow's staging buffer), not part of the slot budget; it
lets a layer whose union exceeds the pool compute in groups (a slot is released once copied). It is also
why the offloaded forward can be faster than the all-resident one: transformers' CPU grouped_mm costs
~3 µs per expert *held* in its weight tensor (64 all-resident vs n here), measured in the benchmark.

Prefetch: a request-horizon predictor (MoE-GPS FFN, ExpertFlow's path predictor) forecasts every layer
of a step in a forward pre-hook, before layer 0; a layer-horizon one (PROBE's lookahead) forecasts layer
l+1 from layer l's router input in a hook on layer l's router. The forecast's per-layer batch sets go to
ExpertStore.prefetch (nearest layer first); each layer's true routing corrects them (store.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from routecast.common.errors import ConfigError
from routecast.runtime.offload.store import ExpertStore, StoreConfig
from routecast.runtime.offload.tier import DiskTier, ExpertLayout
from routecast.trace import DECODE, PREFILL
from routecast.trace.capture_arch import TOPK, adapter_for, find_blocks, spec_from_model

PREFETCHERS = ("none", "lookahead", "expertflow", "ffn")


@dataclass(frozen=True, kw_only=True)
class OffloadConfig:
    """budget: fast-tier expert slots. per_layer: split them per layer (else one pool). direct: try O_DIRECT
    (else posix_fadvise DONTNEED before each read). loader_threads: background readers. verify: compare
    every expert's checkpoint bytes with the loaded weights before freeing them. check: assert the store's
    slot accounting after every change. keep_weights: keep the model's own expert tensors aside (not used) so
    close() can put them back and the model be reused (demo and benchmarks; memory is then not saved). depth: a
    forecast expert reserves its slot and is read at most this many MoE layers ahead of the running one. fallback:
    eMoE's fallback (fallback.py): a token routed to an expert without a slot uses the best one with a slot."""

    budget: int
    per_layer: bool = False
    direct: bool = True
    loader_threads: int = 2
    verify: bool = True
    check: bool = False
    keep_weights: bool = False
    depth: int = 1
    fallback: bool = False


class _SlotView:
    """The experts module as its implementation sees it, with the slot pool (or a compact copy) as its weights."""

    def __init__(self, mod: nn.Module, tensors: dict[str, torch.Tensor], n: int) -> None:
        self.__dict__.update(tensors)
        self.__dict__["num_experts"] = n
        self.__dict__["_mod"] = mod

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_mod"], name)


def _checkpoint_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"--model {model_dir}: no .safetensors file; expected the checkpoint the model was loaded from.")
    return files


def _batch_sets(fc, num_tokens: int) -> np.ndarray:
    """The experts a forecast expects the step's num_tokens tokens to use: bool (l, E). Token-level: the union
    over tokens of each token's K highest-scoring experts with a positive score (one partition per row; a tie
    at the K-th score keeps every tied expert), as Forecast.batch_active_LE up to ties; distributions:
    Forecast.batch_active_LE."""
    s = fc.scores_TLE
    if s is None:
        return fc.batch_active_LE(num_tokens)
    K = min(fc.top_k, s.shape[-1])
    kth = -np.partition(-s, K - 1, axis=-1)[..., K - 1:K]
    return ((s >= kth) & (s > 0)).any(axis=0)


class OffloadedModel:
    """model (decoder-only, top-k routed, fused experts) with its routed experts in an ExpertStore.

    After construction the model's fused expert tensors are gone; ``store`` holds at most cfg.budget
    experts. ``log`` records every access (layer, experts, tokens per expert) for the replay comparison;
    ``pred_sets`` the forecast batch sets of each step (S, L, E) when a predictor runs.
    """

    def __init__(self, model: nn.Module, model_dir: str | Path, cfg: OffloadConfig, predictor: Any = None) -> None:
        adapter = adapter_for(model)
        if adapter.read != TOPK:
            raise ConfigError(f"--offload: {type(model).__name__} routes by {adapter.read}, not top-k ids; expected "
                              "a top-k routed MoE model (Mixtral, Qwen-MoE, OLMoE, DeepSeek, ...).")
        self.model = model
        self.blocks = find_blocks(model, adapter)
        if len({b.stack for b in self.blocks}) != 1:
            raise ConfigError("--offload: the model has MoE layers in several stacks; expected a decoder-only model.")
        self.spec = spec_from_model(model, self.blocks)
        self.L, self.E, self.K = self.spec.num_layers, self.spec.num_experts, self.spec.top_k
        first = self.blocks[0].experts
        params = {n: (tuple(p.shape[1:]), p.dtype) for n, p in first.named_parameters(recurse=False)
                  if p.ndim >= 2 and p.shape[0] == self.E}
        if not params:
            raise ConfigError(f"--offload: {type(first).__name__} holds no fused [E, ...] expert tensors; expected a "
                              "transformers 5 experts module (gate_up_proj / down_proj).")
        self.layout = ExpertLayout(_checkpoint_files(Path(model_dir)), [b.path for b in self.blocks], params, self.E)
        self.tier = DiskTier(self.layout, direct=cfg.direct)
        if cfg.verify:
            self._verify()
        self.store = ExpertStore(self.tier, StoreConfig(budget=cfg.budget, per_layer=cfg.per_layer,
                                                        loader_threads=cfg.loader_threads, check=cfg.check,
                                                        depth=cfg.depth,
                                                        keep_per_layer=self.K if cfg.fallback else 0))
        self.impl = getattr(getattr(first, "config", None), "_experts_implementation", None) or "eager"
        self._kept: dict[tuple[int, str], nn.Parameter] = {}
        self._compact_cap = 0
        self._compact: dict[str, torch.Tensor] = {}
        for li, b in enumerate(self.blocks):
            for n in params:
                p = b.experts._parameters.pop(n)
                if cfg.keep_weights:
                    self._kept[(li, n)] = p
            b.experts.forward = self._make_forward(li, b.experts)
        self.fallback = None
        if cfg.fallback:
            from routecast.runtime.offload.fallback import Fallback

            self.fallback = Fallback(model)
        self.predictor = predictor
        self.log: list[tuple[int, np.ndarray, np.ndarray]] = []  # (layer, experts, tokens) per access
        self.pred_sets: list[np.ndarray] = []
        self.hooks = [model.register_forward_pre_hook(self._step_start, with_kwargs=True),
                      model.register_forward_hook(self._step_end)]
        if predictor is not None and predictor.horizon == "layer":
            self.hooks += [b.router.register_forward_hook(self._router_hook(li)) for li, b in enumerate(self.blocks)]
        self.request = 0
        self._first = 1
        self._shape = (1, 0)
        self.position = 0
        self.step = 0
        self._step_ids: list[torch.Tensor | None] = [None] * self.L
        self._tokens: np.ndarray | None = None
        self.predict_s = 0.0

    # ------------------------------------------------------------------ setup
    def _verify(self) -> None:
        """Every expert's checkpoint bytes, read through the tier, equal the loaded model's weights."""
        dests = {p: torch.empty(shape, dtype=dt) for p, (shape, dt) in self.layout.params.items()}
        for li, b in enumerate(self.blocks):
            for e in range(self.E):
                self.tier.read_into(li * self.E + e, dests)
                for p, t in dests.items():
                    if not torch.equal(t, getattr(b.experts, p)[e]):
                        raise ConfigError(f"checkpoint: expert {e} of {b.path} ('{p}') read from the file differs from "
                                          "the loaded model; expected the checkpoint the model was loaded from.")
        self.tier.bytes_read = self.tier.reads = 0
        self.tier.read_s = 0.0

    def close(self) -> None:
        """Stop the loader threads, remove the hooks; with keep_weights, give the model its expert tensors back."""
        for h in self.hooks:
            h.remove()
        if self.fallback is not None:
            self.fallback.close()
        self.store.close()
        self.tier.close()
        for (li, n), p in self._kept.items():
            self.blocks[li].experts._parameters[n] = p
            self.blocks[li].experts.__dict__.pop("forward", None)
        self._kept = {}

    def preload(self) -> None:
        """Fill the fast tier before a run (layer-major, as many experts as the budget holds); the tier's
        counters restart at 0, so the run's figures count only its own reads."""
        self.store.preload(np.arange(self.L * self.E))
        self.tier.bytes_read = self.tier.reads = 0
        self.tier.read_s = 0.0

    # ------------------------------------------------------------------ the experts forward
    def _compact_buffers(self, n: int) -> dict[str, torch.Tensor]:
        """[n, ...] views of the compact buffers (one per fused param), grown to the largest n seen so far."""
        if n > self._compact_cap:
            self._compact_cap = max(n, min(self.E, 2 * self._compact_cap))
            self._compact = {p: torch.empty((self._compact_cap, *t.shape[1:]), dtype=t.dtype)
                             for p, t in self.store.pools.items()}
        return {p: t[:n] for p, t in self._compact.items()}

    def _make_forward(self, li: int, mod: nn.Module):
        cls_forward = type(mod).forward
        store, E = self.store, self.E
        rank_E = np.zeros(E, np.int64)
        arange_E = np.arange(E, dtype=np.int64)

        def forward(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
            if self.fallback is not None:
                held, full = store.held_experts(li)
                top_k_index, top_k_weights = self.fallback.reroute(li, top_k_index, top_k_weights,
                                                                   torch.from_numpy(held), full)
            ids = top_k_index.numpy()
            counts_E = np.bincount(ids.reshape(-1), minlength=E)
            uniq = np.flatnonzero(counts_E)
            n = len(uniq)
            self.log.append((li, uniq, counts_E[uniq]))
            self._step_ids[li] = top_k_index
            compact = self._compact_buffers(n)
            rank_E[uniq] = arange_E[:n]

            def compute(exps: np.ndarray, slots: np.ndarray) -> None:  # slots pinned by the store: copies only
                s = torch.from_numpy(slots)
                if len(exps) == n:  # the whole layer at once, already in expert order
                    for p, t in store.pools.items():
                        torch.index_select(t, 0, s, out=compact[p])
                else:
                    at = torch.from_numpy(rank_E[exps])
                    for p, t in store.pools.items():
                        compact[p].index_copy_(0, at, t.index_select(0, s))

            store.access(li, uniq, compute)
            ranked = top_k_index if n == E else torch.from_numpy(rank_E[ids])
            return cls_forward(_SlotView(mod, compact, n), hidden, ranked, top_k_weights)

        return forward

    # ------------------------------------------------------------------ step hooks and forecasts
    def new_request(self, n: int = 1) -> None:
        """The next forward is the prefill of `n` new requests, one per batch row (positions restart at 0)."""
        self._first = self.request + 1
        self.request += n
        self.position = 0

    def _view(self, layer: int | None = None, hidden: np.ndarray | None = None):
        from routecast.predict.harness import StepView

        return StepView(spec=self.spec, step=self.step, **self._cols, layer=layer, hidden_TlH=hidden)

    def _prefetch(self, fc, layers: list[int], current: int) -> None:
        sets = _batch_sets(fc, int(self._tokens.shape[0]))
        self.store.prefetch(layers, [lay * self.E + np.flatnonzero(sets[i]) for i, lay in enumerate(layers)],
                            current_layer=current)
        self._pred[layers] = sets

    def _step_start(self, _mod: nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or ids.ndim != 2:
            raise ConfigError("--offload: the forward got no input_ids [batch, tokens]; expected token ids.")
        self._shape = (int(ids.shape[0]), int(ids.shape[1]))
        self._tokens = tok = ids.reshape(-1).numpy()
        self._step_ids = [None] * self.L
        if self.predictor is None:
            return
        T = tok.shape[0]
        B, S = self._shape  # rows are requests _first.. (left-padded batch: positions count the padded row)
        self._cols = dict(request=self._first + np.repeat(np.arange(B, dtype=np.int64), S),
                          position=(self.position + np.tile(np.arange(S), B)).astype(np.int32), token_id=tok.astype(np.int32),
                          phase=np.full(T, PREFILL if self.position == 0 else DECODE, np.int8), task=np.zeros(T, np.int16))
        self._pred = np.zeros((self.L, self.E), bool)
        if self.predictor.horizon != "layer":
            t0 = time.perf_counter()
            fc = self.predictor.predict(self._view())
            self._prefetch(fc, list(range(self.L)), -1)
            self.predict_s += time.perf_counter() - t0

    def _router_hook(self, li: int):
        def hook(_mod: nn.Module, args: tuple, _out: Any) -> None:
            if li + 1 >= self.L:
                return
            t0 = time.perf_counter()
            h = args[0].detach().reshape(-1, args[0].shape[-1])
            hid = np.zeros((h.shape[0], li + 1, h.shape[1]), np.float32)
            hid[:, li] = h.numpy()  # the lookahead reads only the newest router input (layer li)
            fc = self.predictor.predict(self._view(li + 1, hid))
            self._prefetch(fc, [li + 1], li)
            self.predict_s += time.perf_counter() - t0
        return hook

    def _step_end(self, _mod: nn.Module, _args: tuple, _out: Any) -> None:
        self.store.end_step()
        if self.predictor is not None:
            from routecast.predict.harness import StepRouting

            t0 = time.perf_counter()
            T = self._tokens.shape[0]
            ids = np.full((T, self.L, self.K), -1, np.int16)
            for li, x in enumerate(self._step_ids):
                if x is not None:
                    ids[:, li] = x.reshape(T, -1).numpy()
            self.predictor.observe(StepRouting(spec=self.spec, step=self.step, **self._cols, experts_TLK=ids,
                                               weights_TLK=np.full(ids.shape, 1.0 / self.K, np.float32)))
            self.pred_sets.append(self._pred)
            self.predict_s += time.perf_counter() - t0
        self.position += self._shape[1]
        self.step += 1

    # ------------------------------------------------------------------ figures
    def figures(self) -> dict[str, Any]:
        s = dict(self.store.stats)
        asked = s["hits"] + s["misses"]  # a late prefetch is a hit (cache/slots.py), counted apart in "late"
        s.update(hit_ratio=s["hits"] / max(asked, 1), on_time_hit_ratio=(s["hits"] - s["late"]) / max(asked, 1),
                 bytes_read=self.tier.bytes_read, reads=self.tier.reads,
                 read_s=self.tier.read_s, tier_mode=self.tier.mode, budget=self.store.cfg.budget,
                 experts_total=self.L * self.E, expert_bytes=self.layout.expert_bytes, impl=self.impl,
                 predict_s=self.predict_s)
        if self.fallback is not None:
            s.update(self.fallback.figures())
        return s
