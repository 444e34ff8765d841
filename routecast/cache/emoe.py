"""eMoE's task-aware expert loading (§3.4): expected tokens per expert (eq. 2), top-L per layer under a budget.

Legend: N task types, L MoE layers, E experts, K top-k, R prompts.

Eq. 2, per task type n, layer l and expert i: N_i = (sum_j W_j + T * W_o) * s * f_i, where the W_j are the input
tokens of the task's T scheduled prompts, W_o its expected generated tokens, s in {0, 1} whether layer l is
routing-sensitive for the task (profiled, ``runtime/emoe/profile.py``) and f_i the predicted routing frequency of
expert i. The totals over task types rank each layer's experts; the top L_l are loaded, L_l set by the memory
budget: ``layer_budgets`` spreads budget x L x E experts over the layers, keeping layers that no scheduled
task is sensitive to at a floor (half the uniform share, at least K) and giving the rest to the sensitive
ones. ``emoe-flat`` is eq. 2 with every layer sensitive (s = 1) and the same L in every layer: the predictor's
choice without the task-aware allocation. Baselines choose the same number of experts per layer: random,
least-recently-used (the L_l experts each layer used most recently) and an oracle (the true counts of the
prompts to come).
"""

from __future__ import annotations

import math

import numpy as np

from routecast.common.errors import ConfigError

RESIDENCY = ("emoe", "emoe-flat", "random", "lru", "oracle")


def parse_fraction(text: str | float, where: str = "--budget") -> float:
    """'50%' or '0.5' or 50 -> 0.5; ConfigError unless 0 < fraction <= 1."""
    raw = str(text).strip()
    try:
        v = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ConfigError(f"{where} is {text!r}; expected a share of the experts such as '50%' or 0.5.") from None
    if not raw.endswith("%") and v > 1:
        v /= 100.0  # a bare 50 means 50%
    if not (math.isfinite(v) and 0 < v <= 1):
        raise ConfigError(f"{where} is {text!r}; expected a share of the experts in (0%, 100%].")
    return v


def expected_tokens(f_NLE: np.ndarray, tokens_N: np.ndarray, sensitive_NL: np.ndarray, out_tokens_N: np.ndarray | None = None,
                    running_N: np.ndarray | None = None) -> np.ndarray:
    """Eq. 2 summed over task types -> float (L, E) expected tokens per expert.

    f_NLE: predicted routing frequency per task (rows sum to 1); tokens_N: sum of the input tokens W_j of
    each task's scheduled prompts; sensitive_NL: s (bool/0-1); out_tokens_N: W_o per task (None = 0);
    running_N: T, the task's prompts (None = 0, with W_o unused).
    """
    w = np.asarray(tokens_N, np.float64).copy()
    if out_tokens_N is not None and running_N is not None:
        w += np.asarray(running_N, np.float64) * np.asarray(out_tokens_N, np.float64)
    s = np.asarray(sensitive_NL, np.float64)
    return np.einsum("n,nl,nle->le", w, s, np.asarray(f_NLE, np.float64))


def layer_budgets(fraction: float, L: int, E: int, K: int, sensitive_weight_L: np.ndarray | None = None) -> np.ndarray:
    """int (L,) experts to keep per layer: sum = round(fraction x L x E) (at least K per layer, at most E).

    sensitive_weight_L: share of the scheduled tokens whose task is sensitive at each layer (None = all
    sensitive). Layers at 0 get the floor max(K, ceil(uniform / 2)); the rest share what is left equally.
    """
    total = min(L * E, max(L * K, int(round(fraction * L * E))))
    uniform = np.full(L, total // L, np.int64)
    uniform[: total - uniform.sum()] += 1
    uniform = np.clip(uniform, K, E)
    w = None if sensitive_weight_L is None else np.asarray(sensitive_weight_L, np.float64)
    if w is None or np.all(w > 0) or np.all(w <= 0):
        return uniform
    low = w <= 0
    floor = max(K, int(math.ceil(total / L / 2)))
    out = np.where(low, floor, 0).astype(np.int64)
    left = total - int(out.sum())
    hi = np.flatnonzero(~low)
    while left > 0 and hi.size:  # equal shares, capped at E; what a full layer cannot take goes round again
        room = E - out[hi]
        hi = hi[room > 0]
        if not hi.size:
            break
        share = np.minimum(np.maximum(left // hi.size, 1), E - out[hi])
        share[np.cumsum(share) > left] = 0
        if not share.any():
            share[0] = min(left, E - out[hi[0]])
        out[hi] += share
        left -= int(share.sum())
    for i in np.flatnonzero(low):  # budget that no sensitive layer can take
        add = min(left, E - out[i])
        out[i] += add
        left -= add
    return out


def top_l(score_LE: np.ndarray, budgets_L: np.ndarray, tie_LE: np.ndarray | None = None) -> np.ndarray:
    """bool (L, E): each layer's budgets_L[l] highest-scoring experts (ties by tie_LE, then lower id)."""
    L, E = score_LE.shape
    tie = np.zeros((L, E)) if tie_LE is None else np.asarray(tie_LE, np.float64)
    order = np.lexsort((np.arange(E)[None, :].repeat(L, 0), -tie, -np.asarray(score_LE, np.float64)), axis=-1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(E)[None, :].repeat(L, 0), axis=-1)
    return rank < np.asarray(budgets_L)[:, None]


def random_resident(budgets_L: np.ndarray, E: int, rng: np.random.Generator) -> np.ndarray:
    """bool (L, E): budgets_L[l] experts drawn uniformly per layer."""
    return top_l(rng.random((len(budgets_L), E)), budgets_L)


class LRUState:
    """Per layer, when each expert was last asked for (by the routers' own choice, before any fallback).

    observe(experts_TLK, tick): every expert a token of this batch asked for gets time `tick` (and within a
    tick, more tokens = more recent). resident(budgets_L): the budgets_L[l] most recently used experts.
    """

    def __init__(self, L: int, E: int) -> None:
        self.last_LE = np.full((L, E), -np.inf)
        self.E = E

    def observe(self, experts_TLK: np.ndarray, tick: float) -> None:
        ids = np.asarray(experts_TLK, np.int64)
        T, L, K = ids.shape
        ok = ids >= 0
        lay = np.broadcast_to(np.arange(L)[None, :, None], ids.shape)
        c = np.zeros((L, self.E))
        np.add.at(c, (lay[ok], ids[ok]), 1.0)
        frac = c / max(1.0, c.max(initial=0.0) + 1.0)  # in [0, 1): orders experts within the tick
        self.last_LE = np.where(c > 0, tick + frac, self.last_LE)

    def resident(self, budgets_L: np.ndarray) -> np.ndarray:
        return top_l(self.last_LE, budgets_L)


def sensitivity_weights(sensitive_NL: np.ndarray, tokens_N: np.ndarray) -> np.ndarray:
    """float (L,): share of the scheduled tokens whose task is sensitive at each layer."""
    t = np.asarray(tokens_N, np.float64)
    return (np.asarray(sensitive_NL, np.float64) * t[:, None]).sum(0) / max(t.sum(), 1.0)


def check_residency(names: list[str]) -> list[str]:
    bad = [n for n in names if n not in RESIDENCY]
    if bad or not names:
        raise ConfigError(f"--residency holds {bad or names!r}; expected a comma-separated list of {', '.join(RESIDENCY)}.")
    return names
