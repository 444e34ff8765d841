"""MoE-GPS Algorithm 1: expert duplication for load balance (token-level, memory- and copy-limited).

Legend: T tokens, K top-k, E experts, G GPUs (expert-parallel ranks).

The paper states the algorithm over single tokens with a top-1 map f(t). With top-k routing every
(token, k) slot is one unit of work, so here an "item" is a (token, k) slot and f maps items to
experts. The loop of the paper only ever needs, per GPU, how many items of each expert it serves, so
it runs on the count matrix n_EG (E x G) — O(E + G) per iteration, never a loop over tokens — and the
token-level dispatch d(t) is materialised at the end in one vectorised pass ("the first l tokens"
of the paper = the earliest items of that expert, in trace order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from routecast.common.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class DuplicationResult:
    """Output of Algorithm 1.

    placement_EG: bool (E, G), expert e has a copy on GPU g (initial copies included).
    served_EG: int64 (E, G), items of expert e processed on GPU g (sums over g to the expert's load).
    load_G: int64 (G,), items per GPU after balancing; start_load_G before.
    copies_E: int64 (E,), number of GPUs holding expert e.
    memory_used_G: bytes of expert weights on each GPU.
    iterations: loop iterations run; moves: list of (expert, from_gpu, to_gpu, items, new_copy).
    """

    placement_EG: np.ndarray
    served_EG: np.ndarray
    load_G: np.ndarray
    start_load_G: np.ndarray
    copies_E: np.ndarray
    memory_used_G: np.ndarray
    iterations: int
    moves: list[tuple[int, int, int, int, bool]]

    @property
    def imbalance(self) -> float:
        """max_g load / mean_g load after balancing (PROBE's IR at GPU granularity)."""
        m = self.load_G.mean()
        return float(self.load_G.max() / m) if m > 0 else 1.0

    @property
    def start_imbalance(self) -> float:
        m = self.start_load_G.mean()
        return float(self.start_load_G.max() / m) if m > 0 else 1.0

    @property
    def new_copies(self) -> int:
        return sum(1 for *_, new in self.moves if new)


def sharded_placement(num_experts: int, num_gpus: int) -> np.ndarray:
    """Contiguous static sharding: expert e on GPU e // (E / G). Returns bool (E, G)."""
    if num_gpus < 1 or num_experts % num_gpus:
        raise ConfigError(f"num_gpus is {num_gpus}; expected a positive divisor of num_experts = {num_experts}.")
    p = np.zeros((num_experts, num_gpus), dtype=bool)
    p[np.arange(num_experts), np.arange(num_experts) // (num_experts // num_gpus)] = True
    return p


def duplicate_experts(
    load_E: np.ndarray,
    placement_EG: np.ndarray,
    *,
    memory_G: np.ndarray | None = None,
    expert_bytes: int | np.ndarray = 1,
    c_max: int | None = None,
    max_iters: int = 100_000,
) -> DuplicationResult:
    """Algorithm 1 of MoE-GPS on per-expert item counts.

    load_E: int (E,) items routed to each expert (for top-k, count every (token, k) slot).
    placement_EG: bool (E, G) initial placement P; every expert with load needs at least one copy.
    memory_G: bytes of free memory for extra copies on each GPU (None = unlimited).
    expert_bytes: bytes of one expert (scalar or (E,)). c_max: max copies per expert (None = G).
    Step 1 sends each item to the lowest-numbered GPU holding its expert. Then, while
    max_g L - min_g L > 1: take the heaviest GPU gh and the lightest gc, l = ceil((L_gh - L_gc) / 2),
    the expert e* with the most items on gh; if gc lacks e*, copy it there when copies(e*) < c_max and
    its bytes fit in gc's memory; move min(l, items of e* on gh) items to gc. When e* cannot be placed
    on gc the next-heaviest expert of gh is tried (the paper leaves this case open; stopping there
    would strand balance that another expert can still fix); the loop ends when no expert can move.
    """
    load_E = np.asarray(load_E, dtype=np.int64)
    P = np.array(placement_EG, dtype=bool, copy=True)
    E, G = P.shape if P.ndim == 2 else (0, 0)
    if load_E.shape != (E,):
        raise ConfigError(f"load_E has shape {load_E.shape}; expected ({E},) to match placement_EG {P.shape}.")
    if (load_E < 0).any():
        raise ConfigError("load_E holds a negative count; expected non-negative item counts.")
    homeless = np.flatnonzero((load_E > 0) & ~P.any(axis=1))
    if homeless.size:
        raise ConfigError(f"expert {int(homeless[0])} has load but no GPU in placement_EG; expected a copy somewhere.")
    c_max = G if c_max is None else int(c_max)
    bytes_E = np.broadcast_to(np.asarray(expert_bytes, dtype=np.int64), (E,))
    mem = np.full(G, np.iinfo(np.int64).max, dtype=np.int64) if memory_G is None else np.array(memory_G, np.int64)
    if mem.shape != (G,):
        raise ConfigError(f"memory_G has shape {mem.shape}; expected ({G},).")
    used = np.zeros(G, dtype=np.int64)

    # Step 1: d(t) = min{g : (f(t), g) in P}.
    first_g = np.argmax(P, axis=1)
    served = np.zeros((E, G), dtype=np.int64)
    served[np.arange(E), first_g] = load_E
    L = served.sum(axis=0)
    start = L.copy()
    moves: list[tuple[int, int, int, int, bool]] = []
    it = 0
    while it < max_iters and L.max() - L.min() > 1:
        it += 1
        gh, gc = int(np.argmax(L)), int(np.argmin(L))
        ell = (int(L[gh]) - int(L[gc]) + 1) // 2
        # Candidates on gh, hottest first; keep those that can be served by gc.
        cand = np.argsort(-served[:, gh], kind="stable")
        cand = cand[served[cand, gh] > 0]
        can_copy = (P[cand, :].sum(axis=1) < c_max) & (bytes_E[cand] <= mem[gc] - used[gc])
        ok = P[cand, gc] | can_copy
        if not ok.any():
            break
        e = int(cand[np.argmax(ok)])
        new = not P[e, gc]
        if new:
            P[e, gc] = True
            used[gc] += bytes_E[e]
        n = min(ell, int(served[e, gh]))
        served[e, gh] -= n
        served[e, gc] += n
        L[gh] -= n
        L[gc] += n
        moves.append((e, gh, gc, n, new))
    return DuplicationResult(
        placement_EG=P,
        served_EG=served,
        load_G=L,
        start_load_G=start,
        copies_E=P.sum(axis=1),
        memory_used_G=used,
        iterations=it,
        moves=moves,
    )


def dispatch_items(expert_of_item: np.ndarray, served_EG: np.ndarray) -> np.ndarray:
    """Token-level dispatch d: items of expert e go, in order, to GPUs g = 0.. with served_EG[e, g] each.

    expert_of_item: int (N,) expert of each item (-1 = dropped, dispatched to -1).
    served_EG: (E, G) from duplicate_experts; its row sums must equal the item counts per expert.
    Returns int64 (N,) GPU of each item. Vectorised: rank of each item within its expert, then a
    searchsorted against the expert's cumulative served counts.
    """
    f = np.asarray(expert_of_item, dtype=np.int64)
    E, G = served_EG.shape
    out = np.full(f.shape, -1, dtype=np.int64)
    valid = f >= 0
    fv = f[valid]
    counts = np.bincount(fv, minlength=E)
    if (counts != served_EG.sum(axis=1)).any():
        raise ConfigError("dispatch_items: served_EG row sums differ from the item counts per expert.")
    order = np.argsort(fv, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty_like(fv)
    rank[order] = np.arange(fv.size) - np.repeat(starts, counts)
    cum = np.cumsum(served_EG, axis=1)  # (E, G)
    # GPU = number of cumulative bounds <= rank, per item's expert row (vectorised searchsorted).
    g = (cum[fv] <= rank[:, None]).sum(axis=1)
    out[valid] = g
    return out
