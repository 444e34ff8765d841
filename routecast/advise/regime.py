"""The deployment a user asks about and the regime it falls in: do the experts fit, the EP degree, the phase mix.

    Deployment(model=ModelProfile, hw=Hardware, gpus=, ep=, memory_gb=, link=, rate=, slo_ttft=, slo_tpot=)
    detect_regime(dep, trace) -> Regime      memory fit (resident share of the experts), EP, prefill/decode mix

Memory: every GPU gives `memory_gb` (default: the hardware profile's capacity) x MEM_UTIL to weights and KV
cache; the dense weights (attention, embeddings, routers, shared experts: serve_cost.weight_bytes at budget 0)
are replicated over data-parallel attention ranks in the engines we price (SGLang / vLLM DP attention + EP
experts), so each GPU holds them once, and the routed experts are split over the EP ranks. KV_RESERVE of each
GPU's share is kept for the KV cache. The resident share of the routed experts is what remains over what all
experts need; below 1 the experts must be offloaded (caching and prefetch, eMoE residency apply; replication
does not, it needs spare room).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.serve.engine import weight_bytes
from routecast.sim.hardware import Hardware
from routecast.sim.models import ModelProfile
from routecast.trace.trace import Trace

MEM_UTIL = 0.9  # share of device memory an engine takes (vLLM's gpu_memory_utilization default)
KV_RESERVE = 0.1  # share of that kept for the KV cache before experts are placed
MIXED_BAND = (0.2, 0.8)  # prefill token share between these: a mixed workload; outside: prefill- or decode-heavy


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """What the user runs: model and hardware profiles, GPUs, EP degree (ep <= gpus, 1 = no expert
    parallelism), GB of memory per GPU, GPU-GPU link, request rate (req/s, None = 70% of capacity) and SLOs
    (serve.parse_slo strings: seconds or 'Nx' the unloaded latency)."""

    model: ModelProfile
    hw: Hardware
    gpus: int
    ep: int
    memory_gb: float
    link: str = "nvlink"
    rate: float | None = None
    slo_ttft: str = "5x"
    slo_tpot: str = "5x"

    def __post_init__(self) -> None:
        m = self.model
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ConfigError(f"--gpus is {self.gpus!r}; expected a positive integer.")
        if isinstance(self.ep, bool) or not isinstance(self.ep, int) or not 1 <= self.ep <= self.gpus:
            raise ConfigError(f"--ep is {self.ep!r}; expected an integer from 1 to --gpus = {self.gpus}.")
        if self.ep > 1 and m.num_experts % self.ep:
            raise ConfigError(f"--ep is {self.ep}, which does not divide the {m.num_experts} experts of {m.name}; "
                              f"expected a divisor of {m.num_experts}.")
        if not (math.isfinite(self.memory_gb) and self.memory_gb > 0):
            raise ConfigError(f"--memory-gb is {self.memory_gb}; expected a positive number of GB per GPU.")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise ConfigError(f"--rate is {self.rate}; expected a positive number of requests per second.")
        if self.ep > 1 and self.hw.link_bandwidth(self.link) <= 0:
            raise ConfigError(f"--link {self.link}: hardware {self.hw.name} has no such link; expected one it has "
                              f"(nvlink {self.hw.nvlink_bandwidth / 1e9:g} GB/s, pcie {self.hw.pcie_bandwidth / 1e9:g}).")

    def describe(self) -> str:
        link = f" over {self.link}" if self.gpus > 1 else ""
        return (f"{self.model.name} on {self.gpus} x {self.hw.name}{link} (EP {self.ep}, "
                f"{self.memory_gb:g} GB per GPU)")


@dataclass(frozen=True, kw_only=True)
class Regime:
    """The regime of a deployment on a trace.

    resident_share: routed experts that fit in memory / all (1.0 = everything fits; capped at 1); fits: it is 1;
    spare_slots_per_rank: expert slots per EP rank beyond its E / ep (replication room, 0 when offloading);
    prefill_share: prefill tokens / all tokens of the trace; mix: "prefill-heavy" | "mixed" | "decode-heavy";
    tokens, steps, requests of the trace; mean_step_tokens; skewness (hottest expert / mean, token-weighted
    over steps and layers); notes: one line per assumption.
    """

    resident_share: float
    fits: bool
    ep: int
    spare_slots_per_rank: int
    expert_gb: float
    dense_gb: float
    prefill_share: float
    mix: str
    tokens: int
    steps: int
    requests: int
    mean_step_tokens: float
    skewness: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def describe(self) -> str:
        mem = ("all experts fit in memory" if self.fits else
               f"only {self.resident_share:.0%} of the experts fit in memory: the rest must be offloaded")
        ep = f"EP {self.ep}" + (f" with {self.spare_slots_per_rank} spare expert slots per rank"
                                if self.ep > 1 and self.fits else "")
        return (f"{mem}; {ep}; {self.mix} ({self.prefill_share:.0%} of {self.tokens} tokens in prefill, "
                f"{self.steps} steps of {self.mean_step_tokens:.0f} tokens on average, skewness {self.skewness:.2f})")


def memory_fit(dep: Deployment) -> tuple[float, int, float, float]:
    """-> (resident share of routed experts, spare expert slots per EP rank, GB of all routed experts, GB dense)."""
    m = dep.model
    dense = weight_bytes(m, 0.0)  # budget 0: attention, embeddings, routers, shared experts
    experts = m.num_moe_layers * m.num_experts * m.expert_bytes()
    per_gpu = dep.memory_gb * 1e9 * MEM_UTIL * (1 - KV_RESERVE)
    room = dep.gpus * max(per_gpu - dense, 0.0)  # experts spread over every GPU's room
    share = room / experts if experts > 0 else 1.0
    per_rank_room = max(per_gpu - dense, 0.0) * dep.gpus / dep.ep
    slots_per_rank = int(per_rank_room // max(m.num_moe_layers * m.expert_bytes(), 1))
    spare = max(slots_per_rank - m.num_experts // dep.ep, 0) if share >= 1 else 0
    return min(share, 1.0), spare, experts / 1e9, dense / 1e9


def trace_mix(trace: Trace) -> tuple[float, int, int, float, float]:
    """-> (prefill token share, steps, requests, mean tokens per step, skewness) of the trace, streamed.

    Skewness (MoE-GPS): per (step, layer) the hottest expert's count over the mean count, weighted by the
    step's tokens."""
    s = trace.spec
    tokens = pre = 0
    steps: set[int] = set()
    reqs: set[int] = set()
    skew_w = w = 0.0
    for _, ch in trace.step_chunks():
        st = np.asarray(ch.tokens["step"], np.int64)
        tokens += st.size
        pre += int((np.asarray(ch.tokens["phase"]) == 0).sum())
        steps.update(np.unique(st).tolist())
        reqs.update(np.unique(np.asarray(ch.tokens["request"], np.int64)).tolist())
        _, inv = np.unique(st, return_inverse=True)
        n = int(inv.max()) + 1
        ex = np.asarray(ch.experts_TLK, np.int64)  # (t, L, K)
        ok = ex >= 0
        key = (inv[:, None, None] * s.num_layers + np.arange(s.num_layers)[None, :, None]) * s.num_experts
        cnt = np.bincount((key + np.maximum(ex, 0))[ok], minlength=n * s.num_layers * s.num_experts)
        cnt = cnt.reshape(n * s.num_layers, s.num_experts)
        mean = cnt.sum(axis=1) / s.num_experts
        good = mean > 0
        ratio = cnt.max(axis=1)[good] / mean[good]
        wt = cnt.sum(axis=1)[good].astype(np.float64)
        skew_w += float((ratio * wt).sum())
        w += float(wt.sum())
    nsteps = max(len(steps), 1)
    return pre / max(tokens, 1), len(steps), len(reqs), tokens / nsteps, skew_w / w if w else 1.0


def detect_regime(dep: Deployment, trace: Trace) -> Regime:
    """The deployment's regime on `trace` (see the module docstring). The trace must route over the model's
    experts (its statistics and plans do not carry over to another expert count)."""
    if trace.spec.num_experts != dep.model.num_experts:
        raise ConfigError(f"the trace routes over {trace.spec.num_experts} experts and --model-profile "
                          f"{dep.model.name} has {dep.model.num_experts}; expected a profile with the trace's expert count.")
    share, spare, egb, dgb = memory_fit(dep)
    pre, steps, reqs, mean_tok, skew = trace_mix(trace)
    lo, hi = MIXED_BAND
    mix = "prefill-heavy" if pre >= hi else "decode-heavy" if pre <= lo else "mixed"
    notes = [f"memory: {dep.memory_gb:g} GB per GPU x {MEM_UTIL:.0%} engine share, {KV_RESERVE:.0%} of it kept for "
             f"KV; dense weights {dgb:.2f} GB on every GPU, routed experts {egb:.2f} GB over {dep.gpus} GPU(s)"]
    if trace.spec.num_layers != dep.model.num_moe_layers:
        notes.append(f"the trace has {trace.spec.num_layers} MoE layers and {dep.model.name} has "
                     f"{dep.model.num_moe_layers}: times per token scale the trace's mean layer to the model's")
    return Regime(resident_share=share, fits=share >= 1.0, ep=dep.ep, spare_slots_per_rank=spare, expert_gb=egb,
                  dense_gb=dgb, prefill_share=pre, mix=mix, tokens=trace.num_tokens, steps=steps, requests=reqs,
                  mean_step_tokens=mean_tok, skewness=skew, notes=tuple(notes))
