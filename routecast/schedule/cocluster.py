"""Token-expert co-clustering for speculative MoE (s-MoE §3.4, Appendix B): plans, and what they save on a trace.

Legend: T token-positions, L MoE layers, E experts, K top-k, U distinct token ids of the profile, G EP ranks.
A plan holds, per layer, the group (rank) of every expert (expert_group_LE: the s-EG expert pre-grouping) and
the rank every profiled token id is shuffled to (token_group_LU, s-TS's token-to-device table T with confidence
Tp). The affinity each method partitions is W_UE per layer: how often token id u was routed to expert e in the
profile (the paper's a_j Cp,jk up to the constant K).

Scoring a plan on a trace (evaluate_plan): a token-position at layer l is placed on its id's rank; ids the plan
never saw stay on their home rank, as do all tokens of plain EP ("none"). Home rank: the step's tokens split
into G contiguous slices in trace order (what the TP reduce-scatter leaves each rank). Metrics:
- LAR, local activation rate: share of routed (token, expert) assignments whose expert is on the token's rank;
- expert-load imbalance: max / mean over ranks of the routed assignments each rank's experts process (per layer,
  over the whole trace);
- token-load imbalance: max / mean tokens a rank hosts per step, token-weighted over steps;
- a2a bytes per layer (dispatch; the combine returns the same): remote assignments x hidden x act_bytes (no
  deduplication, DeepSpeed-MoE) and distinct remote ranks per token x hidden x act_bytes (deduplicated).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from tqdm.auto import tqdm

from routecast.common.errors import ConfigError
from routecast.schedule import baselines
from routecast.schedule.ceo import CEOConfig, ceo_cocluster
from routecast.trace import Trace
from routecast.trace.stats import column_chunks, masked_value_counts

METHODS = ("smoe", "metis", "kmeans", "hypergraph", "random", "sts", "none")
PLAN_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class CoclusterPlan:
    """expert_group_LE int32 (L, E); token_keys_U int64 (U,) sorted token ids; token_group_LU int32 (L, U);
    token_conf_LU float32 (L, U) (Tp: the confidence of the token's rank; 1 for methods without one);
    fit_s: seconds per layer; ep = G; beta: the token-load bound the tokens were assigned under."""

    method: str
    ep: int
    expert_group_LE: np.ndarray
    token_keys_U: np.ndarray
    token_group_LU: np.ndarray
    token_conf_LU: np.ndarray
    beta: float = 1.1
    fit_s: tuple[float, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    def expert_permutation_LE(self) -> np.ndarray:
        """(L, E) int64: new expert slot j holds old expert perm[l, j]; experts of rank g fill slots g*E/G..."""
        return np.argsort(self.expert_group_LE, axis=1, kind="stable")

    def token_ranks(self, token_id_T: np.ndarray, home_T: np.ndarray, layer: int) -> np.ndarray:
        """(T,) rank of each token at `layer`: its id's table entry, or home_T where the plan never saw it."""
        q = np.asarray(token_id_T, np.int64)
        keys = self.token_keys_U
        if keys.size == 0:
            return np.asarray(home_T, np.int64)
        pos = np.minimum(np.searchsorted(keys, q), keys.size - 1)
        hit = keys[pos] == q
        return np.where(hit, self.token_group_LU[layer, pos], home_T).astype(np.int64)

    def to_json(self) -> str:
        return json.dumps({
            "version": PLAN_VERSION, "method": self.method, "ep": self.ep, "beta": self.beta,
            "fit_s": list(self.fit_s), "meta": self.meta,
            "expert_group_LE": self.expert_group_LE.tolist(), "token_keys_U": self.token_keys_U.tolist(),
            "token_group_LU": self.token_group_LU.tolist(),
            "token_conf_LU": np.round(self.token_conf_LU.astype(np.float64), 5).tolist(),
        })


def _plan_schema():

    from pydantic import Field

    from routecast.common.schemas import Finite, Strict

    class PlanFile(Strict):
        """a plan written by `routecast schedule cocluster`: version, method, ep, beta, fit_s, meta and tables"""

        version: int
        method: str = ""
        ep: int = Field(ge=1, le=4096)
        beta: Finite = Field(default=1.1, ge=1.0)
        fit_s: list[Finite] = []
        meta: dict[str, Any] = {}
        expert_group_LE: list[list[Any]] = Field(min_length=1)
        token_keys_U: list[Any]
        token_group_LU: list[list[Any]]
        token_conf_LU: list[list[Any]]

    return PlanFile


def read_plan(path: str | Path, flag: str = "--plan") -> CoclusterPlan:
    """A plan file written by `routecast schedule cocluster`, checked: ConfigError naming the field (and
    `flag`, the option that named the file) otherwise."""
    from routecast.common.schemas import float_array, int_array, parse, read_json

    p = Path(path)
    doc = read_json(p, flag, "a plan written by `routecast schedule cocluster`")
    if not isinstance(doc, dict) or doc.get("version") != PLAN_VERSION:
        raise ConfigError(f"{flag} {p}: version {doc.get('version') if isinstance(doc, dict) else None!r}; expected {PLAN_VERSION}.")
    d = parse(_plan_schema(), doc, p, flag)
    ep = d.ep
    eg = int_array(d.expert_group_LE, "expert_group_LE", p, flag, ndim=2, lo=0, hi=ep - 1)
    keys = int_array(d.token_keys_U, "token_keys_U", p, flag, ndim=1, lo=0, nonempty=False)
    tg = int_array(d.token_group_LU, "token_group_LU", p, flag, ndim=2, lo=0, hi=ep - 1,
                   shape=(eg.shape[0], keys.size), nonempty=False)
    tc = float_array(d.token_conf_LU, "token_conf_LU", p, flag, ndim=2, lo=0.0, hi=1.0, shape=tg.shape)
    L, E = eg.shape if eg.ndim == 2 else (0, 0)
    if eg.ndim != 2 or ep < 1 or E % ep:
        raise ConfigError(f"{flag} {p}: expert_group_LE has shape {eg.shape} for ep {ep}; expected (L, E) with E divisible by ep.")
    if eg.min() < 0 or eg.max() >= ep or np.any(np.stack([np.bincount(r, minlength=ep) for r in eg]) != E // ep):
        raise ConfigError(f"{flag} {p}: expert_group_LE does not put exactly {E // ep} experts on each of {ep} ranks per layer.")
    if keys.size and (np.any(np.diff(keys) <= 0) or tg.min() < 0 or tg.max() >= ep or not np.isfinite(tc).all()):
        raise ConfigError(f"{flag} {p}: token tables are unsorted or hold a rank outside 0..{ep - 1}; expected a valid plan.")
    return CoclusterPlan(method=d.method, ep=ep, expert_group_LE=eg.astype(np.int32),
                         token_keys_U=keys, token_group_LU=tg.astype(np.int32), token_conf_LU=tc.astype(np.float32),
                         beta=d.beta, fit_s=tuple(d.fit_s), meta=dict(d.meta))


# ------------------------------------------------------------------------------------------ affinity
def fit_sample(trace: Trace, rows: np.ndarray | None, max_tokens: int | None, seed: int = 0) -> tuple[np.ndarray, str]:
    """The rows a plan is fitted on: bool (T,) `rows` (None = all), limited to max_tokens rows (None: no cap).

    Over the cap, a seeded sample of whole requests (permuted with seed, taken while their rows fit) replaces
    the rows, and the note says so in one sentence ("" when every row is kept). The fit copies its rows'
    routing into memory (L x K int16 a row), so the cap bounds its memory on a trace of any size. Requests
    and their sizes are counted one chunk at a time; the result is a bool (T,) mask like `rows`.
    """
    T = trace.num_tokens
    m = np.ones(T, bool) if rows is None else np.asarray(rows, bool)
    n = int(np.count_nonzero(m))
    if max_tokens is None or n <= max_tokens:
        return m, ""
    # The token columns a chunk at a time: no per-token temporaries of the whole trace.
    ids, sizes = masked_value_counts(trace, "request", m)
    order = np.random.default_rng(seed).permutation(ids.size)
    take = max(1, int(np.count_nonzero(np.cumsum(sizes[order]) <= max_tokens)))
    keep = np.sort(ids[order[:take]])
    out = np.zeros(T, bool)
    for a, c in column_chunks(trace):
        r = c["request"]
        pos = np.minimum(np.searchsorted(keep, r), keep.size - 1)
        out[a:a + len(r)] = m[a:a + len(r)] & (keep[pos] == r)
    cut = np.flatnonzero(out)[max_tokens:]  # one request longer than the cap: its first max_tokens rows
    out[cut] = False
    return out, (f"fitted on a seeded sample of {int(out.sum())} of {n} training tokens ({take} whole requests; "
                 f"--max-tokens {max_tokens})")


def _layer_affinity(inv_T: np.ndarray, experts_TK: np.ndarray, U: int, E: int) -> sp.csr_matrix:
    """W_UE of one layer: routed-slot counts of token key index inv_T (T,) to the experts of experts_TK (T, K)."""
    e_TK = np.asarray(experts_TK, np.int64)
    ok = e_TK >= 0
    r = np.broadcast_to(inv_T[:, None], e_TK.shape)[ok]
    return sp.csr_matrix((np.ones(r.size), (r, e_TK[ok])), shape=(U, E))


def _profile(trace: Trace, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token_keys_U sorted int64, key index of each profiled row (T',), experts_TLK int16 (T', L, K)):
    the rows in the mask, gathered once (only those rows are read from a lazy trace)."""
    idx = np.arange(trace.num_tokens) if rows is None else np.flatnonzero(np.asarray(rows, bool))
    keys, inv = np.unique(np.asarray(trace.token_id[idx], np.int64), return_inverse=True)
    return keys, inv.reshape(-1), trace.experts_TLK[idx]


def affinity(trace: Trace, rows: np.ndarray | None = None) -> tuple[np.ndarray, list[sp.csr_matrix]]:
    """(token_keys_U sorted int64, per layer W_UE csr float64): routed-slot counts of token id u to expert e."""
    s = trace.spec
    keys, inv, ex = _profile(trace, rows)
    return keys, [_layer_affinity(inv, ex[:, layer], keys.size, s.num_experts) for layer in range(s.num_layers)]


def topk_sets(experts_TK: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct routed sets of one layer: (sets_NK sorted int64, how often each occurred (N,))."""
    srt = np.sort(np.asarray(experts_TK, np.int64), axis=1)
    return np.unique(srt, axis=0, return_counts=True)


def cocluster(trace: Trace, ep: int, method: str = "smoe", *, rows: np.ndarray | None = None,
              config: CEOConfig | None = None, progress: bool = False, respect_groups: bool = False) -> CoclusterPlan:
    """Fit a plan of `method` on the rows of trace in the bool (T,) mask `rows` (None = all), layer by layer.

    respect_groups: for grouped routers (spec.n_group > 1) place whole router groups (the units are the groups,
    their affinity the sum of their experts'), so the permuted checkpoint routes exactly as before (permute.py).
    """
    if method not in METHODS:
        raise ConfigError(f"--method is {method!r}; expected one of {', '.join(METHODS)}.")
    s = trace.spec
    if type(ep) is not int or ep < 1 or s.num_experts % ep:
        raise ConfigError(f"--ep is {ep!r}; expected a positive divisor of the trace's {s.num_experts} experts.")
    cfg = config or CEOConfig()
    keys, inv, ex_TLK = _profile(trace, rows)  # only the profiled rows' routing is held, as int16
    L, E, U = s.num_layers, s.num_experts, keys.size
    unit_E = np.arange(E)  # the unit each expert is placed with: itself, or its router group
    agg = None
    if respect_groups and s.n_group > 1:
        if s.n_group % ep:
            raise ConfigError(f"--respect-groups: the router's {s.n_group} expert groups cannot be split evenly over "
                              f"--ep {ep} ranks; expected an ep that divides {s.n_group}.")
        unit_E = np.arange(E) // (E // s.n_group)
        agg = sp.csr_matrix((np.ones(E), (np.arange(E), unit_E)), shape=(E, s.n_group))
    n_units = int(unit_E.max()) + 1
    eg = np.zeros((L, E), np.int32)
    tg = np.zeros((L, U), np.int32)
    tc = np.ones((L, U), np.float32)
    fit_s, hist = [], []
    ug = np.zeros((L, n_units), np.int32)
    for layer in tqdm(range(L), desc=f"cocluster {method}", disable=not progress, leave=False):
        # One layer's affinity at a time: W_UE for every layer at once would grow with L x the profile.
        W = _layer_affinity(inv, ex_TLK[:, layer], U, E)
        W = W if agg is None else sp.csr_matrix(W @ agg)
        t0 = time.perf_counter()
        if method == "smoe":
            ug[layer], tg[layer], conf, h = ceo_cocluster(W, ep, cfg)
            tc[layer] = conf
            hist.append(h)
        elif method == "metis":
            ug[layer], tg[layer] = baselines.metis_groups(W, ep, cfg.beta, cfg.seed)
        elif method == "kmeans":
            ug[layer], tg[layer] = baselines.kmeans_groups(W, ep, cfg.beta, cfg.seed)
        elif method == "hypergraph":
            ex = np.asarray(ex_TLK[:, layer], np.int64)
            if n_units != E:  # the hyperedges run over groups: a token's distinct groups
                srt = np.sort(np.where(ex >= 0, unit_E[np.maximum(ex, 0)], -1), axis=-1)
                dup = np.concatenate([np.zeros((len(srt), 1), bool), srt[:, 1:] == srt[:, :-1]], axis=-1)
                ex = np.where(dup, -1, srt)
            sets, n = topk_sets(ex)
            ug[layer], tg[layer] = baselines.hypergraph_groups(W, sets, n, ep, cfg.beta, cfg.seed)
        elif method == "random":
            ug[layer], tg[layer] = baselines.random_groups(W, ep, cfg.beta, cfg.seed + layer)
        elif method == "sts":
            ug[layer], tg[layer] = baselines.sts_groups(W, ep, cfg.beta)
        else:
            ug[layer] = baselines.contiguous_experts(n_units, ep)
        eg[layer] = ug[layer][unit_E]
        fit_s.append(time.perf_counter() - t0)
    if method == "none":  # plain EP: no token table, every token stays home
        keys, tg, tc = keys[:0], tg[:, :0], tc[:, :0]
    meta: dict[str, Any] = {"profile_tokens": int(trace.num_tokens if rows is None else np.sum(rows)), "distinct_tokens": U,
                            "respect_groups": bool(n_units != E)}
    if method == "smoe":
        meta.update(n_steps=cfg.n_steps, samples=cfg.samples, rho=cfg.rho, smoothing=cfg.smoothing,
                    token_sampling=cfg.token_sampling, seed=cfg.seed, best_lar_per_step=[h[-1] for h in hist])
    return CoclusterPlan(method=method, ep=ep, expert_group_LE=eg, token_keys_U=keys, token_group_LU=tg,
                         token_conf_LU=tc, beta=cfg.beta, fit_s=tuple(fit_s), meta=meta)


# ------------------------------------------------------------------------------------------ scoring
def home_ranks(step_T: np.ndarray, G: int) -> np.ndarray:
    """(T,) int64 home rank: each step's tokens, in trace order, split into G contiguous slices."""
    step = np.asarray(step_T)
    order = np.argsort(step, kind="stable")
    _, start, count = np.unique(step[order], return_index=True, return_counts=True)
    rank_in_step = np.empty(step.size, np.int64)
    rank_in_step[order] = np.arange(step.size) - np.repeat(start, count)
    size = np.repeat(count, count)
    out = np.empty(step.size, np.int64)
    out[order] = rank_in_step[order] * G // size
    return out


def evaluate_plan(plan: CoclusterPlan, trace: Trace, *, rows: np.ndarray | None = None,
                  act_bytes: int = 2) -> dict[str, Any]:
    """LAR, imbalances and a2a bytes of `plan` on the rows of trace (see the module docstring); per layer + mean.

    Streams the trace a window of whole steps at a time (Trace.step_chunks): every metric is a sum over
    steps, so only (L, G) totals persist and memory is bounded by the window, not the trace.
    """
    s = trace.spec
    if plan.expert_group_LE.shape != (s.num_layers, s.num_experts):
        raise ConfigError(f"plan has expert groups of shape {plan.expert_group_LE.shape}; expected the trace's "
                          f"({s.num_layers}, {s.num_experts}).")
    G, H, L = plan.ep, s.hidden_size, s.num_layers
    m_T = None if rows is None else np.asarray(rows, bool)
    z = lambda *shape: np.zeros(shape, np.int64)  # noqa: E731
    tot = {"local": z(L), "ok": z(L), "load": z(L, G), "step_max": z(L), "placed": z(L), "remote": z(L),
           "distinct": z(L), "recv": z(L, G)}
    n_tok = n_seen = 0
    for a, ch in trace.step_chunks():
        m = slice(None) if m_T is None else m_T[a:a + ch.num_tokens]
        step, tid = ch.tokens["step"][m], ch.tokens["token_id"][m]
        if not len(step):
            continue
        ex = np.asarray(ch.experts_TLK[m], np.int64)
        home = home_ranks(step, G)
        step_idx = np.unique(step, return_inverse=True)[1].reshape(-1)
        n_tok += len(step)
        n_seen += int(np.count_nonzero(np.isin(np.asarray(tid, np.int64), plan.token_keys_U)))
        for layer in range(L):
            rank_T = plan.token_ranks(tid, home, layer)
            e_TK = ex[:, layer]
            ok = e_TK >= 0
            grp_TK = plan.expert_group_LE[layer][np.where(ok, e_TK, 0)]
            local = (grp_TK == rank_T[:, None]) & ok
            remote = ok & ~local
            tot["local"][layer] += int(local.sum())
            tot["ok"][layer] += int(ok.sum())
            tot["load"][layer] += np.bincount(grp_TK[ok], minlength=G)
            per = np.bincount(step_idx * G + rank_T, minlength=(step_idx.max() + 1) * G).reshape(-1, G)
            tot["step_max"][layer] += int(per.max(axis=1).sum())
            tot["placed"][layer] += int(per.sum())
            tot["remote"][layer] += int(remote.sum())
            # Deduplicated: one copy per distinct remote rank of a token.
            srt = np.sort(np.where(remote, grp_TK, -1), axis=1)
            tot["distinct"][layer] += int((((srt[:, 1:] != srt[:, :-1]) & (srt[:, 1:] >= 0)).sum(axis=1)
                                           + (srt[:, 0] >= 0)).sum())
            tot["recv"][layer] += np.bincount(grp_TK[remote], minlength=G)
        del ch  # before the next window maps the next shard
    with np.errstate(invalid="ignore", divide="ignore"):
        out: dict[str, list[float]] = {
            "lar": (tot["local"] / np.maximum(tot["ok"], 1)).tolist(),
            "expert_imbalance": (tot["load"].max(axis=1) / np.maximum(tot["load"].mean(axis=1), 1e-12)).tolist(),
            "token_imbalance": (tot["step_max"] * G / np.maximum(tot["placed"], 1)).tolist(),
            "remote_assignments": tot["remote"].astype(float).tolist(),
            "a2a_bytes": (tot["remote"] * H * act_bytes).astype(float).tolist(),
            "a2a_bytes_dedup": (tot["distinct"] * H * act_bytes).astype(float).tolist(),
            "a2a_max_rank_bytes": (tot["recv"].max(axis=1) * H * act_bytes).astype(float).tolist(),
            "seen_share": [float(n_seen / n_tok) if plan.token_keys_U.size and n_tok else
                           (0.0 if plan.token_keys_U.size == 0 else float("nan"))] * L,
        }
    res: dict[str, Any] = {k: float(np.mean(v)) for k, v in out.items()}
    res["per_layer"] = out
    res["tokens"] = n_tok
    return res
