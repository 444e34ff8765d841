"""Baselines for token-expert co-clustering on the same affinity W_UE (U distinct tokens x E experts, one layer).

Each returns (expert labels (E,) int32 with exactly E/G experts per group, token labels (U,) int32 whose group
loads stay within beta * total / G + one token), so every method is compared at the same balance constraint:
- ``metis``: METIS (pymetis) on the bipartite token-expert graph (edge weight = W_ue), two balance constraints
  per vertex (token load, expert count), then the expert count made exact and the token load capped.
- ``kmeans``: the paper's "2D balanced k-means": experts clustered by their (SVD-reduced, normalised) token
  profiles into G groups of exactly E/G (k-means-constrained), tokens clustered separately by their expert
  profiles into G groups of near-equal size, token clusters matched to expert groups by the Hungarian method
  (scipy) on their affinity.
- ``hypergraph``: Mt-KaHyPar on the hypergraph whose vertices are the experts and whose hyperedges are the
  distinct routed top-k sets (each token-position is a hyperedge over the experts it activates, weight = how
  often that set occurs), objective connectivity - 1 (km1: the extra ranks a token must reach), epsilon 0;
  tokens then go to the group holding most of their affinity.
- ``random``: random balanced expert groups and random balanced token groups (a floor, LAR ~ 1/G).
- ``sts``: speculative token shuffling alone (s-TS without s-EG): experts stay contiguously sharded
  (expert e on rank e // (E/G)), tokens go to the group holding most of their affinity.
- ``none`` (plain EP) has contiguous experts and no token table: a token stays on its home rank (cocluster.py).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from routecast.common.errors import ConfigError
from routecast.schedule.ceo import balanced_experts, balanced_tokens

_KAHYPAR: object | None = None


def contiguous_experts(E: int, G: int) -> np.ndarray:
    """(E,) int32: expert e on rank e // (E / G), the static EP sharding."""
    return (np.arange(E) // (E // G)).astype(np.int32)


def _capped(W: sp.csr_matrix, expert_E: np.ndarray, token_U: np.ndarray, G: int, beta: float) -> np.ndarray:
    """Keep each token's group unless it overflows beta * total / G; overflow goes to its next best group."""
    prefer = np.zeros((W.shape[0], G))
    prefer[np.arange(W.shape[0]), token_U] = 1.0
    return balanced_tokens(W, expert_E, G, beta, prefer_UG=prefer)


def random_groups(W: sp.csr_matrix, G: int, beta: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    U, E = W.shape
    rng = np.random.default_rng(seed)
    expert_E = contiguous_experts(E, G)[rng.permutation(E)]
    return expert_E, _capped(W, expert_E, rng.integers(0, G, U).astype(np.int32), G, beta)


def sts_groups(W: sp.csr_matrix, G: int, beta: float) -> tuple[np.ndarray, np.ndarray]:
    expert_E = contiguous_experts(W.shape[1], G)
    return expert_E, balanced_tokens(W, expert_E, G, beta)


def metis_groups(W: sp.csr_matrix, G: int, beta: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Bipartite graph: vertices 0..U-1 tokens, U..U+E-1 experts; weights (token load, expert count)."""
    import pymetis

    U, E = W.shape
    coo = W.tocoo()
    # METIS wants integer weights: scale so the lightest non-zero affinity is >= 1.
    scale = 1.0 / max(coo.data.min(), 1e-12) if coo.nnz else 1.0
    ew = np.maximum(np.rint(coo.data * min(scale, 1e6 / max(coo.data.max(), 1e-12))), 1).astype(np.int64)
    rows = np.concatenate([coo.row, coo.col + U])
    cols = np.concatenate([coo.col + U, coo.row])
    A = sp.csr_matrix((np.concatenate([ew, ew]), (rows, cols)), shape=(U + E, U + E))
    load = np.asarray(W.sum(axis=1)).ravel()
    lw = np.maximum(np.rint(load * 1000.0 / max(load.max(), 1e-12)), 1).astype(np.int64)
    vw = np.zeros((U + E, 2), np.int64)
    vw[:U, 0], vw[U:, 1] = lw, 1
    opts = pymetis.Options(seed=seed, ncuts=2)
    _, parts = pymetis.part_graph(G, pymetis.CSRAdjacency(A.indptr, A.indices), eweights=A.data, vweights=vw.ravel(),
                                  options=opts)
    parts = np.asarray(parts, np.int32)
    ex = np.zeros((E, G))
    ex[np.arange(E), parts[U:]] = 1.0
    aff = (W.T @ sp.csr_matrix((np.ones(U), (np.arange(U), parts[:U])), shape=(U, G))).toarray()
    expert_E = balanced_experts(ex + 1e-6 * aff / max(aff.max(), 1e-12))
    return expert_E, _capped(W, expert_E, parts[:U], G, beta)


def kmeans_groups(W: sp.csr_matrix, G: int, beta: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from k_means_constrained import KMeansConstrained
    from scipy.optimize import linear_sum_assignment
    from sklearn.decomposition import TruncatedSVD
    from sklearn.preprocessing import normalize

    U, E = W.shape
    if U < G:
        raise ConfigError(f"kmeans co-clustering: {U} distinct tokens for {G} groups; expected at least one a group.")
    # Stage 1: experts by their token profiles (columns), reduced to at most 32 dimensions.
    cols = normalize(W.T.tocsr())
    dims = min(32, U - 1, E - 1)
    Xe = TruncatedSVD(dims, random_state=seed).fit_transform(cols) if dims >= 2 else cols.toarray()
    ke = KMeansConstrained(n_clusters=G, size_min=E // G, size_max=E // G, random_state=seed, n_init=3)
    expert_E = ke.fit_predict(Xe).astype(np.int32)
    # Stage 2: tokens by their expert profiles (rows), near-equal cluster sizes.
    Xt = normalize(W).toarray() if E <= 512 else TruncatedSVD(32, random_state=seed).fit_transform(normalize(W))
    lo, hi = U // G, -(-U // G)
    kt = KMeansConstrained(n_clusters=G, size_min=lo, size_max=hi, random_state=seed, n_init=1, max_iter=50)
    tok_cluster = kt.fit_predict(Xt).astype(np.int64)
    # Match token clusters to expert groups: maximise the affinity kept local.
    onehot_t = sp.csr_matrix((np.ones(U), (tok_cluster, np.arange(U))), shape=(G, U))
    onehot_e = sp.csr_matrix((np.ones(E), (np.arange(E), expert_E)), shape=(E, G))
    M = (onehot_t @ W @ onehot_e).toarray()
    r, c = linear_sum_assignment(-M)
    to_group = np.empty(G, np.int32)
    to_group[r] = c
    return expert_E, _capped(W, expert_E, to_group[tok_cluster], G, beta)


def hypergraph_groups(W: sp.csr_matrix, sets_NK: np.ndarray, weight_N: np.ndarray, G: int, beta: float,
                      seed: int) -> tuple[np.ndarray, np.ndarray]:
    """sets_NK: the distinct top-k expert sets (-1 = no expert), weight_N how often each occurred."""
    import mtkahypar

    global _KAHYPAR
    if _KAHYPAR is None:
        _KAHYPAR = mtkahypar.initialize(1, False)
    U, E = W.shape
    mtkahypar.set_seed(seed)
    ctx = _KAHYPAR.context_from_preset(mtkahypar.PresetType.DETERMINISTIC)
    ctx.set_partitioning_parameters(G, 0.0, mtkahypar.Objective.KM1)
    ctx.logging = False
    edges = [row[row >= 0].tolist() for row in sets_NK]
    keep = [i for i, e in enumerate(edges) if len(e) >= 2]
    hg = _KAHYPAR.create_hypergraph(ctx, E, len(keep), [edges[i] for i in keep], [1] * E,
                                    np.maximum(np.asarray(weight_N)[keep], 1).astype(np.int64).tolist())
    part = hg.partition(ctx)
    lab = np.array([part.block_id(v) for v in range(E)], np.int32)
    ex = np.zeros((E, G))
    ex[np.arange(E), lab] = 1.0
    expert_E = balanced_experts(ex)  # epsilon 0 already gives E/G each; this only guards rounding
    return expert_E, balanced_tokens(W, expert_E, G, beta)
