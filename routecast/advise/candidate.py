"""One priced strategy (Candidate) and the family baselines the ranking compares it with.

    Candidate(name=, system=, family=, metric=, value=, ...)     one row of the advisor's table
    FAMILIES: family -> (doing-nothing strategy, engine-default strategy or None)

A family is a set of strategies that replace each other (one placement, one cache policy, one scheduler);
strategies of different families compose. Every value is what the user pays or gets on the same trace:
"us_per_token" (time per generated or processed token over all MoE layers of the model, lower is better)
or "goodput_tok_s" (serving-simulator tokens/s of requests that meet the SLO, higher is better).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# family -> (doing nothing, the engine default (None: engines have none))
FAMILIES: dict[str, tuple[str, str | None]] = {
    "placement": ("static EP", "EPLB windowed"),
    "shuffle": ("static EP", "EPLB windowed"),
    "cache": ("on-demand LRU", None),
    "residency": ("on-demand LRU", None),
    "scheduler": ("fcfs", "vllm"),
}
METRICS = {"us_per_token": "µs/token", "goodput_tok_s": "goodput tok/s"}


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A strategy priced on the trace (applicable) or the reason it does not apply.

    name: the table's label; system: the paper or engine it comes from; family: FAMILIES key; metric:
    METRICS key; value: the metric's figure (NaN when not applicable); deployable: False for bounds that
    need the future (Belady, PROBE on the step's own loads): listed, never picked; quality: "none" (exact
    outputs), a measured figure, or "unknown"; artifact: what to deploy (a file under --out or a command);
    detail: the figures behind the value (JSON-able).
    """

    name: str
    system: str
    family: str
    metric: str = "us_per_token"
    value: float = math.nan
    applicable: bool = True
    reason: str = ""
    deployable: bool = True
    quality: str = "none"
    artifact: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def higher_is_better(self) -> bool:
        return self.metric == "goodput_tok_s"

    def gain_over(self, base: float) -> float:
        """Fractional gain over a baseline value: time saved / base (us_per_token) or extra goodput / base."""
        if not (math.isfinite(self.value) and math.isfinite(base)) or base <= 0:
            return math.nan
        return self.value / base - 1.0 if self.higher_is_better else 1.0 - self.value / base

    def gain_band(self, base: float, err: float) -> tuple[float, float]:
        """The gain's band when both values may be off by a relative `err` in opposite directions."""
        if not (math.isfinite(self.value) and math.isfinite(base)) or base <= 0:
            return math.nan, math.nan
        lo_r = self.value * (1 - err) / (base * (1 + err))
        hi_r = self.value * (1 + err) / (base * (1 - err))
        if self.higher_is_better:
            return lo_r - 1.0, hi_r - 1.0
        return 1.0 - hi_r, 1.0 - lo_r


def not_applicable(name: str, system: str, family: str, reason: str, metric: str = "us_per_token") -> Candidate:
    return Candidate(name=name, system=system, family=family, metric=metric, applicable=False, reason=reason)
