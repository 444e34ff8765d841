"""MoE-GPS §3.2.2 fits: accuracy -> prediction overhead (exponential) and accuracy -> performance (polynomial).

    fit_exponential(acc (P,), overhead (P,)) -> ExponentialFit      overhead = a * exp(b * acc)
    fit_polynomial(acc (P,), perf (P,), deg=2) -> PolynomialFit     perf = sum_i c_i acc^i
    OverheadCurve(skews (F,), fits (F,))(acc, skew) -> overhead     fits interpolated in skewness (MoE-GPS §4)
    paper_overhead_curve(), paper_dist_error(skew)                  the paper's reference data (see below)
    measure_predictors(trace, names, ...) -> PredictorMeasurement   OUR predictors on OUR trace, with the model's
                                                                    forward timed in the same run
    measured_overhead_curve(measurement, skewness) -> OverheadCurve
    save_measurement / load_measurement(path) -> (PredictorMeasurement, skewness, info)   a measurement on disk
    reference_measurement(), reference_overhead_curve()  the shipped measurement (sim/predictors/builtin.json:
                                                    our predictors on the built-in model's trace, split by
                                                    document), the default overhead curve of the advisor

Units: accuracy is top-k accuracy in [0, 1] (1 - accuracy is MoE-GPS's token error rate eps); overhead is a
fraction of the model's runtime (predictor µs per token / forward µs per token), the y-axis of MoE-GPS
Figure 4; performance is a normalised speed in (0, 1].

Reference data. Table 1 (skewness, distribution error rate) is quoted from the paper's text. Figure 4's points
are NOT in our copy of the paper: it is text only, and keeps the figure's axes (accuracy 0-1, overhead 0-0.3
of runtime, performance 0-1) and its story (five predictor families per dataset; the neural ones the most
accurate and the most expensive, up to ~0.3 of runtime; at skewness 2.0 the same accuracy costs less) but not
its markers. FIG4_ESTIMATE holds our estimate of those points under exactly those constraints; it is only a
what-if (paper_overhead_curve), labelled so wherever it is used. The default overhead curve is measured:
reference_overhead_curve(), the exponential fit to OUR predictors' accuracy and µs/token over the built-in
model's forward µs/token in the same run, as benchmarks/moe_gps_figures.py --save-reference wrote it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.common.timing import median_seconds

if TYPE_CHECKING:
    from routecast.trace.trace import Trace

# MoE-GPS Table 1: (dataset, skewness, error rate ||p_hat - p||_1 / E); the paper prints the error in percent.
TABLE1 = (("MMLU", 1.39, 0.0180), ("Alpaca Eval", 1.40, 0.0098), ("SST2", 1.99, 0.1600))

# Our estimate of MoE-GPS Figure 4 (see the module docstring): skewness -> ((predictor, accuracy, overhead), ...).
# Order per dataset: probability, conditional-position, conditional-token, FFN, LSTM (Appendix B's families).
FIG4_ESTIMATE: dict[float, tuple[tuple[str, float, float], ...]] = {
    1.4: (("probability", 0.30, 0.001), ("conditional-position", 0.33, 0.002), ("conditional-token", 0.50, 0.005),
          ("ffn", 0.65, 0.05), ("lstm", 0.80, 0.28)),
    2.0: (("probability", 0.40, 0.001), ("conditional-position", 0.45, 0.002), ("conditional-token", 0.62, 0.005),
          ("ffn", 0.78, 0.03), ("lstm", 0.90, 0.15)),
}

# The shipped measurement of our predictors (benchmarks/moe_gps_figures.py --trace out/traces/builtin --save-reference).
REFERENCE_FILE = Path(__file__).resolve().parent / "predictors" / "builtin.json"
MEASUREMENT_FORMAT = "routecast-predictor-measurement"

# Token-to-expert predictors of routecast.predict (the MoE-GPS families); "distribution" is distribution-only.
TOKEN_PREDICTORS = ("probability", "conditional-token", "conditional-position", "ffn", "lstm")


def _pairs(x: Any, y: Any, xname: str, yname: str, min_points: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(x, dtype=np.float64).ravel()
    b = np.asarray(y, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ConfigError(f"{xname} has {a.size} values and {yname} {b.size}; expected one {yname} per {xname}.")
    ok = np.isfinite(a) & np.isfinite(b)
    if np.unique(a[ok]).size < min_points:
        raise ConfigError(f"{xname} has {np.unique(a[ok]).size} distinct finite value(s); expected at least "
                          f"{min_points} to fit.")
    return a[ok], b[ok]


def _r2(y: np.ndarray, yhat: np.ndarray) -> float:
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float(((y - yhat) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)


@dataclass(frozen=True, kw_only=True)
class ExponentialFit:
    """overhead(acc) = a * exp(b * acc), fitted by least squares on log(overhead) (multiplicative errors, as
    overheads span decades). r2: coefficient of determination on the log scale; n: points used."""

    a: float
    b: float
    r2: float
    n: int

    def __call__(self, acc: Any) -> np.ndarray:
        """(...) accuracies -> (...) overhead fractions."""
        return self.a * np.exp(self.b * np.asarray(acc, dtype=np.float64))

    def as_dict(self) -> dict[str, float]:
        return {"a": self.a, "b": self.b, "r2": self.r2, "n": self.n}


@dataclass(frozen=True, kw_only=True)
class PolynomialFit:
    """perf(acc) = polyval(coef, acc), coef highest power first (numpy order); r2 on the data; n points."""

    coef: tuple[float, ...]
    r2: float
    n: int

    @property
    def deg(self) -> int:
        return len(self.coef) - 1

    def __call__(self, acc: Any) -> np.ndarray:
        """(...) accuracies -> (...) fitted performance."""
        return np.polyval(np.asarray(self.coef), np.asarray(acc, dtype=np.float64))

    def argmax(self, lo: float = 0.0, hi: float = 1.0) -> float:
        """The accuracy in [lo, hi] where the fitted performance peaks (the sweet spot of Figure 4)."""
        cands = [lo, hi]
        if self.deg >= 2:
            roots = np.roots(np.polyder(np.asarray(self.coef)))
            cands += [float(r.real) for r in roots if abs(r.imag) < 1e-12 and lo <= r.real <= hi]
        c = np.asarray(cands)
        return float(c[np.argmax(self(c))])

    def as_dict(self) -> dict[str, Any]:
        return {"coef": list(self.coef), "r2": self.r2, "n": self.n}


def fit_exponential(acc: Any, overhead: Any) -> ExponentialFit:
    """(P,) accuracies, (P,) overhead fractions (> 0) -> ExponentialFit; needs 2 distinct accuracies."""
    x, y = _pairs(acc, overhead, "accuracy", "overhead", 2)
    if np.any(y <= 0):
        raise ConfigError(f"overhead holds {y[y <= 0][:3].tolist()}; expected positive fractions of runtime "
                          "for an exponential fit.")
    ly = np.log(y)
    b, la = np.polyfit(x, ly, 1)
    return ExponentialFit(a=float(np.exp(la)), b=float(b), r2=_r2(ly, la + b * x), n=int(x.size))


def fit_polynomial(acc: Any, perf: Any, deg: int = 2) -> PolynomialFit:
    """(P,) accuracies, (P,) performances -> PolynomialFit of degree `deg`; needs deg + 1 distinct accuracies."""
    if isinstance(deg, bool) or not isinstance(deg, (int, np.integer)) or deg < 0:
        raise ConfigError(f"deg is {deg!r}; expected a non-negative integer polynomial degree.")
    x, y = _pairs(acc, perf, "accuracy", "performance", deg + 1)
    coef = np.polyfit(x, y, deg)
    return PolynomialFit(coef=tuple(float(c) for c in coef), r2=_r2(y, np.polyval(coef, x)), n=int(x.size))


def pareto_front(acc: Any, overhead: Any) -> np.ndarray:
    """(P,) bool: points no other point beats (at least as accurate and at most as costly, one strictly).

    A dominated predictor is never the cheapest way to an accuracy, so the accuracy -> overhead curve the
    advisor needs is the frontier's.
    """
    a = np.asarray(acc, dtype=np.float64)
    o = np.asarray(overhead, dtype=np.float64)
    ge = (a[None, :] >= a[:, None]) & (o[None, :] <= o[:, None])
    strict = (a[None, :] > a[:, None]) | (o[None, :] < o[:, None])
    return ~np.any(ge & strict, axis=1)


@dataclass(frozen=True, kw_only=True)
class OverheadCurve:
    """Token-to-expert overhead (fraction of runtime) vs accuracy, at F measured skewness values.

    MoE-GPS §4 fits one exponential per measured skewness and interpolates between them for the others; with
    ln(overhead) = ln a + b * acc, interpolating ln a and b linearly in skewness (and extending the line beyond
    the measured ones) is the same as interpolating ln(overhead) at every accuracy. F = 1: the same curve
    at every skewness.
    """

    skews: tuple[float, ...]
    fits: tuple[ExponentialFit, ...]
    source: str

    def __post_init__(self) -> None:
        if len(self.skews) != len(self.fits) or not self.fits:
            raise ConfigError(f"OverheadCurve has {len(self.skews)} skews and {len(self.fits)} fits; expected one fit "
                              "per skewness, at least one.")
        if len(set(self.skews)) != len(self.skews):
            raise ConfigError(f"OverheadCurve.skews is {self.skews}; expected distinct skewness values.")

    def __call__(self, acc: Any, skewness: Any) -> np.ndarray:
        """accuracy and skewness broadcast together -> overhead fractions of the same shape."""
        acc_a, s = np.broadcast_arrays(np.asarray(acc, np.float64), np.asarray(skewness, np.float64))
        order = np.argsort(self.skews)
        sk = np.asarray(self.skews, np.float64)[order]
        la = np.log([self.fits[i].a for i in order])
        b = np.asarray([self.fits[i].b for i in order])
        if sk.size == 1:
            return np.exp(la[0] + b[0] * acc_a)
        # Piecewise-linear in skewness, extended linearly beyond the ends (np.interp would clamp).
        j = np.clip(np.searchsorted(sk, s) - 1, 0, sk.size - 2)
        w = (s - sk[j]) / (sk[j + 1] - sk[j])
        return np.exp((1 - w) * la[j] + w * la[j + 1] + ((1 - w) * b[j] + w * b[j + 1]) * acc_a)

    def scaled(self, factor: float) -> OverheadCurve:
        """The same curve with every overhead multiplied by `factor` (sensitivity of a result to the overhead)."""
        if not factor > 0:
            raise ConfigError(f"overhead scale factor is {factor!r}; expected a positive number.")
        fits = tuple(dataclasses.replace(f, a=f.a * factor) for f in self.fits)
        return OverheadCurve(skews=self.skews, fits=fits, source=f"{self.source} x {factor:.3g}")

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "fits": {f"{s:g}": f.as_dict() for s, f in zip(self.skews, self.fits, strict=True)}}


def paper_overhead_curve() -> OverheadCurve:
    """What-if only: exponential fits to FIG4_ESTIMATE at skewness 1.4 and 2.0 (our ESTIMATE of MoE-GPS Figure 4's
    points, written by hand: the figure is not in our copy of the paper)."""
    skews = tuple(sorted(FIG4_ESTIMATE))
    fits = tuple(fit_exponential([p[1] for p in FIG4_ESTIMATE[s]], [p[2] for p in FIG4_ESTIMATE[s]]) for s in skews)
    return OverheadCurve(skews=skews, fits=fits,
                         source="what-if: estimated MoE-GPS Figure 4 points (hand-written; the figure is not in our copy)")


def paper_dist_error(skewness: Any) -> np.ndarray:
    """(...) skewness -> (...) distribution-only error rate, linear in skewness through MoE-GPS Table 1.

    The line is the least-squares fit to Table 1's three datasets, clipped at 0 where it goes negative (just
    below the lowest skewness the paper measured, where an even distribution is trivially predicted).
    """
    s = np.array([r[1] for r in TABLE1])
    e = np.array([r[2] for r in TABLE1])
    slope, icpt = np.polyfit(s, e, 1)
    return np.maximum(icpt + slope * np.asarray(skewness, np.float64), 0.0)


# ------------------------------------------------------------------------------- our predictors, measured
@dataclass(frozen=True, kw_only=True)
class PredictorMeasurement:
    """Accuracy and overhead of routecast.predict predictors on one trace, with the forward timed alongside.

    rows: one dict per predictor: predictor, strategy ("distribution" | "token"), top_k_accuracy,
      us_per_token (predictor), overhead_frac (us_per_token / forward_us_per_token), distribution_error
      (per step) and distribution_error_total (whole test set, MoE-GPS Table 1), fit_s.
    forward_us_per_token: the MoE model's forward on CPU at forward_tokens tokens (one sequence), median.
    forward_source: which model was timed; split: what the predictors were fitted and tested on.
    """

    rows: tuple[dict[str, Any], ...]
    forward_us_per_token: float
    forward_tokens: int
    forward_source: str
    split: str

    def token_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["strategy"] == "token" and np.isfinite(r["top_k_accuracy"])]

    def dist_error(self) -> float:
        """The distribution predictor's whole-test-set error (NaN if it was not measured)."""
        errs = [r["distribution_error_total"] for r in self.rows if r["strategy"] == "distribution"]
        return float(errs[0]) if errs else math.nan

    def as_dict(self) -> dict[str, Any]:
        return {"rows": [dict(r) for r in self.rows], "forward_us_per_token": self.forward_us_per_token,
                "forward_tokens": self.forward_tokens, "forward_source": self.forward_source, "split": self.split}


def _forward_model(trace: Trace, model_dir: str | Path | None, seed: int) -> tuple[Any, str]:
    """The trace's model for timing: its checkpoint, else a random-init Mixtral of the built-in shape."""
    import torch
    from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM

    from routecast.models.train import builtin_config
    from routecast.predict.embeddings import resolve_model_dir

    d = resolve_model_dir(model_dir, trace.provenance)
    torch.manual_seed(seed)
    if d is not None:
        m = AutoModelForCausalLM.from_pretrained(d, use_safetensors=True, trust_remote_code=False, local_files_only=True)
        return m.eval(), f"checkpoint {d}"
    c, s = builtin_config(), trace.spec
    hidden = s.hidden_size if s.hidden_size and s.hidden_size % c.num_heads == 0 else c.hidden_size
    # A stand-in for a large model (a synthetic Mixtral-8x7B or DeepSeek-V3 trace) would not fit in memory:
    # above ~50M expert parameters use the built-in hidden size, and build only as many layers as fit,
    # scaling the measured time by L / layers built (layers of one shape cost the same).
    budget = 50_000_000
    if s.num_layers * s.num_experts * 6 * hidden * hidden > budget:
        hidden = c.hidden_size
    built = int(max(1, min(s.num_layers, budget // (s.num_experts * 6 * hidden * hidden))))
    cfg = MixtralConfig(vocab_size=c.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=built, num_attention_heads=c.num_heads,
                        num_key_value_heads=c.num_kv_heads, max_position_embeddings=c.max_position_embeddings,
                        num_local_experts=s.num_experts, num_experts_per_tok=s.top_k, sliding_window=None)
    m = MixtralForCausalLM(cfg).eval()
    m.routecast_time_scale = s.num_layers / built
    return m, (f"random-init Mixtral of the built-in shape (L={s.num_layers}, built {built}, E={s.num_experts}, "
               f"K={s.top_k}, hidden {hidden}): no trained checkpoint")


def forward_us_per_token(trace: Trace, *, model_dir: str | Path | None = None, tokens: int = 64, repeat: int = 10,
                         seed: int = 0, model: Any = None) -> tuple[float, str]:
    """Median CPU forward µs per token of the trace's model on one sequence of `tokens` tokens -> (µs, source).

    The checkpoint is model_dir, or the one the trace's provenance names (routecast.predict.embeddings); with
    none, a randomly initialised MixtralForCausalLM of the built-in model's shape (trace's L, E, K; its hidden
    size when known) is timed instead: weights do not change a forward's time, only its shape does.
    model: an already loaded (model, source) pair to time again.
    """
    import torch

    m, source = model if model is not None else _forward_model(trace, model_dir, seed)
    n = int(np.clip(tokens, 1, m.config.max_position_embeddings))
    ids = torch.randint(0, m.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        t = median_seconds(lambda: m(input_ids=ids, use_cache=False), repeat)
    return t * 1e6 / n * getattr(m, "routecast_time_scale", 1.0), source


def measure_predictors(
    trace: Trace, names: str | Sequence[str] = ("distribution", "probability", "conditional-token",
                                                "conditional-position", "ffn"),
    *, model_dir: str | Path | None = None, epochs: int | None = None, train_fraction: float = 0.8, seed: int = 0,
    threads: int = 1, repeat: int = 10, split: str = "document",
) -> PredictorMeasurement:
    """Fit and score `names` on a held-out split of `trace` (routecast.predict.evaluate; by document unless the
    trace records none, or split="request") and time the model's
    forward in the same process at the test split's mean tokens per step, once before and once after the
    predictors (the mean of the two medians), so both costs see the same machine load.

    epochs: neural predictors' training epochs (None = preset with early stopping; a few keep this fast).
    """
    from routecast.predict.evaluate import evaluate

    (_, test), used, _ = trace.heldout_masks(split, (train_fraction, 1 - train_fraction), seed=seed)
    n_fwd = max(1, round(int(test.sum()) / max(np.unique(trace.step[test]).size, 1)))
    model = _forward_model(trace, model_dir, seed)
    before, source = forward_us_per_token(trace, tokens=n_fwd, repeat=repeat, seed=seed, model=model)
    rows = evaluate(trace, names, model_dir=model_dir, train_fraction=train_fraction, seed=seed, progress=False,
                    threads=threads, epochs=epochs, split=split)
    after, _ = forward_us_per_token(trace, tokens=n_fwd, repeat=repeat, seed=seed, model=model)
    fwd_us = (before + after) / 2
    out = []
    for r in rows:
        out.append({
            "predictor": r["predictor"], "strategy": "distribution" if r["forecast"] == "distribution" else "token",
            "top_k_accuracy": float(r["top_k_accuracy"]), "us_per_token": float(r["us_per_token"]),
            "overhead_frac": float(r["us_per_token"]) / fwd_us,
            "distribution_error": float(r["distribution_error"]),
            "distribution_error_total": float(r["distribution_error_total"]), "fit_s": float(r["fit_s"]),
        })
    split = (f"split by {used}: fitted on {train_fraction:.0%} of {np.unique(trace.tokens[used]).size} {used}s, scored on "
             f"{int(test.sum())} tokens in {np.unique(trace.step[test]).size} steps; forward {before:.1f} / {after:.1f} "
             "µs/token before / after")
    return PredictorMeasurement(rows=tuple(out), forward_us_per_token=fwd_us, forward_tokens=n_fwd,
                                forward_source=source, split=split)


def measured_overhead_curve(measurement: PredictorMeasurement, skewness: float, *, pareto: bool = True) -> OverheadCurve:
    """Exponential fit of overhead vs accuracy over the measured token-to-expert predictors, at `skewness`.

    pareto: fit only the non-dominated predictors (falls back to all when fewer than 2 distinct accuracies
    are left). One trace gives one skewness, so the curve is the same at every skewness.
    """
    rows = measurement.token_rows()
    acc = np.array([r["top_k_accuracy"] for r in rows])
    ovh = np.array([r["overhead_frac"] for r in rows])
    keep = pareto_front(acc, ovh) if pareto else np.ones(acc.size, bool)
    which = "Pareto-efficient" if pareto else "all"
    if np.unique(acc[keep]).size < 2:
        # One predictor beats all others on both axes: the frontier is a point, so fit them all instead.
        keep, which = np.ones(acc.size, bool), "all (the Pareto front is a single predictor)"
    fit = fit_exponential(acc[keep], ovh[keep])
    names = ", ".join(r["predictor"] for r, k in zip(rows, keep, strict=True) if k)
    return OverheadCurve(skews=(float(skewness),), fits=(fit,),
                         source=f"measured on the trace, {which} token predictors: {names}; forward of "
                                f"{measurement.forward_source}")


# ------------------------------------------------------------------------------- a measurement on disk
def save_measurement(measurement: PredictorMeasurement, skewness: float, path: str | Path, **info: Any) -> Path:
    """Write a measurement and the trace's skewness as JSON (info: trace, command, machine, ...). Returns path."""
    doc = {"format": MEASUREMENT_FORMAT, "version": 1, "skewness": float(skewness), **info,
           "measurement": measurement.as_dict()}
    from routecast.common.outputs import write_atomic

    return write_atomic(Path(path), json.dumps(doc, indent=1) + "\n", "--save-reference")


def load_measurement(path: str | Path = REFERENCE_FILE) -> tuple[PredictorMeasurement, float, dict[str, Any]]:
    """A measurement written by save_measurement -> (PredictorMeasurement, skewness, the whole document)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
        m = doc["measurement"]
        meas = PredictorMeasurement(rows=tuple(dict(r) for r in m["rows"]),
                                    forward_us_per_token=float(m["forward_us_per_token"]),
                                    forward_tokens=int(m["forward_tokens"]), forward_source=str(m["forward_source"]),
                                    split=str(m["split"]))
        skew = float(doc["skewness"])
        ok = doc.get("format") == MEASUREMENT_FORMAT and all(
            {"predictor", "strategy", "top_k_accuracy", "overhead_frac"} <= set(r) for r in meas.rows)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{p}: cannot be read as a predictor measurement ({type(e).__name__}: {e}); expected the "
                          "JSON that benchmarks/moe_gps_figures.py --save-reference writes.") from None
    if not ok:
        raise ConfigError(f"{p}: is not a {MEASUREMENT_FORMAT} with predictor rows; expected the JSON that "
                          "benchmarks/moe_gps_figures.py --save-reference writes.")
    return meas, skew, doc


def reference_measurement() -> tuple[PredictorMeasurement, float, dict[str, Any]]:
    """The shipped measurement: our predictors on the built-in model's trace (REFERENCE_FILE)."""
    return load_measurement(REFERENCE_FILE)


def reference_overhead_curve() -> OverheadCurve:
    """The advisor's default overhead curve: measured_overhead_curve of the shipped measurement (one skewness, so
    the same curve at every skewness: one trace cannot show the paper's "higher skew, cheaper accuracy")."""
    meas, skew, doc = reference_measurement()
    c = measured_overhead_curve(meas, skew)
    return dataclasses.replace(c, source=f"measured ({doc.get('trace', 'shipped measurement')}, {meas.split.split(';')[0]}): "
                                         + c.source.removeprefix("measured on the trace, "))
