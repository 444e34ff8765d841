"""Speculative expert pre-grouping: a permuted checkpoint generates exactly what the original does; a permuted
trace is the same routing under new names; permutations that break router groups are refused."""

import numpy as np
import pytest
import torch

from routecast.cli import main
from routecast.common.errors import ConfigError
from routecast.schedule.cocluster import cocluster
from routecast.schedule.permute import check_permutation, permute_checkpoint, permute_trace
from routecast.trace import MoESpec

from .test_cocluster import planted

torch.set_num_threads(1)


def _generate(model_dir, prompts_BS) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        out = m.generate(torch.as_tensor(prompts_BS), attention_mask=torch.ones_like(torch.as_tensor(prompts_BS)),
                         max_new_tokens=12, do_sample=False, pad_token_id=0)
    return out.numpy()


def _tiny_mixtral(path):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=97, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=64)
    MixtralForCausalLM(cfg).save_pretrained(str(path))
    return path


def _block_perm(L, E, group_size, seed):
    """Whole router groups shuffled as blocks, and the experts inside each block shuffled too."""
    rng = np.random.default_rng(seed)
    n = E // group_size
    rows = []
    for _ in range(L):
        blocks = rng.permutation(n)
        rows.append(np.concatenate([b * group_size + rng.permutation(group_size) for b in blocks]))
    return np.stack(rows)


def _check_same_generations(src, perm, tmp_path, vocab):
    from routecast.predict.embeddings import resolve_model_dir

    src = resolve_model_dir(str(src))
    out = permute_checkpoint(src, perm, tmp_path / "permuted")
    prompts = np.random.default_rng(1).integers(3, vocab, (3, 9))
    a, b = _generate(src, prompts), _generate(out, prompts)
    assert a.shape[1] > prompts.shape[1]
    assert np.array_equal(a, b)
    return out


def test_tiny_random_mixtral_generates_the_same(tmp_path):
    src = _tiny_mixtral(tmp_path / "tiny")
    perm = np.stack([np.random.default_rng(s).permutation(8) for s in range(2)])
    out = _check_same_generations(src, perm, tmp_path, 97)
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as h, safe_open(str(src / "model.safetensors"), "pt") as g:
        k = next(n for n in g.keys() if "layers.0." in n and n.endswith("gate.weight") and "proj" not in n)
        assert torch.equal(h.get_tensor(k), g.get_tensor(k)[torch.as_tensor(perm[0])])  # router rows moved


def test_builtin_generates_the_same(tmp_path):
    perm = np.stack([np.random.default_rng(s).permutation(8) for s in range(4)])
    _check_same_generations("builtin", perm, tmp_path, 4096)


def test_builtin_fine_generates_the_same_with_groups_kept(tmp_path):
    perm = _block_perm(5, 64, 8, seed=0)
    out = _check_same_generations("builtin-fine", perm, tmp_path, 4096)
    assert (out / "tokenizer.json").is_file()


def test_builtin_fine_refuses_a_permutation_across_groups(tmp_path):
    perm = np.stack([np.random.default_rng(s).permutation(64) for s in range(5)])
    with pytest.raises(ConfigError, match="groups"):
        permute_checkpoint("builtin-fine", perm, tmp_path / "x")


def test_permute_trace_keeps_the_routing():
    tr = planted()
    plan = cocluster(tr, 4, "smoe")
    perm = plan.expert_permutation_LE()
    new = permute_trace(tr, perm)
    # new slot j holds old expert perm[j]: mapping the new ids back gives the old routing
    back = np.take_along_axis(perm[None], new.experts_TLK.astype(np.int64), axis=2)
    assert np.array_equal(back, tr.experts_TLK)
    # after the permutation the plan's groups are contiguous blocks
    grp = np.take_along_axis(plan.expert_group_LE, perm, axis=1)
    assert (np.diff(grp, axis=1) >= 0).all()


def test_check_permutation_refuses_bad_rows():
    spec = MoESpec(num_layers=1, num_experts=4, top_k=2)
    with pytest.raises(ConfigError, match="repeats"):
        check_permutation(np.array([[0, 0, 1, 2]]), spec)
    with pytest.raises(ConfigError, match="shape"):
        check_permutation(np.array([0, 1, 2, 3]), spec)


def test_permute_experts_cli(tmp_path, capsys):
    src = _tiny_mixtral(tmp_path / "tiny")
    plan = tmp_path / "plan.json"
    plan.write_text('{"version": 1}')
    assert main(["permute-experts", "--model", str(src), "--plan", str(plan), "--out", str(tmp_path / "o")]) == 2
    assert "plan" in capsys.readouterr().err
