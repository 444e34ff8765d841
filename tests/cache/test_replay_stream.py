"""cache replay streams: windows of accesses, the kernel's carried state, Belady's next use, forecasts on disk.

A replay cut into windows must give bit-for-bit the result of one window holding the whole trace, for every
policy; and a replay of a multi-shard trace must run under a memory cap that whole-trace accesses exceed.
"""

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routecast.cache import stream
from routecast.cache.forecasts import forecast_sets, run_replay
from routecast.cache.replay import (
    ORACLE,
    POLICIES,
    ReplayConfig,
    build_accesses,
    forecast_entries,
    replay,
    run_policy,
    true_sets,
)
from routecast.predict.evaluate import fit_or_load, heldout
from routecast.sim.hardware import load_hardware
from routecast.trace import MoESpec, Trace, make_columns
from routecast.trace.io import read_trace, write_trace
from tests.cache.test_properties import tiny_trace
from tests.conftest import build_small_trace

HW = load_hardware("h100-sxm")
TIMING = ("replay_s", "events_per_s")


def assert_rows_equal(got: dict, want: dict, where: str) -> None:
    assert got.keys() == want.keys(), where
    for k, v in want.items():
        if k in TIMING:
            continue
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(got[k], v, err_msg=f"{where} {k}")
        elif isinstance(v, float) and np.isnan(v):
            assert np.isnan(got[k]), f"{where} {k}"
        else:
            assert got[k] == v, f"{where} {k}: {got[k]!r} != {v!r}"


def test_accesses_are_the_same_for_any_window_of_a_sharded_trace(tmp_path):
    tr = build_small_trace()
    write_trace(tr, tmp_path / "t", shard_tokens=37)  # shards cut through steps
    lazy = read_trace(tmp_path / "t")
    whole = build_accesses(tr)
    for rows in (None, 1, 50):
        got = build_accesses(lazy, rows)
        for f in dataclasses.fields(whole):
            np.testing.assert_array_equal(getattr(got, f.name), getattr(whole, f.name), err_msg=f"{rows} {f.name}")
    # the accesses are the per-(step, layer) unions: every routed slot is counted once per token
    assert whole.req_tokens.sum() == (np.asarray(tr.experts_TLK) >= 0).sum()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.tuples(st.integers(0, 10_000), st.integers(1, 3), st.integers(2, 6), st.integers(1, 2),
                      st.integers(2, 7), st.integers(1, 3)),
       frac=st.floats(0.05, 1.0), ws=st.integers(1, 3), ahead=st.booleans(), dense=st.sampled_from([0.0, 2.5]))
def test_windowed_replay_is_bit_identical_to_one_window(args, frac, ws, ahead, dense):
    seed, L, E, k, steps, per_step = args
    tr = tiny_trace(seed, L, E, min(k, E), steps, per_step)
    acc = build_accesses(tr)
    budget = max(1, int(round(frac * L * E)))
    cfg = ReplayConfig(budget=budget, hardware=HW, dense_us=dense, plec_depth=1 + seed % 2,
                       plec_fallback=("lfu", "lru")[seed % 2])
    rng = np.random.default_rng(seed)
    fc = forecast_entries(acc, true_sets(acc) ^ (rng.random((len(acc.step_ids), L, E)) < 0.3))
    for name, pol in POLICIES.items():
        if pol.per_layer and budget < L:
            continue
        kw = dict(forecast=fc, log=True, expert_bytes=1 << 20, layer_ahead=ahead)
        assert_rows_equal(run_policy(acc, name, cfg, window_steps=ws, **kw), run_policy(acc, name, cfg, **kw),
                          f"{name} windows of {ws} steps")


def test_streamed_replay_of_a_sharded_trace_equals_the_in_memory_replay(tmp_path):
    tr = tiny_trace(3, 3, 6, 2, 40, 3)
    write_trace(tr, tmp_path / "t", shard_tokens=37)  # 4 shards, cut through steps
    lazy = read_trace(tmp_path / "t")
    mask = np.random.default_rng(0).random(tr.num_tokens) < 0.7
    sub = tr.select(mask)
    acc = build_accesses(sub)
    rng = np.random.default_rng(1)
    pred = true_sets(acc) ^ (rng.random((len(acc.step_ids), acc.L, acc.E)) < 0.25)
    packed = stream.PackedSets(tmp_path / "f.bits", *pred.shape)
    for i in range(len(pred)):
        packed[i] = pred[i]
    np.testing.assert_array_equal(packed[3:11], pred[3:11])
    cfg = ReplayConfig(budget=7, hardware=HW, dense_us=1.0)
    names = list(POLICIES)
    for fc, fc_name in ((pred, "array"), (packed, "packed"), (ORACLE, "oracle")):
        sets = true_sets(acc) if fc is ORACLE else pred
        want = {n: run_policy(acc, n, cfg, forecast=forecast_entries(acc, sets), expert_bytes=1 << 20) for n in names}
        for rows in (1, 9, None):  # windows of one step, a few steps, the default (one window here)
            got = replay(lazy, names, cfg, pred_SLE=fc, mask=mask, rows=rows, tmp_dir=tmp_path)
            for r in got:
                assert_rows_equal({k: v for k, v in r.items() if k not in ("gap_closed", "shown")},
                                  want[r["policy"]], f"{fc_name} rows={rows} {r['policy']}")
    packed.close()
    assert list(tmp_path.glob("routecast-replay-*")) == []  # the next-use file is gone


def test_cli_replay_on_row_masks_equals_the_copied_held_out_trace(tmp_path, monkeypatch):
    """run_replay fits, forecasts and replays on row masks of a lazy trace, in tiny windows; the result is
    the one of the held-out requests copied into memory and replayed in one window."""
    tr = build_small_trace(num_requests=12, num_experts=8)
    tr = dataclasses.replace(tr, spec=dataclasses.replace(tr.spec, expert_bytes=1 << 20))
    write_trace(tr, tmp_path / "t", shard_tokens=29)
    monkeypatch.setattr(stream, "ACCESS_ROWS", 7)
    names = ["lru", "lfu", "semoe", "plec", "plec-correct", "belady"]
    got = run_replay(read_trace(tmp_path / "t"), budget="40%", policies=names, predictor="conditional-token",
                     dense_us=3.0, tmp_dir=tmp_path)
    train, test, _ = heldout(tr, "document", 0.8, 0)
    pred = fit_or_load("conditional-token", train, model=None, seed=0, threads=1, quiet=True)
    sets, ahead = forecast_sets(pred, test)
    acc = build_accesses(test)
    cfg = ReplayConfig(budget=got["settings"]["budget_slots"], hardware=HW, dense_us=3.0, expert_bytes=1 << 20)
    assert got["settings"]["replayed_tokens"] == test.num_tokens
    for r in got["rows"]:
        want = run_policy(acc, r["policy"], cfg, forecast=forecast_entries(acc, sets), layer_ahead=ahead)
        assert want.keys() <= r.keys()  # plus the time-first columns (compare.add_time_metrics)
        assert_rows_equal({k: v for k, v in r.items() if k in want}, want, r["policy"])


def test_replay_under_a_memory_cap_smaller_than_its_whole_trace_accesses(tmp_path):
    """A regression to whole-trace accesses fails loudly: cache replay of a multi-shard trace in windows of
    256 rows runs under RLIMIT_AS, where building the whole trace's accesses (~40 MB here) does not fit."""
    T, L, E, K = 24000, 8, 64, 8
    rng = np.random.default_rng(0)
    ex = np.argsort(rng.random((4096, L, E)), axis=-1)[..., :K].astype(np.int16)[np.arange(T) % 4096]
    tr = Trace(spec=MoESpec(num_layers=L, num_experts=E, top_k=K, expert_bytes=1 << 20),
               tokens=make_columns(T, request=np.arange(T) // 600, position=np.arange(T) % 600,
                                   step=np.arange(T) // 2),  # steps of 2 tokens: ~16 experts per access
               experts_TLK=ex, weights_TLK=np.full(ex.shape, 1 / K, np.float32))
    d = tmp_path / "big"
    write_trace(tr, d, shard_tokens=4096)
    code = textwrap.dedent(f"""
        import resource, sys
        import numpy as np
        from routecast.cache.replay import ReplayConfig, build_accesses, replay
        from routecast.common.errors import TraceError
        from routecast.sim.hardware import load_hardware
        from routecast.trace.io import read_trace
        from tests.cache.test_properties import tiny_trace
        cfg = ReplayConfig(budget={L * E // 2}, hardware=load_hardware("h100-sxm"))
        replay(tiny_trace(0, 2, 4, 2, 6, 2), ["lfu"], cfg, rows=4, tmp_dir={str(tmp_path)!r})  # compile first
        tr = read_trace({str(d)!r})
        vm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmSize")) * 1024
        cap = vm + 24_000_000
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        rows = replay(tr, ["lfu"], cfg, rows=256, tmp_dir={str(tmp_path)!r})
        print("loads", *[r["demand_loads"] for r in rows])
        try:
            build_accesses(tr)
        except (MemoryError, TraceError) as e:  # numpy's allocation or the next shard's mapping hits the cap
            assert isinstance(e, MemoryError) or "Cannot allocate memory" in str(e), e
            print("capped", cap - vm)
            sys.exit(0)
        sys.exit("whole-trace accesses fit under the cap")
    """)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and "capped" in p.stdout, p.stdout + p.stderr[-3000:]
    acc = build_accesses(tr)
    want = [run_policy(acc, n, ReplayConfig(budget=L * E // 2, hardware=HW), expert_bytes=1 << 20)["demand_loads"]
            for n in ("lru", "lfu", "belady")]
    assert p.stdout.split("\n")[0] == "loads " + " ".join(map(str, want))


@pytest.mark.slow
def test_windowed_replay_of_a_real_capture_is_bit_identical(tmp_path):
    """A trace captured from the shipped DeepSeek-V3-architecture model: every policy, windows of one step."""
    from routecast.trace.capture import capture_to_disk

    out = capture_to_disk("builtin-fine", "corpus:test:12", tmp_path / "t", max_new_tokens=6, batch_size=4,
                          progress=False)
    tr = read_trace(out)
    acc = build_accesses(tr)
    cfg = ReplayConfig(budget=acc.L * acc.E // 2, hardware=HW, dense_us=20.0)
    rng = np.random.default_rng(0)
    fc = forecast_entries(acc, true_sets(acc) ^ (rng.random((len(acc.step_ids), acc.L, acc.E)) < 0.2))
    for name in POLICIES:
        kw = dict(forecast=fc, log=True, expert_bytes=tr.spec.expert_bytes or 1 << 20)
        assert_rows_equal(run_policy(acc, name, cfg, window_steps=1, **kw), run_policy(acc, name, cfg, **kw), name)
