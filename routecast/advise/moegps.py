"""The MoE-GPS advisor: rank no prediction / distribution-only / token-to-expert for a model, hardware and skew.

    sweep(setting, skewness (S,), accuracies (A,), overhead, dist_error) -> Grid     Figure 6 (one call/strategy)
    figure7(setting, bandwidths (B,), skewness (S,), ...) -> (B, S)                  dist saving - token saving
    advise(model_profile=, hardware=, gpus=, link=, ...) -> Advice                   the recommendation
    format_advice(advice) -> str;  advise_main(...) -> int                           `routecast advise`

How a strategy is priced (routecast.sim.scenarios.strategy_cost, MoE-GPS §3):
- no prediction: experts sharded, the hot expert's rank sets the FFN and the all-to-all;
- distribution-only (§3.2.1): duplication from a predicted distribution whose error eps_d = ||p_hat - p||_1 / E
  scales the busiest rank (§3.3 error model); tokens are still scattered at random; no overhead (offline);
- token-to-expert (§3.2.2) at accuracy a: eps = 1 - a scales the busiest rank and is the misrouted share of
  the dispatch (the rest skips the scatter, CostOptions.skip_scatter); overhead = overhead(a, skew) x the
  no-prediction layer time (Figure 4's y-axis is a share of the model's runtime).
§3.3's error models: "optimistic" (errors keep perfect balance), "typical" (busiest rank x (1 + eps), the
paper's default), "pessimistic" (x (1 + eps (G - 1))).

`placement` says what duplication costs: "ideal" is MoE-GPS's assumption (every rank then runs at the mean
load); "replicas" prices each replica as its own GEMM that re-reads the expert's weights, which at small
batches can make duplication slower than none. The advisor uses the hardware's per-direction link figure and
"replicas" by default, and always reports what the other placement would pick.

Figure 1's two questions, as the explanation answers them: bottlenecked by communication = communication
(TP collective + both all-to-alls) is at least COMM_BOUND_SHARE of the no-prediction layer; high load
imbalance = skewness at least HIGH_SKEW (between the paper's typical 1.4 of MMLU / Alpaca Eval and the high
2.0 of SST2).
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
from routecast.sim.cost import LayerCost, moe_gps_options, prefill
from routecast.sim.fits import (
    OverheadCurve,
    PredictorMeasurement,
    fit_polynomial,
    measure_predictors,
    measured_overhead_curve,
    paper_dist_error,
    reference_measurement,
    reference_overhead_curve,
)
from routecast.sim.hardware import Hardware, capacity_note, load_hardware
from routecast.sim.models import ModelProfile, load_model
from routecast.sim.scenarios import ERROR_MODELS, PLACEMENTS, strategy_cost

if TYPE_CHECKING:
    from routecast.trace.trace import Trace

ACCURACIES = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))  # MoE-GPS Figure 6: 0.5 ... 0.95
COMM_BOUND_SHARE = 0.25
HIGH_SKEW = 1.7
DEFAULT_SKEW = 1.4  # MoE-GPS's typical case (MMLU 1.39, Alpaca Eval 1.40)
# MoE-GPS Figure 7's bandwidths (GB/s): 600 and 64 are its Figure 6 NVLink and PCIe settings (bidirectional
# figures, used as the link speed); the paper calls its two intermediate ones arbitrary and does not give them:
# ours are NVLink3 per direction (300) and PCIe 5.0 x16 bidirectional (128).
PAPER_LINK_GBPS = {"nvlink": 600.0, "pcie": 64.0}
FIG7_GBPS = (600.0, 300.0, 128.0, 64.0)
PARTS = ("attention", "attention_comm", "ffn", "ffn_comm", "overhead", "replication")
DEFAULT_PREDICTORS = ("distribution", "probability", "conditional-token", "conditional-position", "ffn")


def _parts(lc: LayerCost) -> dict[str, np.ndarray]:
    """LayerCost -> Figure 6's components (seconds, (C,)): the two all-to-alls are 'FFN comm'."""
    return {"attention": lc.attention, "attention_comm": lc.attention_comm, "ffn": lc.ffn,
            "ffn_comm": lc.dispatch + lc.combine, "overhead": lc.predict, "replication": lc.transfer_exposed,
            "total": lc.total}


@dataclass(frozen=True, kw_only=True)
class Setting:
    """What is simulated: `batch` prefills of `seq` tokens of `model` on `gpus` x `hw` over `link`.

    link_bandwidth: bytes/s per direction overriding the profile's figure (MoE-GPS Figure 7's sweep);
    placement: "ideal" | "replicas"; error_model: "optimistic" | "typical" | "pessimistic";
    charge_transfer: expose replica weight traffic not hidden behind attention (MoE-GPS §5 assumes hidden).
    """

    model: ModelProfile
    hw: Hardware
    gpus: int
    link: str = "nvlink"
    link_bandwidth: float | None = None
    seq: int = 512
    batch: int = 1
    placement: str = "replicas"
    error_model: str = "typical"
    charge_transfer: bool = False

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement is {self.placement!r}; expected one of {list(PLACEMENTS)}.")
        if self.error_model not in ERROR_MODELS:
            raise ConfigError(f"error model is {self.error_model!r}; expected one of {list(ERROR_MODELS)}.")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or not 2 <= self.gpus <= self.model.num_experts:
            raise ConfigError(f"gpus is {self.gpus!r}; expected an integer from 2 to num_experts = "
                              f"{self.model.num_experts} of {self.model.name}.")
        if self.model.num_experts % self.gpus:
            # Expert parallelism shards the experts evenly; the cost model prices E / gpus experts per rank.
            raise ConfigError(f"gpus is {self.gpus}, which does not divide the {self.model.num_experts} experts of "
                              f"{self.model.name}; expected a divisor of {self.model.num_experts}.")
        if self.link_bandwidth is not None and not self.link_bandwidth > 0:
            raise ConfigError(f"link bandwidth is {self.link_bandwidth!r} bytes/s; expected a positive number.")
        bw = self.bandwidth
        if not bw > 0:
            raise ConfigError(f"hardware {self.hw.name} has no '{self.link}' link; expected a link it has.")

    @property
    def bandwidth(self) -> float:
        """Link bytes/s per direction used by the cost model."""
        return float(self.link_bandwidth) if self.link_bandwidth is not None else self.hw.link_bandwidth(self.link)

    def cost(self, strategy: str, skewness: Any, **kw: Any) -> LayerCost:
        opts = dataclasses.replace(moe_gps_options(self.link), link_bandwidth=self.link_bandwidth)
        return strategy_cost(strategy, model=self.model, hw=self.hw, skewness=skewness, num_ranks=self.gpus,
                             work=prefill(self.batch, self.seq), opts=opts, error_model=self.error_model,
                             placement=self.placement, charge_transfer=self.charge_transfer, **kw)


def moe_gps_setting(link: str = "nvlink", *, strict: bool = False, model: str = "mixtral-8x7b",
                    hardware: str = "a100-sxm-80gb", gpus: int = 4, seq: int = 512, batch: int = 1) -> Setting:
    """MoE-GPS Figure 6: Mixtral-8x7B, batch 1 x 512, 4 A100s. strict=False reproduces the paper (its 600 / 64
    GB/s as the link speed, idealised duplication); strict=True is the physical model (the profile's
    per-direction 300 / 32 GB/s, replicas that re-read their weights)."""
    return Setting(model=load_model(model), hw=load_hardware(hardware), gpus=gpus, link=link, seq=seq, batch=batch,
                   link_bandwidth=None if strict else PAPER_LINK_GBPS[link] * 1e9,
                   placement="replicas" if strict else "ideal")


@dataclass(frozen=True, kw_only=True)
class Grid:
    """Figure 6 for S skewness values and A token-to-expert accuracies; component times in seconds.

    none, distribution: PARTS + "total" -> (S,); token: -> (S, A); dist_error (S,); overhead_frac (S, A).
    """

    skewness: np.ndarray
    accuracies: np.ndarray
    dist_error: np.ndarray
    overhead_frac: np.ndarray
    none: dict[str, np.ndarray]
    distribution: dict[str, np.ndarray]
    token: dict[str, np.ndarray]

    @property
    def best_token(self) -> np.ndarray:
        """(S,) index into accuracies of the fastest token-to-expert configuration (the bottom of the U)."""
        return np.argmin(self.token["total"], axis=1)

    @property
    def best_token_total(self) -> np.ndarray:
        return self.token["total"].min(axis=1)

    @property
    def dist_saving(self) -> np.ndarray:
        """(S,) distribution-only's saving on no prediction, a fraction of the no-prediction time."""
        return 1.0 - self.distribution["total"] / self.none["total"]

    @property
    def token_saving(self) -> np.ndarray:
        """(S,) the best token-to-expert configuration's saving on no prediction."""
        return 1.0 - self.best_token_total / self.none["total"]

    @property
    def speedup(self) -> np.ndarray:
        """(S,) best token-to-expert time / distribution-only time - 1 (MoE-GPS's "23% speedup" at skew 1.4)."""
        return self.best_token_total / self.distribution["total"] - 1.0

    @property
    def figure7(self) -> np.ndarray:
        """(S,) MoE-GPS Figure 7: dist-only saving - best token-to-expert saving (> 0: dist-only wins)."""
        return self.dist_saving - self.token_saving

    def as_dict(self) -> dict[str, Any]:
        return {"skewness": self.skewness, "accuracies": self.accuracies, "dist_error": self.dist_error,
                "overhead_frac": self.overhead_frac, "none_s": self.none, "distribution_s": self.distribution,
                "token_s": self.token, "best_token_accuracy": self.accuracies[self.best_token],
                "dist_saving": self.dist_saving, "token_saving": self.token_saving, "speedup": self.speedup,
                "figure7": self.figure7}


def sweep(setting: Setting, *, skewness: Any, accuracies: Sequence[float] = ACCURACIES,
          overhead: OverheadCurve | None = None, dist_error: Any = None) -> Grid:
    """Price the three strategies at every skewness (S,) and accuracy (A,): three vectorised cost calls.

    overhead: token-to-expert overhead curve (default: fits.reference_overhead_curve(), our predictors measured on
    the built-in model's trace; fits.paper_overhead_curve() is the estimated-Figure-4 what-if); dist_error: (S,) or scalar
    distribution-only error (default: paper_dist_error(skewness), MoE-GPS Table 1).
    """
    s = np.atleast_1d(np.asarray(skewness, np.float64))
    a = np.atleast_1d(np.asarray(accuracies, np.float64))
    if s.ndim != 1 or a.ndim != 1 or np.any((a < 0) | (a > 1)):
        raise ConfigError(f"accuracies are {accuracies!r}; expected a 1-D list of values in [0, 1].")
    curve = overhead or reference_overhead_curve()
    derr = np.broadcast_to(paper_dist_error(s) if dist_error is None else np.asarray(dist_error, np.float64), s.shape)
    none = _parts(setting.cost("none", s))
    dist = _parts(setting.cost("distribution", s, dist_error=derr))
    S, A = s.size, a.size
    frac = curve(a[None, :], s[:, None])  # (S, A)
    # Overhead is a share of the model's runtime: the no-prediction layer at the same skewness.
    ovh_s = frac * none["total"][:, None]
    tok = setting.cost("token", np.repeat(s, A), accuracy=np.tile(a, S), overhead_s=ovh_s.ravel())
    token = {k: v.reshape(S, A) for k, v in _parts(tok).items()}
    return Grid(skewness=s, accuracies=a, dist_error=np.array(derr), overhead_frac=frac, none=none,
                distribution=dist, token=token)


def figure7(setting: Setting, *, bandwidths: Sequence[float], skewness: Any, **kw: Any) -> np.ndarray:
    """(B, S) Figure 7 values: dist-only saving - best token saving, per link bandwidth (bytes/s) and skewness."""
    return np.stack([sweep(dataclasses.replace(setting, link_bandwidth=float(b)), skewness=skewness, **kw).figure7
                     for b in bandwidths])


# ---------------------------------------------------------------------------------------------- advice
@dataclass(frozen=True, kw_only=True)
class Option:
    """One priced configuration. parts_us: PARTS -> µs per layer; achievable: within measured evidence."""

    strategy: str
    label: str
    accuracy: float
    error: float
    overhead_frac: float
    parts_us: dict[str, float]
    total_us: float
    achievable: bool = True


@dataclass(frozen=True, kw_only=True)
class Advice:
    """The ranked options for one setting and skewness, the pick, and why (one sentence).

    inputs: what was assumed and where each number came from; comm_share: communication share of the
    no-prediction layer; other_placement: the pick under the other placement model ({label, total_us});
    fits: overhead curve and accuracy -> performance fits used or derived.
    """

    inputs: dict[str, Any]
    options: tuple[Option, ...]
    best: Option
    baseline: Option
    comm_share: float
    comm_bound: bool
    high_imbalance: bool
    explanation: str
    other_placement: dict[str, Any]
    fits: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return _clean({"inputs": self.inputs, "best": dataclasses.asdict(self.best), "explanation": self.explanation,
                       "comm_share": self.comm_share, "comm_bound": self.comm_bound,
                       "high_imbalance": self.high_imbalance, "other_placement": self.other_placement,
                       "options": [dataclasses.asdict(o) for o in self.options], "fits": self.fits})


def _clean(v: Any) -> Any:
    """numpy and NaN -> strict JSON values."""
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, np.ndarray):
        return _clean(v.tolist())
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _option(strategy: str, label: str, parts: dict[str, np.ndarray], i: Any, *, accuracy: float, error: float,
            overhead_frac: float, achievable: bool = True) -> Option:
    us = {k: float(np.asarray(parts[k])[i]) * 1e6 for k in (*PARTS, "total")}
    return Option(strategy=strategy, label=label, accuracy=accuracy, error=error, overhead_frac=overhead_frac,
                  parts_us={k: us[k] for k in PARTS}, total_us=us["total"], achievable=achievable)


def trace_skewness(trace: Trace, tokens: int) -> tuple[float, str]:
    """MoE-GPS skewness of `trace` for steps of `tokens` tokens -> (value, how it was measured).

    Consecutive prefill tokens in trace order are cut into `tokens`-token blocks (MoE-GPS §3.2.1: "for each
    batch, we set sequence length to 512 and measure average skewness across batches"), averaged over blocks
    and layers; a trace with no full block falls back to the token-weighted mean over its steps.
    """
    from routecast.trace.stats import step_stats
    from routecast.trace.synth_presets import moegps_skewness

    v = moegps_skewness(trace, seq_len=int(tokens))
    if np.isfinite(v):
        return float(v), f"trace: mean over {tokens}-token prefill blocks and layers"
    st = step_stats(trace, ep=1)
    w = np.repeat(st.tokens_S[:, None], st.skew_SL.shape[1], axis=1).astype(np.float64)
    ok = np.isfinite(st.skew_SL)
    if not ok.any():
        raise ConfigError(f"trace {trace!r} has no routed tokens; expected a trace with routing to measure skewness.")
    return float((st.skew_SL * w)[ok].sum() / w[ok].sum()), "trace: token-weighted mean over steps and layers " \
        f"(fewer than {tokens} prefill tokens)"


def _resolve(model_profile: str | ModelProfile, hardware: str | Hardware) -> tuple[ModelProfile, Hardware]:
    m = model_profile if isinstance(model_profile, ModelProfile) else load_model(model_profile)
    h = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    return m, h


def _rows(predictor_rows: PredictorMeasurement | Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if predictor_rows is None:
        return []
    rows = list(predictor_rows.rows if isinstance(predictor_rows, PredictorMeasurement) else predictor_rows)
    for r in rows:
        missing = {"predictor", "strategy", "top_k_accuracy", "overhead_frac"} - set(r)
        if missing:
            raise ConfigError(f"predictor row {r.get('predictor', r)!r} lacks {sorted(missing)}; expected rows of "
                              "fits.measure_predictors.")
    return rows


def advise(
    *, model_profile: str | ModelProfile, hardware: str | Hardware, gpus: int, link: str = "nvlink", seq: int = 512,
    batch: int = 1, trace: Trace | None = None,
    predictor_rows: PredictorMeasurement | Sequence[dict[str, Any]] | None = None,
    accuracies: Sequence[float] = ACCURACIES, skewness: float | None = None, placement: str = "replicas",
    error_model: str = "typical", link_bandwidth: float | None = None, dist_error: float | None = None,
    overhead: OverheadCurve | None = None, charge_transfer: bool = False,
    predictors: Sequence[str] = DEFAULT_PREDICTORS, epochs: int | None = 3, model_dir: str | Path | None = None,
    seed: int = 0,
) -> Advice:
    """Rank no prediction / distribution-only / token-to-expert (at each accuracy) for one setting; pick the fastest.

    Each number's source, most specific first: skewness = the argument, else the trace's (trace_skewness over
    batch x seq tokens), else 1.4; predictor_rows = the argument, else `predictors` measured on the trace
    (fits.measure_predictors; `epochs` caps neural training), else none; token overhead = `overhead`, else
    the exponential fit to the predictors measured here, else the shipped measurement of our predictors on the
    built-in model's trace (fits.reference_overhead_curve); distribution error = the argument,
    else the measured distribution predictor's, else the paper's Table 1 line. With measured predictors, each
    is also an option of its own, and grid accuracies outside their measured range are shown but not picked.
    """
    m, h = _resolve(model_profile, hardware)
    setting = Setting(model=m, hw=h, gpus=gpus, link=link, link_bandwidth=link_bandwidth, seq=seq, batch=batch,
                      placement=placement, error_model=error_model, charge_transfer=charge_transfer)
    inputs: dict[str, Any] = {"model": m.name, "hardware": h.name, "gpus": gpus, "link": link,
                              "link_gbps_per_direction": setting.bandwidth / 1e9, "seq": seq, "batch": batch,
                              "placement": placement, "error_model": error_model}
    if skewness is not None:
        skew, inputs["skewness_source"] = float(skewness), "given"
    elif trace is not None:
        skew, inputs["skewness_source"] = trace_skewness(trace, batch * seq)
    else:
        skew, inputs["skewness_source"] = DEFAULT_SKEW, "MoE-GPS typical case (MMLU 1.39 / Alpaca Eval 1.40)"
    if not 1.0 <= skew <= m.num_experts:
        raise ConfigError(f"skewness is {skew}; expected a value in [1, num_experts = {m.num_experts}].")
    inputs["skewness"] = skew
    if (cap := capacity_note(m, h, gpus)) is not None:
        inputs["capacity_note"] = cap
    if trace is not None and trace.spec.num_experts != m.num_experts:
        inputs["note"] = (f"the trace routes over {trace.spec.num_experts} experts and {m.name} over {m.num_experts}: "
                          "its skewness and predictor figures are carried over as they are")
    if predictor_rows is None and trace is not None:
        predictor_rows = measure_predictors(trace, predictors, model_dir=model_dir, epochs=epochs, seed=seed)
    rows = _rows(predictor_rows)
    tok_rows = [r for r in rows if r["strategy"] == "token" and np.isfinite(r["top_k_accuracy"])]
    if isinstance(predictor_rows, PredictorMeasurement):
        measured: PredictorMeasurement | None = predictor_rows
    elif rows:
        measured = PredictorMeasurement(rows=tuple(rows), forward_us_per_token=math.nan, forward_tokens=0,
                                        forward_source="rows given", split="")
    else:
        measured = None
    from_rows = overhead is None and len({r["top_k_accuracy"] for r in tok_rows}) >= 2
    curve = measured_overhead_curve(measured, skew) if from_rows else (overhead or reference_overhead_curve())
    # Only accuracies the measured predictors span count as achievable; beyond them the fit extrapolates. With the
    # shipped reference curve, the span is the reference predictors'; a curve given as an argument spans 0..1.
    span = tok_rows if from_rows else reference_measurement()[0].token_rows() if overhead is None else []
    acc_range = ((min(r["top_k_accuracy"] for r in span), max(r["top_k_accuracy"] for r in span))
                 if span else (0.0, 1.0))
    if dist_error is None and measured is not None and np.isfinite(measured.dist_error()):
        derr, inputs["dist_error_source"] = measured.dist_error(), "measured (distribution predictor, test set)"
    elif dist_error is None:
        derr, inputs["dist_error_source"] = float(paper_dist_error(skew)), "MoE-GPS Table 1 line"
    else:
        derr, inputs["dist_error_source"] = float(dist_error), "given"
    inputs.update(dist_error=derr, overhead_source=curve.source)

    options, fits = _price(setting, skew, accuracies, curve, derr, tok_rows, acc_range)
    alt_setting = dataclasses.replace(setting, placement="ideal" if placement == "replicas" else "replicas")
    alt, _ = _price(alt_setting, skew, accuracies, curve, derr, tok_rows, acc_range)
    pick = [o for o in options if o.achievable]
    best = min(pick, key=lambda o: o.total_us)
    alt_best = min((o for o in alt if o.achievable), key=lambda o: o.total_us)
    base = options[0]
    p = base.parts_us
    comm_share = (p["attention_comm"] + p["ffn_comm"]) / base.total_us
    comm_bound, high = comm_share >= COMM_BOUND_SHARE, skew >= HIGH_SKEW
    tokens = [o for o in pick if o.strategy == "token"]
    best_tok = min(tokens, key=lambda o: o.total_us) if tokens else None
    text = _explain(best, options[0], options[1], best_tok, comm_share, skew, comm_bound, high)
    fits = {"overhead": curve.as_dict(), **fits}
    return Advice(inputs=inputs, options=tuple(options), best=best, baseline=base, comm_share=comm_share,
                  comm_bound=comm_bound, high_imbalance=high, explanation=text,
                  other_placement={"placement": alt_setting.placement, "label": alt_best.label,
                                   "total_us": alt_best.total_us},
                  fits=fits)


def _price(setting: Setting, skew: float, accuracies: Sequence[float], curve: OverheadCurve, derr: float,
           tok_rows: list[dict[str, Any]], acc_range: tuple[float, float]) -> tuple[list[Option], dict[str, Any]]:
    """Options at one skewness: none, distribution-only, the accuracy grid, then each measured predictor."""
    g = sweep(setting, skewness=[skew], accuracies=accuracies, overhead=curve, dist_error=[derr])
    opts = [_option("none", "no prediction", g.none, 0, accuracy=math.nan, error=0.0, overhead_frac=0.0),
            _option("distribution", "distribution-only", g.distribution, 0, accuracy=math.nan, error=derr,
                    overhead_frac=0.0)]
    lo, hi = acc_range
    for j, a in enumerate(g.accuracies):
        opts.append(_option("token", f"token-to-expert @ {a:.2f}", {k: v[0] for k, v in g.token.items()}, j,
                            accuracy=float(a), error=1.0 - float(a), overhead_frac=float(g.overhead_frac[0, j]),
                            achievable=bool(lo - 1e-9 <= a <= hi + 1e-9)))
    # Normalised performance (Figure 4's right axis): a perfect, free token-to-expert predictor's time over each.
    oracle = setting.cost("token", [skew], accuracy=1.0).total[0]
    fits: dict[str, Any] = {"oracle_us": float(oracle) * 1e6}
    perf = oracle / g.token["total"][0]
    if g.accuracies.size >= 3:
        pf = fit_polynomial(g.accuracies, perf, 2)
        fits["performance_grid"] = {**pf.as_dict(), "sweet_spot": pf.argmax(g.accuracies.min(), g.accuracies.max())}
    if tok_rows:
        acc = np.array([r["top_k_accuracy"] for r in tok_rows])
        frac = np.array([r["overhead_frac"] for r in tok_rows])
        base_total = g.none["total"][0]
        lc = _parts(setting.cost("token", np.full(acc.size, skew), accuracy=acc, overhead_s=frac * base_total))
        for i, r in enumerate(tok_rows):
            opts.append(_option("token", f"token-to-expert: {r['predictor']} (measured)", lc, i,
                                accuracy=float(acc[i]), error=1.0 - float(acc[i]), overhead_frac=float(frac[i])))
        if np.unique(acc).size >= 3:
            pf = fit_polynomial(acc, oracle / lc["total"], 2)
            fits["performance_measured"] = {**pf.as_dict(), "sweet_spot": pf.argmax(float(acc.min()), float(acc.max()))}
    return opts, fits


def _explain(best: Option, none: Option, dist: Option, tok: Option | None, comm_share: float, skew: float,
             comm_bound: bool, high: bool) -> str:
    """One sentence: the pick, its margin, and MoE-GPS Figure 1's two questions answered with numbers."""
    q = (f"bottlenecked by communication? {'yes' if comm_bound else 'no'} ({comm_share:.0%} of the no-prediction "
         f"layer); high load imbalance? {'yes' if high else 'no'} (skewness {skew:.2f})")
    rule = "token" if comm_bound and high else "distribution"
    if best.strategy == "none":
        why = (f"duplication costs more than it saves here: distribution-only takes {dist.total_us:.0f} µs, its FFN "
               f"{dist.parts_us['ffn']:.0f} µs against {none.parts_us['ffn']:.0f} µs unduplicated")
    else:
        other = tok if best.strategy == "distribution" else dist
        name = other.label if other is not None else "token-to-expert"
        vs = f", {1 - best.total_us / other.total_us:.1%} below {name}" if other is not None else ""
        why = f"{1 - best.total_us / none.total_us:.1%} below no prediction{vs}"
    agree = ("as MoE-GPS Figure 1 predicts" if best.strategy == rule
             else f"where MoE-GPS Figure 1's rule alone would pick {'token-to-expert' if rule == 'token' else 'distribution-only'}")
    return f"{best.label} is fastest at {best.total_us:.0f} µs per layer ({why}): {q}, {agree}."


def format_advice(advice: Advice) -> str:
    """A fixed-width table of every option (µs per layer; * = the pick, ~ = outside the measured accuracies)."""
    i = advice.inputs
    head = (f"{i['model']} on {i['gpus']} x {i['hardware']} over {i['link']} ({i['link_gbps_per_direction']:.0f} GB/s "
            f"per direction), batch {i['batch']} x {i['seq']} tokens, skewness {i['skewness']:.2f} "
            f"({i['skewness_source']}), placement {i['placement']}, {i['error_model']} errors")
    cols = ("option", "acc", "ovh %", "attn", "attn comm", "FFN", "FFN comm", "overhead", "total µs", "vs none")
    lines = [[*cols]]
    base = advice.baseline.total_us
    for o in advice.options:
        mark = "*" if o is advice.best else ("~" if not o.achievable else " ")
        p = o.parts_us
        lines.append([f"{mark} {o.label}", "" if math.isnan(o.accuracy) else f"{o.accuracy:.3f}",
                      f"{100 * o.overhead_frac:.1f}", f"{p['attention']:.0f}", f"{p['attention_comm']:.0f}",
                      f"{p['ffn']:.0f}", f"{p['ffn_comm']:.0f}", f"{p['overhead']:.0f}", f"{o.total_us:.0f}",
                      f"{o.total_us / base - 1:+.1%}"])
    w = [max(len(r[c]) for r in lines) for c in range(len(cols))]
    rows = ["  ".join(c.ljust(w[k]) if k == 0 else c.rjust(w[k]) for k, c in enumerate(r)) for r in lines]
    rows.insert(1, "  ".join("-" * x for x in w))
    alt = advice.other_placement
    tail = [f"skewness {i['skewness']:.2f}; distribution error {i['dist_error']:.4f} ({i['dist_error_source']}); "
            f"token overhead: {i['overhead_source']}",
            f"advice: {advice.explanation}",
            f"with placement '{alt['placement']}' the pick would be {alt['label']} ({alt['total_us']:.0f} µs)."]
    if "note" in i:
        tail.append(f"note: {i['note']}")
    if "capacity_note" in i:
        tail.append(f"note: {i['capacity_note']}")
    return "\n".join([head, "", *rows, "", *tail])


def advise_main(
    *, model_profile: str, hardware: str, gpus: int, link: str = "nvlink", trace: str | Path | None = None,
    seq: int = 512, batch: int = 1, as_json: bool = False, placement: str = "replicas", error_model: str = "typical",
    skewness: float | None = None, link_gbps: float | None = None, predictors: str = ",".join(DEFAULT_PREDICTORS),
    epochs: int | None = 3, model_dir: str | None = None, seed: int = 0,
) -> int:
    """`routecast advise --model-profile M --hardware H --gpus G --link nvlink|pcie [--trace DIR] [--json]`: prints."""
    tr = None
    for flag, v in (("--seq", seq), ("--batch", batch)):
        if v < 1:
            raise ConfigError(f"{flag} is {v}; expected a positive integer.")
    if epochs is not None and epochs < 1:
        raise ConfigError(f"--epochs is {epochs}; expected a positive integer.")
    if skewness is not None and not math.isfinite(skewness):
        raise ConfigError(f"--skewness is {skewness}; expected a finite number >= 1.")
    if link_gbps is not None and not (math.isfinite(link_gbps) and link_gbps > 0):
        raise ConfigError(f"--link-gbps is {link_gbps}; expected a positive finite number of GB/s.")
    if trace is not None:
        from routecast.trace.io import read_trace

        tr = read_trace(trace, load_hidden=False, load_logits=False)
        m = load_model(model_profile)
        if tr.spec.num_experts != m.num_experts:
            raise ConfigError(f"--trace {trace} routes over {tr.spec.num_experts} experts and --model-profile "
                              f"{m.name} has {m.num_experts}; expected a profile with the trace's expert count "
                              "(its skewness and predictor accuracy do not carry over).")
    names = [n.strip() for n in predictors.split(",") if n.strip()]
    adv = advise(model_profile=model_profile, hardware=hardware, gpus=gpus, link=link, seq=seq, batch=batch, trace=tr,
                 skewness=skewness, placement=placement, error_model=error_model,
                 link_bandwidth=None if link_gbps is None else link_gbps * 1e9, predictors=names, epochs=epochs,
                 model_dir=model_dir, seed=seed)
    print(json.dumps(adv.as_dict(), indent=1) if as_json else format_advice(adv))
    return 0
