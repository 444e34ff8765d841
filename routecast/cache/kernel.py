"""The replay simulator's compiled core: a trace's accesses under one cache policy, one window at a time.

replay_window replays a window of whole steps and carries everything that outlives it (the cache, its heaps
and recency lists, the link's queue, the clock, counters: new_state) to the next window, so a trace of any
length is replayed in memory bounded by its window, bit-for-bit as in one window holding the whole trace.

Legend: A accesses (one per (step, layer), step-major), N required (access, expert) entries, M predicted
entries, K = L·E cache keys (key = layer·E + expert), P pools. Times in seconds.

An access is what one MoE layer of one forward step needs: the union of the experts its batch's tokens
route to (ExpertFlow eq. 7's bit-wise OR), each expert computed once for all its tokens. Per access:

1. at the layer's start t, prefetching policies issue transfers (PLEC: the forecast's experts for this and
   later layers of the step, nearest layer first; they queue on the single host-to-device link);
2. the router decides at tr = t + dense_s: a required expert is a *hit* when resident or already on its way
   (an in-flight prefetch: no demand load is needed, the wait shows in the stall); otherwise a *miss*, loaded
   on demand at tr, behind queued prefetches (FIFO), ahead of every one not yet started (eager priority),
   or ahead of those that still arrive before their own layer's router asks (slack-aware priority: a
   demand load never turns a prefetch that would have been in time into a late one);
3. experts are computed one after another, earliest-ready first; expert i starts at max(end of i-1,
   ready_i). The layer ends when the last one ends; stall = end - (tr + Σ compute).

Hits are computed before misses are fetched, so a miss may evict an expert of the same access once it is
computed (a pool smaller than the batch's union still works, one expert at a time). Belady may also stream
a miss through a one-expert staging buffer without caching it, when every resident expert is needed no
later (the budget counts cache slots; the staging slot is the extra buffer ExpertFlow's multi-stream
pipeline also keeps): evicting the farthest-needed expert at access granularity is then optimal over all
demand policies, ties included (a tie is between experts both needed by the same access, where either
choice costs one load and leaves the same experts available). A transfer in flight is never evicted to
make room for a prefetch. Victims come from a lazy binary min-heap per pool over each
policy's priority pair (p1, p2): the smallest is evicted; a key's entry is stale once its version moves on.
The recency policies (LRU, per-layer LRU, SE-MoE) keep O(1) recency lists instead (structs.py), same order.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from routecast.cache.structs import bump_count, hpop, hpush, less, ltouch, lunlink, lvictim

LRU, LFU, LFUDA, BELADY, SEMOE, PLEC = 0, 1, 2, 3, 4, 5
DEMAND_FIFO, DEMAND_EAGER, DEMAND_SLACK = 0, 1, 2  # how a demand load queues on the link (see replay_window)
OP_LOAD, OP_PREFETCH, OP_EVICT, OP_COMPUTE, OP_STREAM = 0, 1, 2, 3, 4
NEVER = 1e18  # next use of a key that is never used again (Belady)
_PRED = 1e15  # PLEC: keys predicted for the rest of the step rank above every fallback priority


@njit(cache=True)
def _log(log, nl, overflow, a, key, op):
    """Append (access, key, op) to the event log unless it is full; returns (entries, overflowed)."""
    if nl < log.shape[0]:
        log[nl, 0], log[nl, 1], log[nl, 2] = a, key, op
        return nl + 1, overflow
    return nl, True


@njit(cache=True)
def _evict(victim, p, a, resident, pf, ver, used, evs, lnx, lpv):
    if lnx[victim] != victim:
        lunlink(lnx, lpv, victim)
    resident[victim] = False
    pf[victim] = False
    ver[victim] += 1  # its heap entries go stale
    used[p] -= 1
    evs[a] += 1


@njit(cache=True)
def _admit_prefetch(k, p, a, arrive, load_id, prio1, now, resident, used, ready, lid, pf, last, pref, ver,
                    h1, h2, hk, hv, hstart, hsize):
    """Make prefetched key k resident (arriving at `arrive`, touched at tick `now`) with priority (prio1, 0);
    returns the link's free time."""
    resident[k] = True
    used[p] += 1
    ready[k] = arrive
    lid[k] = load_id
    pf[k] = True
    last[k] = now
    pref[a] += 1
    ver[k] += 1
    hpush(h1, h2, hk, hv, hstart, hsize, p, prio1, 0.0, k, ver[k])
    return arrive


@njit(cache=True)
def _semoe_prefetch(keys, a, al, nxt_layer, link_free, tr, xfer_s, next_lid, tick, E, K, pool_of, used, pool_cap,
                    resident, ready, cur, lid, pf, last, ver, lnx, lpv, pref, evs, log_on, log, nl, overflow):
    """SE-MoE at the router of access a (al in the window): prefetch `keys` (the next layer's, most used first) that are not
    resident, each evicting the least recent eligible key (recency lists), until no victim is left.
    Returns (link_free, next_lid, tick, log entries, log overflowed). Its own function: one call per access
    keeps this loop, the hottest of the replay, small enough to compile tightly."""
    arrive = max(link_free, tr)
    for j in range(keys.shape[0]):
        k = keys[j]
        if resident[k]:
            continue
        p = pool_of[k]
        if used[p] >= pool_cap[p]:
            victim = lvictim(lnx, K + p, ready, cur, 2, tr, a, E, nxt_layer)
            if victim < 0:
                break
            lunlink(lnx, lpv, victim)
            resident[victim] = False
            pf[victim] = False
            ver[victim] += 1
            used[p] -= 1
            evs[al] += 1
            if log_on:
                nl, overflow = _log(log, nl, overflow, a, victim, OP_EVICT)
        arrive += xfer_s
        link_free = arrive
        resident[k] = True
        used[p] += 1
        ready[k] = arrive
        lid[k] = next_lid
        pf[k] = True
        last[k] = tick
        pref[al] += 1
        ver[k] += 1
        ltouch(lnx, lpv, k, K + p)
        next_lid += 1
        tick += 1.0
        if log_on:
            nl, overflow = _log(log, nl, overflow, a, k, OP_PREFETCH)
    return link_free, next_lid, tick, nl, overflow


@njit(cache=True)
def _prio(policy, fallback, k, E, step, last, cnt, kval, nxt, mis, pred_step):
    """The (p1, p2) priority of resident key k under `policy`: the smallest is evicted first."""
    if policy == LRU or policy == SEMOE:
        return last[k], 0.0
    if policy == LFU:
        return cnt[k], last[k]
    if policy == LFUDA:
        return kval[k], last[k]
    if policy == BELADY:
        return -nxt[k], last[k]
    if mis[k]:  # PLEC with correction: a mispredicted expert of the current layer goes first
        return -2.0, last[k]
    if pred_step[k] == step:  # predicted for a layer still to come in this step: nearer layer ranks higher
        return _PRED - (k // E), 0.0
    if fallback == 0:
        return last[k], 0.0
    return cnt[k], last[k]


@njit(cache=True)
def _pop_victim(h1, h2, hk, hv, hstart, hsize, p, resident, ver, ready, cur, t1, t2, tk, tv,
                mode, tnow, a, E, excl_layer, lim1, lim2):
    """Pop pool p's lowest-priority evictable key, or -1; skipped entries are pushed back.

    mode 0 (demand miss): any key, lowest priority first (a transfer in flight still occupies the link).
    mode 1 (PLEC prefetch): the victim must rank below (lim1, lim2), never in flight.
    mode 2 (SE-MoE prefetch): never in flight, never needed by access a, never of layer excl_layer.
    A prefetch looks past at most 64 excluded keys, then gives up (keeps the replay linear in the trace).
    """
    victim = -1
    n = 0
    while hsize[p] > 0:
        v1, v2, vk, vv = hpop(h1, h2, hk, hv, hstart, hsize, p)
        if not resident[vk] or vv != ver[vk]:
            continue  # stale entry
        skip = mode != 0 and ready[vk] > tnow
        if mode == 2:
            skip = skip or cur[vk] == a or vk // E == excl_layer
        if skip:
            t1[n], t2[n], tk[n], tv[n] = v1, v2, vk, vv
            n += 1
            if n >= 64:  # a prefetch gives up rather than scan every transfer in flight
                break
            continue
        if mode == 1 and not less(v1, v2, lim1, lim2):
            t1[n], t2[n], tk[n], tv[n] = v1, v2, vk, vv
            n += 1
            break
        victim = vk
        break
    for i in range(n):
        hpush(h1, h2, hk, hv, hstart, hsize, p, t1[i], t2[i], tk[i], tv[i])
    return victim


@njit(cache=True)
def _slack_insert(q_key, q_lid, lid, first, tail, nq, req_key, req_comp, resident, r0, r1, layer, E, cd, xfer_s):
    """Where this access's demand loads enter the prefetch queue (ring index in first..tail) so that no queued
    prefetch for a later layer that could still arrive in time is pushed past its layer's router.

    After the demand loads the layer still computes at least one missed expert (the cheapest one, c_min),
    then layers l+1..l' each spend their non-expert time before the router of layer l' asks. Queued
    transfers run back to back, so if the demand loads enter at queue position j, the prefetch at position
    q >= j arrives (q - j + 1) transfers after them; it stays in time iff that fits in
    c_min + non-expert time up to its layer, i.e. j >= q + 1 - floor(slack_q / xfer_s). The smallest j that
    meets every such bound is returned (first = jump every prefetch, tail = behind all of them). Only the
    prefetches already queued are protected: on a busy link the layers then start earlier than under FIFO,
    and prefetches issued at those starts can arrive after their routers (the same link time, waited for
    later).
    """
    c_min = 1e300
    for i in range(r0, r1):
        if not resident[req_key[i]] and req_comp[i] < c_min:
            c_min = req_comp[i]
    if c_min == 1e300:
        return first
    n = (tail - first + nq) % nq
    need = 0  # smallest relative insertion index allowed so far
    for r in range(n):
        q = (first + r) % nq
        k = q_key[q]
        lk = k // E
        if lid[k] != q_lid[q] or not resident[k] or lk <= layer:
            continue  # evicted since it was queued, or due at this layer already (late whatever the order)
        slack = c_min + cd[lk + 1] - cd[layer + 1]  # cd: non-expert seconds of the step's layers < index
        fit = int(slack / xfer_s) if xfer_s > 0 else n
        b = r + 1 - fit
        if b > need:
            need = b
    return (first + need) % nq


# Slots of the scalar state arrays (new_state): float64 and int64.
F_LINK, F_CLOCK, F_TICK, F_STALL, F_IDEAL = 0, 1, 2, 3, 4
I_LID, I_QHEAD, I_QTAIL, I_USEFUL, I_OVERFLOW = 0, 1, 2, 3, 4


def new_state(policy: int, L: int, E: int, pool_off: np.ndarray) -> tuple:
    """A fresh cache (empty, link idle, clock 0) for replay_window: every array it carries from one window of
    accesses to the next, so memory depends on K = L·E and the pools, never on the trace's length.

    pool_off (P+1,): the pools' key ranges (CSR offsets into pool_keys). Returns a tuple of arrays in
    replay_window's order; the two last are the scalars (float64 F_*, int64 I_* slots).
    """
    K = L * E
    P = pool_off.shape[0] - 1
    nk = np.diff(pool_off).astype(np.int64)
    hroom = 2 * nk + 4 * E + 16  # most pushes one access can make into a pool's heap
    hcap = 2 * nk + hroom + 64
    hstart = np.concatenate([[0], np.cumsum(hcap)[:-1]]).astype(np.int64)
    lists = policy == LRU or policy == SEMOE  # recency order: O(1) lists instead of the heaps
    tot = 1 if lists else int(hcap.sum())
    nq = 2 * K + 2  # ring of prefetch transfers not yet finished (start, end, key, load id)
    sf = np.zeros(8, np.float64)
    si = np.zeros(8, np.int64)
    si[I_LID] = 1
    return (
        np.zeros(K, np.bool_), np.zeros(K, np.float64), np.zeros(K, np.int64),  # resident, ready, ver
        np.zeros(K, np.float64), np.zeros(K, np.float64), np.zeros(K, np.float64),  # last, cnt, fcnt
        np.zeros(K, np.float64), np.full(K, NEVER), np.full(K, -1, np.int64),  # kval, nxt, pred_step
        np.zeros(K, np.bool_), np.zeros(K, np.bool_), np.full(K, -1, np.int64),  # mis, pf, cur
        np.zeros(K, np.int64), np.zeros(P, np.int64), np.zeros(P, np.float64),  # lid, used, age
        np.full(P, -1, np.int64), hstart, hcap, hroom, np.zeros(P, np.int64),  # blocked, heap regions, sizes
        np.zeros(tot, np.float64), np.zeros(tot, np.float64), np.zeros(tot, np.int64), np.zeros(tot, np.int64),
        np.arange(K + P, dtype=np.int64), np.arange(K + P, dtype=np.int64),  # recency lists (node K + p: sentinel)
        np.arange(K, dtype=np.int64), np.arange(K, dtype=np.int64),  # SE-MoE: keys by count, and their index
        np.zeros(nq, np.float64), np.zeros(nq, np.float64), np.zeros(nq, np.int64), np.zeros(nq, np.int64),
        sf, si,
    )


@njit(cache=True)
def replay_window(
    policy, correct, priority_demand, plec_fallback, layer_ahead, depth,
    L, E, pool_of, pool_cap, pool_keys, pool_off, state, a0,
    req_off, req_key, req_comp, req_next,
    pred_off, pred_key,
    dense_s, xfer_s, log_on,
):
    """Replay one window of W = steps·L accesses (whole steps), global accesses a0 .. a0+W-1; see the module
    docstring for the model. The cache, link and clock come in and go out in `state` (new_state), so a trace
    replayed window by window gives bit-for-bit the result of one window holding all of it.

    policy: LRU | LFU | LFUDA | BELADY | SEMOE | PLEC. correct: PLEC real-time correction (mispredicted
    experts of the current layer are evicted first). priority_demand: DEMAND_FIFO (demand loads queue behind
    every prefetch), DEMAND_EAGER (they overtake every queued prefetch that has not started) or DEMAND_SLACK
    (they overtake the queued prefetches that still arrive before their layer's router asks; see
    _slack_insert). plec_fallback: 0 = recency, 1 = frequency for keys with no
    predicted use left in the step. layer_ahead: layer l's forecast arrives at layer l-1's start (layer
    horizon) instead of at the step's start (request horizon). depth: PLEC prefetches the forecast of
    layers l+1..l+depth at layer l's start (the rest of the forecast only protects experts from eviction).
    pool_of (K,) int64, pool_cap (P,) int64; pool_keys/pool_off: the keys of each pool (CSR).
    Window-local: req_off (W+1,), req_key (N,) int64, req_comp (N,) float64 compute seconds, req_next (N,)
    float64 *global* index of the next access needing that key (NEVER if none); pred_off (W+1,), pred_key
    (M,): forecast keys; dense_s (W,) float64 non-expert seconds before the router; xfer_s: seconds per
    expert transfer. Returns the window's per-access hits, on_time, misses, prefetches, evictions (int64
    (W,)), stall_s, end_s (float64 (W,)) and its event log (int64 (n, 3): global access, key, op); the
    totals (useful prefetches, stall, ideal time, log overflow) accumulate in the state's scalars.
    """
    (resident, ready, ver, last, cnt, fcnt, kval, nxt, pred_step, mis, pf, cur, lid, used, age, blocked,
     hstart, hcap, hroom, hsize, h1, h2, hk, hv, lnx, lpv, by_count, by_pos, q_start, q_end, q_key, q_lid,
     sf, si) = state
    A = req_off.shape[0] - 1
    K = L * E
    P = pool_cap.shape[0]
    lists = policy == LRU or policy == SEMOE
    nq = q_key.shape[0]
    ibuf = np.zeros(E, np.int64)
    t1 = np.zeros(K + 1, np.float64)
    t2 = np.zeros(K + 1, np.float64)
    tk = np.zeros(K + 1, np.int64)
    tv = np.zeros(K + 1, np.int64)
    cd = np.zeros(L + 1, np.float64)  # cd[j] = non-expert seconds of the current step's layers < j
    n_log = (8 * (req_key.shape[0] + pred_key.shape[0]) + (2 * A * E if policy == SEMOE else 0) + 64) if log_on else 1
    log = np.zeros((n_log, 3), np.int64)
    nl = 0
    overflow = si[I_OVERFLOW] != 0

    hits = np.zeros(A, np.int64)
    on_time = np.zeros(A, np.int64)
    misses = np.zeros(A, np.int64)
    pref = np.zeros(A, np.int64)
    evs = np.zeros(A, np.int64)
    stall = np.zeros(A, np.float64)
    end = np.zeros(A, np.float64)
    link_free, clock, tick, stall_sum, ideal = sf[F_LINK], sf[F_CLOCK], sf[F_TICK], sf[F_STALL], sf[F_IDEAL]
    next_lid, q_head, q_tail, useful = si[I_LID], si[I_QHEAD], si[I_QTAIL], si[I_USEFUL]
    sbuf_r = np.zeros(E, np.float64)
    sbuf_c = np.zeros(E, np.float64)

    for al in range(A):
        a = a0 + al  # global access index: what `cur`, `blocked` and the log hold
        layer = a % L
        step = a // L
        t = clock
        if layer == 0:
            for j in range(L):
                cd[j + 1] = cd[j] + dense_s[al + j]
        for p in range(P):
            if not lists and hsize[p] > hcap[p] - hroom[p]:
                hsize[p] = 0
                for j in range(pool_off[p], pool_off[p + 1]):
                    k = pool_keys[j]
                    if resident[k]:
                        v1, v2 = _prio(policy, plec_fallback, k, E, step, last, cnt, kval, nxt, mis, pred_step)
                        ver[k] += 1
                        hpush(h1, h2, hk, hv, hstart, hsize, p, v1, v2, k, ver[k])
        if priority_demand:
            while q_head != q_tail and q_end[q_head] <= t:
                q_head = (q_head + 1) % nq
        # ---------------------------------------------------------------- PLEC: forecast arrives, prefetch
        if policy == PLEC:
            m_lo, m_hi = 0, 0
            if not layer_ahead:
                if layer == 0:
                    m_lo, m_hi = pred_off[al], pred_off[al + L]
            else:
                m_lo = pred_off[al if layer == 0 else al + 1]
                m_hi = pred_off[min(al + 2, al + L - layer)]
            for m in range(m_lo, m_hi):
                k = pred_key[m]
                pred_step[k] = step
                if resident[k]:
                    ver[k] += 1
                    hpush(h1, h2, hk, hv, hstart, hsize, pool_of[k], _PRED - (k // E), 0.0, k, ver[k])
            # the forecast's next `depth` layers, nearest first, while a lower-priority victim exists; a
            # prefetch issued for the current layer would leave with its demand load, so it is not issued
            for m in range(pred_off[min(al + 1, al + L - layer)], pred_off[min(al + 1 + depth, al + L - layer)]):
                k = pred_key[m]
                p = pool_of[k]
                if resident[k] or pred_step[k] != step or blocked[p] == a:
                    continue
                c1 = _PRED - (k // E)
                if used[p] >= pool_cap[p]:
                    victim = _pop_victim(h1, h2, hk, hv, hstart, hsize, p, resident, ver, ready, cur, t1, t2, tk, tv,
                                         1, t, a, E, -1, c1, 0.0)
                    if victim < 0:
                        blocked[p] = a
                        continue
                    _evict(victim, p, al, resident, pf, ver, used, evs, lnx, lpv)
                    if log_on:
                        nl, overflow = _log(log, nl, overflow, a, victim, OP_EVICT)
                st = max(link_free, t)
                link_free = _admit_prefetch(k, p, al, st + xfer_s, next_lid, c1, tick, resident, used, ready, lid, pf,
                                            last, pref, ver, h1, h2, hk, hv, hstart, hsize)
                next_lid += 1
                tick += 1.0
                if priority_demand:
                    q_start[q_tail], q_end[q_tail], q_key[q_tail], q_lid[q_tail] = st, ready[k], k, lid[k]
                    q_tail = (q_tail + 1) % nq
                if log_on:
                    nl, overflow = _log(log, nl, overflow, a, k, OP_PREFETCH)
        # ---------------------------------------------------------------- router: correction, hits, misses
        tr = t + dense_s[al]
        r0, r1 = req_off[al], req_off[al + 1]
        for i in range(r0, r1):
            cur[req_key[i]] = a
        if policy == PLEC and correct:
            for m in range(pred_off[al], pred_off[al + 1]):
                k = pred_key[m]
                if cur[k] != a:
                    mis[k] = True
                    if resident[k]:
                        ver[k] += 1
                        hpush(h1, h2, hk, hv, hstart, hsize, pool_of[k], -2.0, last[k], k, ver[k])
        first_shift = q_tail
        if priority_demand:
            while q_head != q_tail and q_end[q_head] <= tr:
                q_head = (q_head + 1) % nq
            dcur = tr
            first_shift = q_head
            if q_head != q_tail and q_start[q_head] <= tr:  # in progress: it finishes first
                dcur = q_end[q_head]
                first_shift = (q_head + 1) % nq
            if priority_demand == DEMAND_SLACK and first_shift != q_tail:
                j = _slack_insert(q_key, q_lid, lid, first_shift, q_tail, nq, req_key, req_comp, resident, r0, r1,
                                  layer, E, cd, xfer_s)
                if j != first_shift:
                    prev = (j - 1 + nq) % nq
                    dcur = max(dcur, q_end[prev])
                    first_shift = j
        else:
            dcur = max(link_free, tr)
        n_miss = 0
        # Hits are computed first, then misses are fetched and computed (a miss may evict a computed hit).
        nh = 0
        for i in range(r0, r1):
            if resident[req_key[i]]:
                ibuf[nh] = i
                nh += 1
        nm = nh
        for i in range(r0, r1):
            if not resident[req_key[i]]:
                ibuf[nm] = i
                nm += 1
        for j0 in range(nm):
            i = ibuf[j0]
            k = req_key[i]
            p = pool_of[k]
            if resident[k]:
                hits[al] += 1
                if ready[k] <= tr:
                    on_time[al] += 1
                if pf[k]:
                    useful += 1
                    pf[k] = False
            else:
                misses[al] += 1
                n_miss += 1
                stream = False
                victim = -1
                if used[p] >= pool_cap[p]:
                    if lists:
                        victim = lvictim(lnx, K + p, ready, cur, 0, tr, a, E, -1)
                    else:
                        victim = _pop_victim(h1, h2, hk, hv, hstart, hsize, p, resident, ver, ready, cur, t1, t2, tk,
                                             tv, 0, tr, a, E, -1, 0.0, 0.0)
                    if victim < 0:
                        raise RuntimeError("cache replay: a full pool has no resident key in its heap")
                    if policy == BELADY and nxt[victim] <= req_next[i]:
                        # every resident is needed no later than k: k streams through the staging slot
                        stream = True
                        hpush(h1, h2, hk, hv, hstart, hsize, p, -nxt[victim], last[victim], victim, ver[victim])
                if stream:
                    ready[k] = dcur + xfer_s
                    dcur = ready[k]
                    last[k] = tick
                    tick += 1.0
                    nxt[k] = req_next[i]
                    if log_on:
                        nl, overflow = _log(log, nl, overflow, a, k, OP_STREAM)
                    continue
                if used[p] >= pool_cap[p]:
                    _evict(victim, p, al, resident, pf, ver, used, evs, lnx, lpv)
                    if policy == LFUDA:
                        age[p] = kval[victim]
                        fcnt[victim] = 0.0
                    if log_on:
                        nl, overflow = _log(log, nl, overflow, a, victim, OP_EVICT)
                resident[k] = True
                used[p] += 1
                lid[k] = next_lid
                next_lid += 1
                ready[k] = dcur + xfer_s
                dcur = ready[k]
                if log_on:
                    nl, overflow = _log(log, nl, overflow, a, k, OP_LOAD)
            # the access itself: recency, frequency, LFUDA value, Belady's next use
            last[k] = tick  # one tick per touched expert: recency ties never depend on the heap
            tick += 1.0
            cnt[k] += 1.0
            fcnt[k] += 1.0
            if policy == SEMOE:
                bump_count(by_count, by_pos, cnt, k, (k // E) * E)
            kval[k] = fcnt[k] + age[p]
            nxt[k] = req_next[i]
            mis[k] = False
            ver[k] += 1
            if lists:
                ltouch(lnx, lpv, k, K + p)
            else:
                v1, v2 = _prio(policy, plec_fallback, k, E, step, last, cnt, kval, nxt, mis, pred_step)
                hpush(h1, h2, hk, hv, hstart, hsize, p, v1, v2, k, ver[k])
            if log_on:
                nl, overflow = _log(log, nl, overflow, a, k, OP_COMPUTE)
        if n_miss:
            if priority_demand:
                # prefetches that had not started wait behind the demand loads
                q = first_shift
                while q != q_tail:
                    if q_start[q] < dcur:
                        q_start[q] = dcur
                        q_end[q] = dcur + xfer_s
                        if lid[q_key[q]] == q_lid[q]:
                            ready[q_key[q]] = q_end[q]
                    dcur = q_end[q]
                    q = (q + 1) % nq
                link_free = max(link_free, dcur)
            else:
                link_free = dcur
        # ---------------------------------------------------------------- SE-MoE: prefetch the next layer
        if policy == SEMOE:
            nxt_layer = (layer + 1) % L
            base = nxt_layer * E
            link_free, next_lid, tick, nl, overflow = _semoe_prefetch(
                by_count[base:base + E], a, al, nxt_layer, link_free, tr, xfer_s, next_lid, tick, E, K, pool_of, used,
                pool_cap, resident, ready, cur, lid, pf, last, ver, lnx, lpv, pref, evs, log_on, log, nl, overflow)
        # ---------------------------------------------------------------- compute, earliest-ready first
        n = r1 - r0
        comp = 0.0
        for i in range(n):
            sbuf_r[i] = ready[req_key[r0 + i]]
            sbuf_c[i] = req_comp[r0 + i]
            comp += sbuf_c[i]
        order_r = np.argsort(sbuf_r[:n], kind="mergesort")
        e_end = tr
        for j in range(n):
            i = order_r[j]
            e_end = max(e_end, sbuf_r[i]) + sbuf_c[i]
        stall[al] = e_end - (tr + comp)
        stall_sum += stall[al]  # running totals, added in access order: the same for any windowing
        ideal += dense_s[al] + comp
        end[al] = e_end
        clock = e_end
        # ---------------------------------------------------------------- PLEC: this layer's forecast is spent
        if policy == PLEC:
            for m in range(pred_off[al], pred_off[al + 1]):
                k = pred_key[m]
                pred_step[k] = -1
                mis[k] = False
                if resident[k]:
                    ver[k] += 1
                    v1, v2 = _prio(policy, plec_fallback, k, E, step, last, cnt, kval, nxt, mis, pred_step)
                    hpush(h1, h2, hk, hv, hstart, hsize, pool_of[k], v1, v2, k, ver[k])
    sf[F_LINK], sf[F_CLOCK], sf[F_TICK], sf[F_STALL], sf[F_IDEAL] = link_free, clock, tick, stall_sum, ideal
    si[I_LID], si[I_QHEAD], si[I_QTAIL], si[I_USEFUL], si[I_OVERFLOW] = next_lid, q_head, q_tail, useful, overflow
    return hits, on_time, misses, pref, evs, stall, end, log[:nl]
