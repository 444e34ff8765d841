"""Measure the all-to-all link of this machine: a sweep of all_to_all_single sizes over G ranks, fitted to
t = alpha + V / B (sim.a2a.fit_link), written as a link profile (routecast/sim/links/*.toml).

Legend: G ranks, P sweep points, R repeats.

Every rank sends `per_peer` bytes to each other rank (fp32 rows), so the busiest rank moves V = (G - 1) x per_peer
each way. Each point: a barrier, then the collective, timed on every rank; the point's time is the median
over R repeats of the slowest rank (after `warmup` untimed calls). Worker mode (`python -m
routecast.runtime.ep.calibrate CONFIG`) runs on ranks.run_ranks; calibrate_link() launches it and fits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from routecast.common.errors import ConfigError
from routecast.common.machine import machine_info
from routecast.common.outputs import write_atomic
from routecast.sim.a2a import LinkProfile, fit_link

DEFAULT_SIZES = (1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20)  # bytes per peer


def _worker(cfg: dict) -> int:
    import torch
    import torch.distributed as dist

    from routecast.runtime.ep.ranks import init_group

    torch.set_num_threads(1)
    rank, G = init_group(cfg.get("backend", "gloo"), float(cfg.get("timeout_s", 30)))
    rows = []
    for per_peer in cfg["sizes"]:
        n = int(per_peer) // 4
        send = torch.ones(n * G)
        recv = torch.empty(n * G)
        times = []
        for rep in range(int(cfg["warmup"]) + int(cfg["repeats"])):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_to_all_single(recv, send)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the slowest rank sets the collective's time
            if rep >= int(cfg["warmup"]):
                times.append(float(dt))
        rows.append({"per_peer": int(per_peer), "volume": (G - 1) * n * 4, "seconds": float(np.median(times)),
                     "p10": float(np.percentile(times, 10)), "p90": float(np.percentile(times, 90))})
    if rank == 0:
        Path(cfg["out"]).write_text(json.dumps({"ranks": G, "points": rows}))
    dist.destroy_process_group()
    return 0


def calibrate_link(out_toml: str | Path, *, nproc: int = 2, sizes: tuple[int, ...] = DEFAULT_SIZES, repeats: int = 30,
                   warmup: int = 3, name: str | None = None, wall_s: float = 600.0,
                   host: str = "127.0.0.1") -> tuple[LinkProfile, list[dict]]:
    """Run the sweep on `nproc` gloo ranks (ranks.run_ranks, store on `host`), fit, write out_toml ->
    (profile, points). The sweep's config and points live in a scratch folder of its own."""
    from routecast.runtime.ep.ranks import run_ranks

    if nproc < 2 or repeats < 1 or warmup < 0 or len(sizes) < 2 or min(sizes) < 4:
        raise ConfigError(f"--nproc {nproc}, --repeats {repeats}, {len(sizes)} sizes; expected nproc >= 2, repeats >= 1, "
                          ">= 2 sizes of at least 4 bytes.")
    from routecast.common.outputs import remove_own, scratch_dir

    out_toml = Path(out_toml)
    work = scratch_dir(out_toml, "--out")  # a folder of its own: a user's X.config.json is never touched
    try:
        tmp, cfg = work / "sweep.json", work / "config.json"
        cfg.write_text(json.dumps({"sizes": list(sizes), "repeats": repeats, "warmup": warmup, "out": str(tmp)}))
        run_ranks("routecast.runtime.ep.calibrate", cfg, nproc, host=host, wall_s=wall_s, what="ep calibrate")
        pts = json.loads(tmp.read_text())["points"]
    finally:
        remove_own(work)
    vol = [p["volume"] for p in pts]
    sec = [p["seconds"] for p in pts]
    alpha, bw = fit_link(vol, sec)
    m = machine_info()
    prof = LinkProfile(name=name or out_toml.stem, backend="gloo", ranks=nproc, alpha=alpha, bandwidth=bw,
                       sizes_bytes=tuple(float(v) for v in vol), seconds=tuple(sec),
                       machine=f"{m['cpu']}, {m['cpus']} cores, load {os.getloadavg()[0]:.1f}, torch {_torch_version()}")
    write_atomic(out_toml, prof.to_toml(), "--out")
    return prof, pts


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    sys.exit(_worker(json.loads(Path(sys.argv[1]).read_text())))
