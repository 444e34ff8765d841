"""Rank priced candidates into one table and a two-sentence verdict; the cost model's error as the band.

    cost_model_error(hw, bench_dir) -> (relative error, where it came from)
    rank(candidates, err) -> list[Row]            gain vs doing nothing and vs the engine default, band
    Verdict(...).table() / .as_dict() / .sentences

Uncertainty: the cost model's mean absolute error measured by benchmarks/cost_model_validation.py for this kind
of device (out/bench/cost_model_validation.json for CPU profiles, -cuda.json for GPU ones; the worst shape's
median MAE). Where no validation has been run for the device, ASSUMED_ERROR (that benchmark's target) is used and
the table says "assumed". A gain's band is its value with both times off by that error in opposite directions,
so a band that straddles 0 means the model cannot tell the strategy from doing nothing.

Ranking: by the gain over what the user would run anyway: the engine default where the family has one (EPLB
for placement and shuffling, vLLM's scheduler for scheduling), else doing nothing (on-demand LRU for caching).
Strategies of one family replace each other; strategies of different families compose (the verdict says which).
Lossy strategies (a quality cost other than "none": eMoE's fallback routing changes the outputs) rank after every
exact one and the verdict names them apart, with their quality cost.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from routecast.advise.candidate import FAMILIES, METRICS, Candidate
from routecast.sim.hardware import Hardware

ASSUMED_ERROR = 0.15
BENCH_DIR = Path("out/bench")


def cost_model_error(hw: Hardware, bench_dir: str | Path = BENCH_DIR) -> tuple[float, str]:
    """(relative error, source) for `hw` (module docstring)."""
    name = "cost_model_validation.json" if hw.kind == "cpu" else "cost_model_validation-cuda.json"
    p = Path(bench_dir) / name
    try:
        doc = json.loads(p.read_text())
        summ = doc.get("summary") or doc.get("data", {}).get("summary") or {}
        maes = [float(v["mae_median"]) for v in summ.values() if math.isfinite(float(v["mae_median"]))]
        if maes:
            return max(maes), f"measured: worst median MAE of {p} ({len(maes)} shapes)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return ASSUMED_ERROR, (f"assumed {ASSUMED_ERROR:.0%}: no cost-model validation of a {hw.kind} profile here "
                           f"(run benchmarks/cost_model_validation.py{' --device cuda' if hw.kind != 'cpu' else ''})")


@dataclass(frozen=True, kw_only=True)
class Row:
    """One table row: the candidate, its rank (0 = not ranked), gains (fractions) and the band."""

    cand: Candidate
    rank: int
    gain: float
    band: tuple[float, float]
    vs_default: float
    baseline: str
    default: str | None

    @property
    def lossy(self) -> bool:
        """The strategy changes the model's outputs (eMoE's fallback routing)."""
        return self.cand.quality != "none"

    @property
    def score(self) -> float:
        """What the ranking sorts by: the gain over what the user runs anyway (the engine default where the family
        has one, else doing nothing)."""
        return self.vs_default if self.default and math.isfinite(self.vs_default) else self.gain

    def as_dict(self) -> dict[str, Any]:
        c = self.cand
        return {"rank": self.rank, "score": self.score, "strategy": c.name, "system": c.system, "family": c.family, "metric": c.metric,
                "value": c.value, "gain_vs_nothing": self.gain, "band": list(self.band),
                "gain_vs_engine_default": self.vs_default, "baseline": self.baseline, "engine_default": self.default,
                "quality_cost": c.quality, "artifact": c.artifact, "applicable": c.applicable,
                "deployable": c.deployable, "reason": c.reason, "detail": c.detail}


def rank(cands: list[Candidate], err: float) -> list[Row]:
    """Rows: deployable candidates by Row.score (best first), then bounds, then what does not apply."""
    values = {(c.family, c.name): c.value for c in cands if c.applicable}
    rows = []
    for c in cands:
        base_name, default = FAMILIES[c.family]
        fam = "placement" if c.family == "shuffle" else "cache" if c.family == "residency" else c.family
        base = values.get((fam, base_name), math.nan)
        dflt = values.get((fam, default), math.nan) if default else math.nan
        rows.append(Row(cand=c, rank=0, gain=c.gain_over(base), band=c.gain_band(base, err),
                        vs_default=c.gain_over(dflt), baseline=base_name, default=default))
    key = lambda r: -r.score if math.isfinite(r.score) else math.inf  # noqa: E731
    # exact strategies first: a lossy one (its quality cost is not "none") buys its time with the outputs
    live = sorted((r for r in rows if r.cand.applicable and r.cand.deployable), key=lambda r: (r.lossy, key(r)))
    bounds = sorted((r for r in rows if r.cand.applicable and not r.cand.deployable), key=key)
    dead = [r for r in rows if not r.cand.applicable]
    live = [Row(**{**r.__dict__, "rank": i + 1}) for i, r in enumerate(live)]
    return live + bounds + dead


def _pct(x: float) -> str:
    return f"{x:+.1%}" if math.isfinite(x) else "-"


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The advisor's answer: inputs, regime, ranked rows, the error used, and the two-sentence verdict."""

    deployment: str
    regime: dict[str, Any]
    regime_text: str
    rows: list[Row]
    error: float
    error_source: str
    timings_s: dict[str, float] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)

    @property
    def best(self) -> Row | None:
        return next((r for r in self.rows if r.rank == 1), None)

    def best_of(self, family: str) -> Row | None:
        """The best ranked exact strategy of a family (placement includes shuffling; cache includes residency)."""
        fams = {"placement": ("placement", "shuffle"), "cache": ("cache", "residency")}.get(family, (family,))
        return next((r for r in self.rows if r.rank and r.cand.family in fams and not r.lossy), None)

    @property
    def sentences(self) -> str:
        """Two sentences: what to deploy and by how much; what else composes with it and what does not apply."""
        b = self.best
        if b is None:
            return "No strategy applies to this deployment. " + self.regime_text[0].upper() + self.regime_text[1:] + "."
        metric = "time per token" if b.cand.metric == "us_per_token" else "SLO goodput"
        lo, hi = b.band
        vs = (f"; it is {_pct(b.vs_default)} against {b.default}, the engine default"
              if b.default and math.isfinite(b.vs_default) and b.cand.name != b.default else "")
        if b.cand.name == b.baseline:
            first = f"Keep {b.cand.name}: no other {b.cand.family} strategy beats it on {metric}{vs}."
        else:
            sure = "beyond" if lo > 0 else "within"
            first = (f"Deploy {b.cand.name} ({b.cand.system}): it changes the {metric} by {_pct(b.gain)} against "
                     f"{b.baseline}{vs} (band {_pct(lo)} to {_pct(hi)}, {sure} the cost model's ±{self.error:.0%} "
                     "error).")
        others = []
        for fam in ("placement", "cache", "scheduler"):
            r = self.best_of(fam)
            if r is not None and r is not b and r.score > 0 and r.cand.name not in (r.baseline, r.default) \
                    and not r.lossy:
                ref = r.default if r.default and math.isfinite(r.vs_default) else r.baseline
                what = "goodput" if r.cand.metric != "us_per_token" else "time"
                others.append(f"{r.cand.name} ({_pct(r.score)} {what} against {ref})")
        lossy = next((r for r in self.rows if r.rank and r.lossy and r.score > 0), None)
        extra = (f"consider {lossy.cand.name} only if its quality cost is acceptable ({lossy.cand.quality}; "
                 f"{_pct(lossy.gain)} time against {lossy.baseline}); " if lossy is not None else "")
        dead = sorted({r.cand.family for r in self.rows if not r.cand.applicable})
        second = (f"Combine it with {' and '.join(others)}; " if others else "Nothing exact pays on top of it; ") + \
            extra + f"regime: {self.regime_text}" + (f"; not applicable: {', '.join(dead)}." if dead else ".")
        return f"{first} {second}"

    def table(self) -> str:
        """The fixed-width ranked table, then the bounds and the strategies that do not apply with the reason."""
        head = ("#", "strategy", "system", "metric", "value", "vs nothing", "band", "vs default", "quality cost",
                "deploy")
        lines = [list(head)]
        for r in self.rows:
            c = r.cand
            if not c.applicable:
                continue
            lines.append([str(r.rank) if r.rank else "bound", c.name, c.system, METRICS[c.metric],
                          f"{c.value:.4g}", _pct(r.gain), f"{_pct(r.band[0])}..{_pct(r.band[1])}",
                          _pct(r.vs_default) if r.default else "n/a", c.quality, c.artifact])
        w = [max(len(x[i]) for x in lines) for i in range(len(head))]
        out = ["  ".join(x[i].ljust(w[i]) for i in range(len(head))).rstrip() for x in lines]
        out.insert(1, "  ".join("-" * n for n in w))
        dead = [r.cand for r in self.rows if not r.cand.applicable]
        if dead:
            out += ["", "not applicable:"]
            seen: dict[str, list[str]] = {}
            for c in dead:
                seen.setdefault(c.reason, []).append(c.name)
            out += [f"  {', '.join(names)}: {why}" for why, names in seen.items()]
        return "\n".join(out)

    def text(self) -> str:
        notes = [f"note: {n}" for n in self.regime.get("notes", ())]
        return "\n".join([self.deployment, f"regime: {self.regime_text}", *notes, "", self.table(), "",
                          f"uncertainty: {self.error_source}", "", "verdict: " + self.sentences])

    def as_dict(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "regime": self.regime, "regime_text": self.regime_text,
                "verdict": self.sentences, "error": self.error, "error_source": self.error_source,
                "rows": [r.as_dict() for r in self.rows], "timings_s": self.timings_s, "artifacts": self.artifacts}
