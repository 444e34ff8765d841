"""Capture on the fine-grained model (DeepSeek-V3 geometry of builtin-fine: 64 routed experts top-6, 8 groups
of which 4 are eligible, one shared expert, correction bias): recorded ids are the executed ones.

Runs on a narrow random model with exactly that routing geometry, and on the shipped builtin-fine
checkpoint when it is present.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from routecast.models.builtin import builtin_path
from routecast.models.train import fine_config, model_config
from routecast.trace.capture import RoutingRecorder, load_model
from tests.trace.test_capture import check_executed, layer_outputs

torch.set_num_threads(1)
SHIPPED = (builtin_path("builtin-fine") / "model.safetensors").is_file()


class _Tok:
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __len__(self) -> int:
        return 256


def narrow_fine(seed: int = 0):
    """builtin-fine's routing geometry at width 32, routers spread and a correction bias that matters."""
    from transformers import DeepseekV3ForCausalLM

    cfg = fine_config(vocab_size=256, hidden_size=32, num_heads=2, num_kv_heads=2, moe_intermediate_size=8,
                      intermediate_size=32, num_layers=3)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(model_config(cfg, _Tok())).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__ == "DeepseekV3TopkRouter":
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.3)
                m.e_score_correction_bias.copy_(torch.randn(m.num_experts, generator=g) * 0.3)
    return model


@pytest.fixture(scope="module", params=["narrow", "shipped"])
def fine_model(request):
    if request.param == "shipped":
        if not SHIPPED:
            pytest.skip("builtin-fine checkpoint not trained yet")
        return load_model("builtin-fine")[0]
    return narrow_fine()


def _inputs(vocab: int):
    x = torch.randint(3, vocab, (3, 9), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    mask[2, :1] = 0
    return x, mask


def _record(model, x, mask):
    def run():
        with torch.no_grad():
            model(input_ids=x, attention_mask=mask)
    with RoutingRecorder(model, logits=True) as rec:
        run()
        fw = rec.forwards()[0]
        rec.reset()
    return rec, fw, run


def test_perturbing_one_routed_expert_changes_only_its_rows(fine_model):
    x, mask = _inputs(fine_model.config.vocab_size)
    rec, fw, run = _record(fine_model, x, mask)
    assert rec.spec.num_experts == 64 and rec.spec.top_k == 6 and rec.spec.layer_ids[0] == 1
    with RoutingRecorder(fine_model) as rec2:
        checked, split = check_executed(fine_model, rec2, fw, run, mask.reshape(-1).bool())
    assert checked == split == rec.spec.num_layers


def test_shared_expert_is_never_recorded_as_routed(fine_model):
    x, mask = _inputs(fine_model.config.vocab_size)
    rec, fw, run = _record(fine_model, x, mask)
    valid = mask.reshape(-1).bool()
    ids = fw.experts_TLK[valid.numpy()]
    assert rec.spec.num_shared_experts == 1 and ids.min() >= 0 and ids.max() < 64
    # The shared expert runs on every token: perturbing it changes every row, yet the routed ids stay.
    b = rec.blocks[0]
    shared = b.block.shared_experts
    before = layer_outputs(fine_model, [b.layer_path], run)[b.layer_path]
    saved = copy.deepcopy(shared.state_dict())
    with torch.no_grad():
        for p in shared.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(9)))
    after = layer_outputs(fine_model, [b.layer_path], run)[b.layer_path]
    _, fw2, _ = _record(fine_model, x, mask)
    shared.load_state_dict(saved)
    assert (after != before).any(-1)[valid].all()
    assert np.array_equal(fw2.experts_TLK[:, 0], fw.experts_TLK[:, 0])  # layer 0's routing saw the same input


def test_ids_are_group_limited_and_bias_corrected(fine_model):
    x, mask = _inputs(fine_model.config.vocab_size)
    rec, fw, _ = _record(fine_model, x, mask)
    valid = mask.reshape(-1).bool().numpy()
    E, K, G, KG = 64, 6, rec.spec.n_group, rec.spec.topk_group
    assert (G, KG) == (8, 4)
    ids = fw.experts_TLK[valid].astype(np.int64)  # [T, L, K]
    groups = ids // (E // G)
    assert max(len(set(r)) for r in groups.reshape(-1, K)) <= KG
    differs = 0
    for li, b in enumerate(rec.blocks):
        bias = b.router.e_score_correction_bias.detach()
        assert bias.abs().max() > 0
        scores = torch.sigmoid(torch.from_numpy(fw.logits_TLE[valid, li]))
        choice = scores + bias
        top2 = choice.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(top2).scatter_(1, top2.topk(KG, dim=-1).indices, 1.0).bool()
        masked = choice.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
        expect = np.sort(masked.topk(K, dim=-1).indices.numpy(), -1)
        assert np.array_equal(np.sort(ids[:, li], -1), expect), f"layer {b.path}: recorded ids are not the executed ones"
        differs += int((np.sort(scores.topk(K, dim=-1).indices.numpy(), -1) != expect).any(-1).sum())
    assert differs > 0  # bias and group limit change some choices, so the check above is not vacuous


def test_capture_records_the_bias_and_stats_measure_the_group_limit(tmp_path):
    import json

    from routecast.report.stats import stats_main
    from routecast.trace.capture import capture_to_disk
    from routecast.trace.io import read_trace
    from routecast.trace.stats_bundle import routing_stats
    from tests.trace.test_capture import PROMPTS
    from tests.trace.test_capture import tokenizer as tokenizer_fixture

    model = narrow_fine()
    tok = tokenizer_fixture.__wrapped__()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    out = capture_to_disk(str(tmp_path / "m"), PROMPTS, tmp_path / "t", max_new_tokens=3, batch_size=3,
                          logits=True, progress=False)
    tr = read_trace(out)
    bias = np.array(tr.provenance["router_correction_bias_LE"])
    gates = [m.gate for m in model.modules() if type(m).__name__ == "DeepseekV3MoE"]
    assert bias.shape == (2, 64) and np.allclose(bias[1], gates[1].e_score_correction_bias.numpy(), atol=1e-7)
    d = routing_stats(tr)
    grp, free = np.array(d["per_layer"]["group_changed"]), np.array(d["per_layer"]["bias_changed"])
    assert (grp > 0).all() and (free > 0).all()
    assert d["per_layer"]["unused_experts"] == [float((c == 0).sum()) for c in np.array(d["counts_LE"])]
    buf = __import__("io").StringIO()
    assert stats_main(out, as_json=True, out=buf) == 0  # the command reads the logits for these columns
    assert json.loads(buf.getvalue())["per_layer"]["group_changed"] == d["per_layer"]["group_changed"]
