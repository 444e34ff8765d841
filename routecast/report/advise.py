"""The advisor's answer as HTML: the verdict in two sentences, the ranked table, what does not apply.

    advise_section(verdict) -> Section          the demo report's first section
    write_html(path, verdict) -> Path           a standalone report whose first section is the verdict
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from routecast.advise.candidate import METRICS
from routecast.advise.rank import Verdict
from routecast.report.html import Section, paragraph, preformatted, table, write_report


def _pct(x: float) -> str:
    return f"{x:+.1%}" if isinstance(x, float) and math.isfinite(x) else "–"


def table_rows(v: Verdict) -> list[dict[str, Any]]:
    """The ranked rows (applicable ones, bounds last) as dicts for report.html.table."""
    out = []
    for r in v.rows:
        c = r.cand
        if not c.applicable:
            continue
        out.append({"#": r.rank or "bound", "strategy": c.name, "system": c.system, "metric": METRICS[c.metric],
                    "value": c.value, "vs nothing": _pct(r.gain), "band": f"{_pct(r.band[0])} .. {_pct(r.band[1])}",
                    "vs engine default": _pct(r.vs_default) if r.default else "n/a", "quality cost": c.quality,
                    "deploy": c.artifact})
    return out


def advise_section(v: Verdict, key: str = "verdict", title: str = "Verdict") -> Section:
    """Verdict (two sentences), the deployment and regime, the ranked table, the strategies that do not apply."""
    parts = [paragraph(v.sentences), paragraph(f"{v.deployment}. Regime: {v.regime_text}."),
             table(table_rows(v), digits=4), paragraph(f"Uncertainty band: {v.error_source}.")]
    dead: dict[str, list[str]] = {}
    for r in v.rows:
        if not r.cand.applicable:
            dead.setdefault(r.cand.reason, []).append(r.cand.name)
    if dead:
        parts.append(preformatted("\n".join(f"{', '.join(n)}: {why}" for why, n in dead.items())))
    return Section(key=key, title=title, parts=parts)


def write_html(path: str | Path, v: Verdict) -> Path:
    """A standalone HTML report whose first section is the verdict."""
    return write_report(path, "routecast advise", [advise_section(v)], {"deployment": v.deployment})


DEMO_HARDWARE = "h100-sxm"


def demo_deployment(trace: Any) -> tuple[str, int]:
    """(model profile, GPUs) the demo asks about: the trace's own model on the largest EP of 8 / 4 / 2 dividing its
    experts (1 when none does)."""
    from routecast.sim.models import list_models

    name = (trace.spec.name or "").lower()
    model = name if name in ("builtin", "builtin-fine") or name in list_models() else "builtin"
    E = trace.spec.num_experts
    return model, next((g for g in (8, 4, 2) if E % g == 0 and E >= g), 1)


def section_advise(trace: Any, out: Path) -> tuple[Section, dict[str, Any]]:
    """The demo's first section: the advisor's verdict and table on the demo trace (the trace's model on
    DEMO_HARDWARE), its artifacts under out/advise/."""
    from routecast.advise.artifacts import write_artifacts
    from routecast.advise.run import advise_trace, make_deployment

    model, gpus = demo_deployment(trace)
    dep = make_deployment(model_profile=model, hardware=DEMO_HARDWARE, gpus=gpus)
    v, extras = advise_trace(trace, dep, model_ref=model, hw_ref=DEMO_HARDWARE, shuffle_methods=("sts", "metis"),
                             trace_path=out / "trace" if (out / "trace").is_dir() else None)
    files = write_artifacts(out / "advise", v, model=dep.model, plans=extras["plans"], shuffle=extras["shuffle"],
                            serve_conf=extras["serve"], model_ref=model, trace_ref=str(out / "trace"))
    sec = advise_section(v, key="advise", title="Verdict: what to deploy")
    sec.parts.append(paragraph("Deploy files: " + ", ".join(f"{k} = {p}" for k, p in files.items())))
    best = v.best
    return sec, {"verdict": v.sentences, "best": None if best is None else best.cand.name,
                 "rows": [r.as_dict() for r in v.rows if r.rank][:5], "timings_s": v.timings_s}
