"""Entry points: evaluate / format_table / fit_and_save and the CLI handlers on an on-disk trace."""

import json
import math

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.predict.evaluate import (
    evaluate,
    fit_and_save,
    format_table,
    parse_names,
    predict_eval_main,
    predict_fit_main,
    rows_to_json,
)
from routecast.predict.metrics import METRICS


@pytest.fixture(scope="module")
def trace(routed_trace):
    return routed_trace(by="token", num_requests=20, prompt_len=6, decode_len=3)


def test_evaluate_rows_hold_every_metric_per_layer_and_cost(trace):
    rows = evaluate(trace, "distribution,probability,conditional-token,conditional-position,ffn", progress=False,
                    epochs=2)
    assert [r["predictor"] for r in rows] == ["distribution", "probability", "conditional-token",
                                              "conditional-position", "ffn"]
    by = {r["predictor"]: r for r in rows}
    assert by["conditional-token"]["top_k_accuracy"] == 1.0 and by["probability"]["top_k_accuracy"] < 0.6
    assert by["distribution"]["forecast"] == "distribution" and by["ffn"]["forecast"] == "token"
    assert by["ffn"]["embedding"] == "learned"  # the synthetic trace names no model
    for r in rows:
        for m in METRICS:
            assert len(r["per_layer"][m]) == trace.spec.num_layers
            assert math.isnan(r[m]) or 0.0 <= r[m] <= 1.0, (r["predictor"], m)
        assert r["us_per_token"] > 0 and r["us_per_batch"] >= r["us_per_token"]
        assert 0 < r["test_tokens"] < trace.num_tokens and r["test_steps"] > 0
    table = format_table(rows)
    assert table.splitlines()[0].startswith("predictor") and "conditional-position" in table
    assert len(table.splitlines()) == 2 + len(rows)


def test_json_is_strict_and_nan_becomes_null():
    rows = [{"predictor": "x", "a": math.nan, "per_layer": {"a": [1.0, math.nan]}}]

    def no_nan(c):
        raise AssertionError(c)

    doc = json.loads(rows_to_json(rows), parse_constant=no_nan)
    assert doc == [{"predictor": "x", "a": None, "per_layer": {"a": [1.0, None]}}]
    assert "n/a" in format_table([{"predictor": "x", "top_k_accuracy": math.nan}])


def test_bad_arguments_are_one_sentence_errors(trace, routed_trace):
    with pytest.raises(ConfigError, match="'lstm2' is neither"):
        parse_names("probability,lstm2")
    with pytest.raises(ConfigError, match="expected a comma-separated"):
        parse_names(" , ")
    with pytest.raises(ConfigError, match="strictly between"):
        evaluate(trace, "probability", train_fraction=1.0, progress=False)
    with pytest.raises(ConfigError, match="1 request"):
        evaluate(routed_trace(num_requests=1), "probability", progress=False)
    with pytest.raises(ConfigError, match="--predictor is 'bogus'"):
        fit_and_save(trace, "bogus", "/nonexistent")


def test_fit_and_save_then_evaluate_the_saved_predictor(trace, tmp_path):
    d = fit_and_save(trace, "conditional-token", tmp_path / "ct", progress=False)
    (row,) = evaluate(trace, [str(d)], progress=False)
    assert row["predictor"] == "conditional-token (ct)" and row["fitted"].startswith("loaded from")
    assert row["top_k_accuracy"] == 1.0


def test_cli_handlers_on_a_trace_directory(trace, tmp_path, capsys):
    from routecast.trace.io import write_trace

    path = write_trace(trace, tmp_path / "trace")
    assert predict_fit_main(path, "probability", tmp_path / "prob", quiet=True) == 0
    assert "wrote" in capsys.readouterr().out
    assert predict_eval_main(path, f"distribution,{tmp_path / 'prob'}", as_json=True, quiet=True) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["predictor"] for r in rows] == ["distribution", "probability (prob)"]
    assert np.isclose(rows[1]["top_k_accuracy"], np.mean(rows[1]["per_layer"]["top_k_accuracy"]))
