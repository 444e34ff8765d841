"""save_predictor / load_predictor: safetensors + JSON, identical forecasts after a round trip."""

import json

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.predict.frequency import (
    ConditionalPredictor,
    DistributionPredictor,
    ProbabilityPredictor,
    by_position_preset,
    by_token_preset,
    ema_preset,
)
from routecast.predict.harness import run_harness
from routecast.predict.neural import NeuralPredictor, ffn_preset, lstm_preset
from routecast.predict.store import META_FILE, TENSOR_FILE, load_predictor, save_predictor


def _forecasts(pred, trace):
    out = []
    for _, fc in run_harness(pred, trace, collect=True).forecasts:
        out.append(fc.scores_TLE if fc.token_level else fc.dist_LE)
    return out


def test_round_trip_gives_identical_forecasts_for_every_predictor(routed_trace, tmp_path):
    tr = routed_trace(by="token", num_requests=16, prompt_len=6, decode_len=3)
    train, test = tr.split("request", (0.75, 0.25), seed=0)
    emb = np.random.default_rng(1).standard_normal((30, 8)).astype(np.float32)
    preds = [
        DistributionPredictor(tr.spec),
        DistributionPredictor(tr.spec, ema_preset(0.5)),
        ProbabilityPredictor(tr.spec),
        ConditionalPredictor(tr.spec, by_token_preset()),
        ConditionalPredictor(tr.spec, by_position_preset()),
        NeuralPredictor(tr.spec, ffn_preset(embedding="learned", epochs=2, progress=False)),
        NeuralPredictor(tr.spec, ffn_preset(epochs=2, progress=False), embeddings=emb, embedding_source="fake"),
        NeuralPredictor(tr.spec, lstm_preset(embedding="learned", epochs=1, window=4, progress=False)),
    ]
    for i, pred in enumerate(preds):
        pred.fit(train)
        before = _forecasts(pred, test)
        d = save_predictor(pred, tmp_path / f"p{i}")
        assert sorted(p.name for p in d.iterdir()) == [META_FILE, TENSOR_FILE]
        loaded = load_predictor(d)
        assert type(loaded) is type(pred) and loaded.name == pred.name and loaded.spec == pred.spec
        after = _forecasts(loaded, test)
        assert len(after) == len(before)
        for a, b in zip(before, after, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b), pred.name
    assert json.loads((tmp_path / "p6" / META_FILE).read_text())["meta"]["embedding_source"] == "fake"


def test_load_errors_name_the_file(routed_trace, tmp_path):
    with pytest.raises(ConfigError, match="predictor.json does not exist"):
        load_predictor(tmp_path)
    tr = routed_trace(num_requests=4)
    d = save_predictor(ProbabilityPredictor(tr.spec).fit(tr), tmp_path / "p")
    doc = json.loads((d / META_FILE).read_text())
    for key, value, msg in (("version", 99, "version 99"), ("class", "Pickled", "class 'Pickled'"),
                            ("format", "x", "format 'x'")):
        bad = dict(doc, **{key: value})
        (d / META_FILE).write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=msg):
            load_predictor(d)
    (d / META_FILE).write_text(json.dumps(doc))
    (d / TENSOR_FILE).write_bytes(b"not safetensors")
    with pytest.raises(ConfigError, match="could not be read as safetensors"):
        load_predictor(d)
