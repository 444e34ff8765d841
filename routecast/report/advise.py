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
