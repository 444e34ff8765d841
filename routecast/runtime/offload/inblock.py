"""PROBE's lookahead inside the offload engine: router logits of an upcoming MoE layer from a hidden state the model
already holds, each token's top-k by the router's own rule, the union -> a forecast set (1, E).

Two sources, both one small matmul on the compute thread:
- layer l+1 from layer l's router input (``next_sets``): LookaheadPredictor's frozen next gate, plus its fitted
  residual MLP where fitting made it non-zero, run inside layer l's MoE block (engine._lookahead);
- MoE layer 0 from the input of the decoder layer that holds it (``first_sets``): the residual stream after the
  layers before it, through that decoder layer's own post-attention norm and layer 0's router, skipping its
  attention. The next-gate lookahead never covers layer 0 (no MoE layer runs before it), so without this every
  step's layer 0 reads its misses on demand; this forecast is one attention ahead of them. Present where the
  decoder layer has a ``post_attention_layernorm`` (the Llama-style blocks of DeepSeek, Mixtral, Qwen-MoE, OLMoE).

Shapes: hidden (T, H) or (B, S, H); logits (T, E); sets (1, E) bool.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from routecast.predict.lookahead import GROUP_TOP2, LookaheadPredictor
from routecast.predict.lookahead_kernel import gate_logits, union_topk


class InBlockLookahead:
    """The forecast sets of a LookaheadPredictor at run time (see the module docstring)."""

    def __init__(self, predictor: LookaheadPredictor, model: nn.Module, blocks: list, *, top_k: int, prefetch_top: int,
                 min_prob: float, first: int = 0) -> None:
        """top_k: the model's; prefetch_top / min_prob: the confidence gate of every forecast (engine.OffloadConfig);
        first: each token's best `first` experts make the first-layer forecast (0: none)."""
        net = predictor.net
        self.pred, self.net, self.min_prob = predictor, net, min_prob
        self.E = int(net.prior_W.shape[1])
        self.Wt = net.prior_W.transpose(1, 2).contiguous()  # (L-1, H, E)
        self.mlp = [bool(net.W2[i].any() or net.c2[i].any()) for i in range(net.prior_W.shape[0])]
        self.corr = [c.detach().float().numpy() for c in net.correction]
        rule = predictor.rule  # the kernel's settings, fixed for the run
        self.kw = dict(sigmoid=rule.scoring != "softmax", n_group=rule.n_group, topk_group=rule.topk_group,
                       group_top2=rule.group_score == GROUP_TOP2, top=top_k if prefetch_top <= 0 else min(prefetch_top, top_k))
        # the kernel serves every rule but a confidence gate (it needs probabilities) and group-limited softmax
        self.kernel = min_prob == 0 and not (rule.scoring == "softmax" and rule.n_group > 1)
        if self.kernel:  # checked and compiled now, not in the first step's predictor time
            union_topk(np.zeros((1, self.E), np.float32), self.corr[0], **self.kw)
        self.Wt_np = [w.numpy() for w in self.Wt]  # the compiled path's views (decode-size matmuls: gate_logits)
        self.b_np = [b.detach().float().numpy() for b in net.prior_b]
        self.first_kw = dict(self.kw, top=min(first, self.kw["top"])) if first > 0 else None
        self.first_module, self._first = (self._first_gate(model, blocks[0]) if first > 0 else (None, None))

    def _first_gate(self, model: nn.Module, block) -> tuple[nn.Module | None, tuple | None]:
        """(the decoder layer holding MoE layer 0, (its post-attention norm, router W^T (H, E), bias (E,), correction
        (E,) numpy and torch)), or (None, None) where the model has no such norm or no linear router."""
        try:
            parent = model.get_submodule(block.layer_path)
        except AttributeError:
            return None, None
        norm = getattr(parent, "post_attention_layernorm", None)
        w = getattr(block.router, "weight", None)
        if not isinstance(norm, nn.Module) or not isinstance(w, torch.Tensor) or w.ndim != 2 or w.shape[0] != self.E:
            return None, None
        b = getattr(block.router, "bias", None)
        c = getattr(block.router, "e_score_correction_bias", None)
        bias = b.detach().float() if isinstance(b, torch.Tensor) else torch.zeros(self.E)
        corr = c.detach().float() if isinstance(c, torch.Tensor) else torch.zeros(self.E)
        Wt = w.detach().float().T.contiguous()
        return parent, (norm, Wt, bias, corr.numpy(), corr, Wt.numpy(), bias.numpy(), _rms(norm))

    def _union(self, logits, corr_np: np.ndarray, corr_t: torch.Tensor | None, kw: dict) -> np.ndarray:
        """logits (T, E), a tensor or (compiled path) an array -> the union of each token's top experts (1, E)."""
        if self.kernel:  # the router's top-k without normalising, in one compiled loop (predict/lookahead_kernel.py)
            return union_topk(logits if isinstance(logits, np.ndarray) else logits.numpy(), corr_np, **kw)[None, :]
        score = self.pred.rule.forecast(logits, corr_t)
        vals, idx = score.topk(kw["top"], dim=-1)
        idx = idx[(vals > 0) & (vals >= self.min_prob)]
        return torch.bincount(idx.reshape(-1), minlength=self.E).numpy()[None, :] > 0

    def next_sets(self, li: int, hidden: torch.Tensor) -> np.ndarray:
        """Layer li's router input -> the forecast set of layer li+1."""
        if self.kernel and not self.mlp[li]:  # the frozen gate alone: one compiled matmul and one compiled top-k
            return self._union(gate_logits(_rows(hidden), self.Wt_np[li], self.b_np[li]), self.corr[li], None, self.kw)
        with torch.no_grad():
            h = hidden.reshape(-1, hidden.shape[-1]).float()
            logits = self.net.one(li, h) if self.mlp[li] else torch.addmm(self.net.prior_b[li], h, self.Wt[li])
            return self._union(logits, self.corr[li], self.net.correction[li], self.kw)

    def first_sets(self, hidden: torch.Tensor) -> np.ndarray:
        """The input of the decoder layer holding MoE layer 0 -> the forecast set of layer 0."""
        norm, Wt, bias, corr_np, corr_t, Wt_np, b_np, rms = self._first
        if self.kernel and rms is not None:  # RMSNorm folded into the compiled matmul
            return self._union(gate_logits(_rows(hidden), Wt_np, b_np, *rms), corr_np, None, self.first_kw)
        with torch.no_grad():
            h = norm(hidden.reshape(-1, hidden.shape[-1])).float()
            return self._union(torch.addmm(bias, h, Wt), corr_np, corr_t, self.first_kw)


def _rows(hidden: torch.Tensor) -> np.ndarray:
    """(..., H) float32 rows as a numpy view (a copy only for another dtype)."""
    t = hidden.detach().reshape(-1, hidden.shape[-1])
    return (t if t.dtype == torch.float32 else t.float()).numpy()


def _rms(norm: nn.Module) -> tuple[np.ndarray, float] | None:
    """(weight (H,) float32, eps) of a plain RMSNorm (x / sqrt(mean(x^2) + eps) * weight: the Llama, Mistral,
    DeepSeek, Qwen and OLMoE norms), None for any other norm (Gemma's 1 + weight, LayerNorm), which runs as a module."""
    w = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    name = type(norm).__name__
    if not name.endswith("RMSNorm") or "Gemma" in name or not isinstance(w, torch.Tensor) or w.ndim != 1 or eps is None:
        return None
    return w.detach().float().numpy().copy(), float(eps)
