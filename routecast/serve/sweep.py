"""Rate sweeps over the serving simulation, and the two numbers read off them.

    run_one(engine, requests, scheduler, slo=, period=, seed=, task_freq=None) -> metrics dict
    sweep(engine_cfg, schedulers, rates, ...) -> (engine, rows)    one simulation per (scheduler, rate), same
                                                                    arrivals for every scheduler at a rate
    capacity_rps(engine, requests) -> requests/s                   what the engine sustains with full batches
    under_slo(rows, target) -> {scheduler: throughput}              highest throughput whose SLO attainment
                                                                    reaches `target` (Speculative MoE's metric)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from routecast.serve.engine import Engine, EngineConfig, ExpertLoader, build_engine
from routecast.serve.loop import SLO, simulate
from routecast.serve.sched import make_scheduler
from routecast.serve.workload import Requests, emoe_tasks, make_requests


def run_one(engine: Engine, req: Requests, scheduler: str, *, slo: SLO, period: int, seed: int,
            task_freq: Any = None) -> dict[str, Any]:
    """One simulation -> its metrics dict (the expert loader runs when the budget keeps a share of the experts;
    task_freq (T, L, E): its per-task expert frequencies, synthetic when None)."""
    loader = (ExpertLoader(engine, req.task_mean_output, period, seed, task_freq=task_freq)
              if engine.config.budget < 1 else None)
    res = simulate(engine, req, make_scheduler(scheduler), slo=slo, loader=loader)
    return {"scheduler": scheduler, **res.metrics(), "events": res.events}


def sweep(engine_cfg: EngineConfig, schedulers: Sequence[str], rates: Sequence[float], *, requests: int, seed: int,
          slo: SLO, period: int = 40, arrival: str = "poisson", cv: float = 1.0, trace_requests: Requests | None = None,
          task_freq: Any = None, progress: bool = False) -> tuple[Engine, list[dict[str, Any]]]:
    """Every scheduler at every rate on the same seeded arrivals -> (engine, rows with 'rate' added).

    With trace_requests, arrivals and lengths come from the trace, time-scaled to each rate; task_freq feeds the
    expert loader (see run_one)."""
    engine = build_engine(engine_cfg)
    rows = []
    total = len(rates) * len(schedulers)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="serve-sim", unit="run", file=sys.stderr)
    for rate in rates:
        if trace_requests is not None:
            req = _rescale(trace_requests, rate)
        else:
            req = make_requests(emoe_tasks(), requests, rate, seed=seed, arrival=arrival, cv=cv)
        for s in schedulers:
            rows.append({"rate": rate, **run_one(engine, req, s, slo=slo, period=period, seed=seed, task_freq=task_freq)})
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return engine, rows


def _rescale(req: Requests, rate: float) -> Requests:
    """The trace's arrivals stretched so the mean rate is `rate` requests/s (lengths and order kept); a trace whose
    requests all arrive at once gets evenly spaced arrivals."""
    import dataclasses

    import numpy as np

    span = float(req.arrival[-1]) if req.n > 1 else 0.0
    arr = req.arrival * ((req.n - 1) / rate) / span if span > 0 else np.arange(req.n) / rate
    return dataclasses.replace(req, arrival=arr)


def capacity_rps(engine: Engine, req: Requests) -> float:
    """Requests/s the engine sustains on these requests' lengths: all of them arriving at once, served by the
    fastgen scheduler (full batches); the rate is that of the middle half of the completions, so neither the
    ramp-up nor the tail of long requests that empties the batch counts."""
    import dataclasses

    import numpy as np

    burst = dataclasses.replace(req, arrival=np.zeros(req.n))
    fin = np.sort(simulate(engine, burst, make_scheduler("fastgen")).finish)
    a, b = req.n // 4, (3 * req.n) // 4
    if b <= a or fin[b] <= fin[a]:
        return req.n / float(fin[-1])
    return (b - a) / float(fin[b] - fin[a])


def under_slo(rows: Sequence[dict[str, Any]], target: float = 0.9) -> dict[str, float]:
    """Per scheduler: the highest throughput (tokens/s) among the rates whose SLO attainment >= target (0 if none)."""
    out: dict[str, float] = {}
    for r in rows:
        ok = r["slo_attainment"] >= target
        out[r["scheduler"]] = max(out.get(r["scheduler"], 0.0), r["throughput_tok_s"] if ok else 0.0)
    return out
