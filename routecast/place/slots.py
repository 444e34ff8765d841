"""Physical expert slots: the plan an expert-parallel runtime (or a serving engine) executes.

Legend: L MoE layers, E logical experts, S physical slots, G ranks, N items ((token, k) pairs of one layer).

A SlotPlan says, per MoE layer, which logical expert each physical slot holds (slot s lives on rank
s // (S / G), SGLang's and vLLM's convention) and what share of its expert's tokens each slot takes:
  static EP   slot s holds expert s, share 1;
  EPLB        place.eplb.rebalance_experts' phy2log, tokens split evenly over an expert's replicas;
  MoE-GPS     Algorithm 1 (place.duplication) on the plan's loads: copies and served_EG as the shares;
  PROBE       Algorithm 2 (place.probe) per step: home experts plus replicas, n_LEG as the shares.
Slots that hold nothing are -1 (a rank with fewer replicas than the widest rank); a rank never loads them.

Token -> slot assignment (assign_items), the same for every method so that only the plan differs:
  quotas   an expert's n_e items are split over its slots in proportion to the shares, integers by the
           largest remainder (ties: lower slot); a plan computed on these very loads is reproduced exactly;
  local    items whose source rank holds a slot of their expert stay there, up to that rank's quota
           (SGLang's static dispatch also prefers a same-rank replica), earliest items first;
  remote   the rest fill the remaining quotas in slot order, items in token order.
So per (expert, rank) the processed items are exactly the quotas, and the items sent and received by each
rank follow from the counts alone (sim.a2a.ep_a2a_bytes predicts them without this code).

weight_moves(old, new) lists the copies a re-plan implies: every expert a rank hosts in `new` but did not
host in `old` is received once from one old holder, the one that has sent the fewest so far (ties: lowest
rank), as place.compare.eplb_transfers counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from routecast.common.errors import ConfigError

METHODS = ("static", "eplb", "moe-gps", "probe")  # the builders of place.slot_plans


@dataclass(frozen=True, kw_only=True)
class SlotPlan:
    """slots_LS int64 (L, S): logical expert per physical slot (-1 empty); share_LS float64 (L, S) >= 0.

    num_ranks: G (S % G == 0); num_experts: E; layer_ids: model layer index of each MoE layer (length L);
    method: the planner's name. Call validate() before use (the constructor does not, so that a bad plan
    read from a file is reported by validate's one sentence).
    """

    slots_LS: np.ndarray
    share_LS: np.ndarray
    num_ranks: int
    num_experts: int
    layer_ids: tuple[int, ...]
    method: str = "static"

    @property
    def num_layers(self) -> int:
        return int(self.slots_LS.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.slots_LS.shape[1])

    @property
    def slots_per_rank(self) -> int:
        return self.num_slots // self.num_ranks

    def rank_of_slot(self) -> np.ndarray:
        """(S,) int64 rank of every slot."""
        return np.arange(self.num_slots) // self.slots_per_rank

    def validate(self, where: str = "plan") -> SlotPlan:
        """Refuse a plan the runtime cannot execute, with one sentence; returns self."""
        s = np.asarray(self.slots_LS)
        w = np.asarray(self.share_LS)
        G, E = self.num_ranks, self.num_experts
        if isinstance(G, bool) or not isinstance(G, (int, np.integer)) or G < 1:
            raise ConfigError(f"{where}: num_ranks is {G!r}; expected a positive integer.")
        if isinstance(E, bool) or not isinstance(E, (int, np.integer)) or E < 1:
            raise ConfigError(f"{where}: num_experts is {E!r}; expected a positive integer.")
        if s.ndim != 2 or 0 in s.shape or s.dtype.kind not in "iu":
            raise ConfigError(f"{where}: slots has shape {s.shape} and dtype {s.dtype}; expected integer (layers, slots).")
        if w.shape != s.shape:
            raise ConfigError(f"{where}: shares have shape {w.shape}; expected {s.shape} like the slots.")
        if s.shape[1] % G:
            raise ConfigError(f"{where}: {s.shape[1]} slots per layer do not divide over {G} ranks; "
                              "expected a slot count divisible by the rank count.")
        if len(self.layer_ids) != s.shape[0]:
            raise ConfigError(f"{where}: {len(self.layer_ids)} layer ids for {s.shape[0]} layers; expected one per layer.")
        bad = (s < -1) | (s >= E)
        if bad.any():
            lay, slot = map(int, np.argwhere(bad)[0])
            raise ConfigError(f"{where}: layer {lay} slot {slot} holds expert {int(s[lay, slot])}; "
                              f"expected -1 (empty) or an id in 0..{E - 1}.")
        if not np.isfinite(w).all() or (w < 0).any():
            raise ConfigError(f"{where}: a share is negative or not finite; expected finite shares >= 0.")
        count = replica_counts(s, E)
        if (count == 0).any():
            lay, e = map(int, np.argwhere(count == 0)[0])
            raise ConfigError(f"{where}: expert {e} of layer {lay} has no slot; expected every expert on at least one slot.")
        return self

    def quotas(self, lay: int, load_E: np.ndarray) -> np.ndarray:
        """(S,) int64 items of each slot of layer `lay` for per-expert loads (E,) (largest remainder)."""
        return slot_quotas(self.slots_LS[lay], self.share_LS[lay], load_E)

    def served_GE(self, lay: int, load_E: np.ndarray) -> np.ndarray:
        """(G, E) int64 items of expert e processed on rank g under this plan."""
        q = self.quotas(lay, load_E)
        s = self.slots_LS[lay]
        out = np.zeros((self.num_ranks, self.num_experts), np.int64)
        ok = s >= 0
        np.add.at(out, (self.rank_of_slot()[ok], s[ok]), q[ok])
        return out


def replica_counts(slots_LS: np.ndarray, num_experts: int) -> np.ndarray:
    """(L, E) int64 slots holding each expert (-1 slots ignored)."""
    s = np.asarray(slots_LS, np.int64)
    L = s.shape[0]
    ok = s >= 0
    key = (s + np.arange(L)[:, None] * num_experts)[ok]
    return np.bincount(key, minlength=L * num_experts).reshape(L, num_experts)


def slot_quotas(slots_S: np.ndarray, share_S: np.ndarray, load_E: np.ndarray) -> np.ndarray:
    """(S,) int64 items per slot: n_e split over e's slots by share, largest remainder, ties to lower slots.

    An expert whose slots all have share 0 is split evenly over them.
    """
    s = np.asarray(slots_S, np.int64)
    n = np.asarray(load_E, np.int64)
    E = n.size
    ok = s >= 0
    e = np.where(ok, s, 0)
    w = np.where(ok, np.asarray(share_S, np.float64), 0.0)
    tot = np.bincount(e[ok], weights=w[ok], minlength=E)
    cnt = np.bincount(e[ok], minlength=E)
    even = tot[e] <= 0
    frac = np.where(even, 1.0 / np.maximum(cnt[e], 1), w / np.where(even, 1.0, tot[e]))
    raw = np.where(ok, n[e] * frac, 0.0)
    base = np.floor(raw + 1e-9).astype(np.int64)
    base = np.minimum(base, np.where(ok, n[e], 0))
    deficit = n - np.bincount(e[ok], weights=base[ok], minlength=E).astype(np.int64)
    rem = np.where(ok, raw - base, -np.inf)
    order = np.lexsort((np.arange(s.size), -rem, np.where(ok, e, E)))  # by expert, largest remainder first
    grp = np.where(ok, e, E)[order]
    start = np.searchsorted(grp, grp, side="left")
    rank_in = np.arange(s.size) - start
    give = np.zeros(s.size, bool)
    give[order] = (grp < E) & (rank_in < np.append(deficit, 0)[grp])
    return base + give


def _rank_within(key: np.ndarray) -> np.ndarray:
    """Position of every element among the earlier elements with the same key (stable, vectorised)."""
    order = np.argsort(key, kind="stable")
    k = key[order]
    start = np.searchsorted(k, k, side="left")
    out = np.empty(key.size, np.int64)
    out[order] = np.arange(key.size) - start
    return out


def assign_items(expert_N: np.ndarray, src_N: np.ndarray, plan: SlotPlan, lay: int) -> np.ndarray:
    """(N,) int64 physical slot of every item of layer `lay` (-1 for dropped items, expert -1).

    expert_N: (N,) logical expert of each (token, k) item in token order; src_N: (N,) rank holding its token.
    Locality-first within the plan's quotas (module docstring).
    """
    e_all = np.asarray(expert_N, np.int64)
    src_all = np.asarray(src_N, np.int64)
    G, E = plan.num_ranks, plan.num_experts
    out = np.full(e_all.size, -1, np.int64)
    valid = e_all >= 0
    e, src = e_all[valid], src_all[valid]
    if e.size and (e.max() >= E or src.min() < 0 or src.max() >= G):
        raise ConfigError(f"routing of layer {lay} holds expert {int(e.max())} or rank {int(src.max())}; "
                          f"expected experts < {E} and ranks < {G}.")
    slots, rank_s = plan.slots_LS[lay], plan.rank_of_slot()
    q = plan.quotas(lay, np.bincount(e, minlength=E))
    okS = slots >= 0
    Q = np.zeros((E, G), np.int64)
    np.add.at(Q, (slots[okS], rank_s[okS]), q[okS])
    # local: the first Q[e, src] items of (e, src) stay on src
    pinned = _rank_within(e * G + src) < Q[e, src]
    dst = np.where(pinned, src, -1)
    P = np.zeros((E, G), np.int64)
    np.add.at(P, (e[pinned], src[pinned]), 1)
    R = Q - P  # quota left per (expert, rank) after the local items
    # remote: unpinned items of e, in token order, fill R[e, 0..G-1]
    un = ~pinned
    u_rank = _rank_within(e[un])
    cumR = np.cumsum(R, axis=1)
    dst[un] = (cumR[e[un]] <= u_rank[:, None]).sum(axis=1)
    # slot within the rank: items of (e, dst) in token order fill that rank's slots of e by slot quota
    order = np.lexsort((np.arange(slots.size), rank_s, np.where(okS, slots, E)))
    cq = np.cumsum(np.where(okS, q, 0)[order])
    first = np.full((E + 1) * G, slots.size, np.int64)
    key_s = np.where(okS, slots, E)[order] * G + rank_s[order]
    np.minimum.at(first, key_s, np.arange(slots.size))
    base = np.where(first < slots.size, cq[np.minimum(first, slots.size - 1)] - np.where(okS, q, 0)[order][
        np.minimum(first, slots.size - 1)], 0)
    pos = base[e * G + dst] + _rank_within(e * G + dst)
    out[valid] = order[np.searchsorted(cq, pos, side="right")]
    return out


def hosted(plan: SlotPlan) -> np.ndarray:
    """(L, E, G) bool: rank g holds at least one slot of expert e."""
    L, S = plan.slots_LS.shape
    out = np.zeros((L, plan.num_experts, plan.num_ranks), bool)
    ok = plan.slots_LS >= 0
    lay = np.repeat(np.arange(L), S).reshape(L, S)
    out[lay[ok], plan.slots_LS[ok], np.broadcast_to(plan.rank_of_slot(), (L, S))[ok]] = True
    return out


def weight_moves(old: SlotPlan, new: SlotPlan) -> np.ndarray:
    """(M, 4) int64 rows (layer, expert, src_rank, dst_rank): the copies `new` needs that `old` lacks."""
    if (old.num_ranks, old.num_experts, old.num_layers) != (new.num_ranks, new.num_experts, new.num_layers):
        raise ConfigError("plans differ in ranks, experts or layers; expected the same geometry for a re-plan.")
    had, has = hosted(old), hosted(new)
    need = np.argwhere(has & ~had)  # (layer, expert, dst) in order
    sent = np.zeros((old.num_layers, old.num_ranks), np.int64)
    rows = np.empty((len(need), 4), np.int64)
    for i, (lay, e, g) in enumerate(need):  # sequential: each choice depends on the sends chosen before it
        holders = np.flatnonzero(had[lay, e])
        src = holders[np.argmin(sent[lay, holders])]
        sent[lay, src] += 1
        rows[i] = (lay, e, src, g)
    return rows
