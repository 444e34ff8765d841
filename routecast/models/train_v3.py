"""DeepSeek-V3 pieces of built-in training: the HF config, router taps, and auxiliary-loss-free balancing.

The fine-grained built-in model is a Hugging Face ``DeepseekV3ForCausalLM``: every MoE layer has E routed
SwiGLU experts plus shared ones; its router (``DeepseekV3TopkRouter``) scores experts with a sigmoid,
adds the per-expert ``e_score_correction_bias`` for *selection only* (keep the ``topk_group`` best of
``n_group`` groups, then the top-k experts inside them), and weights the chosen experts by their
bias-free sigmoid scores, renormalised.

Balancing follows DeepSeek-V3 (arXiv 2412.19437, section 2.1.2):

- auxiliary-loss-free: after every optimiser step, per layer, ``bias_e += gamma * sign(mean_load -
  load_e)`` with load_e the number of (token, slot) pairs the router actually sent to expert e in
  that step (read from the router's returned ids, i.e. the ids the experts executed);
- a small sequence-wise balance loss ``alpha * sum_e f_e P_e`` per sequence, with
  ``f_e = E / (K T) * #(tokens of the sequence routed to e)`` and ``P_e`` the mean over the
  sequence of the sigmoid scores normalised to sum 1 over experts; averaged over sequences and layers.

The bias is a buffer, so the optimiser, weight decay and gradients never touch it.
"""

from __future__ import annotations

import torch
from torch import nn

ARCHES = ("mixtral", "deepseek-v3")


def deepseek_v3_config(cfg, tokenizer):
    """TrainConfig (arch 'deepseek-v3') + tokenizer -> transformers.DeepseekV3Config (MLA attention, no MTP)."""
    from transformers import DeepseekV3Config

    head = cfg.hidden_size // cfg.num_heads
    return DeepseekV3Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        moe_intermediate_size=cfg.moe_intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        n_shared_experts=cfg.num_shared_experts, n_routed_experts=cfg.num_experts,
        num_experts_per_tok=cfg.top_k, n_group=cfg.n_group, topk_group=cfg.topk_group,
        first_k_dense_replace=cfg.first_k_dense, routed_scaling_factor=1.0, norm_topk_prob=True,
        # Multi-head latent attention at small scale: KV compressed to a 64-wide latent, a 16-wide rotary part.
        kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=head - 16, v_head_dim=head,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_embeddings,
        num_mtp_layers=0, rope_interleave=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, hidden_act="silu",
    )


class RouterTap:
    """Forward hooks on every DeepSeek-V3 router: the last forward's (logits [T,E], ids [T,K]) per MoE layer.

    The ids are the router's returned top-k indices, which the block passes unchanged to its experts,
    so loads computed from them are the executed ones (bias included).
    """

    def __init__(self, model: nn.Module):
        self.gates = [m.gate for m in model.modules() if type(m).__name__ == "DeepseekV3MoE"]
        self.logits: list[torch.Tensor | None] = [None] * len(self.gates)
        self.ids: list[torch.Tensor | None] = [None] * len(self.gates)
        self._handles = [g.register_forward_hook(self._hook(i)) for i, g in enumerate(self.gates)]

    def _hook(self, i: int):
        def hook(_mod, _inp, out):
            self.logits[i], self.ids[i] = out[0], out[2]
        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def sequence_balance_loss(logits_L: list[torch.Tensor], ids_L: list[torch.Tensor], batch: int) -> torch.Tensor:
    """DeepSeek-V3 sequence-wise balance loss, averaged over sequences and layers (1.0 when balanced).

    logits_L: L tensors [B*S, E] (router logits); ids_L: L tensors [B*S, K] (chosen experts); batch: B.
    """
    losses = []
    for logits_TE, ids_TK in zip(logits_L, ids_L, strict=True):
        T, E = logits_TE.shape
        scores_BSE = torch.sigmoid(logits_TE.float()).view(batch, T // batch, E)
        p_BE = (scores_BSE / scores_BSE.sum(-1, keepdim=True)).mean(1)
        ids_BN = ids_TK.view(batch, -1)
        f_BE = torch.zeros(batch, E, device=logits_TE.device).scatter_add_(
            1, ids_BN, torch.ones_like(ids_BN, dtype=torch.float32)) * (E / ids_BN.shape[1])
        losses.append((f_BE * p_BE).sum(-1).mean())
    return torch.stack(losses).mean()


@torch.no_grad()
def update_correction_bias(gates: list[nn.Module], ids_L: list[torch.Tensor], gamma: float) -> torch.Tensor:
    """Aux-loss-free step: per layer, bias_e += gamma * sign(mean load - load_e) -> loads [L, E] (float32).

    gates: the routers (each with an ``e_score_correction_bias`` buffer [E]); ids_L: their executed ids [T, K].
    Over-loaded experts lose bias (chosen less next step), under-loaded ones gain it; the gating
    weights are computed from the bias-free scores, so only selection changes.
    """
    loads = []
    for gate, ids in zip(gates, ids_L, strict=True):
        bias = gate.e_score_correction_bias
        load_E = torch.bincount(ids.reshape(-1), minlength=bias.numel()).float()
        bias.add_(gamma * torch.sign(load_E.mean() - load_E))
        loads.append(load_E)
    return torch.stack(loads)
