"""`routecast run --offload --geometry`: one policy and its baseline on a tiny geometry driven by a written trace (with
dropped slots), the replay beside each run, and every bad flag refused in one sentence before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from routecast.cli import main
from routecast.common.errors import ConfigError
from routecast.runtime.offload.geometry import Geometry
from routecast.runtime.offload.geometry_run import format_geometry, geometry_main
from routecast.trace import DECODE
from routecast.trace.io import read_trace, write_trace
from tests.conftest import build_small_trace

TINY = Geometry(name="tiny", hidden=64, ffn=32, experts=8, top_k=2, layers=3)


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("routing") / "trace"
    write_trace(build_small_trace(num_requests=4, decode_len=6, num_layers=2, dropped=0.2, seed=5), path)
    return path


def test_policy_and_baseline_run_on_the_traces_routing_beside_the_replay(trace_dir, tmp_path) -> None:
    res = geometry_main(TINY, routing=trace_dir, tokens=12, warmup=6, budget="50%", policy="fc-evict", baseline="lru",
                        direct=False, weights_dir=tmp_path / "w")
    assert list(res["runs"]) == ["fc-evict", "lru"] and res["budget"] == 12
    tr = read_trace(trace_dir)
    ids = np.asarray(tr.experts_TLK)[np.flatnonzero(tr.phase == DECODE)[6:18]]
    lay = np.arange(TINY.layers) % 2
    asked = sum(len({int(e) for e in ids[t, lay[g]] if e >= 0}) for t in range(12) for g in range(TINY.layers))
    for r in res["runs"].values():
        assert r["hits"] + r["misses"] == asked  # the timed tokens' accesses; dropped slots route nothing
        assert r["s_per_token"] > 0 and r["replay_s_per_token"] > 0
        assert r["replay_hit_ratio"] == pytest.approx(r["hit_ratio"])  # the replay makes the run's decisions
    assert res["x_baseline"] == pytest.approx(res["runs"]["lru"]["s_per_token"] / res["runs"]["fc-evict"]["s_per_token"])
    assert res["bound"]["belady"] <= res["bound"]["lru"]
    text = format_geometry(res)
    assert "fc-evict" in text and "random" in text and "Belady" in text
    json.dumps(res, default=float)  # --figures writes it


def test_request_order_runs_each_requests_decode_tokens_in_a_row(trace_dir) -> None:
    from routecast.runtime.offload.geometry_routing import trace_routing

    tr = read_trace(trace_dir)
    dec = np.flatnonzero(tr.phase == DECODE)
    step = trace_routing(trace_dir, TINY, len(dec), forecast=False)
    by_req = trace_routing(trace_dir, TINY, len(dec), forecast=False, order="request")
    assert np.array_equal(step["request"], np.asarray(tr.request)[dec])  # the trace's own (serving) order
    assert np.all(np.diff(by_req["request"]) >= 0)  # one request after the other
    pos = np.asarray(tr.position)[dec]
    for r in np.unique(by_req["request"]):  # each request's tokens in position order, the same routing as in step order
        a = np.flatnonzero(by_req["request"] == r)
        b = np.flatnonzero(step["request"] == r)
        assert np.array_equal(by_req["ids"][a], step["ids"][b[np.argsort(pos[b], kind="stable")]])
    with pytest.raises(ConfigError, match="--geometry-order is 'random'"):
        trace_routing(trace_dir, TINY, 4, forecast=False, order="random")


@pytest.mark.parametrize("hidden, needle", [(0, "no router inputs"), (16, "a trace of 'tiny-moe'")])
def test_lookahead_needs_router_inputs_of_a_model_whose_gates_it_has(hidden, needle, tmp_path) -> None:
    path = tmp_path / "trace"
    write_trace(build_small_trace(num_requests=2, decode_len=4, num_layers=2, hidden=hidden), path)
    with pytest.raises(ConfigError, match=needle):
        geometry_main(TINY, routing=path, tokens=4, warmup=2, prefetch="lookahead", direct=False,
                      weights_dir=tmp_path / "w")
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("args, needle", [
    (["--geometry", "mixtral-8x7b"], "expected --offload"),
    (["--offload", "--geometry", "gpt-5"], "--geometry is 'gpt-5'"),
    (["--offload", "--geometry", "mixtral-8x7b", "--prefetch", "ffn"], "expected none or lookahead"),
    (["--offload", "--geometry", "mixtral-8x7b", "--fallback"], "--fallback acts on a model run"),
    (["--offload", "--geometry", "mixtral-8x7b", "--policy", "mru"], "--policy is 'mru'"),
    (["--offload", "--geometry", "mixtral-8x7b", "--baseline", "fifo"], "--baseline is 'fifo'; expected none or one of"),
    (["--offload", "--geometry", "mixtral-8x7b", "--budget", "0%"], "--budget is '0%'"),
    (["--offload", "--geometry", "mixtral-8x7b", "--geometry-layers", "0"], "--geometry-layers"),
    (["--offload", "--geometry", "mixtral-8x7b", "--routing", "/nonexistent/trace"], "no trace there"),
    (["--offload", "--geometry", "mixtral-8x7b", "--geometry-order", "random"], "--geometry-order is 'random'"),
])
def test_bad_flags_are_one_sentence_before_anything_is_written(args, needle, tmp_path, capsys) -> None:
    weights = tmp_path / "w"
    assert main(["run", *args, "--weights-dir", str(weights)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not weights.exists()


@pytest.mark.parametrize("flag", [["--routing", "out/traces/fine"], ["--geometry-order", "request"], ["--baseline", "lfu"],
                                  ["--geometry-tokens", "8"], ["--weights-dir", "w"]])
def test_geometry_flags_without_geometry_are_refused(flag, capsys) -> None:
    assert main(["run", "--offload", "--prompts", "corpus:val:1", *flag]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag[0]} acts on a --geometry run" in err[0], err


def test_fc_evict_gets_the_token_table_without_the_probe_and_says_when_there_is_none(trace_dir, tmp_path, capsys) -> None:
    """`--policy fc-evict` alone: the routing carries the token table (fitted on the documents not driven; no router
    inputs needed), and a trace whose every document is driven runs without it, saying so."""
    from routecast.runtime.offload.geometry_routing import trace_routing

    path = tmp_path / "trace"
    write_trace(build_small_trace(num_requests=8, decode_len=6, num_layers=2, seed=3), path)  # no hidden states
    rt = trace_routing(path, TINY, 12, forecast=False, order="request", token_table=True)
    assert rt["token_use"].shape == (12, TINY.layers * TINY.experts) and "reuse" not in rt
    capsys.readouterr()
    geometry_main(TINY, routing=path, tokens=6, warmup=6, policy="fc-evict", baseline="none", direct=False,
                  weights_dir=tmp_path / "w", order="request")
    assert "fc-evict reads the token table's forecast" in capsys.readouterr().out
    every = trace_routing(trace_dir, TINY, 24, forecast=False, token_table=True)  # all 4 requests' documents driven
    assert "token_use" not in every
    geometry_main(TINY, routing=trace_dir, tokens=18, warmup=6, policy="fc-evict", baseline="none", direct=False,
                  weights_dir=tmp_path / "w")
    assert "fc-evict runs without token forecasts" in capsys.readouterr().out


def test_reuse_probe_is_fitted_on_the_documents_not_driven_and_read_by_fc_evict(tmp_path, capsys) -> None:
    from routecast.runtime.offload.geometry_routing import trace_routing

    path = tmp_path / "trace"
    write_trace(build_small_trace(num_requests=8, decode_len=6, num_layers=2, hidden=16, seed=3), path)
    rt = trace_routing(path, TINY, 12, forecast=False, order="request", reuse_probe=True)
    assert rt["reuse"].shape == (12, TINY.layers, TINY.layers * TINY.experts) and rt["reuse_s"] > 0
    use = rt["token_use"]  # the token table's forecast of each token, fitted on the same documents
    assert use.shape == (12, TINY.layers * TINY.experts) and rt["token_s"] > 0
    assert ((use >= 0) & (use <= 0.99)).all() and np.isfinite(use).all()
    tr = read_trace(path)
    driven = set(np.asarray(tr.tokens["document"])[np.asarray(tr.request) == rt["request"][0]].tolist())
    assert rt["reuse_train_tokens"] <= tr.num_tokens - sum(np.isin(tr.tokens["document"], list(driven)))
    res = geometry_main(TINY, routing=path, tokens=6, warmup=6, policy="fc-evict", baseline="lru", direct=False,
                        weights_dir=tmp_path / "w", order="request", reuse_probe=True)
    assert list(res["runs"]) == ["fc-evict+probe", "lru"] and res["runs"]["fc-evict+probe"]["reuse_probe"]
    r = res["runs"]["fc-evict+probe"]
    assert r["replay_hit_ratio"] == pytest.approx(r["hit_ratio"])
    for args, needle in ((["--offload", "--geometry", "mixtral-8x7b", "--reuse-probe", "--policy", "lru"],
                          "read by fc-evict only"),
                         (["--offload", "--prompts", "corpus:val:1", "--reuse-probe"], "read by fc-evict only"),
                         (["--offload", "--prompts", "corpus:val:1", "--reuse-probe", "--policy", "fc-evict"],
                          "expected --fit-trace TRACE"),
                         (["--prompts", "corpus:val:1", "--reuse-probe", "--policy", "fc-evict"], "expected --offload")):
        capsys.readouterr()
        assert main(["run", *args, *(["--weights-dir", str(tmp_path / "x")] if "--geometry" in args else [])]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
        assert not (tmp_path / "x").exists()
    plain = tmp_path / "plain"
    write_trace(build_small_trace(num_requests=8, decode_len=6, num_layers=2, seed=3), plain)
    with pytest.raises(ConfigError, match="no router inputs"):
        geometry_main(TINY, routing=plain, tokens=6, warmup=6, policy="fc-evict", direct=False,
                      weights_dir=tmp_path / "w2", order="request", reuse_probe=True)
    assert not (tmp_path / "w2").exists()


def test_a_device_run_keeps_the_experts_in_host_memory_and_makes_the_disk_runs_decisions(trace_dir, tmp_path) -> None:
    kw = dict(routing=trace_dir, tokens=10, warmup=5, budget="50%", policy="lirs", baseline="lru")
    mem = geometry_main(TINY, device="cpu", **kw)
    disk = geometry_main(TINY, direct=False, weights_dir=tmp_path / "w", **kw)
    assert mem["tier_mode"] == "memory->cpu" and disk["tier_mode"] == "fadvise" and mem["device"] == "cpu"
    for label in ("lirs", "lru"):
        m, d = mem["runs"][label], disk["runs"][label]
        assert (m["hits"], m["misses"]) == (d["hits"], d["misses"])  # random weights differ; decisions do not
        assert m["replay_hit_ratio"] == pytest.approx(m["hit_ratio"])
    assert "memory->cpu" in format_geometry(mem)


@pytest.mark.parametrize("args, needle", [
    (["--geometry-device", "tpu"], "--geometry-device is 'tpu'; expected cuda, cuda:N or cpu"),
    (["--geometry-device", "cuda:64"], "CUDA device"),
    (["--geometry-device", "cpu", "--weights-dir", "w"], "--weights-dir acts on the weights file on disk"),
    (["--geometry-device", "cpu", "--no-direct"], "--no-direct acts on the weights file on disk"),
    (["--geometry-device", "cpu", "--geometry-layers", "1000"], "GB are available: expected fewer --geometry-layers"),
    (["--geometry-device", "cpu", "--geometry-kernel", "torch"], "--geometry-kernel acts on the weights file on disk"),
    (["--geometry-kernel", "cuda"], "--geometry-kernel is 'cuda'; expected one of numba, torch"),
])
def test_bad_device_flags_are_one_sentence_before_anything_is_made(args, needle, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--offload", "--geometry", "mixtral-8x7b", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not list(tmp_path.iterdir())  # no trace captured, no weights written


def test_lookahead_keeps_its_ranks_and_prefetch_top_gates_the_run(tmp_path, capsys) -> None:
    from routecast.runtime.offload.geometry import prefetch_sets
    from routecast.runtime.offload.geometry_routing import trace_routing
    from routecast.trace.capture import capture_to_disk

    d = capture_to_disk("builtin", "corpus:test:3", tmp_path / "t", max_new_tokens=4, hidden=True, progress=False)
    rt = trace_routing(d, TINY, 8)
    rank = rt["pred_rank"]
    assert rank.dtype == np.uint8 and np.array_equal(rank > 0, rt["pred"]) and rank.max() <= TINY.top_k
    for t, g in np.ndindex(rank.shape[:2]):  # each token's forecast: ranks 1, 2, .. without gaps or repeats
        got = np.sort(rank[t, g][rank[t, g] > 0])
        assert np.array_equal(got, np.arange(1, len(got) + 1))
    assert (prefetch_sets(rt, 1).sum(-1) <= 1).all()
    res = geometry_main(TINY, routing=d, tokens=4, warmup=4, policy="lru", prefetch="lookahead", prefetch_top=1,
                        baseline="none", direct=False, weights_dir=tmp_path / "w")
    r = res["runs"]["lookahead top1+lru"]
    assert res["prefetch_top"] == 1 and r["replay_hit_ratio"] == pytest.approx(r["hit_ratio"])
    for args, needle in ((["--prefetch-top", "1"], "expected --prefetch lookahead with it"),
                         (["--prefetch", "lookahead", "--prefetch-top", "3"], "--prefetch-top is 3; expected 0")):
        capsys.readouterr()
        assert main(["run", "--offload", "--geometry", "mixtral-8x7b", *args, "--weights-dir", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
        assert not (tmp_path / "x").exists()
