"""The advisor: regime detection, ranking, every family priced on one trace, and every deploy artifact read back."""

from __future__ import annotations

import json
import math
import shlex

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.advise.candidate import Candidate, not_applicable
from routecast.advise.rank import ASSUMED_ERROR, cost_model_error, rank
from routecast.advise.regime import KV_RESERVE, MEM_UTIL, Deployment, detect_regime, memory_fit
from routecast.advise.run import advise_trace, make_deployment
from routecast.cli import main
from routecast.common.errors import ConfigError
from routecast.serve.engine import weight_bytes
from routecast.sim.models import load_model
from routecast.trace.io import write_trace
from tests.conftest import build_small_trace


def _half_memory_gb(model: str) -> float:
    """GB per GPU at which one GPU holds the dense weights and exactly half of the routed experts."""
    m = load_model(model)
    experts = m.num_moe_layers * m.num_experts * m.expert_bytes()
    return (weight_bytes(m, 0.0) + 0.5 * experts) / (MEM_UTIL * (1 - KV_RESERVE)) / 1e9


# ------------------------------------------------------------------------------------------------ regime
def test_mixtral_fits_on_four_a100_with_spare_slots():
    dep = make_deployment(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4)
    share, spare, egb, _ = memory_fit(dep)
    assert share == 1.0 and spare >= 1 and 80 < egb < 100  # 32 layers x 8 x 352 MB = 90 GB of experts


def test_half_the_experts_of_deepseek_v2_lite_on_one_gpu():
    dep = make_deployment(model_profile="deepseek-v2-lite", hardware="h100-sxm", gpus=1,
                          memory_gb=_half_memory_gb("deepseek-v2-lite"))
    share, spare, _, _ = memory_fit(dep)
    assert abs(share - 0.5) < 1e-6 and spare == 0
    smaller = make_deployment(model_profile="deepseek-v2-lite", hardware="h100-sxm", gpus=1,
                              memory_gb=_half_memory_gb("deepseek-v2-lite") * 0.8)
    assert memory_fit(smaller)[0] < share  # less memory, fewer experts resident


@pytest.mark.parametrize("prompt,decode,mix", [(40, 2, "prefill-heavy"), (4, 40, "decode-heavy"), (10, 10, "mixed")])
def test_prefill_decode_mix(prompt, decode, mix):
    t = build_small_trace(num_requests=6, prompt_len=prompt, decode_len=decode, num_experts=8, top_k=2)
    dep = make_deployment(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4)
    r = detect_regime(dep, t)
    assert r.mix == mix and r.tokens == t.num_tokens and r.requests == 6
    assert r.steps == len(np.unique(t.tokens["step"])) and r.skewness >= 1.0
    assert abs(r.prefill_share - prompt / (prompt + decode)) < 1e-9


def test_regime_refuses_another_expert_count_and_bad_ep():
    t = build_small_trace(num_experts=16, top_k=2)
    dep = make_deployment(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4)
    with pytest.raises(ConfigError, match="routes over 16 experts"):
        detect_regime(dep, t)
    with pytest.raises(ConfigError, match="--ep is 3"):
        make_deployment(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4, ep=3)
    with pytest.raises(ConfigError, match="--ep is 8"):
        make_deployment(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4, ep=8)


# ------------------------------------------------------------------------------------------------ ranking
def _c(name, family, value, **kw):
    return Candidate(name=name, system="s", family=family, value=value,
                     metric="goodput_tok_s" if family == "scheduler" else "us_per_token", **kw)


def test_ranking_orders_by_gain_over_the_engine_default_then_bounds_then_not_applicable():
    cands = [_c("static EP", "placement", 100.0), _c("EPLB windowed", "placement", 120.0),
             _c("PROBE", "placement", 90.0), _c("oracle", "placement", 80.0, deployable=False),
             _c("fcfs", "scheduler", 10.0), _c("vllm", "scheduler", 20.0), _c("fastgen", "scheduler", 22.0),
             not_applicable("lru", "LRU", "cache", "everything fits")]
    rows = rank(cands, 0.1)
    names = [r.cand.name for r in rows]
    assert names[-1] == "lru" and rows[-1].rank == 0 and names[-2] == "oracle" and rows[-2].rank == 0
    live = [r for r in rows if r.rank]
    assert [r.rank for r in live] == list(range(1, len(live) + 1))
    scores = [r.score for r in live]
    assert scores == sorted(scores, reverse=True) and live[0].cand.name == "PROBE"
    probe = live[0]
    assert math.isclose(probe.gain, 0.1) and math.isclose(probe.vs_default, 1 - 90 / 120)
    fastgen = next(r for r in rows if r.cand.name == "fastgen")
    assert math.isclose(fastgen.gain, 22 / 10 - 1) and math.isclose(fastgen.vs_default, 22 / 20 - 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1.0, 1e4), min_size=2, max_size=8), st.floats(0.0, 0.5))
def test_band_holds_the_gain_and_widens_with_the_error(values, err):
    names = ["static EP", *[f"m{i}" for i in range(len(values) - 1)]]
    rows = rank([_c(n, "placement", v) for n, v in zip(names, values, strict=True)], err)
    wider = {r.cand.name: r.band for r in rank([_c(n, "placement", v) for n, v in zip(names, values, strict=True)],
                                                err + 0.1)}
    for r in rows:
        lo, hi = r.band
        assert lo <= r.gain + 1e-12 <= hi + 2e-12
        assert wider[r.cand.name][0] <= lo + 1e-12 and wider[r.cand.name][1] >= hi - 1e-12


def test_cost_model_error_reads_the_validation_or_says_assumed(tmp_path):
    dep = make_deployment(model_profile="mixtral-8x7b", hardware="h100-sxm", gpus=4)
    err, src = cost_model_error(dep.hw, tmp_path)
    assert err == ASSUMED_ERROR and src.startswith("assumed")
    (tmp_path / "cost_model_validation-cuda.json").write_text(json.dumps(
        {"summary": {"a": {"mae_median": 0.04}, "b": {"mae_median": 0.09}}}))
    err, src = cost_model_error(dep.hw, tmp_path)
    assert err == 0.09 and src.startswith("measured")


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def ep_trace(tmp_path_factory):
    t = build_small_trace(num_requests=12, prompt_len=24, decode_len=8, num_layers=4, num_experts=8, top_k=2)
    d = tmp_path_factory.mktemp("adv") / "trace"
    write_trace(t, d)
    return d


def test_ep_deployment_prices_every_placement_and_writes_the_artifacts(ep_trace, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["advise", "--trace", str(ep_trace), "--model-profile", "mixtral-8x7b", "--hardware", "a100-sxm-80gb",
                 "--gpus", "4", "--link", "pcie", "--out", str(out), "--html", str(tmp_path / "r.html"),
                 "--shuffle-methods", "sts,metis"]) == 0
    text = capsys.readouterr().out
    for name in ("static EP", "EPLB one-shot", "EPLB windowed", "PROBE", "MoE-GPS distribution duplication",
                 "MoE-GPS token-to-expert duplication", "Speculative MoE token shuffling", "fcfs", "vllm", "fastgen",
                 "emoe"):
        assert name in text
    assert "everything fits in memory: no expert is offloaded" in text and "verdict: " in text
    doc = json.loads((out / "verdict.json").read_text())
    assert doc["verdict"].count(". ") >= 1 and doc["rows"][0]["rank"] == 1
    # SGLang's rules: exactly one key, integer ids, [num_hidden_layers, experts + redundant], width divisible by EP
    sg = json.loads((out / "sglang-init-expert-location.json").read_text())
    assert list(sg) == ["physical_to_logical_map"]
    m = np.asarray(sg["physical_to_logical_map"])
    assert m.dtype == np.int64 and m.shape[0] == load_model("mixtral-8x7b").num_layers
    flags = (out / "sglang-flags.txt").read_text().split()
    red = int(flags[flags.index("--ep-num-redundant-experts") + 1])
    assert m.shape[1] == 8 + red and m.shape[1] % int(flags[flags.index("--ep-size") + 1]) == 0
    assert ((m >= 0) & (m < 8)).all() and all(np.isin(np.arange(8), row).all() for row in m)
    from routecast.schedule.cocluster import read_plan

    plan = read_plan(out / "cocluster-plan.json")
    assert plan.ep == 4 and plan.expert_group_LE.shape == (4, 8)
    deploy = (out / "deploy.txt").read_text()
    assert "routecast permute-experts" in deploy and "--shuffle-plan" in deploy
    conf = json.loads((out / "serve-sim.json").read_text())
    assert conf["scheduler"] == next(r["strategy"] for r in doc["rows"] if r["family"] == "scheduler" and r["rank"])
    line = next(ln for ln in deploy.splitlines() if ln.startswith("routecast serve-sim"))
    from routecast.cli import build_parser

    args = build_parser().parse_args(shlex.split(line)[1:])
    assert args.scheduler == conf["scheduler"] and args.gpus == 4
    html = (tmp_path / "r.html").read_text()
    assert html.index("Verdict") < html.index("<table>")


def test_offload_regime_prices_the_caches_and_emoe_not_placement(tmp_path, capsys):
    t = build_small_trace(num_requests=10, prompt_len=12, decode_len=6, num_layers=3, num_experts=64, top_k=6)
    d = tmp_path / "t"
    write_trace(t, d)
    dep = make_deployment(model_profile="deepseek-v2-lite", hardware="h100-sxm", gpus=1,
                          memory_gb=_half_memory_gb("deepseek-v2-lite"))
    from routecast.trace.io import read_trace

    v, extras = advise_trace(read_trace(d), dep, model_ref="deepseek-v2-lite", hw_ref="h100-sxm",
                             families=("placement", "shuffle", "cache"))
    by = {r.cand.name: r for r in v.rows}
    assert not by["static EP"].cand.applicable and "EP 1" in by["static EP"].cand.reason
    assert by["on-demand LRU"].cand.applicable and by["belady"].rank == 0  # a bound, never picked
    assert by["belady"].cand.value <= by["on-demand LRU"].cand.value + 1e-9
    em = by["eMoE residency with fallback"]
    assert "rerouted" in em.cand.quality and "unknown" in em.cand.quality
    assert em.cand.value <= by["on-demand LRU"].cand.value  # no load ever waits
    best = v.best_of("cache")
    assert best is not None and "--offload --budget 50%" in best.cand.artifact
    assert extras["plans"] is None


@pytest.mark.parametrize("hidden", [16, 0])
def test_a_trace_with_router_inputs_also_prices_fc_evict_reading_the_reuse_probe(tmp_path, hidden):
    """With router inputs in the trace's files (read for the replayed rows only), the cache family adds fc-evict+probe
    (the probe fitted on the predictor's training rows), whose command fits the probe on that trace; without them, no
    such row."""
    from routecast.trace.io import read_trace

    t = build_small_trace(num_requests=10, prompt_len=12, decode_len=6, num_layers=3, num_experts=64, top_k=6,
                          hidden=hidden)
    d = tmp_path / "t"
    write_trace(t, d)
    dep = make_deployment(model_profile="deepseek-v2-lite", hardware="h100-sxm", gpus=1,
                          memory_gb=_half_memory_gb("deepseek-v2-lite"))
    v, _ = advise_trace(read_trace(d, load_hidden=False), dep, model_ref="deepseek-v2-lite", hw_ref="h100-sxm",
                        families=("cache",), trace_path=d)
    by = {r.cand.name: r for r in v.rows}
    if not hidden:
        assert "fc-evict+probe" not in by
        return
    row = by["fc-evict+probe"].cand
    assert row.applicable and row.family == "cache" and math.isfinite(row.value) and row.value > 0
    assert f"--policy fc-evict --reuse-probe --fit-trace {d}" in row.artifact
    assert row.value >= by["belady"].cand.value - 1e-9 and row.detail["forecast"].endswith("+ reuse probe")
    from routecast.cli import build_parser
    from routecast.runtime.offload.store import check_runtime_policy

    for name in ("fc-evict+probe", "lirs", "lfu"):  # every runtime policy's command is one `routecast run` takes
        args = build_parser().parse_args(shlex.split(by[name].cand.artifact)[1:])
        check_runtime_policy(args.policy)
        assert args.offload and args.policy == name.removesuffix("+probe")
    assert args.reuse_probe is False and build_parser().parse_args(shlex.split(row.artifact)[1:]).fit_trace == str(d)


@pytest.mark.parametrize("argv,expect", [
    (["--slo-ttft-ms", "fast"], "--slo-ttft-ms is 'fast'"),
    (["--slo-tpot-ms", "-3"], "--slo-tpot-ms is '-3'"),
    (["--ep", "3"], "--ep is 3"),
    (["--preset", "mixtral-8x7b"], "--trace and --preset are both given"),
    (["--only", "placement,magic"], "--only holds 'magic'"),
    (["--rate", "0"], "--rate is 0"),
])
def test_advise_refuses_bad_input(ep_trace, argv, expect, capsys):
    assert main(["advise", "--trace", str(ep_trace), "--model-profile", "mixtral-8x7b", "--hardware", "a100-sxm-80gb",
                 "--gpus", "4", *argv]) == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err


def test_deployment_checks_its_fields():
    m = load_model("mixtral-8x7b")
    from routecast.sim.hardware import load_hardware

    hw = load_hardware("a100-sxm-80gb")
    with pytest.raises(ConfigError, match="--memory-gb"):
        Deployment(model=m, hw=hw, gpus=4, ep=4, memory_gb=float("nan"))
    with pytest.raises(ConfigError, match="--gpus"):
        Deployment(model=m, hw=hw, gpus=0, ep=1, memory_gb=80.0)


def test_lossy_strategies_rank_after_exact_ones_and_are_never_the_pick():
    cands = [_c("on-demand LRU", "cache", 100.0), _c("lfu", "cache", 95.0),
             _c("eMoE residency with fallback", "residency", 10.0, quality="30% rerouted")]
    rows = rank(cands, 0.1)
    assert [r.cand.name for r in rows] == ["lfu", "on-demand LRU", "eMoE residency with fallback"]
    assert rows[2].rank == 3 and rows[2].gain > rows[0].gain
    from routecast.advise.rank import Verdict

    v = Verdict(deployment="d", regime={}, regime_text="r", rows=rows, error=0.1, error_source="s")
    assert v.best.cand.name == "lfu" and v.best_of("cache").cand.name == "lfu"
    assert "only if its quality cost is acceptable (30% rerouted" in v.sentences


def test_json_is_strict_and_lists_what_does_not_apply(ep_trace, capsys):
    assert main(["advise", "--trace", str(ep_trace), "--model-profile", "mixtral-8x7b", "--hardware", "a100-sxm-80gb",
                 "--gpus", "4", "--only", "cache,scheduler", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    dead = [r for r in doc["rows"] if not r["applicable"]]
    assert dead and all(r["reason"] and r["rank"] == 0 for r in dead)
    assert {r["strategy"] for r in doc["rows"] if r["rank"]} == {"fcfs", "vllm", "fastgen", "emoe"}


def test_schedulers_apply_when_the_longest_prompt_meets_the_default_token_budget(monkeypatch):
    """The serving simulator needs prompt < token budget; advise raises its budget past the longest prompt (a
    deepseek-v3 preset trace with an 8,927-token prompt was refused at a budget of exactly 8,927)."""
    import routecast.advise.serving as serving

    t = build_small_trace(num_requests=4, prompt_len=12, decode_len=3, num_experts=8, top_k=2)
    monkeypatch.setattr(serving, "TOKEN_BUDGET", 12)
    dep = make_deployment(model_profile="mixtral-8x7b", hardware="a100-sxm-80gb", gpus=4)
    got, conf = serving.scheduler_candidates(t, dep, detect_regime(dep, t), model_ref="mixtral-8x7b",
                                             hw_ref="a100-sxm-80gb")
    assert all(c.applicable for c in got), [c.reason for c in got if not c.applicable]
    assert conf["token_budget"] == 13


def test_first_steps_caps_steps_and_tokens():
    from routecast.advise.run import first_steps

    t = build_small_trace(num_requests=6, prompt_len=10, decode_len=5, num_experts=8, top_k=2)
    steps = np.asarray(t.tokens["step"])
    u, per = np.unique(steps, return_counts=True)
    same, note = first_steps(t, u.size, max_tokens=t.num_tokens)
    assert same is t and note == ""
    cap = int(per[:3].sum())  # exactly three whole steps fit
    sub, note = first_steps(t, u.size, max_tokens=cap, what="caching")
    assert sub.num_tokens == cap and note.startswith("caching priced on the first 3 of")
    one, _ = first_steps(t, u.size, max_tokens=1)  # never less than one step
    assert one.num_tokens == per[0]


def test_cache_family_runs_on_a_prefix_of_a_long_trace_and_says_so(tmp_path, monkeypatch):
    import routecast.advise.run as run

    t = build_small_trace(num_requests=10, prompt_len=12, decode_len=6, num_layers=3, num_experts=64, top_k=6)
    dep = make_deployment(model_profile="deepseek-v2-lite", hardware="h100-sxm", gpus=1,
                          memory_gb=_half_memory_gb("deepseek-v2-lite"))
    monkeypatch.setattr(run, "MAX_CACHE_CELLS", t.num_tokens * 3 // 2)  # half the tokens of a 3-layer trace
    v, _ = advise_trace(t, dep, model_ref="deepseek-v2-lite", hw_ref="h100-sxm", families=("cache",))
    note = next(n for n in v.regime["notes"] if n.startswith("caching and prefetch priced on the first"))
    assert f"of {t.num_tokens} tokens" in note
    assert any(r.cand.name == "on-demand LRU" and r.cand.applicable for r in v.rows)
