"""Expert-parallel all-to-all: bytes each rank sends and receives for a given routing and plan, its time, and the
link profile (alpha, bandwidth) fitted from a measured all-to-all sweep.

Legend: G ranks, E experts, P sweep points.

Bytes (no deduplication: every (token, expert) item is one row of H values, Megatron-style):
    local_GE[g, e]  items of expert e whose token lives on rank g
    served_GE[g, e] items of expert e processed on rank g (the plan's quotas)
    kept_GE = min(local_GE, served_GE)   items processed where their token lives (locality-first dispatch)
    sent_g  = sum_e (local_GE - kept_GE)[g] x row_bytes      received_g = sum_e (served_GE - kept_GE)[g] x row_bytes
The combine sends every row back: its sent and received bytes are the dispatch's swapped.
Time (sim.cost.alltoall, PROBE eq. 4-5): alpha + max_g max(sent_g, received_g) / B.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.sim.cost import alltoall

LINK_DIR = Path(__file__).parent / "links"


def ep_a2a_bytes(local_GE: Any, served_GE: Any, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Dispatch bytes (sent_G, received_G) int64 of one layer under locality-first dispatch (module docstring)."""
    loc = np.asarray(local_GE, np.int64)
    srv = np.asarray(served_GE, np.int64)
    if loc.shape != srv.shape or loc.ndim != 2:
        raise ConfigError(f"local_GE {loc.shape} and served_GE {srv.shape}; expected two (ranks, experts) arrays.")
    if loc.sum(axis=0).tolist() != srv.sum(axis=0).tolist():
        raise ConfigError("served_GE does not process every routed item once; expected equal per-expert totals.")
    kept = np.minimum(loc, srv)
    return (loc - kept).sum(axis=1) * int(row_bytes), (srv - kept).sum(axis=1) * int(row_bytes)


@dataclass(frozen=True, kw_only=True)
class LinkProfile:
    """alpha (s) and bandwidth (bytes/s per direction) of an all-to-all among `ranks` processes, and the sweep.

    sizes_bytes / seconds: the measured points (busiest rank's bytes, median seconds); backend: e.g. "gloo".
    """

    name: str
    backend: str
    ranks: int
    alpha: float
    bandwidth: float
    sizes_bytes: tuple[float, ...] = ()
    seconds: tuple[float, ...] = ()
    machine: str = ""

    def time(self, volume_bytes: Any) -> np.ndarray:
        """Seconds of an all-to-all whose busiest rank moves `volume_bytes`."""
        return alltoall(volume_bytes, self.ranks, self.bandwidth, self.alpha)

    def to_toml(self) -> str:
        return "\n".join([
            f"# All-to-all link profile fitted from a measured sweep ({self.backend}, {self.ranks} ranks).",
            "# Units: microseconds, GB/s per direction (1 GB = 1e9 bytes); the sweep: bytes of the busiest rank, seconds.",
            "schema = 1",
            f"name = {json.dumps(self.name)}",
            f"backend = {json.dumps(self.backend)}",
            f"ranks = {self.ranks}",
            f"machine = {json.dumps(self.machine)}",
            f"alpha_us = {self.alpha * 1e6:.6g}",
            f"bandwidth_gbps = {self.bandwidth / 1e9:.6g}",
            f"sizes_bytes = [{', '.join(f'{v:.0f}' for v in self.sizes_bytes)}]",
            f"seconds = [{', '.join(f'{v:.6g}' for v in self.seconds)}]",
            "",
        ])


def fit_link(sizes_bytes: Any, seconds: Any) -> tuple[float, float]:
    """t = alpha + V / B fitted on relative error (least squares of (model - t) / t, so that the small sizes,
    where alpha dominates, count as much as the large ones) -> (alpha s >= 0, B bytes/s > 0)."""
    v = np.asarray(sizes_bytes, np.float64)
    t = np.asarray(seconds, np.float64)
    if v.shape != t.shape or v.size < 2 or np.unique(v).size < 2 or not np.isfinite(t).all() or (t <= 0).any():
        raise ConfigError(f"sweep of {v.size} points; expected >= 2 distinct sizes with positive finite times.")
    A = np.stack([np.ones_like(v), v], axis=1) / t[:, None]
    (alpha, inv_b), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if inv_b <= 0:
        raise ConfigError("the measured all-to-all time does not grow with size; expected a sweep over larger sizes.")
    return max(float(alpha), 0.0), float(1.0 / inv_b)


def load_link(name_or_path: str | Path) -> LinkProfile:
    """A link profile by name (routecast/sim/links/NAME.toml) or path; one sentence on a bad file."""
    p = Path(name_or_path)
    if not p.suffix:
        p = LINK_DIR / f"{name_or_path}.toml"
    try:
        doc = tomllib.loads(p.read_text())
    except FileNotFoundError:
        known = sorted(q.stem for q in LINK_DIR.glob("*.toml"))
        raise ConfigError(f"link profile {name_or_path!r} not found; expected a .toml path or one of {known}.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"link profile {p}: not valid TOML ({e}).") from None
    try:
        prof = LinkProfile(name=str(doc["name"]), backend=str(doc["backend"]), ranks=int(doc["ranks"]),
                           alpha=float(doc["alpha_us"]) * 1e-6, bandwidth=float(doc["bandwidth_gbps"]) * 1e9,
                           sizes_bytes=tuple(float(x) for x in doc.get("sizes_bytes", ())),
                           seconds=tuple(float(x) for x in doc.get("seconds", ())), machine=str(doc.get("machine", "")))
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"link profile {p}: field {e} missing or not a number; expected name, backend, ranks, "
                          "alpha_us, bandwidth_gbps.") from None
    if prof.bandwidth <= 0 or prof.alpha < 0 or prof.ranks < 2:
        raise ConfigError(f"link profile {p}: alpha_us {prof.alpha * 1e6}, bandwidth_gbps {prof.bandwidth / 1e9}, "
                          f"ranks {prof.ranks}; expected alpha >= 0, bandwidth > 0, ranks >= 2.")
    return prof
