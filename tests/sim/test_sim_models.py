import json

import pytest

from routecast.common.errors import ConfigError
from routecast.sim.models import (
    BUILTIN_CONFIG,
    BUILTIN_CONFIGS,
    MODELS_DIR,
    ModelProfile,
    list_models,
    load_model,
    model_profile_from_hf_config,
)
from routecast.trace.spec import MoESpec

SHIPPED = [
    "deepseek-v2", "deepseek-v2-lite", "deepseek-v3", "gpt-oss-120b", "llama-moe-3.5b", "mixtral-8x22b", "mixtral-8x7b",
    "olmoe-1b-7b", "qwen3-235b-a22b", "switch-base-128",
]


def test_every_shipped_profile_loads_and_converts():
    assert sorted(p.stem for p in MODELS_DIR.glob("*.toml")) == SHIPPED
    assert list_models() == sorted([*SHIPPED, "builtin", "builtin-fine"])
    for name in SHIPPED:
        m = load_model(name)
        spec = m.to_moespec()
        assert isinstance(spec, MoESpec)
        assert spec.num_layers == m.num_moe_layers and spec.num_experts == m.num_experts
        assert spec.expert_bytes == m.expert_bytes() > 0


def test_expert_bytes_match_the_papers():
    m = load_model("mixtral-8x7b")
    assert m.expert_bytes() == 3 * 4096 * 14336 * 2 == 352_321_536  # ANCHORS: 352 MB
    assert m.expert_bytes(two_matrix=True) == 234_881_024  # MoE-GPS §5 counts two matrices: 235 MB
    assert m.to_moespec(two_matrix=True).expert_bytes == 234_881_024
    assert m.expert_flops_per_token == 2 * 3 * 4096 * 14336
    sw = load_model("switch-base-128")
    assert sw.matrices_per_expert == 2 and sw.expert_bytes(two_matrix=True) == sw.expert_bytes()


def test_layer_layouts():
    v3 = load_model("deepseek-v3")
    assert v3.num_moe_layers == 58 and v3.moe_layer_ids[0] == 3 and v3.attention == "mla"
    assert v3.to_moespec().n_group == 8 and v3.to_moespec().topk_group == 4
    assert load_model("deepseek-v2").num_moe_layers == 59
    sw = load_model("switch-base-128")
    assert sw.moe_layer_ids == tuple(range(1, 24, 2))
    gpt = load_model("gpt-oss-120b")
    assert gpt.sliding_window == 128 and gpt.sliding_fraction == 0.5


def test_unknown_name_lists_known_ones():
    with pytest.raises(ConfigError) as e:
        load_model("gpt-5")
    assert "gpt-5" in str(e.value) and "mixtral-8x7b" in str(e.value) and "builtin" in str(e.value)


def test_missing_field_names_file_and_field(tmp_path):
    text = (MODELS_DIR / "olmoe-1b-7b.toml").read_text()
    p = tmp_path / "m.toml"
    p.write_text("\n".join(line for line in text.splitlines() if not line.startswith("top_k")))
    with pytest.raises(ConfigError) as e:
        load_model(p)
    assert str(p) in str(e.value) and "moe.top_k" in str(e.value)
    p.write_text(text.replace('activation = "swiglu"', 'activation = "tanh"'))
    with pytest.raises(ConfigError, match="activation"):
        load_model(p)


def test_profile_validation():
    with pytest.raises(ConfigError, match="top_k"):
        ModelProfile(name="x", vocab_size=10, num_layers=2, hidden_size=8, num_experts=4, top_k=5, expert_ffn=8,
                     num_heads=2, num_kv_heads=2, head_dim=4)
    with pytest.raises(ConfigError, match="MLA"):
        ModelProfile(name="x", vocab_size=10, num_layers=2, hidden_size=8, num_experts=4, top_k=2, expert_ffn=8,
                     num_heads=2, num_kv_heads=2, head_dim=4, attention="mla")


def _write(tmp_path, cfg):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_from_hf_mixtral_config(tmp_path):
    cfg = {"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 4096, "sliding_window": None, "torch_dtype": "float32"}
    m = model_profile_from_hf_config(_write(tmp_path, cfg))
    assert (m.num_layers, m.hidden_size, m.expert_ffn, m.num_experts, m.top_k) == (4, 128, 384, 8, 2)
    assert m.attention == "gqa" and m.head_dim == 32 and m.dtype_bytes == 4 and m.sliding_window == 0
    assert load_model(tmp_path) == m  # a checkpoint directory works too


def test_from_hf_deepseek_and_switch_configs(tmp_path):
    ds = {"model_type": "deepseek_v3", "hidden_size": 7168, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
          "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256, "num_experts_per_tok": 8,
          "n_shared_experts": 1, "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536,
          "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
          "vocab_size": 129280, "n_group": 8, "topk_group": 4, "torch_dtype": "bfloat16"}
    m = model_profile_from_hf_config(_write(tmp_path, ds))
    shipped = load_model("deepseek-v3")
    for f in ("num_moe_layers", "expert_ffn", "num_shared_experts", "shared_ffn", "kv_lora_rank", "n_group"):
        assert getattr(m, f) == getattr(shipped, f), f
    sw = {"model_type": "switch_transformers", "d_model": 768, "d_ff": 3072, "num_layers": 12,
          "num_decoder_layers": 12, "num_heads": 12, "d_kv": 64, "num_experts": 128, "encoder_sparse_step": 2,
          "vocab_size": 32128, "dense_act_fn": "relu"}
    m = model_profile_from_hf_config(_write(tmp_path, sw))
    assert m.top_k == 1 and m.num_moe_layers == 12 and m.activation == "relu" and m.head_dim == 64


def test_from_hf_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        model_profile_from_hf_config(tmp_path / "none.json")
    p = _write(tmp_path, {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2})
    with pytest.raises(ConfigError) as e:
        model_profile_from_hf_config(p)
    assert str(p) in str(e.value) and "num_attention_heads" in str(e.value)


def test_builtin_resolves_to_the_checkpoint_config():
    if BUILTIN_CONFIG.is_file():
        m = load_model("builtin")
        cfg = json.loads(BUILTIN_CONFIG.read_text())
        assert m.name == "builtin" and m.hidden_size == cfg["hidden_size"] and m.num_experts == cfg["num_local_experts"]
    else:
        with pytest.raises(ConfigError, match="config.json"):
            load_model("builtin")


def test_builtin_fine_resolves_to_the_deepseek_v3_checkpoint_config():
    path = BUILTIN_CONFIGS["builtin-fine"]
    if not path.is_file():
        with pytest.raises(ConfigError, match="config.json"):
            load_model("builtin-fine")
        return
    m = load_model("builtin-fine")
    cfg = json.loads(path.read_text())
    assert m.name == "builtin-fine" and m.num_experts == cfg["n_routed_experts"] == 64 and m.top_k == 6
    assert (m.n_group, m.topk_group, m.num_shared_experts, m.first_moe_layer) == (8, 4, 1, 1)
    assert m.attention == "mla" and m.to_moespec().num_layers == 5
