"""sim/: hardware and model profiles (TOML data files), the vectorised layer cost model, MoE-GPS scenarios,
and `calibrate` (measure this machine into a hardware profile). The serving simulator built on the cost model is
the stage above, serve/.

    load_hardware(name | path) -> Hardware        list_hardware()
    load_model(name | path) -> ModelProfile       list_models(), model_profile_from_hf_config(config.json)
    layer_cost(counts (C, G, E), model=, hw=, work=Workload(...), opts=CostOptions(...)) -> LayerCost
    strategy_cost("none" | "distribution" | "token", model=, hw=, skewness=, num_ranks=, ...) -> LayerCost
    calibrate(out_toml, device="cpu" | "cuda[:N]", threads=1, quick=False) -> Hardware   (imports torch lazily):
        expert call floor, weight-read bandwidth vs expert size, peak, eta vs tokens (cpu_plan / cuda_plan)
"""

from routecast.sim.calibrate import calibrate
from routecast.sim.cost import (
    CostOptions,
    LayerCost,
    Workload,
    decode,
    layer_cost,
    moe_gps_options,
    prefill,
    probe_options,
)
from routecast.sim.hardware import Hardware, list_hardware, load_hardware
from routecast.sim.models import ModelProfile, list_models, load_model, model_profile_from_hf_config
from routecast.sim.scenarios import (
    STRATEGIES,
    apply_error,
    balanced_counts,
    counts_from_placement,
    replica_bytes,
    sharded_counts,
    skew_loads,
    strategy_cost,
)

__all__ = [
    "STRATEGIES",
    "CostOptions",
    "Hardware",
    "LayerCost",
    "ModelProfile",
    "Workload",
    "apply_error",
    "balanced_counts",
    "calibrate",
    "counts_from_placement",
    "decode",
    "layer_cost",
    "list_hardware",
    "list_models",
    "load_hardware",
    "load_model",
    "model_profile_from_hf_config",
    "moe_gps_options",
    "prefill",
    "probe_options",
    "replica_bytes",
    "sharded_counts",
    "skew_loads",
    "strategy_cost",
]
