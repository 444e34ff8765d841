"""Presets for synthetic traces, the statistics they are calibrated to, and `routecast synth` plumbing.

Each preset is a function returning a SynthConfig with a real model's routing geometry and knob values
chosen so that the generated trace reproduces a statistic a paper reports (named in its docstring and
in CALIBRATION). `calibrate_preset_table()` regenerates every preset and measures it again.

The statistics, as the papers measure them (all vectorised over the whole trace):
- moegps_skewness: MoE-GPS §3.2.1 -- "for each batch, we set sequence length to 512 and measure
  average skewness across batches": prefill tokens in trace order cut into 512-token blocks, skewness
  (max expert load / mean) per (block, layer), averaged over blocks and layers.
- step_ir: PROBE eq. 1 -- IR = max rank load / mean rank load per (step, layer) with contiguous
  sharded placement on ep = 8 ranks; mean_step_ir averages it over steps and layers (PROBE's "average
  IR across layers"), prefill_spike_ir takes the 90th percentile over prefill (step, layer) pairs
  ("frequent spikes in the IR above 2.6").
- token_table_accuracy: s-MoE / MoE-GPS conditional-probability table -- most frequent K experts of
  each token id on the training requests, top-k accuracy |pred & true| / K on held-out requests.
- next_layer_accuracy: s-MoE inter-layer table (Fig. 8b, one layer of look-back) -- K most frequent
  next-layer experts given this layer's expert set, top-k accuracy on held-out requests.
- tlp_batch_accuracy: ExpertFlow's temporal-locality baseline (TLP, Table 1) -- the previous decode
  step's active experts predict this step's; batch-level accuracy (eq. 7) averaged over layers.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.trace.stats import imbalance_ratio, skewness
from routecast.trace.stats_kernels import add_group_counts
from routecast.trace.synth import SynthConfig, generate, prepare, route_blocks
from routecast.trace.trace import DECODE, PREFILL, Trace


# ==================================================================== statistics
def _block_counts(trace: Trace, idx: np.ndarray, block: np.ndarray, n_blocks: int) -> np.ndarray:
    """counts (n_blocks, L, E) of the (token, k) slots of tokens idx, grouped by block id (len(idx),)."""
    L, E = trace.spec.num_layers, trace.spec.num_experts
    ids = trace.experts_TLK[idx].astype(np.int64)
    key = (block[:, None, None] * L + np.arange(L)[None, :, None]) * E + ids
    return np.bincount(key[ids >= 0], minlength=n_blocks * L * E).reshape(n_blocks, L, E)


def moegps_skewness(trace: Trace, seq_len: int = 512, task: int | None = None) -> float:
    """MoE-GPS skewness: mean over 512-token prefill blocks and layers of max / mean expert load.

    Blocks are consecutive prefill tokens in trace (processing) order, of one task when `task` is set
    (the paper runs each dataset alone); a trailing partial block is dropped. NaN if no full block.
    """
    m = trace.tokens["phase"] == PREFILL
    if task is not None:
        m &= trace.tokens["task"] == task
    idx = np.nonzero(m)[0]
    nb = idx.size // seq_len
    if nb == 0:
        return float("nan")
    block = np.full(trace.num_tokens, -1, np.int64)
    block[idx[: nb * seq_len]] = np.arange(nb * seq_len) // seq_len
    last_row = idx[np.arange(1, nb + 1) * seq_len - 1]  # a block is complete once its last row is read
    L, E = trace.spec.num_layers, trace.spec.num_experts
    total, count, done = 0.0, 0, 0
    open_c = np.zeros((0, L, E), np.int64)  # counts of blocks done .. done + len(open_c) - 1
    for a, ch in trace.chunks():  # streamed: only the blocks still open are held
        b = a + ch.num_tokens
        hi = int(np.searchsorted(idx, b - 1, side="right"))  # prefill rows read so far
        n_open = min(nb, -(-hi // seq_len)) - done
        if n_open > len(open_c):
            open_c = np.concatenate([open_c, np.zeros((n_open - len(open_c), L, E), np.int64)])
        bl = block[a:b]
        add_group_counts(ch.experts_TLK, np.where(bl >= 0, bl - done, -1), open_c)
        fin = int(np.searchsorted(last_row, b - 1, side="right")) - done  # blocks now complete
        if fin > 0:
            sk = skewness(open_c[:fin])
            total, count = total + float(np.nansum(sk)), count + int(np.isfinite(sk).sum())
            open_c, done = open_c[fin:], done + fin
    return total / count if count else float("nan")


def step_ir(trace: Trace, ep: int = 8, phase: int | None = None, min_tokens: int = 1) -> np.ndarray:
    """PROBE imbalance ratio per (step, layer): (S, L) for the S steps holding >= min_tokens tokens
    of `phase` (None = all tokens). Contiguous sharded placement of E experts on ep ranks."""
    m = np.ones(trace.num_tokens, bool) if phase is None else trace.tokens["phase"] == phase
    idx = np.nonzero(m)[0]
    steps, block = np.unique(trace.tokens["step"][idx], return_inverse=True)
    keep = np.bincount(block, minlength=steps.size) >= min_tokens
    counts = _block_counts(trace, idx, block, steps.size)[keep]
    return imbalance_ratio(counts, ep)


def _split_requests(trace: Trace, train_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    req = trace.tokens["request"]
    groups = np.unique(req)
    train = np.random.default_rng(seed).permutation(groups)[: int(round(train_frac * groups.size))]
    m = np.isin(req, train)
    return np.nonzero(m)[0], np.nonzero(~m)[0]


def _table_accuracy(key_tr, ids_tr, key_te, ids_te, E: int, min_count: int) -> tuple[float, float]:
    """Top-k accuracy of an MLE table key -> K most frequent experts; returns (accuracy, coverage).

    key_*: (n,) int64; ids_*: (n, K) experts. Only test keys seen >= min_count times in training are
    scored (coverage = their share); ties break toward the lower expert id.
    """
    K = ids_tr.shape[1]
    uk, inv = np.unique(key_tr, return_inverse=True)
    counts = np.bincount((inv[:, None] * E + ids_tr).ravel(), minlength=uk.size * E).reshape(uk.size, E)
    seen_n = np.bincount(inv, minlength=uk.size)
    pos = np.minimum(np.searchsorted(uk, key_te), uk.size - 1)
    ok = (uk[pos] == key_te) & (seen_n[pos] >= min_count)
    if not ok.any():
        return float("nan"), 0.0
    pred = np.argsort(-counts[pos[ok]], axis=1, kind="stable")[:, :K]
    hit = (pred[:, :, None] == ids_te[ok][:, None, :]).any(axis=2).sum(axis=1) / K
    return float(hit.mean()), float(ok.mean())


def token_table_accuracy(trace: Trace, train_frac: float = 0.5, min_count: int = 3, seed: int = 0,
                         per_layer: bool = False) -> float | np.ndarray:
    """Top-k accuracy of a token-id -> K-most-frequent-experts table fitted on a random train_frac of
    the requests and scored on the others (mean over layers, or (L,) with per_layer)."""
    tr, te = _split_requests(trace, train_frac, seed)
    tok, E = trace.tokens["token_id"].astype(np.int64), trace.spec.num_experts
    e = trace.experts_TLK.astype(np.int64)
    acc = np.array([_table_accuracy(tok[tr], e[tr, l], tok[te], e[te, l], E, min_count)[0]
                    for l in range(trace.spec.num_layers)])
    return acc if per_layer else float(np.nanmean(acc))


def next_layer_accuracy(trace: Trace, train_frac: float = 0.5, min_count: int = 3, seed: int = 0,
                        per_layer: bool = False) -> float | np.ndarray:
    """Top-k accuracy of a table (layer l's expert set) -> K most frequent experts at layer l + 1,
    fitted on train_frac of the requests and scored on the others (mean over l, or (L - 1,))."""
    tr, te = _split_requests(trace, train_frac, seed)
    E, L = trace.spec.num_experts, trace.spec.num_layers
    e = trace.experts_TLK.astype(np.int64)
    acc = []
    for l in range(L - 1):
        _, key = np.unique(np.sort(e[:, l], axis=1), axis=0, return_inverse=True)
        key = key.ravel()
        acc.append(_table_accuracy(key[tr], e[tr, l + 1], key[te], e[te, l + 1], E, min_count)[0])
    return np.array(acc) if per_layer else float(np.nanmean(acc))


def tlp_batch_accuracy(trace: Trace) -> float:
    """ExpertFlow TLP batch-level accuracy: over consecutive decode-only steps s - 1, s, the share of
    step s's active experts (per layer) that were active at s - 1, averaged over layers and steps."""
    step = trace.tokens["step"]
    steps, block = np.unique(step, return_inverse=True)
    pre = np.bincount(block, weights=trace.tokens["phase"] == PREFILL, minlength=steps.size)
    dec = np.bincount(block, weights=trace.tokens["phase"] == DECODE, minlength=steps.size)
    active = _block_counts(trace, np.arange(trace.num_tokens), block, steps.size) > 0
    ok = (pre[1:] == 0) & (pre[:-1] == 0) & (dec[1:] > 0) & (dec[:-1] > 0) & (np.diff(steps) == 1)
    if not ok.any():
        return float("nan")
    cur, prev = active[1:][ok], active[:-1][ok]
    return float(((cur & prev).sum(axis=2) / cur.sum(axis=2)).mean())


def prefill_spike_ir(trace: Trace, ep: int = 8, q: float = 90.0, min_tokens: int = 512) -> float:
    """PROBE prefill spikes: the q-th percentile of IR over (step, layer) pairs, counting the prefill
    tokens of steps that hold >= min_tokens of them (q = 90: one step-layer in ten is above it)."""
    ir = step_ir(trace, ep, phase=PREFILL, min_tokens=min_tokens)
    return float(np.percentile(ir, q)) if ir.size else float("nan")


def mean_step_ir(trace: Trace, ep: int = 8, min_tokens: int = 512) -> float:
    """PROBE average IR: mean over (step, layer) of steps holding >= min_tokens tokens."""
    ir = step_ir(trace, ep, min_tokens=min_tokens)
    return float(ir.mean()) if ir.size else float("nan")


# ==================================================================== presets
_MIXTRAL = {"num_layers": 32, "num_experts": 8, "top_k": 2, "hidden_size": 4096,
            "expert_bytes": 3 * 4096 * 14336 * 2, "vocab_size": 32000}
_MOEGPS_TASKS = ("mmlu", "alpaca_eval", "sst2")
# MoE-GPS batching: batch size 1, sequence length 512, prefill only (§3.2.1, §5).
_MOEGPS_BATCHING = {"output_len": (0.0,), "token_budget": 512, "max_running": 512, "arrival_rate": math.inf,
                    "drift_sigma": 0.0}
# PROBE's evaluation datasets (§6.1): Chinese and Code corpora plus "Repeat", duplicated prompts that
# skew experts on purpose (here: a sharper popularity). Requests come in short same-dataset runs.
_PROBE_WORKLOAD = {"task_names": ("chinese", "code", "repeat"), "task_mix": (0.4, 0.4, 0.2),
                   "task_divergence": 0.6, "task_stickiness": 0.5, "task_sharpness": (1.0, 1.0, 1.5),
                   "prompt_len": (512.0,), "prompt_sigma": 0.8, "output_len": (128.0,), "output_sigma": 0.8,
                   "max_running": 256, "token_strength": 2.0, "token_depth_decay": 0.3,
                   "request_strength": 1.0, "request_fanout": 2, "layer_strength": 1.0, "layer_fanout": 1,
                   "drift_sigma": 0.1, "drift_window": 256}


def mixtral_8x7b() -> SynthConfig:
    """Mixtral-8x7B (32 MoE layers, 8 experts, top-2, bf16 expert 3 x 4096 x 14336 x 2 B) serving a mix of
    MoE-GPS's three datasets (mmlu, alpaca_eval, sst2) with continuous batching.

    Reproduces s-MoE Fig. 8b (Mixtral-8x7B, one layer of look-back): next-layer top-k accuracy of a
    table from this layer's expert set = 0.60, via layer_strength = 1.4 (layer_fanout 2) on top of
    token paths (token_strength 2.0, token_fanout 2, token_depth_decay 0.3) and request_strength 1.0.
    Per-dataset skew comes from task_sharpness (0.57, 0.79, 3.15) on a Zipf(0.5) popularity with
    task_divergence 0.5: the `mixtral-8x7b:<dataset>` presets measure it the way MoE-GPS does.
    """
    return SynthConfig(
        name="mixtral-8x7b", **_MIXTRAL, task_names=_MOEGPS_TASKS, task_divergence=0.5,
        task_sharpness=(0.57, 0.79, 3.15), task_stickiness=0.5, popularity_alpha=0.5,
        token_strength=2.0, token_fanout=2, token_depth_decay=0.3, request_strength=1.0, request_fanout=2,
        layer_strength=1.4, layer_fanout=2, drift_sigma=0.1, drift_window=256, arrival_rate=200.0,
        prompt_len=(80.0, 40.0, 22.0), prompt_sigma=0.5, output_len=(2.0, 300.0, 2.0), output_sigma=0.7,
        token_budget=8192, max_running=256,
    )


def _moegps(task: int) -> SynthConfig:
    mix = tuple(1.0 if i == task else 0.0 for i in range(len(_MOEGPS_TASKS)))
    return dataclasses.replace(mixtral_8x7b(), name=f"mixtral-8x7b:{_MOEGPS_TASKS[task].split('_')[0]}",
                               task_mix=mix, **_MOEGPS_BATCHING)


def mixtral_8x7b_mmlu() -> SynthConfig:
    """Mixtral-8x7B on MMLU as MoE-GPS measures it: prefill only, 512-token batches of packed prompts
    (median 80 tokens). Reproduces MoE-GPS Table 1 / §3.2.1 skewness 1.388 via task_sharpness 0.57 of
    the mmlu task (all other knobs as `mixtral-8x7b`)."""
    return _moegps(0)


def mixtral_8x7b_alpaca() -> SynthConfig:
    """Mixtral-8x7B on Alpaca Eval as MoE-GPS measures it: prefill only, 512-token batches of packed
    prompts (median 40 tokens). Reproduces MoE-GPS skewness 1.402 via task_sharpness 0.79 of the
    alpaca_eval task (all other knobs as `mixtral-8x7b`)."""
    return _moegps(1)


def mixtral_8x7b_sst2() -> SynthConfig:
    """Mixtral-8x7B on SST2 as MoE-GPS measures it: prefill only, 512-token batches of packed sentences
    (median 22 tokens). Reproduces MoE-GPS skewness 1.990 via task_sharpness 3.15 of the sst2 task (all
    other knobs as `mixtral-8x7b`)."""
    return _moegps(2)


def deepseek_v3() -> SynthConfig:
    """DeepSeek-V3 (58 MoE layers = model layers 3..60, 256 routed experts + 1 shared, top-8 with 8 groups
    of which 4 are chosen; bf16 expert 3 x 7168 x 2048 x 2 B, the release stores fp8 = half) serving
    three generic tasks with log-normal drift (sigma 0.25 per 256 steps, the range EPLB studies use).

    Reproduces s-MoE §1 (contribution 5): token-expert routes are predictable from the token itself
    with 89% accuracy -- here the top-k accuracy of a token-id table on held-out requests = 0.89, via
    token paths of token_fanout 8 (inside the token's 4 groups) with token_strength 32 (the token all but
    fixes its experts; token_depth_decay 0.1), request_strength 0.5, layer_strength 1.0, Zipf(0.6).
    """
    return SynthConfig(
        name="deepseek-v3", num_layers=58, num_experts=256, top_k=8, n_group=8, topk_group=4,
        hidden_size=7168, expert_bytes=3 * 7168 * 2048 * 2, num_shared_experts=1, layer_ids=tuple(range(3, 61)),
        vocab_size=129280, task_names=("chat", "code", "math"), task_divergence=0.5, task_stickiness=0.5,
        popularity_alpha=0.6, token_strength=32.0, token_fanout=8, token_depth_decay=0.1,
        request_strength=0.5, request_fanout=2, layer_strength=1.0, layer_fanout=1, drift_sigma=0.25,
        drift_window=256, arrival_rate=20.0, prompt_len=(1024.0,), prompt_sigma=1.0, output_len=(256.0,),
        output_sigma=1.0, token_budget=8192, max_running=256,
    )


def qwen3_235b() -> SynthConfig:
    """Qwen3-235B-A22B (94 MoE layers, 128 experts, top-8; bf16 expert 3 x 4096 x 1536 x 2 B) on PROBE's
    workload: Chinese / Code / Repeat requests (short same-dataset runs), continuous batching of 2048-token
    steps.

    Reproduces PROBE §2.1 at EP = 8 with sharded placement: mean IR over steps and layers = 1.86, the
    middle of the 1.43-2.28 range PROBE reports while decoding (Fig. 2c-d) and below GPT-OSS's 2.13 as
    PROBE finds for the denser Qwen3. Knobs: Zipf popularity_alpha 2.1, task_divergence 0.6, Repeat
    task_sharpness 1.5, token_strength 2.0 (token_fanout 4), request 1.0, layer 1.0. Its prefill spikes
    (90th percentile of prefill IR over step-layers) come out near 2.3.
    """
    return SynthConfig(
        name="qwen3-235b", num_layers=94, num_experts=128, top_k=8, hidden_size=4096,
        expert_bytes=3 * 4096 * 1536 * 2, vocab_size=151936, popularity_alpha=2.1, token_fanout=4,
        token_budget=2048, **_PROBE_WORKLOAD,
    )


def gpt_oss_120b() -> SynthConfig:
    """GPT-OSS-120B (36 MoE layers, 128 experts, top-4; bf16 expert 3 x 2880 x 2880 x 2 B, the release
    stores MXFP4) on PROBE's workload: Chinese / Code / Repeat requests (short same-dataset runs),
    continuous batching of 4096-token steps.

    Reproduces PROBE at EP = 8 with sharded placement: mean IR over steps and layers = 2.13 (§6.5,
    Fig. 11, the baseline averaged over layers 1-35) and prefill spikes, 90th percentile of prefill
    IR over (step, layer) = 2.6 ("frequent spikes in the IR above 2.6", §2.1, Fig. 2a-b). Knobs: Zipf
    popularity_alpha 2.0, task_divergence 0.6, Repeat task_sharpness 1.5, token_strength 2.0
    (token_fanout 2), request 1.0, layer 1.0.
    """
    return SynthConfig(
        name="gpt-oss-120b", num_layers=36, num_experts=128, top_k=4, hidden_size=2880,
        expert_bytes=3 * 2880 * 2880 * 2, vocab_size=201088, popularity_alpha=2.0, token_fanout=2,
        token_budget=4096, **_PROBE_WORKLOAD,
    )


def switch_128() -> SynthConfig:
    """Switch-Base-128 (12 MoE layers: every other FFN of its 12 encoder + 12 decoder blocks, layer ids 1,
    3, ..., 23; 128 experts, top-1; d_model 768, d_ff 3072, expert 2 x 768 x 3072 x 2 B) decoding WMT16
    translations in static batches of 32 (equal output lengths keep the batch together).

    Reproduces ExpertFlow Table 1: temporal-locality (TLP) batch-level accuracy at batch size 32 on
    WMT16 = 0.2415, via a flat popularity (Zipf 0.1: the model is trained with a load-balancing loss)
    and token_strength 4.2 (token_fanout 1): repeated frequent tokens are its only temporal locality.
    Uniform routing would give 0.223. ExpertFlow's batch 8 and 16 figures (0.056, 0.111) lie below the
    uniform baseline, which no stationary routing reproduces, so they are not targets.
    """
    return SynthConfig(
        name="switch-128", num_layers=12, num_experts=128, top_k=1, hidden_size=768,
        expert_bytes=2 * 768 * 3072 * 2, layer_ids=tuple(range(1, 24, 2)), vocab_size=32128,
        task_names=("wmt16", "xsum"), task_mix=(1.0, 0.0), task_divergence=0.5, popularity_alpha=0.1,
        token_strength=4.2, token_fanout=1, token_depth_decay=0.3, request_strength=0.5, request_fanout=1,
        layer_strength=1.0, layer_fanout=1, prompt_len=(40.0, 400.0), prompt_sigma=0.4,
        output_len=(40.0, 30.0), output_sigma=0.0, token_budget=16384, max_running=32,
    )


PRESETS: dict[str, Callable[[], SynthConfig]] = {
    "mixtral-8x7b": mixtral_8x7b,
    "mixtral-8x7b:mmlu": mixtral_8x7b_mmlu,
    "mixtral-8x7b:alpaca": mixtral_8x7b_alpaca,
    "mixtral-8x7b:sst2": mixtral_8x7b_sst2,
    "deepseek-v3": deepseek_v3,
    "qwen3-235b": qwen3_235b,
    "gpt-oss-120b": gpt_oss_120b,
    "switch-128": switch_128,
}


# ==================================================================== calibration
@dataclasses.dataclass(frozen=True, kw_only=True)
class Calibration:
    """One statistic a preset reproduces: measured on a trace of num_tokens tokens (seed 0)."""

    preset: str
    statistic: str
    target: float
    source: str
    measure: Callable[[Trace], float]
    num_tokens: int


CALIBRATION: tuple[Calibration, ...] = (
    Calibration(preset="mixtral-8x7b", statistic="next-layer top-k accuracy (expert-set table)", target=0.60,
                source="s-MoE Fig. 8b", measure=next_layer_accuracy, num_tokens=20480),
    Calibration(preset="mixtral-8x7b:mmlu", statistic="skewness per 512-token batch", target=1.388,
                source="MoE-GPS §3.2.1", measure=moegps_skewness, num_tokens=20480),
    Calibration(preset="mixtral-8x7b:alpaca", statistic="skewness per 512-token batch", target=1.402,
                source="MoE-GPS §3.2.1", measure=moegps_skewness, num_tokens=20480),
    Calibration(preset="mixtral-8x7b:sst2", statistic="skewness per 512-token batch", target=1.990,
                source="MoE-GPS §3.2.1", measure=moegps_skewness, num_tokens=20480),
    Calibration(preset="deepseek-v3", statistic="token-id table top-k accuracy", target=0.89,
                source="s-MoE §1", measure=token_table_accuracy, num_tokens=10000),
    Calibration(preset="qwen3-235b", statistic="mean IR per step and layer, EP=8", target=1.86,
                source="PROBE Fig. 2c-d", measure=mean_step_ir, num_tokens=16384),
    Calibration(preset="gpt-oss-120b", statistic="mean IR per step and layer, EP=8", target=2.13,
                source="PROBE Fig. 11", measure=mean_step_ir, num_tokens=40960),
    Calibration(preset="gpt-oss-120b", statistic="p90 prefill IR per step and layer, EP=8", target=2.6,
                source="PROBE Fig. 2a-b", measure=prefill_spike_ir, num_tokens=40960),
    Calibration(preset="switch-128", statistic="TLP batch-level accuracy, batch 32", target=0.2415,
                source="ExpertFlow Table 1", measure=tlp_batch_accuracy, num_tokens=20000),
)


def calibrate_preset_table(presets: Sequence[str] | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Regenerate each preset (at its calibration size) and measure its statistics.

    Returns one dict per CALIBRATION row: preset, statistic, target, measured, within_10pct, source,
    tokens, seconds (generation time, shared by a preset's rows).
    """
    rows: list[dict[str, Any]] = []
    cache: dict[tuple[str, int], tuple[Trace, float]] = {}
    for cal in CALIBRATION:
        if presets is not None and cal.preset not in presets:
            continue
        key = (cal.preset, cal.num_tokens)
        if key not in cache:
            t0 = time.perf_counter()
            trace = generate(dataclasses.replace(PRESETS[cal.preset](), num_tokens=cal.num_tokens, seed=seed))
            cache[key] = (trace, time.perf_counter() - t0)
        trace, secs = cache[key]
        measured = float(cal.measure(trace))
        rows.append({"preset": cal.preset, "statistic": cal.statistic, "target": cal.target,
                     "measured": round(measured, 4), "within_10pct": bool(abs(measured - cal.target) <= 0.1 * cal.target),
                     "source": cal.source, "tokens": trace.num_tokens, "seconds": round(secs, 2)})
    return rows


# ==================================================================== CLI plumbing
def knob_names() -> list[str]:
    """Every SynthConfig field name, in declaration order (the valid `--set` knobs)."""
    return [f.name for f in dataclasses.fields(SynthConfig)]


def parse_set_args(items: Sequence[str], where: str = "--set") -> dict[str, str]:
    """["knob=value", ...] -> {knob: value}; an item without '=' raises a ConfigError naming it."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{where}: {item!r} is not of the form knob=value; expected e.g. drift_sigma=0.3.")
        out[key.strip()] = value.strip()
    return out


def with_overrides(cfg: SynthConfig, overrides: dict[str, Any] | None, where: str = "--set") -> SynthConfig:
    """cfg with knobs replaced; strings ("1.5", "a,b", "inf", "3") are parsed to the field's type.

    An unknown knob or an unparsable value raises a ConfigError naming `where`, the knob, the value and
    the valid knobs or the expected form; a value out of range raises SynthConfig's own ConfigError.
    """
    if not overrides:
        return cfg
    names = knob_names()
    kw: dict[str, Any] = {}
    for key, raw in overrides.items():
        if key not in names:
            raise ConfigError(f"{where}: unknown knob {key!r}; expected one of {', '.join(names)}.")
        current = getattr(cfg, key)
        try:
            kw[key] = _parse_like(current, raw, key)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{where}: knob {key} = {raw!r} cannot be read as {type(current).__name__}; "
                f"expected a value like {current!r}."
            ) from None
    return dataclasses.replace(cfg, **kw)


def _parse_like(current: Any, raw: Any, key: str) -> Any:
    if not isinstance(raw, str):
        return tuple(raw) if isinstance(current, tuple) and isinstance(raw, list) else raw
    if isinstance(current, tuple):
        items = [s.strip() for s in raw.split(",") if s.strip()]
        if key == "task_names":
            return tuple(items)
        return tuple(int(s) for s in items) if key == "layer_ids" else tuple(float(s) for s in items)
    if isinstance(current, int):
        v = float(raw)  # accepts 1e6 for counts
        if not v.is_integer():
            raise ValueError(raw)
        return int(v)
    if isinstance(current, float):
        return float(raw)
    return raw


def preset_config(preset: str, *, tokens: int | None = None, requests: int | None = None, seed: int = 0,
                  overrides: dict[str, Any] | None = None) -> SynthConfig:
    """The SynthConfig `routecast synth` generates: a preset, its --set overrides, then size and seed."""
    if preset not in PRESETS:
        raise ConfigError(f"--preset is {preset!r}; expected one of {', '.join(PRESETS)}.")
    if tokens is not None and requests is not None:
        raise ConfigError(f"--tokens {tokens} and --requests {requests} were both given; expected at most one.")
    for flag, v, lo in (("--tokens", tokens, 1), ("--requests", requests, 1), ("--seed", seed, 0)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
            raise ConfigError(f"{flag} is {v!r}; expected an integer >= {lo}.")
    cfg = with_overrides(PRESETS[preset](), overrides)
    size: dict[str, int] = {"seed": seed}
    if tokens is not None:
        size.update(num_tokens=tokens, num_requests=0)
    if requests is not None:
        size.update(num_requests=requests)
    return dataclasses.replace(cfg, **size)


def synth_to_disk(preset: str, out: str | Path, *, tokens: int | None = None, requests: int | None = None,
                  seed: int = 0, overrides: dict[str, Any] | None = None, overwrite: bool = False,
                  shard_tokens: int = 65536) -> Path:
    """Generate a preset's trace (see preset_config) and write it shard by shard as it is generated.

    Routing is drawn shard_tokens rows at a time (synth.route_blocks) and each block committed as one
    shard, so memory holds one block plus the token columns, never the trace. The draws depend on
    shard_tokens (blocks are routed independently). Returns the trace directory. Bad preset names, sizes
    or knobs and an output path the writer would refuse raise before any work. overwrite=True replaces a
    trace (finished, or left unfinished by a kill) at out once the new one is complete; generation is
    deterministic for a seed, so rerunning with --overwrite is how an interrupted synth is recovered.
    """
    cfg = preset_config(preset, tokens=tokens, requests=requests, seed=seed, overrides=overrides)
    from routecast.trace.io import TraceWriter, check_trace_out  # imported late to keep this module light

    check_trace_out(out, overwrite=overwrite)
    cols, provenance, rngs = prepare(cfg)
    provenance["preset"] = preset
    provenance["block_tokens"] = shard_tokens
    with TraceWriter(out, cfg.spec(), task_names=cfg.task_names, source_names=("synthetic",),
                     provenance=provenance, shard_tokens=shard_tokens, overwrite=overwrite) as w:
        for b0, ex, wt in route_blocks(cfg, cols, *rngs, rows=shard_tokens):
            w.append({k: v[b0:b0 + len(ex)] for k, v in cols.items()}, ex, wt, copy=False)  # fresh per block
            w.flush()
    return Path(out)
