"""Request schedulers on the trace's requests through the serving simulator: fcfs, vllm, fastgen, eMoE.

    scheduler_candidates(trace, dep, regime, model_ref=, hw_ref=) -> (list[Candidate], serve-sim config dict)

The engine is the deployment (model, hardware, GPUs, link) with the regime's resident share of the experts
and the trace's skewness; the requests are the trace's (prompt and output lengths, tasks, arrival order),
their arrivals stretched to --rate requests/s (default: RATE_OF_CAPACITY of what the engine sustains on them,
serve.capacity_rps). Each scheduler serves the same arrivals; the figure is goodput: tokens/s of the requests
that meet both SLOs. "Doing nothing" is FCFS; the engine default is vLLM's scheduler.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from routecast.advise.candidate import Candidate, not_applicable
from routecast.advise.regime import Deployment, Regime
from routecast.common.errors import ConfigError
from routecast.trace.trace import Trace

SCHEDULERS = {"fcfs": "FCFS (doing nothing)", "vllm": "vLLM scheduler (engine default)", "fastgen": "DeepSpeed-FastGen",
              "emoe": "eMoE SLO-aware scheduler"}
RATE_OF_CAPACITY = 0.7
TOKEN_BUDGET = 4096  # tokens per step (vLLM's max_num_batched_tokens), raised to the trace's longest prompt


def scheduler_candidates(trace: Trace, dep: Deployment, regime: Regime, *, model_ref: str, hw_ref: str,
                         seed: int = 0, period: int = 40) -> tuple[list[Candidate], dict[str, Any]]:
    """Every scheduler on the same arrivals (module docstring) -> (candidates, the serve-sim configuration)."""
    from routecast.serve.engine import EngineConfig, build_engine
    from routecast.serve.loop import SLO
    from routecast.serve.sweep import capacity_rps, run_one
    from routecast.serve.workload import Requests, task_expert_freq

    budget = min(max(regime.resident_share, 1e-6), 1.0)
    try:
        req = Requests.from_trace(trace)
        # the simulator prefills a prompt in one step: the budget must exceed the longest prompt
        token_budget = max(TOKEN_BUDGET, int(req.prompt.max()) + 1)  # serve.loop: prompt < budget
        cfg = EngineConfig(model=model_ref, hardware=hw_ref, gpus=dep.gpus, link=dep.link, budget=budget,
                           skewness=max(regime.skewness, 1.0), token_budget=token_budget, seed=seed)
        engine = build_engine(cfg)
        cap = capacity_rps(engine, req)
    except ConfigError as e:
        return [not_applicable(n, sy, "scheduler", f"the serving simulator refuses this deployment: {e}",
                               "goodput_tok_s") for n, sy in SCHEDULERS.items()], {}
    rate = dep.rate if dep.rate is not None else RATE_OF_CAPACITY * cap
    span = float(req.arrival[-1]) if req.n > 1 else 0.0
    arr = req.arrival * ((req.n - 1) / rate) / span if span > 0 else np.arange(req.n) / rate
    req = dataclasses.replace(req, arrival=arr)
    slo = SLO(ttft=dep.slo_ttft, tpot=dep.slo_tpot)
    freq = (task_expert_freq(trace, len(req.task_names), dep.model.num_moe_layers)
            if budget < 1 and trace.spec.num_layers == dep.model.num_moe_layers else None)
    out = []
    for name, system in SCHEDULERS.items():
        r = run_one(engine, req, name, slo=slo, period=period, seed=seed, task_freq=freq)
        out.append(Candidate(
            name=name, system=system, family="scheduler", metric="goodput_tok_s", value=float(r["goodput_tok_s"]),
            artifact=f"serve-sim.json (scheduler {name})",
            detail={k: float(r[k]) for k in ("slo_attainment", "throughput_tok_s", "ttft_p90_s", "tpot_p50_s",
                                              "e2e_mean_s")}))
    conf = {"model_profile": model_ref, "hardware": hw_ref, "gpus": engine.gpus, "link": dep.link,
            "token_budget": cfg.token_budget,
            "budget": budget, "skewness": cfg.skewness, "rate_req_s": rate, "capacity_req_s": cap,
            "requests": int(req.n), "slo_ttft": dep.slo_ttft, "slo_tpot": dep.slo_tpot, "period": period,
            "seed": seed}
    return out, conf
