"""Prediction metrics, named as the papers name them, and a per-step accumulator for the harness.

Legend: T tokens, L MoE layers, E experts, K top-k; a leading ``x`` means any leading axes.
True expert lists may hold -1 (a slot dropped by a capacity limit): it is never a hit and never counted
as a true expert. Per-token values are NaN where a token has no valid true expert at that layer.

- top-k accuracy (PROBE): |pred_K ∩ true| / |true| per token per layer.
- exact-set accuracy: 1 where the predicted K-set equals the true set.
- top-half-K hit rate (PROBE): share of the ⌈K/2⌉ heaviest true experts (largest routing weight, the
  bulk of a token's expert work) that are among the K predictions; with recall@2K it measures false
  negatives, the misses a prefetcher or pre-dispatcher cannot hide.
- recall@2K (PROBE, "2× top-K recall"): |pred_2K ∩ true| / |true|.
- batch-level accuracy (ExpertFlow eq. 7): B_acc = 1/L Σ_l |R_l ∩ R̂_l| / |R_l| where R, R̂ are the
  (L, E) bit-wise ORs of the batch's true and predicted routing paths.
- distribution error (MoE-GPS §3.2.1, Table 1): ‖p̂_l − p_l‖₁ / E per layer, p the share of routed
  slots per expert, averaged over layers.
- precision / recall / F1 of active sets, and the prediction cost in µs per token and per batch.
"""

from __future__ import annotations

import math

import numpy as np

from routecast.predict.forecast import Forecast, multi_hot


def overlap(pred_xP: np.ndarray, true_xK: np.ndarray) -> np.ndarray:
    """|pred ∩ true| per row: int64 (...). Entries of pred are distinct; true entries < 0 never match."""
    true = np.asarray(true_xK)
    eq = (np.asarray(pred_xP)[..., :, None] == true[..., None, :]) & (true[..., None, :] >= 0)
    return eq.any(axis=-1).sum(axis=-1)


def _over_true(hits: np.ndarray, true_xK: np.ndarray) -> np.ndarray:
    n_true = (np.asarray(true_xK) >= 0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_true > 0, hits / np.maximum(n_true, 1), np.nan)


def topk_accuracy(pred_xK: np.ndarray, true_xK: np.ndarray) -> np.ndarray:
    """Top-k accuracy |pred ∩ true| / |true| per row: float64 (...), NaN where no true expert."""
    return _over_true(overlap(pred_xK, true_xK), true_xK)


def recall_at_2k(pred_x2K: np.ndarray, true_xK: np.ndarray) -> np.ndarray:
    """Recall@2K: the true experts found among the 2K best predictions, / |true|: float64 (...)."""
    return _over_true(overlap(pred_x2K, true_xK), true_xK)


def exact_set_accuracy(pred_xK: np.ndarray, true_xK: np.ndarray) -> np.ndarray:
    """1.0 where the predicted set equals the true set (both of size K), else 0.0; NaN where no true expert."""
    n_true = (np.asarray(true_xK) >= 0).sum(axis=-1)
    exact = (overlap(pred_xK, true_xK) == n_true) & (n_true == np.asarray(pred_xK).shape[-1])
    return np.where(n_true > 0, exact.astype(np.float64), np.nan)


def top_half_k_hit_rate(pred_xK: np.ndarray, true_xK: np.ndarray, weights_xK: np.ndarray) -> np.ndarray:
    """Share of the ⌈K/2⌉ heaviest true experts (by routing weight) found among the K predictions.

    pred_xK, true_xK int, weights_xK float (the routing weight of each true slot). float64 (...); NaN
    where no true expert. Ties in weight go to the earlier slot.
    """
    true = np.asarray(true_xK)
    half = math.ceil(true.shape[-1] / 2)
    w = np.where(true >= 0, np.asarray(weights_xK, dtype=np.float64), -np.inf)
    heavy = np.take_along_axis(true, np.argsort(-w, axis=-1, kind="stable")[..., :half], axis=-1)
    return _over_true(overlap(pred_xK, heavy), heavy)


def batch_level_accuracy_L(pred_LE: np.ndarray, true_LE: np.ndarray) -> np.ndarray:
    """ExpertFlow eq. 7 per layer: |R_l ∩ R̂_l| / |R_l| for bool (..., L, E) -> (..., L); NaN if R_l empty."""
    inter = (np.asarray(pred_LE) & np.asarray(true_LE)).sum(axis=-1)
    n_true = np.asarray(true_LE).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_true > 0, inter / np.maximum(n_true, 1), np.nan)


def batch_level_accuracy(pred_LE: np.ndarray, true_LE: np.ndarray) -> float:
    """ExpertFlow eq. 7: B_acc = mean over layers of |R ∩ R̂| / |R| for one batch's bool (L, E) paths."""
    return float(np.nanmean(batch_level_accuracy_L(pred_LE, true_LE)))


def distribution_error(pred_xE: np.ndarray, true_xE: np.ndarray) -> np.ndarray:
    """MoE-GPS error rate ‖p̂ − p‖₁ / E per row, each row normalised to sum 1: float64 (...).

    Inputs may be counts or probabilities; rows with no mass give NaN.
    """
    p_hat = np.asarray(pred_xE, dtype=np.float64)
    p = np.asarray(true_xE, dtype=np.float64)
    s_hat, s = p_hat.sum(axis=-1, keepdims=True), p.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.abs(p_hat / s_hat - p / s).sum(axis=-1) / p.shape[-1]
    return np.where((s[..., 0] > 0) & (s_hat[..., 0] > 0), err, np.nan)


def confusion_counts(pred_xE: np.ndarray, true_xE: np.ndarray, axis: int | tuple[int, ...] | None = None):
    """True positives, false positives, false negatives of bool active sets, summed over axis: int64."""
    pred, true = np.asarray(pred_xE, dtype=bool), np.asarray(true_xE, dtype=bool)
    return (pred & true).sum(axis=axis), (pred & ~true).sum(axis=axis), (~pred & true).sum(axis=axis)


def precision_recall_f1(tp, fp, fn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision, recall, F1 from counts (same shapes), float64; NaN where undefined."""
    tp, fp, fn = (np.asarray(a, dtype=np.float64) for a in (tp, fp, fn))
    with np.errstate(invalid="ignore", divide="ignore"):
        p = tp / (tp + fp)
        r = tp / (tp + fn)
        f1 = 2 * tp / (2 * tp + fp + fn)
    return p, r, f1


class CostMeter:
    """Measured prediction cost: wall nanoseconds per call summed, reported per token and per batch."""

    def __init__(self) -> None:
        self.ns = 0
        self.tokens = 0
        self.batches = 0

    def add(self, ns: int, tokens: int) -> None:
        self.ns += int(ns)
        self.tokens += int(tokens)
        self.batches += 1

    @property
    def us_per_token(self) -> float:
        return self.ns / 1e3 / self.tokens if self.tokens else math.nan

    @property
    def us_per_batch(self) -> float:
        return self.ns / 1e3 / self.batches if self.batches else math.nan


# Scalar metrics reported per layer and as the mean over layers, in table order.
METRICS = (
    "top_k_accuracy",
    "exact_set_accuracy",
    "top_half_k_hit_rate",
    "recall_at_2k",
    "batch_level_accuracy",
    "distribution_error",
    "distribution_error_total",
    "active_precision",
    "active_recall",
    "active_f1",
)


class MetricAccumulator:
    """Scores one step's forecast at a time against the step's true routing; result() reduces them.

    Token metrics are means over tokens (per layer); batch-level accuracy and distribution error are
    means over steps; active-set precision/recall/F1 are micro-averaged over steps (batch-level sets);
    distribution_error_total compares predicted and true counts summed over the whole evaluation
    (the MoE-GPS Table 1 setting: one estimate against the test set's empirical distribution).
    """

    def __init__(self, num_layers: int, num_experts: int, top_k: int) -> None:
        L, E = num_layers, num_experts
        self.L, self.E, self.K = L, E, top_k
        self._tok_sum = {m: np.zeros(L) for m in METRICS[:4]}
        self._tok_n = np.zeros(L)
        self._step_sum = {m: np.zeros(L) for m in ("batch_level_accuracy", "distribution_error")}
        self._step_n = {m: np.zeros(L) for m in ("batch_level_accuracy", "distribution_error")}
        self._conf = np.zeros((3, L))
        self._pred_counts = np.zeros((L, E))
        self._true_counts = np.zeros((L, E))

    def update(self, forecast: Forecast, experts_TLK: np.ndarray, weights_TLK: np.ndarray) -> None:
        """Add one step: forecast for its T tokens; experts_TLK int / weights_TLK float (T, L, K) the truth."""
        T = experts_TLK.shape[0]
        if T == 0:
            return
        true = experts_TLK.astype(np.int64)
        top_K = forecast.token_topk(T, self.K)
        top_2K = forecast.token_topk(T, min(2 * self.K, self.E))
        per_tok = {
            "top_k_accuracy": topk_accuracy(top_K, true),
            "exact_set_accuracy": exact_set_accuracy(top_K, true),
            "top_half_k_hit_rate": top_half_k_hit_rate(top_K, true, weights_TLK),
            "recall_at_2k": recall_at_2k(top_2K, true),
        }
        valid = (true >= 0).any(axis=-1)  # (T, L)
        self._tok_n += valid.sum(axis=0)
        for m, v in per_tok.items():
            self._tok_sum[m] += np.where(valid, v, 0.0).sum(axis=0)

        true_LE = multi_hot(true, self.E).any(axis=0)
        pred_LE = forecast.batch_active_LE(T)
        self._add_step("batch_level_accuracy", batch_level_accuracy_L(pred_LE, true_LE))
        self._conf += np.stack(confusion_counts(pred_LE, true_LE, axis=-1))

        true_counts = multi_hot(true, self.E).sum(axis=0, dtype=np.float64)  # dropped slots excluded
        pred_counts = forecast.expected_counts_LE(None if forecast.token_level else T)
        self._add_step("distribution_error", distribution_error(pred_counts, true_counts))
        self._pred_counts += pred_counts
        self._true_counts += true_counts

    def _add_step(self, name: str, v_L: np.ndarray) -> None:
        ok = ~np.isnan(v_L)
        self._step_sum[name] += np.where(ok, v_L, 0.0)
        self._step_n[name] += ok

    def result(self) -> dict[str, list[float]]:
        """Metric name -> per-layer values (length L); NaN where a layer had nothing to score."""
        with np.errstate(invalid="ignore", divide="ignore"):
            out = {m: s / self._tok_n for m, s in self._tok_sum.items()}
            out.update({m: self._step_sum[m] / self._step_n[m] for m in self._step_sum})
        out["distribution_error_total"] = distribution_error(self._pred_counts, self._true_counts)
        p, r, f1 = precision_recall_f1(*self._conf)
        out.update(active_precision=p, active_recall=r, active_f1=f1)
        return {m: [float(x) for x in out[m]] for m in METRICS}
