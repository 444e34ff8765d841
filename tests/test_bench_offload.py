"""benchmarks/offload.py's headline arithmetic: the runtime's ceiling (LRU's wall over the resident-path run's)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_offload", ROOT / "benchmarks" / "offload.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _walls(*xs):
    return [{"wall_s": x} for x in xs]


def test_ceiling_is_per_round_lru_over_resident_path(bench):
    runs = {"resident-path": _walls(4.0, 5.0, 2.0), "lru@50%": _walls(5.0, 5.5, 3.0)}
    assert bench.ceiling(runs, "50%") == pytest.approx((1.25, 1.1, 1.5))
    assert bench.ceiling(runs, "25%") is None  # no LRU rounds at that budget
    assert bench.ceiling({"lru@50%": _walls(1.0)}, "50%") is None  # no resident-path run


def test_headline_states_the_ceiling_and_the_share_of_it_a_target_needs(bench):
    row = {"prefetch": "none", "policy": "lru", "x_lru": 1.0, "x_lru_min": 1.0, "x_lru_max": 1.0,
           "predictor_share": 0.0, "logits_allclose": True}
    out = {"rows": [dict(row, config="lru@50%"), dict(row, config="lookahead@50%", prefetch="lookahead", x_lru=1.05,
                                                        x_lru_min=0.9, x_lru_max=1.1, predictor_share=0.04)],
           "runs": {"resident-path": _walls(4.0, 4.0), "lru@50%": _walls(5.0, 4.8)},
           "load_avg": [1.0, 1.2], "machine": {"cpus": 2}, "tier": {"mode": "o_direct"}}
    lines = bench.headline(out)
    ceil = [x for x in lines if "ceiling" in x]
    assert ceil == ["budget 50%: ceiling 1.23x LRU tokens/s (per-round min-max 1.20-1.25): the resident-path run, this "
                    "engine with every expert resident, no reads, stalls or predictor; 1.10x needs 44% of that margin"]
    out["runs"]["lru@50%"] = _walls(3.9, 4.0)  # LRU as fast as every expert resident: nothing left to gain
    assert "1.10x is out of reach" in [x for x in bench.headline(out) if "ceiling" in x][0]


def test_belady_ceiling_prices_beladys_reads_at_lrus_measured_cost_per_read(bench, monkeypatch):
    monkeypatch.setattr(bench, "_kernel", lambda r0, budget, pf, L, E, n, eb, hw, dense, policy="lru":
                        {"demand_loads": {"lru": 100, "belady": 60}[policy]})
    lru = [{"wall_s": 5.0, "reads": 200, "budget": 8}, {"wall_s": 6.0, "reads": 200, "budget": 8}]
    runs = {"resident-path": _walls(4.0, 4.0), "lru@50%": lru}
    c = bench.belady_ceiling(runs, "50%", 2, 8, 100, 1024, None, 0.0)
    # per round: resident + 60% of LRU's miss time -> 5 / 4.6 and 6 / 5.2
    assert c["x_lru"] == pytest.approx((5 / 4.6 + 6 / 5.2) / 2)
    assert (c["x_lru_min"], c["x_lru_max"]) == pytest.approx((5 / 4.6, 6 / 5.2))
    assert c["load_ratio"] == pytest.approx(0.6) and c["us_per_read"] == pytest.approx(7500.0)
    assert bench.belady_ceiling(runs, "25%", 2, 8, 100, 1024, None, 0.0) is None
    row = {"prefetch": "none", "policy": "lru", "x_lru": 1.0, "x_lru_min": 1.0, "x_lru_max": 1.0,
           "predictor_share": 0.0, "logits_allclose": True, "config": "lru@50%"}
    out = {"rows": [row], "runs": runs, "belady": {"50%": c}, "load_avg": [1.0, 1.2], "machine": {"cpus": 2},
           "tier": {"mode": "o_direct"}}
    line = [x for x in bench.headline(out) if "Belady" in x][0]
    assert line.startswith("budget 50%: Belady ceiling 1.12x LRU tokens/s (per-round min-max 1.09-1.15)")
    assert "60% of LRU's reads at LRU's measured 7500 µs per read; 1.10x needs 83% of Belady's gain" in line
    c["x_lru"] = 1.05
    assert "1.10x is beyond any eviction policy" in [x for x in bench.headline(out) if "Belady" in x][0]


def test_rounds_keep_the_reference_first_and_permute_the_rest():
    from routecast.common.bench import round_order

    configs = [(name, None) for name in ("all-resident", "resident-path", "on-demand", "lru@25%", "lfu@25%", "lru@50%",
                                         "fc-evict@50%")]
    assert round_order(configs, 0, keep=1) == configs  # the first round in the listed order
    orders = [round_order(configs, r, keep=1) for r in range(1, 5)]
    for o in orders:
        assert o[0] == configs[0] and sorted(o) == sorted(configs)
    assert len({tuple(o) for o in orders}) > 1  # LRU is not first of its budget in every round
    assert round_order(configs, 3, keep=1) == round_order(configs, 3, keep=1)  # seeded: a rerun repeats the order
    assert sorted(round_order(configs, 2)) == sorted(configs)  # keep=0 (the geometry benchmark): all permuted


@pytest.mark.parametrize("args, needle", [
    (["--geometry-minutes", "0"], "--geometry-minutes is 0.0; expected a positive number"),
    (["--geometry-minutes", "nan"], "--geometry-minutes is nan"),
    (["--routing-file", "none.npz"], "--routing-file none.npz: no such file"),
    (["--routing-file", "r.npz"], "holds the tokens in request order; --geometry-order is step"),
    (["--geometry-device", "tpu"], "--geometry-device is 'tpu'"),
    (["--save-routing", ""], "--save-routing '' is a directory"),
    (["--save-routing", "r.npz/x.npz"], "is a regular file, not a directory"),
    (["--save-routing", "s.npz", "--routing-file", "r.npz"], "expected one or the other"),
    (["--geometry-device", "cpu", "--geometry-layers", "100000"], "expected fewer --geometry-layers"),
    (["--geometry-replay", "6.5"], "expected READ_MS,COMPUTE_MS"),
    (["--geometry-replay", "0,1"], "expected a positive read time"),
    (["--geometry-replay", "1,nan"], "expected a positive read time"),
    (["--geometry-replay", "1,1", "--geometry-device", "cpu"], "expected neither --geometry-device"),
    (["--geometry-replay", "1,1", "--policies", "lfu"], "expected lru among --policies"),
    (["--gate", "p0.2"], "keeps each forecast's rank, not its probability"),
    (["--gate", "top0"], "--gate 'top0': expected 'pX' (a probability in [0, 1)) or 'topN'"),
    (["--gate", "pnan"], "--gate 'pnan': expected 'pX'"),
    (["--gate", "top2"], "expected topN with N from 1 to 1"),
    (["--gate", "top1", "--geometry-prefetch", ""], "expected the demand policies to combine it with"),
])
def test_geometry_flags_are_one_sentence_before_anything_is_written(args, needle, tmp_path):
    import subprocess
    import sys

    import numpy as np

    from routecast.runtime.offload.geometry import geometry
    from routecast.runtime.offload.geometry_routing import save_routing

    geom = geometry("mixtral-8x7b", 1)
    T = 4
    save_routing(tmp_path / "r.npz", {"ids": np.zeros((T, 1, 2), np.int64), "w": np.full((T, 1, 2), 0.5, np.float32),
                                      "request": np.zeros(T, np.int64), "pred": np.zeros((T, 1, 8), bool), "tokens": T,
                                      "order": "request", "trace": "t", "trace_layers": 1, "predict_s": 0.0}, geom)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "offload.py"), "--geometry", "mixtral-8x7b", "--geometry-layers", "1",
           *args]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and needle in err[0], p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.npz"]  # no weights, no trace, no bench JSON


def test_geometry_replay_prices_every_row_and_fc_evict_with_and_without_the_schedule(tmp_path):
    """--geometry-replay runs nothing (no weights written) and gives the replay's rows: LRU at 1.00x, fc-evict also
    without the server's schedule in step order, the same as replay_geometry's."""
    import json
    import subprocess
    import sys

    import numpy as np

    from routecast.runtime.offload.geometry import geometry, replay_geometry
    from routecast.runtime.offload.geometry_routing import save_routing

    geom = geometry("mixtral-8x7b", 2)
    T, rng = 20, np.random.default_rng(0)
    ids = np.stack([[rng.choice(8, 2, replace=False) for _ in range(2)] for _ in range(T)])
    rt = {"ids": ids, "w": np.full((T, 2, 2), 0.5, np.float32), "request": np.arange(T) % 4,
          "pred": rng.random((T, 2, 8)) < 0.3, "tokens": T, "order": "step", "trace": "t", "trace_layers": 2,
          "predict_s": 1e-4, "reuse": rng.uniform(0, 3, (T, 2, 16)).astype(np.float32), "reuse_s": 1e-5}
    rt["pred_rank"] = np.where(rt["pred"], rng.integers(1, 3, (T, 2, 8)), 0).astype(np.uint8)
    save_routing(tmp_path / "r.npz", rt, geom)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "offload.py"), "--geometry", "mixtral-8x7b", "--geometry-layers",
           "2", "--routing-file", "r.npz", "--geometry-warmup", "8", "--geometry-tokens", "12", "--budgets", "50",
           "--policies", "lru,fc-evict", "--geometry-prefetch", "fc-evict", "--geometry-replay", "5,0.5", "--gate", "top1"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads((tmp_path / "out/bench/offload_geometry_mixtral-8x7b-replay.json").read_text())["data"]
    rows = {r["config"]: r for r in out["rows"]}
    assert set(rows) == {"on-demand", "lru@50%", "fc-evict@50%", "fc-evict+probe@50%", "lookahead+fc-evict@50%",
                         "lookahead top1+fc-evict@50%"}
    assert rows["lru@50%"]["x_lru"] == 1.0 and rows["lru@50%"]["without_schedule_s_per_token"] is None
    assert not (tmp_path / "out/geometry").exists()  # no weights: nothing ran
    log = [(g, *np.unique(ids[t, g], return_counts=True)) for t in range(T) for g in range(2)]
    fig = {"log": log, "pred_sets": np.zeros((T, 2, 8), bool), "compute_s_per_expert": 5e-4, "policy": "fc-evict",
           "budget": 8, "prefetch": False, "reuse": True, "warmup": 8}
    for sched, key in ((True, "replay_s_per_token"), (False, "without_schedule_s_per_token")):
        want = replay_geometry(fig, geom, {**rt, "reuse": rt["reuse"]}, xfer_s=5e-3, schedule=sched)["s_per_token"]
        assert rows["fc-evict+probe@50%"][key] == pytest.approx(want)
    gated = (rt["pred_rank"] == 1) & (np.arange(2) > 0)[None, :, None]  # the top-1 forecast; layer 0 never prefetched
    fig.update(pred_sets=gated, prefetch=True, reuse=False)
    want = replay_geometry(fig, geom, rt, xfer_s=5e-3)
    assert rows["lookahead top1+fc-evict@50%"]["replay_hit_ratio"] == pytest.approx(want["hit_ratio"])
    assert rows["lookahead top1+fc-evict@50%"]["replay_s_per_token"] == pytest.approx(want["s_per_token"])


@pytest.mark.parametrize("content, needle", [
    (None, "cannot be read as benchmark JSON"),
    ("{not json", "cannot be read as benchmark JSON"),
    ('{"benchmark": "x", "title": "t", "headline": [], "tables": [], "machine": {}, "data": {"rows": []}}',
     "is not a saved run of this benchmark's non-geometry mode"),
])
def test_report_of_a_missing_or_foreign_file_is_one_sentence(content, needle, tmp_path):
    import subprocess
    import sys

    p = tmp_path / "saved.json"
    if content is not None:
        p.write_text(content)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "offload.py"), "--report", str(p)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and needle in err[0], r.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ([] if content is None else ["saved.json"])
