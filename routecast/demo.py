"""`routecast demo`: the main job end to end on the built-in default.

Captures a routing trace from the built-in MoE model on the shipped multi-domain corpus sample
(or generates a synthetic preset trace with --synthetic), then runs every analysis section and writes
out/demo/report.html (figures embedded), out/demo/summary.json and prints a short table.
Each section is a function (trace, out_dir) -> (Section, summary dict); later stages append theirs.
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.report.html import Section, figure, paragraph, preformatted, table, write_atomic, write_report
from routecast.trace.io import is_trace_file
from routecast.trace.trace import Trace

# Requests captured when --requests is not given, per built-in model.
DEFAULT_REQUESTS = {"builtin": 80, "builtin-fine": 48}
# Requests generated for --synthetic when --requests is not given: 16 DeepSeek-V3 requests are ~43k tokens in
# ~2,200 steps (64 were 133k tokens in 4,141 steps and ~4 CPU-minutes, mostly the MoE-GPS predictors' fits).
DEFAULT_SYNTHETIC_REQUESTS = 16
SectionFn = Callable[[Trace, Path], tuple[Section, dict[str, Any]]]
# Steps the PROBE section compares: a synthetic DeepSeek-V3 demo trace has ~4,000 small decode steps, each
# planned per layer (58) per arm; the first 512 keep the section under a minute of CPU (the text says so).
DEMO_PROBE_STEPS = 512


def _capture_builtin(trace_dir: Path, requests: int, seed: int, max_new_tokens: int | None,
                     model: str = "builtin") -> dict[str, Any]:
    """Capture a built-in model ('builtin' or 'builtin-fine') on `requests` prompts from the shipped corpus's test split."""
    from routecast.trace.capture import capture_to_disk

    partial = _fresh(trace_dir.with_name(trace_dir.name + ".partial"))
    t0 = time.perf_counter()
    capture_to_disk(
        model, f"corpus:test:{requests}", partial, max_new_tokens=max_new_tokens, batch_size=8,
        hidden=True, logits=True, threads=1, resume=False,
    )
    _swap(partial, trace_dir)
    return {"source": "built-in model capture" if model == "builtin" else f"{model} model capture", "requests": requests, "capture_s": time.perf_counter() - t0}


def _fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    return path


def _swap(new: Path, dst: Path) -> None:
    # The demo's own trace is replaced only once the new one is complete.
    old = dst.with_name(dst.name + ".old")
    _fresh(old)
    if dst.exists():
        dst.rename(old)
    new.rename(dst)
    _fresh(old)


def _synthetic(trace_dir: Path, preset: str, requests: int, seed: int) -> dict[str, Any]:
    from routecast.trace.synth_presets import synth_to_disk

    partial = _fresh(trace_dir.with_name(trace_dir.name + ".partial"))
    t0 = time.perf_counter()
    synth_to_disk(preset, partial, requests=requests, seed=seed)
    _swap(partial, trace_dir)
    return {"source": f"synthetic preset {preset} ({requests} requests, --requests to change)", "requests": requests,
            "generate_s": time.perf_counter() - t0}


def section_stats(trace: Trace, out: Path) -> tuple[Section, dict[str, Any]]:
    """Routing statistics: skewness, IR, entropy, token/inter-layer predictability, task distances."""
    from routecast.report.plots import stats_figure
    from routecast.trace.stats_bundle import format_stats, routing_stats

    ep = _default_ep(trace.spec.num_experts)
    d = routing_stats(trace, ep=ep)
    png = stats_figure(d, out / "stats.png")
    per = d["per_layer"]
    rows = [
        {"layer": lid, **{k: per[k][i] for k in per if isinstance(per[k], list) and len(per[k]) == len(per["layer"])}}
        for i, lid in enumerate(per["layer"])
    ] if "layer" in per else []
    sec = Section("stats", "Routing statistics", [
        paragraph(f"{trace!r}; imbalance ratio computed for EP={ep} under contiguous sharding."),
        table(rows) if rows else preformatted(format_stats(d)),
        figure(png, "Expert load per layer, imbalance ratio over steps, inter-layer transitions"),
    ])
    return sec, {"stats": d["overall"], "ep": ep}


def _default_ep(num_experts: int) -> int:
    for ep in (8, 4, 2):
        if num_experts % ep == 0 and num_experts >= ep:
            return ep
    return 1


def section_moegps(trace: Trace, out: Path) -> tuple[Section, dict[str, Any]]:
    from routecast.report.moegps import section_moegps as run

    return run(trace, out)


def section_probe(trace: Trace, out: Path) -> tuple[Section, dict[str, Any]]:
    from routecast.report.placement import section_probe as run

    return run(trace, str(out), ep=_default_ep(trace.spec.num_experts), max_steps=DEMO_PROBE_STEPS)


def section_emoe(trace: Trace, out: Path) -> tuple[Section, dict[str, Any]]:
    from routecast.report.emoe import section_emoe as run

    return run(trace, out)


def section_smoe(trace: Trace, out: Path) -> tuple[Section, dict[str, Any]]:
    from routecast.report.smoe import section_smoe as run

    return run(trace, str(out), ep=_default_ep(trace.spec.num_experts))


def section_expertflow(trace: Trace, out: Path) -> tuple[Section, dict[str, Any]]:
    from routecast.report.expertflow import section_expertflow as run

    return run(trace, out)


def section_offload(trace: Trace, out: Path) -> tuple[Section, dict[str, Any]]:
    from routecast.report.offload import section_offload as run

    return run(trace, out)


def section_serving(trace: Trace, out: Path) -> tuple[Section, dict[str, Any]]:
    from routecast.report.serving import section_serving as run

    return run(trace, out)


def section_advise(trace: Trace, out: Path) -> tuple[Section, dict[str, Any]]:
    from routecast.report.advise import section_advise as run

    return run(trace, out)


SECTIONS: list[tuple[str, SectionFn]] = [
    ("advise", section_advise),  # the report opens with the verdict
    ("stats", section_stats),
    ("moegps", section_moegps),
    ("probe", section_probe),
    ("emoe", section_emoe),
    ("smoe", section_smoe),
    ("expertflow", section_expertflow),
    ("offload", section_offload),
    ("serving", section_serving),
]


def run_demo(
    out_dir: str | Path = "out/demo", *, synthetic: str | None = None, requests: int | None = None, seed: int = 0,
    max_new_tokens: int | None = None, overwrite: bool = False, model: str = "builtin",
) -> dict[str, Any]:
    """Run the demo on a capture of `model` (or a synthetic preset); returns the summary dict written to summary.json.

    max_new_tokens None: each corpus prompt's own budget (its task's length draw). A non-empty out_dir is
    refused unless overwrite; then only the demo's own files (trace/, report.html, summary.json, figures) are
    replaced and anything else there is left alone.
    """
    from routecast.common.outputs import check_out_dir, os_error
    from routecast.trace.io import read_trace

    out = check_out_dir(out_dir, "--out", overwrite=overwrite)
    trace_dir = out / "trace"
    for name in ("trace", "trace.partial", "trace.old"):
        q = out / name
        if q.exists() and not (q.is_dir() and all(is_trace_file(f.name) for f in q.iterdir())):
            raise ConfigError(f"--out {out}: {q} is not a trace the demo wrote; expected the demo's own output there "
                              "(move it away: --overwrite never deletes other files).")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise os_error(e, "--out", out) from None
    t_start = time.perf_counter()
    if synthetic:
        origin = _synthetic(trace_dir, synthetic, requests or DEFAULT_SYNTHETIC_REQUESTS, seed)
    else:
        # builtin-fine's forward costs ~1.7x the built-in model's: fewer requests keep the run time alike.
        origin = _capture_builtin(trace_dir, requests or DEFAULT_REQUESTS[model], seed, max_new_tokens, model)
    trace = read_trace(trace_dir)
    print(f"trace: {trace!r}")
    trace_sec = Section("trace", "Trace", [paragraph(f"{origin['source']}: {trace!r}"), table([_trace_row(trace)])])
    sections: list[Section] = []
    summary: dict[str, Any] = {"trace": {**origin, **_trace_row(trace)}}
    timings: dict[str, float] = {}
    for key, fn in SECTIONS:
        t0 = time.perf_counter()
        sec, s = fn(trace, out)
        timings[key] = time.perf_counter() - t0
        sections.append(sec)
        if key == "advise":  # the verdict first, then what it was computed on
            sections.append(trace_sec)
        summary[key] = s
        print(f"[{key}] done in {timings[key]:.1f}s")
    summary["timings_s"] = {**timings, "total": time.perf_counter() - t_start}
    summary["machine"] = {"platform": platform.platform(), "python": platform.python_version()}
    write_atomic(out / "summary.json", json.dumps(_finite(summary), indent=2, default=_json_default, allow_nan=False))
    report = write_report(out / "report.html", "routecast demo", sections, meta={"trace": origin["source"]})
    print(_summary_table(summary))
    print(f"wrote {report} and {out / 'summary.json'}")
    return summary


def _trace_row(trace: Trace) -> dict[str, Any]:
    s = trace.spec
    return {
        "model": s.name or "moe", "tokens": trace.num_tokens, "moe_layers": s.num_layers, "experts": s.num_experts,
        "top_k": s.top_k, "requests": int(np.unique(trace.request).size), "steps": int(np.unique(trace.step).size),
        "decode_share": float((trace.phase == 1).mean()) if trace.num_tokens else 0.0,
        "tasks": ",".join(trace.task_names),
    }


def _summary_table(summary: dict[str, Any]) -> str:
    lines = ["", f"{'section':<12} {'figure':<34} {'value':>10}", "-" * 58]
    for sec, vals in summary.items():
        if not isinstance(vals, dict) or sec in ("machine", "timings_s"):
            continue
        for k, v in vals.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                lines.append(f"{sec:<12} {k:<34} {v:>10.4g}")
            elif k == "rows" and isinstance(v, list):
                for r in v:
                    if isinstance(r, dict) and "method" in r and isinstance(r.get("moe_us_before"), float):
                        lines.append(f"{sec:<12} {(r['method'] + '.moe_us')[:34]:<34} {r['moe_us_before']:>10.4g}")
            elif isinstance(v, dict) and k != "settings":  # settings are in summary.json, not the table
                for k2, v2 in v.items():
                    if isinstance(v2, (int, float)) and not isinstance(v2, bool):
                        lines.append(f"{sec:<12} {(k + '.' + k2)[:34]:<34} {v2:>10.4g}")
    return "\n".join(lines)


def _finite(o: Any) -> Any:
    """NaN/inf -> None, recursively: summary.json stays strict JSON."""
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if isinstance(o, (float, np.floating)):
        return float(o) if np.isfinite(o) else None
    if isinstance(o, np.ndarray):
        return _finite(o.tolist())
    return o


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
