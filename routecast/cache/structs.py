"""Victim-order structures of the replay kernel (numba): lazy binary min-heaps and recency lists.

Heaps: one region per pool in flat arrays (h1, h2 priority pair, hk key, hv version); an entry is stale once
its key's version has moved on, and is dropped when popped. Recency lists: for the policies that evict the
least recently touched key (LRU, per-layer LRU, SE-MoE), one circular doubly-linked list per pool over
K keys plus P sentinels (node K + p); touching a key moves it to the most-recent end in O(1), the victim
is the first eligible key from the least-recent end. Both give the same order when every touch takes a
fresh, increasing tick (the kernel's rule), so the lists only make those policies faster.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def less(a1, a2, b1, b2):
    return a1 < b1 or (a1 == b1 and a2 < b2)


@njit(cache=True)
def hput(h1, h2, hk, hv, j, v1, v2, key, ver):
    h1[j] = v1
    h2[j] = v2
    hk[j] = key
    hv[j] = ver


@njit(cache=True)
def hpush(h1, h2, hk, hv, hstart, hsize, p, v1, v2, key, ver):
    base = hstart[p]
    i = hsize[p]
    hsize[p] = i + 1
    while i > 0:
        par = (i - 1) >> 1
        j = base + par
        if not less(v1, v2, h1[j], h2[j]):
            break
        hput(h1, h2, hk, hv, base + i, h1[j], h2[j], hk[j], hv[j])
        i = par
    hput(h1, h2, hk, hv, base + i, v1, v2, key, ver)


@njit(cache=True)
def hpop(h1, h2, hk, hv, hstart, hsize, p):
    """Remove the root of pool p's heap; returns (p1, p2, key, version)."""
    base = hstart[p]
    r1, r2, rk, rv = h1[base], h2[base], hk[base], hv[base]
    n = hsize[p] - 1
    hsize[p] = n
    if n > 0:
        v1, v2, key, ver = h1[base + n], h2[base + n], hk[base + n], hv[base + n]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and less(h1[base + c + 1], h2[base + c + 1], h1[base + c], h2[base + c]):
                c += 1
            j = base + c
            if not less(h1[j], h2[j], v1, v2):
                break
            hput(h1, h2, hk, hv, base + i, h1[j], h2[j], hk[j], hv[j])
            i = c
        hput(h1, h2, hk, hv, base + i, v1, v2, key, ver)
    return r1, r2, rk, rv


@njit(cache=True)
def lunlink(lnx, lpv, k):
    n, p = lnx[k], lpv[k]
    lnx[p] = n
    lpv[n] = p
    lnx[k] = k
    lpv[k] = k


@njit(cache=True)
def ltouch(lnx, lpv, k, sentinel):
    """Move key k (linked or not) to the most recent end of the list headed by `sentinel`."""
    if lnx[k] != k:
        lunlink(lnx, lpv, k)
    last = lpv[sentinel]
    lnx[last] = k
    lpv[k] = last
    lnx[k] = sentinel
    lpv[sentinel] = k


@njit(cache=True)
def lvictim(lnx, sentinel, ready, cur, mode, tnow, a, E, excl_layer):
    """The least recent eligible key of a list, or -1 (mode as in kernel._pop_victim; modes 0 and 2)."""
    v = lnx[sentinel]
    n = 0
    while v != sentinel:
        skip = mode != 0 and ready[v] > tnow
        if mode == 2:
            skip = skip or cur[v] == a or v // E == excl_layer
        if not skip:
            return v
        n += 1
        if n >= 64:
            return -1
        v = lnx[v]
    return -1


@njit(cache=True)
def bump_count(order, pos, cnt, k, base):
    """cnt[k] just grew: move key k towards the front of its block of `order` (from index base), which is
    kept sorted by (-cnt[key], key); pos[key] is each key's index in `order`. Counts only grow, so a key
    only moves forward, usually past a few keys."""
    i = pos[k]
    c = cnt[k]
    while i > base:
        o = order[i - 1]
        if cnt[o] > c or (cnt[o] == c and o < k):
            break
        order[i] = o
        pos[o] = i
        i -= 1
    order[i] = k
    pos[k] = i
