"""EPLB-style replication and packing: the expert-parallel load balancer engines deploy today.

Legend: L MoE layers, E logical experts, S physical slots (= num_replicas), G GPUs, M max replicas of one
expert (S - E + 1), N items being packed, P packs, W steps in a statistics window, T steps of a run.

Written from the published description of DeepSeek's EPLB (see ../shared/ANCHORS.md), not from its code:

- Hierarchical policy (num_groups % num_nodes == 0): (1) experts form num_groups contiguous groups; groups
  are packed onto nodes, exactly groups/nodes per node, largest first into the lightest non-full node;
  (2) inside each node every extra slot goes, one at a time, to the expert with the highest load per
  replica; (3) the node's replicas (load / count each) are packed onto its GPUs, exactly slots/gpus per
  GPU, largest first into the lightest non-full GPU.
- Global policy otherwise: the same with one group and one node.
- Slot s lives on GPU s // (S / G); tokens of an expert are split evenly over its replicas.

It replicates before it packs and knows nothing of the old placement or of how fast loads drift; the
deployment wrappers below reproduce how engines run it (statistics over a window of steps, a rebalance
every N steps, or once after a warm-up) so that its stale placements can be measured on later steps.
Every function is batched over layers; the greedy loops run over items (slots) with layers vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from routecast.common.errors import ConfigError


# ---- the three greedy steps ------------------------------------------------------------------------------
def balanced_packing(weight_LN: np.ndarray, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack N items into num_packs packs of exactly N / num_packs items each, per layer.

    weight_LN: (L, N) item weights. Items are taken heaviest first (ties: lower index first) and each goes
    into the lightest pack that is not yet full (ties: lower pack index).
    Returns (pack_LN, rank_LN) int64: the pack of every item and its position inside that pack.
    """
    w = np.asarray(weight_LN, dtype=np.float64)
    L, N = w.shape
    if num_packs < 1 or N % num_packs:
        raise ConfigError(f"num_packs is {num_packs}; expected a positive divisor of the {N} items to pack.")
    per_pack = N // num_packs
    pack = np.zeros((L, N), dtype=np.int64)
    rank = np.zeros((L, N), dtype=np.int64)
    if per_pack == N:  # one pack: everything in it, in index order
        rank[:] = np.arange(N)
        return pack, rank
    order_LN = np.argsort(-w, axis=1, kind="stable")
    load_LP = np.zeros((L, num_packs))
    count_LP = np.zeros((L, num_packs), dtype=np.int64)
    rows = np.arange(L)
    for j in range(N):
        item = order_LN[:, j]
        p = np.argmin(np.where(count_LP < per_pack, load_LP, np.inf), axis=1)
        pack[rows, item] = p
        rank[rows, item] = count_LP[rows, p]
        load_LP[rows, p] += w[rows, item]
        count_LP[rows, p] += 1
    return pack, rank


def replicate_experts(weight_LX: np.ndarray, num_phy: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Give num_phy - X extra slots, one at a time, to the expert with the highest load per replica.

    weight_LX: (L, X) expert loads. Slot s < X holds expert s; slot s >= X holds the s-th extra replica.
    Returns (phy2log_LP, replica_LP, count_LX) int64: expert of each of the P = num_phy slots, which
    replica of it the slot is (0 = first), and the number of replicas of each expert.
    """
    w = np.asarray(weight_LX, dtype=np.float64)
    L, X = w.shape
    if num_phy < X:
        raise ConfigError(f"num_phy is {num_phy}; expected at least one slot per expert ({X}).")
    phy2log = np.empty((L, num_phy), dtype=np.int64)
    replica = np.zeros((L, num_phy), dtype=np.int64)
    phy2log[:, :X] = np.arange(X)
    count = np.ones((L, X), dtype=np.int64)
    rows = np.arange(L)
    for s in range(X, num_phy):
        e = np.argmax(w / count, axis=1)
        phy2log[:, s] = e
        replica[:, s] = count[rows, e]
        count[rows, e] += 1
    return phy2log, replica, count


def _inverse(perm_LN: np.ndarray) -> np.ndarray:
    inv = np.empty_like(perm_LN)
    np.put_along_axis(inv, perm_LN, np.broadcast_to(np.arange(perm_LN.shape[1]), perm_LN.shape), axis=1)
    return inv


def log2phy_map(phy2log_LS: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Invert a slot map: (log2phy_LEM, count_LE).

    phy2log_LS: (L, S) expert of every slot. log2phy_LEM[l, e, :count] lists the slots of expert e in
    increasing slot order, padded with -1 to M = S - E + 1 columns.
    """
    p = np.asarray(phy2log_LS, dtype=np.int64)
    L, S = p.shape
    E, M = num_experts, S - num_experts + 1
    key = (p + np.arange(L)[:, None] * E).reshape(-1)
    order = np.argsort(key, kind="stable")  # slots grouped by (layer, expert), in slot order
    count = np.bincount(key, minlength=L * E)
    start = np.cumsum(count) - count
    ordinal = np.arange(L * S) - start[key[order]]
    out = np.full((L * E, M), -1, dtype=np.int64)
    out[key[order], ordinal] = order % S
    return out.reshape(L, E, M), count.reshape(L, E)


def _check(weight_LE: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int) -> np.ndarray:
    w = np.asarray(weight_LE, dtype=np.float64)
    if w.ndim != 2 or 0 in w.shape:
        raise ConfigError(f"weight_LE has shape {np.shape(weight_LE)}; expected (layers, experts).")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ConfigError("weight_LE holds a negative or non-finite load; expected finite loads >= 0.")
    E = w.shape[1]
    for name, v in (("num_groups", num_groups), ("num_nodes", num_nodes), ("num_gpus", num_gpus)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ConfigError(f"{name} is {v!r}; expected a positive integer.")
    if num_replicas < E or num_replicas % num_gpus:
        raise ConfigError(
            f"num_replicas is {num_replicas}; expected a multiple of num_gpus = {num_gpus} that is >= {E} experts."
        )
    if num_gpus % num_nodes:
        raise ConfigError(f"num_nodes is {num_nodes}; expected a divisor of num_gpus = {num_gpus}.")
    if E % num_groups:
        raise ConfigError(f"num_groups is {num_groups}; expected a divisor of the {E} experts.")
    return w


def rebalance_experts(
    weight_LE: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EPLB: replicate and place experts for L layers at once.

    weight_LE: (L, E) load statistics (tokens per expert; any non-negative scale).
    num_replicas: S physical slots in all, a multiple of num_gpus; num_groups: contiguous expert groups;
    num_nodes, num_gpus: the cluster. Hierarchical when num_groups % num_nodes == 0, global otherwise.
    Returns (phy2log_LS, log2phy_LEM, logcnt_LE), int64: expert of each slot (slot s on GPU
    s // (S / G)), the slots of each expert padded with -1 (M = S - E + 1), and the replicas per expert.
    """
    w = _check(weight_LE, num_replicas, num_groups, num_nodes, num_gpus)
    if num_groups % num_nodes == 0:
        phy2log = _hierarchical(w, num_replicas, num_groups, num_nodes, num_gpus)
    else:
        phy2log = _hierarchical(w, num_replicas, 1, 1, num_gpus)
    log2phy, logcnt = log2phy_map(phy2log, w.shape[1])
    return phy2log, log2phy, logcnt


def _hierarchical(w: np.ndarray, S: int, groups: int, nodes: int, gpus: int) -> np.ndarray:
    """(L, E) loads -> (L, S) phy2log by the three steps of the module docstring."""
    L, E = w.shape
    group_size, groups_per_node = E // groups, groups // nodes
    experts_per_node, slots_per_node, gpus_per_node = E // nodes, S // nodes, gpus // nodes
    # (1) groups -> nodes. "mlog" numbers experts node-major: node n owns mlog n*E/nodes .. (n+1)*E/nodes-1.
    group_pack, group_rank = balanced_packing(w.reshape(L, groups, group_size).sum(axis=2), nodes)
    first_mlog_LG = (group_pack * groups_per_node + group_rank) * group_size
    log2mlog = (first_mlog_LG[:, :, None] + np.arange(group_size)).reshape(L, E)
    mlog2log = _inverse(log2mlog)
    # (2) extra slots inside every node; the (layer, node) pairs form one batch of L * nodes rows.
    w_node = np.take_along_axis(w, mlog2log, axis=1).reshape(L * nodes, experts_per_node)
    phy2mlog, _, count = replicate_experts(w_node, slots_per_node)
    # (3) replicas -> the node's GPUs; "pphy" numbers the node's slots GPU-major.
    per_replica = np.take_along_axis(w_node / count, phy2mlog, axis=1)
    gpu, rank = balanced_packing(per_replica, gpus_per_node)
    pphy2phy = _inverse(gpu * (slots_per_node // gpus_per_node) + rank)
    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=1).reshape(L, nodes, slots_per_node)
    pphy2mlog = (pphy2mlog + (np.arange(nodes) * experts_per_node)[:, None]).reshape(L, S)
    return np.take_along_axis(mlog2log, pphy2mlog, axis=1)


# ---- evaluating a placement on actual loads ---------------------------------------------------------------
def gpu_loads(load_xLE: np.ndarray, phy2log_LS: np.ndarray, num_gpus: int) -> np.ndarray:
    """Per-GPU load of actual loads under a placement, tokens of an expert split evenly over its replicas.

    load_xLE: (..., L, E) tokens per expert (e.g. (T, L, E) for T steps); phy2log_LS: (L, S).
    Returns (..., L, G) float64.
    """
    load = np.asarray(load_xLE, dtype=np.float64)
    p = np.asarray(phy2log_LS, dtype=np.int64)
    L, S = p.shape
    if load.ndim < 2 or load.shape[-2] != L:
        raise ConfigError(f"load_xLE has shape {load.shape}; expected (..., {L}, E) to match phy2log_LS {p.shape}.")
    E = load.shape[-1]
    if S % num_gpus or p.min() < 0 or p.max() >= E:
        raise ConfigError(
            f"phy2log_LS {p.shape} does not fit {num_gpus} GPUs and {E} experts; expected S divisible by G, ids < E."
        )
    count = np.bincount((p + np.arange(L)[:, None] * E).reshape(-1), minlength=L * E).reshape(L, E)
    if ((count == 0) & (load > 0)).any():
        raise ConfigError("phy2log_LS leaves an expert with load on no slot; expected every loaded expert placed.")
    per_replica = load / np.maximum(count, 1)
    per_slot = np.take_along_axis(per_replica, np.broadcast_to(p, load.shape[:-1] + (S,)), axis=-1)
    return per_slot.reshape(*load.shape[:-1], num_gpus, S // num_gpus).sum(axis=-1)


def imbalance(load_xG: np.ndarray) -> np.ndarray:
    """IR = max / mean over the last axis (1.0 where there is no load)."""
    x = np.asarray(load_xG, dtype=np.float64)
    mean = x.mean(axis=-1)
    return np.where(mean > 0, x.max(axis=-1) / np.where(mean > 0, mean, 1.0), 1.0)


def placement_ir(load_xLE: np.ndarray, phy2log_LS: np.ndarray, num_gpus: int) -> np.ndarray:
    """IR (max / mean GPU load) of actual loads under a placement: (..., L, E) -> (..., L)."""
    return imbalance(gpu_loads(load_xLE, phy2log_LS, num_gpus))


# ---- deployment as engines run it -------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class EPLBDeployment:
    """EPLB the way vLLM (--eplb-config) and SGLang (--enable-eplb) run it.

    num_gpus: EP ranks; redundant_per_gpu: extra slots per GPU (S = E + G * redundant_per_gpu);
    num_groups, num_nodes: passed to rebalance_experts (hierarchical when num_groups % num_nodes == 0).
    window_steps: steps of per-step loads summed into the statistics (vLLM window_size 1000).
    rebalance_every: steps between rebalances (vLLM step_interval 3000; SGLang 1000); None = one-shot:
    computed once on the first window_steps steps (a warm-up) and kept.
    Before the first rebalance the placement is EPLB of uniform loads (no statistics yet).
    """

    num_gpus: int
    redundant_per_gpu: int = 1
    num_groups: int = 1
    num_nodes: int = 1
    window_steps: int = 1000
    rebalance_every: int | None = 3000

    def __post_init__(self) -> None:
        if self.num_gpus < 1 or self.redundant_per_gpu < 0 or self.window_steps < 1:
            raise ConfigError(
                f"EPLBDeployment(num_gpus={self.num_gpus}, redundant_per_gpu={self.redundant_per_gpu}, "
                f"window_steps={self.window_steps}); expected num_gpus >= 1, redundant_per_gpu >= 0, window >= 1."
            )
        if self.rebalance_every is not None and self.rebalance_every < 1:
            raise ConfigError(f"rebalance_every is {self.rebalance_every}; expected a positive step count or None.")

    def num_slots(self, num_experts: int) -> int:
        """S = E + G * redundant_per_gpu."""
        return num_experts + self.num_gpus * self.redundant_per_gpu

    def place(self, weight_LE: np.ndarray) -> np.ndarray:
        """(L, E) statistics -> (L, S) phy2log."""
        w = np.asarray(weight_LE, dtype=np.float64)
        return rebalance_experts(w, self.num_slots(w.shape[-1]), self.num_groups, self.num_nodes, self.num_gpus)[0]

    def rebalance_steps(self, num_steps: int) -> list[int]:
        """Steps at which a new placement takes effect (it uses the loads of the steps before it)."""
        if self.rebalance_every is None:
            return [self.window_steps] if self.window_steps < num_steps else []
        return list(range(self.rebalance_every, num_steps, self.rebalance_every))

    def run(self, loads_TLE: np.ndarray) -> DeploymentRun:
        """Replay T steps of actual per-step loads (T, L, E) under this deployment."""
        loads = np.asarray(loads_TLE, dtype=np.float64)
        if loads.ndim != 3:
            raise ConfigError(f"loads_TLE has shape {loads.shape}; expected (steps, layers, experts).")
        T, L, E = loads.shape
        bounds = [0, *self.rebalance_steps(T), T]
        placements = [self.place(np.ones((L, E)))]
        for t in bounds[1:-1]:
            placements.append(self.place(loads[max(0, t - self.window_steps):t].sum(axis=0)))
        ir = np.empty((T, L))
        for p, (a, b) in zip(placements, zip(bounds[:-1], bounds[1:], strict=True), strict=True):
            ir[a:b] = placement_ir(loads[a:b], p, self.num_gpus)
        moved = [int((new != old).sum()) for old, new in zip(placements[:-1], placements[1:], strict=True)]
        return DeploymentRun(ir_TL=ir, rebalance_steps=tuple(bounds[1:-1]), placements=tuple(placements),
                             slots_changed=tuple(moved))


def one_shot_deployment(num_gpus: int, *, redundant_per_gpu: int = 1, warmup_steps: int = 1000,
                        num_groups: int = 1, num_nodes: int = 1) -> EPLBDeployment:
    """Preset: EPLB computed once from a warm-up window of `warmup_steps` steps and never again."""
    return EPLBDeployment(num_gpus=num_gpus, redundant_per_gpu=redundant_per_gpu, num_groups=num_groups,
                          num_nodes=num_nodes, window_steps=warmup_steps, rebalance_every=None)


def periodic_deployment(num_gpus: int, *, redundant_per_gpu: int = 1, window_steps: int = 1000,
                        rebalance_every: int = 3000, num_groups: int = 1, num_nodes: int = 1) -> EPLBDeployment:
    """Preset: vLLM's defaults (window 1000 steps, a rebalance every 3000 steps)."""
    return EPLBDeployment(num_gpus=num_gpus, redundant_per_gpu=redundant_per_gpu, num_groups=num_groups,
                          num_nodes=num_nodes, window_steps=window_steps, rebalance_every=rebalance_every)


@dataclass(frozen=True, kw_only=True)
class DeploymentRun:
    """Result of EPLBDeployment.run.

    ir_TL: (T, L) max / mean GPU load of every step and layer under the placement in effect then.
    rebalance_steps: steps at which a new placement took effect; placements: the (L, S) phy2log maps in
    effect, the initial one first; slots_changed: slots whose expert changed at each rebalance (each one a
    weight transfer of one expert).
    """

    ir_TL: np.ndarray
    rebalance_steps: tuple[int, ...]
    placements: tuple[np.ndarray, ...]
    slots_changed: tuple[int, ...]

    @property
    def mean_ir(self) -> float:
        return float(self.ir_TL.mean())
