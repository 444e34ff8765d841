"""scripts/run_benchmarks.py (`make bench`): finds every benchmark script, refuses an unknown name."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _runner():
    spec = importlib.util.spec_from_file_location("run_benchmarks", ROOT / "scripts" / "run_benchmarks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_discovers_scripts_not_helper_modules():
    names = _runner().discover()
    assert {"smoe", "serve_sim", "planner_speed", "bad_input_sweep"} <= set(names)
    assert "bad_input_fixtures" not in names and "bad_input_rows_recent" not in names
    assert names == sorted(names)


def test_unknown_benchmark_refused(capsys):
    assert _runner().main(["--only", "no_such_benchmark"]) == 2
    assert "'no_such_benchmark' is not a benchmark" in capsys.readouterr().err
