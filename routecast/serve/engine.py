"""Engine prices for the serving simulation: seconds per step from the layer cost model, tabulated once.

An engine is `gpus` devices of one hardware profile serving one model profile with TP attention + EP experts
(MoE-GPS's / DeepSpeed-MoE's layout, `cost.moe_gps_options`). A step processes n tokens: d decode tokens (one
per running sequence, mean context c) and the prompts admitted in it. Its time, over all num_layers layers:

    step(n, d, c, prompts) = base(n) + dec(d, c) + sum_p pre(p) + miss(n) [+ exposed expert loading]

    base(n)  = layer_cost(counts of n tokens) x layers, context 0: attention projections, TP all-reduce,
               dispatch + combine all-to-all (local share = `lar`, default 1/G), expert FFN, shared experts;
               counts are multinomial draws of n K assignments over the experts (popularity: MoE-GPS skewness),
               averaged over `samples` draws, so a decode step pays for the experts it actually activates;
    dec(d,c) = attention over the KV cache: attention_time(d seqs, context c) - attention_time(context 0);
    pre(p)   = causal attention of a p-token prompt over itself: attention_time(1 x p) - attention_time(p x 1);
    miss(n)  = with budget < 1 and miss="load": expected active non-resident experts x expert bytes / h2d
               (on-demand loading, no prediction); with miss="fallback" (eMoE) tokens of non-resident experts
               go to resident ones, so only the resident experts are ever active and miss(n) = 0.

base is tabulated on a geometric grid of n and interpolated; dec on every d and a grid of c; pre on a grid of
p. The tables make one simulated step a few array lookups. DeepSeek-V3's three dense layers are priced as
MoE layers (3 of 61). Memory: KV capacity = mem_util x gpus x capacity - weights (non-expert weights + the
resident `budget` share of the experts), in tokens of num_layers x KV bytes per token.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from routecast.common.errors import ConfigError
from routecast.sim.cost import Workload, attention_time, layer_cost, moe_gps_options
from routecast.sim.hardware import Hardware, load_hardware
from routecast.sim.models import ModelProfile, load_model
from routecast.sim.scenarios import sharded_counts, skew_loads

MISS_MODES = ("fallback", "load")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """One serving engine. model / hardware: profile names or paths; gpus 0 = the smallest power of two whose
    memory holds the full weights at 75% of mem_util; link: the profile's GPU-GPU link, link_gbps overrides its
    per-direction bandwidth (e.g. 20.8 for the cross-socket UPI hop of Speculative MoE's GPU-Server-B); budget: resident share of each layer's experts (0, 1];
    lar: local activation rate of the all-to-all (None = 1/G, random placement); skewness: hottest expert's
    load over the mean (MoE-GPS; 1 = uniform); max_seqs: running sequences at most; token_budget: tokens per
    step at most (eMoE's T_max, vLLM's max_num_batched_tokens); samples: routing draws per table point."""

    model: str = "mixtral-8x7b"
    hardware: str = "h100-sxm"
    gpus: int = 0
    link: str = "nvlink"
    link_gbps: float | None = None
    budget: float = 1.0
    miss: str = "fallback"
    lar: float | None = None
    skewness: float = 1.4
    max_seqs: int = 256
    token_budget: int = 4096
    mem_util: float = 0.9
    samples: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, want: str) -> ConfigError:
            return ConfigError(f"{name} is {getattr(self, name)!r}; expected {want}.")

        if not (isinstance(self.budget, (int, float)) and math.isfinite(self.budget) and 0 < self.budget <= 1):
            raise bad("budget", "a resident share of experts in (0, 1] (e.g. 50%)")
        if self.miss not in MISS_MODES:
            raise bad("miss", f"one of {list(MISS_MODES)}")
        if self.lar is not None and not (math.isfinite(self.lar) and 0 <= self.lar <= 1):
            raise bad("lar", "a local activation rate in [0, 1]")
        if not (math.isfinite(self.skewness) and self.skewness >= 1):
            raise bad("skewness", "a value >= 1")
        for name in ("max_seqs", "token_budget", "samples"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise bad(name, "a positive integer")
        if not isinstance(self.gpus, int) or self.gpus < 0:
            raise bad("gpus", "a positive integer (0 = automatic)")
        if self.link_gbps is not None and not (math.isfinite(self.link_gbps) and self.link_gbps > 0):
            raise bad("link_gbps", "a finite GPU-GPU bandwidth > 0 GB/s per direction")
        if not (math.isfinite(self.mem_util) and 0 < self.mem_util <= 1):
            raise bad("mem_util", "a fraction in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class StepPrices:
    """Step-time tables in seconds (all layers). base_n, attn_n, miss_n: (N+1,) by token count (index 0 = 0);
    ctx_grid (X,) and dec_ctx (D+1, X): decode attention extra by sequences d and mean context; pre_grid (P,)
    and pre_extra (P,): a prompt's causal self-attention extra by prompt length."""

    base_n: np.ndarray
    attn_n: np.ndarray
    miss_n: np.ndarray
    ctx_grid: np.ndarray
    dec_ctx: np.ndarray
    pre_grid: np.ndarray
    pre_extra: np.ndarray

    @property
    def max_tokens(self) -> int:
        return self.base_n.shape[0] - 1

    def prefill(self, prompts: np.ndarray) -> float:
        """Extra seconds of the prompts' causal attention, (m,) prompt lengths -> float."""
        return float(np.interp(prompts, self.pre_grid, self.pre_extra).sum()) if len(prompts) else 0.0

    def step(self, n: int, d: int, ctx_mean: float, pre: float) -> float:
        """Seconds of one step of n tokens, d of them decode tokens at mean context ctx_mean; pre = prefill()."""
        B = self.max_tokens
        if n > B:  # a prefill larger than the table runs in chunks of B tokens (request-level batching)
            q, n = divmod(n, B)
            pre += q * (self.base_n[B] + self.miss_n[B])
        t = self.base_n[n] + self.miss_n[n] + pre
        if d:
            t += float(np.interp(ctx_mean, self.ctx_grid, self.dec_ctx[d]))
        return float(t)

    def decode_run(self, d: int, ctx_mean: float, k: int, price_d: int | None = None) -> np.ndarray:
        """(k,) seconds of k decode steps of d sequences whose mean context starts at ctx_mean and grows by one
        per step; price_d prices padded steps (request-level batching keeps finished slots in the batch)."""
        p = d if price_d is None else price_d
        ctx = ctx_mean + np.arange(k, dtype=np.float64)
        return np.interp(ctx, self.ctx_grid, self.dec_ctx[p]) + (self.base_n[p] + self.miss_n[p])


@dataclass(frozen=True, kw_only=True)
class Engine:
    """A priced engine: config, profiles, gpus, step tables, KV capacity (tokens), seconds to load one
    expert (its share of every GPU's h2d link), resident experts per layer."""

    config: EngineConfig
    model: ModelProfile
    hw: Hardware
    gpus: int
    prices: StepPrices
    kv_capacity: int
    weight_bytes: float
    expert_load_s: float
    resident_per_layer: int


def attention_params(m: ModelProfile) -> float:
    """Attention weights of one layer (elements), the same projections cost.attention_time counts."""
    H = float(m.hidden_size)
    if m.attention == "mla":
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = (H * m.q_lora_rank + m.q_lora_rank * m.num_heads * qk) if m.q_lora_rank else H * m.num_heads * qk
        kv = H * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * m.num_heads * (m.qk_nope_head_dim + m.v_head_dim)
        return q + kv + m.num_heads * m.v_head_dim * H
    return H * (m.num_heads + 2 * m.num_kv_heads) * m.head_dim + m.num_heads * m.head_dim * H


def kv_bytes_per_token(m: ModelProfile) -> float:
    """KV-cache bytes of one token over all layers (MLA caches the compressed latent + rope key)."""
    per = (m.kv_lora_rank + m.qk_rope_head_dim) if m.attention == "mla" else 2 * m.num_kv_heads * m.head_dim
    return float(per * m.dtype_bytes * m.num_layers)


def weight_bytes(m: ModelProfile, budget: float) -> float:
    """Weights held in device memory: attention, router, embeddings, shared experts, `budget` of the experts."""
    dense = m.num_layers * attention_params(m) + 2 * m.vocab_size * m.hidden_size
    dense += m.num_moe_layers * m.hidden_size * m.num_experts
    experts = m.num_moe_layers * (math.ceil(budget * m.num_experts) * m.expert_bytes() + m.shared_bytes)
    return dense * m.dtype_bytes + experts


def resident_experts(num_experts: int, budget: float) -> np.ndarray:
    """(E,) bool: the experts a budget keeps for pricing: the hottest (expert 0 under skew_loads) and the
    rest evenly spaced, so they spread over the ranks of a contiguous sharding."""
    L = max(1, math.ceil(budget * num_experts))
    keep = np.zeros(num_experts, dtype=bool)
    keep[np.unique(np.round(np.linspace(0, num_experts - 1, L)).astype(int))] = True
    extra = L - int(keep.sum())
    if extra > 0:
        keep[np.flatnonzero(~keep)[:extra]] = True
    return keep


def _auto_gpus(m: ModelProfile, hw: Hardware, mem_util: float) -> int:
    need = weight_bytes(m, 1.0)
    g = 1
    while g * hw.mem_capacity * mem_util * 0.75 < need:
        g *= 2
    return g


def build_engine(cfg: EngineConfig) -> Engine:
    """Load the profiles, size the engine, tabulate its step prices (vectorised: a few layer_cost calls)."""
    m, hw = load_model(cfg.model), load_hardware(cfg.hardware)
    G = cfg.gpus or _auto_gpus(m, hw, cfg.mem_util)
    if G > m.num_experts:
        raise ConfigError(f"gpus is {G}; expected at most num_experts = {m.num_experts} of {m.name} (one EP rank per GPU).")
    wb = weight_bytes(m, cfg.budget)
    kv_cap = int((cfg.mem_util * G * hw.mem_capacity - wb) // kv_bytes_per_token(m))
    if kv_cap < cfg.max_seqs:
        raise ConfigError(f"{m.name} on {G} x {hw.name} leaves room for {max(kv_cap, 0)} KV tokens after "
                          f"{wb / 1e9:.0f} GB of weights; expected more GPUs (--gpus) or a smaller --budget.")
    if cfg.budget < 1 and hw.h2d_bandwidth <= 0:
        raise ConfigError(f"hardware {hw.name} has no host-to-device link (h2d_gbps 0); expected one to load experts.")
    if G > 1 and cfg.link_gbps is None and hw.link_bandwidth(cfg.link) <= 0:
        raise ConfigError(f"hardware {hw.name} has no {cfg.link} bandwidth; expected a link for {G} GPUs.")
    opts = dataclasses.replace(moe_gps_options(cfg.link), local_fraction=cfg.lar,
                               link_bandwidth=None if cfg.link_gbps is None else cfg.link_gbps * 1e9)
    resident = resident_experts(m.num_experts, cfg.budget)
    prices = _tables(cfg, m, hw, G, opts, resident)
    load_s = m.expert_bytes() / (G * hw.h2d_bandwidth) if hw.h2d_bandwidth > 0 else 0.0
    return Engine(config=cfg, model=m, hw=hw, gpus=G, prices=prices, kv_capacity=kv_cap, weight_bytes=wb,
                  expert_load_s=load_s, resident_per_layer=int(resident.sum()))


def _tables(cfg: EngineConfig, m: ModelProfile, hw: Hardware, G: int, opts, resident: np.ndarray) -> StepPrices:
    E, K, L = m.num_experts, m.top_k, float(m.num_layers)
    n_max = cfg.token_budget + cfg.max_seqs
    grid = np.unique(np.round(np.geomspace(1, n_max, 48)).astype(np.int64))
    pop = skew_loads([cfg.skewness], num_experts=E, total=1.0)[0]
    route = pop * resident if cfg.miss == "fallback" else pop
    route = route / route.sum()
    R = cfg.samples
    rng = np.random.default_rng(cfg.seed)
    n_rep = np.repeat(grid, R)
    # top-k picks K distinct experts; a multinomial over all n K assignments is close enough for pricing and
    # gets the number of active experts (what a small decode batch pays for) right on average
    counts = rng.multinomial(n_rep * K, route).astype(np.float64)  # (C, E)
    lc = layer_cost(sharded_counts(counts, G), model=m, hw=hw, work=Workload(batch=n_rep, seq_len=1, context_len=0),
                    opts=opts)
    total = lc.total.reshape(-1, R).mean(1)
    attn = (lc.attention + lc.attention_comm).reshape(-1, R).mean(1)
    n_all = np.arange(n_max + 1, dtype=np.float64)
    log_n = np.log(np.maximum(n_all, 1.0))
    base_n = L * np.interp(log_n, np.log(grid), total)
    attn_n = L * np.interp(log_n, np.log(grid), attn)
    base_n[0] = attn_n[0] = 0.0
    miss_n = np.zeros(n_max + 1)
    if cfg.miss == "load" and cfg.budget < 1:
        cold = pop[~resident]
        active = (1.0 - (1.0 - cold[None, :]) ** (n_all[:, None] * K)).sum(1)  # expected cold experts touched
        miss_n = active * m.num_moe_layers * m.expert_bytes() / (G * hw.h2d_bandwidth)
    # decode attention over the cache: every d in 1..max_seqs, context on a geometric grid
    ctx_max = 4 * cfg.token_budget + 4096
    ctx_grid = np.concatenate([[0.0], np.geomspace(1, ctx_max, 40)])
    d = np.repeat(np.arange(1, cfg.max_seqs + 1), ctx_grid.size)
    c = np.tile(ctx_grid, cfg.max_seqs)
    a1, _ = attention_time(m, hw, Workload(batch=d, seq_len=1, context_len=c), opts, G, d.size)
    a0, _ = attention_time(m, hw, Workload(batch=d, seq_len=1, context_len=0), opts, G, d.size)
    dec = np.zeros((cfg.max_seqs + 1, ctx_grid.size))
    dec[1:] = (L * np.maximum(a1 - a0, 0.0)).reshape(cfg.max_seqs, ctx_grid.size)
    pre_grid = np.unique(np.round(np.geomspace(1, cfg.token_budget, 40)))
    p1, _ = attention_time(m, hw, Workload(batch=1, seq_len=pre_grid, context_len=0), opts, G, pre_grid.size)
    p0, _ = attention_time(m, hw, Workload(batch=pre_grid, seq_len=1, context_len=0), opts, G, pre_grid.size)
    pre = L * np.maximum(p1 - p0, 0.0)
    return StepPrices(base_n=base_n, attn_n=attn_n, miss_n=miss_n, ctx_grid=ctx_grid, dec_ctx=dec, pre_grid=pre_grid,
                      pre_extra=pre)


class ExpertLoader:
    """eMoE's task-aware expert loading (§3.4): every `period` admitted prompts, the resident experts of each
    MoE layer become the top-L by eq. 2's expected tokens N_i = (sum_j W_j + T W_o) s f_i summed over tasks
    (s = 1: every layer treated as routing-sensitive; the sensitivity profile is not modelled here); loading the
    experts not yet resident costs expert_load_s each, exposed beyond the step's attention time.

    task_freq (num_tasks, L, E): per-task expert frequencies f_i (workload.task_expert_freq reads them from a
    trace); synthetic (Dirichlet(1) per task and layer, seeded) unless given. The first set is loaded before the first request (eMoE loads all experts first).
    """

    def __init__(self, engine: Engine, task_mean_output: np.ndarray, period: int, seed: int,
                 task_freq: np.ndarray | None = None) -> None:
        if not isinstance(period, int) or period < 1:
            raise ConfigError(f"period is {period!r}; expected a positive number of prompts.")
        m = engine.model
        T = task_mean_output.shape[0]
        rng = np.random.default_rng(seed + 7919)
        self.freq = task_freq if task_freq is not None else rng.dirichlet(np.ones(m.num_experts), size=(T, m.num_moe_layers))
        if self.freq.shape != (T, m.num_moe_layers, m.num_experts):
            raise ConfigError(f"task_freq has shape {self.freq.shape}; expected ({T}, {m.num_moe_layers}, {m.num_experts}).")
        self.wo = np.asarray(task_mean_output, dtype=np.float64)
        self.L = engine.resident_per_layer
        self.active = engine.config.budget < 1
        self.period, self.load_s = period, engine.expert_load_s
        self.since = 0
        self.loaded_experts = 0
        self.resident = self._top(np.ones(T))

    def _top(self, weight_T: np.ndarray) -> np.ndarray:
        n = np.einsum("t,tle->le", weight_T, self.freq)
        keep = np.zeros(n.shape, dtype=bool)
        idx = np.argpartition(-n, self.L - 1, axis=1)[:, : self.L]
        np.put_along_axis(keep, idx, True, axis=1)
        return keep

    def weights(self, prompt_sum_T: np.ndarray, count_T: np.ndarray) -> np.ndarray:
        """Eq. 2's per-task factor sum_j W_j + T W_o, (num_tasks,)."""
        return prompt_sum_T + count_T * self.wo

    def due(self, admitted: int) -> bool:
        """Whether admitting `admitted` more prompts reaches the next periodic reload."""
        return self.active and self.since + admitted >= self.period

    def delta_s(self, prompt_sum_T: np.ndarray, count_T: np.ndarray) -> float:
        """Seconds to load the experts the eq. 2 set for these running requests adds (no state change)."""
        new = self._top(self.weights(prompt_sum_T, count_T))
        return float((new & ~self.resident).sum()) * self.load_s

    def admit(self, admitted: int, prompt_sum_T: np.ndarray, count_T: np.ndarray) -> float:
        """Record `admitted` prompts; on a periodic reload swap the resident set. -> seconds of loading."""
        if not self.active or admitted == 0:
            return 0.0
        self.since += admitted
        if self.since < self.period:
            return 0.0
        self.since = 0
        new = self._top(self.weights(prompt_sum_T, count_T))
        moved = int((new & ~self.resident).sum())
        self.resident = new
        self.loaded_experts += moved
        return moved * self.load_s
