"""Communication volumes of Speculative MoE §3.2 (EP, TP, s-TS), and LAR -> all-to-all bytes -> layer latency.

Units: volumes are per rank, in token vectors (multiply by hidden x dtype bytes for bytes); G ranks, a global
batch B of sequences of S tokens (B*S tokens per step), k experts per token, `lar` the local activation rate
(share of a token's routed assignments whose expert is already on its rank). The paper's preliminaries:

    AR = 2 (G-1) BS / G        AG = RS = (G-1) BS / G        A2A(lar) = (1 - lar) k BS / G

(the paper prints A2A as "alpha k B S / G" but evaluates it with the remote share 1 - alpha: its DS-MoE sum
uses (G-1)/G^2 for lar = 1/G, and its s-MoE sum k (1 - alpha); we follow the evaluated form.) Pipelines:
- DS-MoE-EP (TP attention, EP experts): AR -> A2A -> A2A -> AG with lar = 1/G
      = 3 BS (G-1)/G + 2 BS k (G-1)/G^2      (the paper's closed form BS (3 - 1/G - 2/G^2) is this at k = 1)
- TP everywhere (SGLang-TP): AR (attention) + AR (experts) = 4 BS (G-1)/G
- s-MoE (s-TS + s-EG): shuffled reduce-scatter -> A2A -> A2A = BS (G-1)/G + 2 BS k (1 - lar)/G
      = BS (1 + (2 k (1 - lar) - 1)/G)
  savings: vs DS-MoE-EP BS (2 - (2 k (1 - lar) + 2/G)/G) at k = 1 in the A2A of DS-MoE (as printed), vs TP
  BS (3 - (2 k (1 - lar) + 3)/G).
Seconds use the existing collectives of sim/cost.py (ring all-reduce / all-gather / reduce-scatter with their
alpha terms, all-to-all = alpha + busiest rank's volume / link), never a second copy of the link model.

For the serving simulator (routecast/serve/): ``a2a_for_lar(lar, ...)`` maps a local activation rate
to per-rank all-to-all bytes and the layer time of the existing layer cost model (cost.layer_cost with
local_fraction = lar and, for s-TS, the reduce-scatter in place of the all-reduce), vectorised over lar.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.sim.cost import (
    CostOptions,
    LayerCost,
    Workload,
    alltoall,
    layer_cost,
    ring_allgather,
    ring_allreduce,
    ring_reduce_scatter,
)
from routecast.sim.hardware import Hardware
from routecast.sim.models import ModelProfile

SCHEMES = ("ds-moe-ep", "tp", "s-moe")


def _check(G: Any, lar: Any = 0.0) -> tuple[np.ndarray, np.ndarray]:
    g = np.asarray(G, np.float64)
    a = np.asarray(lar, np.float64)
    if np.any(g < 1) or not np.all(np.isfinite(g)):
        raise ConfigError(f"ranks G is {G!r}; expected at least 1.")
    if np.any((a < 0) | (a > 1)) or not np.all(np.isfinite(a)):
        raise ConfigError(f"local activation rate is {lar!r}; expected fractions in [0, 1].")
    return g, a


def vol_allreduce(G: Any, B: Any, S: Any) -> np.ndarray:
    g, _ = _check(G)
    return 2.0 * (g - 1) * np.asarray(B, np.float64) * S / g


def vol_allgather(G: Any, B: Any, S: Any) -> np.ndarray:
    g, _ = _check(G)
    return (g - 1) * np.asarray(B, np.float64) * S / g


vol_reduce_scatter = vol_allgather


def vol_alltoall(G: Any, B: Any, S: Any, k: Any, lar: Any) -> np.ndarray:
    g, a = _check(G, lar)
    return (1.0 - a) * np.asarray(k, np.float64) * B * S / g


def volume(scheme: str, G: Any, B: Any, S: Any, k: Any, lar: Any = None) -> np.ndarray:
    """Per-rank token vectors one MoE layer moves under `scheme` (lar: s-MoE's rate; DS-MoE uses 1/G, TP none)."""
    g = np.asarray(G, np.float64)
    if scheme == "ds-moe-ep":
        return vol_allreduce(G, B, S) + 2 * vol_alltoall(G, B, S, k, 1.0 / g) + vol_allgather(G, B, S)
    if scheme == "tp":
        return 2 * vol_allreduce(G, B, S)
    if scheme == "s-moe":
        if lar is None:
            raise ConfigError("s-moe volume needs the local activation rate lar; expected a fraction in [0, 1].")
        return vol_reduce_scatter(G, B, S) + 2 * vol_alltoall(G, B, S, k, lar)
    raise ConfigError(f"scheme is {scheme!r}; expected one of {SCHEMES}.")


def saving_closed_form(G: Any, B: Any, S: Any, k: Any, lar: Any) -> dict[str, np.ndarray]:
    """The paper's printed savings of s-MoE: vs DS-MoE-EP (its A2A at k = 1) and vs TP (SGLang), token vectors."""
    g, a = _check(G, lar)
    bs = np.asarray(B, np.float64) * S
    return {"vs_ds_moe_ep": bs * (2 - (2 * k * (1 - a) + 2 / g) / g), "vs_tp": bs * (3 - (2 * k * (1 - a) + 3) / g)}


def comm_seconds(scheme: str, G: Any, B: Any, S: Any, k: Any, lar: Any, *, hidden: int, dtype_bytes: int,
                 bandwidth: Any, alpha: Any) -> np.ndarray:
    """Seconds of one layer's collectives under `scheme`, priced by sim/cost.py's collectives (alpha included)."""
    g = np.asarray(G, np.float64)
    tok = hidden * dtype_bytes
    full = np.asarray(B, np.float64) * S * tok  # the activation tensor each rank holds before the reduce
    if scheme == "ds-moe-ep":
        a2a = alltoall(vol_alltoall(G, B, S, k, 1.0 / g) * tok, g, bandwidth, alpha)
        return ring_allreduce(full, g, bandwidth, alpha) + 2 * a2a + ring_allgather(full, g, bandwidth, alpha)
    if scheme == "tp":
        return 2 * ring_allreduce(full, g, bandwidth, alpha)
    if scheme == "s-moe":
        a2a = alltoall(vol_alltoall(G, B, S, k, lar) * tok, g, bandwidth, alpha)
        return ring_reduce_scatter(full, g, bandwidth, alpha) + 2 * a2a
    raise ConfigError(f"scheme is {scheme!r}; expected one of {SCHEMES}.")


def a2a_for_lar(lar: Any, *, model: ModelProfile, hw: Hardware, ep: int, work: Workload | None = None,
                link: str = "nvlink", dedup: bool = False, scatter: str = "reduce_scatter") -> dict[str, Any]:
    """Per-layer all-to-all bytes and latency at local activation rate(s) `lar` (scalar or (C,)), for the serving
    simulator and the s-MoE benchmark.

    Expert loads are even (every expert gets B*S*k/E assignments, contiguous EP sharding over `ep` ranks); each
    rank's dispatch moves (1 - lar) of the assignments it receives, the combine the same back. scatter:
    "reduce_scatter" (s-TS's shuffled reduce-scatter) or "allreduce" (DS-MoE's TP all-reduce; then lar is what
    the tokens happen to have, 1/G for plain EP). Returns {'lar' (C,), 'a2a_bytes_per_rank' (C,) dispatch bytes of
    the busiest rank, 'a2a_bytes_total' (C,) dispatch bytes over all ranks, 'a2a_s' (C,) dispatch + combine
    seconds, 'layer_s' (C,) the layer's total, 'cost' (LayerCost)}.
    """
    work = work or Workload(batch=16, seq_len=512)
    lar_C = np.atleast_1d(np.asarray(lar, np.float64))
    _check(ep, lar_C)
    E, G, C = model.num_experts, int(ep), lar_C.size
    if E % G:
        raise ConfigError(f"ep is {ep}; expected a divisor of {model.name}'s {E} experts.")
    tokens = float(np.max(np.asarray(work.batch, np.float64) * np.asarray(work.seq_len, np.float64)))
    per_expert = tokens * model.top_k / E
    counts = np.zeros((C, G, E))
    counts[:, np.arange(E) // (E // G), np.arange(E)] = per_expert
    opts = CostOptions(link=link, attn_parallel="tp", tp_collective=scatter, dedup=dedup,
                       local_fraction=np.broadcast_to(lar_C[:, None], (C, G)))
    cost: LayerCost = layer_cost(counts, model=model, hw=hw, work=work, opts=opts)
    recv = counts.sum(-1)  # (C, G) assignments each rank's experts process
    bytes_CG = recv * (1.0 - lar_C[:, None]) * model.hidden_size * model.dtype_bytes
    return {"lar": lar_C, "a2a_bytes_per_rank": bytes_CG.max(-1), "a2a_bytes_total": bytes_CG.sum(-1),
            "a2a_s": cost.dispatch + cost.combine, "layer_s": cost.total, "cost": cost}
