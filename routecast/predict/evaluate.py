"""Entry points: build predictors by name, fit them on a held-out split, evaluate causally, tabulate.

Held out means by source document by default (Trace.split(by="document")): requests cut from one document
share text, so a request split lets a token-id table memorise the held-out prompts' own n-grams. A trace that
records no documents falls back to the request split with a printed note; `--split request` asks for it.

Names: distribution, probability, conditional-token, conditional-position, ffn, lstm, lookahead (PROBE),
expertflow (ExpertFlow's path predictor), tlp, slp (its baselines), smoe (Speculative MoE's token table +
device n-gram), emoe / emoe-l (eMoE-A / eMoE-L, invoked every prompt; predict/emoe.py); or the path of
a directory written by save_predictor / fit_and_save (loaded, not refitted). The CLI handlers
``predict_eval_main`` and ``predict_fit_main`` read the trace from disk and print.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.predict.embeddings import load_input_embeddings, resolve_model_dir
from routecast.predict.frequency import (
    ConditionalPredictor,
    DistributionPredictor,
    ProbabilityPredictor,
    by_position_preset,
    by_token_preset,
    mle_preset,
)
from routecast.predict.harness import Predictor, run_harness
from routecast.predict.metrics import METRICS
from routecast.predict.neural import NeuralPredictor, ffn_preset, lstm_preset, torch_threads
from routecast.predict.store import is_predictor_dir, load_predictor, save_predictor
from routecast.trace import MoESpec, Trace

PREDICTOR_NAMES = (
    "distribution", "probability", "conditional-token", "conditional-position", "ffn", "lstm", "lookahead",
    "expertflow", "tlp", "slp", "smoe", "emoe", "emoe-l",
)
# Predictors that read the router inputs (hidden_TLH) and router logits of a trace.
NEEDS_ROUTER_INPUTS = ("lookahead",)
NEURAL = ("ffn", "lstm")
# Predictors that use the model's input embeddings when the checkpoint is found (smoe: nearest known token).
NEEDS_EMBEDDINGS = (*NEURAL, "smoe")
SPLIT_CHOICES = ("document", "request")


def trace_fingerprint(trace: Trace) -> str:
    """A short hash of the trace's requests, documents, positions and routing: which trace a predictor saw."""
    h = hashlib.blake2b(digest_size=12)
    for a in (trace.tokens["request"], trace.tokens["document"], trace.tokens["position"]):
        h.update(np.ascontiguousarray(a).tobytes())
    for _, ch in trace.chunks():  # routing hashed chunk by chunk: the same digest, without loading the trace
        h.update(np.ascontiguousarray(ch.experts_TLK).tobytes())
    return h.hexdigest()


def heldout(trace: Trace, split: str, train_fraction: float, seed: int) -> tuple[Trace, Trace, str]:
    """(train, test, split used) by whole documents or requests, copied into memory (heldout_rows: masks)."""
    train, test, used = heldout_rows(trace, split, train_fraction, seed)
    return trace.select(train), trace.select(test), used


def heldout_rows(trace: Trace, split: str, train_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """(train rows, test rows, split used) by whole documents or requests, as bool (T,) masks (the fit and
    the scoring stream the trace; no routing is copied); prints the fallback note on stderr."""
    if split not in SPLIT_CHOICES:
        raise ConfigError(f"--split is {split!r}; expected one of {', '.join(SPLIT_CHOICES)}.")
    if not 0 < train_fraction < 1:
        raise ConfigError(f"train_fraction is {train_fraction}; expected a number strictly between 0 and 1.")
    (train, test), used, note = trace.heldout_masks(split, (train_fraction, 1 - train_fraction), seed=seed)
    if note:
        print(note, file=sys.stderr)
    if not train.any() or not test.any():
        n = len(np.unique(trace.tokens[used]))
        raise ConfigError(
            f"trace has {n} {used}(s); a {train_fraction:.2f}/{1 - train_fraction:.2f} split by {used} left one "
            f"side empty; expected more {used}s."
        )
    return train, test, used


def _document_names(trace: Trace) -> set[str]:
    names = list(trace.provenance.get("documents") or [])
    ids = np.unique(trace.tokens["document"])
    return {str(names[i]) for i in ids.tolist() if 0 <= i < len(names)}


def with_extra_training(train: Trace, extra: Trace, test: Trace) -> Trace:
    """train + extra (another capture of the same model, e.g. of the corpus's train split) as one training
    trace: extra's request ids and steps are shifted past train's so no two requests merge. Refuses an extra
    trace of another geometry or task list, or one that shares a source document with the held-out test."""
    s, x = train.spec, extra.spec
    if (s.num_layers, s.num_experts, s.top_k) != (x.num_layers, x.num_experts, x.top_k):
        raise ConfigError(f"--train-extra: its trace has L={x.num_layers}, E={x.num_experts}, K={x.top_k}; expected "
                          f"the evaluated trace's L={s.num_layers}, E={s.num_experts}, K={s.top_k}.")
    if extra.task_names != train.task_names:
        raise ConfigError(f"--train-extra: its tasks are {list(extra.task_names)}; expected the evaluated trace's "
                          f"{list(train.task_names)}.")
    shared = _document_names(extra) & _document_names(test)
    if shared:
        raise ConfigError(f"--train-extra: it holds {len(shared)} source document(s) of the held-out requests (e.g. "
                          f"{sorted(shared)[0]!r}); expected documents disjoint from the test (e.g. corpus:train).")
    tok = dict(extra.tokens)
    tok["request"] = tok["request"] + (int(train.tokens["request"].max()) + 1 if train.num_tokens else 0)
    tok["step"] = tok["step"] + (int(train.tokens["step"].max()) + 1 if train.num_tokens else 0)
    tok["document"] = np.full_like(tok["document"], -1)  # ids number another document list
    shifted = Trace(spec=train.spec, tokens=tok, experts_TLK=extra.experts_TLK, weights_TLK=extra.weights_TLK,
                    task_names=train.task_names, source_names=train.source_names)
    if train.hidden_TLH is not None or train.logits_TLE is not None:  # concat keeps a tensor only if all have it
        train = Trace(spec=train.spec, tokens=train.tokens, experts_TLK=train.experts_TLK,
                      weights_TLK=train.weights_TLK, task_names=train.task_names, source_names=train.source_names,
                      provenance=dict(train.provenance))
    return Trace.concat([train, shifted])


def parse_names(names: str | Sequence[str]) -> list[str]:
    """'a,b' or ['a', 'b'] -> checked list; each a known name or a saved predictor directory."""
    items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    if not items:
        raise ConfigError(f"--predictors is {names!r}; expected a comma-separated list of {', '.join(PREDICTOR_NAMES)}.")
    for n in items:
        if n not in PREDICTOR_NAMES and not is_predictor_dir(n):
            raise ConfigError(
                f"--predictors: {n!r} is neither a predictor name nor a saved predictor directory; "
                f"expected one of {', '.join(PREDICTOR_NAMES)} or a folder holding predictor.json."
            )
    return items


def make_predictor(
    name: str, spec: MoESpec, *, embeddings: np.ndarray | None = None, embedding_source: str = "",
    seed: int = 0, threads: int = 1, progress: bool = True, epochs: int | None = None,
    model_path: str | Path | None = None, expertflow: Any = None,
) -> Predictor:
    """An unfitted predictor by name; neural ones use `embeddings` (V, D) when given, else learn their own.

    epochs: neural training epochs (None = the preset's, with early stopping). model_path: the checkpoint
    whose routers the lookahead predictor clones (required for "lookahead"). expertflow: an ExpertFlowConfig
    for "expertflow" (its seed, threads and progress are replaced by these arguments').
    """
    if name == "lookahead":
        from routecast.predict.lookahead import LookaheadConfig, LookaheadPredictor

        if model_path is None:
            raise ConfigError("predictor 'lookahead' needs the model's routers; pass --model DIR or builtin.")
        extra = {} if epochs is None else {"epochs": epochs}
        return LookaheadPredictor.from_model(
            model_path, spec, config=LookaheadConfig(seed=seed, threads=threads, **extra)
        )
    if name == "expertflow":
        import dataclasses

        from routecast.predict.expertflow import ExpertFlowConfig, ExpertFlowPredictor

        cfg = dataclasses.replace(expertflow or ExpertFlowConfig(), seed=seed, threads=threads, progress=progress)
        return ExpertFlowPredictor(spec, cfg if epochs is None else dataclasses.replace(cfg, epochs=epochs))
    if name == "smoe":
        from routecast.predict.smoe import SMoEPredictor

        return SMoEPredictor(spec, embeddings=embeddings, embedding_source=embedding_source)
    if name in ("emoe", "emoe-l"):
        from routecast.predict.emoe import make_emoe

        return make_emoe(name, spec, seed=seed, threads=threads, epochs=epochs)
    if name in ("tlp", "slp"):
        from routecast.predict.locality import SLPPredictor, TLPPredictor

        return TLPPredictor(spec) if name == "tlp" else SLPPredictor(spec)
    if name == "distribution":
        return DistributionPredictor(spec, mle_preset())
    if name == "probability":
        return ProbabilityPredictor(spec)
    if name == "conditional-token":
        return ConditionalPredictor(spec, by_token_preset())
    if name == "conditional-position":
        return ConditionalPredictor(spec, by_position_preset())
    if name in NEURAL:
        preset = ffn_preset if name == "ffn" else lstm_preset
        extra = {} if epochs is None else {"epochs": epochs}
        cfg = preset(embedding="model" if embeddings is not None else "learned", seed=seed, threads=threads,
                     progress=progress, **extra)
        return NeuralPredictor(spec, cfg, embeddings=embeddings, embedding_source=embedding_source)
    raise ConfigError(f"predictor name {name!r} is unknown; expected one of {', '.join(PREDICTOR_NAMES)}.")


def _embeddings_for(names: Sequence[str], trace: Trace, model_dir: str | Path | None) -> tuple[np.ndarray | None, str]:
    if not any(n in NEEDS_EMBEDDINGS for n in names):
        return None, ""
    d = resolve_model_dir(model_dir, trace.provenance)
    return (None, "learned") if d is None else (load_input_embeddings(d), str(d))


def _router_model(name: str, trace: Trace, model_dir: str | Path | None) -> Path | None:
    return resolve_model_dir(model_dir, trace.provenance) if name in NEEDS_ROUTER_INPUTS else None


def _nanmean(v: list[float]) -> float:
    a = np.asarray(v, dtype=np.float64)
    return float(np.nanmean(a)) if np.isfinite(a).any() else math.nan


def evaluate(
    trace: Trace, predictor_names: str | Sequence[str], *, model_dir: str | Path | None = None,
    train_fraction: float = 0.8, seed: int = 0, progress: bool = True, threads: int = 1, epochs: int | None = None,
    split: str = "document", extra_train: Trace | None = None, score_all: bool = False,
) -> list[dict[str, Any]]:
    """Fit each predictor on train_fraction of the documents (split="request": of the requests) and score it
    causally on the requests of the others; a saved predictor fitted on this trace must come from the same split.
    score_all: every name is a saved predictor fitted on another trace, scored on every row of this one (nothing
    is fitted; a predictor name, or a folder fitted on this trace, is refused: see check_score_all).
    extra_train: another capture of the model on other documents, added to every predictor's training data
    (with_extra_training) except the lookahead's (it needs router inputs, which such captures may lack).

    model_dir: checkpoint for the neural predictors' embeddings (a directory, "builtin", "none", or None =
    from the trace's provenance, else learned embeddings). Returns one row per predictor: the mean over
    layers of every metric in metrics.METRICS, "per_layer" (metric -> L values), us_per_token,
    us_per_batch, observe_us_per_batch, fit_s, "split" (the split used), and what was fitted on what.
    """
    names = parse_names(predictor_names)
    if score_all:
        check_score_all(names, trace, extra_train)
    # Row masks, not copies: the fit and the scoring stream the trace window by window (a trace larger
    # than memory is never loaded whole; predictors that train on all rows at once fit a bounded sample).
    if score_all:
        train, test, used = np.zeros(trace.num_tokens, bool), None, "all"
    else:
        train, test, used = heldout_rows(trace, split, train_fraction, seed)
    fitted_on = {"trace": trace_fingerprint(trace), "split": used, "train_fraction": train_fraction, "seed": seed}
    emb, emb_source = _embeddings_for(names, trace, model_dir)
    both = None if extra_train is None else with_extra_training(trace.select(train), extra_train, trace.select(test))
    rows = []
    with torch_threads(threads):
        for name in names:
            t0 = time.perf_counter()
            if name in PREDICTOR_NAMES:
                pred = make_predictor(name, trace.spec, embeddings=emb, embedding_source=emb_source, seed=seed,
                                      threads=threads, progress=progress, epochs=epochs,
                                      model_path=_router_model(name, trace, model_dir))
                if both is not None and name not in NEEDS_ROUTER_INPUTS:
                    pred.fit_rows(both, np.ones(both.num_tokens, bool))
                    fitted = pred.fit_note or (f"{int(train.sum())} tokens ({train_fraction:.0%} of {used}s) + "
                                               f"{extra_train.num_tokens} of --train-extra")
                else:
                    pred.fit_rows(trace, train)
                    fitted = pred.fit_note or f"{int(train.sum())} tokens ({train_fraction:.0%} of {used}s)"
            else:
                pred = load_predictor(name)
                ps, ts = pred.spec, trace.spec
                if (ps.num_layers, ps.num_experts, ps.top_k) != (ts.num_layers, ts.num_experts, ts.top_k):
                    raise ConfigError(f"{name}: predictor was fitted for L={ps.num_layers}, E={ps.num_experts}, "
                                      f"K={ps.top_k}; expected the trace's L={ts.num_layers}, E={ts.num_experts}, "
                                      f"K={ts.top_k}.")
                if not score_all:
                    check_fitted_on(name, fitted_on)
                fitted = f"loaded from {name}" + _fitted_where(name)
            fit_s = time.perf_counter() - t0
            res = run_harness(pred, trace, rows=test, progress=progress)
            row: dict[str, Any] = {
                "predictor": name if name in PREDICTOR_NAMES else f"{pred.name} ({Path(name).name})",
                "horizon": pred.horizon,
                "forecast": res.forecast_kind,
                "embedding": getattr(pred, "embedding_source", ""),
                "fitted": fitted,
                "split": used,
                "test_tokens": res.num_tokens,
                "test_steps": res.num_steps,
                "fit_s": fit_s,
            }
            row.update({m: _nanmean(res.metrics[m]) for m in METRICS})
            row.update(us_per_token=res.us_per_token, us_per_batch=res.us_per_batch,
                       observe_us_per_batch=res.observe_us_per_batch, per_layer=res.metrics)
            rows.append(row)
    return rows


def check_score_all(names: Sequence[str], trace: Trace, extra_train: Trace | None) -> None:
    """--score-all takes saved predictors fitted on another trace only (ConfigError naming the first that is not)."""
    from routecast.predict.store import fitted_on

    if extra_train is not None:
        raise ConfigError("--score-all with --train-extra: nothing is fitted when every row is scored; expected "
                          "one of the two.")
    here = trace_fingerprint(trace)
    for name in names:
        if name in PREDICTOR_NAMES:
            raise ConfigError(f"--score-all with --predictors {name!r}: a name would be fitted on the trace it is "
                              "scored on; expected folders written by `routecast predict fit` on another trace.")
        if not is_predictor_dir(name):
            raise ConfigError(f"--predictors: {name} is neither a predictor name nor a folder written by "
                              "`routecast predict fit`; expected one of those.")
        if (fitted_on(name) or {}).get("trace") == here:
            raise ConfigError(f"--score-all: {name} was fitted on this trace; expected a predictor fitted on another "
                              "trace (scoring it on every row would count its own training rows).")


def _fitted_where(path: str) -> str:
    """' (fitted on N tokens of trace <fingerprint>)'-style note from a saved predictor's record ('' if none)."""
    from routecast.predict.store import fitted_on

    rec = fitted_on(path) or {}
    return f" (fitted on trace {rec['trace']}, split {rec.get('split')})" if rec.get("trace") else ""


def check_fitted_on(path: str, want: dict[str, Any]) -> None:
    """Refuse a saved predictor fitted on this trace under another split: it would be scored on its own data."""
    from routecast.predict.store import fitted_on

    have = fitted_on(path)
    if have is None or have.get("trace") != want["trace"]:
        return  # fitted on another trace (or saved before this was recorded): nothing here was fitted on
    if have.get("split") == "none" or any(have.get(k) != want[k] for k in ("split", "train_fraction", "seed")):
        raise ConfigError(
            f"--predictors: {path} was fitted on this trace with split {have.get('split')}, train fraction "
            f"{have.get('train_fraction')}, seed {have.get('seed')}, so some of the requests scored here trained it; "
            f"expected the same split as this evaluation ({want['split']}, {want['train_fraction']}, "
            f"{want['seed']}), or a predictor fitted on another trace."
        )


# Table columns: (row key, header, format).
_COLUMNS = (
    ("predictor", "predictor", "{}"),
    ("top_k_accuracy", "top-k acc", "{:.3f}"),
    ("exact_set_accuracy", "exact", "{:.3f}"),
    ("top_half_k_hit_rate", "half-k hit", "{:.3f}"),
    ("recall_at_2k", "recall@2k", "{:.3f}"),
    ("batch_level_accuracy", "batch acc", "{:.3f}"),
    ("active_f1", "active F1", "{:.3f}"),
    ("distribution_error", "dist err", "{:.4f}"),
    ("distribution_error_total", "dist err tot", "{:.4f}"),
    ("us_per_token", "µs/token", "{:.2f}"),
    ("us_per_batch", "µs/batch", "{:.1f}"),
)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width text table of evaluate()'s rows (means over layers; 'n/a' where undefined)."""

    def cell(row: dict[str, Any], key: str, fmt: str) -> str:
        v = row.get(key)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "n/a"
        return fmt.format(v)

    cells = [[h for _, h, _ in _COLUMNS]] + [[cell(r, k, f) for k, _, f in _COLUMNS] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
        for line in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def rows_to_json(rows: Sequence[dict[str, Any]]) -> str:
    """evaluate()'s rows as strict JSON (NaN -> null)."""

    def clean(v: Any) -> Any:
        if isinstance(v, float):
            return None if math.isnan(v) or math.isinf(v) else v
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(list(rows)), indent=1)


def fit_and_save(
    trace: Trace, name: str, out_dir: str | Path, *, model_dir: str | Path | None = None, seed: int = 0,
    threads: int = 1, progress: bool = True, epochs: int | None = None, split: str = "document",
    train_fraction: float = 0.8, extra_train: Trace | Sequence[Trace] | None = None,
) -> Path:
    """Fit predictor `name` on the training part of the held-out split that evaluate() uses with the same split,
    train_fraction and seed (split="none": the whole trace, for deployment), plus extra_train (another capture
    on disjoint documents, see with_extra_training), and save it to out_dir with what it was fitted on (see
    store.save_predictor), so `predict eval` and `cache replay` can score it on the held-out part only.
    """
    if name not in PREDICTOR_NAMES:
        raise ConfigError(f"--predictor is {name!r}; expected one of {', '.join(PREDICTOR_NAMES)}.")
    used, fingerprint = "none", trace_fingerprint(trace)
    rows = np.ones(trace.num_tokens, bool)
    if split != "none":
        rows, _, used = heldout_rows(trace, split, train_fraction, seed)
    emb, emb_source = _embeddings_for([name], trace, model_dir)
    with torch_threads(threads):
        pred = make_predictor(name, trace.spec, embeddings=emb, embedding_source=emb_source, seed=seed,
                              threads=threads, progress=progress, epochs=epochs,
                              model_path=_router_model(name, trace, model_dir))
        extras = [] if extra_train is None else [extra_train] if isinstance(extra_train, Trace) else list(extra_train)
        if not extras or name in NEEDS_ROUTER_INPUTS:  # extra captures carry no router inputs
            pred.fit_rows(trace, rows)  # streams, or fits a bounded sample of whole requests (fit_note)
        else:
            both, test = trace.select(rows), trace.select(~rows)
            for x in extras:
                both = with_extra_training(both, x, test)
            pred.fit_rows(both, np.ones(both.num_tokens, bool))
    extra = {} if not extras or name in NEEDS_ROUTER_INPUTS else {"extra_tokens": sum(x.num_tokens for x in extras)}
    return save_predictor(pred, out_dir, fitted_on={"trace": fingerprint, "split": used,
                                                    "train_fraction": train_fraction, "seed": seed, **extra})


def fit_or_load(name: str, train: Trace, *, model: str | None, seed: int, threads: int, quiet: bool,
                rows: np.ndarray | None = None) -> Predictor:
    """A predictor by name, fitted on `train` (on its `rows` only, a bool (T,) mask streamed by fit_rows,
    when given), or loaded from a folder written by `routecast predict fit`."""
    if name not in PREDICTOR_NAMES:
        if not is_predictor_dir(name):
            raise ConfigError(f"--predictor is {name!r}; expected 'oracle', one of {', '.join(PREDICTOR_NAMES)} "
                              "or a folder written by `routecast predict fit`.")
        return load_predictor(name)
    emb, src = _embeddings_for([name], train, model)
    with torch_threads(threads):
        pred = make_predictor(name, train.spec, embeddings=emb, embedding_source=src, seed=seed, threads=threads,
                              progress=not quiet, model_path=_router_model(name, train, model))
        return pred.fit(train) if rows is None else pred.fit_rows(train, rows)


# ------------------------------------------------------------------------------------------- CLI handlers
def predict_eval_main(
    trace_path: str | Path, predictors: str, *, model: str | None = None, as_json: bool = False,
    train_fraction: float = 0.8, seed: int = 0, threads: int = 1, epochs: int | None = None, quiet: bool = False,
    split: str = "document", train_extra: str | Path | None = None, score_all: bool = False,
) -> int:
    """`routecast predict eval TRACE --predictors A,B [--split document|request] [--model DIR|builtin|none]
    [--train-extra DIR] [--score-all] [--json]`: prints the table (with the split it used), returns 0."""
    from routecast.trace.io import read_trace

    routers = any(n.strip() in NEEDS_ROUTER_INPUTS for n in predictors.split(","))
    trace = read_trace(trace_path, load_hidden=routers, load_logits=routers)
    extra = None if train_extra is None else read_trace(train_extra)
    rows = evaluate(trace, predictors, model_dir=model, train_fraction=train_fraction, seed=seed,
                    progress=not quiet, threads=threads, epochs=epochs, split=split, extra_train=extra,
                    score_all=score_all)
    if as_json:
        print(rows_to_json(rows))
    elif score_all:
        print(f"every row scored ({rows[0]['test_tokens']} tokens, {rows[0]['test_steps']} steps) with predictors "
              "fitted on other traces")
        print(format_table(rows))
    else:
        print(f"held-out split by {rows[0]['split']}: fitted on {train_fraction:.0%} of the {rows[0]['split']}s "
              f"(seed {seed}){'' if extra is None else f' plus {extra.num_tokens} tokens of {train_extra}'}, "
              "scored on the rest")
        print(format_table(rows))
    return 0


def predict_fit_main(
    trace_path: str | Path, predictor: str, out: str | Path, *, model: str | None = None, seed: int = 0,
    threads: int = 1, epochs: int | None = None, quiet: bool = False, split: str = "document",
    train_fraction: float = 0.8, train_extra: str | Path | None = None,
) -> int:
    """`routecast predict fit TRACE --predictor NAME --out DIR [--split document|request|none]
    [--model DIR|builtin|none] [--train-extra DIR]`: prints the path."""
    from routecast.trace.io import read_trace

    routers = predictor in NEEDS_ROUTER_INPUTS
    trace = read_trace(trace_path, load_hidden=routers, load_logits=routers)
    extra = [read_trace(d.strip()) for d in str(train_extra or "").split(",") if d.strip()]
    path = fit_and_save(trace, predictor, out, model_dir=model, seed=seed, threads=threads, progress=not quiet,
                        epochs=epochs, split=split, train_fraction=train_fraction, extra_train=extra)
    print(f"wrote {path}")
    return 0
