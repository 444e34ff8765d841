"""MoE-GPS frequency predictors (§3.2, Appendices A and B): counts of routed slots, normalised.

- ``distribution`` (§3.2.1, Appendix A): per-layer multinomial MLE p̂_l,e = n_l,e / N_l, kept as a
  moving average over the batches seen (cumulative, i.e. the exact MLE, or exponential). Online: every
  revealed step updates it. It forecasts dist_LE only.
- ``probability`` (Appendix B eq. 7-8): the global MLE from the training trace; every token gets the
  globally most frequent K experts of each layer.
- ``conditional-token`` / ``conditional-position`` (eq. 9-10): the MLE per token id or per absolute
  position, with the global distribution for keys never seen in training.

With top-K routing a token contributes K slots per layer, so the MLEs count slots (dropped slots are
not counted) and each row sums to 1; the predicted set is the K most likely experts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.predict.forecast import Forecast
from routecast.predict.harness import REQUEST, Predictor, StepRouting, StepView
from routecast.trace import MoESpec, Trace
from routecast.trace.stats_kernels import add_group_counts


def slot_counts_LE(experts_TLK: np.ndarray, num_experts: int) -> np.ndarray:
    """Routed slots per expert: experts_TLK int (T, L, K) -> float64 (L, E); -1 (dropped) not counted."""
    T, L, K = experts_TLK.shape
    ids = experts_TLK.astype(np.int64)
    flat = (ids + np.arange(L, dtype=np.int64)[None, :, None] * num_experts)[ids >= 0]
    return np.bincount(flat, minlength=L * num_experts).reshape(L, num_experts).astype(np.float64)


def stream_slot_counts_LE(trace: Trace, rows: np.ndarray | None) -> np.ndarray:
    """slot_counts_LE over the rows of trace in the bool (T,) mask (None = all), one chunk at a time."""
    s = trace.spec
    out = np.zeros((s.num_layers, s.num_experts))
    for a, ch in trace.chunks():
        ex = ch.experts_TLK if rows is None else ch.experts_TLK[rows[a:a + ch.num_tokens]]
        out += slot_counts_LE(ex, s.num_experts)
    return out


def _normalise(counts_xE: np.ndarray) -> np.ndarray:
    """Rows to probabilities; an all-zero row becomes uniform (nothing seen: no expert is favoured)."""
    s = counts_xE.sum(axis=-1, keepdims=True)
    uniform = np.full_like(counts_xE, 1.0 / counts_xE.shape[-1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(s > 0, counts_xE / np.where(s > 0, s, 1.0), uniform)


# ------------------------------------------------------------------------------------------ distribution
@dataclass(frozen=True, kw_only=True)
class DistributionConfig:
    """decay 0: cumulative moving average over batches weighted by tokens (the exact MLE of every slot
    seen so far); decay in (0, 1): exponential moving average giving the newest batch weight `decay`.
    online False: the training-set MLE only (the MoE-GPS Table 1 setting)."""

    decay: float = 0.0
    online: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.decay < 1.0:
            raise ConfigError(f"DistributionConfig.decay is {self.decay}; expected 0 <= decay < 1.")


def mle_preset() -> DistributionConfig:
    """The paper's estimator: the MLE over every batch seen, updated online."""
    return DistributionConfig()


def ema_preset(decay: float = 0.2) -> DistributionConfig:
    """Tracks drift: the newest batch gets weight `decay`."""
    return DistributionConfig(decay=decay)


def static_preset() -> DistributionConfig:
    """Training-set MLE, never updated."""
    return DistributionConfig(online=False)


class DistributionPredictor(Predictor):
    """Distribution-only prediction: forecasts dist_LE, the share of slots each expert will get."""

    name = "distribution"
    horizon = REQUEST
    learns = True

    def __init__(self, spec: MoESpec, config: DistributionConfig | None = None) -> None:
        super().__init__(spec)
        self.config = config or DistributionConfig()
        self._fit_LE = np.zeros((spec.num_layers, spec.num_experts))
        self._cur_LE = self._fit_LE.copy()

    def fit(self, trace: Trace) -> DistributionPredictor:
        return self.fit_rows(trace, None)

    def fit_rows(self, trace: Trace, rows: np.ndarray | None) -> DistributionPredictor:
        """Streams the trace chunk by chunk (counts only)."""
        counts = stream_slot_counts_LE(trace, rows)
        # The EMA state is a distribution; the cumulative state keeps raw counts so new batches weigh by size.
        self._fit_LE = counts if self.config.decay == 0 else _normalise(counts) * (counts.sum(-1, keepdims=True) > 0)
        self.reset()
        return self

    def reset(self) -> None:
        self._cur_LE = self._fit_LE.copy()

    def predict(self, view: StepView) -> Forecast:
        return Forecast(top_k=self.spec.top_k, dist_LE=_normalise(self._cur_LE))

    def observe(self, routing: StepRouting) -> None:
        if not self.config.online:
            return
        batch = slot_counts_LE(routing.experts_TLK, self.spec.num_experts)
        if self.config.decay == 0:
            self._cur_LE += batch
            return
        seen = self._cur_LE.sum(-1, keepdims=True) > 0
        has = batch.sum(-1, keepdims=True) > 0
        new = (1 - self.config.decay) * _normalise(self._cur_LE) + self.config.decay * _normalise(batch)
        self._cur_LE = np.where(has, np.where(seen, new, _normalise(batch)), self._cur_LE)

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {"config": dataclasses.asdict(self.config)}, {"fit_LE": self._fit_LE}

    @classmethod
    def state_schema(cls, spec: MoESpec, meta: dict[str, Any]) -> dict[str, tuple]:
        return {"fit_LE": ((spec.num_layers, spec.num_experts), "f", ("nonneg",))}

    @classmethod
    def from_state(cls, spec: MoESpec, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> DistributionPredictor:
        p = cls(spec, DistributionConfig(**meta["config"]))
        p._fit_LE = tensors["fit_LE"].astype(np.float64)
        p.reset()
        return p


# ------------------------------------------------------------------------------------------- probability
class ProbabilityPredictor(Predictor):
    """Token-to-expert baseline: every token is given the K globally most frequent experts per layer."""

    name = "probability"
    horizon = REQUEST
    learns = True

    def __init__(self, spec: MoESpec) -> None:
        super().__init__(spec)
        self.p_LE = np.full((spec.num_layers, spec.num_experts), 1.0 / spec.num_experts)

    def fit(self, trace: Trace) -> ProbabilityPredictor:
        return self.fit_rows(trace, None)

    def fit_rows(self, trace: Trace, rows: np.ndarray | None) -> ProbabilityPredictor:
        """Streams the trace chunk by chunk (counts only)."""
        self.p_LE = _normalise(stream_slot_counts_LE(trace, rows))
        return self

    def predict(self, view: StepView) -> Forecast:
        # A broadcast view costs nothing per token; the forecast is the same for every token.
        scores = np.broadcast_to(self.p_LE, (view.num_tokens, *self.p_LE.shape))
        return Forecast(top_k=self.spec.top_k, scores_TLE=scores)

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {}, {"p_LE": self.p_LE}

    @classmethod
    def state_schema(cls, spec: MoESpec, meta: dict[str, Any]) -> dict[str, tuple]:
        return {"p_LE": ((spec.num_layers, spec.num_experts), "f", ("nonneg",))}

    @classmethod
    def from_state(cls, spec: MoESpec, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> ProbabilityPredictor:
        p = cls(spec)
        p.p_LE = tensors["p_LE"].astype(np.float64)
        return p


# ------------------------------------------------------------------------------------------- conditional
CONDITION_KEYS = ("token", "position")


@dataclass(frozen=True, kw_only=True)
class ConditionalConfig:
    """key: condition on the token id or the absolute position. prior_weight: pseudo-slots of the
    global distribution mixed into every key's counts, so that ties between a key's experts (a key
    seen once has K experts at 1/K each, the rest at 0) break towards globally frequent experts."""

    key: str = "token"
    prior_weight: float = 1.0
    # The table keeps the max_keys most frequent training keys (ties: lower key); rarer keys get the
    # global distribution, as unseen ones do. The table costs L x E x 4 bytes a key (59 KB at DeepSeek-V3
    # geometry: 8,192 keys = 486 MB, where a 129k-id vocabulary would need 7.7 GB).
    max_keys: int = 8192

    def __post_init__(self) -> None:
        if type(self.max_keys) is not int or self.max_keys < 1:
            raise ConfigError(f"ConditionalConfig.max_keys is {self.max_keys!r}; expected a positive integer.")
        if self.key not in CONDITION_KEYS:
            raise ConfigError(f"ConditionalConfig.key is {self.key!r}; expected one of {CONDITION_KEYS}.")
        if self.prior_weight < 0:
            raise ConfigError(f"ConditionalConfig.prior_weight is {self.prior_weight}; expected >= 0.")


def by_token_preset() -> ConditionalConfig:
    return ConditionalConfig(key="token")


def by_position_preset() -> ConditionalConfig:
    return ConditionalConfig(key="position")


class ConditionalPredictor(Predictor):
    """Per-key MLE table: keys_U sorted, probs_ULE; unseen keys get the global distribution."""

    horizon = REQUEST
    learns = True

    def __init__(self, spec: MoESpec, config: ConditionalConfig | None = None) -> None:
        super().__init__(spec)
        self.config = config or ConditionalConfig()
        self.name = f"conditional-{self.config.key}"
        L, E = spec.num_layers, spec.num_experts
        self.keys_U = np.zeros(0, dtype=np.int64)
        self.probs_ULE = np.zeros((0, L, E), dtype=np.float32)
        self.global_LE = np.full((L, E), 1.0 / E, dtype=np.float32)

    def _key(self, token_id: np.ndarray, position: np.ndarray) -> np.ndarray:
        return (token_id if self.config.key == "token" else position).astype(np.int64)

    def fit(self, trace: Trace) -> ConditionalPredictor:
        return self.fit_rows(trace, None)

    def fit_rows(self, trace: Trace, rows: np.ndarray | None) -> ConditionalPredictor:
        """Streams the trace chunk by chunk into a (keys, L, E) count table (memory set by at most
        max_keys keys, not by the trace: int32 counts normalised in place into float32 probabilities)."""
        L, E = self.spec.num_layers, self.spec.num_experts
        key_T = self._key(trace.token_id, trace.position)
        keys, n = np.unique(key_T if rows is None else key_T[rows], return_counts=True)
        if len(keys) > self.config.max_keys:
            keys = np.sort(keys[np.argsort(-n, kind="stable")[: self.config.max_keys]])
        U = len(keys)
        counts = np.zeros((U + 1, L, E), np.int32)  # row U: every other key (feeds only the global distribution)
        for a, ch in trace.chunks():
            m = slice(None) if rows is None else rows[a:a + ch.num_tokens]
            k = key_T[a:a + ch.num_tokens][m]
            pos = np.minimum(np.searchsorted(keys, k), max(U - 1, 0))
            add_group_counts(ch.experts_TLK[m], np.where(keys[pos] == k, pos, U) if U else np.zeros(len(k), np.int64),
                             counts)
        glob = _normalise(counts.sum(axis=0, dtype=np.float64))
        counts = counts[:U]
        self.keys_U = keys
        # Normalised in place, block by block: the float32 table reuses the int32 counts' memory (each
        # block is read into a float64 temporary before its bytes are overwritten), so the peak is one table.
        self.probs_ULE = counts.view(np.float32)
        for u0 in range(0, len(keys), 256):
            mixed = counts[u0:u0 + 256] + self.config.prior_weight * glob[None]
            self.probs_ULE[u0:u0 + 256] = _normalise(mixed)
        self.global_LE = glob.astype(np.float32)
        return self

    def shares(self, keys: np.ndarray) -> np.ndarray:
        """(T, L, E) float32: each key's row of the table (its share of the layer's K routing slots per expert), the
        global distribution for a key the table has not seen."""
        q = np.asarray(keys, np.int64)
        U = len(self.keys_U)
        pos = np.minimum(np.searchsorted(self.keys_U, q), max(U - 1, 0))
        found = (self.keys_U[pos] == q) if U else np.zeros(q.shape, dtype=bool)
        table = self.probs_ULE[pos] if U else np.empty((len(q), *self.global_LE.shape), np.float32)
        return np.where(found[:, None, None], table, self.global_LE[None])

    def step_use(self, token_ids: np.ndarray) -> np.ndarray:
        """(L·E,) the probability that a step of these tokens (the token-id table) uses each (layer, expert): each
        token's use probability min(K·share, 0.99), combined as independent, 1 - prod_t (1 - u_t) (fc-evict's
        forecast of a step from its known input tokens, cache/reuse.py)."""
        u = np.minimum(self.spec.top_k * self.shares(self._key(np.asarray(token_ids), np.zeros(len(token_ids)))
                                                     ).astype(np.float64), 0.99)
        return -np.expm1(np.log1p(-u).sum(0)).reshape(-1)

    def predict(self, view: StepView) -> Forecast:
        return Forecast(top_k=self.spec.top_k, scores_TLE=self.shares(self._key(view.token_id, view.position)))

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return (
            {"config": dataclasses.asdict(self.config)},
            {"keys_U": self.keys_U, "probs_ULE": self.probs_ULE, "global_LE": self.global_LE},
        )

    @classmethod
    def state_schema(cls, spec: MoESpec, meta: dict[str, Any]) -> dict[str, tuple]:
        L, E = spec.num_layers, spec.num_experts
        # predict() binary-searches keys_U: unsorted keys would give wrong rows without any error
        return {"keys_U": (("U",), "iu", ("sorted",)), "probs_ULE": (("U", L, E), "f", ("nonneg",)),
                "global_LE": ((L, E), "f", ("nonneg",))}

    @classmethod
    def from_state(cls, spec: MoESpec, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> ConditionalPredictor:
        p = cls(spec, ConditionalConfig(**meta["config"]))
        p.keys_U = tensors["keys_U"].astype(np.int64)
        p.probs_ULE = tensors["probs_ULE"].astype(np.float32)
        p.global_LE = tensors["global_LE"].astype(np.float32)
        return p
