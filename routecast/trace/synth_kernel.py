"""Compiled sampling kernel of the synthetic routing generator (synth.py, step 10): one layer of lazy
Gumbel-top-k routing for a block of tokens, one row at a time (numba, cached on disk after the first call).

Shapes: n rows (tokens of a block), M bonus entries per row, E experts, K top-k, G expert groups,
C contexts; tables are flat (context * E + expert). The numpy formulation it replaces worked on (n, M)
and (n, E) temporaries with scatter-dedupe, flat takes and argpartitions per chunk and ran at ~17 MB of
trace per CPU-second on DeepSeek-V3; per row it needs O(M + K) random draws and no (n, E) memory.

The random stream is the caller's np.random.Generator (numba draws from its bit generator), so a seed
reproduces a trace bit for bit. Without numba the same code runs as plain Python (same draws, slow):
numba is a dependency, so that happens only in a broken install.
"""

from __future__ import annotations

import math

import numpy as np


def _gumbel(rng) -> float:
    """One standard Gumbel draw: -log of a standard exponential (numpy's ziggurat, one log instead of two)."""
    return -math.log(rng.standard_exponential())


def _draw_free(rng, base: int, cr: int, E: int, B: int, gs: int, cdf, guide, mark, tag: int, chosen) -> int:
    """One categorical draw from context cr's base distribution, retried while it hits a taken expert or an
    unchosen group (= a draw from the base restricted to the free experts); -1 after 64 misses."""
    for _ in range(64):
        u = rng.random()
        i = guide[cr * B + int(u * B)]
        while cdf[base + i] <= u and i < E - 1:  # guide-table walk past the bucket's first index
            i += 1
        if mark[i] != tag and chosen[i // gs]:
            return i
    return -1


def _exact_list(rng, base: int, E: int, gs: int, logp, mark, tag: int, chosen, need: int, out) -> None:
    """out[:need] = the next `need` draws without replacement over the free experts, in order: one dense
    Gumbel-top-k over what is left (used once the free mass is too small for rejection to pay)."""
    keys = np.empty(E)
    for e in range(E):
        keys[e] = logp[base + e] + _gumbel(rng) if mark[e] != tag and chosen[e // gs] else -np.inf
    for j in range(need):
        best = 0
        for e in range(1, E):
            if keys[e] > keys[best]:
                best = e
        out[j] = best
        keys[best] = -np.inf


def _insert_desc(vals, idx, n: int, x: float, e: int) -> None:
    """Insert (x, e) into vals/idx[:n + 1], kept sorted by value descending (ties keep arrival order)."""
    pos = n
    while pos > 0 and vals[pos - 1] < x:
        vals[pos] = vals[pos - 1]
        idx[pos] = idx[pos - 1]
        pos -= 1
    vals[pos] = x
    idx[pos] = e


def _add_entries(ids, bon, ebon, r: int, tag: int, mark, slot, uid, ub, eub, nu: int) -> int:
    """Append row r's bonus experts ids[r, :] (bonus bon[j], exp(bon[j]) ebon[j]) to the row's unique list
    (uid, ub, eub); a repeated expert adds to its first entry. -> new length."""
    for j in range(ids.shape[1]):
        e = ids[r, j]
        if mark[e] == tag:
            ub[slot[e]] += bon[j]
            eub[slot[e]] *= ebon[j]
        else:
            mark[e], slot[e], uid[nu], ub[nu], eub[nu] = tag, nu, e, bon[j], ebon[j]
            nu += 1
    return nu


def _route_layer(rng, c, tok, req, prev_e, succ, bon_tok, bon_req, bon_lay, p, logp, p_CG, cdf, guide, B: int,
                 tg: int, out_e, out_w) -> None:
    """Route n tokens through one layer: out_e (n, K) int16 expert ids, out_w (n, K) float32 weights.

    c (n,) context of each row. Bonus experts: tok (n, mt) the token's preferred experts, req (n, mr) the
    request's, and for each of the K experts of the previous layer prev_e (n, K) its successors succ (E, ml);
    bon_tok (mt,), bon_req (mr,), bon_lay (ml,) their log-odds bonuses (a repeated expert sums them).
    p / logp (C*E,) base probabilities and their float32 logs; p_CG (C, G) group masses; cdf (C*E,) and
    guide (C*B,) the categorical tables of Contexts.layer; tg groups are chosen per row. Per row: groups by
    sequential draws without replacement proportional to their exp-score mass (= Gumbel-top-tg), the bonus
    experts perturbed explicitly, then the top-down Gumbel process over the complement (module docstring of
    synth.py), stopped at the first value that cannot enter the top K. Weights: softmax of the K scores.
    """
    n = c.shape[0]
    K = out_e.shape[1]
    C, G = p_CG.shape
    E = p.shape[0] // max(C, 1)
    gs = E // G
    mt, mr, ml, kp = tok.shape[1], req.shape[1], succ.shape[1], prev_e.shape[1]
    M = mt + mr + kp * ml
    mark = np.zeros(E, np.int64)  # == tag (row + 1): taken in this row (a bonus expert or a complement draw)
    slot = np.zeros(E, np.int64)
    uid, ub, eub = np.empty(max(M, 1), np.int64), np.empty(max(M, 1)), np.empty(max(M, 1))
    lay_ids = np.empty((1, max(kp * ml, 1)), np.int64)
    bon_l, ebon_l = np.empty(max(kp * ml, 1)), np.empty(max(kp * ml, 1))
    for k in range(kp):
        for j in range(ml):
            bon_l[k * ml + j] = bon_lay[j]
    cap = math.exp(700.0)  # an expert's exp-bonus is capped so that its group mass stays finite
    ebon_t, ebon_r = np.minimum(np.exp(bon_tok), cap), np.minimum(np.exp(bon_req), cap)
    ebon_l = np.minimum(np.exp(bon_l), cap)
    gm, chosen = np.empty(G), np.zeros(G, np.bool_)
    uval, uix = np.empty(K), np.empty(K, np.int64)
    fval, fix = np.empty(K), np.empty(K, np.int64)
    exact = np.empty(K, np.int64)
    small = min(0.5, 16.0 / E)  # free mass below which rejection costs more than one O(E) pass
    for r in range(n):
        tag = r + 1
        cr = c[r]
        base = cr * E
        nu = _add_entries(tok, bon_tok, ebon_t, r, tag, mark, slot, uid, ub, eub, 0)
        nu = _add_entries(req, bon_req, ebon_r, r, tag, mark, slot, uid, ub, eub, nu)
        if kp * ml > 0:
            for k in range(kp):
                for j in range(ml):
                    lay_ids[0, k * ml + j] = succ[prev_e[r, k], j]
            nu = _add_entries(lay_ids, bon_l, ebon_l, 0, tag, mark, slot, uid, ub, eub, nu)
        if G > 1:
            # Groups: Gumbel-top-tg over their exp-score masses (bonuses included), drawn as tg sequential
            # draws without replacement proportional to mass (the same distribution, no logs).
            for g in range(G):
                gm[g] = p_CG[cr, g]
                chosen[g] = False
            for j in range(nu):
                t = p[base + uid[j]] * (eub[j] - 1.0)
                gm[uid[j] // gs] += min(t, cap) if t == t else 0.0
            for g in range(G):
                gm[g] = max(gm[g], 1e-30)
            z = 0.0
            for _ in range(tg):
                tot = 0.0  # summed afresh: subtracting a huge capped mass would cancel the small ones
                for g in range(G):
                    if not chosen[g]:
                        tot += gm[g]
                u = rng.random() * tot
                pick = -1
                for g in range(G):
                    if not chosen[g]:
                        pick = g
                        u -= gm[g]
                        if u < 0.0:
                            break
                chosen[pick] = True
                z += p_CG[cr, pick]
            n_allowed = tg * gs
        else:
            chosen[0] = True
            z, n_allowed = 1.0, E
        nk = nvalid = 0  # bonus experts in chosen groups, perturbed; their top K kept in uval
        for j in range(nu):
            e = uid[j]
            if not chosen[e // gs]:
                continue
            z -= p[base + e]
            nvalid += 1
            x = float(logp[base + e]) + ub[j] + _gumbel(rng)
            if nk < K:
                _insert_desc(uval, uix, nk, x, e)
                nk += 1
            elif x > uval[K - 1]:
                _insert_desc(uval, uix, K - 1, x, e)
        for j in range(nk, K):
            uval[j] = -np.inf
        z = max(z, 0.0)
        # Complement: its i-th largest value is Gumbel(log z) truncated below the previous one; it enters the
        # top K iff it beats the (K - i)-th best bonus value (or that slot is empty: then it must).
        prev, n_exact, p_exact = np.inf, 0, 0
        for i in range(min(K, n_allowed - nvalid)):
            thr = uval[K - 1 - i]
            g = (math.log(z) + _gumbel(rng)) if z > 0.0 else -np.inf
            if g == -np.inf:
                v = -np.inf
            elif prev == np.inf:
                v = g
            else:  # -logaddexp(-prev, -g)
                hi, lo = max(-prev, -g), min(-prev, -g)
                v = -(hi + math.log1p(math.exp(lo - hi)))
            if thr == -np.inf:
                v = max(v, -1e30)
            elif not v > thr:
                break
            e = -1
            if n_exact == 0 and z >= small:
                e = _draw_free(rng, base, cr, E, B, gs, cdf, guide, mark, tag, chosen)
            if e < 0:
                if n_exact == 0:
                    n_exact, p_exact = K - i, 0
                    _exact_list(rng, base, E, gs, logp, mark, tag, chosen, n_exact, exact)
                e = exact[p_exact]
                p_exact += 1
            mark[e] = tag
            z = max(z - p[base + e], 0.0)
            uval[K - 1 - i], uix[K - 1 - i] = v, e  # becomes the complement's entry in the final top K
            prev = v
        # The final top K: the K - taken best bonus entries (uval[:K - taken], untouched) and the taken
        # complement values (written over the slots they displaced), by value.
        for j in range(K):
            _insert_desc(fval, fix, j, uval[j], uix[j])
        s, top = 0.0, fval[0]
        for j in range(K):
            fval[j] = math.exp(fval[j] - top)
            s += fval[j]
        for j in range(K):
            out_e[r, j] = fix[j]
            out_w[r, j] = fval[j] / s


try:  # numba is a dependency; the fallback keeps a broken install correct, only slow
    from numba import njit
except ImportError:  # pragma: no cover - depends on the environment
    njit = None
if njit is not None:
    _gumbel, _draw_free, _exact_list, _insert_desc, _add_entries, _route_layer = (
        njit(cache=True, nogil=True)(f) for f in (_gumbel, _draw_free, _exact_list, _insert_desc, _add_entries, _route_layer))


def route_layer(rng: np.random.Generator, c: np.ndarray, bonus: dict, tables: dict, top_k_group: int,
                out_e: np.ndarray, out_w: np.ndarray) -> None:
    """Fill out_e (n, K) int16 and out_w (n, K) float32 (views of one layer of a block) for n rows with
    contexts c (n,); bonus from synth._bonus_sources, tables from synth._Contexts.layer."""
    _route_layer(rng, c, bonus["tok"], bonus["req"], bonus["prev"], bonus["succ"], bonus["bon_tok"],
                 bonus["bon_req"], bonus["bon_lay"], tables["p"], tables["logp"], tables["p_CG"], tables["cdf"],
                 tables["guide"], int(tables["B"]), int(top_k_group), out_e, out_w)
