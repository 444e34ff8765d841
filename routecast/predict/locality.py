"""ExpertFlow's two baselines (§5.2, Table 1): temporal- and spatial-locality prediction.

Legend: T tokens of the step, L MoE layers, E experts, K top-k.
- TLP (temporal locality, request horizon): "experts activated in recent MoE computations are likely to be
  used again". A token's forecast is the true experts of its request's most recent token whose routing an
  earlier step revealed (for a decode token: the previous token of its sequence), so a decode batch's
  predicted set is exactly the set the same batch activated at its previous step, ExpertFlow's TLP. A
  token of a request with nothing revealed yet (its prefill) gets the previous step's share of routed
  slots per layer (uniform before any step). Nothing of the current step is used.
- SLP (spatial locality, Lina; layer horizon): tokens that chose expert i at layer l-1 choose similar
  experts at l. Forecast for token t at layer l: the mean over its true layer-(l-1) experts of the fitted
  transition rows P(e_l | e_{l-1}) (counts + 1 smoothing); layer 0 uses layer 0's fitted distribution.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from routecast.common.errors import ConfigError
from routecast.predict.forecast import Forecast, multi_hot
from routecast.predict.frequency import slot_counts_LE
from routecast.predict.harness import LAYER, REQUEST, Predictor, StepRouting, StepView
from routecast.trace import MoESpec, Trace


class TLPPredictor(Predictor):
    """Temporal-locality prediction: each request's most recent revealed token (see the module docstring)."""

    name: ClassVar[str] = "tlp"
    horizon: ClassVar[str] = REQUEST

    def __init__(self, spec: MoESpec) -> None:
        super().__init__(spec)
        self._prev: np.ndarray | None = None  # (L, E) the previous step's share of routed slots
        self._last: dict[int, tuple[int, np.ndarray]] = {}  # request -> (position, experts (L, K)) of its newest token

    def reset(self) -> None:
        self._prev = None
        self._last.clear()

    def predict(self, view: StepView) -> Forecast:
        """(T, L, E) scores, rows summing to 1: the request's last revealed experts, ties broken by the previous step."""
        L, E = self.spec.num_layers, self.spec.num_experts
        dist = np.full((L, E), 1.0 / E) if self._prev is None else self._prev
        scores = np.broadcast_to(1e-3 * dist, (view.num_tokens, L, E)).copy()
        if self._last:
            req = view.request.astype(np.int64)
            uniq, inv = np.unique(req, return_inverse=True)
            known = np.array([int(r) in self._last for r in uniq.tolist()])
            if known.any():
                ids = np.stack([self._last[int(r)][1] if k else np.full((L, self.spec.top_k), -1, np.int16)
                                for r, k in zip(uniq.tolist(), known.tolist(), strict=True)])  # (R, L, K)
                hot = multi_hot(ids, E)  # (R, L, E)
                scores += hot[inv].astype(np.float64)
        scores /= scores.sum(axis=-1, keepdims=True)
        return Forecast(top_k=self.spec.top_k, scores_TLE=scores)

    def observe(self, routing: StepRouting) -> None:
        c = slot_counts_LE(routing.experts_TLK, self.spec.num_experts).astype(np.float64)
        tot = c.sum(axis=-1, keepdims=True)
        self._prev = np.where(tot > 0, c / np.maximum(tot, 1.0), 1.0 / self.spec.num_experts)
        # each request's newest token in this step: the last row of its run after sorting by (request, position)
        order = np.lexsort((routing.position, routing.request))
        req = routing.request[order]
        last = order[np.r_[req[1:] != req[:-1], True]]
        for i in last.tolist():
            r, pos = int(routing.request[i]), int(routing.position[i])
            if r not in self._last or self._last[r][0] <= pos:
                self._last[r] = (pos, np.array(routing.experts_TLK[i], np.int16))

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {}, {}

    @classmethod
    def from_state(cls, spec: MoESpec, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> TLPPredictor:
        return cls(spec)


class SLPPredictor(Predictor):
    """Spatial-locality prediction from the previous layer's true experts (see the module docstring)."""

    name: ClassVar[str] = "slp"
    horizon: ClassVar[str] = LAYER

    def __init__(self, spec: MoESpec) -> None:
        super().__init__(spec)
        self._trans: np.ndarray | None = None  # (L, E, E): row e of layer l = P(expert at l | e at l-1)
        self._first: np.ndarray | None = None  # (E,) layer 0's distribution

    def fit(self, trace: Trace) -> SLPPredictor:
        L, E = self.spec.num_layers, self.spec.num_experts
        ids = trace.experts_TLK.astype(np.int64)
        trans = np.ones((L, E, E))
        for layer in range(1, L):
            prev, cur = ids[:, layer - 1, :], ids[:, layer, :]
            ok = (prev[:, :, None] >= 0) & (cur[:, None, :] >= 0)
            a = np.broadcast_to(prev[:, :, None], ok.shape)[ok]
            b = np.broadcast_to(cur[:, None, :], ok.shape)[ok]
            np.add.at(trans[layer], (a, b), 1.0)
        self._trans = trans / trans.sum(axis=-1, keepdims=True)
        first = slot_counts_LE(ids[:, :1, :], E)[0].astype(np.float64) + 1.0
        self._first = first / first.sum()
        return self

    def predict(self, view: StepView) -> Forecast:
        if self._trans is None or self._first is None:
            raise ConfigError("predictor 'slp' is not fitted; call fit(train_trace) first.")
        T, E, layer = view.num_tokens, self.spec.num_experts, view.layer
        if layer == 0 or layer is None:
            scores = np.broadcast_to(self._first, (T, 1, E)).copy()
        else:
            prev = view.experts_TlK[:, layer - 1, :].astype(np.int64)  # (T, K)
            rows = self._trans[layer][np.maximum(prev, 0)]  # (T, K, E)
            w = (prev >= 0)[:, :, None]
            s = (rows * w).sum(axis=1)
            n = w.sum(axis=1)
            scores = np.where(n > 0, s / np.maximum(n, 1), self._first[None, :])[:, None, :]
        return Forecast(top_k=self.spec.top_k, scores_TLE=scores)

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        if self._trans is None or self._first is None:
            raise ConfigError("predictor 'slp' is not fitted; nothing to save.")
        return {}, {"trans": self._trans, "first": self._first}

    @classmethod
    def from_state(cls, spec: MoESpec, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> SLPPredictor:
        p = cls(spec)
        p._trans = np.asarray(tensors["trans"], np.float64)
        p._first = np.asarray(tensors["first"], np.float64)
        return p
