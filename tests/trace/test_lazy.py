"""Lazy multi-shard traces: views, chunked passes, checksums, and a read under a memory cap (issue 10)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import routecast.trace.trace as trace_mod
from routecast.common.errors import TraceError
from routecast.trace import lazy
from routecast.trace.io import read_trace, verify_trace, write_trace
from routecast.trace.lazy import ShardedArray
from routecast.trace.spec import MoESpec
from routecast.trace.summary import inspect_trace
from routecast.trace.trace import Trace, make_columns


def serving_trace(T: int = 700, L: int = 4, E: int = 16, K: int = 2, seed: int = 0) -> Trace:
    """Steps of 1-40 tokens in increasing order, requests interleaved, 3 tasks, some dropped slots."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 40, T)
    step = np.repeat(np.arange(T), sizes)[:T]
    ex = np.argsort(rng.random((T, L, E)) + np.linspace(0, 0.6, E), axis=-1)[..., :K].astype(np.int16)
    ex[rng.random(ex.shape) < 0.02] = -1
    w = rng.random((T, L, K)).astype(np.float32)
    req = rng.integers(0, 30, T)
    order = np.argsort(req, kind="stable")
    pos = np.empty(T, np.int64)  # each request's tokens at positions 0, 1, ... in row (= step) order
    pos[order] = np.arange(T) - np.searchsorted(req[order], req[order])
    cols = make_columns(T, request=req, position=pos, step=step, token_id=rng.integers(0, 50, T),
                        phase=(rng.random(T) < 0.3).astype(np.int8), task=req % 3)
    return Trace(spec=MoESpec(num_layers=L, num_experts=E, top_k=K, name="lazy-test"), tokens=cols, experts_TLK=ex,
                 weights_TLK=w, task_names=("a", "b", "c"))


@pytest.fixture
def on_disk(tmp_path):
    tr = serving_trace()
    d = tmp_path / "t"
    write_trace(tr, d, shard_tokens=64)  # 11 shards
    return tr, d


@pytest.fixture
def tiny_chunks(monkeypatch):
    monkeypatch.setattr(trace_mod, "CHUNK_ROWS", 23)  # chunks end inside shards and inside steps


def test_multi_shard_read_is_lazy_and_indexes_like_memory(on_disk):
    tr, d = on_disk
    lz = read_trace(d)
    assert lz.is_lazy and isinstance(lz.experts_TLK, ShardedArray) and lz.experts_TLK.source.num_shards == 11
    before = lazy.MATERIALISED["count"]
    ex = tr.experts_TLK
    rng = np.random.default_rng(1)
    idx = rng.integers(-700, 700, 50)
    mask = rng.random(700) < 0.3
    for key in (5, -1, slice(10, 20), slice(60, 200), slice(1, None), idx, mask, (slice(60, 70), 1), (idx, 2, 0),
                slice(None, None, 3), (mask, 0)):
        np.testing.assert_array_equal(lz.experts_TLK[key], ex[key], err_msg=str(key))
    np.testing.assert_array_equal(lz.weights_TLK[100:300], tr.weights_TLK[100:300])
    assert lazy.MATERIALISED["count"] == before  # none of that loaded the whole tensor
    np.testing.assert_array_equal(np.asarray(lz.experts_TLK), ex)  # this does, and says so
    assert lazy.MATERIALISED["count"] == before + 1
    # so does every other spelling of a whole read: each holds all rows (or a whole column) in memory at once
    whole = (slice(None), Ellipsis, (slice(None), 0), slice(0, 10**6), slice(None, None, -1), np.ones(700, bool),
             np.arange(700), np.arange(700).reshape(7, 100), np.r_[np.arange(700), 3], (np.ones(700, bool), 1, 0))
    for n, key in enumerate(whole, start=2):
        np.testing.assert_array_equal(lz.experts_TLK[key], ex[key], err_msg=str(key))
        assert lazy.MATERIALISED["count"] == before + n, key
    np.testing.assert_array_equal(lz.materialise().weights_TLK, tr.weights_TLK)


def test_chunks_and_step_chunks_cover_the_trace_in_order(on_disk, tiny_chunks):
    tr, d = on_disk
    lz = read_trace(d)
    rows = [(a, ch.num_tokens) for a, ch in lz.chunks()]
    assert [a for a, _ in rows] == list(np.cumsum([0] + [n for _, n in rows])[:-1])
    assert sum(n for _, n in rows) == 700 and max(n for _, n in rows) <= 23
    seen = []
    step = tr.tokens["step"]
    for a, ch in lz.step_chunks():
        b = a + ch.num_tokens
        assert a == 0 or step[a] != step[a - 1]  # starts at a step boundary
        assert b == 700 or step[b] != step[b - 1]  # ends at one
        np.testing.assert_array_equal(ch.experts_TLK, tr.experts_TLK[a:b])
        np.testing.assert_array_equal(ch.tokens["step"], step[a:b])
        seen.append((a, b))
    assert seen[0][0] == 0 and seen[-1][1] == 700 and all(x[1] == y[0] for x, y in zip(seen, seen[1:], strict=False))


def test_streaming_commands_match_memory_and_never_load_the_trace(on_disk, tiny_chunks, monkeypatch):
    from routecast.place.compare import compare_methods, summarize
    from routecast.predict.evaluate import evaluate
    from routecast.sim.hardware import load_hardware
    from routecast.sim.models import load_model
    from routecast.trace import stats_bundle
    from routecast.trace.stats_bundle import routing_stats
    from routecast.trace.synth_presets import moegps_skewness

    tr, d = on_disk
    lz = read_trace(d)
    monkeypatch.setattr(stats_bundle, "SAMPLE_TOKENS", 300)  # a sample cap below the 700 rows: reading all is whole
    before = lazy.MATERIALISED["count"]
    assert routing_stats(lz, ep=4, seq_len=None) == routing_stats(tr, ep=4, seq_len=None)
    names = "distribution,probability,conditional-token,conditional-position"
    rows = [[{k: v for k, v in r.items() if "us_per" not in k and k != "fit_s"} for r in res] for res in (
        evaluate(lz, names, progress=False), evaluate(tr, names, progress=False))]
    assert json.dumps(rows[0]) == json.dumps(rows[1])
    assert moegps_skewness(lz, seq_len=50) == pytest.approx(moegps_skewness(tr, seq_len=50), rel=1e-12)
    hw, model = load_hardware("h100-sxm"), load_model("mixtral-8x7b")
    small = serving_trace(E=8, seed=3)  # Mixtral's 8 experts for the cost model
    write_trace(small, d.parent / "s", shard_tokens=64)
    lz8 = read_trace(d.parent / "s")
    strip = [{k: v for k, v in r.items() if not k.startswith("planner")} for r in
             summarize(compare_methods(lz8, ep=4, hw=hw, model=model))]
    ref = [{k: v for k, v in r.items() if not k.startswith("planner")} for r in
           summarize(compare_methods(small, ep=4, hw=hw, model=model))]
    assert json.dumps(strip) == json.dumps(ref)
    assert lazy.MATERIALISED["count"] == before


def test_bit_flip_in_routing_data_is_caught_by_the_checksum(on_disk):
    _, d = on_disk
    meta = json.loads((d / "trace.json").read_text())
    assert all(isinstance(s["crc32"], int) for s in meta["shards"])
    f = d / "routing-00003.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-300] ^= 0x01  # one bit in the token columns' tail: every value stays valid
    f.write_bytes(bytes(raw))
    tr = read_trace(d)  # opening maps nothing yet
    with pytest.raises(TraceError, match=r"routing-00003\.safetensors: CRC-32 .* expected .* trace\.json"):
        verify_trace(tr)
    info = inspect_trace(d)
    assert not info["valid"] and "CRC-32" in info["error"]
    assert verify_trace(read_trace(d, verify=False)) == 11  # the checksum is optional on read, not in inspect
    with pytest.raises(TraceError, match="CRC-32"):
        read_trace(d, mmap=False)


def test_an_out_of_range_id_is_named_with_or_without_the_checksum(on_disk):
    # The value checks run on every shard whatever its CRC says, and before the CRC, so the id is named
    # (tests/trace/test_trace_values.py changes values with a CRC that matches).
    _, d = on_disk
    f = d / "routing-00002.safetensors"
    raw = bytearray(f.read_bytes())
    start = int.from_bytes(raw[:8], "little") + 8  # safetensors: header length, JSON header, tensors
    a = start + json.loads(raw[8:start])["experts_TLK"]["data_offsets"][0]
    raw[a:a + 2] = (999).to_bytes(2, "little", signed=True)  # the first expert id of the shard
    f.write_bytes(bytes(raw))
    for verify in (True, False):
        with pytest.raises(TraceError, match=r"routing-00002\.safetensors.*expert id 999"):
            verify_trace(read_trace(d, verify=verify))


def test_synth_writes_shard_by_shard(tmp_path):
    from routecast.trace.synth_presets import synth_to_disk

    d = synth_to_disk("switch-128", tmp_path / "s", tokens=2500, shard_tokens=512)
    meta = json.loads((d / "trace.json").read_text())
    assert len(meta["shards"]) >= 5 and meta["num_tokens"] >= 2500
    tr = read_trace(d)
    assert tr.is_lazy and verify_trace(tr) == len(meta["shards"])
    ex = tr.materialise().experts_TLK
    s = np.sort(ex, axis=-1)
    assert (s[..., 1:] != s[..., :-1]).all()  # K distinct experts in every row of every block


def test_reading_under_a_memory_cap_smaller_than_the_trace(tmp_path):
    """A regression to whole-trace loading fails loudly: stats (the full pass, sequence skewness included) and
    schedule cocluster's fit sample, plan and streamed scoring run under RLIMIT_AS below the trace's size."""
    T, L, E, K = 60000, 32, 64, 8
    rng = np.random.default_rng(0)
    ex = np.argsort(rng.random((4096, L, E)), axis=-1)[..., :K].astype(np.int16)[np.arange(T) % 4096]
    # 100 requests of 600 tokens interleaved (as decode steps are): sequences are not contiguous row ranges.
    tr = Trace(spec=MoESpec(num_layers=L, num_experts=E, top_k=K), tokens=make_columns(
        T, request=np.arange(T) % 100, position=np.arange(T) // 100, step=np.arange(T) // 256,
        token_id=np.arange(T) % 101), experts_TLK=ex, weights_TLK=np.full(ex.shape, 1 / K, np.float32))
    d = tmp_path / "big"
    write_trace(tr, d, shard_tokens=4096)
    size = sum(f.stat().st_size for f in d.glob("routing-*.safetensors"))
    assert size > 90e6
    code = textwrap.dedent(f"""
        import resource, sys
        import numpy as np
        from routecast.trace.io import read_trace
        from routecast.trace.stats_bundle import routing_stats
        from routecast.trace.trace import Trace, make_columns
        from routecast.trace.spec import MoESpec
        warm = Trace(spec=MoESpec(num_layers=2, num_experts=4, top_k=2), tokens=make_columns(8),
                     experts_TLK=np.zeros((8, 2, 2), np.int16) + np.arange(2, dtype=np.int16),
                     weights_TLK=np.ones((8, 2, 2), np.float32))
        routing_stats(warm, ep=2, seq_len=4)  # compile the numba kernels before the cap
        from routecast.schedule.ceo import CEOConfig
        from routecast.schedule.cocluster import cocluster, evaluate_plan, fit_sample
        cfg = CEOConfig(n_steps=3, samples=8)
        evaluate_plan(cocluster(warm, 2, "smoe", config=cfg), warm)  # imports, compiles
        tr = read_trace({str(d)!r})
        vm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmSize")) * 1024
        cap = vm + {size} // 3
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        d = routing_stats(tr, ep=8, max_tokens=2048, seq_len=512)
        assert d["num_tokens"] == {T} and d["per_layer"]["skewness_seq_mean"][0] is not None
        # schedule cocluster's path: held-out masks, a capped fit sample, the streamed scoring of both sides
        (train, test), _, _ = tr.heldout_masks("request", (0.8, 0.2), seed=0)
        fit, note = fit_sample(tr, train, 2048)
        plan = cocluster(tr, 8, "smoe", rows=fit, config=cfg)
        ev = [evaluate_plan(plan, tr, rows=r) for r in (fit, test)]
        assert note and ev[1]["tokens"] == test.sum() and ev[0]["tokens"] <= 2048
        try:
            np.asarray(tr.weights_TLK)
        except MemoryError:
            print("capped", cap - vm)
            sys.exit(0)
        sys.exit("whole-trace load succeeded under the cap")
    """)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and "capped" in p.stdout, p.stdout + p.stderr[-3000:]
