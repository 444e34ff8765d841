"""`routecast serve-sim`: a run writes its JSON; bad input is one sentence and exit code 2."""

from __future__ import annotations

import json

import pytest

from routecast.cli import main


def test_serve_sim_sweep_writes_json(tmp_path, capsys):
    out = tmp_path / "s.json"
    rc = main(["serve-sim", "--rates", "4,16", "--requests", "60", "--scheduler", "emoe,fcfs,vllm", "--budget", "50%",
               "--lar", "0.7", "--out", str(out), "--quiet"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 6 and {r["scheduler"] for r in doc["rows"]} == {"emoe", "fcfs", "vllm"}
    assert doc["engine"]["resident_per_layer"] == 4 and doc["config"]["lar"] == 0.7
    text = capsys.readouterr().out
    assert "throughput under SLO" in text and "emoe" in text


@pytest.mark.parametrize("args", [
    ["--scheduler", "sjf"], ["--rate", "0"], ["--rate", "nan"], ["--rates", "1,-2"], ["--model-profile", "nope"],
    ["--hardware", "nope"], ["--budget", "0%"], ["--budget", "nan"], ["--lar", "nan"], ["--lar", "2"],
    ["--requests", "0"], ["--slo-ttft", "abc"], ["--slo-tpot", "0"], ["--period", "0"], ["--token-budget", "8"],
])
def test_serve_sim_bad_input(args, tmp_path, capsys):
    rc = main(["serve-sim", "--requests", "20", "--out", str(tmp_path / "x.json"), "--quiet", *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("routecast serve-sim: error:") and err.count("\n") == 1
    assert not (tmp_path / "x.json").exists()
