"""Save and load predictors as a directory: predictor.json (class, spec, config) + predictor.safetensors.

No pickle: a predictor exposes ``state() -> (meta, tensors)`` (JSON-able dict, named numpy arrays) and
``from_state(spec, meta, tensors)``. Files are written to temporary names and renamed into place,
the JSON last, so a directory with a predictor.json always holds a complete predictor.
Classes are found by the name saved in predictor.json: ``CLASSES`` maps the package's own to "module:Class"
(imported on use); predictor classes outside this package register themselves with ``register``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from routecast.common.errors import ConfigError, TraceError
from routecast.common.outputs import os_error, write_atomic
from routecast.predict.harness import Predictor
from routecast.trace import MoESpec

FORMAT = "routecast-predictor"
VERSION = 1
META_FILE, TENSOR_FILE = "predictor.json", "predictor.safetensors"

# Class name (as saved in predictor.json) -> "module:Class", imported on first use: the store never imports a
# predictor module up front, and no predictor module imports the store (so the two cannot form an import circle).
CLASSES: dict[str, str] = {
    "DistributionPredictor": "routecast.predict.frequency:DistributionPredictor",
    "ProbabilityPredictor": "routecast.predict.frequency:ProbabilityPredictor",
    "ConditionalPredictor": "routecast.predict.frequency:ConditionalPredictor",
    "NeuralPredictor": "routecast.predict.neural:NeuralPredictor",
    "TLPPredictor": "routecast.predict.locality:TLPPredictor",
    "SLPPredictor": "routecast.predict.locality:SLPPredictor",
    "LookaheadPredictor": "routecast.predict.lookahead:LookaheadPredictor",
    "ExpertFlowPredictor": "routecast.predict.expertflow:ExpertFlowPredictor",
    "SMoEPredictor": "routecast.predict.smoe:SMoEPredictor",
    "EmoePredictor": "routecast.predict.emoe:EmoePredictor",
    "EmoeLayerPredictor": "routecast.predict.emoe:EmoeLayerPredictor",
}
_REGISTERED: dict[str, type[Predictor]] = {}


def register(cls: type[Predictor]) -> type[Predictor]:
    """Make a Predictor subclass defined outside routecast.predict loadable by load_predictor (usable as a class
    decorator); the package's own classes are listed in CLASSES instead."""
    _REGISTERED[cls.__name__] = cls
    return cls


def predictor_class(name: str) -> type[Predictor] | None:
    """The Predictor class saved under `name` (CLASSES, imported now, or registered), None when unknown."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    target = CLASSES.get(name)
    if target is None:
        return None
    import importlib

    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def save_predictor(pred: Predictor, out_dir: str | Path, *, fitted_on: dict | None = None) -> Path:
    """Write pred to out_dir (created if missing; an earlier predictor there is replaced). Returns out_dir.

    fitted_on: what it was fitted on ({trace fingerprint, split, train_fraction, seed}), kept in predictor.json
    so an evaluation on the same trace can refuse to score it on its own training requests.
    """
    from safetensors.numpy import save

    meta, tensors = pred.state()
    d = Path(out_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise os_error(e, "--out", d) from None
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "class": type(pred).__name__,
        "name": pred.name,
        "horizon": pred.horizon,
        "spec": pred.spec.to_dict(),
        "meta": meta,
    }
    if fitted_on is not None:
        doc["fitted_on"] = dict(fitted_on)
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    write_atomic(d / TENSOR_FILE, save(arrays, metadata={"format": FORMAT}), "--out")
    write_atomic(d / META_FILE, (json.dumps(doc, indent=1) + "\n").encode(), "--out")
    return d


def is_predictor_dir(path: str | Path) -> bool:
    """True when path is a directory holding a saved predictor."""
    return (Path(path) / META_FILE).is_file()


def fitted_on(path: str | Path) -> dict | None:
    """The 'fitted_on' record of a saved predictor (None when it has none); load_predictor checks the rest."""
    try:
        v = json.loads((Path(path) / META_FILE).read_text()).get("fitted_on")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    return v if isinstance(v, dict) else None


def load_predictor(path: str | Path) -> Predictor:
    """Read a predictor saved by save_predictor; errors name the file and what was expected."""
    from safetensors.numpy import load_file

    d = Path(path)
    meta_path, tensor_path = d / META_FILE, d / TENSOR_FILE
    if not meta_path.is_file():
        raise ConfigError(f"{meta_path} does not exist; expected a predictor directory written by save_predictor.")
    try:
        doc = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{meta_path} is not readable JSON ({e}); expected a predictor description.") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{meta_path} has format {doc.get('format') if isinstance(doc, dict) else doc!r}; expected {FORMAT!r}.")
    if doc.get("version") != VERSION:
        raise ConfigError(f"{meta_path} has version {doc.get('version')!r}; expected {VERSION}.")
    cls = predictor_class(str(doc.get("class")))
    if cls is None:
        known = sorted({*CLASSES, *_REGISTERED})
        raise ConfigError(f"{meta_path} names predictor class {doc.get('class')!r}; expected one of {known}.")
    try:
        spec = MoESpec.from_dict(doc.get("spec"), where=str(meta_path))
    except TraceError as e:
        raise ConfigError(str(e)) from None
    if not tensor_path.is_file():
        raise ConfigError(f"{tensor_path} does not exist; expected the predictor's tensors next to {META_FILE}.")
    try:
        tensors = load_file(str(tensor_path))
    except Exception as e:  # safetensors raises its own error types for a corrupt header
        raise ConfigError(f"{tensor_path} could not be read as safetensors ({e}); expected predictor tensors.") from None
    meta = doc.get("meta") or {}
    if not isinstance(meta, dict):
        raise ConfigError(f"{meta_path} field 'meta' is {type(meta).__name__}; expected a JSON object.")
    check_state(tensors, cls.state_schema(spec, meta), f"{tensor_path}", f"a {cls.__name__} of {_geometry(spec)}")
    try:
        return cls.from_state(spec, meta, tensors)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        # torch's load_state_dict lists every mismatch on its own line: keep the first one
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = next((ln for ln in lines if ln.startswith(("size mismatch", "Missing key", "Unexpected key"))),
                   lines[0] if lines else "")
        raise ConfigError(
            f"{d}: saved {doc.get('class')} state cannot be loaded ({type(e).__name__}: {why.rstrip('.')}); "
            "expected the state save_predictor wrote with this version of routecast."
        ) from None


def _geometry(spec: MoESpec) -> str:
    return f"L={spec.num_layers}, E={spec.num_experts}, K={spec.top_k}"


def check_state(tensors: dict[str, np.ndarray], schema: dict[str, tuple], where: str, what: str) -> None:
    """Check loaded tensors against a Predictor.state_schema (see harness.Predictor); raise ConfigError.

    Every float tensor must be finite; named tensors must have their shape (names in a shape bind once),
    dtype kind, strictly increasing values ("sorted") and no negative entry ("nonneg")."""
    bound: dict[str, int] = {}
    for name, (shape, kinds, rules) in schema.items():
        if name not in tensors:
            if "optional" in rules:
                continue
            raise ConfigError(f"{where}: tensor '{name}' is missing; expected it in {what}.")
        t = tensors[name]
        want = tuple(bound.get(x, x) if isinstance(x, str) else x for x in shape)
        ok = t.ndim == len(shape) and all(isinstance(w, str) or w == n for w, n in zip(want, t.shape, strict=True))
        if not ok:
            shown = "(" + ", ".join(str(w) for w in want) + (",)" if len(want) == 1 else ")")
            raise ConfigError(f"{where}: tensor '{name}' has shape {tuple(t.shape)}; expected {shown} for {what}.")
        bound.update({x: n for x, n in zip(shape, t.shape, strict=True) if isinstance(x, str)})
        if t.dtype.kind not in kinds:
            raise ConfigError(f"{where}: tensor '{name}' has dtype {t.dtype}; expected "
                              f"{'a float' if kinds == 'f' else 'an integer'} dtype.")
        if "sorted" in rules and t.size > 1 and not (t[1:] > t[:-1]).all():
            i = int(np.flatnonzero(t[1:] <= t[:-1])[0])
            raise ConfigError(f"{where}: tensor '{name}' holds {t[i]} before {t[i + 1]} (entry {i + 1}); expected "
                              "strictly increasing lookup keys.")
        if "nonneg" in rules and t.size and t.min() < 0:
            raise ConfigError(f"{where}: tensor '{name}' holds {t.min()}; expected no negative entry.")
    for name, t in tensors.items():
        if t.dtype.kind == "f" and t.size and not np.isfinite(t).all():
            raise ConfigError(f"{where}: tensor '{name}' holds NaN or inf; expected finite values.")
