"""Offloaded generation on the built-in models: token-for-token identical to all-resident, the runtime's hit
ratio equal to the replay's on its own access log (the kernel's LRU; the slot replay with prefetch), the disk
tier's bytes, and bad input."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch

from routecast.cache.replay import ReplayConfig, run_policy
from routecast.cache.slots import replay_slots
from routecast.cli import main
from routecast.common.errors import ConfigError
from routecast.runtime.offload.run import (
    accesses_from_log,
    encode_prompts,
    logits_match,
    make_predictor,
    replay_feed,
    run_config,
)
from routecast.sim.hardware import load_hardware
from routecast.trace.capture_inputs import load_model

PROMPTS = [{"prompt": "It is a truth universally acknowledged, that a single man", "max_new_tokens": 6},
           {"prompt": "def parse(text):\n    return", "max_new_tokens": 6}]


@pytest.fixture(scope="module", params=["builtin", "builtin-fine"])
def setup(request):
    model, tok = load_model(request.param)
    reqs = encode_prompts(tok, PROMPTS, None)
    ref = run_config(request.param, reqs, budget=None, logits=True)
    return request.param, model, reqs, ref


@pytest.mark.parametrize("frac,prefetch", [(0.25, "lookahead"), pytest.param(0.5, "none", marks=pytest.mark.slow)])
def test_greedy_tokens_identical_to_all_resident(setup, frac, prefetch) -> None:
    name, model, reqs, ref = setup
    pred = make_predictor(prefetch, model, name)
    from routecast.trace.capture_arch import spec_from_model

    s = spec_from_model(model)
    budget = max(1, int(frac * s.num_layers * s.num_experts))
    got = run_config(name, reqs, budget=budget, prefetch=prefetch, predictor=pred, cfg_kw={"check": True}, logits=True)
    assert got["tokens"] == ref["tokens"]
    assert logits_match(ref["logits"], got["logits"])[0]  # every step's logits, not only the greedy ids
    assert got["max_occupied"] <= budget
    assert got["tier_mode"] in ("o_direct", "fadvise")
    assert got["bytes_read"] >= got["reads"] * got["expert_bytes"]  # every read fetched at least one expert
    if prefetch != "none":
        assert got["prefetch_issued"] > 0 and got["pred_sets"].shape[1:] == (s.num_layers, s.num_experts)
    # the replay of the runtime's own access log and forecast sets counts the same hits (timing-free definition)
    acc = accesses_from_log(got["log"], got["L"], got["E"], 1)
    rep = replay_slots(acc.req_off, acc.req_key, acc.L, acc.E, budget, pred_SLE=got["pred_sets"],
                       layer_ahead=prefetch == "lookahead")
    assert (rep["hits"], rep["misses"], rep["prefetch_issued"]) == (got["hits"], got["misses"], got["prefetch_issued"])
    assert rep["hit_ratio"] == got["hit_ratio"] and got["late"] <= got["hits"]


def test_per_layer_pools_keep_tokens_and_per_layer_budget(setup) -> None:
    name, _model, reqs, ref = setup
    got = run_config(name, reqs, budget=12, prefetch="none", cfg_kw={"check": True, "per_layer": True})
    assert got["tokens"] == ref["tokens"] and got["max_occupied"] <= 12


def test_runtime_lru_hit_ratio_equals_replay_on_its_access_log(setup) -> None:
    name, _model, reqs, ref = setup
    got = run_config(name, reqs, budget=5, prefetch="none")
    acc = accesses_from_log(got["log"], got["L"], got["E"], 1)
    row = run_policy(acc, "lru", ReplayConfig(budget=5, hardware=load_hardware("h100-sxm")), expert_bytes=got["expert_bytes"])
    assert row["demand_loads"] == got["misses"]
    assert row["hit_ratio"] == pytest.approx(got["hit_ratio"], abs=1e-12)


def test_predictor_needs_fit_and_unknown_names_refused() -> None:
    model, _ = load_model("builtin")
    with pytest.raises(ConfigError, match="needs a fitted predictor"):
        make_predictor("ffn", model, "builtin")
    with pytest.raises(ConfigError, match="expected one of none"):
        make_predictor("oracle", model, "builtin")


@pytest.mark.parametrize("args,needle", [
    (["--offload", "--budget", "0"], "--budget is '0'"),
    (["--offload", "--prefetch", "psychic"], "--prefetch is 'psychic'"),
    (["--prefetch", "lookahead"], "expected --offload"),
    (["--offload", "--model", "NOPE_DIR"], "--model"),
    (["--offload", "--batch-size", "0"], "--batch-size is 0"),
    (["--fallback"], "expected --offload"),
    (["--offload", "--prefetch-min-prob", "nan"], "--prefetch-min-prob is nan"),
    (["--offload", "--prefetch-top", "-1"], "--prefetch-top is -1"),
    (["--offload", "--prefetch-top", "99"], "--prefetch-top is 99"),
    (["--offload", "--policy", "mru"], "--policy is 'mru'"),
    (["--offload", "--prefetch", "lookahead", "--lookahead-first", "-2"], "--lookahead-first is -2"),
    (["--offload", "--reader", "fork"], "--reader"),
])
def test_bad_input_one_sentence_exit_2(args, needle, capsys) -> None:
    assert main(["run", "--prompts", "corpus:val:1", "--max-new-tokens", "1", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # before it: transformers' own weight-loading bar
    assert needle in err and err.startswith("routecast run: error:")


def test_non_moe_model_refused(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")  # a valid, empty safetensors file
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / f).write_text("{}")
    assert main(["run", "--offload", "--model", str(tmp_path), "--prompts", "corpus:val:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not supported" in err and "\n" not in err


def test_cli_prints_the_text_and_figures(tmp_path, capsys) -> None:
    out, fig = tmp_path / "run.jsonl", tmp_path / "fig.json"
    assert main(["run", "--model", "builtin", "--offload", "--budget", "50%", "--prefetch", "lookahead",
                 "--prompts", "corpus:val:2", "--max-new-tokens", "3", "--out", str(out), "--figures", str(fig)]) == 0
    text = capsys.readouterr().out
    assert "tokens/s" in text and "hit ratio" in text and "bytes loaded" in text and "stall share" in text
    assert "of the run" in text  # the predictor's share
    doc = json.loads(fig.read_text())
    assert doc["budget"] == 16 and doc["new_tokens"] >= 1 and doc["policy"] == "lru"
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["request"] for g in lines] == [1, 2] and all(1 <= len(g["token_ids"]) <= 3 for g in lines)
    for g in lines:  # the printed text is the decoded generation
        assert f"-> {g['text']!r}" in text and g["prompt"]


def test_preloaded_full_budget_reads_nothing_and_keeps_tokens(setup) -> None:
    name, model, reqs, ref = setup
    from routecast.trace.capture_arch import spec_from_model

    s = spec_from_model(model)
    got = run_config(name, reqs, budget=s.num_layers * s.num_experts, preload=True, cfg_kw={"check": True})
    assert got["tokens"] == ref["tokens"] and got["reads"] == 0 and got["misses"] == 0 and got["hit_ratio"] == 1.0


def test_batch_sets_are_the_union_of_each_tokens_top_k() -> None:
    import numpy as np

    from routecast.predict.forecast import Forecast
    from routecast.runtime.offload.engine import _batch_sets

    rng = np.random.default_rng(0)
    scores = rng.random((5, 3, 16)).astype(np.float32)
    scores /= scores.sum(-1, keepdims=True)
    fc = Forecast(top_k=4, scores_TLE=scores)
    assert np.array_equal(_batch_sets(fc, 5), fc.batch_active_LE(5))
    dist = Forecast(top_k=4, dist_LE=scores[0])
    assert np.array_equal(_batch_sets(dist, 5), dist.batch_active_LE(5))


def test_confidence_gate_keeps_each_tokens_confident_top_experts() -> None:
    import numpy as np

    from routecast.predict.forecast import Forecast
    from routecast.runtime.offload.engine import _batch_sets

    scores = np.zeros((2, 1, 8), np.float32)
    scores[0, 0] = [0.40, 0.25, 0.15, 0.10, 0.05, 0.05, 0.0, 0.0]
    scores[1, 0] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.05, 0.15, 0.80]
    fc = Forecast(top_k=4, scores_TLE=scores)
    got = lambda **kw: np.flatnonzero(_batch_sets(fc, 2, **kw)[0]).tolist()  # noqa: E731
    assert got() == [0, 1, 2, 3, 5, 6, 7]  # each token's top 4 with a positive score
    assert got(top=2) == [0, 1, 6, 7]
    assert got(min_prob=0.15) == [0, 1, 2, 6, 7]
    assert got(top=1, min_prob=0.5) == [7]  # token 0's best (0.40) is not confident enough
    assert got(top=9) == got()  # clipped to the model's top-k
    dist = Forecast(top_k=4, dist_LE=scores[0])  # a distribution-only forecast is not gated
    assert np.array_equal(_batch_sets(dist, 2, top=1, min_prob=0.5), dist.batch_active_LE(2))


@pytest.mark.parametrize("kw,msg", [({"prefetch_top": -1}, "--prefetch-top is -1"),
                                    ({"prefetch_min_prob": 1.0}, "--prefetch-min-prob is 1.0"),
                                    ({"prefetch_min_prob": float("nan")}, "--prefetch-min-prob is nan")])
def test_confidence_gate_rejects_bad_settings(kw, msg) -> None:
    from routecast.runtime.offload.engine import OffloadConfig

    with pytest.raises(ConfigError, match=msg):
        OffloadConfig(budget=4, **kw)


def test_gated_prefetch_keeps_tokens_and_replay_agreement(setup) -> None:
    name, model, reqs, ref = setup
    from routecast.trace.capture_arch import spec_from_model

    s = spec_from_model(model)
    budget = max(1, s.num_layers * s.num_experts // 4)
    got = run_config(name, reqs, budget=budget, prefetch="lookahead", predictor=make_predictor("lookahead", model, name),
                     cfg_kw={"check": True, "prefetch_top": 1, "prefetch_min_prob": 0.01})
    assert got["tokens"] == ref["tokens"] and got["max_occupied"] <= budget
    assert got["prefetch_issued"] > 0 and got["pred_sets"][-1].sum(-1).max() <= 1  # a decode step: one token, top 1
    acc = accesses_from_log(got["log"], got["L"], got["E"], 1)  # the replay sees the gated sets the runtime used
    rep = replay_slots(acc.req_off, acc.req_key, acc.L, acc.E, budget, pred_SLE=got["pred_sets"], layer_ahead=True)
    assert (rep["hits"], rep["misses"], rep["prefetch_issued"], rep["prefetch_cancelled"]) == \
        (got["hits"], got["misses"], got["prefetch_issued"], got["prefetch_cancelled"])


def test_prefetch_top_above_the_models_top_k_is_refused() -> None:
    from routecast.runtime.offload.run import check_prefetch_top

    check_prefetch_top(0, 2)
    check_prefetch_top(2, 2)
    for top in (-1, 3, 99):  # above top-k it was silently clamped to top-k
        with pytest.raises(ConfigError, match=f"--prefetch-top is {top}; expected 0 .* to 2"):
            check_prefetch_top(top, 2)


def test_deferred_rounds_and_policy_keep_logits(setup) -> None:
    """A budget below one layer's union computes in rounds (sentinel ids): logits allclose, tokens equal."""
    name, model, reqs, ref = setup
    from routecast.trace.capture_arch import spec_from_model

    got = run_config(name, reqs, budget=spec_from_model(model).top_k, cfg_kw={"check": True, "policy": "lru"},
                     logits=True)
    assert got["tokens"] == ref["tokens"] and logits_match(ref["logits"], got["logits"])[0]
    assert got["policy"] == "lru" and got["max_occupied"] <= spec_from_model(model).top_k


def test_swapping_two_experts_of_one_layer_is_caught_by_logits(tmp_path) -> None:
    """A checkpoint with two routed experts of one layer swapped: the offloaded run's logits differ from the
    all-resident model's (the equality the tests use sees a wrong expert, which 12 greedy tokens may not)."""
    import shutil

    import numpy as np
    from safetensors.torch import load_file, save_file

    from routecast.runtime.offload.load import model_path

    name = "builtin-fine"
    src = model_path(name)
    model, tok = load_model(name)
    reqs = encode_prompts(tok, PROMPTS[:1], 4)
    ref = run_config(name, reqs, budget=None, logits=True)
    probe = run_config(name, reqs, budget=64)
    lay0 = [c for lay, e, c in probe["log"] if lay == 0]
    e_ids = np.concatenate([e for lay, e, _ in probe["log"] if lay == 0])
    counts = np.bincount(e_ids, weights=np.concatenate(lay0), minlength=64)
    a, b = (int(x) for x in np.argsort(-counts)[:2])  # the two experts layer 0 uses most
    dst = tmp_path / "swapped"
    shutil.copytree(src, dst)
    sd = load_file(str(src / "model.safetensors"))
    block = "model.layers.1.mlp.experts"  # MoE layer 0 (model layer 0 is dense)
    for proj in ("gate_proj", "up_proj", "down_proj"):
        ka, kb = f"{block}.{a}.{proj}.weight", f"{block}.{b}.{proj}.weight"
        sd[ka], sd[kb] = sd[kb], sd[ka]
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    good = run_config(name, reqs, budget=64, logits=True)
    bad = run_config(str(dst), reqs, budget=64, logits=True)
    assert logits_match(ref["logits"], good["logits"])[0]
    ok, diff = logits_match(ref["logits"], bad["logits"])
    assert not ok and diff > 1e-3


@pytest.mark.parametrize("policy", ["lfu", "arc", "s3fifo", "lirs", "fc-evict", "lfu+bypass", "fc-evict+bypass"])
def test_every_zoo_policy_runs_exactly_with_the_replays_decisions(policy) -> None:
    """The runtime drives cache/zoo.py's policy objects: logits equal all-resident's, the budget holds, and for the
    demand policies the slot replay of the run's own access log counts the same hits (the same objects decide)."""
    name = "builtin-fine"
    model, tok = load_model(name)
    reqs = encode_prompts(tok, PROMPTS, 4)
    ref = run_config(name, reqs, budget=None, logits=True)
    budget = 80  # 25% of builtin-fine's 320 routed experts
    got = run_config(name, reqs, budget=budget, cfg_kw={"check": True, "policy": policy}, logits=True, keep_feed=True)
    assert got["tokens"] == ref["tokens"] and logits_match(ref["logits"], got["logits"])[0]
    assert got["policy"] == policy and got["max_occupied"] <= budget and got["misses"] > 0
    # the time split (benchmarks/offload.py's "where the time goes"): the expert accesses of prefill and decode steps
    # are parts of the wall time, and their stall parts of them
    for ph in ("prefill", "decode"):
        assert 0 < got[f"stall_{ph}_s"] <= got[f"experts_{ph}_s"]
    assert got["experts_prefill_s"] + got["experts_decode_s"] < got["wall_s"]
    assert got["stall_prefill_s"] + got["stall_decode_s"] == pytest.approx(got["stall_s"])
    acc = accesses_from_log(got["log"], got["L"], got["E"], 1)
    # fc-evict's request profiles get each step's routing in the replay as in the run (replay_feed)
    rep = replay_slots(acc.req_off, acc.req_key, acc.L, acc.E, budget, policy=policy, **replay_feed(got))
    assert (rep["hits"], rep["misses"]) == (got["hits"], got["misses"])
    assert (got["bypassed"] > 0) == policy.endswith("+bypass") and rep["bypassed"] == got["bypassed"]
    assert bool(got.get("uses")) == policy.startswith("fc-evict")  # the profiles got every step, +bypass too


def test_admission_policies_are_refused_by_the_runtime() -> None:
    from routecast.runtime.offload.store import StoreConfig

    with pytest.raises(ConfigError, match=r"\+admit\) runs in `routecast cache replay` only"):
        StoreConfig(budget=4, policy="lru+admit")


def test_in_block_lookahead_kernel_picks_the_router_rules_sets(setup) -> None:
    """The compiled selection (no confidence gate) and RouterRule.forecast + topk (a gate that keeps every positive
    score) forecast the same sets on every step of a run."""
    name, model, reqs, _ref = setup
    pred = make_predictor("lookahead", model, name)
    runs = [run_config(name, reqs, budget=8, prefetch="lookahead", predictor=pred, cfg_kw={"prefetch_min_prob": p})
            for p in (0.0, 1e-12)]
    assert runs[0]["pred_sets"].any() and np.array_equal(runs[0]["pred_sets"], runs[1]["pred_sets"])


def test_compact_scratch_gives_the_pool_paths_logits_exactly(setup) -> None:
    """A layer's experts run from a compact copy of their slots (the default) or from the whole pool (compact_bytes
    0): the same logits bit for bit, at a budget where layers hit and miss."""
    name, model, reqs, ref = setup
    from routecast.trace.capture_arch import spec_from_model

    s = spec_from_model(model)
    budget = s.num_layers * s.num_experts // 4
    runs = [run_config(name, reqs, budget=budget, logits=True, cfg_kw={"compact_bytes": cb}) for cb in (0, 4 << 20)]
    assert runs[0]["tokens"] == runs[1]["tokens"] == ref["tokens"]
    assert all(torch.equal(a, b) for a, b in zip(runs[0]["logits"], runs[1]["logits"], strict=True))
    assert runs[0]["compact_calls"] == 0 < runs[1]["compact_calls"]
    from routecast.runtime.offload.engine import OffloadConfig

    with pytest.raises(ConfigError, match="compact_bytes is -1"):
        OffloadConfig(budget=4, compact_bytes=-1)


def test_reuse_probe_rows_come_from_each_steps_router_inputs_and_keep_logits(monkeypatch) -> None:
    """fc-evict reading the reuse probe: logits equal all-resident's, and the row the policy gets at layer l of each
    step is the probe applied to the router inputs of layers 0..l of that step's token (seen by hooks on the routers)."""
    from routecast.predict.reuse_probe import ReuseProbe
    from routecast.runtime.offload.store import ExpertStore
    from routecast.trace.capture_arch import adapter_for, find_blocks, spec_from_model

    name = "builtin-fine"
    model, tok = load_model(name)
    s = spec_from_model(model)
    L, K, H = s.num_layers, s.num_layers * s.num_experts, s.hidden_size
    rng = np.random.default_rng(0)
    weights = [rng.normal(0, 0.02, ((li + 1) * H + 1, K)) for li in range(L)]
    for w in weights:
        w[-1] += 1.7  # the bias: log d near the middle of [0, log 32]
    probe = ReuseProbe(weights=tuple(weights), cap=32, num_layers=L, num_experts=s.num_experts, hidden_size=H)
    rows: list[tuple[int, np.ndarray]] = []
    orig = ExpertStore.reuse_row
    monkeypatch.setattr(ExpertStore, "reuse_row", lambda self, li, logd: (rows.append((li, logd.copy())),
                                                                           orig(self, li, logd))[1])
    seen: list[list[np.ndarray]] = [[] for _ in range(L)]
    hooks = [b.router.register_forward_hook(
        lambda _m, a, _o, li=li: seen[li].append(a[0].detach().reshape(-1, H)[-1].float().numpy().copy()))
        for li, b in enumerate(find_blocks(model, adapter_for(model)))]
    reqs = encode_prompts(tok, PROMPTS[:1], 4)
    ref = run_config(name, reqs, budget=None, logits=True)
    try:
        got = run_config(name, reqs, budget=80, cfg_kw={"check": True, "policy": "fc-evict"}, logits=True,
                         reuse_probe=probe, loaded=(model, tok), keep_feed=True)
    finally:
        for h in hooks:
            h.remove()
    assert got["tokens"] == ref["tokens"] and logits_match(ref["logits"], got["logits"])[0]
    steps = len(seen[0])
    assert steps >= 2 and [li for li, _ in rows] == list(range(L)) * steps
    want = probe.predict(np.stack([np.stack([seen[li][t] for li in range(L)]) for t in range(steps)]))
    for t in range(steps):
        for li in range(L):
            np.testing.assert_allclose(rows[t * L + li][1][0], want[t, li], atol=1e-4)
    inside = (want > 0) & (want < np.log(32))
    assert inside.mean() > 0.2, inside.mean()  # most values are not at a clip bound: the comparison has teeth
    # the run's rows, fed to the slot replay of its own access log, give its hits and misses
    assert len(got["reuse_steps"]) == steps and got["reuse_steps"][0].shape == (1, L, K)
    acc = accesses_from_log(got["log"], L, s.num_experts, 1)
    rep = replay_slots(acc.req_off, acc.req_key, L, s.num_experts, 80, policy="fc-evict", **replay_feed(got))
    assert (rep["hits"], rep["misses"]) == (got["hits"], got["misses"])
    plain = run_config(name, reqs, budget=80, cfg_kw={"policy": "fc-evict"}, reuse_probe=probe)
    assert plain["uses"] is None and plain["reuse_steps"] is None  # kept only when asked (they grow with the run)
    with pytest.raises(ConfigError, match="read by fc-evict only"):
        run_config(name, reqs, budget=80, cfg_kw={"policy": "lru"}, reuse_probe=probe)


def test_cli_reuse_probe_fits_on_the_fit_trace_and_prints_its_share(tmp_path, capsys) -> None:
    from routecast.trace.capture import capture_to_disk

    d = capture_to_disk("builtin", "corpus:test:3", tmp_path / "t", max_new_tokens=3, hidden=True, progress=False)
    fig = tmp_path / "fig.json"
    assert main(["run", "--model", "builtin", "--offload", "--budget", "25%", "--policy", "fc-evict", "--reuse-probe",
                 "--token-table", "--fit-trace", str(d), "--prompts", "corpus:val:2", "--max-new-tokens", "3", "--figures",
                 str(fig)]) == 0
    text = capsys.readouterr().out
    assert "fc-evict's forecasts (request profiles, token table, reuse probe)" in text and "of the run" in text
    doc = json.loads(fig.read_text())
    assert doc["reuse_probe"] and doc["token_table"] and doc["policy"] == "fc-evict" and doc["predict_s"] > 0
    assert main(["run", "--model", "builtin", "--offload", "--budget", "25%", "--policy", "fc-evict",
                 "--fit-trace", str(d), "--prompts", "corpus:val:1", "--max-new-tokens", "2", "--figures",
                 str(tmp_path / "fig2.json")]) == 0
    assert "fc-evict's forecasts (request profiles)" in capsys.readouterr().out
    assert not json.loads((tmp_path / "fig2.json").read_text())["token_table"]
    assert main(["run", "--model", "builtin", "--offload", "--policy", "lru", "--token-table"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--token-table acts on fc-evict" in err[0], err
    plain = capture_to_disk("builtin", "corpus:test:2", tmp_path / "p", max_new_tokens=2, progress=False)
    assert main(["run", "--model", "builtin", "--offload", "--policy", "fc-evict", "--reuse-probe", "--fit-trace",
                 str(plain), "--prompts", "corpus:val:1", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no router inputs" in err[0], err
