"""The compiled core of PROBE's planner (place/probe.py): lines 2-18 of Algorithm 2 as scalar code.

Legend as in probe.py. `_plan_call` runs the value checks, the locality-first initial assignment and the
per-layer loop, and fills the result arrays; probe.plan_layers wraps it. numba compiles these functions
when installed (cache=True); without numba they run as plain Python and give the same plans.
"""

from __future__ import annotations

import numpy as np

GRID = 16  # water-filling grid intervals per pass (two passes, then linear interpolation)

# ---- the loop (lines 4-18): scalar code, compiled by numba when it is installed ------------------------------
# On one layer's small arrays a scalar loop beats any sequence of numpy calls (~1 us of dispatch each). The
# arithmetic is the same IEEE operations, in the same order, as PlanCosts.expert_time (np.interp of np.log)
# and np.mean (pairwise sum), so a plan does not depend on whether numba is present.
def _t(n: float, eta: tuple) -> float:
    """PlanCosts.expert_time of one GEMM group of n tokens; eta = (F, F_peak, log tokens, values, floor)."""
    if n == 0.0:  # what the formula gives for n = 0 (up to the sign of zero); most cells are empty
        return 0.0
    fpt, peak, xp, fp, floor = eta
    m = xp.size
    if m == 1:
        t = n * (fpt / (fp[0] * peak))
    else:
        v = np.log(n) if n > 0 else (-np.inf if n == 0 else np.nan)
        e = fp[0] if v <= xp[0] else (fp[m - 1] if v >= xp[m - 1] else np.nan)
        if xp[0] < v < xp[m - 1]:  # xp[j] <= v < xp[j + 1]; a scan beats a binary search on a few points
            j = 0
            while xp[j + 1] <= v:
                j += 1
            e = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]) * (v - xp[j]) + fp[j]
        t = n * fpt / (e * peak)
    if floor != 0.0:
        t = max(t, floor) if n > 0 else 0.0
    return t


def _block(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of a[lo:lo + n] for n <= 128: one loop over 8 accumulators."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r = a[lo:lo + 8].copy()
    i = 8
    while i < n - n % 8:
        for j in range(8):
            r[j] += a[lo + i + j]
        i += 8
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


def _pairwise(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of a[lo:lo + n] (what np.mean uses), bit for bit: pw(lo, n) = pw(lo, h) +
    pw(lo + h, n - h), h = n // 2 rounded down to a multiple of 8, down to blocks of <= 128, on explicit
    stacks (numba's cache mishandles recursion): nodes to expand, or kind 1: add the two latest sums."""
    if n <= 128:
        return _block(a, lo, n)
    node = np.empty((64, 3), dtype=np.int64)
    vals = np.empty(64)
    node[0, 0], node[0, 1], node[0, 2] = lo, n, 0
    top, nv = 1, 0
    while top:
        top -= 1
        l0, m, kind = node[top, 0], node[top, 1], node[top, 2]
        if kind == 1:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
        elif m <= 128:
            vals[nv] = _block(a, l0, m)
            nv += 1
        else:
            h = m // 2 - (m // 2) % 8
            node[top, 0], node[top, 1], node[top, 2] = 0, 0, 1
            node[top + 1, 0], node[top + 1, 1], node[top + 1, 2] = l0 + h, m - h, 0
            node[top + 2, 0], node[top + 2, 1], node[top + 2, 2] = l0, h, 0
            top += 3
    return vals[0]


def _pair(xm: float, f: tuple, eta: tuple) -> tuple:
    """(L_src, L_dst) after moving xm remote tokens of e* from r_src to r_dst (no other rank changes);
    f = (c, base_s, n_s, vin_s, vout_s, base_d, n_d, vin_d, vout_d, avg): base_* the compute of the rank's
    other experts, n_* its tokens of e*, vin / vout its remote tokens in / out, avg the cluster mean."""
    c, bs, ns, vis, vos, bd, nd, vid, vod, _ = f
    return (bs + _t(ns - xm, eta) + c * max(vis - xm, vos), bd + _t(nd + xm, eta) + c * max(vid + xm, vod))


def _gap(j: int, lo: float, hi: float, f: tuple, eta: tuple) -> tuple:
    """Grid point j of GRID + 1 over [lo, hi] -> (x_j, L_src - max(avg, L_dst) at x_j)."""
    xj = lo + (hi - lo) * (j / GRID)
    ls, ld = _pair(xj, f, eta)
    return xj, ls - max(f[9], ld)


def _cross(lo: float, hi: float, f: tuple, eta: tuple) -> tuple:
    """On GRID + 1 points over [lo, hi], the first x with L_src <= max(avg, L_dst) and the point before it
    -> (x_before, x_first, gap_before, gap_first), gap = L_src - max(avg, L_dst); where no point qualifies,
    x_first = hi and both gaps are positive (the pool runs out first); at the first point, both are it.
    The gap does not rise with x wherever the expert time does not fall with tokens (L_src falls, L_dst
    rises), so the first qualifying point is found by bisection: log2(GRID) + 2 evaluations instead of up to
    GRID + 1, a third of the batched planner's time at 256 experts / EP 32. Where an efficiency curve rises
    faster than its token count the time dips (H100's between 32 and 42 tokens, by up to 2.9%); there
    bisection may return a later crossing than a scan would: a water level a few tokens off, still valid."""
    x0, g0 = _gap(0, lo, hi, f, eta)
    if g0 <= 0:
        return x0, x0, g0, g0
    xb, gb = _gap(GRID, lo, hi, f, eta)
    if gb > 0:
        xa, ga = _gap(GRID - 1, lo, hi, f, eta) if GRID > 1 else (x0, g0)
        return xa, xb, ga, gb
    a, b, xa, ga = 0, GRID, x0, g0  # gap(a) > 0 >= gap(b)
    while b - a > 1:
        m = (a + b) // 2
        xm, gm = _gap(m, lo, hi, f, eta)
        if gm <= 0:
            b, xb, gb = m, xm, gm
        else:
            a, xa, ga = m, xm, gm
    return xa, xb, ga, gb


def _solve(pool: float, f: tuple, eta: tuple, integral: bool) -> tuple:
    """Line 11's water level -> (tokens to move in [0, pool], the pair's peak latency after it): the
    smallest x with L_src(x) <= max(avg, L_dst(x)) (r_src reaches the cluster average or meets r_dst
    rising), else the pool; on a grid, refined once on the bracketing interval, interpolated (exact when
    latency is linear in tokens); integer counts take the neighbouring integer with the lower peak."""
    lo, hi, _, _ = _cross(0.0, pool, f, eta)
    lo, hi, g_lo, g_hi = _cross(lo, hi, f, eta)
    if g_lo <= 0:
        x = lo
    else:
        x = lo + (hi - lo) * (g_lo / (g_lo - g_hi) if g_hi <= 0 else 1.0)
    best_x, best = x, np.inf
    for cand in ((np.floor(x), min(np.ceil(x), pool)) if integral else (x, x)):
        ls, ld = _pair(cand, f, eta)
        if max(ls, ld) < best:
            best_x, best = cand, max(ls, ld)
    return best_x, best


def _plan_one(x, P, n, tc, comp, vin, vout, lat, win, cin, cout, moves, eta, c, t_unit, integral, k_max, max_red,
              eps):
    """Lines 4-18 for one layer, in place. x: (G, E), P / n: (E, G), the rest (G,); returns k.

    tc (E, G): _t(n[e, g]) of every cell with n[e, g] != 0, kept with n, so an iteration evaluates the curve
    only where its expert's column changes (the same values, so the same plans)."""
    G, E = x.shape
    invalid = np.zeros((G, G), dtype=np.bool_)
    take, col, vin1, vout1, t_old, comp1, lat1 = np.empty((7, G))
    k = 0
    while True:
        src = int(np.argmax(lat))
        # Line 7: hottest expert on r_src among those with remote tokens there (n minus pinned local ones).
        e, best = 0, -np.inf
        for q in range(E):
            ns = n[q, src]
            m = ns - x[src, q] * P[q, src]
            score = ns if m > (0.0 if integral else 1e-9 * (1.0 + ns)) else -1.0
            if score > best:
                e, best = q, score
        if best <= 0:
            return k
        # Lines 6, 8-9: least-loaded helper that passes the dual-side budget check; failing lighter ones
        # are marked invalid for r_src, as the sequential loop would mark them one by one.
        send_ok = max(cin[src], cout[src] + 1) * t_unit <= win[src]
        dst = -1
        for g in range(G):
            if g == src or invalid[src, g]:
                continue
            ok = P[e, g] or (send_ok and cin[g] + 1 <= max_red and max(cin[g] + 1, cout[g]) * t_unit <= win[g])
            if ok and (dst < 0 or lat[g] < lat[dst]):
                dst = g
        for g in range(G):
            if g == src or invalid[src, g] or P[e, g]:
                continue
            if not (send_ok and cin[g] + 1 <= max_red and max(cin[g] + 1, cout[g]) * t_unit <= win[g]):
                if dst < 0 or lat[g] < lat[dst] or (lat[g] == lat[dst] and g < dst):
                    invalid[src, g] = True
        if dst < 0:
            return k
        need = not P[e, dst]
        # Line 11: water-filling. First r_dst's own tokens of e* become local to its new copy, taken from
        # r_src's remote tokens first, then from ranks 0, 1, ...
        own = x[dst, e] if need else 0.0
        m_src = n[e, src] - x[src, e] * P[e, src]
        rest, cum = own - min(own, m_src), 0.0
        for g in range(G):  # before_g = cumsum - own value, as np.cumsum(other) - other computes it
            m = n[e, g] - x[g, e] * P[e, g] if g != src else 0.0
            cum += m
            take[g] = min(own, m_src) if g == src else min(max(rest - (cum - m), 0.0), m)
        for g in range(G):
            col[g] = n[e, g] - take[g]
        col[dst] += own
        for g in range(G):
            vin1[g] = vin[g] - take[g]
            vout1[g] = vout[g]
        vout1[dst] -= own
        for g in range(G):
            t_old[g] = tc[e, g] if n[e, g] != 0.0 else 0.0
            comp1[g] = comp[g] - t_old[g] + (t_old[g] if col[g] == n[e, g] else _t(col[g], eta))
        for g in range(G):
            lat1[g] = comp1[g] + c * max(vin1[g], vout1[g])
        ts, td = _t(col[src], eta), _t(col[dst], eta)
        f = (c, comp1[src] - ts, col[src], vin1[src], vout1[src], comp1[dst] - td, col[dst], vin1[dst],
             vout1[dst], _pairwise(lat1, 0, G) / G)
        xm, peak = _solve(m_src - take[src], f, eta, integral)
        # Line 12: stop on a small gain or an exhausted iteration budget.
        if not (lat[src] - peak > eps * lat[src]) or k >= k_max:
            return k
        col[src] -= xm
        col[dst] += xm
        vin1[src] -= xm
        vin1[dst] += xm
        for g in range(G):
            if col[g] != n[e, g]:
                tc[e, g] = _t(col[g], eta)
                comp[g] = comp[g] - t_old[g] + tc[e, g]
            else:
                comp[g] = comp[g] - t_old[g] + t_old[g]
            n[e, g] = col[g]
            vin[g], vout[g] = vin1[g], vout1[g]
            lat[g] = comp[g] + c * max(vin[g], vout[g])
        if need:
            P[e, dst] = True
            cin[dst] += 1
            cout[src] += 1
        moves[k, 0], moves[k, 1], moves[k, 2], moves[k, 3] = e, src, dst, int(np.rint(xm + own))
        k += 1


def _initial(x, tot, P, single, integral, eta, n, tc, comp, vin, vout, load, own):
    """Lines 2-3 for one layer, into zeroed n (E, G), comp / vin / load (G,) and vout (G,); own (G,) scratch;
    tc (E, G) gets _t(n) of every nonzero cell (others are left as they were: _plan_one reads only those).

    x: (G, E) tokens per source rank; tot (E,) their sums over ranks; P: (E, G) copies; single: no expert of
    any layer has two copies (then an expert's tokens all go to its home rank). load: tokens per rank after.
    Sums run in numpy's order for the same arrays (sequential over the reduced axis, pairwise along a
    contiguous row), so the start state does not depend on whether numba is present.
    """
    G, E = x.shape
    for g in range(G):  # tokens each source sends, before subtracting its local ones
        if integral:  # integer sums are exact in any order: four independent chains, not one long one
            a0, a1, a2, a3, row, e4 = 0.0, 0.0, 0.0, 0.0, x[g], E - E % 4
            for e in range(0, e4, 4):
                a0 += row[e]
                a1 += row[e + 1]
                a2 += row[e + 2]
                a3 += row[e + 3]
            for e in range(e4, E):
                a0 += row[e]
            vout[g] = (a0 + a1) + (a2 + a3)
        else:
            vout[g] = _pairwise(x[g], 0, E)
        own[g] = 0.0
    if single:
        for e in range(E):
            h, o = 0, 0.0
            for g in range(G):
                if P[e, g]:
                    h, o = g, x[g, e]
                    n[e, g] = tot[e]
                    load[g] += tot[e]
                    break
            tc[e, h] = _t(tot[e], eta)
            comp[h] += tc[e, h]
            vin[h] += tot[e] - o
            own[h] += o
    else:
        for e in range(E):
            cnt = 0
            for g in range(G):
                if P[e, g]:
                    n[e, g] = x[g, e]
                    own[g] += x[g, e]
                    cnt += 1
            remote = tot[e] - _pairwise(n[e], 0, G)
            c1 = max(cnt, 1)
            base, rem, cs = remote // c1, remote % c1, 0
            for g in range(G):
                if P[e, g]:
                    cs += 1
                    m = (base + (1.0 if cs - 1 < rem else 0.0)) if integral else remote / c1
                    n[e, g] += m
                    vin[g] += m
                if n[e, g] != 0.0:
                    tc[e, g] = _t(n[e, g], eta)
                    comp[g] += tc[e, g]
                    load[g] += n[e, g]
    for g in range(G):
        vout[g] -= own[g]


def _plan_call(x, P_in, w_in, integral, k_max, max_red, eps, c, t_unit, fpt, peak, xp, fp, floor,
               expert_bytes):
    """Checks, lines 2-3 and the loop for L layers -> (error code, its layer, expert or rank, Plan arrays).

    x: (L, G, E) int64 or float64 (compiled once for each); P_in: (1 or L, E, G) baseline copies; w_in: (1 or L, 1 or G) windows (seconds).
    Error codes: 1 a negative or non-finite load, 2 an expert with tokens and no copy (the first in layer,
    expert order), 3 a negative or NaN window; the arrays are then unfilled. n_int is n as int64 when
    integral, converted in place over n's memory (else empty). The per-rank results share one array, lg (7, L, G): compute, comm, latency,
    start latency, load, start load, transfer seconds (returning one array instead of seven saves the
    boxing of six on every call).
    """
    L, G, E = x.shape
    eta = (fpt, peak, xp, fp, floor)
    many_p, rows_w, cols_w = P_in.shape[0] > 1, w_in.shape[0] > 1, w_in.shape[1] > 1
    P = np.empty((L, E, G), dtype=np.bool_)
    replicas = np.zeros((L, E, G), dtype=np.bool_)
    n = np.zeros((L, E, G))
    # Integral plans are converted in place (n_int views n's memory; n is then not returned): a second
    # (L, E, G) result would be allocated and faulted in afresh on every call once it passes malloc's
    # trim threshold (4 ms a call at 58 x 256 x 32, more than the whole plan).
    n_int = n.view(np.int64) if integral else np.empty((0, 0, 0), dtype=np.int64)
    tot, win = np.zeros((L, E)), np.empty((L, G))
    vin, vout = np.zeros((L, G)), np.empty((L, G))
    lg = np.zeros((7, L, G))
    comp, comm, lat, start_lat, load, start_load, trans = lg[0], lg[1], lg[2], lg[3], lg[4], lg[5], lg[6]
    cin, cout = np.zeros((L, G), dtype=np.int64), np.zeros((L, G), dtype=np.int64)
    k, moved = np.zeros(L, dtype=np.int64), np.zeros(L)
    moves = np.full((L, max(k_max, 1), 4), -1, dtype=np.int64)
    out = (n, n_int, P, replicas, k, moves, moved, lg)
    valid = 0  # counted, not tested with an early exit, so that the loop vectorises
    for lay in range(L):
        t = tot[lay]
        for g in range(G):
            row = x[lay, g]
            for e in range(E):
                v = row[e]
                valid += (v >= 0.0) & (v < np.inf)
                t[e] += v  # sequential over source ranks, as numpy sums over a non-contiguous axis
    if valid != L * G * E:
        return (1, 0, 0) + out
    single = True
    for lay in range(L):
        src = lay if many_p else 0
        for e in range(E):
            cnt = 0
            for g in range(G):
                P[lay, e, g] = P_in[src, e, g]
                cnt += P_in[src, e, g]
            single = single and cnt <= 1
            if tot[lay, e] > 0.0 and cnt == 0:
                return (2, lay, e) + out
    for lay in range(L):
        for g in range(G):
            w = w_in[lay if rows_w else 0, g if cols_w else 0]
            if not w >= 0.0:
                return (3, lay, g) + out
            win[lay, g] = w
    own, tc = np.empty(G), np.empty((E, G))
    for lay in range(L):
        _initial(x[lay], tot[lay], P[lay], single, integral, eta, n[lay], tc, comp[lay], vin[lay], vout[lay],
                 start_load[lay], own)
        for g in range(G):
            lat[lay, g] = comp[lay, g] + c * max(vin[lay, g], vout[lay, g])
            start_lat[lay, g] = lat[lay, g]
        if k_max > 0:
            k[lay] = _plan_one(x[lay], P[lay], n[lay], tc, comp[lay], vin[lay], vout[lay], lat[lay], win[lay],
                               cin[lay], cout[lay], moves[lay], eta, c, t_unit, integral, k_max, max_red, eps)
        if k[lay] == 0:
            load[lay] = start_load[lay]
        else:
            for e in range(E):
                for g in range(G):
                    load[lay, g] += n[lay, e, g]
        received = 0
        for j in range(k[lay]):
            e, g = moves[lay, j, 0], moves[lay, j, 2]
            replicas[lay, e, g] = replicas[lay, e, g] or not P_in[lay if many_p else 0, e, g]
        for g in range(G):
            comm[lay, g] = c * max(vin[lay, g], vout[lay, g])
            trans[lay, g] = max(cin[lay, g], cout[lay, g]) * t_unit
            received += cin[lay, g]
        moved[lay] = received * expert_bytes
        if integral:
            for e in range(E):
                for g in range(G):
                    n_int[lay, e, g] = np.int64(n[lay, e, g])
    return (0, 0, 0) + out


def compile_all(fns: tuple, njit) -> tuple:
    """fns compiled by numba's njit, cached on disk (the first call of a fresh process then loads machine code
    instead of compiling for ~10 s); where numba finds no writable cache directory (it refuses cache=True at
    decoration then), compiled per process instead, with one warning that says how to restore the cache."""
    try:
        return tuple(njit(cache=True)(fn) for fn in fns)
    except (RuntimeError, OSError) as err:
        import warnings

        warnings.warn(f"numba cannot cache the PROBE planner ({err}); it compiles in every process (~10 s). "
                      "Set NUMBA_CACHE_DIR to a writable directory to cache it.", RuntimeWarning, stacklevel=2)
        return tuple(njit(cache=False)(fn) for fn in fns)


try:  # numba is optional: without it the same functions run as Python (slower, same plans)
    from numba import njit
except ImportError:  # pragma: no cover - depends on the environment
    njit = None
if njit is not None:
    _t, _block, _pairwise, _pair, _gap, _cross, _solve, _plan_one, _initial, _plan_call = compile_all(
        (_t, _block, _pairwise, _pair, _gap, _cross, _solve, _plan_one, _initial, _plan_call), njit)
