"""Routing capture from tiny random Hugging Face MoE models (built from configs, nothing downloaded).

The central check, per architecture: perturb one expert's weights at one MoE layer and confirm that
exactly the rows that recorded that expert at that layer change that layer's output (prefill with left
padding, and one cached decode step); then that `capture` maps every processed token back to its
request, position and id (a teacher-forced forward of each request reproduces the trace).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

from routecast.common.errors import ConfigError, TraceError
from routecast.trace.capture import RoutingRecorder, capture, capture_to_disk, load_prompts, spec_from_model
from routecast.trace.capture_arch import SUPPORTED, find_blocks
from routecast.trace.io import TraceWriter, read_trace
from routecast.trace.trace import DECODE, PREFILL

torch.set_num_threads(1)
transformers = pytest.importorskip("transformers")

V = 128  # vocabulary; ids 0 pad, 1 eos
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, eos_token_id=1, bos_token_id=None)
MLA = dict(num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
           moe_intermediate_size=32, first_k_dense_replace=1, n_shared_experts=1, n_routed_experts=8)
CONFIGS = {
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=32, mlp_only_layers=[1]),
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=8),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "deepseek_v2": dict(**MLA, q_lora_rank=None, num_experts_per_tok=2, n_group=2, topk_group=1,
                        topk_method="group_limited_greedy"),
    "deepseek_v3": dict(**MLA, q_lora_rank=16, num_experts_per_tok=2, n_group=4, topk_group=2),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, head_dim=8),
    "phimoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "glm4_moe": dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
                     n_shared_experts=1, n_group=2, topk_group=1, head_dim=8),
    "llama4_text": dict(intermediate_size=32, intermediate_size_mlp=64, num_hidden_layers=4, head_dim=8,
                        num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2),
    "dbrx": dict(d_model=32, n_heads=4, n_layers=3, max_seq_len=128, vocab_size=V, pad_token_id=0, eos_token_id=1,
                 ffn_config=dict(ffn_hidden_size=64, moe_num_experts=4, moe_top_k=2),
                 attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0)),
    "switch_transformers": dict(vocab_size=V, d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=4,
                                num_decoder_layers=4, num_experts=4, expert_capacity=3, num_sparse_encoder_layers=2,
                                num_sparse_decoder_layers=2, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
}
ARCHS = sorted(CONFIGS)
STANDALONE = ("dbrx", "switch_transformers")  # configs that do not take the common BASE keys


def build(arch: str, seed: int = 0, **over) -> nn.Module:
    kw = dict(CONFIGS[arch]) if arch in STANDALONE else {**BASE, **CONFIGS[arch]}
    cfg = transformers.AutoConfig.for_model(arch, **{**kw, **over})
    torch.manual_seed(seed)
    auto = transformers.AutoModelForSeq2SeqLM if cfg.is_encoder_decoder else transformers.AutoModelForCausalLM
    model = auto.from_config(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in find_blocks(model):  # init std 0.02 gives near-uniform routers: spread them
            for p in b.router.parameters():
                if p.ndim == 2:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            bias = getattr(b.router, "e_score_correction_bias", None)
            if bias is not None:  # a zero bias would leave the bias-corrected group choice untested
                bias.copy_(torch.rand(bias.shape, generator=g) * 0.2)
    return model


def perturb(experts: nn.Module, e: int, E: int) -> None:
    """Add noise to every weight of expert e (fused [E,...] params, DBRX [E*I,H] params, or a ModuleDict)."""
    g = torch.Generator().manual_seed(e)
    with torch.no_grad():
        if isinstance(experts, nn.ModuleDict):
            params = [p for p in experts[f"expert_{e}"].parameters()]
        else:
            params = [p.view(E, -1)[e] for p in experts.parameters() if p.shape[0] % E == 0]
        assert params
        for p in params:
            p.add_(torch.randn(p.shape, generator=g))


def layer_outputs(model: nn.Module, paths: list[str], run) -> dict[str, torch.Tensor]:
    """Run run() and return each named layer's output as rows [B*S, H]."""
    got: dict[str, torch.Tensor] = {}
    hooks = [model.get_submodule(p).register_forward_hook(
        lambda m, a, o, p=p: got.__setitem__(p, (o[0] if isinstance(o, tuple) else o).reshape(-1, o[0].shape[-1]
                                                  if isinstance(o, tuple) else o.shape[-1]).clone()))
        for p in paths]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return got


def check_executed(model: nn.Module, rec: RoutingRecorder, fw, run, valid: torch.Tensor) -> tuple[int, int]:
    """For every MoE layer of fw's stack, perturb its most evenly used expert: exactly its rows change.

    Returns (layers checked, layers where that expert was used by some rows but not all).
    """
    E = rec.spec.num_experts
    ids, w = torch.from_numpy(fw.experts_TLK.astype(np.int64)), torch.from_numpy(fw.weights_TLK)
    checked = split = 0
    for li, b in enumerate(rec.blocks):
        if b.stack != fw.stack:
            continue
        uses = ((ids[:, li, :, None] == torch.arange(E)) & (w[:, li, :, None] != 0)).any(1)[valid]  # [T, E]
        e = int(torch.minimum(uses.sum(0), (~uses).sum(0)).argmax())
        before = layer_outputs(model, [b.layer_path], run)[b.layer_path]
        saved = copy.deepcopy(b.experts.state_dict())
        perturb(b.experts, e, E)
        after = layer_outputs(model, [b.layer_path], run)[b.layer_path]
        b.experts.load_state_dict(saved)
        changed = (after != before).any(-1)[valid]
        assert uses[:, e].any()
        assert torch.equal(changed, uses[:, e]), f"layer {b.path} expert {e}: changed rows differ from recorded ones"
        checked += 1
        split += int(not uses[:, e].all())
    return checked, split


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ("the a cat dog sat on mat ran fast slow red blue green one two three four five six seven eight nine "
             "ten if else for while def return import class print").split()
    vocab = {"[PAD]": 0, "[EOS]": 1, "[UNK]": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", eos_token="[EOS]",
                                                unk_token="[UNK]")


PROMPTS = [
    {"prompt": "the cat sat on the mat", "task": "story", "arrival_s": 0.5},
    {"prompt": "def return", "task": "code", "max_new_tokens": 2},
    {"prompt": "red blue green one two three four five", "task": "story"},
]


# ---------------------------------------------------------------------- executed ids, per architecture
@pytest.mark.parametrize("arch", ARCHS)
def test_recorded_experts_are_the_executed_ones(arch: str) -> None:
    model = build(arch)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(3, V, (3, 7), generator=g)
    mask = torch.ones_like(x)
    enc_dec = model.config.is_encoder_decoder
    if enc_dec:  # right padding, as capture does for encoder-decoder models
        mask[1, 4:] = 0
        mask[2, 6:] = 0
        y = torch.randint(3, V, (3, 5), generator=g)
        def run():
            with torch.no_grad():
                model(input_ids=x, attention_mask=mask, decoder_input_ids=y)
    else:
        mask[1, :3] = 0
        mask[2, :1] = 0
        def run():
            with torch.no_grad():
                model(input_ids=x, attention_mask=mask)
    with RoutingRecorder(model) as rec:
        run()
        fws = rec.forwards()
        rec.reset()
        assert len(fws) == (2 if enc_dec else 1)
        checked, split = check_executed(model, rec, fws[0], run, mask.reshape(-1).bool())
        if enc_dec:
            c2, s2 = check_executed(model, rec, fws[1], run, torch.ones(y.numel(), dtype=torch.bool))
            checked, split = checked + c2, split + s2
            assert (fws[0].experts_TLK == -1).any(), "capacity 3 for 7 tokens should drop some"
    assert checked == split == rec.spec.num_layers
    ids = fws[0].experts_TLK[mask.reshape(-1).bool().numpy()]
    live = ids[:, [i for i, b in enumerate(rec.blocks) if b.stack == 0]]
    assert ((live >= -1) & (live < rec.spec.num_experts)).all()
    if rec.spec.n_group > 1:  # group-limited routing: experts of at most topk_group groups per token
        groups = live // (rec.spec.num_experts // rec.spec.n_group)
        n_groups = np.array([[len(set(r)) for r in tok] for tok in groups])
        assert n_groups.max() <= rec.spec.topk_group


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "switch_transformers"])
def test_decode_step_records_the_executed_experts(arch: str) -> None:
    model = build(arch)
    g = torch.Generator().manual_seed(2)
    x = torch.randint(3, V, (6, 6), generator=g)
    mask = torch.ones_like(x)
    mask[0, :2] = 0
    with torch.no_grad():
        cache = model(input_ids=x, attention_mask=mask, use_cache=True).past_key_values
    nxt = torch.randint(3, V, (6, 1), generator=g)
    mask2 = torch.cat([mask, torch.ones_like(nxt)], 1)

    def run():
        with torch.no_grad():
            model(input_ids=nxt, attention_mask=mask2, past_key_values=copy.deepcopy(cache), use_cache=True)

    with RoutingRecorder(model) as rec:
        run()
        (fw,) = rec.forwards()
        rec.reset()
        assert fw.num_rows == 6
        checked, split = check_executed(model, rec, fw, run, torch.ones(6, dtype=torch.bool))
        assert checked == rec.spec.num_layers and split >= 1


# ---------------------------------------------------------------------- capture bookkeeping, per architecture
def teacher_forced(model: nn.Module, prompt_ids: np.ndarray, dec_ids: np.ndarray):
    """Unpadded single-request forward: (routing rows in trace order, next-token argmax per row)."""
    with RoutingRecorder(model) as rec, torch.no_grad():
        if model.config.is_encoder_decoder:
            start = np.array([model.config.decoder_start_token_id])
            dec = torch.from_numpy(np.concatenate([start, dec_ids]))[None]
            out = model(input_ids=torch.from_numpy(prompt_ids)[None], decoder_input_ids=dec)
            enc, dfw = rec.forwards()
            ids = np.concatenate([enc.experts_TLK, dfw.experts_TLK])
            return ids, out.logits[0].argmax(-1).numpy()
        seq = torch.from_numpy(np.concatenate([prompt_ids, dec_ids]))[None]
        out = model(input_ids=seq)
        (fw,) = rec.forwards()
        return fw.experts_TLK, out.logits[0].argmax(-1).numpy()


@pytest.mark.parametrize("arch", ARCHS)
def test_capture_maps_rows_to_tokens(arch: str, tokenizer, tmp_path) -> None:
    over = {"expert_capacity": 64} if arch == "switch_transformers" else {}  # no drops: compare with one pass
    model = build(arch, **over)
    model.generation_config.eos_token_id = None  # only the budgets end requests here (eos: tested below)
    w = TraceWriter(tmp_path / "t", spec_from_model(model), task_names=("code", "story"))
    summary = capture(model, tokenizer, PROMPTS, w, max_new_tokens=5, batch_size=2, progress=False, logits=True,
                      hidden=True)  # also: no architecture changes router inputs or outputs in place
    tr = read_trace(w.close())
    assert summary["requests"] == 3 and summary["tokens"] == tr.num_tokens
    assert tr.logits_TLE.shape[1:] == (tr.spec.num_layers, tr.spec.num_experts)
    assert tr.hidden_TLH.shape[1:] == (tr.spec.num_layers, tr.spec.hidden_size)
    enc_dec = model.config.is_encoder_decoder
    agree = total = 0
    for req, idx in tr.requests():
        rec = PROMPTS[req]
        p_ids = np.asarray(tokenizer(rec["prompt"])["input_ids"])
        phase, pos = tr.phase[idx], tr.position[idx]
        np.testing.assert_array_equal(pos, np.arange(len(idx)))  # trace order = position order per request
        np.testing.assert_array_equal(tr.token_id[idx][: len(p_ids)], p_ids)
        assert (phase[: len(p_ids)] == PREFILL).all() and (phase[len(p_ids):] == DECODE).all()
        n_dec = len(idx) - len(p_ids)
        budget = rec.get("max_new_tokens", 5)
        assert n_dec == (budget if enc_dec else budget - 1)
        assert len(np.unique(tr.step[idx][: len(p_ids)])) == 1 and (np.diff(tr.step[idx][len(p_ids) - 1:]) == 1).all()
        assert tr.task[idx][0] == tr.task_names.index(rec["task"])
        assert tr.arrival_s[idx][0] == rec.get("arrival_s", 0.0)
        dec_ids = tr.token_id[idx][len(p_ids):][int(enc_dec):]  # enc-dec: the first is the start token
        routed, greedy = teacher_forced(model, p_ids, dec_ids)
        got = np.sort(tr.experts_TLK[idx], -1)
        agree += (np.sort(routed, -1) == got).all(-1).sum()
        total += got.shape[0] * got.shape[1]
        # the token fed at each decode step is the greedy choice after the previous one
        nxt = tr.token_id[idx][len(p_ids) + int(enc_dec):]
        prev = greedy[len(p_ids) - 1: len(p_ids) - 1 + len(nxt)] if not enc_dec else greedy[: len(nxt)]
        assert (prev == nxt).mean() >= 0.75
    assert agree / total >= 0.97, f"only {agree}/{total} (token, layer) expert sets match a teacher-forced pass"


# ---------------------------------------------------------------------- spec, errors, resume, options
def test_spec_from_model_counts_moe_layers_only() -> None:
    s = spec_from_model(build("mixtral"))
    assert (s.num_layers, s.num_experts, s.top_k, s.hidden_size, s.layer_ids) == (3, 4, 2, 32, (0, 1, 2))
    assert s.expert_bytes == (2 * 64 * 32 + 32 * 64) * 4 and s.num_shared_experts == 0
    s = spec_from_model(build("qwen2_moe"))
    assert s.layer_ids == (0, 2) and s.num_shared_experts == 1
    s = spec_from_model(build("deepseek_v3"))
    assert (s.layer_ids, s.num_experts, s.n_group, s.topk_group, s.num_shared_experts) == ((1, 2), 8, 4, 2, 1)
    assert s.expert_bytes == 3 * 32 * 32 * 4
    s = spec_from_model(build("switch_transformers"))
    assert (s.layer_ids, s.top_k) == ((1, 3, 5, 7), 1)
    assert spec_from_model(build("dbrx")).expert_bytes == 3 * 64 * 32 * 4
    assert spec_from_model(build("deepseek_v2", topk_method="greedy")).n_group == 1


def test_unsupported_architecture_is_a_config_error() -> None:
    cfg = transformers.AutoConfig.for_model("llama", **{k: v for k, v in BASE.items()})
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(ConfigError, match="not supported.*mixtral") as err:
        RoutingRecorder(model)
    assert all(a in str(err.value) for a in SUPPORTED)


def test_logits_and_hidden_are_the_router_view(tokenizer, tmp_path) -> None:
    model = build("mixtral")
    w = TraceWriter(tmp_path / "t", spec_from_model(model), task_names=("code", "story"))
    capture(model, tokenizer, PROMPTS, w, max_new_tokens=3, batch_size=3, logits=True, hidden=True, progress=False)
    tr = read_trace(w.close())
    for i, blk in enumerate(RoutingRecorder(model).blocks):
        lg = torch.from_numpy(np.array(tr.hidden_TLH[:, i])) @ blk.router.weight.detach().T
        np.testing.assert_allclose(tr.logits_TLE[:, i], lg.numpy(), rtol=1e-4, atol=1e-5)
        top = np.sort(np.argsort(-tr.logits_TLE[:, i], -1)[:, :2], -1)
        assert (top == np.sort(tr.experts_TLK[:, i], -1)).mean() > 0.95


def test_eos_and_per_request_budgets_end_requests(tokenizer, tmp_path) -> None:
    model = build("mixtral")
    w = TraceWriter(tmp_path / "a", spec_from_model(model), task_names=("code", "story"))
    capture(model, tokenizer, PROMPTS, w, max_new_tokens=6, batch_size=3, progress=False)
    first = read_trace(w.close())
    fed = {r: first.token_id[i][first.phase[i] == DECODE] for r, i in first.requests()}
    eos = int(fed[0][1])  # request 0's 2nd generated token becomes the eos: it then ends after one fed token
    model.generation_config.eos_token_id = eos
    w = TraceWriter(tmp_path / "b", spec_from_model(model), task_names=("code", "story"))
    s = capture(model, tokenizer, PROMPTS, w, max_new_tokens=6, batch_size=3, progress=False)
    tr = read_trace(w.close())
    for r, toks in fed.items():  # a request stops feeding tokens at its first eos, or at its own budget
        assert len(toks) == PROMPTS[r].get("max_new_tokens", 6) - 1
        hit = np.flatnonzero(toks == eos)
        want = hit[0] if hit.size else len(toks)
        assert int(((tr.request == r) & (tr.phase == DECODE)).sum()) == want
    assert int(((tr.request == 0) & (tr.phase == DECODE)).sum()) <= 1
    assert s["decode_tokens"] == int((tr.phase == DECODE).sum())
    # rows of finished requests are not in the trace: a step never holds more rows than live requests
    dec = tr.select(tr.phase == DECODE)
    assert max(len(i) for _, i in dec.batches()) <= 3


def test_prefill_only_and_resume(tokenizer, tmp_path) -> None:
    model = build("olmoe")
    spec = spec_from_model(model)
    prompts = [{k: v for k, v in p.items() if k != "max_new_tokens"} for p in PROMPTS]
    with pytest.raises(KeyboardInterrupt), TraceWriter(tmp_path / "t", spec, task_names=("code", "story")) as w:
        flush, calls = w.flush, []

        def interrupted_flush() -> None:  # the third batch is cut off before it commits
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            flush()

        w.flush = interrupted_flush
        capture(model, tokenizer, prompts, w, max_new_tokens=0, batch_size=1, progress=False)
    w = TraceWriter(tmp_path / "t", spec, task_names=("code", "story"), resume=True)
    s = capture(model, tokenizer, prompts, w, max_new_tokens=0, batch_size=2, progress=False)
    assert (s["skipped"], s["requests"]) == (2, 1)
    tr = read_trace(w.close())
    assert sorted(np.unique(tr.request)) == [0, 1, 2]
    assert len(np.unique(tr.step)) == 3  # steps stay unique across the resumed run
    assert (tr.phase == PREFILL).all()


def test_bad_inputs_name_the_argument(tokenizer, tmp_path) -> None:
    model = build("mixtral")
    w = TraceWriter(tmp_path / "t", spec_from_model(model), task_names=("story",))
    with pytest.raises(ConfigError, match="task 'code'"):
        capture(model, tokenizer, PROMPTS, w, progress=False)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        capture(model, tokenizer, [{"prompt": "a", "max_new_tokens": -1}], w, progress=False)
    with pytest.raises(ConfigError, match="request id 3"):
        capture(model, tokenizer, [{"prompt": "a", "request": 3}, {"prompt": "b", "request": 3}], w, progress=False)
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(ConfigError, match="line 2"):
        load_prompts(bad)
    bad.write_text('{"text": "a"}\n')
    with pytest.raises(ConfigError, match="p.jsonl: record 0 has prompt None"):
        load_prompts(bad)
    with pytest.raises(ConfigError, match="no config.json"):
        capture_to_disk(tmp_path, PROMPTS, tmp_path / "x", max_new_tokens=1, batch_size=1)


def test_in_place_change_after_the_hook_is_caught() -> None:
    model = build("mixtral")
    with RoutingRecorder(model, hidden=True) as rec:
        with torch.no_grad():
            model(input_ids=torch.tensor([[3, 4, 5]]))
    rec._hd[0][0].mul_(2)  # what a model mutating its router input after routing would do
    with pytest.raises(TraceError, match="modified in place"):
        rec.forwards()


def test_capture_to_disk_end_to_end(tokenizer, tmp_path) -> None:
    model = build("qwen3_moe")
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n")
    out = capture_to_disk(tmp_path / "m", prompts, tmp_path / "trace", max_new_tokens=3, batch_size=2,
                          hidden=True, logits=False, progress=False)
    tr = read_trace(out)
    assert tr.task_names == ("code", "story") and tr.hidden_TLH is not None and tr.logits_TLE is None
    assert tr.provenance["model_type"] == "qwen3_moe" and tr.spec.num_experts == 8
    again = capture_to_disk(tmp_path / "m", prompts, tmp_path / "trace", max_new_tokens=3, batch_size=2,
                            hidden=True, progress=False)  # resume of a finished trace: nothing to add
    assert read_trace(again).num_tokens == tr.num_tokens


def test_corpus_prompts_come_from_routecast_models(tokenizer) -> None:
    recs = load_prompts("corpus:bible:3", tokenizer)
    assert [r["request"] for r in recs] == [0, 1, 2] and {r["task"] for r in recs} == {"bible"}
    assert all(r["prompt"] and r["max_new_tokens"] >= 1 for r in recs)
    assert np.all(np.diff([r["arrival_s"] for r in recs]) >= 0)
    with pytest.raises(ConfigError, match="neither a split"):
        load_prompts("corpus:poetry", tokenizer)


def test_builtin_model_loads_or_names_the_missing_file(tmp_path) -> None:
    from routecast.models.builtin import REQUIRED_FILES, builtin_path

    if not all((builtin_path() / f).is_file() for f in REQUIRED_FILES):
        with pytest.raises(ConfigError, match="missing"):
            capture_to_disk("builtin", PROMPTS, tmp_path / "t", max_new_tokens=2, batch_size=2)
        return
    out = capture_to_disk("builtin", PROMPTS, tmp_path / "t", max_new_tokens=2, batch_size=2, progress=False)
    tr = read_trace(out)
    assert tr.spec.num_layers == 4 and tr.spec.num_experts == 8 and tr.spec.top_k == 2
    assert sorted(np.unique(tr.request)) == [0, 1, 2]
