"""Standard traces that benchmarks, the docs and the advisor use, made on first use under out/traces/.

A fresh clone has no trace; every benchmark asks this module for the one it needs by name and gets a
directory, captured (or synthesised) once and then reused. Names and what they are:

  builtin       the built-in Mixtral-architecture model, 160 corpus test requests, batch 16, hidden + logits
  fine          builtin-fine (DeepSeek-V3 architecture, 64 experts top-6), the same prompts and settings
  PRESET        any synthetic preset of trace/synth_presets.py (e.g. mixtral-8x7b), 64 requests, seed 0

A trace is made in NAME.partial and renamed into place only when complete, under a lock file, so two
benchmarks started together neither capture twice nor read a half-written trace.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from routecast.common.errors import ConfigError

# Where standard traces live unless ROUTECAST_TRACES points elsewhere (a shared folder across checkouts).
DEFAULT_ROOT = Path("out/traces")
# name -> (built-in model, corpus prompt spec); the capture settings the README's figures were measured with.
CAPTURED = {
    "builtin": ("builtin", "corpus:test:160"),
    "fine": ("builtin-fine", "corpus:test:160"),
}
SYNTH_REQUESTS = 64


def traces_root(root: str | Path | None = None) -> Path:
    """The folder holding standard traces: root, else $ROUTECAST_TRACES, else out/traces (relative to cwd)."""
    if root is not None:
        return Path(root)
    env = os.environ.get("ROUTECAST_TRACES")
    return Path(env) if env else DEFAULT_ROOT


def captured_name_of(model: str) -> str | None:
    """The captured standard trace of built-in model `model` ('builtin-fine' -> 'fine'), None for any other model."""
    return next((name for name, (m, _prompts) in CAPTURED.items() if m == str(model)), None)


def standard_names() -> list[str]:
    """Every name standard_trace accepts: the captured ones, then the synthetic presets."""
    from routecast.trace.synth_presets import PRESETS

    return [*CAPTURED, *sorted(PRESETS)]


def standard_trace(name: str, root: str | Path | None = None, *, progress: bool = True,
                   requests: int | None = None) -> Path:
    """Path of standard trace `name` under root (see traces_root), made first if it is not there yet.

    requests: synthetic presets only, the request count (default 64); it becomes part of the folder name
    when not the default, so different sizes never overwrite each other.
    """
    from routecast.trace.synth_presets import PRESETS

    if name not in CAPTURED and name not in PRESETS:
        raise ConfigError(f"standard trace {name!r} is unknown; expected one of {', '.join(standard_names())}.")
    if requests is not None and name in CAPTURED:
        raise ConfigError(f"standard trace {name!r} is a capture of fixed prompts; requests applies to presets only.")
    n = SYNTH_REQUESTS if requests is None else int(requests)
    base = traces_root(root)
    dst = base / (name if n == SYNTH_REQUESTS or name in CAPTURED else f"{name}-r{n}")
    if (dst / "trace.json").is_file():
        return dst
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f".{dst.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second caller waits here, then finds the trace made
        if (dst / "trace.json").is_file():
            return dst
        partial = dst.with_name(dst.name + ".partial")
        if partial.exists():
            shutil.rmtree(partial)  # ours: only this function writes NAME.partial, under the lock
        if name in CAPTURED:
            from routecast.trace.capture import capture_to_disk

            model, prompts = CAPTURED[name]
            capture_to_disk(model, prompts, partial, batch_size=16, hidden=True, logits=True, threads=1,
                            resume=False, progress=progress)
        else:
            from routecast.trace.synth_presets import synth_to_disk

            synth_to_disk(name, partial, requests=n, seed=0)
        partial.rename(dst)
    return dst
