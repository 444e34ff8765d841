"""Training: a tiny run gives a loadable HF Mixtral checkpoint whose routing is top-2 over 8 experts."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, MixtralForCausalLM

from routecast.common.errors import ConfigError
from routecast.models.train import (
    TrainConfig,
    builtin_config,
    eval_per_domain,
    load_model,
    tiny_config,
    windows,
)


def test_checkpoint_files_and_record(tiny_checkpoint):
    out, record = tiny_checkpoint
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "training.json"):
        assert (out / name).is_file(), name
    assert not list(out.parent.glob("*.tmp-*"))  # the temporary folder was moved into place
    saved = json.loads((out / "training.json").read_text())
    steps = saved["config"]["steps"]
    assert saved["steps"] == steps and saved["schedule"] == "steps" and saved["seed"] == 0
    assert saved["tokens_seen"] == steps * saved["config"]["batch_size"] * saved["config"]["seq_len"]
    assert set(saved["val_loss_per_task"]) == {"code", "docs", "austen", "bible", "wiki"}
    assert all(math.isfinite(v) for v in saved["val_loss_per_task"].values())
    assert record["val_loss_per_task"] == saved["val_loss_per_task"]


def test_loads_as_hf_mixtral_with_top2_of_8(tiny_checkpoint):
    out, _ = tiny_checkpoint
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert isinstance(model, MixtralForCausalLM)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_local_experts, cfg.num_experts_per_tok, cfg.hidden_size) == (4, 8, 2, 64)
    model, tok = load_model(out)
    assert not model.training
    ids = tok("def add(a, b):\n    return a + b\n", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        res = model(input_ids=ids, output_router_logits=True)
    assert len(res.router_logits) == 4
    for logits in res.router_logits:
        assert logits.shape == (ids.shape[1], 8)
    # The model's own router (softmax, top-2, renormalised) picks two distinct experts per token.
    gate = model.model.layers[0].mlp.gate
    h = torch.randn(5, cfg.hidden_size)
    _, weights, experts = gate(h)
    assert experts.shape == (5, 2) and (experts[:, 0] != experts[:, 1]).all()
    assert torch.allclose(weights.sum(-1), torch.ones(5))


def test_training_lowers_loss_below_uniform(tiny_checkpoint):
    _, record = tiny_checkpoint
    # ln(vocab) is the loss of a uniform guess; even 30 steps learn the unigram statistics.
    assert max(record["val_loss_per_task"].values()) < math.log(tiny_config().vocab_size) - 0.3


def test_eval_per_domain(tiny_checkpoint):
    out, _ = tiny_checkpoint
    res = eval_per_domain(out, "test", max_tokens_per_task=256)
    assert set(res) == {"code", "docs", "austen", "bible", "wiki"}
    assert all(math.isfinite(v) and 0 < v < 10 for v in res.values())
    with pytest.raises(ConfigError, match="split 'dev'"):
        eval_per_domain(out, "dev")


def test_load_model_missing_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        load_model(tmp_path)


def test_config_presets_and_validation():
    assert builtin_config().hidden_size == 128 and builtin_config().num_experts == 8
    assert tiny_config().hidden_size == 64 and tiny_config().steps == 100
    with pytest.raises(ConfigError, match="num_heads"):
        TrainConfig(hidden_size=100, num_heads=3)
    with pytest.raises(ConfigError, match="top_k"):
        TrainConfig(top_k=9)
    with pytest.raises(TypeError):
        TrainConfig(128)  # keyword-only


def test_windows_shapes():
    import numpy as np

    w = windows(np.arange(100, dtype=np.int32), 10, max_windows=3)
    assert w.shape == (3, 11) and w[1, 0] == 10 and w.dtype == torch.int64
    with pytest.raises(ConfigError, match="shorter"):
        windows(np.arange(5, dtype=np.int32), 10)
