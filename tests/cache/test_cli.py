"""`routecast cache replay` end to end: table and JSON, forecasts through the harness, one-line errors."""

import dataclasses
import json

import numpy as np
import pytest

from routecast.cache.forecasts import forecast_sets, run_replay
from routecast.cache.replay import build_accesses, parse_budget, true_sets
from routecast.cli import main
from routecast.common.errors import ConfigError
from routecast.predict.frequency import ConditionalPredictor, by_token_preset
from routecast.predict.store import save_predictor
from routecast.trace import MoESpec
from routecast.trace.io import write_trace
from tests.conftest import build_small_trace


@pytest.fixture
def small():
    tr = build_small_trace(num_requests=10, num_experts=8)
    return dataclasses.replace(tr, spec=dataclasses.replace(tr.spec, expert_bytes=1 << 20))


def test_replay_table_json_and_gap(small, tmp_path, capsys):
    d = write_trace(small, tmp_path / "t")
    out = tmp_path / "r.json"
    assert main(["cache", "replay", str(d), "--budget", "50%", "--policies", "lru,lfuda,plec-correct,belady",
                 "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "plec-correct" in text and "gap closed" in text
    res = json.loads(out.read_text())
    rows = {r["policy"]: r for r in res["rows"]}
    assert rows["lru"]["gap_closed"] in (0.0, None) and res["settings"]["budget_slots"] == 12
    assert rows["belady"]["demand_loads"] <= rows["lru"]["demand_loads"]


def test_bad_input_is_one_line_exit_2(small, tmp_path, capsys):
    d = write_trace(small, tmp_path / "t")
    for args, want in ((["--budget", "0"], "--budget"), (["--budget", "25"], "1..24"), (["--budget", "150%"], "1..24"),
                       (["--budget", "nan"], "--budget"), (["--policies", "lru,nosuch"], "nosuch"), (["--policies", ","], "--policies"),
                       (["--predictor", "nosuch"], "--predictor"), (["--hardware", "nosuch"], "hardware"),
                       (["--dense-us", "nan"], "--dense-us is nan"), (["--expert-bytes", "-5"], "--expert-bytes is -5"),
                       (["--policies", "lru", "--train-fraction", "1.5"], "--train-fraction is 1.5")):
        assert main(["cache", "replay", str(d), "--quiet", "--out", str(tmp_path / "x.json"), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert want in err and len(err.splitlines()) == 1, err
    other = ConditionalPredictor(MoESpec(num_layers=2, num_experts=8, top_k=2), by_token_preset())
    other.fit(build_small_trace(num_requests=3, num_layers=2))
    pdir = save_predictor(other, tmp_path / "p")
    assert main(["cache", "replay", str(d), "--predictor", str(pdir), "--quiet", "--out", str(tmp_path / "y.json")]) == 2
    assert "L=2" in capsys.readouterr().err


def test_forecast_sets_are_the_batch_unions_of_the_harness_forecasts(small):
    train, test = small.split("request", (0.6, 0.4), seed=0)
    pred = ConditionalPredictor(small.spec, by_token_preset()).fit(train)
    sets, ahead = forecast_sets(pred, test)
    acc = build_accesses(test)
    assert sets.shape == true_sets(acc).shape and not ahead
    assert sets.sum(axis=-1).min() >= small.spec.top_k  # every step predicts at least K experts per layer
    oracle = run_replay(small, budget="50%", policies=["plec-correct"], predictor="oracle")
    by = {r["policy"]: r for r in oracle["rows"]}
    assert by["plec-correct"]["covered_ratio"] >= by["lru"]["covered_ratio"]


def test_parse_budget_forms():
    assert parse_budget("50%", 32, 100) == 16
    assert parse_budget("7", 32, 100) == 7
    assert parse_budget("1KB", 32, 100) == 10
    for bad in ("0%", "2.5", "abc", "33"):
        with pytest.raises(ConfigError):
            parse_budget(bad, 32, 100)
    assert np.isfinite(parse_budget("100%", 32, 0))


def test_make_forecast_is_reused_and_a_saved_predictor_must_not_have_trained_on_the_replay(small, tmp_path):
    from routecast.cache.forecasts import make_forecast
    from routecast.predict.evaluate import fit_and_save

    fc = make_forecast(small, "conditional-token", split="request")
    a = run_replay(small, budget="50%", policies=["plec"], forecast=fc)
    b = run_replay(small, budget="50%", policies=["plec"], predictor="conditional-token", split="request")
    assert [r["hit_ratio"] for r in a["rows"]] == [r["hit_ratio"] for r in b["rows"]]
    same = fit_and_save(small, "conditional-token", tmp_path / "same", split="request", progress=False)
    assert "loaded from" in make_forecast(small, str(same), split="request")[3]
    whole = fit_and_save(small, "conditional-token", tmp_path / "whole", split="none", progress=False)
    with pytest.raises(ConfigError, match="fitted on this trace"):
        make_forecast(small, str(whole), split="request")


def test_out_naming_a_directory_is_refused_before_the_replay_and_leaves_nothing(small, tmp_path, capsys):
    d = write_trace(small, tmp_path / "t")
    out = tmp_path / "out"
    out.mkdir()
    assert main(["cache", "replay", str(d), "--quiet", "--policies", "lru", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a directory; expected a file path" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "t"]  # no stray out.tmp beside it


def test_score_all_scores_a_predictor_from_another_trace_on_every_row(small, tmp_path, capsys):
    d = write_trace(small, tmp_path / "t")
    other = build_small_trace(num_requests=4, num_experts=8, seed=7)
    pred = ConditionalPredictor(small.spec, by_token_preset())
    pred.fit(other)
    pdir = save_predictor(pred, tmp_path / "p")
    out = tmp_path / "r.json"
    assert main(["cache", "replay", str(d), "--predictor", str(pdir), "--score-all", "--policies", "lirs,fc-evict",
                 "--out", str(out), "--quiet"]) == 0
    res = json.loads(out.read_text())
    assert res["settings"]["replayed_tokens"] == small.num_tokens and "whole trace" in res["settings"]["predictor"]
    us = [r["us_per_token"] for r in res["rows"]]
    assert us == sorted(us) and {"lirs", "fc-evict", "lru", "belady"} <= {r["policy"] for r in res["rows"]}
    capsys.readouterr()
    assert main(["cache", "replay", str(d), "--predictor", "conditional-token", "--score-all", "--quiet",
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "--score-all" in capsys.readouterr().err


def test_reuse_probe_flag_fits_on_the_training_rows_and_refuses_what_it_cannot_read(tmp_path, capsys):
    tr = build_small_trace(num_requests=10, num_experts=8, hidden=6)
    d = write_trace(dataclasses.replace(tr, spec=dataclasses.replace(tr.spec, expert_bytes=1 << 20)), tmp_path / "t")
    out = tmp_path / "r.json"
    assert main(["cache", "replay", str(d), "--policies", "lru,fc-evict", "--reuse-probe", "--out", str(out),
                 "--quiet"]) == 0
    res = json.loads(out.read_text())
    assert res["settings"]["reuse_probe"] and "learning on the replayed ones (weight 16)" in res["settings"]["predictor"]
    assert res["settings"]["probe_adapt"] == 16.0
    rows = {r["policy"]: r for r in res["rows"]}
    assert rows["fc-evict"]["demand_loads"] >= rows["belady"]["demand_loads"]
    fixed = tmp_path / "f.json"  # --probe-adapt 0: the probe stays as fitted
    assert main(["cache", "replay", str(d), "--policies", "lru,fc-evict", "--reuse-probe", "--probe-adapt", "0",
                 "--out", str(fixed), "--quiet"]) == 0
    st = json.loads(fixed.read_text())["settings"]
    assert st["probe_adapt"] == 0.0 and st["predictor"].endswith("reuse probe fitted on the same rows")
    no_hidden = write_trace(build_small_trace(num_requests=10, num_experts=8), tmp_path / "n")
    for trace, args, want in ((d, ["--policies", "lru"], "fc-evict only"),
                              (d, ["--policies", "fc-evict", "--predictor", "oracle"], "--predictor oracle"),
                              (no_hidden, ["--policies", "fc-evict"], "router inputs"),
                              (d, ["--policies", "fc-evict", "--probe-adapt", "-1"], "--probe-adapt"),
                              (d, ["--policies", "fc-evict", "--probe-adapt", "nan"], "--probe-adapt")):
        capsys.readouterr()
        assert main(["cache", "replay", str(trace), "--reuse-probe", "--quiet", "--out", str(tmp_path / "x.json"),
                     *args]) == 2
        err = capsys.readouterr().err.strip()
        assert want in err and len(err.splitlines()) == 1, err
        assert not (tmp_path / "x.json").exists()
    capsys.readouterr()  # the weight without the probe it weighs
    assert main(["cache", "replay", str(d), "--policies", "fc-evict", "--probe-adapt", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "expected it with --reuse-probe" in err and len(err.splitlines()) == 1, err
