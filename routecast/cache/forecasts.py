"""Forecasts for the cache replay and the replay itself, for the CLI, the advisor, reports and benchmarks.

    forecast_sets(predictor, trace, rows=) -> (per-step predicted batch sets (S, L, E), layer_ahead)
    make_forecast(trace, predictor, ...) -> (held-out row mask, sets, layer_ahead, what it was fitted on)
    run_replay(trace, budget=, policies=, predictor=, reuse_probe=, ...) -> {"settings", "rows"} (fastest first)

With a forecast policy (plec, plec-correct, fc-evict) and a predictor, the predictor is fitted on train_fraction
of the documents (Trace.heldout_split: by request when the trace records no documents) and every policy is
replayed on the held-out requests, so all rows see the same accesses; the forecast of each step comes from the
causal harness (the predictor sees only what its horizon allows). 'oracle' is the step's true routing: an upper
bound for PLEC, not a predictor. Without a forecast policy the whole trace is replayed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from routecast.cache.compare import ALL_POLICIES, add_time_metrics, compare_policies, is_predictive
from routecast.cache.replay import ORACLE, POLICIES, ReplayConfig, parse_budget, replay
from routecast.cache.stream import PackedSets
from routecast.cache.zoo import ADMIT, BYPASSES, bypasses, split_name
from routecast.common.errors import ConfigError
from routecast.predict.evaluate import (
    PREDICTOR_NAMES,
    check_fitted_on,
    fit_or_load,
    heldout_rows,
    trace_fingerprint,
)
from routecast.predict.harness import LAYER, Predictor, StepRouting, StepView, run_harness
from routecast.predict.reuse_probe import adapting_probe_steps, fit_reuse_probe, probe_steps
from routecast.trace import Trace


class _Recorder(Predictor):
    """Passes a predictor through the harness and writes each step's predicted batch set (L, E) into `sink`
    (a bool (S, L, E) array or a stream.PackedSets), one step at a time."""

    def __init__(self, inner: Predictor, step_ids: np.ndarray, sink: Any) -> None:
        super().__init__(inner.spec)
        self.inner = inner
        self.name = inner.name
        self.horizon = inner.horizon
        self.index = {int(s): i for i, s in enumerate(step_ids)}
        self.sink = sink
        self.cur = -1  # the step being predicted (a layer-horizon predictor is asked once per layer)
        self.buf = np.zeros((inner.spec.num_layers, inner.spec.num_experts), dtype=bool)

    def reset(self) -> None:
        self.inner.reset()

    def flush(self) -> None:
        if self.cur >= 0:
            self.sink[self.cur] = self.buf
            self.buf[:] = False
        self.cur = -1

    def predict(self, view: StepView):
        fc = self.inner.predict(view)
        got = fc.batch_active_LE(view.num_tokens)
        i = self.index[int(view.step)]
        if i != self.cur:
            self.flush()
            self.cur = i
        if view.layer is None:
            self.buf[:] = got
        else:
            self.buf[view.layer] = got[0]
        return fc

    def observe(self, routing: StepRouting) -> None:
        self.inner.observe(routing)


def forecast_sets(predictor: Predictor, trace: Trace, *, rows: np.ndarray | None = None,
                  sink: Any = None) -> tuple[Any, bool]:
    """Run `predictor` causally over `trace` (its `rows`, a bool (T,) mask; None = all) -> (predicted batch
    sets, one per step of those rows, layer_ahead). The sets go into `sink` (a stream.PackedSets of shape
    (S, L, E): memory bounded by a window) or, with no sink, into a bool (S, L, E) array in memory."""
    s = trace.spec
    if predictor.spec.num_layers != s.num_layers or predictor.spec.num_experts != s.num_experts:
        raise ConfigError(
            f"--predictor '{predictor.name}' was built for L={predictor.spec.num_layers}, E={predictor.spec.num_experts}; "
            f"the trace has L={s.num_layers}, E={s.num_experts}: expected a predictor of the trace's model."
        )
    steps = np.unique(trace.step if rows is None else trace.step[rows])
    if sink is None:
        sink = np.zeros((len(steps), s.num_layers, s.num_experts), dtype=bool)
    rec = _Recorder(predictor, steps, sink)
    run_harness(rec, trace, rows=rows)
    rec.flush()
    return sink, predictor.horizon == LAYER


def make_forecast(trace: Trace, predictor: str, *, model: str | None = None, train_fraction: float = 0.8,
                  seed: int = 0, split: str = "document", threads: int = 1, quiet: bool = True,
                  sink_dir: str | Path | None = None, score_all: bool = False) -> tuple[np.ndarray | None, Any, bool, str]:
    """-> (bool (T,) mask of the replayed rows or None = all, forecast batch sets (S, L, E), layer_ahead, what it
    was fitted on): 'oracle' (the whole trace, its true routing), a predictor name (fitted on train_fraction of the
    documents, forecast on the rest) or a folder from `routecast predict fit` (refused if it was fitted on this
    trace's held-out part). Row masks, not copies: the fit, the forecast and the replay stream the trace. With
    sink_dir the sets are bit-packed into a file there (memory bounded by a window), else a bool array in memory,
    which a caller may reuse across budgets. score_all: a saved predictor (fitted on another trace) forecasts
    every row of this trace; a name or a folder fitted on this trace is refused."""
    if predictor == "oracle":
        return None, ORACLE, False, "oracle: the true routing of each step"
    if score_all:
        from routecast.predict.store import fitted_on

        if predictor in PREDICTOR_NAMES:
            raise ConfigError(f"--score-all with --predictor {predictor!r}: a name would be fitted on the trace it is "
                              "scored on; expected a folder written by `routecast predict fit` on another trace.")
        pred = fit_or_load(predictor, trace, model=model, seed=seed, threads=threads, quiet=quiet)
        if (fitted_on(predictor) or {}).get("trace") == trace_fingerprint(trace):
            raise ConfigError(f"--score-all: {predictor} was fitted on this trace; expected a predictor fitted on "
                              "another trace (scoring it here would count its own training rows).")
        test = np.ones(trace.num_tokens, bool)
        sink = None
        if sink_dir is not None:
            s = trace.spec
            sink = PackedSets(Path(sink_dir) / "forecast.bits", len(np.unique(trace.step)), s.num_layers,
                              s.num_experts)
        pred_SLE, layer_ahead = forecast_sets(pred, trace, rows=test, sink=sink)
        return test, pred_SLE, layer_ahead, f"{pred.name} loaded from {predictor}, scored on the whole trace"
    train, test, used = heldout_rows(trace, split, train_fraction, seed)
    pred = fit_or_load(predictor, trace, model=model, seed=seed, threads=threads, quiet=quiet, rows=train)
    if predictor in PREDICTOR_NAMES:
        fitted = f"{predictor} fitted on {int(train.sum())} tokens ({train_fraction:.0%} of the {used}s)"
    else:
        check_fitted_on(predictor, {"trace": trace_fingerprint(trace), "split": used,
                                    "train_fraction": train_fraction, "seed": seed})
        fitted = f"{pred.name} loaded from {predictor}"
    sink = None
    if sink_dir is not None:
        s = trace.spec
        sink = PackedSets(Path(sink_dir) / "forecast.bits", len(np.unique(trace.step[test])), s.num_layers,
                          s.num_experts)
    pred_SLE, layer_ahead = forecast_sets(pred, trace, rows=test, sink=sink)
    return test, pred_SLE, layer_ahead, fitted


def _object_name(name: str) -> bool:
    try:
        split_name(name)
    except ConfigError:
        return False
    return name.endswith(ADMIT) or bypasses(name)


def parse_policies(text: str | Sequence[str]) -> list[str]:
    items = [p.strip() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
    bad = [p for p in items if p not in ALL_POLICIES and not _object_name(p)]
    if not items or bad:
        raise ConfigError(f"--policies holds {bad or text!r}; expected a comma-separated list of "
                          f"{', '.join(ALL_POLICIES)} (a policy object may take +admit; {' and '.join(BYPASSES)} "
                          "also +bypass, before it).")
    return items


def run_replay(trace: Trace, *, budget: str | int, policies: str | Sequence[str], predictor: str | None = None,
               hardware: str = "h100-sxm", dense_us: float = 0.0, plec_fallback: str = "lfu", plec_depth: int = 1,
               expert_bytes: int = 0, model: str | None = None, train_fraction: float = 0.8, seed: int = 0,
               split: str = "document", threads: int = 1, quiet: bool = True,
               tmp_dir: str | Path | None = None, score_all: bool = False,
               forecast: tuple[np.ndarray | None, Any, bool, str] | None = None,
               reuse_probe: bool = False, probe_adapt: float | None = None) -> dict[str, Any]:
    """The whole replay as a dict: settings and one row per policy (LRU and Belady always included), fastest
    first. Kernel policies stream the trace; with a policy object (arc, s3fifo, lirs, fc-evict, +admit) every
    policy replays the replayed rows in memory (cache.compare.compare_policies), with the same time model.

    tmp_dir: where the temporary files go (the bit-packed forecast, Belady's next use; None = the system's
    temporary directory); they are removed at the end. forecast: make_forecast's result (made in memory),
    reused across budgets; else made here from `predictor`, bit-packed in tmp_dir. reuse_probe: fc-evict also
    reads a reuse probe of the router inputs (predict/reuse_probe.py), fitted on the predictor's training rows.
    probe_adapt: the weight of a replayed row once it joins the probe's fit (adapting_probe_steps; None = 16,
    0 = the probe stays as fitted); only with reuse_probe."""
    from routecast.sim.hardware import load_hardware

    names = parse_policies(policies)
    if not 0 < train_fraction < 1:  # NaN fails too; checked even when no policy fits a predictor
        raise ConfigError(f"--train-fraction is {train_fraction}; expected a share strictly between 0 and 1.")
    if expert_bytes < 0:
        raise ConfigError(f"--expert-bytes is {expert_bytes}; expected a positive byte count (0 = the trace's spec).")
    eb = expert_bytes or trace.spec.expert_bytes
    s = trace.spec
    if probe_adapt is not None and not reuse_probe:
        raise ConfigError(f"--probe-adapt {probe_adapt} weighs the reuse probe's replayed rows; expected it with "
                          "--reuse-probe.")
    adapt = 16.0 if probe_adapt is None else probe_adapt
    if reuse_probe:
        _check_reuse_probe(trace, names, predictor, score_all)
    slots = parse_budget(budget, s.num_layers * s.num_experts, eb)
    cfg = ReplayConfig(budget=slots, hardware=load_hardware(hardware), dense_us=dense_us, plec_fallback=plec_fallback,
                       plec_depth=plec_depth, expert_bytes=eb)
    with tempfile.TemporaryDirectory(prefix="routecast-forecast-", dir=tmp_dir) as tmp:
        made_here = forecast is None and (any(is_predictive(n) for n in names) or score_all)
        if made_here:
            forecast = make_forecast(trace, predictor or "conditional-token", model=model,
                                     train_fraction=train_fraction, seed=seed, split=split, threads=threads,
                                     quiet=quiet, sink_dir=tmp, score_all=score_all)
        test, pred_SLE, layer_ahead, fitted = forecast or (None, None, False, "")
        replayed = trace.num_tokens if test is None else int(test.sum())
        if all(n in POLICIES for n in names):
            rows = replay(trace, names, cfg, pred_SLE=pred_SLE, layer_ahead=layer_ahead, mask=test, tmp_dir=tmp,
                          progress=not quiet)
            for r in rows:
                r["prefetch_bytes_unused"] = float((r["prefetches"] - r["useful_prefetches"]) * eb)
                r["demand_stall_s"] = r["stall_s"] if POLICIES[r["policy"]].demand_only else None
                r["predictive"] = is_predictive(r["policy"])
            add_time_metrics(rows, replayed)
            rows.sort(key=lambda r: r["us_per_token"])
        else:
            sets = pred_SLE[0:pred_SLE.shape[0]] if isinstance(pred_SLE, PackedSets) else pred_SLE
            reuse = None
            if reuse_probe:  # fitted on the rows the predictor was fitted on, never on the replayed ones
                if adapt > 0:  # keeps learning on the replayed rows, each once its distances are all seen
                    reuse = adapting_probe_steps(trace, ~test, test, weight=adapt)
                    fitted += f"; reuse probe fitted on the same rows, learning on the replayed ones (weight {adapt:g})"
                else:
                    reuse = probe_steps(fit_reuse_probe(trace, ~test), trace, test)
                    fitted += "; reuse probe fitted on the same rows"
            rows = compare_policies(trace, budget=slots, hardware=cfg.hardware, policies=names, mask=test,
                                    forecast=sets, layer_ahead=layer_ahead, dense_us=dense_us, expert_bytes=eb,
                                    reuse=reuse)
            for r in rows:
                r["shown"] = r["policy"] in names
        if made_here and isinstance(pred_SLE, PackedSets):
            pred_SLE.close()
    return {
        "settings": {"budget_slots": slots, "budget_fraction": slots / (s.num_layers * s.num_experts),
                     "hardware": cfg.hardware.name, "expert_bytes": eb, "dense_us": dense_us,
                     "plec_fallback": plec_fallback, "plec_depth": plec_depth, "predictor": fitted,
                     "replayed_tokens": replayed, "layers": s.num_layers, "experts": s.num_experts,
                     "reuse_probe": reuse_probe, "probe_adapt": adapt if reuse_probe else None},
        "rows": rows,
    }


def _check_reuse_probe(trace: Trace, names: Sequence[str], predictor: str | None, score_all: bool) -> None:
    """--reuse-probe's refusals, before any work: it is read by fc-evict, fitted on a held-out split, from router
    inputs."""
    if not any(n.split("+")[0] == "fc-evict" for n in names):
        raise ConfigError("--reuse-probe is read by fc-evict only; expected fc-evict or fc-evict+admit in --policies.")
    if predictor == "oracle" or score_all:
        raise ConfigError("--reuse-probe is fitted on the predictor's training rows; with "
                          f"{'--score-all' if score_all else '--predictor oracle'} there are none: expected a predictor "
                          "name or a folder fitted on this trace.")
    if trace.hidden_TLH is None:
        raise ConfigError("--reuse-probe reads router inputs; the trace has none (hidden_TLH): expected a trace captured "
                          "with hidden states.")
