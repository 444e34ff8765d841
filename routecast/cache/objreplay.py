"""Replay of the policy objects (zoo.py): the same objects the runtime drives, with the kernel's time model.

Legend as in kernel.py: A = S·L accesses, step-major; N required (access, expert) entries; keys layer·E + expert.

Per access (step s, layer l), as kernel.replay_window with demand loads queued FIFO on one link:
1. the router asks at tr = t + dense_s; a required key is a hit when the policy holds it (on time when its
   transfer ended by tr); hits are touched first, then each miss in a full pool evicts the policy's victim
   (incoming = the missing key) and is loaded on demand at max(link free, tr), one transfer after another;
2. experts are computed earliest-ready first; the layer ends when the last one ends; stall = end - (tr + Σ
   compute) (time the compute waits for the link); the clock moves to the end.
3. NAME+bypass (zoo.BYPASSES): the pool has the budget less zoo.STAGING slots; a miss the policy keeps out
   (keeps_out(miss, victim)) evicts nothing and is read, after the layer's other demand loads, into a staging
   slot, free again once its expert is computed: with one slot each such read waits for the one before it to be
   computed. Belady here never bypasses, so it bounds the demand-only policies, not these.
4. with prefetch admission (NAME+admit): after the demand loads are queued, each forecast key of layer l+1
   that no slot holds is weighed by forecast_evict.admit_prefetch, with W = (estimated start of layer l+1's
   router) - (when the link frees), the victim the policy would evict and its reuse probability; admitted
   ones are queued behind the demand loads and W shrinks by a transfer each.

Before each step the policies get begin_step(requests, the step's forecast sets, reuse forecasts); after it end_step(the step's
routing per request, a reuse.StepUse). Without prefetches the decisions and the time are the kernel's
for lru and lfu, exactly (tests/cache/test_zoo.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from routecast.cache.forecast_evict import PrefetchAdmission, admit_prefetch
from routecast.cache.reuse import StepUse
from routecast.cache.zoo import STAGING, bypasses, make_policy, split_name
from routecast.common.errors import ConfigError
from routecast.trace import Trace


def step_uses(trace: Trace) -> tuple[np.ndarray, list[StepUse]]:
    """(step ids (S,), one StepUse per step in step order): each step's routing per request, vectorised."""
    L, E = trace.spec.num_layers, trace.spec.num_experts
    step = np.asarray(trace.step, np.int64)
    req = np.asarray(trace.tokens["request"], np.int64)
    ex = np.asarray(trace.experts_TLK).astype(np.int64)
    T, _, k = ex.shape
    steps, s_idx = np.unique(step, return_inverse=True)
    reqs, r_idx = np.unique(req, return_inverse=True)
    keys = (np.arange(L, dtype=np.int64)[None, :, None] * E + ex)
    ok = ex >= 0
    rows = np.broadcast_to(np.arange(T)[:, None, None], ex.shape)[ok]
    K = L * E
    code = (s_idx[rows] * len(reqs) + r_idx[rows]) * K + keys[ok]
    u, cnt = np.unique(code, return_counts=True)
    pair, key = u // K, u % K
    tok_code = s_idx * len(reqs) + r_idx
    tu, tcnt = np.unique(tok_code, return_counts=True)
    out: list[StepUse] = []
    p_lo = np.searchsorted(tu // len(reqs), np.arange(len(steps) + 1))
    for s in range(len(steps)):
        pairs = tu[p_lo[s]:p_lo[s + 1]]
        lo, hi = np.searchsorted(pair, pairs[0]), np.searchsorted(pair, pairs[-1], side="right")
        off = np.searchsorted(pair[lo:hi], pairs).astype(np.int64)
        out.append(StepUse(requests=reqs[pairs % len(reqs)], off=np.append(off, hi - lo), keys=key[lo:hi],
                           counts=cnt[lo:hi].astype(np.float64), tokens=tcnt[p_lo[s]:p_lo[s + 1]]))
    del k
    return steps, out


def replay_objects(name: str, req_off: np.ndarray, req_key: np.ndarray, comp_s: np.ndarray, L: int, E: int,
                   budget: int, *, xfer_s: float, dense_s: float = 0.0, per_layer: bool = False,
                   pred_SLE: np.ndarray | None = None, uses: Sequence[StepUse] | None = None,
                   num_tokens: int = 0, expert_bytes: int = 0,
                   reuse: Sequence[np.ndarray] | None = None) -> dict[str, Any]:
    """Replay accesses (req_off (A+1,), req_key (N,), comp_s (N,) compute seconds) under policy object `name`
    (zoo.py; NAME+admit adds prefetch admission) -> the metrics dict of replay.PolicyRun.result plus
    prefetch_bytes_unused and demand_stall_s. pred_SLE: bool (S, L, E) forecast sets (fc-evict, +admit); uses:
    one StepUse per step (request profiles; None = none known); reuse: per step a reuse probe's log d̂ (R, L, L·E)
    for that step's requests (uses[s].requests order; fc-evict's forecast from the router inputs)."""
    base, admit = split_name(name)
    A = len(req_off) - 1
    if A % L:
        raise ConfigError(f"the accesses are {A}, not a whole number of {L}-layer steps.")
    S = A // L
    if pred_SLE is not None and tuple(pred_SLE.shape) != (S, L, E):
        raise ConfigError(f"forecast sets have shape {tuple(pred_SLE.shape)}; expected ({S}, {L}, {E}).")
    if uses is not None and len(uses) != S:
        raise ConfigError(f"{len(uses)} steps of request routing for {S} replayed steps; expected one per step.")
    if reuse is not None and (uses is None or len(reuse) != S):
        raise ConfigError(f"reuse forecasts for {len(reuse)} steps of {S} replayed ones; expected one per step, "
                          "with the steps' request routing.")
    n_pools = L if per_layer else 1
    bypass = bypasses(name)
    stage = STAGING if bypass else 0
    if bypass and per_layer:
        raise ConfigError(f"policy {name}: +bypass shares its staging slots across layers; expected pooled slots, "
                          "not per-layer pools.")
    cap = [(budget - stage) // n_pools + (1 if i < (budget - stage) % n_pools else 0) for i in range(n_pools)]
    if min(cap) < 1:
        raise ConfigError(f"budget of {budget} slots leaves pools with none; expected at least {n_pools + stage}"
                          + (f" ({stage} staging)." if stage else "."))
    pols = [make_policy(base, c, L, E) for c in cap]
    adm = PrefetchAdmission(L, E) if admit else None
    ready = np.zeros(L * E)
    pf = np.zeros(L * E, bool)  # prefetched, not used since
    link_free = clock = stall = demand_stall = ideal = 0.0
    hits = on_time = misses = pref = useful = unused = evs = passed = 0

    def pool(k: int) -> int:
        return k // E if per_layer else 0

    def no_pin(_k: int) -> bool:
        return False

    for s in range(S):
        rq = uses[s].requests if uses is not None else None
        fc = pred_SLE[s] if pred_SLE is not None else None
        ru = reuse[s] if reuse is not None else None
        for p in pols:
            p.begin_step(rq, fc, ru, None, None, uses[s].tokens if uses is not None else None)
        if adm is not None:
            adm.begin_step(rq, fc)
        for lay in range(L):
            a = s * L + lay
            t = clock
            tr = t + dense_s
            keys = req_key[req_off[a]:req_off[a + 1]].tolist()
            comp = comp_s[req_off[a]:req_off[a + 1]]
            held = [k in pols[pool(k)] for k in keys]
            for k, h in zip(keys, held, strict=True):
                if h:
                    pols[pool(k)].touch(k)
                    hits += 1
                    on_time += ready[k] <= tr
                    if pf[k]:
                        useful += 1
                        pf[k] = False
            dcur = max(link_free, tr)
            is_miss = np.zeros(len(keys), bool)
            out = []  # indices of the misses read through staging (+bypass)
            for i, (k, h) in enumerate(zip(keys, held, strict=True)):
                if h:
                    continue
                is_miss[i] = True
                misses += 1
                pol = pols[pool(k)]
                if len(pol) >= pol.capacity:
                    v = pol.victim(no_pin, None, k)
                    if v < 0:
                        raise RuntimeError(f"replay: policy {name} found no victim in a full pool")
                    if bypass and pol.keeps_out(k, v):
                        pol.passed(k)
                        out.append(i)
                        continue
                    pol.remove(v)
                    evs += 1
                    unused += bool(pf[v])
                    pf[v] = False
                pol.admit(k)
                ready[k] = dcur + xfer_s
                dcur = ready[k]
            r = ready[np.asarray(keys, np.int64)]
            order = np.argsort(r, kind="mergesort")
            if out:
                order = order[~np.isin(order, out)]
            e_end = tr
            for j in order.tolist():
                w = max(0.0, r[j] - e_end)
                if is_miss[j]:
                    demand_stall += w
                e_end = max(e_end, r[j]) + comp[j]
            free = [tr] * stage  # when each staging slot is free: its last expert computed
            for n, j in enumerate(out):  # after every slot holder, so each read lands after the layer's others
                got = max(dcur, free[n % stage]) + xfer_s
                dcur = got
                demand_stall += max(0.0, got - e_end)
                e_end = free[n % stage] = max(e_end, got) + comp[j]
            passed += len(out)
            link_free = max(link_free, dcur)
            stall += e_end - (tr + comp.sum())
            ideal += dense_s + comp.sum()
            if adm is not None and fc is not None and lay + 1 < L:
                # the next layer's router asks about dense_s after this layer ends (estimated from the queue)
                window = e_end + dense_s - link_free
                conf = adm.confidence(lay + 1)
                cur = set(keys)
                for e in np.flatnonzero(fc[lay + 1]).tolist():
                    k = (lay + 1) * E + e
                    pol = pols[pool(k)]
                    if k in pol:
                        continue
                    v = -1
                    if len(pol) >= pol.capacity:
                        v = pol.victim(lambda x, cur=cur, tr=tr: x in cur or ready[x] > tr, (2, -(lay + 1)), k)
                        if v < 0:
                            continue
                    if not admit_prefetch(conf, xfer_s, window, adm.reuse(v)):
                        continue
                    if v >= 0:
                        pol.remove(v)
                        evs += 1
                        unused += bool(pf[v])
                        pf[v] = False
                    pol.admit(k)
                    start = max(link_free, tr)
                    ready[k] = link_free = start + xfer_s
                    pf[k] = True
                    pref += 1
                    window -= xfer_s
            clock = e_end
        use = uses[s] if uses is not None else None
        for p in pols:
            p.end_step(use)
        if adm is not None:
            adm.end_step(use)
    unused += int(pf.sum())
    req = len(req_key)
    tok = max(num_tokens, 1)
    return {
        "policy": name, "budget": budget, "hit_ratio": on_time / max(req, 1), "covered_ratio": hits / max(req, 1),
        "demand_loads": misses, "bypassed": passed, "prefetches": pref, "useful_prefetches": useful, "evictions": evs,
        "bytes_moved": float((misses + pref) * expert_bytes), "prefetch_bytes_unused": float(unused * expert_bytes),
        "stall_s": stall, "demand_stall_s": demand_stall, "sim_s": clock, "us_per_token": 1e6 * clock / tok,
        "ideal_us_per_token": 1e6 * ideal / tok, "requests": req,
    }
