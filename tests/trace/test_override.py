"""Routing override (eMoE fallback, random routing) in the real forward pass of tiny and built-in MoE models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from routecast.common.errors import ConfigError
from routecast.trace.capture import RoutingRecorder
from routecast.trace.capture_arch import find_blocks
from routecast.trace.override import RoutingOverride, fallback_routing
from tests.trace.test_capture import CONFIGS, build

TOPK_ARCHS = sorted(a for a in CONFIGS if a not in ("switch_transformers", "llama4_text"))


def poison(experts: nn.Module, keep_E: np.ndarray) -> None:
    """Set every weight of the experts not in keep_E to NaN: a token that reaches one gets NaN logits."""
    E = keep_E.size
    with torch.no_grad():
        for p in experts.parameters():
            if p.shape[0] % E == 0:
                v = p.view(E, -1)
                v[torch.from_numpy(~keep_E)] = float("nan")


def random_resident(L: int, E: int, K: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = np.zeros((L, E), bool)
    for layer in range(L):
        r[layer, rng.choice(E, size=max(n, K), replace=False)] = True
    return r


def _x(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(2, vocab, (2, 12), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v3"])
def test_all_resident_gives_the_original_logits_exactly(arch):
    model = build(arch)
    x = _x(model.config.vocab_size)
    with torch.no_grad():
        ref = model(x).logits
        with RoutingOverride(model) as ov:
            ov.set_resident(np.ones((ov.spec.num_layers, ov.spec.num_experts), bool))
            got = model(x).logits
    assert torch.equal(ref, got)


@pytest.mark.parametrize("arch", TOPK_ARCHS)
def test_no_token_uses_a_non_resident_expert(arch):
    model = build(arch)
    x = _x(model.config.vocab_size, 1)
    with RoutingOverride(model) as ov:
        s = ov.spec
        res = random_resident(s.num_layers, s.num_experts, s.top_k, s.num_experts // 2, seed=3)
        ov.set_resident(res)
        for b, keep in zip(ov.blocks, res, strict=True):
            poison(b.experts, keep)
        with RoutingRecorder(model) as rec, torch.no_grad():  # installed after the override: sees the rewrite
            logits = model(x).logits
        assert torch.isfinite(logits).all()
        assert ov.rerouted_L.sum() > 0
        for fw in rec.forwards():
            for layer in range(s.num_layers):
                ids = fw.experts_TLK[:, layer]
                if (ids >= 0).any():
                    assert res[layer][ids[ids >= 0]].all()
                    assert all(len(set(r)) == s.top_k for r in ids.tolist())  # still K distinct experts


def test_mixtral_fallback_equals_the_router_restricted_to_resident_experts():
    model = build("mixtral")
    x = _x(model.config.vocab_size, 2)
    blocks = find_blocks(model)
    seen = {}

    def keep_input(_m, args, _out):
        seen["in"] = args[0].clone()

    h = blocks[0].router.register_forward_hook(keep_input)
    with RoutingOverride(model) as ov:
        res = np.zeros((ov.spec.num_layers, ov.spec.num_experts), bool)
        res[:, [0, 2, 3]] = True
        ov.set_resident(res)
        with RoutingRecorder(model) as rec, torch.no_grad():
            model(x)
    h.remove()
    fw = rec.forwards()[0]
    logits = torch.nn.functional.linear(seen["in"].reshape(-1, seen["in"].shape[-1]), blocks[0].router.weight)
    masked = logits.masked_fill(~torch.from_numpy(res[0]), float("-inf")).softmax(-1)
    w, i = masked.topk(2, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    got_i = torch.from_numpy(fw.experts_TLK[:, 0].astype(np.int64))
    got_w = torch.from_numpy(fw.weights_TLK[:, 0])
    assert torch.equal(got_i.sort(-1).values, i.sort(-1).values)
    order = lambda ids, ws: ws.gather(1, ids.argsort(-1))  # noqa: E731
    assert torch.allclose(order(got_i, got_w), order(i, w), atol=1e-6)


def test_fallback_worked_example():
    # 1 token, E = 5, K = 2: it picks experts 3 (score 4) and 1 (score 3); only 0, 1, 4 are resident.
    choice = torch.tensor([[1.0, 3.0, 0.0, 4.0, 2.0]])
    prob = choice.softmax(-1)
    ids = torch.tensor([[3, 1]])
    w = torch.tensor([[0.7, 0.3]])
    res = torch.tensor([True, True, False, False, True])
    new, neww, moved = fallback_routing(ids, w, choice, prob, res)
    assert new.tolist() == [[4, 1]]  # 3 -> next best resident not used yet: 4 (score 2), not 0 (score 1)
    p = prob[0, [4, 1]]
    assert torch.allclose(neww[0], p / p.sum())  # renormalised to the original mass 1.0
    assert moved.tolist() == [[True, False]]
    unchanged = fallback_routing(torch.tensor([[1, 4]]), w, choice, prob, res)
    assert unchanged[1] is w  # nothing to reroute: the weights object itself comes back


def test_random_layers_reroute_only_those_layers_and_are_seeded():
    model = build("mixtral")
    x = _x(model.config.vocab_size, 4)
    outs = []
    for _ in range(2):
        with RoutingOverride(model) as ov, torch.no_grad():
            ov.set_random({0}, seed=7)
            outs.append(model(x).logits)
            assert ov.rerouted_L[0] > 0 and ov.rerouted_L[1:].sum() == 0
    assert torch.equal(outs[0], outs[1])
    with torch.no_grad():
        assert not torch.equal(model(x).logits, outs[0])


def test_desired_records_the_routers_own_choice():
    model = build("mixtral")
    x = _x(model.config.vocab_size, 5)
    with RoutingRecorder(model) as rec, torch.no_grad():
        model(x)
    truth = rec.forwards()[0].experts_TLK
    with RoutingOverride(model, record=True) as ov, torch.no_grad():
        res = np.zeros((ov.spec.num_layers, ov.spec.num_experts), bool)
        res[:, :2] = True
        ov.set_resident(res)
        model(x)
        (d,) = ov.desired()
    assert np.array_equal(d[:, 0], truth[:, 0])  # layer 0 sees the unchanged input: same choice


def test_bad_resident_sets_and_architectures_are_refused():
    model = build("mixtral")
    ov = RoutingOverride(model)
    with pytest.raises(ConfigError, match="shape"):
        ov.set_resident(np.ones((1, 2), bool))
    with pytest.raises(ConfigError, match="fewer than top-k"):
        ov.set_resident(np.eye(ov.spec.num_layers, ov.spec.num_experts, dtype=bool))
    with pytest.raises(ConfigError, match="out of range"):
        ov.set_random({9})
    with pytest.raises(ConfigError, match="not supported"):
        RoutingOverride(build("llama4_text"))


@pytest.mark.parametrize("name", ["builtin", "builtin-fine"])
def test_builtin_models_exact_when_all_resident_and_never_use_others(name):
    from routecast.models.builtin import load_builtin

    model, _ = load_builtin(name)
    x = torch.randint(5, 4000, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(x).logits
        with RoutingOverride(model) as ov:
            s = ov.spec
            ov.set_resident(np.ones((s.num_layers, s.num_experts), bool))
            assert torch.equal(model(x).logits, ref)
            res = random_resident(s.num_layers, s.num_experts, s.top_k, s.num_experts // 4, seed=1)
            ov.set_resident(res)
            for b, keep in zip(ov.blocks, res, strict=True):
                poison(b.experts, keep)
            with RoutingRecorder(model) as rec:
                got = model(x).logits
    assert torch.isfinite(got).all() and ov.rerouted_L.sum() > 0
    ids = rec.forwards()[0].experts_TLK  # what the experts executed, counted by the capture hooks
    assert all(res[layer][ids[:, layer]].all() for layer in range(s.num_layers))


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 12), E=st.integers(2, 16), K=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_fallback_properties(T, E, K, seed):
    K = min(K, E)
    g = torch.Generator().manual_seed(seed)
    choice = torch.randn(T, E, generator=g)
    ids = choice.topk(K, dim=-1).indices
    prob = choice.softmax(-1)
    w = prob.gather(1, ids)
    w = w / w.sum(-1, keepdim=True)
    res = torch.zeros(E, dtype=torch.bool)
    res[torch.randperm(E, generator=g)[: int(torch.randint(K, E + 1, (1,), generator=g))]] = True
    new, neww, moved = fallback_routing(ids, w, choice, prob, res)
    assert res[new].all()  # only resident experts
    assert all(len(set(r)) == K for r in new.tolist())  # K distinct experts per token
    assert torch.equal(new[~moved], ids[~moved])  # resident choices kept in place
    assert torch.allclose(neww.sum(-1), w.sum(-1), atol=1e-5)  # gate mass kept
    same = ~moved.any(-1)
    assert torch.equal(neww[same], w[same])  # untouched rows bit-identical
    # every substitute outranks every resident expert the token does not use
    for t in range(T):
        unused = [e for e in range(E) if res[e] and e not in new[t].tolist()]
        subs = new[t][moved[t]].tolist()
        if unused and subs:
            assert min(choice[t, subs]) >= max(choice[t, unused])
