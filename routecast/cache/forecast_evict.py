"""Cost-aware prediction: evict by forecast next use (zero extra bytes) and admit a prefetch only when it pays.

The forecasts (within the step, beyond it from request profiles, through a server's schedule, from the router
inputs) are cache/reuse.py's; a key's predicted next use, in accesses from layer l of this step, is
off_k + L·(1/q_k - 1), off_k the layers until the key's layer comes round and q_k from those forecasts.

ForecastEvictPolicy (a, "fc-evict") evicts the resident key whose predicted next use is farthest: keys
forecast for a later layer of this step are needed at that layer (nearest kept); every other key at its
expected next use above. Keys of the access being served go last (only when the pool is smaller than the
access, as in the kernel). No prefetch: the bytes
moved are the demand loads only.

PrefetchAdmission (b, "+admit"): a forecast key k of the next layer is fetched ahead only when

    p_k · min(x, W)  >  (1 - p_k) · (max(0, x - W) + r_v · x)

x: seconds to move one expert; W: idle link seconds before the next layer's router asks (its estimated
start minus the time the link frees from the transfers already queued); p_k: the forecast's confidence
(the running precision of that layer's forecast sets, prior 0.5); r_v: the probability that the victim the
prefetch evicts is needed in the next step (q_v above; 0 for a free slot). Left: the stall a right
forecast removes (only the part of the transfer that fits in idle link time is saved; the rest would
have queued anyway). Right: the link time a wrong forecast wastes beyond the idle window (it delays the
next demand loads) plus the demand load the victim then costs. On a link busy with demand loads (W = 0)
nothing is prefetched: that is the measured regime of the built-in traces on h100-sxm and PCIe profiles.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
from numba import njit  # a dependency, as in cache/kernel.py

from routecast.cache.policy import BasePolicy, Rank
from routecast.cache.reuse import (
    NextTokenMix,
    ReuseForecast,
    ReuseMix,
    SelectedForecast,
    StepUse,
    check_next_use,
    mix_row,
    schedule_probs,
    schedule_q,
    schedule_q_at,
    step_probs,
    warm_kernels,
)


class ForecastEvictPolicy(BasePolicy):
    """(a) Belady on the forecast: evict the resident key with the farthest predicted next use (module docstring).

    L, E: the model's layers and experts (keys are layer·E + expert); forecaster: a ReuseForecast or
    SelectedForecast to share between pools (a SelectedForecast is made if None). Ties go to the least recently
    used key.
    """

    name = "fc-evict"
    PREFIX = 48  # victim(): keys of the order built at a miss (the whole order only when these run out)

    def __init__(self, capacity: int, L: int, E: int, forecaster: ReuseForecast | SelectedForecast | None = None) -> None:
        super().__init__(capacity)
        self.L, self.E = L, E
        self.fc = forecaster or SelectedForecast(L * E)
        self.owns_fc = forecaster is None
        self.res = np.zeros(L * E, bool)
        self.last = np.zeros(L * E)
        self.tick = 0.0
        self.q = np.zeros(L * E)
        self.fset = np.zeros(L * E, bool)
        self.mix = ReuseMix()
        self.tok = NextTokenMix()
        self.tok_now = NextTokenMix()  # the running requests' own input-token forecast of this step
        self.q_this = self.q  # this step's use probabilities (with tok_now's mix when the step's tokens are known)
        self._pi_now: np.ndarray | None = None  # (n, K) this step's requests' pi for the step (its tokens, that mix)
        self._fold_n = 0  # tokens of this step's one request when it has several (a prefill): routed() folds them
        self.qn = self.q  # next-step probabilities, the layers this step routed so far folded in (routed)
        self._next_use: Mapping[int, np.ndarray] | None = None  # forecasts from known input tokens (begin_step)
        self.qL: np.ndarray | None = None  # (L, K) with a reuse probe's forecast this step
        self._up: np.ndarray | None = None  # (R, K) use probabilities of the schedule's next steps (begin_step)
        self._mine: np.ndarray | None = None  # (R,) bool: that step batches this step's requests again
        self._q01: tuple[np.ndarray, np.ndarray] | None = None  # q_at's q0, q1 of this step without the probe's rows
        self._layer_of = np.arange(L * E) // E  # each key's layer
        self._req: np.ndarray | None = None  # the step's requests (reuse_row's rows follow them)
        self.layer = 0
        self.cur: set[int] = set()
        self.n = 0
        self.ver = 0  # bumped when the step or the running layer changes (victim's memo is valid within one)
        self._memo: tuple[int, int, list[int], bool] | None = None  # (layer, ver, order's head, complete)
        victim_order(self.res, self.q, self.fset, self.last, 0, L, E, 0)  # compiled (or loaded) now, not at a miss
        for dt in (np.float32, np.float64):  # the reuse probe's rows: float32 from the runtime, float64 in replays
            mix_row(np.zeros((1, 1), dt), np.zeros((1, 1)), 0.5)
        schedule_q_at(np.zeros(1), np.zeros((1, 1)), np.zeros(1, bool), self._layer_of[:1], 0)
        warm_kernels()  # the profiles' compiled steps, compiled (or loaded) now, not in the first step

    def __len__(self) -> int:
        return self.n

    def __contains__(self, key: int) -> bool:
        return bool(self.res[key])

    def _use(self, key: int) -> None:
        lay = key // self.E
        if lay != self.layer:
            self.layer, self.cur = lay, set()
            self.ver += 1
        self.cur.add(key)
        self.last[key] = self.tick
        self.tick += 1.0

    def touch(self, key: int) -> None:
        self._use(key)

    def admit(self, key: int) -> None:
        self.res[key] = True
        self.n += 1
        self._use(key)

    def remove(self, key: int) -> None:
        if self.res[key]:
            self.res[key] = False
            self.n -= 1

    def begin_step(self, requests: np.ndarray | None = None, forecast_LE: np.ndarray | None = None,
                   reuse_RLK: np.ndarray | None = None, upcoming: Sequence[np.ndarray] | None = None,
                   next_use: Mapping[int, np.ndarray] | None = None, tokens: np.ndarray | None = None) -> None:
        """reuse_RLK: a reuse probe's log d̂ for the step's `requests` (same order); row l is read only from
        layer l on. upcoming: the requests of each step of one period of the server's schedule after this one
        (this step's requests again where their turn comes back); None: every step batches `requests` (module
        docstring). next_use: request id -> (K,) the forecast of its next step from its known input token
        (cache/reuse.py known_next_use, NextTokenMix): a waiting request's next turn (read with `upcoming`), and for a
        request of this step, this step (its input tokens; mixed into this step's q by tok_now, never into its
        later turns, whose tokens are not sampled yet). tokens: (R,) each request's tokens in this step (known as it
        starts; None = one each): a request of n tokens uses a key this step with 1 - (1 - pi)^n, and a step of one
        request with several (a prefill) folds each layer's routing into the next step's forecast as the layer is
        routed (routed())."""
        self.q = self.fc.next_step_probs(requests)
        self._up, self._mine, self._q01 = None, None, None
        self._req = None if requests is None else np.asarray(requests)
        self.q_this, self._pi_now, self.qn, self._fold_n = self.q, None, self.q, 0
        n = None if tokens is None or self._req is None else np.asarray(tokens, np.float64)
        if n is not None and n.shape != self._req.shape:
            raise ValueError(f"fc-evict: tokens has shape {n.shape}; expected {self._req.shape}, one count per request "
                             "of the step.")
        many = n is not None and bool((n > 1).any())
        own = {}
        if next_use:
            check_next_use(next_use, self.L * self.E)
            own = {} if self._req is None else {r: next_use[r] for r in self._req.tolist() if r in next_use}
        if own or many:  # this step's tokens: the profiles per token raised to the step, the input tokens' forecast mixed in
            pi = self.fc.request_probs(self._req)
            if many:
                pi = -np.expm1(np.maximum(n, 1.0)[:, None] * np.log1p(-np.minimum(pi, 0.999)))
            self._pi_now = self.tok_now.mix(pi, self._req, own, set()) if own else pi
            self.q_this = step_probs(self._pi_now)
        if many and len(n) == 1 and hasattr(self.fc, "folded"):
            self._fold_n, self.qn = int(n[0]), self.q.copy()
        self._next_use = next_use or None
        if upcoming is not None and len(upcoming) and requests is not None and len(requests):
            self._up, self._mine = schedule_probs(self._later_probs, upcoming, requests)
        self.fset = np.zeros(self.L * self.E, bool) if forecast_LE is None else np.array(forecast_LE, bool).ravel()
        self.qL = None
        if reuse_RLK is not None and requests is not None and len(requests):
            if reuse_RLK.shape != (len(requests), self.L, self.L * self.E):
                raise ValueError(f"fc-evict: reuse forecast has shape {reuse_RLK.shape}; expected "
                                 f"({len(requests)}, {self.L}, {self.L * self.E}), one row per request of the step.")
            self.qL = self.mix.probs(self._pi(), reuse_RLK, requests)
        self.layer, self.cur = 0, set()
        self.ver += 1

    def _pi(self) -> np.ndarray:
        """(n, K) this step's requests' pi: their profiles, with their own input tokens' forecast mixed in when given."""
        return self.fc.request_probs(self._req) if self._pi_now is None else self._pi_now

    def _later_probs(self, requests: np.ndarray) -> np.ndarray:
        """(n, K) pi of requests at their next turns: the profiles, with each request's latest probe hazards mixed in
        (ReuseMix.later) and, for a waiting request, its next input token's forecast (NextTokenMix)."""
        pi = self.mix.later(self.fc.request_probs(requests), requests)
        if self._next_use is None:
            return pi
        running = set() if self._req is None else set(np.asarray(self._req).tolist())
        return self.tok.mix(pi, requests, self._next_use, running)

    def reuse_row(self, layer: int, logd_RK: np.ndarray) -> None:
        """The reuse probe's row of `layer` for the step's requests (begin_step's order), given once the layer's router
        input exists (the runtime, inside the MoE block); rows not given yet keep the profiles' forecast."""
        if self._req is None or not len(self._req):
            return
        if logd_RK.shape != (len(self._req), self.L * self.E):
            raise ValueError(f"fc-evict: reuse row has shape {logd_RK.shape}; expected ({len(self._req)}, "
                             f"{self.L * self.E}), one row per request of the step.")
        if self.qL is None:
            self.qL = np.repeat(self.q[None], self.L, 0)
            self.mix.start(self._pi(), self.L, self._req)
        self.qL[layer] = self.mix.row(layer, logd_RK)
        self.ver += 1  # the victim order's memo is stale

    def mark_predicted(self, keys, layer_of) -> None:
        """A prefetch forecast `keys` for a later layer of this step: each is needed at its layer (nearest kept), as
        the step's forecast sets of begin_step; without this a reserved prefetch was the next one's victim."""
        if keys:
            self.fset[list(keys)] = True
            self.ver += 1

    def mark_spent(self, keys, used: set[int]) -> list[int]:
        """The layer's routing arrived: its forecast keys are spent (their next use is the profiles' again)."""
        if keys:
            self.fset[list(keys)] = False
            self.ver += 1
        return []

    def routed(self, layer: int, keys: np.ndarray, counts: np.ndarray) -> None:
        """Layer `layer` of a step of one request with several tokens (a prefill) routed `counts` tokens to `keys`:
        the next step's forecast of that layer's keys becomes the request's profile with them folded in (what
        end_step will fold), read by q_at for the keys of the layers already run (their next use is a later step;
        without a reuse probe's rows or a schedule, which forecast those keys their own way). A prefill's routing
        covers most of each layer; the profile from before it (none, for a new request) is the trace-wide share. Not
        for one-token steps: there the fold changes one token's worth of a decayed profile, and in the builtin-fine
        replay it evicted worse at 25% (docs/stages/cache.md)."""
        if not self._fold_n or self._up is not None:
            return
        lo = layer * self.E
        self.qn[lo:lo + self.E] = self.fc.folded(int(self._req[0]), self._fold_n, lo, self.E, keys, counts)
        self.ver += 1  # the victim order's memo is stale

    def end_step(self, observed: StepUse | None = None) -> None:
        if observed is not None and self.owns_fc:
            self.fc.observe(observed)
        if observed is not None and self.tok.pending:
            self.tok.observe(observed)
        if observed is not None and self.tok_now.pending:
            self.tok_now.observe(observed)
        self.mix.observe(observed if self.qL is not None else None)

    def q_at(self, layer: int) -> np.ndarray:
        """(K,) the next-use probability whose 1/q - 1 is a key's expected whole steps to its next use from layer
        `layer` (module docstring): this step's q (with the reuse probe's row when given), through the schedule's
        later steps when begin_step had one."""
        if self._up is None:
            if self.qL is not None:
                return self.qL[layer]
            q = self.qn  # self.q with the layers routed so far folded in (a prefill: routed())
            return q if self.q_this is self.q else np.where(self._layer_of > layer, self.q_this, q)
        if self.qL is not None:  # this step's requests again in the schedule: their sharper row, layer by layer
            return schedule_q_at(self.qL[layer], self._up, self._mine, self._layer_of, layer)
        if self._q01 is None:  # without the probe's rows q0, q1 hold for the whole step: computed once
            self._q01 = schedule_q(self.q_this, np.where(self._mine[:, None], self.q[None], self._up))
        return np.where(self._layer_of > layer, *self._q01)

    def next_use(self, keys: np.ndarray, layer: int) -> np.ndarray:
        """(n,) predicted next use of `keys`, in accesses from layer `layer` of this step."""
        lk = keys // self.E
        off = np.where(lk > layer, lk - layer, self.L - layer + lk).astype(np.float64)
        q = self.q_at(layer)
        far = off + self.L * (1.0 / np.maximum(q[keys], 1e-9) - 1.0)
        return np.where(self.fset[keys] & (lk > layer), off, far)

    def keeps_out(self, incoming: int, victim: int) -> bool:
        """Belady's bypass on the forecast: keep `victim` when the missing key's predicted next use is farther."""
        d = self.next_use(np.array([incoming, victim], np.int64), incoming // self.E)
        return bool(d[0] > d[1])

    def passed(self, key: int) -> None:
        self._use(key)

    def victim(self, pinned: Callable[[int], bool], below: Rank | None = None, incoming: int = -1) -> int:
        # distances from the running layer: a demand miss's own; a prefetch (`below` given) is reserved while the layer
        # before its own runs (depth 1: its own layer counts as ahead, with the other forecast keys of it)
        layer = self.layer if incoming < 0 else incoming // self.E - (below is not None)
        # Farthest first, then least recent. Within one step and running layer (one `ver`) a key's distance is fixed
        # and only keys used in it (self.cur, never victims) change recency, so the order built at the first miss
        # holds for every later one: it is memoised and walked, skipping keys gone since. Only its head is built
        # (PREFIX keys and the ties at its end: an exact prefix of the whole order); the whole order when the head
        # runs out.
        memo = self._memo
        if memo is None or memo[0] != layer or memo[1] != self.ver:
            memo = self._memo = self._order(layer, self.PREFIX)
        k = self._walk(memo[2], pinned)
        if k < 0 and not memo[3]:
            memo = self._memo = self._order(layer, 0)
            k = self._walk(memo[2], pinned)
        if below is not None:  # a prefetch evicts no key forecast for its own layer or a nearer one (PLEC's rule;
            # such keys come last in the order) and never a key of the running layer
            return -1 if k < 0 or (self.fset[k] and layer < k // self.E <= incoming // self.E) else k
        if k >= 0:
            return k
        # a pool smaller than the access: a computed key of it goes (the driver pins the others); the order is built
        # afresh, as keys admitted since the memo (all in self.cur) are candidates now
        return self._first_free(self._order(layer, 0)[2], pinned, False)

    def _order(self, layer: int, head: int) -> tuple[int, int, list[int], bool]:
        """Resident keys farthest-then-least-recent from `layer` (next_use's distances; ties by key), the first `head`
        of them and every key tied with the last (0: all) -> memo (layer, ver, keys, whether that is all of them).
        One compiled call (victim_order): as numpy it was about twenty small array operations, each costing the
        runtime's compute thread several µs cold inside a layer (benchmarks/offload.py)."""
        q = self.q_at(layer)
        order = victim_order(self.res, q, self.fset, self.last, layer, self.L, self.E, head)
        return layer, self.ver, order.tolist(), head <= 0 or len(order) >= self.n

    def _walk(self, order: list[int], pinned: Callable[[int], bool]) -> int:
        res, cur = self.res, self.cur
        for k in order:
            if res[k] and k not in cur and not pinned(k):
                return k
        return -1

    def _first_free(self, order: list[int], pinned: Callable[[int], bool], skip_current: bool) -> int:
        for k in order:
            if not (skip_current and k in self.cur) and not pinned(k):
                return k
        return -1



def admit_prefetch(p_use: float, xfer_s: float, window_s: float, victim_reuse: float) -> bool:
    """The admission rule of the module docstring: p·min(x, W) > (1 - p)·(max(0, x - W) + r_v·x)."""
    w = max(window_s, 0.0)
    return p_use * min(xfer_s, w) > (1.0 - p_use) * (max(0.0, xfer_s - w) + victim_reuse * xfer_s)


class PrefetchAdmission:
    """(b) The state the admission rule needs: per-layer forecast precision (p) and the victims' reuse (r_v).

    begin_step(requests, forecast_LE) before a step, end_step(use) after it (use: StepUse); confidence(layer)
    and reuse(key) feed admit_prefetch.
    """

    def __init__(self, L: int, E: int, forecaster: ReuseForecast | None = None) -> None:
        self.L, self.E = L, E
        self.fc = forecaster or ReuseForecast(L * E)
        self.owns_fc = forecaster is None
        self.right = np.ones(L)  # prior: one right and one wrong forecast key per layer (precision 0.5)
        self.told = np.full(L, 2.0)
        self.q = np.zeros(L * E)
        self.fset = np.zeros((L, E), bool)

    def begin_step(self, requests: np.ndarray | None, forecast_LE: np.ndarray | None) -> None:
        self.q = self.fc.next_step_probs(requests)
        self.fset = np.zeros((self.L, self.E), bool) if forecast_LE is None else np.asarray(forecast_LE, bool)

    def end_step(self, use: StepUse | None) -> None:
        if use is None:
            return
        used = np.zeros(self.L * self.E, bool)
        used[use.keys] = True
        self.right += (self.fset.ravel() & used).reshape(self.L, self.E).sum(1)
        self.told += self.fset.sum(1)
        if self.owns_fc:
            self.fc.observe(use)

    def confidence(self, layer: int) -> float:
        return float(self.right[layer] / self.told[layer])

    def reuse(self, key: int) -> float:
        return 0.0 if key < 0 else float(self.q[key])


@njit(cache=True, nogil=True)
def victim_order(res: np.ndarray, q: np.ndarray, fset: np.ndarray, last: np.ndarray, layer: int, L: int,
                 E: int, head: int) -> np.ndarray:
    """Resident keys (res bool (K,)) ordered by ForecastEvictPolicy.next_use from `layer` descending, then `last`
    ascending, then key ascending: np.lexsort((last, -d)) of flatnonzero(res). head > 0: only the first `head` of
    that order and every key whose distance ties the last of them (an exact prefix: the rest all come later), found
    by one partition, so a miss costs O(resident keys), not a sort of them all; head <= 0: the whole order."""
    n = 0
    for k in range(res.size):
        if res[k]:
            n += 1
    keys = np.empty(n, np.int64)
    d = np.empty(n)
    lst = np.empty(n)
    j = 0
    for k in range(res.size):
        if res[k]:
            lk = k // E
            off = float(lk - layer) if lk > layer else float(L - layer + lk)
            d[j] = off if (fset[k] and lk > layer) else off + L * (1.0 / max(q[k], 1e-9) - 1.0)
            keys[j] = k
            lst[j] = last[k]
            j += 1
    if 0 < head < n:
        cut = -np.partition(-d, head - 1)[head - 1]  # the head-th farthest distance: keep every key at least as far
        sel = np.flatnonzero(d >= cut)
        keys, d, lst = keys[sel], d[sel], lst[sel]
    by_last = np.argsort(lst, kind="mergesort")
    return keys[by_last[np.argsort(-d[by_last], kind="mergesort")]]
