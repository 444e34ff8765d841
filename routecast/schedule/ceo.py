"""s-MoE Algorithm 1 (Speculative MoE, Appendix B): balanced token-expert co-clustering by cross-entropy optimisation.

Legend: U distinct tokens (token ids) of the profile, E experts of one layer, G co-clusters (= EP ranks, the
paper's E), S samples per iteration (the paper's K). Input: the affinity W_UE (float, >= 0): how often token u
was routed to expert e in the profile, i.e. a_u * Cp_ue times top-k (the paper's a_j Cp,jk up to a constant).

Algorithm 1 as implemented here:
  p_EG <- 1/G, p_UG <- 1/G                                       (lines 1-2)
  repeat n_steps:
    S expert samples: each expert draws a cluster from norm(p_E[e] * mask); a cluster is masked once it
      holds E/G experts (lines 9-15: every sample has exactly E/G experts per cluster);
    S token samples, paired with the expert samples: each token draws from norm(p_U[u] * mask); cluster g is
      masked once its load (sum of its tokens' W rows, the paper's sum(Cp[i]*a[i])) reaches beta * total / G
      (lines 16-19, the balance relaxation beta);
    score of sample s = local activations: sum over (u, e) of W_ue where token u and expert e share a cluster
      (line 28); the top rho * S samples are the elite (line 29);
    p <- (1 - smoothing) * p + smoothing * (label frequencies in the elite)       (line 30)
  expert labels = argmax p_EG, token labels = argmax p_UG with confidences Tp = their probability (lines 33-34).

Where this differs from the paper's text, and why:
- token_sampling="affinity" (default) draws token u's label in sample s from p_U[u] * (A_s[u] + eps), A_s[u, g]
  = u's affinity to the experts that sample s puts in cluster g; "paper" draws from p_U[u] alone (line 10). With
  thousands of tokens, a paired sample's total score says almost nothing about one token's label, so the
  paper's sampler needs far more than tens of iterations to leave uniform (benchmarks/smoe.py prints both).
- Items are visited in a fixed order (experts: a fresh random order per sample; tokens: heaviest first), so
  the capacity masks bind on light tokens; the paper visits them in index order.
- The final argmax (lines 33-34) is taken under the same capacity masks (experts E/G per cluster exactly,
  token load <= beta * total / G + one token), so the returned labels satisfy the constraints they were
  sampled under; the paper's plain argmax does not guarantee them.
- The smoothing factor of the update (line 30, unspecified in the paper) is CEOConfig.smoothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import scipy.sparse as sp

from routecast.common.errors import ConfigError

TOKEN_SAMPLING = ("affinity", "paper")


@dataclass(frozen=True, kw_only=True)
class CEOConfig:
    """Algorithm 1's hyper-parameters: beta and rho as the paper sets them (1.1 and 0.2)."""

    n_steps: int = 30
    samples: int = 48
    rho: float = 0.2
    beta: float = 1.1
    smoothing: float = 0.7
    token_sampling: str = "affinity"
    seed: int = 0

    def __post_init__(self) -> None:
        if type(self.n_steps) is not int or self.n_steps < 1:
            raise ConfigError(f"CEOConfig.n_steps is {self.n_steps!r}; expected a positive integer.")
        if type(self.samples) is not int or self.samples < 2:
            raise ConfigError(f"CEOConfig.samples is {self.samples!r}; expected an integer >= 2.")
        if not 0 < self.rho <= 1:
            raise ConfigError(f"CEOConfig.rho is {self.rho}; expected 0 < rho <= 1.")
        if not self.beta >= 1:
            raise ConfigError(f"CEOConfig.beta is {self.beta}; expected beta >= 1 (1 = perfectly even token load).")
        if not 0 < self.smoothing <= 1:
            raise ConfigError(f"CEOConfig.smoothing is {self.smoothing}; expected 0 < smoothing <= 1.")
        if self.token_sampling not in TOKEN_SAMPLING:
            raise ConfigError(f"CEOConfig.token_sampling is {self.token_sampling!r}; expected one of {TOKEN_SAMPLING}.")


def paper_preset(seed: int = 0) -> CEOConfig:
    """The paper's sampler (line 10 as written) with its beta 1.1 and rho 0.2."""
    return CEOConfig(token_sampling="paper", seed=seed)


# ------------------------------------------------------------------------------------------- kernels
@numba.njit(cache=True)
def _draw(p_G: np.ndarray, mask_G: np.ndarray, u: float) -> int:
    """Index drawn from norm(p * mask) with the uniform u; uniform over the unmasked ones when p * mask is 0."""
    G = p_G.shape[0]
    tot = 0.0
    for g in range(G):
        tot += p_G[g] * mask_G[g]
    if tot <= 0.0:
        n = 0.0
        for g in range(G):
            n += mask_G[g]
        target, acc = u * n, 0.0
        for g in range(G):
            acc += mask_G[g]
            if mask_G[g] > 0 and acc >= target:
                return g
    else:
        target, acc = u * tot, 0.0
        for g in range(G):
            acc += p_G[g] * mask_G[g]
            if p_G[g] * mask_G[g] > 0 and acc >= target:
                return g
    for g in range(G - 1, -1, -1):  # rounding left the target past the last positive entry
        if mask_G[g] > 0:
            return g
    return 0


@numba.njit(cache=True)
def _sample_experts(p_EG: np.ndarray, order_SE: np.ndarray, unif_SE: np.ndarray) -> np.ndarray:
    """(S, E) int32 labels, exactly E/G experts per cluster in every sample (Algorithm 1 lines 9-15)."""
    S, E = order_SE.shape
    G = p_EG.shape[1]
    cap = E // G
    out = np.empty((S, E), np.int32)
    for s in range(S):
        mask = np.ones(G)
        cnt = np.zeros(G, np.int64)
        for i in range(E):
            e = order_SE[s, i]
            g = _draw(p_EG[e], mask, unif_SE[s, i])
            out[s, e] = g
            cnt[g] += 1
            if cnt[g] == cap:
                mask[g] = 0.0
    return out


@numba.njit(cache=True)
def _sample_tokens(indptr: np.ndarray, idx: np.ndarray, w: np.ndarray, p_UG: np.ndarray, load_U: np.ndarray,
                   order_U: np.ndarray, cap: float, lab_SE: np.ndarray, unif_SU: np.ndarray,
                   affinity: bool) -> tuple[np.ndarray, np.ndarray]:
    """Token labels (S, U) under the beta load mask (lines 16-19) and each sample's local activations (S,)."""
    S, U = unif_SU.shape
    G = p_UG.shape[1]
    out = np.empty((S, U), np.int32)
    score = np.zeros(S)
    for s in range(S):
        mask = np.ones(G)
        cnt = np.zeros(G)
        a_G = np.zeros(G)
        q = np.empty(G)
        for i in range(U):
            u = order_U[i]
            a_G[:] = 0.0
            for j in range(indptr[u], indptr[u + 1]):
                a_G[lab_SE[s, idx[j]]] += w[j]
            if affinity:
                eps = 1e-3 * (load_U[u] + 1e-12)
                for g in range(G):
                    q[g] = p_UG[u, g] * (a_G[g] + eps)
                g = _draw(q, mask, unif_SU[s, i])
            else:
                g = _draw(p_UG[u], mask, unif_SU[s, i])
            out[s, u] = g
            score[s] += a_G[g]
            cnt[g] += load_U[u]
            if cnt[g] >= cap:
                mask[g] = 0.0
                if mask.sum() == 0.0:  # every cluster full (only zero-load tokens or rounding remain): reopen
                    mask[:] = 1.0
    return out, score


@numba.njit(cache=True)
def _greedy_assign(score_NG: np.ndarray, load_N: np.ndarray, cap: float, order_N: np.ndarray) -> np.ndarray:
    """Each item, in `order_N`, takes its best-scoring cluster among those whose load is still below cap."""
    N, G = score_NG.shape
    out = np.empty(N, np.int32)
    mask = np.ones(G, np.bool_)
    cnt = np.zeros(G)
    for i in range(N):
        n = order_N[i]
        best, bv = -1, -np.inf
        for g in range(G):
            if mask[g] and score_NG[n, g] > bv:
                best, bv = g, score_NG[n, g]
        if best < 0:  # every cluster reached cap (zero-load items or rounding remain): least loaded one
            best = int(np.argmin(cnt))
        out[n] = best
        cnt[best] += load_N[n]
        if cnt[best] >= cap:
            mask[best] = False
    return out


@numba.njit(cache=True)
def _affinity_UG(indptr: np.ndarray, idx: np.ndarray, w: np.ndarray, lab_E: np.ndarray, G: int) -> np.ndarray:
    U = indptr.shape[0] - 1
    out = np.zeros((U, G))
    for u in range(U):
        for j in range(indptr[u], indptr[u + 1]):
            out[u, lab_E[idx[j]]] += w[j]
    return out


# ------------------------------------------------------------------------------------------- public
def balanced_experts(score_EG: np.ndarray) -> np.ndarray:
    """(E,) labels with exactly E/G experts per cluster: experts most sure of their best cluster choose first."""
    E, G = score_EG.shape
    s = np.asarray(score_EG, np.float64)
    order = np.argsort(-s.max(axis=1), kind="stable").astype(np.int64)
    return _greedy_assign(s, np.ones(E), float(E // G), order)


def balanced_tokens(W_UE: sp.csr_matrix, expert_E: np.ndarray, G: int, beta: float,
                    prefer_UG: np.ndarray | None = None) -> np.ndarray:
    """(U,) token labels: each token to the cluster holding most of its affinity (or `prefer_UG`'s best), heaviest
    tokens first, a cluster closed once its load reaches beta * total / G (loads = row sums of W_UE)."""
    W = sp.csr_matrix(W_UE, dtype=np.float64)
    load = np.asarray(W.sum(axis=1)).ravel()
    aff = _affinity_UG(W.indptr.astype(np.int64), W.indices.astype(np.int64), W.data, np.asarray(expert_E, np.int32), G)
    score = aff if prefer_UG is None else prefer_UG + 1e-9 * aff  # ties in the preference broken by affinity
    order = np.argsort(-load, kind="stable").astype(np.int64)
    return _greedy_assign(score, load, beta * load.sum() / G, order)


def ceo_cocluster(W_UE: sp.csr_matrix | np.ndarray, G: int, config: CEOConfig | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
    """Algorithm 1 on the affinity W_UE (U, E) -> (expert labels (E,) int32, token labels (U,) int32,
    token confidence Tp (U,) float, best local-activation share per iteration)."""
    cfg = config or CEOConfig()
    W = sp.csr_matrix(W_UE, dtype=np.float64)
    U, E = W.shape
    if G < 1 or E % G:
        raise ConfigError(f"co-clustering: {E} experts cannot be split evenly over {G} groups; expected a divisor of {E}.")
    if W.nnz and (not np.all(np.isfinite(W.data)) or W.data.min() < 0):
        raise ConfigError("co-clustering: the affinity matrix holds negative or non-finite values; expected counts >= 0.")
    rng = np.random.default_rng(cfg.seed)
    indptr, idx, w = W.indptr.astype(np.int64), W.indices.astype(np.int64), W.data
    load = np.asarray(W.sum(axis=1)).ravel()
    total = max(load.sum(), 1e-12)
    cap = cfg.beta * total / G
    order_U = np.argsort(-load, kind="stable").astype(np.int64)
    p_EG, p_UG = np.full((E, G), 1.0 / G), np.full((U, G), 1.0 / G)
    S = cfg.samples
    n_elite = max(1, int(np.ceil(cfg.rho * S)))
    history: list[float] = []
    for _ in range(cfg.n_steps):
        order_SE = np.argsort(rng.random((S, E)), axis=1).astype(np.int64)
        lab_SE = _sample_experts(p_EG, order_SE, rng.random((S, E)))
        lab_SU, score_S = _sample_tokens(indptr, idx, w, p_UG, load, order_U, cap, lab_SE, rng.random((S, U)),
                                         cfg.token_sampling == "affinity")
        elite = np.argsort(-score_S, kind="stable")[:n_elite]
        history.append(float(score_S[elite[0]] / total))
        # Elite label frequencies; bincount over (item * G + label) keeps this one vectorised pass.
        f_EG = np.bincount((np.arange(E)[None] * G + lab_SE[elite]).ravel(), minlength=E * G).reshape(E, G) / n_elite
        f_UG = np.bincount((np.arange(U)[None] * G + lab_SU[elite]).ravel(), minlength=U * G).reshape(U, G) / n_elite
        p_EG = (1 - cfg.smoothing) * p_EG + cfg.smoothing * f_EG
        p_UG = (1 - cfg.smoothing) * p_UG + cfg.smoothing * f_UG
    expert_E = balanced_experts(p_EG)
    token_U = balanced_tokens(W, expert_E, G, cfg.beta, prefer_UG=p_UG)
    conf_U = p_UG[np.arange(U), token_U]
    return expert_E, token_U, conf_U, history
