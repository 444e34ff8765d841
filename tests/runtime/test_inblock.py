"""PROBE's lookahead at run time (runtime/offload/inblock.py): the first-layer forecast is layer 0's own router on
the decoder layer's normed input, and the engine prefetches it (recorded for the replay)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from routecast.runtime.offload.inblock import InBlockLookahead
from routecast.runtime.offload.run import encode_prompts, make_predictor, run_config
from routecast.trace.capture_arch import find_blocks, spec_from_model
from routecast.trace.capture_inputs import load_model


@pytest.mark.parametrize("name", ["builtin", "builtin-fine"])
def test_first_sets_are_layer_zeros_own_routing_of_the_normed_input(name) -> None:
    model, _tok = load_model(name)
    blocks = find_blocks(model)
    spec = spec_from_model(model, blocks)
    la = InBlockLookahead(make_predictor("lookahead", model, name), model, blocks, top_k=spec.top_k, prefetch_top=0,
                          min_prob=0.0, first=spec.top_k)
    assert la.first_module is not None
    norm = la._first[0]
    got: list[np.ndarray] = []
    hook = blocks[0].experts.register_forward_pre_hook(lambda _m, args: got.append(args[1].numpy()))
    try:
        for seed in range(4):
            h = torch.randn(3, spec.hidden_size, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                blocks[0].block(norm(h)[None])  # the MoE block on exactly the router input the forecast assumes
            routed = np.zeros(spec.num_experts, bool)
            routed[got[-1].reshape(-1)] = True
            assert np.array_equal(la.first_sets(h)[0], routed)
    finally:
        hook.remove()


@pytest.mark.parametrize("name", ["builtin", "builtin-fine"])
def test_compiled_paths_equal_the_torch_paths(name) -> None:
    model, _tok = load_model(name)
    blocks = find_blocks(model)
    spec = spec_from_model(model, blocks)
    pred = make_predictor("lookahead", model, name)
    fast = InBlockLookahead(pred, model, blocks, top_k=spec.top_k, prefetch_top=0, min_prob=0.0, first=3)
    slow = InBlockLookahead(pred, model, blocks, top_k=spec.top_k, prefetch_top=0, min_prob=0.0, first=3)
    slow.mlp = [True] * len(slow.mlp)  # the residual MLP path (zero MLP: the same logits through torch)
    slow._first = (*slow._first[:-1], None)  # the norm as a module
    for seed in range(5):
        h = torch.randn(1 + seed % 3, spec.hidden_size, generator=torch.Generator().manual_seed(seed))
        for li in range(spec.num_layers - 1):
            assert np.array_equal(fast.next_sets(li, h), slow.next_sets(li, h))
        got = fast.first_sets(h)
        top = min(3, spec.top_k)
        assert np.array_equal(got, slow.first_sets(h)) and got.sum() <= top * h.shape[0]
        if h.shape[0] == 1:
            assert got.sum() == top  # one token: its best three (at most its top-k)


def test_no_norm_no_first_layer_forecast() -> None:
    model, _tok = load_model("builtin")
    blocks = find_blocks(model)
    spec = spec_from_model(model, blocks)
    pred = make_predictor("lookahead", model, "builtin")
    assert InBlockLookahead(pred, model, blocks, top_k=spec.top_k, prefetch_top=0, min_prob=0.0,
                            first=0).first_module is None
    moved = [replace(blocks[0], layer_path="model"), *blocks[1:]]  # a parent with no post-attention norm
    assert InBlockLookahead(pred, model, moved, top_k=spec.top_k, prefetch_top=0, min_prob=0.0,
                            first=2).first_module is None


def test_the_engine_prefetches_layer_zero_only_when_asked() -> None:
    model, tok = load_model("builtin-fine")
    reqs = encode_prompts(tok, [{"prompt": "It is a truth universally acknowledged", "max_new_tokens": 4}], None)
    s = spec_from_model(model)
    budget = s.num_layers * s.num_experts // 4
    pred = make_predictor("lookahead", model, "builtin-fine")
    on = run_config("builtin-fine", reqs, budget=budget, prefetch="lookahead", predictor=pred, cfg_kw={"check": True})
    off = run_config("builtin-fine", reqs, budget=budget, prefetch="lookahead", predictor=pred,
                     cfg_kw={"check": True, "lookahead_first": 0})
    assert on["tokens"] == off["tokens"]
    assert on["pred_sets"][:, 0].any(axis=-1).all()  # every step forecast layer 0
    assert not off["pred_sets"][:, 0].any()
    assert on["misses"] < off["misses"]  # layer 0's forecast turns some of its demand reads into prefetches


def test_the_default_skips_a_first_layer_fed_by_the_embeddings() -> None:
    model, tok = load_model("builtin")  # its first MoE layer is model layer 0: its input is the token embeddings
    reqs = encode_prompts(tok, [{"prompt": "It is a truth universally acknowledged", "max_new_tokens": 3}], None)
    s = spec_from_model(model)
    pred = make_predictor("lookahead", model, "builtin")
    kw = dict(budget=s.num_layers * s.num_experts // 2, prefetch="lookahead", predictor=pred)
    assert not run_config("builtin", reqs, **kw)["pred_sets"][:, 0].any()
    assert run_config("builtin", reqs, cfg_kw={"lookahead_first": 1}, **kw)["pred_sets"][:, 0].any(axis=-1).all()
