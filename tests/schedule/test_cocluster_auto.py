"""`schedule cocluster --method auto` picks the partitioner on a validation part of the training documents;
`--score PLAN` scores a saved plan on every token of another trace."""

import json

import numpy as np

from routecast.schedule.ceo import CEOConfig
from routecast.schedule.cocluster import read_plan
from routecast.schedule.cocluster_auto import AUTO_METHODS, pick_method, validation_rows
from tests.schedule.test_cocluster import planted


def test_validation_rows_split_training_rows_by_request():
    tr = planted(T=320)
    train = tr.tokens["request"] < 12
    fit, val, by = validation_rows(tr, train, seed=0)
    assert by == "request" and not (fit & val).any() and ((fit | val) == train).all()
    assert not np.isin(tr.tokens["request"][fit], tr.tokens["request"][val]).any()


def test_pick_method_scores_all_four_and_names_the_best():
    tr = planted(T=480, noise=0.1)
    best, rep = pick_method(tr, 4, np.ones(tr.num_tokens, bool), config=CEOConfig(n_steps=4, samples=10),
                            max_tokens=None)
    assert set(rep["scores"]) == set(AUTO_METHODS) and best == rep["best"]
    lar = {m: s["lar"] for m, s in rep["scores"].items()}
    assert lar[best] == max(lar.values()) and rep["margin_lar"] >= 0
    assert lar[best] > 0.5  # planted communities: a good partitioner keeps most assignments local


def test_auto_is_the_default_and_score_reads_a_plan_on_another_trace(tmp_path, capsys):
    from routecast.cli import main
    from routecast.trace.io import write_trace

    write_trace(planted(T=480, seed=1), tmp_path / "a")
    write_trace(planted(T=320, seed=2), tmp_path / "b")
    out, plan = tmp_path / "cc.json", tmp_path / "plan.json"
    assert main(["schedule", "cocluster", str(tmp_path / "a"), "--ep", "4", "--out", str(out), "--plan", str(plan),
                 "--quiet", "--split", "request"]) == 0
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["settings"]["asked"] == "auto" and res["settings"]["method"] in AUTO_METHODS
    assert "auto: " + res["settings"]["method"] in text and read_plan(plan).method == res["settings"]["method"]
    score = tmp_path / "score.json"
    assert main(["schedule", "cocluster", str(tmp_path / "b"), "--score", str(plan), "--out", str(score)]) == 0
    rows = json.loads(score.read_text())["rows"]
    assert [r["method"] for r in rows] == ["none", res["settings"]["method"]]
    assert rows[1]["scored"]["lar"] > rows[0]["scored"]["lar"] and rows[0]["scored"]["tokens"] == 320
    assert "LAR" in capsys.readouterr().out
    # a plan of another geometry, and a file that is no plan: one sentence, exit 2
    write_trace(planted(T=160, E=8), tmp_path / "c")
    for target, p in ((tmp_path / "c", plan), (tmp_path / "b", score)):
        assert main(["schedule", "cocluster", str(target), "--score", str(p), "--out", str(tmp_path / "x.json")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--score" in err
