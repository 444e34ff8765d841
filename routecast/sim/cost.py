"""The layer cost model: time of one MoE transformer layer on G expert-parallel ranks, for C configurations
at once.

    T = T_attn + AR_tp + max_g A2A_dispatch,g + max_g FFN_g + max_g A2A_combine,g + T_predict
        + max(0, T_transfer - W_hide)
    FFN_g = sum_{e on g, n_ge > 0} [c_call + max(W_e / B(W_e), flops(n_ge) / (eta(n_ge) * peak)) + a n_ge (3H + 2I)]
            + shared + overhead
    A2A_g = alpha + V_g / B_link,  V_g = (1 - local_g) * U_g * H * bytes

(with CostOptions.roofline = "rank", the regime pricing: FFN_g = max(sum_e flops(n_ge) / (eta(n_ge) peak),
D_g x W / B(W)) + D_g c_call + activations, D_g the distinct experts rank g runs: a decode step is bound by the
experts a rank reads, a prefill step by the tokens it computes), where c_call is the fixed cost of one expert call (the launch / dispatch floor of an eager expert loop, which
sets a one-token decode step), B(W) the weight-read bandwidth at expert size W (the measured curve of a
calibrated profile, else HBM_eff), a the cost per activation value an eager expert call touches outside its
GEMMs (gather, SiLU x up, scale, scatter-add), overhead the fixed per-layer router cost, n_ge the number of (token,
expert) assignments of expert e processed on rank g, U_g the tokens rank g receives (U_g = sum_e n_ge, or
the unique tokens with `dedup`), local_g the share already on g (1/G when tokens are spread at random, as MoE-GPS assumes after the TP reduce). Attention is a roofline per rank (FLOPs
over eta x peak vs weight + KV + activation bytes over HBM_eff), heads split over the G ranks (`attn_parallel="tp"`, MoE-GPS) or sequences split (`"dp"`, PROBE).
The collectives (ring all-reduce / all-gather / reduce-scatter, all-to-all) are public functions below.

Every input that varies across configurations may be an array of shape (C,) (or (C, G) where noted); the
hardware and model are shared by the batch. Units: seconds, bytes, FLOPs, tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.sim.hardware import Hardware
from routecast.sim.models import ModelProfile

ArrayLike = Any  # float | np.ndarray broadcastable to (C,) (or (C, G) where a docstring says so)


# ---- collectives -------------------------------------------------------------------------------------------
# Alpha-beta costs, vectorised: size / volume in bytes, n ranks, bandwidth in bytes/s PER DIRECTION per rank,
# alpha in seconds; array-likes broadcast together. A group of one rank communicates nothing and costs 0.
# Ring algorithms (Patarasuk & Yuan 2009, the bandwidth-optimal all-reduce MoE-GPS cites):
#     all-reduce      AR = 2(N-1) alpha + 2(N-1)/N * S / B
#     all-gather      AG = (N-1) alpha + (N-1)/N * S / B        (S = the gathered, full size)
#     reduce-scatter  RS = (N-1) alpha + (N-1)/N * S / B        (S = the full input size)
# All-to-all is bounded by its busiest rank (PROBE eq. 4-5): A2A = alpha + V / B, V = that rank's max(in, out).
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "alltoall")


def _prep(n: Any, bandwidth: Any) -> tuple[np.ndarray, np.ndarray]:
    n_arr = np.asarray(n, dtype=np.float64)
    bw = np.asarray(bandwidth, dtype=np.float64)
    if np.any(n_arr < 1):
        raise ConfigError(f"collective group size is {n!r}; expected at least 1 rank.")
    # Bandwidth only matters where data moves; a zero link with n > 1 is a configuration error.
    if np.any((bw <= 0) & (n_arr > 1)):
        raise ConfigError(f"link bandwidth is {bandwidth!r} bytes/s for a group of {n!r} ranks; expected > 0.")
    return n_arr, np.where(bw > 0, bw, 1.0)


def ring_allreduce(size_bytes: Any, n: Any, bandwidth: Any, alpha: Any) -> np.ndarray:
    """Seconds for a ring all-reduce of `size_bytes` (per rank, full tensor) over `n` ranks."""
    n_arr, bw = _prep(n, bandwidth)
    frac = (n_arr - 1.0) / n_arr
    return 2.0 * (n_arr - 1.0) * np.asarray(alpha, np.float64) + 2.0 * frac * np.asarray(size_bytes, np.float64) / bw


def ring_allgather(size_bytes: Any, n: Any, bandwidth: Any, alpha: Any) -> np.ndarray:
    """Seconds for a ring all-gather whose gathered result is `size_bytes` per rank."""
    n_arr, bw = _prep(n, bandwidth)
    frac = (n_arr - 1.0) / n_arr
    return (n_arr - 1.0) * np.asarray(alpha, np.float64) + frac * np.asarray(size_bytes, np.float64) / bw


def ring_reduce_scatter(size_bytes: Any, n: Any, bandwidth: Any, alpha: Any) -> np.ndarray:
    """Seconds for a ring reduce-scatter of a `size_bytes` input per rank (each keeps 1/n, reduced)."""
    return ring_allgather(size_bytes, n, bandwidth, alpha)


def alltoall(volume_bytes: Any, n: Any, bandwidth: Any, alpha: Any) -> np.ndarray:
    """Seconds for an all-to-all whose busiest rank sends or receives `volume_bytes` (0 for n == 1)."""
    n_arr, bw = _prep(n, bandwidth)
    t = np.asarray(alpha, np.float64) + np.asarray(volume_bytes, np.float64) / bw
    return np.where(n_arr > 1, t, 0.0)


def collective_time(kind: str, size_bytes: Any, n: Any, bandwidth: Any, alpha: Any) -> np.ndarray:
    """Dispatch on `kind` in COLLECTIVES (the CLI and the serving simulation name collectives by string)."""
    table = {
        "allreduce": ring_allreduce,
        "allgather": ring_allgather,
        "reduce_scatter": ring_reduce_scatter,
        "alltoall": alltoall,
    }
    if kind not in table:
        raise ConfigError(f"collective is {kind!r}; expected one of {list(COLLECTIVES)}.")
    return table[kind](size_bytes, n, bandwidth, alpha)


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One forward step: `batch` sequences each adding `seq_len` new tokens after `context_len` cached ones.

    Prefill: seq_len = prompt length, context_len = 0. Decode: seq_len = 1, context_len = tokens so far.
    Each field is a scalar or a (C,) array.
    """

    batch: ArrayLike = 1
    seq_len: ArrayLike = 512
    context_len: ArrayLike = 0

    def __post_init__(self) -> None:
        for name, low in (("batch", 1), ("seq_len", 1), ("context_len", 0)):
            v = np.asarray(getattr(self, name), dtype=np.float64)
            if v.ndim > 1 or not np.all(np.isfinite(v)) or np.any(v < low):
                raise ConfigError(f"Workload.{name} is {getattr(self, name)!r}; expected a scalar or (C,) array >= {low}.")


def prefill(batch: ArrayLike = 1, seq_len: ArrayLike = 512) -> Workload:
    """Prefill of `batch` prompts of `seq_len` tokens (MoE-GPS Figure 6: batch 1, sequence 512)."""
    return Workload(batch=batch, seq_len=seq_len, context_len=0)


def decode(batch: ArrayLike = 64, context_len: ArrayLike = 1024) -> Workload:
    """One decode step of `batch` sequences with `context_len` cached tokens each."""
    return Workload(batch=batch, seq_len=1, context_len=context_len)


@dataclass(frozen=True, kw_only=True)
class CostOptions:
    """How the layer runs. Numeric fields are scalars or (C,) arrays unless noted.

    link: "nvlink" | "pcie" (per-direction bandwidth from the hardware profile); link_bandwidth overrides it
      (bytes/s, for bandwidth sweeps such as MoE-GPS Figure 7).
    attn_parallel: "tp" (heads split over the G ranks, then `tp_collective` of the activations: MoE-GPS) or
      "dp" (each rank attends its own batch / G sequences, no collective: PROBE).
    tp_collective: "allreduce" | "reduce_scatter".
    dedup: a token goes to a rank once however many of its experts live there (DeepEP-style); without it every
      (token, expert) assignment is sent (Megatron/DeepSpeed all-to-all).
    staircase: evaluate eta at tile-padded token counts (hardware `tile_m`).
    local_fraction: share of each rank's assignments whose token already lives on it; None = 1/G (random
      placement); (C,) or (C, G). Speculative token shuffling raises it (s-MoE's local activation rate).
    skip_scatter, misroute_fraction: token-to-expert prediction (MoE-GPS §3.2.2) sends each token straight to
      its predicted expert's rank during the TP reduce, so the dispatch all-to-all carries only the misrouted
      share (misroute_fraction of each rank's tokens); the combine is unchanged.
    predict_s: seconds of predictor time on the critical path.
    transfer_bytes: expert-weight bytes each rank moves for replication on its busier direction (PROBE eq. 6:
      max(received, sent) x W), (C,) or (C, G); rank g's transfer takes bytes_g / B_link, of which only the part
      beyond its window `hide_window_s` is exposed: max_g max(0, bytes_g / B_link - window_g) (PROBE §3.4).
    hide_window_s: seconds of compute the transfers overlap, (C,) or (C, G) per rank (None = the attention
      time: MoE-GPS §5 hides duplication behind attention).
    roofline: "expert" (each active expert costs the slower of its weight read and its GEMM, summed over the
      rank's experts) or "rank" (the regime pricing of a step: a rank's expert time is the slower of its
      token compute, sum_e flops(n_ge) / (eta(n_ge) peak), and its weight reads, D_g x W / B(W), where D_g
      is the distinct experts it runs; plus D_g call floors and the activation work). Decode steps are then
      priced by how many experts a rank reads, prefill steps by how many tokens it computes.
    """

    link: str = "nvlink"
    link_bandwidth: ArrayLike | None = None
    attn_parallel: str = "tp"
    tp_collective: str = "allreduce"
    dedup: bool = False
    staircase: bool = False
    local_fraction: ArrayLike | None = None
    skip_scatter: bool = False
    misroute_fraction: ArrayLike = 0.0
    predict_s: ArrayLike = 0.0
    transfer_bytes: ArrayLike = 0.0
    hide_window_s: ArrayLike | None = None
    roofline: str = "expert"

    def __post_init__(self) -> None:
        if self.roofline not in ("expert", "rank"):
            raise ConfigError(f"CostOptions.roofline is {self.roofline!r}; expected 'expert' or 'rank'.")
        if self.link not in ("nvlink", "pcie"):
            raise ConfigError(f"CostOptions.link is {self.link!r}; expected 'nvlink' or 'pcie'.")
        if self.attn_parallel not in ("tp", "dp"):
            raise ConfigError(f"CostOptions.attn_parallel is {self.attn_parallel!r}; expected 'tp' or 'dp'.")
        if self.tp_collective not in ("allreduce", "reduce_scatter"):
            raise ConfigError(
                f"CostOptions.tp_collective is {self.tp_collective!r}; expected 'allreduce' or 'reduce_scatter'."
            )
        for name in ("misroute_fraction", "local_fraction"):
            v = getattr(self, name)
            if v is not None and np.any((np.asarray(v, np.float64) < 0) | (np.asarray(v, np.float64) > 1)):
                raise ConfigError(f"CostOptions.{name} is {v!r}; expected fractions in [0, 1].")
        for name in ("predict_s", "transfer_bytes", "hide_window_s"):
            if getattr(self, name) is None:
                continue
            if np.any(np.asarray(getattr(self, name), np.float64) < 0):
                raise ConfigError(f"CostOptions.{name} is {getattr(self, name)!r}; expected values >= 0.")


def moe_gps_options(link: str = "nvlink") -> CostOptions:
    """MoE-GPS §2-4 setting: TP attention + ring all-reduce, EP FFN, per-assignment all-to-all, random tokens."""
    return CostOptions(link=link, attn_parallel="tp", tp_collective="allreduce", dedup=False)


def probe_options(link: str = "nvlink") -> CostOptions:
    """PROBE §3 setting: DP attention, EP FFN, deduplicated all-to-all (DeepEP)."""
    return CostOptions(link=link, attn_parallel="dp", dedup=True)


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    """Seconds per layer for C configurations. Scalar parts are (C,); per-rank parts are (C, G).

    attention, attention_comm (TP collective), dispatch and combine (max over ranks of the all-to-all),
    ffn (max over ranks of expert compute, shared experts and the fixed MoE overhead), predict,
    transfer_exposed (replication traffic not hidden), total (their sum).
    """

    attention: np.ndarray
    attention_comm: np.ndarray
    dispatch: np.ndarray
    ffn: np.ndarray
    combine: np.ndarray
    predict: np.ndarray
    transfer_exposed: np.ndarray
    total: np.ndarray
    ffn_CG: np.ndarray
    dispatch_CG: np.ndarray
    combine_CG: np.ndarray

    PARTS = ("attention", "attention_comm", "dispatch", "ffn", "combine", "predict", "transfer_exposed")

    def as_dict(self) -> dict[str, np.ndarray]:
        """The (C,) parts and the total by name (for tables and JSON)."""
        return {k: getattr(self, k) for k in (*self.PARTS, "total")}

    def select(self, idx: Any) -> LayerCost:
        """The configurations `idx` (an index, slice or mask over C) as a LayerCost."""
        if isinstance(idx, (int, np.integer)):
            idx = [idx]  # keep the C axis so per-rank parts stay (C, G)
        return LayerCost(**{f.name: np.atleast_1d(getattr(self, f.name)[idx]) for f in dataclasses.fields(self)})


def _per_config(x: ArrayLike, C: int, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    try:
        return np.broadcast_to(a, (C,))
    except ValueError:
        raise ConfigError(f"{name} has shape {a.shape}; expected a scalar or ({C},).") from None


def _per_rank(x: ArrayLike, C: int, G: int, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1 and a.shape[0] == C:
        a = a[:, None]
    try:
        return np.broadcast_to(a, (C, G))
    except ValueError:
        raise ConfigError(f"{name} has shape {a.shape}; expected a scalar, ({C},) or ({C}, {G}).") from None


def _context_sum(ctx: np.ndarray, s: np.ndarray, window: float) -> np.ndarray:
    """sum_{j=ctx+1}^{ctx+s} min(j, window): key positions attended by s new causal tokens (window 0 = none)."""
    a, b = ctx + 1.0, ctx + s
    full = (b * (b + 1.0) - (a - 1.0) * a) / 2.0
    if window <= 0:
        return full
    m = np.clip(window, a - 1.0, b)  # last position still under the window
    return (m * (m + 1.0) - (a - 1.0) * a) / 2.0 + window * (b - m)


def attention_time(
    model: ModelProfile, hw: Hardware, work: Workload, opts: CostOptions, num_ranks: int, C: int
) -> tuple[np.ndarray, np.ndarray]:
    """(attention seconds, TP collective seconds), each (C,), on the slowest rank of `num_ranks`."""
    N = float(num_ranks)
    batch = _per_config(work.batch, C, "Workload.batch")
    s = _per_config(work.seq_len, C, "Workload.seq_len")
    ctx = _per_config(work.context_len, C, "Workload.context_len")
    H, b = float(model.hidden_size), float(model.dtype_bytes)
    if opts.attn_parallel == "tp":
        heads, seqs = model.num_heads / N, batch
        kv_heads = max(model.num_kv_heads / N, 1.0)  # KV heads are replicated once ranks outnumber them
    else:
        heads, kv_heads, seqs = float(model.num_heads), float(model.num_kv_heads), np.ceil(batch / N)
    tokens = seqs * s
    f = model.sliding_fraction if model.sliding_window else 0.0
    keys = f * _context_sum(ctx, s, model.sliding_window) + (1.0 - f) * _context_sum(ctx, s, 0)
    kv_len = ctx + s
    if model.sliding_window:
        kv_len = f * np.minimum(kv_len, np.maximum(model.sliding_window, s)) + (1.0 - f) * kv_len
    if model.attention == "mla":
        qk, v = model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
        q_params = (H * model.q_lora_rank + model.q_lora_rank * heads * qk) if model.q_lora_rank else H * heads * qk
        kv_params = H * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank * heads * (
            model.qk_nope_head_dim + v
        )
        params = q_params + kv_params + heads * v * H
        kv_token_bytes = (model.kv_lora_rank + model.qk_rope_head_dim) * b  # the compressed latent is cached
        core = 2.0 * heads * (qk + v) * seqs * keys
    else:
        hd = float(model.head_dim)
        params = H * (heads * hd + 2.0 * kv_heads * hd) + heads * hd * H
        kv_token_bytes = 2.0 * kv_heads * hd * b
        core = 2.0 * heads * 2.0 * hd * seqs * keys
    flops = 2.0 * tokens * params + core
    mem = params * b + kv_token_bytes * (seqs * kv_len + tokens) + 2.0 * tokens * H * b
    t_attn = np.maximum(flops / (hw.eta(tokens) * hw.peak_flops), mem / hw.mem_effective)
    if opts.attn_parallel == "dp" or num_ranks == 1:
        return t_attn, np.zeros(C)
    bw = _link(hw, opts, C)
    size = batch * s * H * b
    comm = collective_time(opts.tp_collective, size, num_ranks, bw, hw.alpha)
    return t_attn, comm


def _link(hw: Hardware, opts: CostOptions, C: int) -> np.ndarray:
    if opts.link_bandwidth is not None:
        return _per_config(opts.link_bandwidth, C, "CostOptions.link_bandwidth")
    return np.full(C, hw.link_bandwidth(opts.link))


def rank_parts(n: np.ndarray, model: ModelProfile, hw: Hardware, staircase: bool = False
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C, G, E) counts -> (compute_CG, read_CG, fixed_CG) seconds of routed-expert work per rank.

    compute: sum over active experts of flops(n_ge) / (eta(n_ge) x peak); read: distinct active experts x
    W / B(W); fixed: distinct active experts x the call floor plus n x (3 H + 2 I) activation values. The
    "rank" roofline is max(compute, read) + fixed.
    """
    C, G, E = n.shape
    t_read = float(hw.weight_read_time(model.expert_bytes()))
    per_token = model.expert_flops_per_token / hw.peak_flops
    act_per_token = hw.activation_cost * (3 * model.hidden_size + 2 * model.expert_ffn)
    flat = n.reshape(-1)
    active = np.flatnonzero(flat)
    v = flat[active]
    rank = active // E
    comp = np.bincount(rank, weights=v * per_token / hw.eta(v, staircase=staircase), minlength=C * G)
    dist = np.bincount(rank, minlength=C * G).astype(np.float64)
    fixed = dist * hw.expert_call_overhead + np.bincount(rank, weights=v, minlength=C * G) * act_per_token
    return comp.reshape(C, G), (dist * t_read).reshape(C, G), fixed.reshape(C, G)


def _expert_time(n: np.ndarray, model: ModelProfile, hw: Hardware, staircase: bool,
                 roofline: str = "expert") -> np.ndarray:
    """(C, G, E) counts -> (C, G) seconds of routed-expert calls per rank (experts with no tokens cost 0).

    An active expert costs its call floor, the slower of reading its weights and its GEMM FLOPs, and its
    activation work (n x (3 H + 2 I) values at hw.activation_cost each). roofline="rank": see rank_parts.
    """
    if roofline == "rank":
        comp, read, fixed = rank_parts(n, model, hw, staircase)
        return np.maximum(comp, read) + fixed
    C, G, E = n.shape
    t_mem = float(hw.weight_read_time(model.expert_bytes())) + hw.expert_call_overhead
    per_token = model.expert_flops_per_token / hw.peak_flops
    act_per_token = hw.activation_cost * (3 * model.hidden_size + 2 * model.expert_ffn)
    flat = n.reshape(-1)
    active = np.flatnonzero(flat)
    if active.size * 2 < flat.size:
        # Sharded placements leave most (rank, expert) cells empty (DeepSeek-V3 on 32 ranks: 97%); pricing
        # only the active cells and summing them per rank with bincount is several times faster.
        v = flat[active]
        t = np.maximum(v * per_token / hw.eta(v, staircase=staircase) + hw.expert_call_overhead, t_mem)
        if act_per_token:
            t += v * act_per_token
        return np.bincount(active // E, weights=t, minlength=C * G).reshape(C, G)
    t = n * per_token
    t /= hw.eta(n, staircase=staircase)
    t += hw.expert_call_overhead
    np.maximum(t, t_mem, out=t)
    if act_per_token:
        t += n * act_per_token
    t *= n > 0
    return t.sum(axis=-1)


def _check_counts(counts: Any) -> np.ndarray:
    a = np.asarray(counts, dtype=np.float64)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or 0 in a.shape:
        raise ConfigError(f"counts has shape {np.shape(counts)}; expected (C, G, E) or (G, E) token counts.")
    lo, hi = a.min(), a.max()
    if not (lo >= 0) or not np.isfinite(hi):
        raise ConfigError(f"counts holds values in [{lo}, {hi}]; expected finite, non-negative token counts.")
    return a


def layer_cost(
    counts: Any,
    *,
    model: ModelProfile,
    hw: Hardware,
    work: Workload | None = None,
    opts: CostOptions | None = None,
    recv: Any = None,
    unique: Any = None,
) -> LayerCost:
    """Time of one MoE layer for C configurations at once.

    counts: (C, G, E) or (G, E) assignments of expert e processed on rank g (replicas: an expert with tokens
      on several ranks); floats allowed (expected counts). Build them from per-expert loads with
      `scenarios.sharded_counts` / `scenarios.balanced_counts` or from a trace.
    recv: (C, G) assignments each rank receives in the all-to-all; default counts.sum(-1).
    unique: (C, G) distinct tokens each rank receives (with `opts.dedup`); default: the expectation for
      tokens whose K experts fall independently, T * (1 - (1 - recv / (T K)) ** K).
    Returns a LayerCost of (C,) parts in seconds.
    """
    work = work or Workload()
    opts = opts or CostOptions()
    n = _check_counts(counts)
    C, G, E = n.shape
    if E != model.num_experts:
        raise ConfigError(f"counts has {E} experts on its last axis; expected num_experts = {model.num_experts} of {model.name}.")
    bw = _link(hw, opts, C) if G > 1 else np.ones(C)
    if G > 1 and np.any(bw <= 0):
        raise ConfigError(f"link '{opts.link}' of {hw.name} has no bandwidth; expected a link that exists for {G} ranks.")
    H, b, K = float(model.hidden_size), float(model.dtype_bytes), float(model.top_k)

    # FFN: each active (rank, expert) runs one GEMM group; it is bound by weight reads or by compute.
    ffn_CG = _expert_time(n, model, hw, opts.staircase, opts.roofline)
    tokens = _per_config(work.batch, C, "Workload.batch") * _per_config(work.seq_len, C, "Workload.seq_len")
    if model.num_shared_experts:
        local_tokens = tokens / G  # shared experts run on every rank over the tokens it holds
        t_sh = np.maximum(
            model.shared_flops_per_token * local_tokens / (hw.eta(local_tokens) * hw.peak_flops),
            hw.weight_read_time(model.shared_bytes),
        ) + hw.expert_call_overhead
        t_sh = t_sh + hw.activation_cost * local_tokens * (3 * model.hidden_size + 2 * model.shared_ffn * model.num_shared_experts)
        ffn_CG = ffn_CG + t_sh[:, None]
    ffn_CG = ffn_CG + hw.moe_layer_overhead

    # All-to-all: the busiest receiver sets the time (senders hold T/G random tokens each, so the mean
    # egress never exceeds the max ingress).
    if G > 1:
        A = n.sum(axis=-1) if recv is None else _per_rank(recv, C, G, "recv")
        if opts.dedup:
            if unique is not None:
                U = _per_rank(unique, C, G, "unique")
            else:
                p = np.clip(A / np.maximum(tokens * K, 1e-30)[:, None], 0.0, 1.0)
                U = tokens[:, None] * (1.0 - (1.0 - p) ** K)
        else:
            U = A
        local = 1.0 / G if opts.local_fraction is None else _per_rank(opts.local_fraction, C, G, "local_fraction")
        vol = U * (H * b)
        comb_vol = vol * (1.0 - local)
        combine_CG = hw.alpha + comb_vol / bw[:, None]
        if opts.skip_scatter:
            mis = _per_config(opts.misroute_fraction, C, "CostOptions.misroute_fraction")[:, None]
            disp_vol = vol * mis
            dispatch_CG = np.where(disp_vol > 0, hw.alpha + disp_vol / bw[:, None], 0.0)
        else:
            dispatch_CG = combine_CG
    else:
        dispatch_CG = combine_CG = np.zeros((C, G))

    t_attn, t_attn_comm = attention_time(model, hw, work, opts, G, C)
    predict = _per_config(opts.predict_s, C, "CostOptions.predict_s")
    xfer = _per_rank(opts.transfer_bytes, C, G, "CostOptions.transfer_bytes")
    if np.any(xfer > 0):
        xbw = _link(hw, opts, C) if G > 1 else np.full(C, hw.h2d_bandwidth or hw.mem_bandwidth)
        window = t_attn if opts.hide_window_s is None else opts.hide_window_s
        # a rank's transfer can only hide behind its own window (PROBE eq. 8 bounds each rank separately)
        exposed = np.maximum(0.0, xfer / xbw[:, None] - _per_rank(window, C, G, "CostOptions.hide_window_s"))
        exposed = exposed.max(axis=-1)
    else:
        exposed = np.zeros(C)
    ffn, dispatch, combine = ffn_CG.max(axis=-1), dispatch_CG.max(axis=-1), combine_CG.max(axis=-1)
    total = t_attn + t_attn_comm + dispatch + ffn + combine + predict + exposed
    return LayerCost(
        attention=t_attn, attention_comm=t_attn_comm, dispatch=dispatch, ffn=ffn, combine=combine,
        predict=np.array(predict), transfer_exposed=exposed, total=total,
        ffn_CG=ffn_CG, dispatch_CG=np.asarray(dispatch_CG), combine_CG=np.asarray(combine_CG),
    )
