"""serve/: the serving simulator, a stage above sim/ (it prices each engine step with sim's layer cost model).

    EngineConfig(...) -> build_engine(cfg) -> Engine        engine.py: step prices tabulated from the cost model
    make_requests(emoe_tasks(), n, rate, seed=) -> Requests  workload.py (or Requests.from_trace(trace))
    make_scheduler("fcfs" | "vllm" | "fastgen" | "emoe")    sched.py
    simulate(engine, requests, scheduler, slo=SLO()) -> ServeResult     loop.py: the discrete-event loop
    sweep(cfg, schedulers, rates, ...), capacity_rps, under_slo          sweep.py: rate sweeps
    `routecast serve-sim`                                    cli.py
"""

from routecast.serve.engine import Engine, EngineConfig, ExpertLoader, build_engine
from routecast.serve.loop import SLO, ServeResult, simulate
from routecast.serve.sched import SCHEDULERS, make_scheduler
from routecast.serve.sweep import capacity_rps, sweep, under_slo
from routecast.serve.workload import Requests, emoe_tasks, make_requests

__all__ = [
    "SCHEDULERS",
    "SLO",
    "Engine",
    "EngineConfig",
    "ExpertLoader",
    "Requests",
    "ServeResult",
    "build_engine",
    "capacity_rps",
    "emoe_tasks",
    "make_requests",
    "make_scheduler",
    "simulate",
    "sweep",
    "under_slo",
]
