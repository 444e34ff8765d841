"""Every routing statistic of a trace in one bundle: what `routecast stats TRACE` prints and writes.

routing_stats bundles the metrics of stats.py into one JSON-serialisable dict (per-layer lists and an
overall row); format_stats renders it as a compact text table. The `routecast stats` command (table,
JSON, --plot) is report/stats.py.
"""

from __future__ import annotations

import textwrap
import warnings
from typing import TYPE_CHECKING

import numpy as np

from routecast.common.errors import ConfigError
from routecast.trace.stats import (
    entropy_bits,
    fixed_set_kurtosis,
    grouped_choice_counts,
    grouped_choice_shares,
    imbalance_ratio,
    popularity_curve,
    skewness,
    step_stats,
    token_kurtosis,
    token_table_accuracy,
    top1_TL,
    transition_accuracy,
    transition_matrix,
)
from routecast.trace.stats_stream import distinct, half_sample, sequence_skewness, task_distances

if TYPE_CHECKING:
    from routecast.trace.trace import Trace

# Tokens scored by routing_stats' transition predictor (a random subset of the held-out half).
TRANSITION_EVAL_TOKENS = 8192

# (key in per_layer, column header, format). Ratios get 2 decimals, shares and accuracies 3.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("skewness", "skew", "{:.2f}"),
    ("skewness_step_mean", "skew/st", "{:.2f}"),
    ("skewness_seq_mean", "skew/seq", "{:.2f}"),
    ("ir", "IR", "{:.2f}"),
    ("ir_step_mean", "IR/st", "{:.2f}"),
    ("ir_step_max", "IRmax", "{:.2f}"),
    ("entropy_norm", "H/Hmax", "{:.3f}"),
    ("unused_experts", "unused", "{:.0f}"),
    ("top10_share", "top10%", "{:.3f}"),
    ("kurtosis_median", "kurt", "{:.1f}"),
    ("table_top1", "tok@1", "{:.3f}"),
    ("table_hit", "tok-hit", "{:.3f}"),
    ("global_top1", "glob@1", "{:.3f}"),
    ("transition_top1", "prev@1", "{:.3f}"),
    ("task_l1_mean", "taskL1", "{:.3f}"),
    ("task_half_l1_mean", "halfL1", "{:.3f}"),
    ("drift_l1_mean", "drift", "{:.3f}"),
    ("group_changed", "grp!=", "{:.3f}"),
    ("bias_changed", "bias!=", "{:.3f}"),
)

LEGEND = (
    "skew: MoE-GPS skewness (max/mean expert load) over the whole trace; skew/st, skew/seq: mean per step "
    "and per sequence. IR: PROBE imbalance ratio (max/mean rank load, contiguous sharding on ep ranks); "
    "IR/st, IRmax: mean and max per step. H/Hmax: routing entropy / log2 E. unused: experts never chosen in the trace. top10%: share of slots on the "
    "top 10% of experts (at least one). kurt: median kurtosis of per-token-id activation maps (s-MoE). tok@1, tok-hit: "
    "token-id table's expert = true top-1 / is in the true top-k (held-out documents; requests when the "
    "trace records none); glob@1: most "
    "frequent expert = top-1. prev@1: argmax transition from the previous layer's experts = top-1. "
    "taskL1: mean pairwise L1 between task distributions; halfL1: L1 between two halves of one task "
    "(the noise floor). drift: L1 between consecutive windows of steps. Grouped routers with a recorded "
    "correction bias and captured logits: grp!=: share of tokens whose executed experts differ from the "
    "unconstrained top-k of sigmoid + bias (the group limit's effect); bias!=: differ from the plain "
    "top-k of the sigmoid scores (group limit and bias together)."
)


# Default cap on the tokens the token-level statistics read (a seeded sample of whole documents or requests).
SAMPLE_TOKENS = 65536


def _nan_reduce(fn, a: np.ndarray, axis: int | None = None) -> np.ndarray:
    """np.nanmean / nanmax / nanmedian without the all-NaN RuntimeWarning (all-NaN gives NaN)."""
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0:
        return np.full(np.delete(a.shape, axis) if axis is not None else (), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(a, axis=axis)


def _to_json(x):
    """numpy -> plain Python, NaN/inf -> None, floats rounded to 6 decimals (compact, JSON-safe)."""
    if isinstance(x, dict):
        return {str(k): _to_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_json(v) for v in x]
    if isinstance(x, np.ndarray):
        if x.dtype.kind != "f":
            return x.tolist()
        r = np.round(x.astype(np.float64), 6)
        fin = np.isfinite(r)
        if fin.all():
            return r.tolist()  # the common case stays in C: no per-element Python call
        o = r.astype(object)
        o[~fin] = None
        return o.tolist()
    if isinstance(x, (np.integer, bool, np.bool_)):
        return x.item() if isinstance(x, np.generic) else x
    if isinstance(x, (float, np.floating)):
        return round(float(x), 6) if np.isfinite(x) else None
    return x


def _pool_rows(a_SL: np.ndarray, max_rows: int) -> tuple[np.ndarray, int]:
    """Mean over consecutive groups of `pool` rows so at most max_rows remain: ((ceil(S/pool), L), pool)."""
    S = len(a_SL)
    pool = max(1, -(-S // max_rows))
    if pool == 1:
        return a_SL, 1
    pad = np.full((-S % pool, *a_SL.shape[1:]), np.nan)
    return _nan_reduce(np.nanmean, np.concatenate([a_SL, pad]).reshape(-1, pool, *a_SL.shape[1:]), axis=1), pool


def routing_stats(
    trace: Trace, *, ep: int = 8, window: int | None = None, seq_len: int | None = None,
    max_tokens: int | None = None, max_step_rows: int = 4096, seed: int = 0,
) -> dict:
    """All routing statistics of a trace, JSON-serialisable (NaN -> None), per layer and overall.

    ep: EP ranks for PROBE IR (contiguous sharding). window: steps per drift window (None: ~16 windows).
    seq_len: also report MoE-GPS skewness per seq_len-token sequence (None: skip). max_tokens: cap on
    the tokens (half fit, half scored, split by document with seed; by request when the trace records no
    documents) behind the token-id table, kurtosis and transition statistics (None: SAMPLE_TOKENS, read
    when called, so a test can set a cap below a small trace's size). max_step_rows: per-step arrays longer than this are stored as means over
    consecutive steps (`steps.pool` says how many). `per_layer` maps a statistic to a list of L values;
    `overall` holds the mean over layers of each.
    """
    s = trace.spec
    L, E, K = s.num_layers, s.num_experts, s.top_k
    max_tokens = SAMPLE_TOKENS if max_tokens is None else max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < 2:
        raise ConfigError(f"max_tokens is {max_tokens!r}; expected an integer of at least 2.")
    st = step_stats(trace, ep=ep, window=window)
    counts = st.counts_LE
    per: dict[str, np.ndarray] = {
        "skewness": skewness(counts),
        "skewness_step_mean": _nan_reduce(np.nanmean, st.skew_SL, axis=0),
        "ir": imbalance_ratio(counts, ep),
        "ir_step_mean": _nan_reduce(np.nanmean, st.ir_SL, axis=0),
        "ir_step_max": _nan_reduce(np.nanmax, st.ir_SL, axis=0),
        "entropy_bits": entropy_bits(counts),
        "entropy_norm": entropy_bits(counts) / np.log2(E) if E > 1 else np.full(L, np.nan),
        "top10_share": popularity_curve(counts)[:, : max(1, E // 10)].sum(axis=1),
        "unused_experts": (counts == 0).sum(axis=1).astype(np.float64),
        "drift_l1_mean": _nan_reduce(np.nanmean, st.drift_WL, axis=0),
    }
    bias = (trace.provenance or {}).get("router_correction_bias_LE")
    if trace.logits_TLE is not None and bias is not None and s.n_group > 1:
        bias_LE = np.asarray(bias, dtype=np.float64)
        if bias_LE.shape != (L, E):
            raise ConfigError(f"provenance router_correction_bias_LE has shape {bias_LE.shape}; expected ({L}, {E}).")
        gc = {k: np.zeros(L, np.int64) for k in ("group_changed", "bias_changed", "scored")}
        for _, ch in trace.chunks():  # logits are E floats a token per layer: one chunk at a time
            for k, v in grouped_choice_counts(ch.logits_TLE, ch.experts_TLK, bias_LE).items():
                gc[k] += v
        per.update(grouped_choice_shares(gc))
    if seq_len is not None:
        per["skewness_seq_mean"] = _nan_reduce(np.nanmean, sequence_skewness(trace, seq_len), axis=0)

    # Token-level statistics on a capped sample: fit on one half of the documents (requests), score on the other.
    rng = np.random.default_rng(seed)
    fit, ev = half_sample(trace, max_tokens // 2, rng, seed=seed)
    tok = trace.tokens["token_id"]
    # Only the sampled rows are read (a gather per shard of a lazy trace), never a (T, L) array.
    both = np.sort(np.concatenate([fit, ev]))
    ex_b = trace.experts_TLK[both]
    top1_b = top1_TL(ex_b, trace.weights_TLK[both])
    fit_b, ev_b = np.searchsorted(both, fit), np.searchsorted(both, ev)
    if len(fit) and len(ev) and int(tok.max(initial=-1)) >= 0:
        per.update(token_table_accuracy(tok[fit], top1_b[fit_b], tok[ev], top1_b[ev_b], ex_b[ev_b], E))
    else:
        per.update({k: np.full(L, np.nan) for k in ("table_top1", "table_hit", "global_top1")})
    kid, kurt = token_kurtosis(tok[both], ex_b, E)
    known_k = kid >= 0  # id -1 (unknown token) is not a token
    per["kurtosis_median"] = _nan_reduce(np.nanmedian, kurt[known_k], axis=0) if known_k.any() else np.full(L, np.nan)
    P = transition_matrix(ex_b[fit_b], E)
    # Scoring costs T x K x E per layer pair: a random subset of TRANSITION_EVAL_TOKENS scored tokens
    # keeps it under a second at DeepSeek-V3 geometry (standard error < 0.6 points).
    ev_t = ev_b if len(ev) <= TRANSITION_EVAL_TOKENS else np.sort(rng.choice(ev_b, TRANSITION_EVAL_TOKENS, replace=False))
    per["transition_top1"] = np.r_[np.nan, transition_accuracy(P, ex_b[ev_t], top1_b[ev_t])]

    td = task_distances(trace, seed=seed)
    n_tasks = len(td["tasks"])
    iu = np.triu_indices(n_tasks, k=1)
    per["task_l1_mean"] = _nan_reduce(np.nanmean, td["l1_nnL"][iu], axis=0) if n_tasks > 1 else np.full(L, np.nan)
    per["task_half_l1_mean"] = _nan_reduce(np.nanmean, td["half_l1_nL"], axis=0) if n_tasks else np.full(L, np.nan)

    ir_rows, pool = _pool_rows(st.ir_SL, max_step_rows)
    skew_rows, _ = _pool_rows(st.skew_SL, max_step_rows)
    pair = (L - 1) // 2
    out = {
        "schema": "routecast.stats/1",
        "model": s.name, "num_layers": L, "num_experts": E, "top_k": K, "layer_ids": list(s.layer_ids),
        "num_tokens": trace.num_tokens, "num_requests": int(len(distinct(trace, lambda c: c["request"]))),
        "num_steps": int(len(st.steps_S)), "ep": int(ep), "window": st.window, "seq_len": seq_len,
        "token_sample": {"fit": int(len(fit)), "scored": int(len(ev)), "kurtosis_ids": int(known_k.sum()),
                         "split": "document" if trace.has_documents else "request"},
        "per_layer": per,
        "overall": {k: _nan_reduce(np.nanmean, v) for k, v in per.items()},
        "reference": {"entropy_max_bits": float(np.log2(E)), "kurtosis_fixed_set": fixed_set_kurtosis(E, K)},
        "counts_LE": counts,
        "steps": {"pool": pool, "ir_SL": ir_rows, "skew_SL": skew_rows},
        "drift_WL": st.drift_WL,
        "tasks": {
            "names": td["tasks"],
            "l1": _nan_reduce(np.nanmean, td["l1_nnL"], axis=2) if n_tasks else np.zeros((0, 0)),
            "half_l1": _nan_reduce(np.nanmean, td["half_l1_nL"], axis=1) if n_tasks else np.zeros(0),
        },
        "transition": {"layer": pair, "P_EE": P[pair]} if L > 1 else None,
    }
    return _to_json(out)


def _cell(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def format_stats(d: dict) -> str:
    """A compact text table of routing_stats output: a header, one row per MoE layer, an overall row."""
    per, overall = d["per_layer"], d["overall"]
    cols = [c for c in COLUMNS if c[0] in per]
    ts = d["token_sample"]
    head = [
        f"routing statistics: {d['model'] or 'moe'}  T={d['num_tokens']}  L={d['num_layers']}  "
        f"E={d['num_experts']}  K={d['top_k']}  requests={d['num_requests']}  steps={d['num_steps']}  "
        f"ep={d['ep']}  window={d['window']} steps",
        f"token sample: fit {ts['fit']}, scored {ts['scored']} (split by {ts['split']}); kurtosis over "
        f"{ts['kurtosis_ids']} token ids, fixed-set reference {_cell(d['reference']['kurtosis_fixed_set'], '{:.1f}')}",
    ]
    if d["tasks"]["names"]:
        head.append(f"tasks: {', '.join(d['tasks']['names'])}")
    width = [max(len(h), 6) for _, h, _ in cols]
    rows = [["layer", *[h.rjust(w) for (_, h, _), w in zip(cols, width, strict=True)]]]
    for i, lid in enumerate(d["layer_ids"]):
        rows.append([str(lid), *[_cell(per[k][i], f).rjust(w) for (k, _, f), w in zip(cols, width, strict=True)]])
    rows.append(["all", *[_cell(overall[k], f).rjust(w) for (k, _, f), w in zip(cols, width, strict=True)]])
    lw = max(len(r[0]) for r in rows)
    table = [" ".join([r[0].ljust(lw), *r[1:]]) for r in rows]
    table.insert(len(table) - 1, "-" * len(table[0]))
    return "\n".join([*head, "", *table, "", textwrap.fill(LEGEND, width=100)])
