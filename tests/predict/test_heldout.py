"""Held-out evaluation: no predictor is ever scored on a request, or a document, it was fitted on."""

import json

import numpy as np
import pytest

import routecast.predict.evaluate as ev
from routecast.common.errors import ConfigError
from routecast.predict.frequency import ProbabilityPredictor
from routecast.trace import Trace


def _with_documents(trace: Trace, per_doc: int) -> Trace:
    """The same trace with requests grouped into documents of per_doc consecutive requests."""
    tokens = dict(trace.tokens, document=trace.tokens["request"] // per_doc)
    return Trace(spec=trace.spec, tokens=tokens, experts_TLK=trace.experts_TLK, weights_TLK=trace.weights_TLK,
                 task_names=trace.task_names, provenance=trace.provenance)


@pytest.fixture(scope="module")
def doc_trace(routed_trace):
    return _with_documents(routed_trace(by="token", num_requests=40, prompt_len=6, decode_len=3), per_doc=4)


class _Spy(ProbabilityPredictor):
    """Records the requests it was fitted on and the requests it was asked to predict."""

    seen: dict[str, set] = {}

    def fit(self, trace):
        _Spy.seen["fit"] = set(trace.tokens["request"].tolist())
        return super().fit(trace)

    def fit_rows(self, trace, rows):  # evaluate() streams the training rows through fit_rows
        _Spy.seen["fit"] = set(trace.tokens["request"][rows].tolist())
        return super().fit_rows(trace, rows)

    def predict(self, view):
        _Spy.seen.setdefault("scored", set()).update(view.request.tolist())
        return super().predict(view)


@pytest.mark.parametrize("split", ["document", "request"])
def test_no_predictor_is_fitted_on_a_request_it_is_scored_on(doc_trace, monkeypatch, split):
    _Spy.seen = {}
    monkeypatch.setattr(ev, "make_predictor", lambda name, spec, **kw: _Spy(spec))
    (row,) = ev.evaluate(doc_trace, "probability", progress=False, split=split)
    fit, scored = _Spy.seen["fit"], _Spy.seen["scored"]
    assert fit and scored and row["split"] == split
    assert not fit & scored, f"fitted on {len(fit & scored)} of the {len(scored)} scored requests"
    assert len(fit | scored) == len(np.unique(doc_trace.request))  # and together they cover the trace
    if split == "document":
        doc_of = dict(zip(doc_trace.request.tolist(), doc_trace.document.tolist(), strict=True))
        shared = {doc_of[r] for r in fit} & {doc_of[r] for r in scored}
        assert not shared, f"train and test share documents {sorted(shared)}"


def test_document_split_is_the_default_and_falls_back_with_a_note(doc_trace, routed_trace, capsys):
    (row,) = ev.evaluate(doc_trace, "probability", progress=False)
    assert row["split"] == "document" and "of documents" in row["fitted"]
    assert capsys.readouterr().err == ""
    (row,) = ev.evaluate(routed_trace(num_requests=10), "probability", progress=False)  # no documents recorded
    assert row["split"] == "request" and "splitting by request" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--split is 'none'"):
        ev.evaluate(doc_trace, "probability", progress=False, split="none")


def test_a_saved_predictor_is_fitted_on_the_training_part_and_refused_on_its_own_requests(doc_trace, tmp_path):
    d = ev.fit_and_save(doc_trace, "conditional-token", tmp_path / "ct", progress=False)
    rec = json.loads((d / "predictor.json").read_text())["fitted_on"]
    assert rec["split"] == "document" and rec["trace"] == ev.trace_fingerprint(doc_trace)
    (row,) = ev.evaluate(doc_trace, [str(d)], progress=False)  # same split: scored on held-out documents only
    assert row["fitted"].startswith("loaded from")
    with pytest.raises(ConfigError, match="some of the requests scored here trained it"):
        ev.evaluate(doc_trace, [str(d)], progress=False, split="request")
    whole = ev.fit_and_save(doc_trace, "conditional-token", tmp_path / "all", progress=False, split="none")
    with pytest.raises(ConfigError, match="split none"):
        ev.evaluate(doc_trace, [str(whole)], progress=False)


def test_score_all_scores_a_predictor_from_another_trace_on_every_row(routed_trace, tmp_path, capsys):
    """`predict eval --score-all`: a predictor saved from trace A (predict fit --out) scored on all of trace B;
    a name (it would be fitted on B), a folder fitted on B and --train-extra are refused with one sentence."""
    from routecast.cli import main
    from routecast.predict import load_predictor, run_harness
    from routecast.predict.metrics import METRICS
    from routecast.trace.io import write_trace

    a, b = routed_trace(num_requests=30, seed=1), routed_trace(num_requests=20, seed=2)
    write_trace(a, tmp_path / "a")
    write_trace(b, tmp_path / "b")
    fit = ["predict", "fit", "--predictor", "conditional-token", "--split", "none", "--quiet", "--out"]
    assert main([*fit[:2], str(tmp_path / "a"), *fit[2:], str(tmp_path / "pa")]) == 0
    assert main([*fit[:2], str(tmp_path / "b"), *fit[2:], str(tmp_path / "pb")]) == 0
    capsys.readouterr()
    assert main(["predict", "eval", str(tmp_path / "b"), "--predictors", str(tmp_path / "pa"), "--score-all",
                 "--json", "--quiet"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["test_tokens"] == b.num_tokens and row["split"] == "all"  # every row, not the held-out 20%
    ref = run_harness(load_predictor(tmp_path / "pa"), b)
    for m in METRICS:
        assert row[m] == pytest.approx(ev._nanmean(ref.metrics[m]), nan_ok=True), m
    assert main(["predict", "eval", str(tmp_path / "b"), "--predictors", str(tmp_path / "pa"), "--quiet"]) == 0
    assert "held-out split" in capsys.readouterr().out  # without the flag: the held-out part, as before
    for bad, why in ((["--predictors", "conditional-token"], "a name would be fitted"),
                     (["--predictors", str(tmp_path / "pb")], "was fitted on this trace"),
                     (["--predictors", str(tmp_path / "pa"), "--train-extra", str(tmp_path / "a")], "--train-extra")):
        assert main(["predict", "eval", str(tmp_path / "b"), "--score-all", "--quiet", *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err
