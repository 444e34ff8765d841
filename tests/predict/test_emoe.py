"""eMoE predictors: task extraction, eMoE-A / eMoE-L over expert sequences, periodic invocation, no leak."""

from __future__ import annotations

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.predict.emoe import EmoeConfig, EmoeLayerPredictor, EmoePredictor, TaskExtractor, dist_by_group
from routecast.predict.evaluate import PREDICTOR_NAMES, evaluate
from routecast.predict.harness import check_no_leak, run_harness
from routecast.trace import MoESpec, Trace, make_columns
from tests.conftest import server_schedule

FAST = EmoeConfig(epochs=60, d_model=16, heads=2, layers=1)


def task_trace(R: int = 30, P: int = 6, D: int = 3, L: int = 3, E: int = 8, K: int = 2, seed: int = 0) -> Trace:
    """Two tasks; task n's tokens come from its own vocabulary half and route to experts {4n..4n+3} mostly."""
    rng = np.random.default_rng(seed)
    req, pos, phase, step = server_schedule(R, P, D)
    task = req % 2
    T = req.size
    tid = task * 20 + rng.integers(0, 20, T)
    pool = task[:, None, None] * 4 + np.argsort(rng.random((T, L, 4)), -1)[..., :K]
    noise = rng.random((T, L, 1)) < 0.1  # a tenth of the tokens route anywhere
    anyw = np.argsort(rng.random((T, L, E)), -1)[..., :K]
    experts = np.where(noise, anyw, pool).astype(np.int16)
    w = np.full((T, L, K), 1.0 / K, np.float32)
    return Trace(spec=MoESpec(num_layers=L, num_experts=E, top_k=K, hidden_size=0),
                 tokens=make_columns(T, request=req, position=pos, token_id=tid, phase=phase, step=step, task=task,
                                     document=req // 2),
                 experts_TLK=experts, weights_TLK=w, task_names=("a", "b"), source_names=(),
                 provenance={"generator": "tests.predict.emoe"})


def test_task_extraction_worked_example():
    prompts = [np.array([1, 2, 3]), np.array([1, 2]), np.array([7, 8, 9]), np.array([8, 9, 9])]
    ex = TaskExtractor(keywords=2, min_count=1).fit(prompts, np.array([0, 0, 1, 1]), 2)
    assert ex.extract(np.array([2, 2, 5])) == 0
    assert ex.extract(np.array([9, 1, 9])) == 1  # two matches for task 1, one for task 0
    assert ex.extract(np.array([50, 60])) == ex.default  # no keyword: the most common task
    assert TaskExtractor().extract(np.array([1])) == -1  # unfitted


def test_dist_by_group_ignores_dropped_slots_and_is_uniform_when_empty():
    ids = np.array([[[0, 1]], [[1, -1]], [[-1, -1]]], np.int16)  # T=3, L=1, K=2
    d = dist_by_group(ids, np.array([0, 0, 1]), 2, 3)
    assert np.allclose(d[0, 0], [1 / 3, 2 / 3, 0])
    assert np.allclose(d[1, 0], [1 / 3] * 3)


@pytest.mark.parametrize("cls", [EmoePredictor, EmoeLayerPredictor])
@pytest.mark.parametrize("period", [1, 3])
def test_emoe_never_sees_what_its_horizon_forbids(cls, period):
    tr = task_trace()
    train = tr.select(tr.tokens["request"] < 20)
    test = tr.select(tr.tokens["request"] >= 20)
    pred = cls(tr.spec, FAST, period=period).fit(train)
    n = check_no_leak(pred, test, seed=period)
    assert n == 4 * (tr.spec.num_layers if cls is EmoeLayerPredictor else 1)


@pytest.mark.parametrize("cls", [EmoePredictor, EmoeLayerPredictor])
def test_emoe_learns_task_specific_experts(cls):
    tr = task_trace()
    train = tr.select(tr.tokens["request"] < 20)
    test = tr.select(tr.tokens["request"] >= 20)
    pred = cls(tr.spec, FAST).fit(train)
    res = run_harness(pred, test, collect=True)
    assert np.mean(res.metrics["top_k_accuracy"]) > 0.4  # 2 of its task's 4 experts: 0.5 expected, blind 0.25
    for step, fc in res.forecasts:
        task = test.tokens["task"][test.step == step]
        own = np.stack([fc.scores_TLE[i, :, 4 * t:4 * t + 4].sum(-1) for i, t in enumerate(task)])
        assert own.mean() > 0.7  # the forecast puts its mass on the prompt's task's experts


def test_forecast_is_held_between_invocations():
    tr = task_trace(R=40)
    train = tr.select(tr.tokens["request"] < 20)
    test = tr.select(tr.tokens["request"] >= 20)
    pred = EmoePredictor(tr.spec, FAST, period=40).fit(train)  # one invocation: the first held-out prompt
    fcs = run_harness(pred, test, collect=True).forecasts
    rows = {}
    for step, fc in fcs:
        ids = test.tokens["request"][test.step == step]
        for r, row in zip(ids, fc.scores_TLE, strict=True):
            rows.setdefault(int(r) % 2, []).append(row)
    for task_rows in rows.values():
        assert all(np.array_equal(task_rows[0], x) for x in task_rows)
    again = EmoePredictor(tr.spec, FAST, period=1).fit(train)
    fcs1 = run_harness(again, test, collect=True).forecasts
    assert any(not np.array_equal(a.scores_TLE[0], fcs1[0][1].scores_TLE[0]) for _, a in fcs1[1:20])


def test_emoe_is_listed_in_predict_eval_and_checks_its_arguments():
    assert {"emoe", "emoe-l"} <= set(PREDICTOR_NAMES)
    tr = task_trace()
    rows = evaluate(tr, "emoe", epochs=20, progress=False)
    assert rows[0]["predictor"] == "emoe" and 0 <= rows[0]["top_k_accuracy"] <= 1
    with pytest.raises(ConfigError, match="period"):
        EmoePredictor(tr.spec, period=0)
    with pytest.raises(ConfigError, match="not fitted"):
        run_harness(EmoePredictor(tr.spec, FAST), tr)


@pytest.mark.parametrize("cls", [EmoePredictor, EmoeLayerPredictor])
def test_saved_emoe_predicts_the_same(cls, tmp_path):
    from routecast.predict.store import load_predictor, save_predictor

    tr = task_trace()
    train = tr.select(tr.tokens["request"] < 20)
    test = tr.select(tr.tokens["request"] >= 20)
    pred = cls(tr.spec, FAST, period=2).fit(train)
    back = load_predictor(save_predictor(pred, tmp_path / "p"))
    assert type(back) is cls and back.period == 2
    a = run_harness(pred, test, collect=True).forecasts
    b = run_harness(back, test, collect=True).forecasts
    assert all(np.array_equal(x.scores_TLE, y.scores_TLE) for (_, x), (_, y) in zip(a, b, strict=True))
