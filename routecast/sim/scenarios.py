"""MoE-GPS scenarios as pure functions: skewed loads, placements, prediction errors, and the three strategies.

Building blocks (all vectorised over C configurations; G ranks, E experts):
    skew_loads(skewness (C,), E, total (C,))  -> loads (C, E)     hottest expert = skewness x mean (MoE-GPS §2)
    sharded_counts(loads (C, E), G)           -> counts (C, G, E) expert e on rank e * G // E, no replicas
    counts_from_placement(loads, share (G, E)) -> counts (C, G, E) any replica map (shares per expert sum to 1)
    balanced_counts(counts (C, G, E))         -> counts (C, G, E) home-first, hottest-first rebalancing
    replica_bytes(before, after, bytes)       -> (C, G)           weights each rank must receive
    apply_error(counts, error (C,), model)    -> counts           MoE-GPS §3.3 error models on the busiest rank
and `strategy_cost`, which prices one strategy at given skewness / accuracy / overhead with cost.layer_cost:

    "none"          sharded experts, no prediction.
    "distribution"  Distribution-Only Prediction (MoE-GPS §3.2.1): experts duplicated from a predicted
                    distribution of error `dist_error` (averaged L1 distance / E); tokens are still scattered
                    at random, so the all-to-all volume stays that of "none" as the paper models it
                    (`dist_balances_comm=True` charges the balanced volume instead). No overhead by default
                    (the distribution is estimated offline).
    "token"         Token-to-Expert Prediction (MoE-GPS §3.2.2) at `accuracy`: balanced experts with error
                    1 - accuracy, the dispatch scatter skipped except for misrouted tokens, `overhead_s` of
                    predictor time on the critical path.

How duplication is priced (`placement`):
    "replicas"  the explicit plan of `balanced_counts`: each replica fragment is a GEMM of its own and pays a
                full weight read, so a few tokens on a replica of a large expert cost W / HBM_eff (PROBE's
                fragmentation penalty). With Mixtral-8x7B at 512 tokens on 4 A100s this makes duplication
                slower than no prediction.
    "ideal"     MoE-GPS's assumption: after duplication every rank runs its own experts at the mean load
                (as at skewness 1), times the error model's factor.

The advisor ranks strategies by `strategy_cost(...).total`; every argument that varies across a sweep may be a
(C,) array, so a whole skewness x accuracy grid is one call per strategy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.sim.cost import CostOptions, LayerCost, Workload, layer_cost, moe_gps_options
from routecast.sim.hardware import Hardware
from routecast.sim.models import ModelProfile

STRATEGIES = ("none", "distribution", "token")
ERROR_MODELS = ("optimistic", "typical", "pessimistic")
PLACEMENTS = ("replicas", "ideal")


def skew_loads(skewness: Any, *, num_experts: int, total: Any) -> np.ndarray:
    """(C,) skewness, (C,) or scalar total assignments -> (C, E) per-expert loads (float).

    Expert 0 gets skewness x total / E; the other E - 1 share the remainder equally (MoE-GPS §2's skewness:
    tokens of the most popular expert over the mean). Skewness must lie in [1, E].
    """
    s = np.atleast_1d(np.asarray(skewness, dtype=np.float64))
    if s.ndim != 1 or np.any(s < 1.0) or np.any(s > num_experts):
        raise ConfigError(f"skewness is {skewness!r}; expected values in [1, num_experts = {num_experts}].")
    tot = np.broadcast_to(np.asarray(total, dtype=np.float64), s.shape)
    mean = tot / num_experts
    loads = np.empty((s.shape[0], num_experts))
    loads[:, 0] = s * mean
    if num_experts > 1:
        loads[:, 1:] = ((tot - s * mean) / (num_experts - 1))[:, None]
    return loads


def home_ranks(num_experts: int, num_ranks: int) -> np.ndarray:
    """(E,) home rank of each expert under contiguous sharding: e * G // E."""
    if num_ranks < 1 or num_ranks > num_experts:
        raise ConfigError(f"num_ranks is {num_ranks}; expected 1..num_experts = {num_experts}.")
    return np.arange(num_experts) * num_ranks // num_experts


def sharded_counts(loads: Any, num_ranks: int) -> np.ndarray:
    """(C, E) or (E,) loads -> (C, G, E) counts with every expert only on its home rank."""
    L = np.atleast_2d(np.asarray(loads, dtype=np.float64))
    C, E = L.shape
    onehot = home_ranks(E, num_ranks)[None, :] == np.arange(num_ranks)[:, None]  # (G, E)
    return L[:, None, :] * onehot[None]


def counts_from_placement(loads: Any, share: Any) -> np.ndarray:
    """(C, E) loads and a placement share (G, E) or (C, G, E) -> (C, G, E) counts.

    share[g, e] is the fraction of expert e's tokens processed on rank g (a replica map: each column sums to
    1; an expert with replicas has several non-zero entries, e.g. 0.5 / 0.5 for an even split).
    """
    L = np.atleast_2d(np.asarray(loads, dtype=np.float64))
    S = np.asarray(share, dtype=np.float64)
    if S.ndim not in (2, 3) or S.shape[-1] != L.shape[-1]:
        raise ConfigError(f"share has shape {S.shape}; expected (G, {L.shape[-1]}) or (C, G, {L.shape[-1]}).")
    col = S.sum(axis=-2)
    if np.any(S < 0) or not np.allclose(col, 1.0, atol=1e-6):
        raise ConfigError("share has a column that is negative or does not sum to 1; expected each expert's "
                          "token shares over ranks to sum to 1.")
    return L[:, None, :] * (S if S.ndim == 3 else S[None])


def balanced_counts(counts: Any) -> np.ndarray:
    """(C, G, E) counts -> (C, G, E) counts with every rank at the mean load, moving as little as possible.

    Each overloaded rank keeps its coldest experts and trims its hottest ones down to a common water level
    (so only hot experts get replicas); the trimmed tokens fill the underloaded ranks in rank order (the
    north-west-corner transport plan), so each trimmed expert lands on a contiguous run of ranks.
    """
    n = np.asarray(counts, dtype=np.float64)
    C, G, E = n.shape
    load = n.sum(-1)  # (C, G)
    target = load.mean(-1, keepdims=True)  # (C, 1)
    # Water level per rank: sum_e min(n_e, level) = target, solved exactly on the sorted loads.
    s = -np.sort(-n, axis=-1)  # descending
    cum = np.cumsum(s, axis=-1)
    j = np.arange(1, E + 1, dtype=np.float64)
    rest = load[..., None] - cum  # sum of the entries below the j top ones
    level = (target[..., None] - rest) / j  # level if exactly the top j entries are capped
    below = np.concatenate([s[..., 1:], np.zeros((C, G, 1))], axis=-1)
    ok = (level >= below - 1e-9) & (level <= s + 1e-9)
    first = np.argmax(ok, axis=-1)
    lvl = np.take_along_axis(level, first[..., None], axis=-1)
    lvl = np.where(load[..., None] > target[..., None], lvl, np.inf)
    kept = np.minimum(n, lvl)
    shed = (n - kept).reshape(C, G * E)
    deficit = np.maximum(target - kept.sum(-1), 0.0)  # (C, G)
    # Overlap of the shed intervals (laid out over (g, e)) with the deficit intervals (over ranks).
    s_hi = np.cumsum(shed, axis=-1)
    s_lo = s_hi - shed
    d_hi = np.cumsum(deficit, axis=-1)
    d_lo = d_hi - deficit
    moved = np.clip(
        np.minimum(s_hi[:, None, :], d_hi[:, :, None]) - np.maximum(s_lo[:, None, :], d_lo[:, :, None]), 0.0, None
    )  # (C, G_dst, G_src * E)
    return kept + moved.reshape(C, G, G, E).sum(axis=2)


def replica_bytes(before: Any, after: Any, expert_bytes: float) -> np.ndarray:
    """(C, G, E) counts before and after rebalancing -> (C, G) expert-weight bytes each rank must receive."""
    new = (np.asarray(after) > 1e-9) & (np.asarray(before) <= 1e-9)
    return new.sum(-1) * float(expert_bytes)


def apply_error(counts: Any, error: Any, model: str = "typical") -> np.ndarray:
    """MoE-GPS §3.3: scale the busiest rank's counts for prediction error `error` (C,) under `model`.

    optimistic: unchanged; typical: x (1 + error) (errors spread over ranks, the default in MoE-GPS);
    pessimistic: x (1 + error (G - 1)) (all errors land on one rank).
    """
    if model not in ERROR_MODELS:
        raise ConfigError(f"error model is {model!r}; expected one of {list(ERROR_MODELS)}.")
    n = np.array(counts, dtype=np.float64)
    C, G, _ = n.shape
    eps = np.broadcast_to(np.asarray(error, dtype=np.float64), (C,))
    if np.any(eps < 0):
        raise ConfigError(f"prediction error is {error!r}; expected values >= 0.")
    if model == "optimistic":
        return n
    factor = 1.0 + eps * (1.0 if model == "typical" else G - 1.0)
    busiest = n.sum(-1).argmax(-1)
    n[np.arange(C), busiest] *= factor[:, None]
    return n


def strategy_cost(
    strategy: str,
    *,
    model: ModelProfile,
    hw: Hardware,
    skewness: Any,
    num_ranks: int,
    work: Workload | None = None,
    opts: CostOptions | None = None,
    accuracy: Any = 1.0,
    dist_error: Any = 0.0,
    overhead_s: Any = 0.0,
    error_model: str = "typical",
    dist_balances_comm: bool = False,
    charge_transfer: bool = False,
    placement: str = "replicas",
) -> LayerCost:
    """Layer time of one MoE-GPS strategy ("none" | "distribution" | "token") for C configurations.

    skewness, accuracy, dist_error, overhead_s: scalars or (C,) arrays (broadcast together).
    work: default prefill(1, 512) (MoE-GPS Figure 6); opts: default moe_gps_options("nvlink").
    charge_transfer: price replica traffic (hidden behind attention up to its length, MoE-GPS §5);
    MoE-GPS assumes it is fully hidden, so it is off by default.
    placement: "replicas" | "ideal" (see the module docstring).
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy is {strategy!r}; expected one of {list(STRATEGIES)}.")
    if placement not in PLACEMENTS:
        raise ConfigError(f"placement is {placement!r}; expected one of {list(PLACEMENTS)}.")
    work = work or Workload()
    opts = opts or moe_gps_options()
    acc = np.asarray(accuracy, dtype=np.float64)
    if np.any((acc < 0) | (acc > 1)):
        raise ConfigError(f"accuracy is {accuracy!r}; expected values in [0, 1].")
    s, acc, derr, ovh = np.broadcast_arrays(
        np.atleast_1d(np.asarray(skewness, np.float64)), acc, np.asarray(dist_error, np.float64),
        np.asarray(overhead_s, np.float64),
    )
    C = s.shape[0]
    tokens = np.broadcast_to(np.asarray(work.batch, np.float64) * np.asarray(work.seq_len, np.float64), (C,))
    base = sharded_counts(skew_loads(s, num_experts=model.num_experts, total=tokens * model.top_k), num_ranks)
    if strategy == "none":
        return layer_cost(base, model=model, hw=hw, work=work, opts=opts)
    bal = balanced_counts(base)
    if placement == "ideal":
        even = sharded_counts(skew_loads(np.ones(C), num_experts=model.num_experts, total=tokens * model.top_k), num_ranks)
    else:
        even = bal
    xfer = replica_bytes(base, bal, model.expert_bytes()) if charge_transfer else 0.0
    if strategy == "distribution":
        counts = apply_error(even, derr, error_model)
        recv = counts.sum(-1) if dist_balances_comm else base.sum(-1)
        o = dataclasses.replace(opts, predict_s=ovh, transfer_bytes=xfer)
        return layer_cost(counts, model=model, hw=hw, work=work, opts=o, recv=recv)
    eps = 1.0 - acc
    counts = apply_error(even, eps, error_model)
    o = dataclasses.replace(opts, predict_s=ovh, transfer_bytes=xfer, skip_scatter=True, misroute_fraction=eps)
    return layer_cost(counts, model=model, hw=hw, work=work, opts=o)
