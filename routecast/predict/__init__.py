"""Predictors (one file per family), the causal evaluation harness, metrics, save/load, entry points."""

from routecast.predict.forecast import Forecast
from routecast.predict.harness import (
    LAYER,
    REQUEST,
    HarnessResult,
    LeakError,
    Predictor,
    StepRouting,
    StepView,
    check_no_leak,
    run_harness,
)
from routecast.predict.store import load_predictor, register, save_predictor

__all__ = [
    "LAYER",
    "REQUEST",
    "Forecast",
    "HarnessResult",
    "LeakError",
    "Predictor",
    "StepRouting",
    "StepView",
    "check_no_leak",
    "load_predictor",
    "register",
    "run_harness",
    "save_predictor",
]
