"""Offloaded MoE inference: a transformers-5 MoE model whose routed experts live in an ExpertStore.

``OffloadedModel(model, model_dir, cfg, predictor)`` finds the MoE blocks with the capture adapters
(trace/capture_arch.py), maps every expert to its bytes in the checkpoint (tier.ExpertLayout), checks
those bytes against the loaded weights (when the model was loaded with them; load.py loads it without), frees the
fused expert tensors and replaces each experts
module's forward: the router's choice is turned into one store access (the layer's distinct experts),
and the experts run from the store's slot pools through the model's own experts implementation.

Exactness and memory: once all of a layer's experts hold slots (hits at once, misses when read), the model's own
experts function (eager, grouped_mm or batched_mm, as its config says) runs once, the router's ids remapped (numpy
bincount for the distinct experts, a slot table for the remap): on a compact copy of those experts' slots when they
take at most OffloadConfig.compact_bytes (4 MiB: a decode step of small experts; grouped_mm's CPU cost grows with
the number of expert groups, empty ones included, so on the whole pool it grew with the budget), else on the slot
pool itself with no copy. transformers' grouped_mm sums each token's K contributions in the
router's k order, whatever the expert numbering, so the logits are bit-identical to the all-resident model's
(tested on every generation step). A layer whose distinct experts exceed its pool computes in rounds (each
round's slots are released before the next round is read; the other ids take transformers' expert-parallel
sentinel), its outputs summed: allclose, not bit-identical.

Prefetch: a request-horizon predictor (MoE-GPS FFN, ExpertFlow's path predictor) forecasts every layer
of a step in a forward pre-hook, before layer 0; PROBE's lookahead forecasts layer l+1 inside layer l's MoE block
from the hidden state the block holds (one small matmul, _lookahead); other layer-horizon predictors use a hook on
layer l's router. The forecast's per-layer batch sets go to
ExpertStore.prefetch (nearest layer first); each layer's true routing corrects them (store.py).

Reuse probe (fc-evict, `reuse_probe=`): inside layer l's MoE block, before its experts are asked for, the router
inputs of each request's last token at layers 0..l (kept from the earlier layers of the step) give row l of the
probe (predict/reuse_probe.py: one small matmul), handed to the policy (ExpertStore.reuse_row) for the evictions of
that layer and after; its time counts as predictor time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from routecast.cache.zoo import check_reuse_policy, is_fc_evict
from routecast.common.errors import ConfigError
from routecast.predict.lookahead import LookaheadPredictor
from routecast.predict.reuse_probe import probe_row
from routecast.runtime.offload.fallback import Fallback
from routecast.runtime.offload.inblock import InBlockLookahead
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
    eMoE's fallback (fallback.py): a token routed to an expert without a slot uses the best one with a slot.
    prefetch_top, prefetch_min_prob: confidence gate on a token-level forecast (_batch_sets): each token prefetches
    only its prefetch_top (0 = top-k) highest-scoring experts whose probability is at least prefetch_min_prob.
    policy: the replacement policy of the slots (cache/zoo.py: lru, lfu, arc, s3fifo, lirs, fc-evict; the same
    objects as the replay's). compact_bytes: a layer whose experts (one round) take at most this many bytes runs them
    from a compact copy of their slots instead of the whole pool (0 = never): scratch memory beyond --budget of at
    most this size, for a compute cost that no longer grows with the pool (transformers' grouped_mm on CPU pays a
    fixed cost per expert group, empty ones included). reader: 'auto' (reader processes where they run), 'process'
    or 'threads' (store.StoreConfig.reader: the reads in loader_threads child processes, reader.py, or threads).
    lookahead_first: with PROBE's lookahead, also forecast MoE layer 0 from the input of its decoder layer
    (inblock.py), each token's best `lookahead_first` experts; -1: half the top-k (rounded up) where a layer runs
    before the first MoE layer, none where that input is the token embeddings alone (a weak forecast); 0: none
    (layer 0 reads its misses on demand)."""

    budget: int
    per_layer: bool = False
    direct: bool = True
    loader_threads: int = 2
    verify: bool = True
    check: bool = False
    keep_weights: bool = False
    depth: int = 1
    fallback: bool = False
    prefetch_top: int = 0
    prefetch_min_prob: float = 0.0
    policy: str = "lru"
    compact_bytes: int = 4 << 20
    reader: str = "auto"
    lookahead_first: int = -1

    def __post_init__(self) -> None:
        if self.prefetch_top < 0:
            raise ConfigError(f"--prefetch-top is {self.prefetch_top}; expected 0 (the model's top-k) or more.")
        if self.compact_bytes < 0:
            raise ConfigError(f"compact_bytes is {self.compact_bytes}; expected 0 (never) or a byte count.")
        if self.lookahead_first < -1:
            raise ConfigError(f"lookahead_first is {self.lookahead_first}; expected -1 (half the top-k), 0 (none) or "
                              "a count of experts per token.")
        if not 0.0 <= self.prefetch_min_prob < 1.0:  # NaN fails too
            raise ConfigError(f"--prefetch-min-prob is {self.prefetch_min_prob}; expected a probability in [0, 1).")


class _SlotView:
    """The experts module as its implementation sees it, with the slot pool (or a compact copy) as its weights."""

    def __init__(self, mod: nn.Module, tensors: dict[str, torch.Tensor], n: int, sentinel: bool = False) -> None:
        self.__dict__.update(tensors)
        self.__dict__["num_experts"] = n
        self.__dict__["_mod"] = mod
        if sentinel:  # ids == n are skipped (transformers' expert-parallel sentinel): a round of a deferred layer
            self.__dict__["_is_expert_parallel"] = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_mod"], name)


def _checkpoint_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"--model {model_dir}: no .safetensors file; expected the checkpoint the model was loaded from.")
    return files


def _batch_sets(fc, num_tokens: int, top: int = 0, min_prob: float = 0.0) -> np.ndarray:
    """The experts a forecast expects the step's num_tokens tokens to use: bool (l, E). Token-level: the union
    over tokens of each token's K highest-scoring experts with a positive score (one partition per row; a tie
    at the K-th score keeps every tied expert), as Forecast.batch_active_LE up to ties; distributions:
    Forecast.batch_active_LE.
    Confidence gate (token-level only): top > 0 keeps each token's `top` (<= K) highest scores instead of K, and
    min_prob > 0 keeps only scores >= min_prob (a probability: each (t, l) row sums to 1), so a low-confidence
    forecast reads nothing."""
    s = fc.scores_TLE
    if s is None:
        return fc.batch_active_LE(num_tokens)
    K = min(fc.top_k if top <= 0 else min(top, fc.top_k), s.shape[-1])
    kth = -np.partition(-s, K - 1, axis=-1)[..., K - 1:K]
    return ((s >= kth) & (s > 0) & (s >= min_prob)).any(axis=0)


def step_use_from_ids(ids_L: list[torch.Tensor | None], first: int, B: int, S: int, E: int):
    """A step's top-k ids per layer ((B·S, K) tensors; None: the layer did not run) -> its StepUse: requests
    first..first+B-1 (one per batch row), each row's distinct layer·E + expert keys and token counts."""
    from routecast.cache.reuse import StepUse

    keys_R, counts_R = [], []
    for r in range(B):
        ks = np.concatenate([li * E + x.reshape(B, S, -1)[r].reshape(-1).numpy() for li, x in enumerate(ids_L)
                             if x is not None])
        u, c = np.unique(ks, return_counts=True)
        keys_R.append(u)
        counts_R.append(c)
    off = np.concatenate([[0], np.cumsum([len(k) for k in keys_R])]).astype(np.int64)
    return StepUse(requests=first + np.arange(B, dtype=np.int64), off=off, keys=np.concatenate(keys_R).astype(np.int64),
                   counts=np.concatenate(counts_R).astype(np.int64), tokens=np.full(B, S, np.int64))


def step_use_from_log(step_log: list[tuple[int, np.ndarray, np.ndarray]], request: int, S: int, E: int):
    """One request's step from its access-log entries ((layer, distinct experts ascending, tokens per expert), one per
    layer run, layers ascending) -> the same StepUse as step_use_from_ids, without a unique over every token's ids
    (a decode step's dozen cold numpy calls become three)."""
    from routecast.cache.reuse import StepUse

    keys = np.concatenate([li * E + u for li, u, _ in step_log]).astype(np.int64)
    return StepUse(requests=np.array([request], np.int64), off=np.array([0, len(keys)], np.int64), keys=keys,
                   counts=np.concatenate([c for _, _, c in step_log]).astype(np.int64), tokens=np.array([S], np.int64))


class OffloadedModel:
    """model (decoder-only, top-k routed, fused experts) with its routed experts in an ExpertStore.

    After construction the model's fused expert tensors are gone; ``store`` holds at most cfg.budget
    experts. ``log`` records every access (layer, experts, tokens per expert) for the replay comparison;
    ``pred_sets`` the forecast batch sets of each step (S, L, E) when a predictor runs.
    """

    def __init__(self, model: nn.Module, model_dir: str | Path, cfg: OffloadConfig, predictor: Any = None,
                 reuse_probe: Any = None, token_table: Any = None) -> None:
        adapter = adapter_for(model)
        if adapter.read != TOPK:
            raise ConfigError(f"--offload: {type(model).__name__} routes by {adapter.read}, not top-k ids; expected "
                              "a top-k routed MoE model (Mixtral, Qwen-MoE, OLMoE, DeepSeek, ...).")
        self.model, self.cfg = model, cfg
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
        self.materialised = first.get_parameter(next(iter(params))).device.type != "meta"
        if cfg.verify and self.materialised:  # (loaded without its experts: nothing to compare with)
            self._verify()
        self.store = ExpertStore(self.tier, StoreConfig(budget=cfg.budget, per_layer=cfg.per_layer,
                                                        loader_threads=cfg.loader_threads, check=cfg.check,
                                                        depth=cfg.depth, policy=cfg.policy, reader=cfg.reader,
                                                        keep_per_layer=self.K if cfg.fallback else 0))
        self.impl = getattr(getattr(first, "config", None), "_experts_implementation", None) or "eager"
        self._kept: dict[tuple[int, str], nn.Parameter] = {}
        for li, b in enumerate(self.blocks):
            for n in params:
                p = b.experts._parameters.pop(n)
                if cfg.keep_weights:
                    self._kept[(li, n)] = p
            b.experts.forward = self._make_forward(li, b.experts)
        self.fallback = Fallback(model) if cfg.fallback else None
        self.predictor = predictor
        # PROBE's lookahead runs inside the MoE block on the hidden state the block already holds (one small matmul)
        self.lookahead = predictor if isinstance(predictor, LookaheadPredictor) else None
        self.inblock = None if self.lookahead is None else InBlockLookahead(
            self.lookahead, model, self.blocks, top_k=self.K, prefetch_top=cfg.prefetch_top,
            min_prob=cfg.prefetch_min_prob,
            first=min(cfg.lookahead_first, self.K) if cfg.lookahead_first >= 0 else  # default: half the top-k, where
            (-(-self.K // 2) if self.blocks[0].layer_id > 0 else 0))  # a layer runs before the first MoE layer
        self.log: list[tuple[int, np.ndarray, np.ndarray]] = []  # (layer, experts, tokens) per access
        self.pred_sets: list[np.ndarray] = []
        self.hooks = [model.register_forward_pre_hook(self._step_start, with_kwargs=True),
                      model.register_forward_hook(self._step_end)]
        if predictor is not None and predictor.horizon == "layer" and self.lookahead is None:
            self.hooks += [b.router.register_forward_hook(self._router_hook(li)) for li, b in enumerate(self.blocks)]
        if self.inblock is not None and self.inblock.first_module is not None:
            self.hooks.append(self.inblock.first_module.register_forward_pre_hook(self._lookahead_first, with_kwargs=True))
        self.request = 0
        self._first = 1
        self._shape = (1, 0)
        self.position = 0
        self.step = 0
        self._step_ids: list[torch.Tensor | None] = [None] * self.L
        self._tokens: np.ndarray | None = None
        self._profiles = is_fc_evict(cfg.policy)  # the policy keeps per-request profiles: feed it the steps
        self._rp_W: list[np.ndarray] | None = None  # the reuse probe's weights per layer (features, K), float32
        if reuse_probe is not None:
            check_reuse_policy(cfg.policy)
            if (reuse_probe.num_layers, reuse_probe.num_experts, reuse_probe.hidden_size) != (self.L, self.E,
                                                                                            self.spec.hidden_size):
                raise ConfigError(f"--reuse-probe: fitted for L={reuse_probe.num_layers}, E={reuse_probe.num_experts}, "
                                  f"H={reuse_probe.hidden_size}; the model has L={self.L}, E={self.E}, "
                                  f"H={self.spec.hidden_size}: expected a probe fitted on a trace of this model.")
            # the bias row first: features are [1, h_0, h_1, ...], so row l is one matmul of a prefix of them
            self._rp_W = [np.ascontiguousarray(np.vstack([w[-1:], w[:-1]]), np.float32) for w in reuse_probe.weights]
            self._rp_cap = float(np.log(reuse_probe.cap))
            self._rp_inv_sqrt = reuse_probe.target == "inv-sqrt"
            H = self.spec.hidden_size
            for h in (np.zeros((1, H), np.float32), np.zeros((1, 2, H), np.float32)[:, -1]):  # decode and prefill views
                probe_row(np.ones((1, 1 + H), np.float32), h, self._rp_W[0], 0, self._rp_cap,  # compiled now, not
                          self._rp_inv_sqrt)  # in a layer
        self.token_table = None  # fc-evict's forecast of each step from its input tokens (_begin_step)
        if token_table is not None and self._profiles:
            ts = token_table.spec
            if (ts.num_layers, ts.num_experts) != (self.L, self.E) or token_table.config.key != "token":
                raise ConfigError(f"token table: a {token_table.config.key}-keyed table of L={ts.num_layers}, "
                                  f"E={ts.num_experts}; the model has L={self.L}, E={self.E}: expected a token-id table "
                                  "fitted on a trace of this model.")
            self.token_table = token_table
        self._rp_x = np.zeros((0, 0), np.float32)  # this step's [1, last-token router inputs layer after layer]: (B, 1 + L·H)
        # keep_feed (run_config(keep_feed=True)): what fc-evict got, kept for the replay of the run (run.replay_feed):
        # each step's StepUse and, with a reuse probe, its rows (B, K) in layer order. Off by default: the rows of a
        # long run of a large model would grow without bound (L·K floats a step).
        self.keep_feed = False
        self.uses: list = []
        self.next_uses: list[dict[int, np.ndarray]] = []  # each step's begin_step next_use (with a token table)
        self.reuse_rows: list[list[np.ndarray]] = []
        self.predict_s = 0.0  # the forecasts' own compute (predict + observe; fc-evict's profile upkeep), on the
        # compute thread
        self.issue_s = 0.0  # forecast + handing its sets to the store (slot decisions, queueing the reads)
        self.compact_calls = 0  # layer rounds run from a compact copy of their slots (OffloadConfig.compact_bytes)
        self.moe_s = [0.0, 0.0]  # seconds inside the store's accesses (the experts of every layer), prefill / decode
        self.moe_stall_s = [0.0, 0.0]  # of which waiting for reads

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
    def _make_forward(self, li: int, mod: nn.Module):
        cls_forward = type(mod).forward
        store, E, B, ebytes = self.store, self.E, self.cfg.budget, self.layout.expert_bytes
        slot_E = np.full(E, B, np.int64)  # expert -> its slot this round (B: the sentinel, not in this round)

        def forward(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
            if self.fallback is not None:
                held, full = store.held_experts(li)
                top_k_index, top_k_weights = self.fallback.reroute(li, top_k_index, top_k_weights,
                                                                   torch.from_numpy(held), full)
            ids = top_k_index.numpy()
            counts_E = np.bincount(ids.reshape(-1), minlength=E)
            uniq = np.flatnonzero(counts_E)
            if self.lookahead is not None and li + 1 < self.L:
                self._lookahead(li, hidden, li * E + uniq)
            if self._rp_W is not None:
                self._reuse_row(li, hidden)
            self.log.append((li, uniq, counts_E[uniq]))
            self._step_ids[li] = top_k_index
            outs: list[torch.Tensor] = []

            def compute(exps: np.ndarray, slots: np.ndarray) -> None:  # slots pinned by the store during the call
                whole = len(exps) == len(uniq)
                if whole and len(exps) * ebytes <= self.cfg.compact_bytes and len(exps) < B:
                    # the round's experts copied into a compact scratch: grouped_mm costs per group, empty or not
                    idx = torch.from_numpy(slots)
                    view = _SlotView(mod, {p: t.index_select(0, idx) for p, t in store.pools.items()}, len(exps))
                    slot_E[exps] = np.arange(len(exps))
                    self.compact_calls += 1
                else:
                    view = _SlotView(mod, store.pools, B, sentinel=not whole)
                    slot_E[exps] = slots
                outs.append(cls_forward(view, hidden, torch.from_numpy(slot_E[ids]), top_k_weights))
                slot_E[exps] = B

            t0, s0, ph = time.perf_counter(), store.stats["stall_s"], self.position > 0
            store.access(li, uniq, compute, counts_E[uniq] if self._profiles else None)
            self.moe_s[ph] += time.perf_counter() - t0  # the layer's experts: waits for reads, compute, the store
            self.moe_stall_s[ph] += store.stats["stall_s"] - s0
            return outs[0] if len(outs) == 1 else torch.stack(outs).sum(0)

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

    def _prefetch(self, fc, layers: list[int], current: int, sets: np.ndarray | None = None,
                  running: np.ndarray | None = None) -> None:
        """Forecast sets -> the store. A layer-horizon forecast (current >= 0) is made before layer `current`'s
        access: its reads are held until that access queued its own (store.prefetch hold), as the replay times them;
        running: that access's keys, never evicted by the forecast's reservations (known inside the MoE block)."""
        if sets is None:
            sets = _batch_sets(fc, int(self._tokens.shape[0]), self.cfg.prefetch_top, self.cfg.prefetch_min_prob)
        self.store.prefetch(layers, [lay * self.E + np.flatnonzero(sets[i]) for i, lay in enumerate(layers)],
                            current_layer=current, hold=current >= 0, running=() if running is None else running)
        self._pred[layers] = sets

    def _step_start(self, _mod: nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or ids.ndim != 2:
            raise ConfigError("--offload: the forward got no input_ids [batch, tokens]; expected token ids.")
        self._shape = (int(ids.shape[0]), int(ids.shape[1]))
        self._tokens = tok = ids.reshape(-1).numpy()
        if self._rp_W is not None and self.keep_feed:
            self.reuse_rows.append([])
        self._step_ids = [None] * self.L
        if self.predictor is None:
            if self._profiles:
                self._begin_step(self._first + np.arange(self._shape[0], dtype=np.int64), None)
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
            self.predict_s += time.perf_counter() - t0
            if self._profiles:  # fc-evict sees the step's forecast sets before they are prefetched
                sets = _batch_sets(fc, T, self.cfg.prefetch_top, self.cfg.prefetch_min_prob)
                self._begin_step(self._cols["request"][::S], sets)
                self._prefetch(fc, list(range(self.L)), -1, sets)
            else:
                self._prefetch(fc, list(range(self.L)), -1)
            self.issue_s += time.perf_counter() - t0
        elif self._profiles:  # a layer-horizon predictor: fc-evict's step starts with no sets (its prefetches mark them)
            self._begin_step(self._cols["request"][::S], None)

    def _begin_step(self, req: np.ndarray, sets: np.ndarray | None) -> None:
        """fc-evict's step starts (rows = requests `req`, the forecast sets if any): with each request's tokens in
        the step and, with a token table, its forecast of the step from its input tokens (ConditionalPredictor.
        step_use: a prefill's prompt, a decode step's last sampled token; a left-padded row's pads count as tokens),
        kept with keep_feed for the replay (run.replay_feed). Its time is predictor time."""
        t0 = time.perf_counter()
        B, S = self._shape
        kw: dict[str, Any] = {"tokens": np.full(B, S, np.int64)} if S > 1 else {}  # None: one token each
        if self.token_table is not None:
            tok = self._tokens.reshape(B, S)
            kw["next_use"] = {int(r): self.token_table.step_use(tok[i]) for i, r in enumerate(req.tolist())}
        if self.keep_feed:
            self.next_uses.append(kw.get("next_use", {}))
        self.store.begin_step(req, sets, **kw)
        self.predict_s += time.perf_counter() - t0

    def _reuse_row(self, li: int, hidden: torch.Tensor) -> None:
        """Row li of the reuse probe from each request's last token's router inputs at layers 0..li -> the policy."""
        t0 = time.perf_counter()
        B, S = self._shape
        t = hidden if hidden.dtype == torch.float32 else hidden.float()
        h = (t.detach() if t.requires_grad else t).numpy().reshape(B, S, -1)[:, -1]
        H = h.shape[1]
        if self._rp_x.shape != (B, 1 + self.L * H):
            self._rp_x = np.ones((B, 1 + self.L * H), np.float32)
        # numpy, then one compiled call (h written into x, whose earlier layers' parts their blocks wrote this step;
        # multiply; clip): each distinct torch or numpy call costs the compute thread tens of µs cold inside a layer
        logd = probe_row(self._rp_x, h, self._rp_W[li], li, self._rp_cap, self._rp_inv_sqrt)
        self.store.reuse_row(li, logd)
        if self.keep_feed:
            self.reuse_rows[-1].append(logd)
        self.predict_s += time.perf_counter() - t0

    def _lookahead(self, li: int, hidden: torch.Tensor, running: np.ndarray) -> None:
        """Layer li's router input hidden (T, H) -> PROBE's forecast of layer li+1 (the frozen next gate, plus the
        residual MLP where fitting made it non-zero: one small matmul), each token's top-k by the router's own rule
        (sigmoid + correction and group limit where the router has them; probabilities only when a confidence gate
        needs them), the union prefetched. Runs inside the MoE block: no hook, no numpy copy of the hidden state;
        `running` (layer li's keys, from its router) keeps its slots."""
        t0 = time.perf_counter()
        sets = self.inblock.next_sets(li, hidden)
        self.predict_s += time.perf_counter() - t0
        self._prefetch(None, [li + 1], li, sets, running)
        self.issue_s += time.perf_counter() - t0

    def _lookahead_first(self, _mod: nn.Module, args: tuple, kwargs: dict) -> None:
        """The decoder layer holding MoE layer 0 starts: PROBE's forecast of layer 0 from its input (inblock.py), its
        reads queued now, one attention ahead of the layer's own access."""
        t0 = time.perf_counter()
        hidden = args[0] if args else kwargs["hidden_states"]
        sets = self.inblock.first_sets(hidden)
        self.predict_s += time.perf_counter() - t0
        self._prefetch(None, [0], -1, sets)
        self.issue_s += time.perf_counter() - t0

    def _router_hook(self, li: int):
        def hook(_mod: nn.Module, args: tuple, _out: Any) -> None:
            if li + 1 >= self.L:
                return
            t0 = time.perf_counter()
            h = args[0].detach().reshape(-1, args[0].shape[-1])
            hid = np.zeros((h.shape[0], li + 1, h.shape[1]), np.float32)
            hid[:, li] = h.numpy()  # the lookahead reads only the newest router input (layer li)
            fc = self.predictor.predict(self._view(li + 1, hid))
            self.predict_s += time.perf_counter() - t0
            self._prefetch(fc, [li + 1], li)
            self.issue_s += time.perf_counter() - t0
        return hook

    def _step_use(self):
        """The step's routing per request (batch row) as a cache.reuse.StepUse (fc-evict's profiles)."""
        B, S = self._shape
        if B == 1:  # one request: the step's access-log entries (one per layer run) are its use, already unique
            ran = sum(x is not None for x in self._step_ids)
            return step_use_from_log(self.log[len(self.log) - ran:], self._first, S, self.E)
        return step_use_from_ids(self._step_ids, self._first, B, S, self.E)

    def _step_end(self, _mod: nn.Module, _args: tuple, _out: Any) -> None:
        t0 = time.perf_counter()
        if self._profiles:  # fc-evict's request profiles are its forecast: their upkeep is predictor time
            use = self._step_use()
            if self.keep_feed:
                self.uses.append(use)
            self.store.end_step(use)
            self.predict_s += time.perf_counter() - t0
        else:
            self.store.end_step(None)
        if self.lookahead is not None and not self.lookahead.config.online:  # its observe would do nothing
            self.pred_sets.append(self._pred)
        elif self.predictor is not None:
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
                 experts_total=self.L * self.E, expert_bytes=self.layout.expert_bytes, impl=self.impl, policy=self.cfg.policy,
                 predict_s=self.predict_s, issue_s=self.issue_s, compact_calls=self.compact_calls,
                 experts_prefill_s=self.moe_s[0], experts_decode_s=self.moe_s[1], stall_prefill_s=self.moe_stall_s[0],
                 stall_decode_s=self.moe_stall_s[1])
        if self.fallback is not None:
            s.update(self.fallback.figures())
        return s
