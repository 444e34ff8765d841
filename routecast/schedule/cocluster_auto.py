"""Co-clustering that picks its partitioner, and a saved plan scored on another trace.

`schedule cocluster --method auto` (the default): the training rows are split again, by document (by request
when the trace records none), into a fitting part and a validation part (VALIDATION_SHARE of the documents,
seeded); each of AUTO_METHODS (Speculative MoE's Algorithm 1, METIS, balanced k-means, the hypergraph
partitioner) is fitted on the fitting part and scored on the validation part; the one with the highest
local-activation rate (LAR: the share of a token's expert assignments that run on the rank holding the token,
so the all-to-all carries 1 - LAR of them) wins and is then fitted on all training rows. The choice and its
margin over the runner-up are printed and kept in the JSON.

`schedule cocluster --score PLAN`: the plan file's LAR, all-to-all bytes and imbalances on every token of
another trace (nothing held out: the plan was fitted elsewhere), beside plain EP on the same tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.schedule.ceo import CEOConfig
from routecast.schedule.cocluster import CoclusterPlan, cocluster, evaluate_plan, fit_sample
from routecast.trace import Trace

AUTO_METHODS = ("smoe", "metis", "kmeans", "hypergraph")
VALIDATION_SHARE = 0.25


def validation_rows(trace: Trace, train: np.ndarray, seed: int, share: float = VALIDATION_SHARE
                    ) -> tuple[np.ndarray, np.ndarray, str]:
    """Split the bool (T,) training rows by whole documents (else requests) -> (fit rows, validation rows, by)."""
    by = "document" if trace.has_documents else "request"
    key = trace.tokens[by]
    groups = np.unique(key[train])
    n_val = int(round(share * groups.size))
    if groups.size < 2 or not 0 < n_val < groups.size:
        raise ConfigError(f"--method auto: the training part holds {groups.size} {by}(s); expected at least 2 to "
                          "hold some out for choosing the method (or name a --method).")
    val_groups = np.random.default_rng(seed).choice(groups, n_val, replace=False)
    val = train & np.isin(key, val_groups)
    return train & ~val, val, by


def pick_method(trace: Trace, ep: int, train: np.ndarray, *, config: CEOConfig, max_tokens: int | None,
                respect_groups: bool = False, progress: bool = False) -> tuple[str, dict[str, Any]]:
    """Score AUTO_METHODS on a validation part of the training rows -> (best method, report dict).

    report: {"by", "validation_tokens", "scores": {method: validation evaluate_plan summary}, "best",
    "runner_up", "margin_lar"}.
    """
    fit, val, by = validation_rows(trace, train, config.seed)
    fit_rows, _ = fit_sample(trace, fit, max_tokens, config.seed)
    scores = {}
    for m in AUTO_METHODS:
        plan = cocluster(trace, ep, m, rows=fit_rows, config=config, progress=progress, respect_groups=respect_groups)
        s = evaluate_plan(plan, trace, rows=val)
        scores[m] = {k: s[k] for k in ("lar", "a2a_bytes", "a2a_bytes_dedup", "expert_imbalance", "token_imbalance")}
    order = sorted(AUTO_METHODS, key=lambda m: -scores[m]["lar"])
    best, second = order[0], order[1]
    return best, {"by": by, "validation_tokens": int(val.sum()), "scores": scores, "best": best, "runner_up": second,
                  "margin_lar": scores[best]["lar"] - scores[second]["lar"]}


def auto_line(rep: dict[str, Any]) -> str:
    """One sentence: which method won on validation and by how much."""
    s = rep["scores"]
    rest = ", ".join(f"{m} {s[m]['lar']:.3f}" for m in sorted(s, key=lambda m: -s[m]["lar"])[1:])
    return (f"auto: {rep['best']} has the highest local-activation rate on the validation {rep['by']}s "
            f"({s[rep['best']]['lar']:.3f}; {rest}), {rep['margin_lar']:+.3f} over {rep['runner_up']}; fitted on all "
            "training rows")


def plain_ep(plan: CoclusterPlan) -> CoclusterPlan:
    """Plain EP of the plan's geometry: expert e on rank e // (E / G), every token stays on its home rank."""
    L, E = plan.expert_group_LE.shape
    eg = np.tile((np.arange(E) // (E // plan.ep)).astype(np.int32), (L, 1))
    return CoclusterPlan(method="none", ep=plan.ep, expert_group_LE=eg, token_keys_U=np.zeros(0, np.int64),
                         token_group_LU=np.zeros((L, 0), np.int32), token_conf_LU=np.zeros((L, 0), np.float32))


def score_plan(plan: CoclusterPlan, trace: Trace) -> list[dict[str, Any]]:
    """The plan and plain EP on every token of `trace` -> rows {"method", "scored": evaluate_plan summary}."""
    s = trace.spec
    if plan.expert_group_LE.shape != (s.num_layers, s.num_experts):
        raise ConfigError(f"--score: the plan places {plan.expert_group_LE.shape[1]} experts on "
                          f"{plan.expert_group_LE.shape[0]} layers; expected the trace's {s.num_experts} experts on "
                          f"{s.num_layers} layers.")
    return [{"method": p.method, "scored": evaluate_plan(p, trace)} for p in (plain_ep(plan), plan)]
