"""Speculative MoE's routing predictor (s-MoE §3.3, Appendix B.1-B.2, Algorithm 2).

Legend: T tokens of the step, L MoE layers, E experts, K top-k, G EP ranks (devices), U token ids of the
profile, V vocabulary, D embedding width. Two offline tables per layer l, fitted on the training rows:
- the token-to-expert confidence table Cp (U, E): Pr(expert e | token id u) = T_ue / sum_e T_ue, the routed-slot
  counts of the profile (plus prior_weight pseudo-slots of the layer's global distribution, so ties break
  towards popular experts); the token's device confidence Tp = max_g sum_{e on g} Cp[u, e];
- the device-sequence n-gram Ap (G+1)^n x G: Pr(D_l | D_{l-1}, ..., D_{l-n}), n = lookback (the paper's 2-gram),
  where D_l is the rank holding most of the token's K experts at layer l (ties: the lower rank); layers before
  the first have the extra symbol G; counts + 1 smoothing.
Algorithm 2's choice, per token and layer: if Tp >= max Ap[history] the token table speaks (scores = Cp[u]);
else the n-gram does: scores_e = Ap[history, g(e)] * Cp[u, e] / sum_{e' on g(e)} Cp[u, e'] (the n-gram picks the
device, the token table the experts on it). Either way sum_{e on g} scores_e is the device distribution the
chosen table gives, so the predicted device (its argmax) is T[u] or A[history] exactly as in Algorithm 2.

Token ids outside the profile: with the model's input embeddings (V, D) (`predict eval` reads them from the
checkpoint named by --model or the trace's provenance, predict/embeddings.py) the nearest profiled token by
cosine similarity lends its rows; without embeddings such tokens get the layer's global distribution
(Tp is then that distribution's device mass, so the n-gram usually wins for them).

Horizon ``layer``: the n-gram reads this step's routing of layers < l (view.experts_TlK); the token table reads
only token ids. Expert-to-rank map: `group_LE` (a co-clustering plan's expert groups, schedule/cocluster.py)
or, by default, contiguous EP sharding (expert e on rank e // (E / G)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from routecast.common.errors import ConfigError
from routecast.predict.forecast import Forecast
from routecast.predict.frequency import ConditionalConfig, ConditionalPredictor
from routecast.predict.harness import LAYER, Predictor, StepView
from routecast.trace import MoESpec, Trace

# Embedding tables up to this many values (64 MB float32) are saved with the predictor.
MAX_SAVED_EMBEDDING_VALUES = 1 << 24


@dataclass(frozen=True, kw_only=True)
class SMoEConfig:
    """ep: ranks G; lookback: n of the device n-gram (the paper's 2); prior_weight: pseudo-slots of the global
    distribution in each token row (as conditional-token)."""

    ep: int = 8
    lookback: int = 2
    prior_weight: float = 1.0

    def __post_init__(self) -> None:
        if type(self.ep) is not int or self.ep < 1:
            raise ConfigError(f"SMoEConfig.ep is {self.ep!r}; expected a positive integer.")
        if type(self.lookback) is not int or not 1 <= self.lookback <= 4:
            raise ConfigError(f"SMoEConfig.lookback is {self.lookback!r}; expected 1..4 layers.")


def default_ep(num_experts: int) -> int:
    """The largest of 8, 4, 2, 1 that divides num_experts (predict eval's default rank count)."""
    return next(g for g in (8, 4, 2, 1) if num_experts % g == 0)


def contiguous_groups_LE(L: int, E: int, G: int) -> np.ndarray:
    return np.broadcast_to(np.arange(E) // (E // G), (L, E)).astype(np.int64).copy()


def majority_device(experts_TK: np.ndarray, group_E: np.ndarray, G: int) -> np.ndarray:
    """(T,) rank holding most of each token's experts (ties: lower rank; a token with no expert: rank 0)."""
    e = np.asarray(experts_TK, np.int64)
    ok = e >= 0
    T = e.shape[0]
    rows = np.broadcast_to(np.arange(T)[:, None], e.shape)[ok]
    cnt = np.bincount(rows * G + group_E[e[ok]], minlength=T * G).reshape(T, G)
    return cnt.argmax(axis=1)


def nearest_known(query_ids: np.ndarray, keys_U: np.ndarray, emb_VD: np.ndarray,
                  known: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """(Q,) index into keys_U of the known token nearest each query id by cosine similarity of their input
    embeddings; -1 where a query id is outside the embedding table. known: known_index(keys_U, emb_VD), cached."""
    q = np.asarray(query_ids, np.int64)
    out = np.full(q.shape, -1, np.int64)
    V = emb_VD.shape[0]
    ok = (q >= 0) & (q < V)
    pos_K, unit_KD = known if known is not None else known_index(keys_U, emb_VD)
    if not ok.any() or pos_K.size == 0:
        return out
    x = emb_VD[q[ok]].astype(np.float32)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    out[ok] = pos_K[(x @ unit_KD.T).argmax(axis=1)]
    return out


def known_index(keys_U: np.ndarray, emb_VD: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions in keys_U of the keys inside the embedding table, their unit-norm embeddings (K, D))."""
    pos = np.flatnonzero((keys_U >= 0) & (keys_U < emb_VD.shape[0]))
    unit = emb_VD[keys_U[pos]].astype(np.float32)
    unit /= np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    return pos, unit


class SMoEPredictor(Predictor):
    """s-MoE's token table + device n-gram with the confidence-based choice (see the module docstring)."""

    name: ClassVar[str] = "smoe"
    horizon: ClassVar[str] = LAYER
    learns: ClassVar[bool] = True

    def __init__(self, spec: MoESpec, config: SMoEConfig | None = None, *, embeddings: np.ndarray | None = None,
                 embedding_source: str = "", group_LE: np.ndarray | None = None) -> None:
        super().__init__(spec)
        self.config = config or SMoEConfig(ep=default_ep(spec.num_experts))
        L, E, G = spec.num_layers, spec.num_experts, self.config.ep
        if E % G:
            raise ConfigError(f"smoe predictor: ep {G} does not divide the {E} experts; expected a divisor of {E}.")
        self.group_LE = contiguous_groups_LE(L, E, G) if group_LE is None else np.asarray(group_LE, np.int64)
        if self.group_LE.shape != (L, E) or self.group_LE.min() < 0 or self.group_LE.max() >= G:
            raise ConfigError(f"smoe predictor: expert groups of shape {self.group_LE.shape}; expected ({L}, {E}) ranks < {G}.")
        self.embeddings = embeddings
        self.embedding_source = embedding_source if embeddings is not None else ""
        self.table = ConditionalPredictor(spec, ConditionalConfig(key="token", prior_weight=self.config.prior_weight))
        n = self.config.lookback
        self.ngram_LHG = np.full((L, (G + 1) ** n, G), 1.0 / G)  # history index in base G+1, symbol G = none
        self._onehot_EG = [np.eye(G)[self.group_LE[layer]] for layer in range(L)]
        self._known: tuple[np.ndarray, np.ndarray] | None = None  # cached unit embeddings of the profiled tokens
        self._memo: dict[int, int] = {}

    # ---------------------------------------------------------------------------- fit
    def fit(self, trace: Trace) -> SMoEPredictor:
        return self.fit_rows(trace, None)

    def fit_rows(self, trace: Trace, rows: np.ndarray | None) -> SMoEPredictor:
        self.table.fit_rows(trace, rows)
        self._known = None
        L, G = self.spec.num_layers, self.config.ep
        counts = np.ones_like(self.ngram_LHG)
        for a, ch in trace.chunks():
            ex = ch.experts_TLK if rows is None else ch.experts_TLK[rows[a:a + ch.num_tokens]]
            dev_TL = np.stack([majority_device(ex[:, layer], self.group_LE[layer], G) for layer in range(L)], axis=1)
            for layer in range(L):
                h = self._history(dev_TL, layer)
                np.add.at(counts[layer], (h, dev_TL[:, layer]), 1.0)
        self.ngram_LHG = counts / counts.sum(axis=-1, keepdims=True)
        return self

    def _history(self, dev_TL: np.ndarray, layer: int) -> np.ndarray:
        """(T,) n-gram row: devices at layers layer-n .. layer-1 in base G+1 (G where the layer does not exist)."""
        G, n = self.config.ep, self.config.lookback
        h = np.zeros(dev_TL.shape[0], np.int64)
        for j in range(layer - n, layer):
            d = dev_TL[:, j] if j >= 0 else np.full(dev_TL.shape[0], G)
            h = h * (G + 1) + d
        return h

    # ---------------------------------------------------------------------------- predict
    def token_rows(self, token_id: np.ndarray, layer: int) -> np.ndarray:
        """(T, E) Cp rows of layer `layer`: the token's own, its nearest profiled neighbour's, or the global row."""
        t = self.table
        q = np.asarray(token_id, np.int64)
        U = t.keys_U.size
        pos = np.minimum(np.searchsorted(t.keys_U, q), max(U - 1, 0))
        found = (t.keys_U[pos] == q) if U else np.zeros(q.shape, bool)
        if self.embeddings is not None and U and not found.all():
            miss = np.flatnonzero(~found)
            if self._known is None:
                self._known = known_index(t.keys_U, self.embeddings)
                self._memo = {}
            # memo: one similarity search per distinct unseen id (a function of the fitted tables only)
            todo = np.array(sorted({int(x) for x in q[miss]} - self._memo.keys()), np.int64)
            if todo.size:
                self._memo.update(zip(todo.tolist(), nearest_known(todo, t.keys_U, self.embeddings, self._known).tolist(),
                                      strict=True))
            near = np.array([self._memo[int(x)] for x in q[miss]], np.int64)
            pos[miss[near >= 0]] = near[near >= 0]
            found[miss[near >= 0]] = True
        rows = t.probs_ULE[pos, layer] if U else np.empty((q.size, self.spec.num_experts), np.float32)
        return np.where(found[:, None], rows, t.global_LE[layer][None]).astype(np.float64)

    def predict(self, view: StepView) -> Forecast:
        layer = int(view.layer)
        G = self.config.ep
        cp_TE = self.token_rows(view.token_id, layer)
        oh_EG = self._onehot_EG[layer]
        dev_mass_TG = cp_TE @ oh_EG
        tp_T = dev_mass_TG.max(axis=1)
        if layer == 0 or view.experts_TlK is None:
            ap_TG = np.full((cp_TE.shape[0], G), 1.0 / G)
        else:
            prev = view.experts_TlK
            dev_Tl = np.zeros((prev.shape[0], layer), np.int64)
            for j in range(max(0, layer - self.config.lookback), layer):  # only the n-gram's look-back is read
                dev_Tl[:, j] = majority_device(prev[:, j], self.group_LE[j], G)
            ap_TG = self.ngram_LHG[layer][self._history(dev_Tl, layer)]
        # n-gram branch: device from Ap, experts within it in proportion to the token row
        within_TE = cp_TE / np.maximum(dev_mass_TG @ oh_EG.T, 1e-30)
        ngram_TE = (ap_TG @ oh_EG.T) * within_TE
        use_token = tp_T >= ap_TG.max(axis=1)
        scores = np.where(use_token[:, None], cp_TE, ngram_TE)
        return Forecast(top_k=self.spec.top_k, scores_TLE=scores[:, None, :].astype(np.float32))

    # ---------------------------------------------------------------------------- save / load
    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        t = self.table
        tensors = {"keys_U": t.keys_U, "probs_ULE": t.probs_ULE, "global_LE": t.global_LE, "group_LE": self.group_LE,
                   "ngram_LHG": self.ngram_LHG}
        meta = {"config": dataclasses.asdict(self.config), "embedding_source": self.embedding_source}
        if self.embeddings is not None and self.embeddings.size <= MAX_SAVED_EMBEDDING_VALUES:
            tensors["embeddings_VD"] = np.asarray(self.embeddings, np.float32)
        elif self.embeddings is not None:  # a 129k x 7168 table is 3.7 GB: the saved predictor goes without it
            meta["embedding_source"] = ""
            meta["note"] = (f"the {self.embeddings.shape} input embeddings were not saved (over "
                            f"{MAX_SAVED_EMBEDDING_VALUES} values): unseen tokens take the global rows after loading")
        return meta, tensors

    @classmethod
    def state_schema(cls, spec: MoESpec, meta: dict[str, Any]) -> dict[str, tuple]:
        L, E = spec.num_layers, spec.num_experts
        G, n = int(meta["config"]["ep"]), int(meta["config"]["lookback"])
        return {"keys_U": (("U",), "iu", ("sorted",)), "probs_ULE": (("U", L, E), "f", ("nonneg",)),
                "global_LE": ((L, E), "f", ("nonneg",)), "group_LE": ((L, E), "iu", ("nonneg",)),
                "ngram_LHG": ((L, (G + 1) ** n, G), "f", ("nonneg",))}

    @classmethod
    def from_state(cls, spec: MoESpec, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> SMoEPredictor:
        p = cls(spec, SMoEConfig(**meta["config"]), embeddings=tensors.get("embeddings_VD"),
                embedding_source=str(meta.get("embedding_source", "")), group_LE=tensors["group_LE"])
        p.table.keys_U = tensors["keys_U"].astype(np.int64)
        p.table.probs_ULE = tensors["probs_ULE"].astype(np.float32)
        p.table.global_LE = tensors["global_LE"].astype(np.float32)
        p.ngram_LHG = tensors["ngram_LHG"].astype(np.float64)
        return p


def device_scores(forecasts: list[tuple[int, Forecast]], trace: Trace, group_LE: np.ndarray, G: int) -> dict[str, Any]:
    """Device-level accuracy of collected forecasts (run_harness(collect=True) over `trace`, the scored rows):
    per layer, the share of tokens whose predicted rank (argmax of the forecast's per-rank mass) is the rank
    holding most of their experts (device accuracy), and the share of their routed assignments on the predicted
    rank (the LAR speculative token shuffling reaches with this predictor)."""
    L = trace.spec.num_layers
    acc, lar = np.zeros(L), np.zeros(L)
    n_tok, n_slot = 0, np.zeros(L)
    by_step = dict(forecasts)
    for step, idx in trace.batches():
        s_TLE = by_step[step].scores_TLE
        ex = np.asarray(trace.experts_TLK[idx], np.int64)
        n_tok += len(idx)
        for layer in range(L):
            oh = np.eye(G)[group_LE[layer]]
            pred = (s_TLE[:, layer] @ oh).argmax(axis=1)
            true = majority_device(ex[:, layer], group_LE[layer], G)
            acc[layer] += float((pred == true).sum())
            ok = ex[:, layer] >= 0
            on = (group_LE[layer][np.maximum(ex[:, layer], 0)] == pred[:, None]) & ok
            lar[layer] += float(on.sum())
            n_slot[layer] += float(ok.sum())
    acc /= max(n_tok, 1)
    lar /= np.maximum(n_slot, 1)
    return {"device_accuracy": float(acc.mean()), "speculative_lar": float(lar.mean()),
            "per_layer": {"device_accuracy": acc.tolist(), "speculative_lar": lar.tolist()}}
