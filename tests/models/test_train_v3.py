"""DeepSeek-V3 training: aux-loss-free bias balancing, the sequence-wise loss, and a tiny trained checkpoint."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

from routecast.common.errors import ConfigError
from routecast.models.train import fine_config, main, model_config
from routecast.models.train_v3 import RouterTap, sequence_balance_loss, update_correction_bias

torch.set_num_threads(1)


def tiny_router(E: int = 16, K: int = 4, groups: int = 4, topk_group: int = 2, H: int = 8, seed: int = 0):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = DeepseekV3Config(hidden_size=H, n_routed_experts=E, num_experts_per_tok=K, n_group=groups,
                           topk_group=topk_group, routed_scaling_factor=1.0, norm_topk_prob=True)
    r = DeepseekV3TopkRouter(cfg)
    with torch.no_grad():
        r.weight.copy_(torch.randn(E, H, generator=torch.Generator().manual_seed(seed)))
    return r


def test_bias_moves_toward_under_loaded_experts():
    r = tiny_router()
    ids = torch.tensor([[0, 1, 2, 3], [0, 1, 4, 5], [0, 6, 7, 8]])  # expert 0: 3, experts 1: 2, 2..8: 1, 9..15: 0
    loads = update_correction_bias([r], [ids], gamma=0.01)
    b = r.e_score_correction_bias
    assert loads[0, 0] == 3 and loads[0, 15] == 0 and loads.sum() == ids.numel()
    mean = ids.numel() / 16  # 0.75: experts with load 1..3 are over-loaded, 0 under-loaded
    assert torch.equal(b < 0, loads[0] > mean) and torch.equal(b > 0, loads[0] < mean)
    assert torch.allclose(b.abs(), torch.full((16,), 0.01))
    # Repeated updates on the same loads keep moving the same way (sign, not magnitude).
    update_correction_bias([r], [ids], gamma=0.01)
    assert torch.allclose(r.e_score_correction_bias[9:], torch.full((7,), 0.02))


def test_bias_changes_selection_but_not_gating_weights():
    r = tiny_router()
    h = torch.randn(64, 8, generator=torch.Generator().manual_seed(3))
    logits0, w0, ids0 = r(h)
    counts = torch.bincount(ids0.reshape(-1), minlength=16)
    cold = int(counts.argmin())
    with torch.no_grad():
        r.e_score_correction_bias[cold] = 5.0  # selection only: the cold expert now wins its group everywhere
    logits1, w1, ids1 = r(h)
    assert torch.equal(logits0, logits1)  # the router's parameters are untouched
    assert (ids1 == cold).any(-1).all() and not torch.equal(ids0, ids1)
    # Weights are the bias-free sigmoid scores of the chosen experts, renormalised.
    s = torch.sigmoid(logits1).gather(1, ids1)
    assert torch.allclose(w1, s / s.sum(-1, keepdim=True), atol=1e-6)
    assert "e_score_correction_bias" not in dict(r.named_parameters())  # a buffer: no gradient, no weight decay


def test_update_never_touches_parameters_and_balances_a_skewed_router():
    r = tiny_router(seed=1)
    h = torch.randn(512, 8, generator=torch.Generator().manual_seed(4)) + 1.0
    with torch.no_grad():
        r.weight[:4] += 1.0  # experts 0-3 (one group) score high on every token without correction
    w_before = r.weight.detach().clone()
    first = None
    for _ in range(300):
        _, _, ids = r(h)
        loads = update_correction_bias([r], [ids], gamma=0.01)
        first = loads if first is None else first
    assert torch.equal(r.weight, w_before)
    ratio = lambda x: float(x.max() / x.mean())  # noqa: E731
    assert ratio(first) > 2.5 and ratio(loads) < 0.5 * ratio(first), (ratio(first), ratio(loads))


def test_sequence_balance_loss_is_one_when_balanced_and_differentiable():
    B, S, E = 2, 8, 4
    logits = torch.zeros(B * S, E, requires_grad=True)  # equal scores: P_e = 1/E
    ids = torch.tensor([[0, 1], [2, 3]] * (B * S // 2))  # every expert gets K*S/E slots per sequence
    loss = sequence_balance_loss([logits], [ids], B)
    assert math.isclose(float(loss.detach()), 1.0, rel_tol=1e-6)
    # Scores favouring experts 0, 1 and all slots on them: f = E/K = 2 on both, P = sigmoid(2) / 2 each.
    hot = torch.tensor([[2.0, 2.0, -2.0, -2.0]] * (B * S), requires_grad=True)
    skew = sequence_balance_loss([hot], [torch.tensor([[0, 1]] * (B * S))], B)
    skew.backward()
    assert float(skew.detach()) == pytest.approx(2 * float(torch.sigmoid(torch.tensor(2.0))), rel=1e-6)
    assert hot.grad is not None and hot.grad[:, :2].sum() > 0  # the loss pushes the hot experts' scores down


def test_router_tap_reads_the_ids_the_experts_run():
    cfg = fine_config(vocab_size=64, hidden_size=32, num_layers=3, num_experts=16, top_k=4, n_group=4,
                      topk_group=2, moe_intermediate_size=16, intermediate_size=64, num_heads=2, num_kv_heads=2)

    class Tok:
        bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

        def __len__(self):
            return 64

    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(model_config(cfg, Tok()))
    tap = RouterTap(model)
    seen = []
    hooks = [m.experts.register_forward_pre_hook(lambda mod, args: seen.append(args[1].clone()))
             for m in model.modules() if type(m).__name__ == "DeepseekV3MoE"]
    model(input_ids=torch.randint(0, 64, (2, 5)))
    assert len(tap.ids) == len(seen) == 2  # layer 0 is dense
    for a, b in zip(tap.ids, seen, strict=True):
        assert torch.equal(a, b)
    tap.remove()
    for h in hooks:
        h.remove()


def test_fine_config_validation_and_shape():
    cfg = fine_config()
    assert (cfg.arch, cfg.num_experts, cfg.top_k, cfg.n_group, cfg.topk_group, cfg.num_layers) == (
        "deepseek-v3", 64, 6, 8, 4, 6)
    with pytest.raises(ConfigError, match="n_group"):
        fine_config(n_group=7)
    with pytest.raises(ConfigError, match="top_k"):
        fine_config(top_k=12, topk_group=1)  # 12 experts cannot come from one group of 8
    with pytest.raises(ConfigError, match="--arch"):
        fine_config(arch="switch")
    assert main(["--out", "x", "--arch", "deepseek-v3", "--steps", "0"]) == 2


def test_tiny_fine_checkpoint_loads_as_hf_deepseek_v3(tiny_fine_checkpoint, tiny_checkpoint):
    out, record = tiny_fine_checkpoint
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert isinstance(model, DeepseekV3ForCausalLM)
    cfg = model.config
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group, cfg.first_k_dense_replace,
            cfg.n_shared_experts) == (16, 4, 4, 2, 1, 1)
    saved = json.loads((out / "training.json").read_text())
    assert saved["steps"] == saved["config"]["steps"] and saved["tokenizer"] == str(tiny_checkpoint[0])
    assert all(math.isfinite(v) for v in saved["val_loss_per_task"].values())
    # The balancing ran: biases moved (a multiple of gamma away from 0) and were saved with the weights.
    gates = [m.gate for m in model.modules() if type(m).__name__ == "DeepseekV3MoE"]
    assert len(gates) == 2
    for g in gates:
        assert g.e_score_correction_bias.abs().max() > 0
    assert len(saved["history"][-1]["load_max_over_mean"]) == 2
    # Same tokenizer as the checkpoint it was taken from.
    assert (out / "tokenizer.json").read_text() == (tiny_checkpoint[0] / "tokenizer.json").read_text()
