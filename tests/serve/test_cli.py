"""`routecast serve-sim`: a run writes its JSON; bad input is one sentence and exit code 2."""

from __future__ import annotations

import json

import numpy as np
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
    ["--scheduler", "sjf"], ["--rate", "0"], ["--rate", "nan"], ["--rates", "1,-2"], ["--rate", "1e-300"], ["--model-profile", "nope"],
    ["--hardware", "nope"], ["--budget", "0%"], ["--budget", "nan"], ["--lar", "nan"], ["--lar", "2"],
    ["--requests", "0"], ["--gpus", "0"], ["--gpus", "-2"], ["--link-gbps", "0"], ["--slo-ttft", "abc"], ["--slo-tpot", "0"], ["--period", "0"], ["--token-budget", "8"],
])
def test_serve_sim_bad_input(args, tmp_path, capsys):
    rc = main(["serve-sim", "--requests", "20", "--out", str(tmp_path / "x.json"), "--quiet", *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("routecast serve-sim: error:") and err.count("\n") == 1
    assert not (tmp_path / "x.json").exists()


def test_serve_sim_replays_a_trace_over_a_slow_link(tmp_path, small_trace, capsys):
    from routecast.trace.io import write_trace

    write_trace(small_trace(num_requests=6), tmp_path / "tr")
    out = tmp_path / "t.json"
    rc = main(["serve-sim", "--trace", str(tmp_path / "tr"), "--rates", "2,50", "--scheduler", "vllm,emoe",
               "--gpus", "8", "--link", "pcie", "--link-gbps", "20.8", "--lar", "0.9", "--out", str(out), "--quiet"])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 and all(r["requests"] == 6 for r in rows)
    assert "20.8 GB/s" in capsys.readouterr().out


def test_serve_sim_budget_uses_the_traces_task_routing(tmp_path, capsys, small_trace):
    from routecast.serve.workload import Requests, task_expert_freq
    from routecast.trace.io import write_trace

    tr = small_trace(num_requests=6, num_layers=3, num_experts=8)
    f = task_expert_freq(tr, len(Requests.from_trace(tr).task_names), 32)
    assert f.shape[1:] == (32, 8) and np.allclose(f.sum(-1), 1.0) and np.array_equal(f[:, 3], f[:, 0])
    write_trace(tr, tmp_path / "tr")
    rc = main(["serve-sim", "--trace", str(tmp_path / "tr"), "--rate", "5", "--budget", "50%", "--period", "1",
               "--out", str(tmp_path / "b.json"), "--quiet"])
    assert rc == 0 and "per-task expert frequencies from" in capsys.readouterr().out
