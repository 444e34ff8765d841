"""eMoE on a real model (runtime/emoe/): the sensitivity profile, perplexity under fallback, `routecast emoe`."""

from __future__ import annotations

import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def builtin():
    from routecast.models.builtin import load_builtin

    return load_builtin("builtin")


def test_profile_and_quality_on_the_builtin_model(builtin):
    from routecast.predict.emoe import EmoeConfig
    from routecast.runtime.emoe.profile import TextConfig, format_profile, profile_sensitivity, text_windows
    from routecast.runtime.emoe.quality import QualityConfig, format_quality, run_quality

    model, tok = builtin
    small = TextConfig(split="val", per_task=2, seq_len=16)
    tasks, w, task_of, docs = text_windows(tok, small)
    assert len(tasks) == 5 and w.shape == (10, 17) and np.bincount(task_of).tolist() == [2] * 5
    prof = profile_sensitivity(model, tasks, w, task_of, progress=False)
    assert np.allclose(prof.agree_NJ[:, 0], 1.0)  # nothing randomised: the model agrees with itself
    assert (prof.ppl_NJ[:, -1] > prof.ppl_NJ[:, 0]).all()  # random routing everywhere hurts
    assert "sensitive" in format_profile(prof)
    cfg = QualityConfig(budgets=(0.5, 1.0), reuse_periods=(3,), eval_text=small,
                        warmup_text=TextConfig(split="test", per_task=2, seq_len=16),
                        predictor=EmoeConfig(epochs=5, d_model=16, heads=2, layers=1))
    res = run_quality(model, tok, cfg, progress=False, profile=prof)
    rows = {(r["choice"], r["budget"], r["period"]): r for r in res["rows"]}
    for c in ("emoe", "random", "lru", "oracle"):
        full = rows[(c, 1.0, 1)]
        assert full["fallback_share"] == 0.0 and full["ppl"] == pytest.approx(res["full"]["ppl"], rel=1e-5)
        half = rows[(c, 0.5, 1)]
        assert half["resident_share"] == 0.5 and half["fallback_share"] > 0
        assert (c, 0.5, 3) in rows
    assert rows[("oracle", 0.5, 1)]["fallback_share"] < rows[("random", 0.5, 1)]["fallback_share"]
    assert "full" in format_quality(res)
    json.dumps(res)


@pytest.mark.parametrize("args", [["quality", "--budget", "0"], ["quality", "--budget", "101%"],
                                  ["quality", "--model", "builtin", "--budget", "10%"],
                                  ["quality", "--model", "no-such-model"], ["quality", "--residency", "mru"],
                                  ["profile", "--threshold", "1.5"], ["quality", "--reuse", "0"]])
def test_cli_bad_input_is_one_sentence_and_exit_2(args, capsys, tmp_path):
    from routecast.cli import main

    assert main(["emoe", *args, "--out", str(tmp_path / "x.json")]) == 2
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if "Loading weights" not in ln]
    assert len(err) == 1 and err[0].startswith("routecast emoe: error:")  # one sentence (after HF's load bar)
    assert not (tmp_path / "x.json").exists()


def test_cli_profile_writes_json(tmp_path, capsys):
    from routecast.cli import main

    out = tmp_path / "p.json"
    assert main(["emoe", "profile", "--model", "builtin", "--per-task", "1", "--seq-len", "8", "--quiet",
                 "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["tasks"] == ["austen", "bible", "code", "docs", "wiki"] and len(got["agreement"][0]) == 5
    assert "sensitive MoE layers" in capsys.readouterr().out
