"""eMoE fallback in the offload runtime: no demand load once a layer holds top-k experts, the budget kept, outputs
identical at a 100% budget, and the quality figures (agreement, perplexity) computed."""

from __future__ import annotations

import pytest

from routecast.runtime.offload.fallback import perplexity, token_agreement
from routecast.runtime.offload.run import encode_prompts, run_config
from routecast.trace.capture_inputs import load_model

PROMPTS = [{"prompt": "It is a truth universally acknowledged, that a single man", "max_new_tokens": 6},
           {"prompt": "def parse(text):\n    return", "max_new_tokens": 6}]


@pytest.fixture(scope="module")
def setup():
    model, tok = load_model("builtin")
    reqs = encode_prompts(tok, PROMPTS, None)
    return model, tok, reqs, run_config("builtin", reqs, budget=None)


def test_fallback_never_loads_once_warm_and_keeps_the_budget(setup) -> None:
    _model, _tok, reqs, _ref = setup
    got = run_config("builtin", reqs, budget=8, cfg_kw={"fallback": True, "check": True})  # 8 of 32 experts
    assert got["max_occupied"] <= 8 and got["rerouted"] > 0
    # loads only while the cache is cold (pool not full yet): every other access is served from held experts
    assert got["misses"] <= got["cold_experts"] and got["cold_accesses"] < len(got["log"]) // 4
    assert got["hits"] + got["misses"] == sum(len(e) for _, e, _ in got["log"])


def test_fallback_at_full_budget_is_identical_and_costs_nothing(setup) -> None:
    model, tok, reqs, ref = setup
    got = run_config("builtin", reqs, budget=32, cfg_kw={"fallback": True})
    assert got["tokens"] == ref["tokens"] and token_agreement(ref["tokens"], got["tokens"]) == 1.0
    assert token_agreement([[1, 2, 3]], [[1, 5, 3]]) == pytest.approx(2 / 3)
    texts = [ids for ids, _ in reqs]
    assert perplexity(model, texts) > 1.0


def test_cli_fallback_prints_quality_and_refuses_a_budget_below_top_k_per_layer(capsys) -> None:
    from routecast.cli import main

    args = ["run", "--model", "builtin", "--offload", "--fallback", "--prompts", "corpus:val:1", "--max-new-tokens", "3"]
    assert main([*args, "--budget", "50%"]) == 0
    out = capsys.readouterr().out
    assert "fallback: rerouted" in out and "greedy-token agreement with all-resident" in out
    assert main([*args, "--budget", "4"]) == 2  # 4 layers x top-2 need 8 slots
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "expected at least 8" in err and err.startswith("routecast run: error:")
