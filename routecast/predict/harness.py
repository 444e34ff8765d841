"""The causal evaluation harness: walks a trace step by step and shows each predictor only what it may see.

Horizons (DESIGN.md, "Predictors and causality"):
- ``request``: before the step's forward pass. The view holds the step's token ids, positions,
  requests, phases and tasks; everything about past steps arrives through ``observe``.
- ``layer``: one layer ahead inside the forward pass, queried once per layer l. The view adds this
  step's routing (expert ids, weights, router logits) of layers < l and the router inputs
  (hidden_TLH) of layers < l, the newest being layer l-1's.

After a step is predicted its true routing is revealed with ``observe`` (online predictors learn from
it). Views and routings are fresh read-only copies, so a predictor cannot reach the rest of the trace
through them. ``check_no_leak`` proves a predictor respects this: randomising everything it may not
see leaves its forecasts bit-identical.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from tqdm.auto import tqdm

from routecast.common.errors import ConfigError
from routecast.predict.forecast import Forecast
from routecast.predict.metrics import CostMeter, MetricAccumulator
from routecast.trace import MoESpec, Trace

REQUEST, LAYER = "request", "layer"
HORIZONS = (REQUEST, LAYER)
_VIEW_COLUMNS = ("request", "position", "token_id", "phase", "task")


@dataclass(frozen=True, kw_only=True)
class StepTokens:
    """One step's token columns (T,): request int64, position int32, token_id int32, phase int8, task int16."""

    spec: MoESpec
    step: int
    request: np.ndarray
    position: np.ndarray
    token_id: np.ndarray
    phase: np.ndarray
    task: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.token_id.shape[0])


@dataclass(frozen=True, kw_only=True)
class StepView(StepTokens):
    """What a predictor may see when it predicts one step (T = tokens of the step, in trace order).

    request int64, position int32, token_id int32, phase int8, task int16: (T,) token columns.
    layer: the layer being predicted (layer horizon) or None (request horizon, predict all L).
    experts_TlK int16 / weights_TlK float / logits_TlE float: this step's routing of layers < layer.
    hidden_TlH float: router inputs of layers < layer (None when the trace has none).
    """

    task_names: tuple[str, ...] = ()
    layer: int | None = None
    experts_TlK: np.ndarray | None = None
    weights_TlK: np.ndarray | None = None
    logits_TlE: np.ndarray | None = None
    hidden_TlH: np.ndarray | None = None


@dataclass(frozen=True, kw_only=True)
class StepRouting(StepTokens):
    """A finished step revealed to the predictor: its token columns and its full routing (T, L, ·)."""

    experts_TLK: np.ndarray
    weights_TLK: np.ndarray
    logits_TLE: np.ndarray | None = None
    hidden_TLH: np.ndarray | None = None


class Predictor:
    """Base of every predictor. Subclasses set ``name`` and ``horizon`` and implement ``predict``.

    fit(trace): learn from a training trace (no-op for predictors that do not learn); returns self.
    reset(): forget what evaluation revealed (online state) and return to the post-fit state.
    predict(view) -> Forecast over all L layers (request horizon) or layer view.layer only (a
    forecast with one layer, layer horizon).
    observe(routing): the step's true routing, after it was predicted.
    state() / from_state(): metadata + named arrays for save/load (store.py), no pickle.
    """

    name: ClassVar[str] = ""
    horizon: ClassVar[str] = REQUEST
    learns: ClassVar[bool] = False

    def __init__(self, spec: MoESpec) -> None:
        self.spec = spec

    def fit(self, trace: Trace) -> Predictor:
        return self

    def reset(self) -> None:
        return None

    def predict(self, view: StepView) -> Forecast:
        raise NotImplementedError(f"{type(self).__name__} does not implement predict().")

    def observe(self, routing: StepRouting) -> None:
        return None

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        raise NotImplementedError(f"{type(self).__name__} cannot be saved (no state()).")

    @classmethod
    def from_state(cls, spec: MoESpec, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> Predictor:
        raise NotImplementedError(f"{cls.__name__} cannot be loaded (no from_state()).")

    @classmethod
    def state_schema(cls, spec: MoESpec, meta: dict[str, Any]) -> dict[str, tuple]:
        """What load_predictor checks before from_state: name -> (shape, dtype kinds, rules).

        shape: ints, or names bound on first sight and equal wherever repeated ("U" keys = "U" rows);
        kinds: numpy dtype kinds ("f", "iu"); rules: "sorted" (strictly increasing lookup keys), "nonneg".
        Every float tensor in the file is also checked finite. {} = no checks."""
        return {}


@dataclass
class HarnessResult:
    """Per-layer metrics (metrics.METRICS -> list of L floats), measured cost, optional forecasts.

    forecast_kind: "token", "distribution" or "mixed" (what the predictor returned over the steps).
    """

    metrics: dict[str, list[float]]
    us_per_token: float
    us_per_batch: float
    observe_us_per_batch: float
    num_tokens: int
    num_steps: int
    forecast_kind: str = ""
    forecasts: list[tuple[int, Forecast]] | None = field(default=None, repr=False)


def _frozen(a: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return None
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


def _check(fc: Any, pred: Predictor, step: int, T: int, L: int, E: int) -> Forecast:
    if not isinstance(fc, Forecast):
        raise ConfigError(f"predictor '{pred.name}' returned {type(fc).__name__} at step {step}; expected a Forecast.")
    shape = fc.scores_TLE.shape if fc.scores_TLE is not None else fc.dist_LE.shape
    want = (T, L, E) if fc.token_level else (L, E)
    if shape != want:
        raise ConfigError(f"predictor '{pred.name}' returned a forecast of shape {shape} at step {step}; expected {want}.")
    return fc.validate(f"predictor '{pred.name}' at step {step}: Forecast")


def _stack_layers(parts: list[Forecast], T: int, K: int) -> Forecast:
    """Per-layer forecasts of a layer-horizon predictor -> one (T, L, E) or (L, E) forecast."""
    if all(not p.token_level for p in parts):
        return Forecast(top_k=K, dist_LE=np.concatenate([p.dist_LE for p in parts]))
    rows = [p.scores_TLE if p.token_level else np.broadcast_to(p.dist_LE, (T, *p.dist_LE.shape)) for p in parts]
    return Forecast(top_k=K, scores_TLE=np.concatenate(rows, axis=1))


def run_harness(
    predictor: Predictor,
    trace: Trace,
    *,
    collect: bool = False,
    progress: bool = False,
    stop_after_step: int | None = None,
) -> HarnessResult:
    """Walk trace's steps in order: view -> predict (timed) -> score -> observe(true routing).

    collect: keep every step's Forecast (memory T·L·E floats) for inspection and the leak check.
    stop_after_step: stop once this step has been predicted (the leak check needs no later steps).
    """
    if predictor.horizon not in HORIZONS:
        raise ConfigError(f"predictor '{predictor.name}' has horizon {predictor.horizon!r}; expected one of {HORIZONS}.")
    s = trace.spec
    if predictor.spec.num_layers != s.num_layers or predictor.spec.num_experts != s.num_experts:
        raise ConfigError(
            f"predictor '{predictor.name}' was built for L={predictor.spec.num_layers}, E={predictor.spec.num_experts}; "
            f"the trace has L={s.num_layers}, E={s.num_experts}."
        )
    predictor.reset()
    acc = MetricAccumulator(s.num_layers, s.num_experts, s.top_k)
    cost, obs_cost = CostMeter(), CostMeter()
    forecasts: list[tuple[int, Forecast]] | None = [] if collect else None
    kinds: set[str] = set()
    cols = trace.tokens
    batches = trace.batches()
    n_steps = len(np.unique(trace.step)) if trace.num_tokens else 0
    for step, idx in tqdm(batches, total=n_steps, desc=f"eval {predictor.name}", disable=not progress, leave=False):
        T = len(idx)
        tok = {c: _frozen(cols[c][idx]) for c in _VIEW_COLUMNS}
        experts = trace.experts_TLK[idx]
        weights = trace.weights_TLK[idx]
        logits = None if trace.logits_TLE is None else trace.logits_TLE[idx]
        hidden = None if trace.hidden_TLH is None else trace.hidden_TLH[idx]
        if predictor.horizon == REQUEST:
            view = StepView(spec=s, step=step, task_names=trace.task_names, **tok)
            t0 = time.perf_counter_ns()
            fc = predictor.predict(view)
            cost.add(time.perf_counter_ns() - t0, T)
            fc = _check(fc, predictor, step, T, s.num_layers, s.num_experts)
        else:
            parts, ns = [], 0
            for layer in range(s.num_layers):
                view = StepView(
                    spec=s, step=step, task_names=trace.task_names, layer=layer, **tok,
                    experts_TlK=_frozen(experts[:, :layer]), weights_TlK=_frozen(weights[:, :layer]),
                    logits_TlE=None if logits is None else _frozen(logits[:, :layer]),
                    hidden_TlH=None if hidden is None else _frozen(hidden[:, :layer]),
                )
                t0 = time.perf_counter_ns()
                part = predictor.predict(view)
                ns += time.perf_counter_ns() - t0
                parts.append(_check(part, predictor, step, T, 1, s.num_experts))
            cost.add(ns, T)
            fc = _stack_layers(parts, T, s.top_k)
        acc.update(fc, experts, weights)
        kinds.add("token" if fc.token_level else "distribution")
        if forecasts is not None:
            forecasts.append((step, fc))
        routing = StepRouting(
            spec=s, step=step, **tok, experts_TLK=_frozen(experts), weights_TLK=_frozen(weights),
            logits_TLE=_frozen(logits), hidden_TLH=_frozen(hidden),
        )
        t0 = time.perf_counter_ns()
        predictor.observe(routing)
        obs_cost.add(time.perf_counter_ns() - t0, T)
        if stop_after_step is not None and step >= stop_after_step:
            break
    return HarnessResult(
        metrics=acc.result(), us_per_token=cost.us_per_token, us_per_batch=cost.us_per_batch,
        observe_us_per_batch=obs_cost.us_per_batch, num_tokens=cost.tokens, num_steps=cost.batches,
        forecast_kind=kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else ""), forecasts=forecasts,
    )


# ------------------------------------------------------------------------------------------- leak check
class LeakError(AssertionError):
    """A predictor's forecast changed when only data it may not see was changed."""


def perturb_forbidden(trace: Trace, step: int, layer: int, seed: int) -> Trace:
    """A copy of trace where everything unknown when predicting layer `layer` of `step` is random.

    Randomised: every column and tensor of later steps (token ids, positions, requests (fresh ids), phases, tasks,
    routing, logits, router inputs), and this step's routing, logits and router inputs of layers >= layer.
    Kept: earlier steps, this step's token columns, and the step schedule (which tokens share a step).
    layer = 0 gives the request-horizon perturbation.
    """
    rng = np.random.default_rng(seed)
    s = trace.spec
    now = trace.step == step
    fut = trace.step > step
    nf, nn = int(fut.sum()), int(now.sum())
    tok = {k: v.copy() for k, v in trace.tokens.items()}
    hi_tok = max(int(tok["token_id"].max()) + 1, 2) if trace.num_tokens else 2
    tok["token_id"][fut] = rng.integers(0, hi_tok, nf)
    tok["position"][fut] = rng.integers(0, 4096, nf)
    # Fresh request ids, one per future token: random positions inside existing requests could put a later
    # position in an earlier step, which a Trace refuses (a token cannot run before the one it follows).
    first_new = int(tok["request"].max()) + 1 if trace.num_tokens else 0
    tok["request"][fut] = first_new + rng.permutation(nf)
    tok["phase"][fut] = rng.integers(0, 2, nf)
    tok["task"][fut] = rng.integers(-1, len(trace.task_names), nf)
    tok["source"][fut] = rng.integers(-1, len(trace.source_names), nf)
    tok["arrival_s"][fut] = rng.random(nf) * 1e3

    def rand_experts(n: int, layers: int) -> np.ndarray:
        return np.argsort(rng.random((n, layers, s.num_experts)), axis=-1)[..., : s.top_k].astype(np.int16)

    experts, weights = trace.experts_TLK.copy(), trace.weights_TLK.copy()
    experts[fut] = rand_experts(nf, s.num_layers)
    weights[fut] = rng.random((nf, s.num_layers, s.top_k)).astype(weights.dtype)
    experts[np.flatnonzero(now)[:, None], np.arange(layer, s.num_layers)[None, :]] = rand_experts(nn, s.num_layers - layer)
    weights[np.flatnonzero(now)[:, None], np.arange(layer, s.num_layers)[None, :]] = rng.random(
        (nn, s.num_layers - layer, s.top_k)
    ).astype(weights.dtype)

    def rand_like(a: np.ndarray | None) -> np.ndarray | None:
        if a is None:
            return None
        a = a.copy()
        a[fut] = rng.standard_normal((nf, *a.shape[1:])).astype(a.dtype)
        a[np.flatnonzero(now)[:, None], np.arange(layer, s.num_layers)[None, :]] = rng.standard_normal(
            (nn, s.num_layers - layer, a.shape[2])
        ).astype(a.dtype)
        return a

    return Trace(
        spec=s, tokens=tok, experts_TLK=experts, weights_TLK=weights, logits_TLE=rand_like(trace.logits_TLE),
        hidden_TLH=rand_like(trace.hidden_TLH), task_names=trace.task_names, source_names=trace.source_names,
        provenance=dict(trace.provenance),
    )


def _same(a: Forecast, b: Forecast, layers: slice) -> bool:
    if a.token_level != b.token_level:
        return False
    x, y = (a.scores_TLE, b.scores_TLE) if a.token_level else (a.dist_LE, b.dist_LE)
    x, y = x[..., layers, :], y[..., layers, :]
    return x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)


def check_no_leak(
    predictor: Predictor,
    trace: Trace,
    *,
    steps: list[int] | None = None,
    seed: int = 0,
    on_run: Callable[[int], None] | None = None,
) -> int:
    """Raise LeakError unless randomising what predictor may not see leaves its forecasts bit-identical.

    predictor must already be fitted (reset() is called before every run). For each checked step s
    (default: 4 steps spread over the trace) and, for layer-horizon predictors, each layer l, the
    trace is perturbed with perturb_forbidden(s, l) and every forecast up to step s (layers <= l of
    step s) must equal the unperturbed run's. Returns the number of perturbed runs compared.
    """
    uniq = np.unique(trace.step)
    if uniq.size == 0:
        raise ConfigError("check_no_leak: the trace has no tokens; expected at least one step.")
    if steps is None:
        steps = sorted({int(uniq[i]) for i in np.linspace(0, uniq.size - 1, min(4, uniq.size)).round().astype(int)})
    base = run_harness(predictor, trace, collect=True).forecasts
    by_step = dict(base)
    layers = range(trace.spec.num_layers) if predictor.horizon == LAYER else range(1)
    runs = 0
    for k, s in enumerate(steps):
        for layer in layers:
            pert = perturb_forbidden(trace, s, layer, seed + 1000 * k + layer)
            got = run_harness(predictor, pert, collect=True, stop_after_step=s).forecasts
            runs += 1
            if on_run is not None:
                on_run(runs)
            for step_i, fc in got:
                visible = slice(0, layer + 1) if (step_i == s and predictor.horizon == LAYER) else slice(None)
                if not _same(by_step[step_i], fc, visible):
                    where = f"step {step_i}" + (f" layers <= {layer}" if predictor.horizon == LAYER else "")
                    raise LeakError(
                        f"predictor '{predictor.name}' changed its forecast for {where} when only data it may "
                        f"not see (after step {s}, layer {layer}) was randomised."
                    )
    return runs
