"""SlotPlans from every placement method, and the expert-weight moves between two plans.

Legend: L MoE layers, E experts, S slots, G ranks, T steps.

  static_plan   expert e on slot e (rank e // (E / G)), one replica each;
  eplb_plan     place.eplb.rebalance_experts on (L, E) statistics, S = E + G * redundant_per_rank, tokens
                split evenly over replicas (hierarchical when groups % nodes == 0, global otherwise);
  moegps_plan   MoE-GPS Algorithm 1 (place.duplication.duplicate_experts) per layer on the statistics, from
                the sharded placement, at most `redundant_per_rank` new copies per rank (its memory budget) and
                c_max copies per expert; served_EG are the shares;
  probe_plans   PROBE Algorithm 2 (place.probe.plan_layers) for every step on that step's per-source-rank
                loads, from the sharded placement: E / G home slots per rank + max_redundant replica slots
                (empty where the planner placed none); n_LEG are the shares. One plan per step.
"""

from __future__ import annotations

import numpy as np

from routecast.common.errors import ConfigError
from routecast.place.duplication import duplicate_experts, sharded_placement
from routecast.place.eplb import rebalance_experts
from routecast.place.probe import plan_layers, token_costs
from routecast.place.slots import METHODS, SlotPlan

__all__ = ["METHODS", "eplb_plan", "moegps_plan", "probe_plans", "static_plan"]


def _layer_ids(layer_ids, L: int) -> tuple[int, ...]:
    return tuple(range(L)) if layer_ids is None else tuple(int(i) for i in layer_ids)


def _check_ranks(E: int, G: int) -> None:
    if isinstance(G, bool) or not isinstance(G, (int, np.integer)) or G < 1 or E % G:
        raise ConfigError(f"ranks (--ep / --nproc) is {G!r}; expected a positive divisor of the {E} experts.")


def static_plan(num_layers: int, num_experts: int, num_ranks: int, layer_ids=None) -> SlotPlan:
    """Sharded EP: slot s holds expert s."""
    _check_ranks(num_experts, num_ranks)
    slots = np.tile(np.arange(num_experts, dtype=np.int64), (num_layers, 1))
    return SlotPlan(slots_LS=slots, share_LS=np.ones(slots.shape), num_ranks=num_ranks, num_experts=num_experts,
                    layer_ids=_layer_ids(layer_ids, num_layers), method="static").validate()


def _stats(load_LE) -> np.ndarray:
    w = np.asarray(load_LE, np.float64)
    if w.ndim != 2 or 0 in w.shape or not np.isfinite(w).all() or (w < 0).any():
        raise ConfigError(f"load_LE has shape {w.shape}; expected finite (layers, experts) loads >= 0.")
    return w


def eplb_plan(load_LE, num_ranks: int, *, redundant_per_rank: int = 1, num_groups: int = 1, num_nodes: int = 1,
              layer_ids=None) -> SlotPlan:
    """EPLB (place.eplb) on (L, E) statistics -> SlotPlan with even shares."""
    w = _stats(load_LE)
    L, E = w.shape
    _check_ranks(E, num_ranks)
    if redundant_per_rank < 0:
        raise ConfigError(f"redundant_per_rank is {redundant_per_rank}; expected >= 0.")
    phy2log, _, _ = rebalance_experts(w, E + num_ranks * redundant_per_rank, num_groups, num_nodes, num_ranks)
    return SlotPlan(slots_LS=phy2log, share_LS=np.ones(phy2log.shape), num_ranks=num_ranks, num_experts=E,
                    layer_ids=_layer_ids(layer_ids, L), method="eplb").validate()


def _slots_from_copies(placement_LEG: np.ndarray, served_LEG: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(L, E, G) copies and served counts -> (slots_LS, share_LS), home experts first then replicas by id."""
    L, E, G = placement_LEG.shape
    per = E // G
    home = np.arange(E) // per
    slots = np.full((L, G, width), -1, np.int64)
    share = np.zeros((L, G, width))
    for lay in range(L):
        for g in range(G):
            held = np.flatnonzero(placement_LEG[lay, :, g])
            held = np.concatenate([held[home[held] == g], held[home[held] != g]])
            if held.size > width:
                raise ConfigError(f"layer {lay} rank {g} holds {held.size} experts; expected at most {width} slots.")
            slots[lay, g, :held.size] = held
            share[lay, g, :held.size] = served_LEG[lay, held, g]
    return slots.reshape(L, G * width), share.reshape(L, G * width)


def moegps_plan(load_LE, num_ranks: int, *, redundant_per_rank: int = 1, c_max: int | None = None,
                expert_bytes: int = 1, layer_ids=None) -> SlotPlan:
    """MoE-GPS Algorithm 1 per layer on integer (L, E) item counts -> SlotPlan (E / G + redundant slots a rank)."""
    w = _stats(load_LE)
    L, E = w.shape
    _check_ranks(E, num_ranks)
    P0 = sharded_placement(E, num_ranks)
    placement = np.zeros((L, E, num_ranks), bool)
    served = np.zeros((L, E, num_ranks))
    for lay in range(L):
        r = duplicate_experts(np.rint(w[lay]).astype(np.int64), P0, memory_G=np.full(num_ranks, redundant_per_rank * expert_bytes),
                              expert_bytes=expert_bytes, c_max=c_max)
        placement[lay], served[lay] = r.placement_EG, r.served_EG
    slots, share = _slots_from_copies(placement, served, E // num_ranks + redundant_per_rank)
    return SlotPlan(slots_LS=slots, share_LS=share, num_ranks=num_ranks, num_experts=E,
                    layer_ids=_layer_ids(layer_ids, L), method="moe-gps").validate()


def probe_plans(load_TLGE, *, k_max: int = 16, max_redundant: int = 3, hide_window_s: float = np.inf,
                layer_ids=None) -> list[SlotPlan]:
    """PROBE Algorithm 2 on each step's (L, G, E) per-source-rank loads -> one SlotPlan per step.

    Latency is tokens (place.probe.token_costs: one transfer costs 1, the window is in transfers; the default
    np.inf leaves the budget to max_redundant and k_max).
    """
    x = np.asarray(load_TLGE)
    if x.ndim != 4 or 0 in x.shape:
        raise ConfigError(f"load_TLGE has shape {x.shape}; expected (steps, layers, ranks, experts).")
    T, L, G, E = x.shape
    _check_ranks(E, G)
    P0 = sharded_placement(E, G)
    costs = token_costs()
    plans = []
    for t in range(T):
        p = plan_layers(x[t], P0, costs=costs, hide_window_s=hide_window_s, k_max=k_max, max_redundant=max_redundant)
        slots, share = _slots_from_copies(p.placement_LEG, p.n_LEG, E // G + max_redundant)
        plans.append(SlotPlan(slots_LS=slots, share_LS=share, num_ranks=G, num_experts=E,
                              layer_ids=_layer_ids(layer_ids, L), method="probe").validate())
    return plans
