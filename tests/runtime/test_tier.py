"""The disk tier: expert byte ranges in fused and per-expert checkpoints, O_DIRECT and fadvise reads, bad files."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from routecast.common.errors import ConfigError
from routecast.runtime.offload.tier import DiskTier, ExpertLayout, measure_bandwidth

E, I2, H, I = 4, 6, 5, 3  # noqa: E741


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"gate_up_proj": torch.randn(E, I2, H, generator=g), "down_proj": torch.randn(E, H, I, generator=g)}


PARAMS = {"gate_up_proj": ((I2, H), torch.float32), "down_proj": ((H, I), torch.float32)}


@pytest.mark.parametrize("direct", [True, False])
def test_fused_checkpoint_reads_each_expert_slice(tmp_path, direct) -> None:
    w = weights()
    path = tmp_path / "model.safetensors"
    save_file({"model.layers.1.mlp.experts.gate_up_proj": w["gate_up_proj"], "model.layers.1.mlp.experts.down_proj": w["down_proj"],
               "model.embed_tokens.weight": torch.zeros(7, H)}, str(path))
    tier = DiskTier(ExpertLayout([path], ["model.layers.1.mlp"], PARAMS, E), direct=direct)
    try:
        assert tier.mode in (("o_direct", "fadvise") if direct else ("fadvise",))
        out = {p: torch.empty(s, dtype=d) for p, (s, d) in PARAMS.items()}
        for e in range(E):
            n = tier.read_into(e, out)
            assert n % 4096 == 0 and n >= (I2 * H + H * I) * 4
            assert torch.equal(out["gate_up_proj"], w["gate_up_proj"][e]) and torch.equal(out["down_proj"], w["down_proj"][e])
        m = measure_bandwidth(tier, reads=8)
        assert m["bandwidth_Bps"] > 0 and m["mode"] == tier.mode
    finally:
        tier.close()


def test_per_expert_mixtral_names_are_concatenated(tmp_path) -> None:
    w = weights(1)
    t = {}
    for e in range(E):  # Mixtral's original names under block_sparse_moe: w1 (gate), w3 (up), w2 (down)
        t[f"model.layers.0.block_sparse_moe.experts.{e}.w1.weight"] = w["gate_up_proj"][e, :I].contiguous()
        t[f"model.layers.0.block_sparse_moe.experts.{e}.w3.weight"] = w["gate_up_proj"][e, I:].contiguous()
        t[f"model.layers.0.block_sparse_moe.experts.{e}.w2.weight"] = w["down_proj"][e].contiguous()
    path = tmp_path / "model.safetensors"
    save_file(t, str(path))
    tier = DiskTier(ExpertLayout([path], ["model.layers.0.mlp"], PARAMS, E))
    try:
        out = {p: torch.empty(s, dtype=d) for p, (s, d) in PARAMS.items()}
        tier.read_into(2, out)
        assert torch.equal(out["gate_up_proj"], w["gate_up_proj"][2]) and torch.equal(out["down_proj"], w["down_proj"][2])
        assert len(tier.layout.plans[2].requests) == 1  # the three adjacent tensors are one read
        # byte-array destinations (the store's flat uint8 views of a slot) get the same bytes, pieces in place
        raw = {p: torch.zeros(s, dtype=d) for p, (s, d) in PARAMS.items()}
        tier.read_into(1, {p: t.view(torch.uint8).numpy().reshape(-1) for p, t in raw.items()})
        assert torch.equal(raw["gate_up_proj"], w["gate_up_proj"][1]) and torch.equal(raw["down_proj"], w["down_proj"][1])
    finally:
        tier.close()


def test_missing_expert_tensor_and_bad_file_are_one_sentence(tmp_path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"model.layers.0.mlp.experts.gate_up_proj": weights()["gate_up_proj"]}, str(path))
    with pytest.raises(ConfigError, match="no tensor for 'down_proj'"):
        ExpertLayout([path], ["model.layers.0.mlp"], PARAMS, E)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05")
    with pytest.raises(ConfigError, match="too short"):
        ExpertLayout([bad], ["model.layers.0.mlp"], PARAMS, E)
