"""PROBE's gate-initialised lookahead predictor (§4.2, eq. 7), distilled offline or online.

For each MoE layer l >= 1 the predictor clones layer l's router as a frozen prior and applies it to the
router input of the previous MoE layer, h_{l-1} (hidden_TLH[:, l-1], known one layer ahead):

    logits_l = W_l h_{l-1} + b_l + W2_l SiLU(W1_l h_{l-1} + c1_l) + c2_l          (eq. 7)

W2_l and c2_l start at zero, so the untrained predictor is exactly the frozen-gate prior. The router's
rule turns logits into the forecast: Mixtral-style softmax, or DeepSeek-V3-style sigmoid with the
score-correction bias and group-limited choice (DeepSeek-V2 group-limited softmax too); the forecast row
is the router's selection score renormalised over the experts its group limit leaves, so its top-K is
the set that router would pick from those logits.

Layer 0 has no earlier router input. Its forecast is the request-horizon fallback: the share of layer-0
routing slots per expert in the training trace (and, online, in every observed step), a distribution.

Distillation (the residual only; the prior stays frozen): cross-entropy between the predictor's
softmax and the router's probabilities softmax(logits_TLE) for softmax routers, per-expert binary
cross-entropy against sigmoid(logits_TLE) for sigmoid routers, Adam. Offline: ``fit(trace)`` runs
``epochs`` passes over shuffled tokens. Online (``online=True``): after ``observe`` of each step, the
step's tokens enter a bounded replay buffer (the newest ``buffer_tokens``) and ``online_updates``
Adam steps run on minibatches drawn from it; ``reset`` returns to the post-fit weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from routecast.common.errors import ConfigError
from routecast.predict.forecast import Forecast
from routecast.predict.frequency import slot_counts_LE
from routecast.predict.harness import LAYER, Predictor, StepRouting, StepView
from routecast.predict.neural import torch_threads
from routecast.trace import MoESpec, Trace

SOFTMAX, SIGMOID = "softmax", "sigmoid"
GROUP_MAX, GROUP_TOP2 = "max", "top2"  # DeepSeek-V2 (max prob per group) / V3 (sum of the top 2 scores)
_SIGMOID_TYPES = ("deepseek_v3", "glm4_moe")


@dataclass(frozen=True, kw_only=True)
class RouterRule:
    """How a router turns logits into its choice.

    scoring: "softmax" or "sigmoid". n_group / topk_group: group-limited choice (1 / 1 = none);
    group_score: "max" (DeepSeek-V2) or "top2" (DeepSeek-V3) per-group score.
    """

    scoring: str = SOFTMAX
    n_group: int = 1
    topk_group: int = 1
    group_score: str = GROUP_MAX

    def __post_init__(self) -> None:
        if self.scoring not in (SOFTMAX, SIGMOID) or self.group_score not in (GROUP_MAX, GROUP_TOP2):
            raise ConfigError(
                f"RouterRule has scoring {self.scoring!r}, group_score {self.group_score!r}; expected "
                f"scoring in {(SOFTMAX, SIGMOID)} and group_score in {(GROUP_MAX, GROUP_TOP2)}."
            )
        if not 1 <= self.topk_group <= self.n_group:
            raise ConfigError(f"RouterRule has topk_group {self.topk_group}, n_group {self.n_group}; expected 1..n_group.")

    def forecast(self, logits_xE: torch.Tensor, correction_xE: torch.Tensor) -> torch.Tensor:
        """Router logits (..., E) -> forecast rows (..., E) float32 summing to 1, top-K = the router's pick.

        correction_xE: score-correction bias (sigmoid routers; zeros otherwise), broadcast to logits.
        """
        logits = logits_xE.float()
        if self.scoring == SOFTMAX:
            score = logits.softmax(-1)
        else:  # the sigmoid score plus correction decides; it may be negative, so shift to >= 0 per row
            score = logits.sigmoid() + correction_xE
        if self.n_group > 1:
            E = score.shape[-1]
            grouped = score.reshape(*score.shape[:-1], self.n_group, E // self.n_group)
            g = grouped.amax(-1) if self.group_score == GROUP_MAX else grouped.topk(2, dim=-1).values.sum(-1)
            keep = torch.zeros_like(g).scatter_(-1, g.topk(self.topk_group, dim=-1).indices, 1.0).bool()
            keep = keep.unsqueeze(-1).expand(grouped.shape).reshape(score.shape)
        else:
            keep = torch.ones_like(score, dtype=torch.bool)
        if self.scoring == SIGMOID:
            score = score - score.amin(-1, keepdim=True) + 1e-6
        score = torch.where(keep, score, torch.zeros_like(score))
        return score / score.sum(-1, keepdim=True)


@dataclass(frozen=True, kw_only=True)
class LookaheadConfig:
    """Residual MLP size, distillation and online settings (sizes in elements).

    epochs: offline passes over the training tokens in fit (0 = keep the frozen-gate prior).
    online: after each observed step, add its tokens to a replay buffer of the newest buffer_tokens
    tokens and run online_updates Adam steps of batch_size tokens drawn from it.
    """

    mlp_dim: int = 64
    epochs: int = 8
    batch_size: int = 256
    lr: float = 1e-3
    online: bool = False
    buffer_tokens: int = 4096
    online_updates: int = 1
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        for f in ("mlp_dim", "batch_size", "buffer_tokens", "online_updates", "threads"):
            if getattr(self, f) < 1:
                raise ConfigError(f"LookaheadConfig.{f} is {getattr(self, f)}; expected a positive integer.")
        if self.epochs < 0 or self.lr <= 0:
            raise ConfigError(f"LookaheadConfig has epochs {self.epochs}, lr {self.lr}; expected epochs >= 0 and lr > 0.")


class _Residual(nn.Module):
    """Frozen priors and residual MLPs of the L-1 target layers, batched over layers.

    prior_W (L-1, E, H), prior_b / correction (L-1, E): buffers. W1 (L-1, H, D), c1 (L-1, D),
    W2 (L-1, D, E) = 0, c2 (L-1, E) = 0: trainable.
    """

    def __init__(self, prior_W: torch.Tensor, prior_b: torch.Tensor, correction: torch.Tensor, mlp_dim: int,
                 seed: int) -> None:
        super().__init__()
        n, E, H = prior_W.shape
        self.register_buffer("prior_W", prior_W.float().contiguous())
        self.register_buffer("prior_b", prior_b.float().contiguous())
        self.register_buffer("correction", correction.float().contiguous())
        g = torch.Generator().manual_seed(seed)
        self.W1 = nn.Parameter(torch.randn(n, H, mlp_dim, generator=g) / H**0.5)
        self.c1 = nn.Parameter(torch.zeros(n, mlp_dim))
        self.W2 = nn.Parameter(torch.zeros(n, mlp_dim, E))
        self.c2 = nn.Parameter(torch.zeros(n, E))

    def forward(self, h_NnH: torch.Tensor) -> torch.Tensor:
        """Router inputs of the source layers (N, n, H) -> predicted logits of the target layers (N, n, E)."""
        prior = torch.einsum("nlh,leh->nle", h_NnH, self.prior_W) + self.prior_b
        mid = F.silu(torch.einsum("nlh,lhd->nld", h_NnH, self.W1) + self.c1)
        return prior + torch.einsum("nld,lde->nle", mid, self.W2) + self.c2

    def one(self, layer: int, h_TH: torch.Tensor) -> torch.Tensor:
        """Target index `layer` (0-based over the L-1 targets) for h (T, H) -> logits (T, E)."""
        mid = F.silu(h_TH @ self.W1[layer] + self.c1[layer])
        return h_TH @ self.prior_W[layer].T + self.prior_b[layer] + mid @ self.W2[layer] + self.c2[layer]


def _loss(rule: RouterRule, pred_NnE: torch.Tensor, true_NnE: torch.Tensor) -> torch.Tensor:
    """Distillation loss per token and layer, averaged: soft CE (softmax routers) or BCE (sigmoid)."""
    if rule.scoring == SOFTMAX:
        return -(true_NnE.softmax(-1) * F.log_softmax(pred_NnE, -1)).sum(-1).mean()
    return F.binary_cross_entropy_with_logits(pred_NnE, true_NnE.sigmoid(), reduction="none").sum(-1).mean()


def _pairs(hidden_TLH: np.ndarray | None, logits_TLE: np.ndarray | None, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Training pairs of a trace or step: inputs h[:, :-1] (T, L-1, H) and targets logits[:, 1:] (T, L-1, E)."""
    if hidden_TLH is None or logits_TLE is None:
        raise ConfigError(
            f"{where} has no {'hidden_TLH' if hidden_TLH is None else 'logits_TLE'}; the lookahead predictor "
            "distils from router inputs and logits: capture with --hidden --logits and read both."
        )
    return (torch.from_numpy(np.array(hidden_TLH[:, :-1], np.float32)),
            torch.from_numpy(np.array(logits_TLE[:, 1:], np.float32)))


class LookaheadPredictor(Predictor):
    """Gate-initialised lookahead predictor (layer horizon); see the module docstring."""

    name = "lookahead"
    horizon = LAYER
    learns = True

    def __init__(self, spec: MoESpec, prior_W_LEH: np.ndarray, *, prior_b_LE: np.ndarray | None = None,
                 correction_LE: np.ndarray | None = None, rule: RouterRule | None = None,
                 config: LookaheadConfig | None = None, source: str = "") -> None:
        """prior_W_LEH (L, E, H): every MoE layer's router weight; prior_b_LE / correction_LE (L, E) or None."""
        super().__init__(spec)
        L, E = spec.num_layers, spec.num_experts
        W = np.asarray(prior_W_LEH, np.float32)
        if W.ndim != 3 or W.shape[:2] != (L, E) or (spec.hidden_size and W.shape[2] != spec.hidden_size):
            raise ConfigError(
                f"router weights have shape {W.shape}; expected (L, E, H) = ({L}, {E}, {spec.hidden_size or 'H'})."
            )
        if L < 2:
            raise ConfigError(f"the spec has {L} MoE layer(s); the lookahead predictor needs at least 2.")
        zeros = np.zeros((L, E), np.float32)
        self.rule = rule or RouterRule()
        if E % self.rule.n_group:
            raise ConfigError(f"E = {E} is not divisible by n_group = {self.rule.n_group}; expected equal groups.")
        self.config = config or LookaheadConfig()
        self.source = source
        b = zeros if prior_b_LE is None else np.asarray(prior_b_LE, np.float32)
        c = zeros if correction_LE is None else np.asarray(correction_LE, np.float32)
        self.net = _Residual(torch.from_numpy(W[1:].copy()), torch.from_numpy(b[1:].copy()),
                             torch.from_numpy(c[1:].copy()), self.config.mlp_dim, self.config.seed)
        self.counts0_E = np.zeros(E, np.float64)  # layer-0 routing slots seen in fit
        self.fit_log: list[float] = []
        self._snapshot()

    # ------------------------------------------------------------------------------------------- building
    @classmethod
    def from_model(cls, model_dir_or_builtin: str | Path | nn.Module, spec: MoESpec | None = None, *,
                   config: LookaheadConfig | None = None) -> LookaheadPredictor:
        """Clone every MoE router of a model (a directory, 'builtin', or a loaded transformers model).

        spec: the trace's spec, checked against the model's (L, E, top-k, H); None = the model's own.
        """
        from routecast.trace.capture import load_model
        from routecast.trace.capture_arch import find_blocks, model_type, spec_from_model

        model = model_dir_or_builtin if isinstance(model_dir_or_builtin, nn.Module) else load_model(model_dir_or_builtin)[0]
        source = type(model).__name__ if isinstance(model_dir_or_builtin, nn.Module) else str(model_dir_or_builtin)
        blocks = find_blocks(model)
        if len({b.stack for b in blocks}) != 1:
            raise ConfigError(f"model {source}: MoE layers in several stacks (encoder-decoder); expected a decoder-only model.")
        mspec = spec_from_model(model, blocks)
        spec = spec or mspec
        if (spec.num_layers, spec.num_experts, spec.top_k) != (mspec.num_layers, mspec.num_experts, mspec.top_k) or (
            spec.hidden_size and spec.hidden_size != mspec.hidden_size
        ):
            raise ConfigError(
                f"model {source} has L={mspec.num_layers}, E={mspec.num_experts}, K={mspec.top_k}, H={mspec.hidden_size}; "
                f"the spec has L={spec.num_layers}, E={spec.num_experts}, K={spec.top_k}, H={spec.hidden_size}."
            )
        E = mspec.num_experts
        W, bias, corr = [], [], []
        for b in blocks:
            r = b.router
            w = getattr(r, "weight", None)
            if not isinstance(w, torch.Tensor) or tuple(w.shape[:1]) != (E,) or w.ndim != 2:
                raise ConfigError(f"model {source}: {b.path} router has no (E, H) 'weight'; expected a linear router.")
            W.append(w.detach().float())
            rb = getattr(r, "bias", None)
            bias.append(rb.detach().float() if isinstance(rb, torch.Tensor) else torch.zeros(E))
            cb = getattr(r, "e_score_correction_bias", None)
            corr.append(cb.detach().float() if isinstance(cb, torch.Tensor) else torch.zeros(E))
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        sigmoid = model_type(model) in _SIGMOID_TYPES or getattr(cfg, "scoring_func", "softmax") == "sigmoid"
        rule = RouterRule(scoring=SIGMOID if sigmoid else SOFTMAX, n_group=mspec.n_group, topk_group=mspec.topk_group,
                          group_score=GROUP_TOP2 if sigmoid else GROUP_MAX)
        return cls(spec, torch.stack(W).numpy(), prior_b_LE=torch.stack(bias).numpy(),
                   correction_LE=torch.stack(corr).numpy(), rule=rule, config=config, source=source)

    # ------------------------------------------------------------------------------------------- training
    def _snapshot(self) -> None:
        """Remember the post-fit state that reset() returns to, with a fresh optimiser and buffer."""
        self._fitted = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
        self._fitted_counts0 = self.counts0_E.copy()
        self.reset()

    def reset(self) -> None:
        self.net.load_state_dict(self._fitted)
        self.counts0_E = self._fitted_counts0.copy()
        self._opt = torch.optim.Adam(self.net.parameters(), lr=self.config.lr)
        self._gen = torch.Generator().manual_seed(self.config.seed + 1)
        self._buf_h: torch.Tensor | None = None
        self._buf_y: torch.Tensor | None = None
        self.online_loss: list[float] = []

    def _step(self, h: torch.Tensor, y: torch.Tensor) -> float:
        self._opt.zero_grad(set_to_none=True)
        loss = _loss(self.rule, self.net(h), y)
        loss.backward()
        self._opt.step()
        return float(loss.detach())

    def fit(self, trace: Trace) -> LookaheadPredictor:
        """Layer-0 slot shares of trace, then `epochs` offline distillation passes (needs hidden + logits)."""
        self._check_spec(trace.spec, "fit")
        self.counts0_E = slot_counts_LE(trace.experts_TLK[:, :1], self.spec.num_experts)[0].astype(np.float64)
        cfg = self.config
        self.fit_log = []
        if cfg.epochs and trace.num_tokens:
            h, y = _pairs(trace.hidden_TLH, trace.logits_TLE, "fit trace")
            g = torch.Generator().manual_seed(cfg.seed)
            with torch_threads(cfg.threads):
                for _ in range(cfg.epochs):
                    order = torch.randperm(h.shape[0], generator=g)
                    losses = [self._step(h[i], y[i]) for i in order.split(cfg.batch_size)]
                    self.fit_log.append(float(np.mean(losses)))
        self._snapshot()
        return self

    def observe(self, routing: StepRouting) -> None:
        """Online mode: layer-0 counts, replay buffer (newest buffer_tokens tokens), online_updates Adam steps."""
        if not self.config.online:
            return
        cfg = self.config
        self.counts0_E += slot_counts_LE(routing.experts_TLK[:, :1], self.spec.num_experts)[0]
        h, y = _pairs(routing.hidden_TLH, routing.logits_TLE, f"step {routing.step}")
        if self._buf_h is None:
            self._buf_h, self._buf_y = h, y
        else:
            self._buf_h = torch.cat([self._buf_h, h])[-cfg.buffer_tokens:]
            self._buf_y = torch.cat([self._buf_y, y])[-cfg.buffer_tokens:]
        n = self._buf_h.shape[0]
        with torch_threads(cfg.threads):
            for _ in range(cfg.online_updates):
                idx = torch.randint(0, n, (min(cfg.batch_size, n),), generator=self._gen)
                self.online_loss.append(self._step(self._buf_h[idx], self._buf_y[idx]))

    # ------------------------------------------------------------------------------------------- inference
    def layer0_dist(self) -> np.ndarray:
        """Layer-0 fallback forecast (E,) float64: slot shares seen so far (uniform before any)."""
        E = self.spec.num_experts
        total = self.counts0_E.sum()
        return self.counts0_E / total if total > 0 else np.full(E, 1.0 / E)

    @torch.no_grad()
    def predict_logits(self, layer: int, h_TH: np.ndarray) -> np.ndarray:
        """Predicted router logits of MoE layer `layer` >= 1 from layer-1's router input h (T, H) -> (T, E)."""
        return self.net.one(layer - 1, torch.from_numpy(np.array(h_TH, np.float32))).numpy()

    def predict(self, view: StepView) -> Forecast:
        K, layer = self.spec.top_k, view.layer
        if layer is None:
            raise ConfigError("LookaheadPredictor is a layer-horizon predictor; expected a view with a layer.")
        if layer == 0:
            return Forecast(top_k=K, dist_LE=self.layer0_dist()[None, :])
        if view.hidden_TlH is None:
            raise ConfigError(
                "the lookahead predictor needs the router inputs (hidden_TLH) of the trace; capture with "
                "--hidden and read the trace with load_hidden=True."
            )
        with torch.no_grad():
            h = torch.from_numpy(np.array(view.hidden_TlH[:, layer - 1], np.float32))
            logits = self.net.one(layer - 1, h)
            probs = self.rule.forecast(logits, self.net.correction[layer - 1])
        return Forecast(top_k=K, scores_TLE=probs.numpy()[:, None, :])

    def _check_spec(self, spec: MoESpec, where: str) -> None:
        if (spec.num_layers, spec.num_experts) != (self.spec.num_layers, self.spec.num_experts):
            raise ConfigError(
                f"{where}: trace has L={spec.num_layers}, E={spec.num_experts}; the predictor was built for "
                f"L={self.spec.num_layers}, E={self.spec.num_experts}."
            )

    # ------------------------------------------------------------------------------------------- save / load
    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Post-fit state (what reset() returns to): config, rule, source; priors, MLPs, layer-0 counts."""
        meta = {"config": dataclasses.asdict(self.config), "rule": dataclasses.asdict(self.rule),
                "source": self.source, "fit_log": self.fit_log}
        tensors = {k: v.numpy().copy() for k, v in self._fitted.items()}
        tensors["counts0_E"] = self._fitted_counts0.copy()
        return meta, tensors

    @classmethod
    def state_schema(cls, spec: MoESpec, meta: dict[str, Any]) -> dict[str, tuple]:
        # target layers 1..L-1 (row 0 is rebuilt as zeros); the MLP shapes are checked by load_state_dict
        n, E, H = spec.num_layers - 1, spec.num_experts, spec.hidden_size or "H"
        return {"prior_W": ((n, E, H), "f", ()), "prior_b": ((n, E), "f", ()), "correction": ((n, E), "f", ()),
                "counts0_E": ((E,), "f", ("nonneg",))}

    @classmethod
    def from_state(cls, spec: MoESpec, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> LookaheadPredictor:
        L, E = spec.num_layers, spec.num_experts

        def full(name: str) -> np.ndarray:  # the saved tensors cover target layers 1..L-1; row 0 is unused
            t = tensors[name]
            return np.concatenate([np.zeros((1, *t.shape[1:]), t.dtype), t])

        pred = cls(spec, full("prior_W"), prior_b_LE=full("prior_b"), correction_LE=full("correction"),
                   rule=RouterRule(**meta["rule"]), config=LookaheadConfig(**meta["config"]),
                   source=str(meta.get("source", "")))
        if tensors["prior_W"].shape[:2] != (L - 1, E):
            raise ValueError(f"prior_W has shape {tensors['prior_W'].shape}; expected ({L - 1}, {E}, H).")
        pred.net.load_state_dict({k: torch.from_numpy(np.array(tensors[k])) for k in pred._fitted})
        pred.counts0_E = np.asarray(tensors["counts0_E"], np.float64).copy()
        pred.fit_log = [float(x) for x in meta.get("fit_log", [])]
        pred._snapshot()
        return pred
