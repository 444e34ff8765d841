"""Batched offloaded generation (left-padded): token-for-token identical to all-resident batched generation."""

from __future__ import annotations

import pytest

from routecast.runtime.offload.run import encode_prompts, make_predictor, run_config
from routecast.trace.capture import _generation_setup
from routecast.trace.capture_inputs import load_model

PROMPTS = [{"prompt": "It is a truth universally acknowledged, that a single man", "max_new_tokens": 5},
           {"prompt": "def parse(text):\n    return", "max_new_tokens": 4},
           {"prompt": "The cat", "max_new_tokens": 5}]


@pytest.mark.parametrize("name,prefetch", [("builtin", "lookahead"),
                                           pytest.param("builtin-fine", "none", marks=pytest.mark.slow)])
def test_batched_offload_equals_all_resident_batched(name: str, prefetch: str) -> None:
    model, tok = load_model(name)
    reqs = encode_prompts(tok, PROMPTS, None)
    ref = run_config(name, reqs, budget=None, batch_size=3)
    eos = {int(x) for x in _generation_setup(model, tok)[2]}
    for got_ids, r in zip(ref["tokens"], PROMPTS, strict=True):  # each row keeps its own budget, cut after its EOS
        assert 1 <= len(got_ids) <= r["max_new_tokens"]
        assert len(got_ids) == r["max_new_tokens"] or got_ids[-1] in eos
        assert not eos & set(got_ids[:-1])
    from routecast.trace.capture_arch import spec_from_model

    s = spec_from_model(model)
    budget = max(s.top_k, s.num_layers * s.num_experts // 4)
    got = run_config(name, reqs, budget=budget, prefetch=prefetch, predictor=make_predictor(prefetch, model, name),
                     cfg_kw={"check": True}, batch_size=3)
    assert got["tokens"] == ref["tokens"] and got["max_occupied"] <= budget
    assert got["misses"] > 0  # the batch really ran offloaded
