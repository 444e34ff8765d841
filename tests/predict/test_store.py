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


# ------------------------------------------------------------------ damaged predictors, through the CLI
def _damage(d, name, how):
    from safetensors.numpy import load_file, save_file

    t = load_file(str(d / TENSOR_FILE))
    a = t[name]
    t[name] = {"drop row": lambda: a[:-1].copy(), "transpose": lambda: np.ascontiguousarray(a.T),
               "reverse": lambda: a[::-1].copy(), "nan": lambda: np.where(np.arange(a.size).reshape(a.shape) == 0,
                                                                           np.nan, a).astype(a.dtype),
               "negative": lambda: a - 1.0, "int": lambda: a.astype(np.int32)}[how]()
    save_file(t, str(d / TENSOR_FILE), metadata={"format": "routecast-predictor"})


def _error_line(err: str) -> str:
    """The one error sentence on stderr (a trace without documents adds a 'note:' line before it)."""
    lines = [ln for ln in err.splitlines() if not ln.startswith("note: ")]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("routecast predict: error: "), err
    return lines[0]


# predictor, tensor, damage, what the one sentence says
DAMAGED = [
    ("distribution", "fit_LE", "transpose", "tensor 'fit_LE' has shape (8, 3); expected (3, 8)"),
    ("probability", "p_LE", "drop row", "tensor 'p_LE' has shape (2, 8); expected (3, 8)"),
    ("probability", "p_LE", "nan", "tensor 'p_LE' holds NaN or inf"),
    ("probability", "p_LE", "negative", "tensor 'p_LE' holds -"),
    ("conditional-token", "keys_U", "reverse", "tensor 'keys_U' holds 29 before 28 (entry 1); expected strictly "
     "increasing lookup keys"),
    ("conditional-token", "probs_ULE", "drop row", "tensor 'probs_ULE' has shape (29, 3, 8); expected (30, 3, 8)"),
    ("conditional-token", "global_LE", "transpose", "tensor 'global_LE' has shape (8, 3); expected (3, 8)"),
    ("conditional-token", "probs_ULE", "int", "tensor 'probs_ULE' has dtype int32; expected a float dtype"),
    ("ffn", "vocab_ids", "reverse", "tensor 'vocab_ids' holds 29 before 28"),
    ("ffn", "vocab_ids", "drop row", "tensor 'vocab_ids' has shape (29,); expected (30,)"),
    ("ffn", "net.mid.weight", "transpose", "size mismatch for mid.weight"),
]


@pytest.mark.parametrize("pred,tensor,how,pattern", DAMAGED, ids=[f"{p}-{t}-{h}" for p, t, h, _ in DAMAGED])
def test_damaged_predictor_is_refused_on_load_with_one_sentence(routed_trace, tmp_path, capsys, pred, tensor, how,
                                                                  pattern):
    from routecast.cli import main
    from routecast.trace.io import write_trace

    tr = write_trace(routed_trace(num_requests=12), tmp_path / "t")
    d = tmp_path / "p"
    assert main(["predict", "fit", str(tr), "--predictor", pred, "--out", str(d), "--quiet", "--epochs", "1"]) == 0
    capsys.readouterr()
    _damage(d, tensor, how)
    assert main(["predict", "eval", str(tr), "--predictors", str(d), "--quiet"]) == 2
    err = _error_line(capsys.readouterr().err)
    assert pattern in err and str(d) in err, err


def test_predictor_for_another_geometry_is_refused(routed_trace, tmp_path, capsys):
    from routecast.cli import main
    from routecast.trace.io import write_trace

    wide = routed_trace(num_experts=16)
    d = save_predictor(ProbabilityPredictor(wide.spec).fit(wide), tmp_path / "p")
    tr = write_trace(routed_trace(num_requests=12), tmp_path / "t")
    assert main(["predict", "eval", str(tr), "--predictors", str(d), "--quiet"]) == 2
    err = _error_line(capsys.readouterr().err)
    assert "predictor was fitted for L=3, E=16, K=2; expected the trace's L=3, E=8, K=2" in err


def test_store_class_table_names_every_predictor_of_the_package():
    """CLASSES (name -> "module:Class", resolved on load) must list each Predictor subclass of routecast.predict,
    under its own name, and nothing else: a new or renamed predictor that is missing here could be saved but not
    loaded."""
    import importlib
    import inspect
    import pkgutil

    import routecast.predict as pkg
    from routecast.predict.harness import Predictor
    from routecast.predict.store import CLASSES, predictor_class

    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"routecast.predict.{info.name}")
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, Predictor) and obj is not Predictor \
                    and obj.__module__ == mod.__name__ and not name.startswith("_"):
                found[name] = f"{obj.__module__}:{name}"
    assert found == CLASSES
    for name in CLASSES:
        assert predictor_class(name).__name__ == name
    assert predictor_class("NoSuchPredictor") is None
