"""The full path on the built-in fine-grained model (slow: every rank imports transformers and loads the model):
`ep run` at EP 2 for every plan (outputs allclose to the single-process model, bytes == sim), and faults of
ranks started directly: a killed rank, a hung rank."""

from __future__ import annotations

import dataclasses
import time

import pytest

from routecast.common.errors import ConfigError
from routecast.models.builtin import builtin_path

pytestmark = pytest.mark.slow


@pytest.fixture
def fine_trace(tmp_path, small_trace):
    """A trace with builtin-fine's geometry (64 experts, top-6, H 128, MoE layers 1-5) and random router inputs."""
    from routecast.trace.io import write_trace

    if not (builtin_path("builtin-fine") / "model.safetensors").is_file():
        pytest.skip("builtin-fine checkpoint absent")
    t = small_trace(num_requests=6, prompt_len=20, decode_len=3, num_layers=5, num_experts=64, top_k=6, hidden=128)
    spec = dataclasses.replace(t.spec, layer_ids=(1, 2, 3, 4, 5), name="builtin-fine")
    write_trace(dataclasses.replace(t, spec=spec), tmp_path / "trace")
    return str(tmp_path / "trace")


def test_ep_run_every_plan_at_ep2(fine_trace, tmp_path):
    from routecast.runtime.ep.run import run_plans
    from routecast.sim.a2a import LINK_DIR

    res = run_plans(model="builtin-fine", trace_dir=fine_trace, out=tmp_path / "ep", nproc=2,
                    plans=["static", "eplb", "moe-gps", "probe"], steps=3, repeats=2,
                    link=LINK_DIR / "gloo-cpu-ep2.toml", quiet=True)
    for name, s in res["plans"].items():
        assert s["outputs"]["allclose"] and s["outputs"]["cells"] == 15, name
        assert s["bytes"]["equal"] and s["bytes"]["checked"] == 2 * 15 * 2, name
        assert s["a2a_pred_s"] > 0 and s["a2a_s"] > 0
    assert res["plans"]["probe"]["weight_bytes_moved"] > 0
    assert res["plans"]["static"]["weight_bytes_moved"] == 0
    # each rank holds only its slots' experts: half of the 5 x 64 experts under static EP
    assert res["plans"]["static"]["held_bytes_per_rank"] == [5 * 32 * 98304] * 2


def _fault_run(fine_trace, tmp_path, mode: str, timeout_s: float):
    from routecast.runtime.ep.launch import prepare, select_steps, spawn_direct
    from routecast.trace.io import read_trace

    tr = read_trace(fine_trace)
    out = tmp_path / mode
    cfg, _, _ = prepare(tr, model="builtin-fine", trace_dir=fine_trace, out=out, method="static", nproc=2,
                        steps=select_steps(tr, 0, 4), save_outputs=False, timeout_s=timeout_s,
                        kill={"rank": 1, "step": 2, "mode": mode})
    procs = spawn_direct(2, cfg)
    err = procs[0].communicate(timeout=180)[1]
    done = time.time()
    fault_at = float((out / "fault-rank1").read_text())
    if procs[1].poll() is None:
        procs[1].kill()
    procs[1].communicate()
    return procs[0].returncode, err, done - fault_at


def test_killed_rank_makes_the_other_exit_with_one_sentence(fine_trace, tmp_path):
    rc, err, after = _fault_run(fine_trace, tmp_path, "kill", 20.0)
    assert rc == 3 and after < 30
    line = [ln for ln in err.splitlines() if ln.startswith("routecast ep: rank 0:")]
    assert len(line) == 1 and "a peer rank has exited or timed out" in line[0] and "Traceback" not in err


def test_hung_rank_times_out_instead_of_hanging(fine_trace, tmp_path):
    rc, err, after = _fault_run(fine_trace, tmp_path, "hang", 5.0)
    assert rc == 3 and after < 30 and "Traceback" not in err


def test_torchrun_reports_a_dead_rank(fine_trace, tmp_path):
    from routecast.runtime.ep.launch import launch, prepare, select_steps
    from routecast.trace.io import read_trace

    tr = read_trace(fine_trace)
    cfg, _, _ = prepare(tr, model="builtin-fine", trace_dir=fine_trace, out=tmp_path / "tr", method="static", nproc=2,
                        steps=select_steps(tr, 0, 3), save_outputs=False, kill={"rank": 1, "step": 1})
    t0 = time.time()
    with pytest.raises(ConfigError, match="ep run rank 1 of 2 failed: it was killed by SIGKILL"):
        launch(cfg, 2)
    assert time.time() - t0 < 120


def test_whole_model_forward_at_ep2(fine_trace, tmp_path):
    from routecast.runtime.ep.forward import run_forward

    r = run_forward(model="builtin-fine", trace_dir=fine_trace, out=tmp_path / "fwd", nproc=2, method="eplb",
                    requests=4, tokens=12)
    assert r["allclose"] and r["bytes_equal"] and r["cells_checked"] == 2 * 5
    assert max(r["held_bytes_per_rank"]) < 64 * 5 * 98304


def test_ep_run_with_a_shuffle_plan_at_ep2(fine_trace, tmp_path):
    """`ep run --shuffle-plan` end to end: the plan's experts and token shuffle on torchrun ranks, outputs
    allclose, bytes == sim == schedule cocluster's own prediction, fewer bytes than static EP."""
    from routecast.runtime.ep.run import run_plans
    from routecast.schedule.cocluster import cocluster
    from routecast.trace.io import read_trace

    plan = tmp_path / "plan.json"
    plan.write_text(cocluster(read_trace(fine_trace), 2, "smoe").to_json())
    res = run_plans(model="builtin-fine", trace_dir=fine_trace, out=tmp_path / "ep", nproc=2, plans=["static"],
                    shuffle_plan=str(plan), steps=3, repeats=1, quiet=True)
    s, base = res["plans"]["shuffle"], res["plans"]["static"]
    assert s["outputs"]["allclose"] and s["outputs"]["cells"] == 15 and s["bytes"]["equal"]
    assert s["schedule_predicted"]["a2a_sent_bytes"] == s["bytes"]["measured_sent_bytes"]
    assert abs(s["schedule_predicted"]["lar"] - s["bytes"]["lar"]) < 1e-12
    assert s["bytes"]["lar"] > base["bytes"]["lar"] and s["a2a_bytes"] < base["a2a_bytes"]
