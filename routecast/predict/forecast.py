"""Forecast: what a predictor says about a step's routing, at the moment it is allowed to say it.

Two kinds (legend: T tokens of the step, L MoE layers, E experts, K top-k):
- token-level: ``scores_TLE`` float, each (t, l) row a probability distribution over experts (sums
  to 1; the chance that one routing slot of token t at layer l goes to expert e). The predicted
  expert set of a token is its top-K row entries.
- distribution-only: ``dist_LE`` float, each row the share of the step's (token, k) slots that goes
  to each expert (sums to 1). It says nothing about which token goes where; at token level every
  token is given the same top-K (the MoE-GPS probability model's rule).

Ties are broken towards the lower expert id, so every derived set is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from routecast.common.errors import ConfigError

# Scores are float32 or float64; a row may drift from 1 by accumulated rounding, not by more.
_SUM_TOL = 1e-3


def topk_indices(scores_xE: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries along the last axis, best first, ties to the lower index.

    scores_xE: (..., E) float. Returns int64 (..., k).
    """
    s = np.asarray(scores_xE)
    if s.ndim > 1 and s.shape[0] > 1 and s.strides[0] == 0:
        # A broadcast forecast (the same scores for every token): rank one row, broadcast the result,
        # instead of copying T x L x E scores (973 MB for an 8,192-token step at DeepSeek-V3 geometry).
        top = topk_indices(s[0], k)
        return np.broadcast_to(top, (s.shape[0], *top.shape))
    E = s.shape[-1]
    if k >= E or s.size == 0 or E <= 16:
        # A stable sort of the negated scores keeps equal scores in expert-id order.
        return np.argsort(-s, axis=-1, kind="stable")[..., :k]
    # Same result in O(E) passes instead of a full sort per row (measured ~9x faster at E = 256): the
    # k-th largest value v by a partition, then every entry above v plus the lowest-index entries equal
    # to v up to k, then a stable sort of those k.
    flat = s.reshape(-1, E)
    v = -np.partition(-flat, k - 1, axis=1)[:, k - 1:k]
    sel = flat >= v
    tied = np.flatnonzero(sel.sum(axis=1) > k)  # rows where entries equal to v spill past k
    if tied.size:
        f, vt = flat[tied], v[tied]
        eq = f == vt
        need = k - (f > vt).sum(axis=1, keepdims=True)
        sel[tied] = (f > vt) | (eq & (np.cumsum(eq, axis=1) <= need))
    idx = (np.flatnonzero(sel) % E).reshape(-1, k)  # ascending expert ids per row
    top = np.take_along_axis(flat, idx, axis=1)
    order = np.argsort(-top, axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1).reshape(*s.shape[:-1], k)


def multi_hot(ids_xK: np.ndarray, num_experts: int) -> np.ndarray:
    """Expert-id lists -> bool membership (..., E); ids < 0 (dropped slots) set nothing."""
    ids = np.asarray(ids_xK, dtype=np.int64)
    hot = np.zeros((*ids.shape[:-1], num_experts + 1), dtype=bool)
    sink = np.where(ids < 0, num_experts, ids)
    np.put_along_axis(hot, sink, True, axis=-1)
    return hot[..., :num_experts]


@dataclass(frozen=True, kw_only=True)
class Forecast:
    """A step's forecast: exactly one of scores_TLE (token-level) or dist_LE (distribution-only).

    top_k: K of the model, the default set size of topk() and active_sets(). Construction checks the
    structure; validate() checks the values.
    """

    top_k: int
    scores_TLE: np.ndarray | None = None
    dist_LE: np.ndarray | None = None
    # topk() results by k: the metrics ask for the same sets several times per step (measured 3 calls).
    _topk: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.scores_TLE is None) == (self.dist_LE is None):
            raise ConfigError("Forecast got both or neither of scores_TLE and dist_LE; expected exactly one.")
        name, arr, ndim = (
            ("scores_TLE", self.scores_TLE, 3) if self.scores_TLE is not None else ("dist_LE", self.dist_LE, 2)
        )
        if not isinstance(arr, np.ndarray) or arr.ndim != ndim or arr.dtype.kind != "f":
            raise ConfigError(
                f"Forecast.{name} is {type(arr).__name__} with shape {getattr(arr, 'shape', None)} dtype "
                f"{getattr(arr, 'dtype', None)}; expected a {ndim}-d float array."
            )
        if not 1 <= self.top_k <= arr.shape[-1]:
            raise ConfigError(f"Forecast.top_k is {self.top_k}; expected 1..E = {arr.shape[-1]}.")

    def validate(self, where: str = "Forecast") -> Forecast:
        """Check the values (finite, non-negative rows summing to 1); returns self.

        Separate from construction so the harness can check outside the timed predict() call.
        """
        arr = self._probs
        if arr.size:
            sums = arr.sum(axis=-1)
            if not (np.abs(sums - 1.0) <= _SUM_TOL).all() or arr.min() < 0:
                name = "scores_TLE" if self.token_level else "dist_LE"
                raise ConfigError(
                    f"{where}.{name} has rows summing to {float(sums.min()):.4g}..{float(sums.max()):.4g} "
                    f"(min entry {float(arr.min()):.4g}); expected non-negative rows summing to 1."
                )
        return self

    # ---------------------------------------------------------------- shape
    @property
    def token_level(self) -> bool:
        return self.scores_TLE is not None

    @property
    def num_tokens(self) -> int | None:
        """T for a token-level forecast, None for a distribution."""
        return None if self.scores_TLE is None else int(self.scores_TLE.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self._probs.shape[-2])

    @property
    def num_experts(self) -> int:
        return int(self._probs.shape[-1])

    @property
    def _probs(self) -> np.ndarray:
        return self.scores_TLE if self.scores_TLE is not None else self.dist_LE

    # ---------------------------------------------------------------- derived sets
    def topk(self, k: int | None = None) -> np.ndarray:
        """The k most likely experts, best first: int64 (T, L, k) or (L, k) for a distribution.

        k defaults to top_k and is clipped to E.
        """
        k = self.top_k if k is None else k
        if k < 1:
            raise ConfigError(f"Forecast.topk: k is {k}; expected a positive integer.")
        k = min(k, self.num_experts)
        if k not in self._topk:
            top = topk_indices(self._probs, k)
            top.flags.writeable = False  # shared between callers
            self._topk[k] = top
        return self._topk[k]

    def token_topk(self, num_tokens: int, k: int | None = None) -> np.ndarray:
        """Per-token top-k for a step of num_tokens tokens: int64 (T, L, k); a distribution is broadcast."""
        top = self.topk(k)
        if self.scores_TLE is None:
            return np.broadcast_to(top, (num_tokens, *top.shape))
        if top.shape[0] != num_tokens:
            raise ConfigError(f"Forecast.token_topk: num_tokens is {num_tokens}; the forecast covers {top.shape[0]}.")
        return top

    def expected_counts_LE(self, num_tokens: int | None = None) -> np.ndarray:
        """Expected (token, k) slots per expert: float64 (L, E), summing to K·T per layer.

        Token-level: K·Σ_t scores (num_tokens, if given, must equal T). Distribution: K·num_tokens·dist
        (num_tokens required).
        """
        if self.scores_TLE is not None:
            if num_tokens is not None and num_tokens != self.scores_TLE.shape[0]:
                raise ConfigError(
                    f"Forecast.expected_counts_LE: num_tokens is {num_tokens}; the forecast covers "
                    f"{self.scores_TLE.shape[0]} tokens."
                )
            return self.top_k * self.scores_TLE.sum(axis=0, dtype=np.float64)
        if num_tokens is None or num_tokens < 0:
            raise ConfigError(
                f"Forecast.expected_counts_LE: num_tokens is {num_tokens}; a distribution forecast needs "
                "the step's token count (a non-negative integer)."
            )
        return self.top_k * num_tokens * self.dist_LE.astype(np.float64)

    def active_sets(self, k: int | None = None, threshold: float | None = None) -> np.ndarray:
        """Predicted active experts: bool (T, L, E) for token-level, (L, E) for a distribution.

        threshold: experts whose probability is >= threshold; otherwise the top-k (k defaults to top_k).
        """
        if threshold is not None:
            if k is not None:
                raise ConfigError("Forecast.active_sets got both k and threshold; expected at most one.")
            return self._probs >= threshold
        return multi_hot(self.topk(k), self.num_experts)

    def batch_active_LE(self, num_tokens: int) -> np.ndarray:
        """Experts predicted to receive at least one of the step's num_tokens tokens: bool (L, E).

        Token-level: the union of every token's top-K (ExpertFlow's bit-wise OR of routing paths).
        Distribution: the m most likely experts, m = round(expected number of distinct experts hit),
        where expert e is hit by a token with probability min(1, K·p_e) independently per token;
        predicting only the top-K would ignore that a batch of many tokens spreads over more experts.
        """
        if self.scores_TLE is not None:
            return self.active_sets().any(axis=0)
        p_hit = np.minimum(1.0, self.top_k * self.dist_LE.astype(np.float64))
        distinct_L = (1.0 - (1.0 - p_hit) ** num_tokens).sum(axis=-1)
        m_L = np.clip(np.rint(distinct_L), min(self.top_k, num_tokens) if num_tokens else 0, self.num_experts)
        rank = np.empty(self.dist_LE.shape, dtype=np.int64)
        order = topk_indices(self.dist_LE, self.num_experts)
        np.put_along_axis(rank, order, np.arange(self.num_experts)[None, :].repeat(self.num_layers, 0), axis=-1)
        return rank < m_L[:, None]
