"""The one JSON shape every benchmark writes under out/bench/, so `make results` can render any of them.

    {"benchmark": NAME, "title": "...", "command": "python benchmarks/NAME.py ...",
     "machine": {cpu, cpus, platform, python, numpy, torch?}, "load_avg": [1, 5, 15 min], "quick": bool,
     "finished_utc": "...", "wall_s": float,
     "headline": ["line the benchmark printed", ...],          # the claims, as printed
     "tables": [{"title": "...", "rows": [{"col": value, ...}, ...], "note": "..."}],
     "data": {...}}                                              # anything else the benchmark keeps

Figures in the README and the docs are rendered from these files only (report/results.py), never typed.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from routecast.common.machine import machine_info
from routecast.common.outputs import write_atomic

BENCH_DIR = Path("out/bench")
_T0 = time.monotonic()


def _clean(x: Any) -> Any:
    """JSON-safe copy: numpy scalars and arrays to Python, NaN/inf to None, paths to str, tuples to lists."""
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "tolist"):  # numpy scalar or array
        return _clean(x.tolist())
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Path):
        return str(x)
    return x


def _command(name: str) -> str:
    """How the run was started: `python benchmarks/NAME.py ...`, or `python -m pytest ...` under pytest."""
    argv = list(sys.argv)
    if not argv or not argv[0]:
        return name
    head = "-m pytest" if argv[0].endswith(("pytest/__main__.py", "/pytest", "py.test")) else shlex.quote(argv[0])
    return " ".join(["python", head, *map(shlex.quote, argv[1:])])  # quoted: an empty argument stays visible


def round_order(configs: Sequence[Any], rep: int, keep: int = 0) -> list[Any]:
    """The order of round `rep` of an interleaved benchmark: the first round as listed, later ones the first `keep`
    configurations then the rest in a permutation seeded by the round. A fixed order runs each configuration at the
    same place in every round, so any drift within a round (the process's heap and caches as runs pile up, a disk
    warming) favours the same ones every time: benchmarks/offload.py's fixed order put LRU first in each budget's
    block and measured every policy below it at 50%."""
    import numpy as np

    items = list(configs)
    if rep == 0:
        return items
    rest = items[keep:]
    return items[:keep] + [rest[i] for i in np.random.default_rng(rep).permutation(len(rest))]


def table(title: str, rows: Sequence[Mapping[str, Any]], note: str = "") -> dict[str, Any]:
    """One renderable table: rows are dicts sharing their keys (the columns, in the first row's order)."""
    return {"title": title, "rows": [dict(r) for r in rows], "note": note}


def write_bench(name: str, *, title: str, headline: Sequence[str], tables: Sequence[Mapping[str, Any]] = (),
                data: Mapping[str, Any] | None = None, quick: bool = False,
                path: str | os.PathLike | None = None) -> Path:
    """Write out/bench/NAME.json (or path) atomically in the shape above and return its path.

    headline: the benchmark's claim lines exactly as it printed them. quick: a reduced run (make bench);
    the renderer says so beside every figure from it.
    """
    doc = {
        "benchmark": name, "title": title,
        "command": _command(name),
        "machine": machine_info(), "load_avg": list(os.getloadavg()), "quick": bool(quick),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": time.monotonic() - _T0,
        "headline": list(headline), "tables": list(tables), "data": dict(data or {}),
    }
    p = Path(path) if path is not None else BENCH_DIR / f"{name}.json"
    return write_atomic(p, json.dumps(_clean(doc), indent=1) + "\n", "--out")


def read_bench(path: str | os.PathLike) -> dict[str, Any]:
    """A benchmark JSON back, checked for the keys the renderer needs (one sentence naming what is missing)."""
    from routecast.common.errors import ConfigError

    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{p}: cannot be read as benchmark JSON ({e}); expected a file write_bench wrote.") from None
    missing = [k for k in ("benchmark", "title", "headline", "tables", "machine") if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise ConfigError(f"{p}: benchmark JSON lacks {missing[0]!r}; expected the shape of routecast.common.bench.")
    return doc
