"""Cost-aware prediction: evict by forecast next use (zero extra bytes) and admit a prefetch only when it pays.

Two forecasts, both causal (they use only routing already observed and what the request horizon allows):

- **within the step**: the predictor's batch sets for the step's layers (e.g. conditional-token), given
  before the step (``begin_step(forecast_LE=...)``);
- **beyond the step** (ReuseForecast): each active request's exponentially decayed expert profile
  (decay per token of that request, smoothed towards the trace-wide share of request-steps using each key: a
  prefill counts once, as it is one access of each of its keys) gives, for each key, the
  probability q_k that the next step's batch uses it: q_k = 1 - prod_r (1 - pi_rk), pi_rk the share of
  request r's recent tokens routed to k. A key's expected next use, in accesses from layer l of this step,
  is then off_k + L·(1/q_k - 1) (geometric over steps; off_k = layers until the key's layer comes round).
  SelectedForecast keeps a short and a long memory of these profiles and uses, each step, the one whose
  forecasts so far had the lower log-loss on the steps observed.

- **the server's schedule** (optional, ``begin_step(upcoming=...)``): when the next steps batch other requests than
  this one (a server that runs one decode token of each request in flight in turn), the steps of one period of the
  schedule (the requests in flight, least recently served first, this step's last) each get
  p_ik = 1 - prod_{r in step i} (1 - pi_rk), and a key's expected whole steps before the step that uses it is
  E1_k = sum_{m=1..R} c_mk / (1 - c_Rk), c_mk = prod_{i<m} (1 - p_ik) (the schedule repeating); from a layer after
  the running one, this step comes first: E0_k = (1 - p_0k)·(1 + E1_k). The distance is then off_k + L·E_k, and
  with no schedule (every step the same requests, as a batching server) E1 = E0 = 1/q_k - 1 as above.

- **from the router inputs** (optional, ReuseMix): a reuse probe (predict/reuse_probe.py) reads each request's
  token at layer l of this step and gives d̂_rk, the tokens until request r next uses key k; 1/d̂_rk is a
  per-token hazard of reuse, mixed with the profile: pi'_rk = a/d̂_rk + (1 - a)·pi_rk, q_k as above, one q per
  layer (row l only once layer l has run). a is chosen each step among 0, 1/2 and 1 by the log-loss of the
  forecasts each made one step earlier for the step that followed, so a probe that does not transfer (text of
  another task) falls back to the profiles by itself.

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit  # a dependency, as in cache/kernel.py

from routecast.cache.policy import BasePolicy, Rank


@dataclass(frozen=True)
class StepUse:
    """One forward step's routing per request: requests (R,) int64 ids; off (R+1,) CSR into keys (n,) int64
    (layer·E + expert) and counts (n,) tokens of the request routed there; tokens (R,) its tokens in the step."""

    requests: np.ndarray
    off: np.ndarray
    keys: np.ndarray
    counts: np.ndarray
    tokens: np.ndarray

    @classmethod
    def from_routing(cls, request_T: np.ndarray, experts_TLK: np.ndarray, E: int) -> StepUse:
        """One step's StepUse from its tokens' request ids (T,) and routed experts (T, L, K) (-1 = dropped slot):
        what the runtime hands SlotCache.end_step after a forward step."""
        req = np.asarray(request_T, np.int64)
        ex = np.asarray(experts_TLK, np.int64)
        T, L, _ = ex.shape
        reqs, r_idx, tok = np.unique(req, return_inverse=True, return_counts=True)
        ok = ex >= 0
        keys = (np.arange(L, dtype=np.int64)[None, :, None] * E + ex)[ok]
        rows = np.broadcast_to(r_idx.reshape(T, 1, 1), ex.shape)[ok]
        u, cnt = np.unique(rows * (L * E) + keys, return_counts=True)
        off = np.searchsorted(u // (L * E), np.arange(len(reqs) + 1)).astype(np.int64)
        return cls(requests=reqs, off=off, keys=u % (L * E), counts=cnt.astype(np.float64), tokens=tok)


class ReuseForecast:
    """Per-request decayed expert profiles over K keys -> next-step use probability q (K,) (module docstring).

    decay: weight kept per token of the same request (0.9: about the last ten tokens dominate); prior: tokens'
    worth of trace-wide frequency mixed into each profile; forget_steps: a request unseen that long is dropped.
    """

    def __init__(self, K: int, decay: float = 0.9, prior: float = 1.0, forget_steps: int = 64) -> None:
        self.K, self.decay, self.prior, self.forget = K, decay, prior, forget_steps
        self.prof: dict[int, np.ndarray] = {}
        self.mass: dict[int, float] = {}
        self.seen: dict[int, int] = {}
        self.glob = np.zeros(K)
        self.glob_tokens = 0.0
        self.step = 0

    def next_step_probs(self, requests: np.ndarray | None) -> np.ndarray:
        """(K,) probability that a step batching `requests` uses each key (trace-wide share for unknown ones)."""
        if requests is None or len(requests) == 0:
            return np.clip(self._glob(), 0.0, 1.0)
        return -np.expm1(np.log1p(-np.minimum(self.request_probs(requests), 0.999)).sum(0))

    def _glob(self) -> np.ndarray:
        return self.glob / self.glob_tokens if self.glob_tokens > 0 else np.zeros(self.K)

    def request_probs(self, requests: np.ndarray) -> np.ndarray:
        """(R, K) pi_rk: each request's share of recent tokens routed to each key (the trace-wide share mixed in)."""
        gp = self._glob()
        out = np.empty((len(requests), self.K))
        for i, r in enumerate(np.asarray(requests).tolist()):
            c = self.prof.get(r)
            out[i] = gp if c is None else (c + self.prior * gp) / (self.mass[r] + self.prior)
        return out

    def observe(self, use: StepUse) -> None:
        """Fold one step's routing into the profiles (decay by the request's tokens in the step first)."""
        self.step += 1
        for i, r in enumerate(use.requests.tolist()):
            n = float(use.tokens[i])
            d = self.decay ** n
            c = self.prof.get(r)
            if c is None:
                c = self.prof[r] = np.zeros(self.K)
                self.mass[r] = 0.0
            c *= d
            ks, cs = use.keys[use.off[i]:use.off[i + 1]], use.counts[use.off[i]:use.off[i + 1]]
            c[ks] += cs
            self.mass[r] = self.mass[r] * d + n
            self.seen[r] = self.step
            self.glob[ks] += 1.0  # trace-wide: the share of request-steps that use each key (a prefill counts once)
            self.glob_tokens += 1.0
        for r in [r for r, s in self.seen.items() if self.step - s > self.forget]:
            del self.prof[r], self.mass[r], self.seen[r]


class SelectedForecast:
    """ReuseForecasts of several memories ((decay, prior) each) -> each step, the forecast of the one whose earlier
    forecasts had the lowest total log-loss on the steps observed (each key used or not in a step: a Bernoulli of
    probability q_k, clipped to [1e-4, 1 - 1e-4]); ties go to the first. Short memory (0.9: a request's last ten
    tokens) suits text whose experts drift within a request (builtin-fine: it is picked there on every held-out
    part); long memory (0.99, 16 tokens of trace-wide prior) suits stationary routing (the mixtral-8x7b preset)."""

    def __init__(self, K: int, memories: tuple[tuple[float, float], ...] = ((0.9, 1.0), (0.99, 16.0))) -> None:
        self.K = K
        self.subs = [ReuseForecast(K, decay=d, prior=p) for d, p in memories]
        self.loss = np.zeros(len(self.subs))
        self._q: list[np.ndarray] | None = None

    @property
    def chosen(self) -> int:
        return int(np.argmin(self.loss))

    def next_step_probs(self, requests: np.ndarray | None) -> np.ndarray:
        self._q = [f.next_step_probs(requests) for f in self.subs]
        return self._q[self.chosen]

    def request_probs(self, requests: np.ndarray) -> np.ndarray:
        """(R, K) per-request shares of the memory chosen now (ReuseForecast.request_probs)."""
        return self.subs[self.chosen].request_probs(requests)

    def observe(self, use: StepUse) -> None:
        if self._q is not None:  # score the forecasts made for this step, then learn from it
            used = np.zeros(self.K, bool)
            used[use.keys] = True
            for i, q in enumerate(self._q):
                q = np.clip(q, 1e-4, 1 - 1e-4)
                self.loss[i] -= np.log(np.where(used, q, 1.0 - q)).sum()
            self._q = None
        for f in self.subs:
            f.observe(use)


class ReuseMix:
    """Per-layer next-step use probabilities from a reuse probe's log d̂ mixed with request profiles (module
    docstring). start(pi (R, K), L, requests) opens a step; row(l, logd (R, K)) -> q (K,) of layer l for the mix
    chosen now (the runtime gives each row when its layer runs); probs(pi, logd (R, L, K), requests) -> q (L, K),
    every row at once (the replay). observe(StepUse) scores every mix's forecasts made a step earlier (the mean over
    the rows made) against the keys that step used, as SelectedForecast does: only the chosen mix is computed per
    row, the others when scored, once per step. A step that shares no request with the one before (a server running
    one token of each request in turn) scores each request's forecast at that request's next step, against its own
    keys.
    latest: request -> the hazards of its latest row (for its later turns; oldest dropped past KEEP requests)."""

    ALPHAS = (0.0, 0.5, 1.0)
    KEEP = 1024

    def __init__(self) -> None:
        self.loss = np.zeros(len(self.ALPHAS))
        self._a = self.ALPHAS[0]
        self._pi: np.ndarray | None = None
        self._hz: np.ndarray | None = None  # (L, R, K) hazards 1/d̂ of this step's rows (NaN: a row not made)
        self._req: np.ndarray | None = None  # (R,) this step's requests
        self._due: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None  # (pi, hazards, requests) a step earlier
        self.pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # request -> (pi (K,), rows made (M, K)) unscored
        self.latest: dict[int, np.ndarray] = {}

    @property
    def chosen(self) -> int:
        return int(np.argmin(self.loss))

    def start(self, pi_RK: np.ndarray, L: int, requests: np.ndarray | None = None) -> None:
        self._a = self.ALPHAS[self.chosen]  # fixed within a step: the losses change only in observe
        self._pi = np.asarray(pi_RK, np.float64)
        self._hz = np.full((L, *self._pi.shape), np.nan)
        self._req = None if requests is None else np.asarray(requests, np.int64).ravel()

    @staticmethod
    def _q(a, pi: np.ndarray, hz: np.ndarray) -> np.ndarray:
        """P(a step of these requests uses each key): 1 - prod_r (1 - pi'_rk), pi' = a·hz + (1 - a)·pi; axis -2 = r."""
        mix = np.minimum(a * hz + (1.0 - a) * pi, 0.999)
        return mix[..., 0, :] if mix.shape[-2] == 1 else -np.expm1(np.log1p(-mix).sum(-2))

    def row(self, layer: int, logd_RK: np.ndarray) -> np.ndarray:
        hz, q = mix_row(np.asarray(logd_RK), self._pi, self._a)  # one compiled call: it runs inside a layer
        self._hz[layer] = hz
        return q

    def probs(self, pi_RK: np.ndarray, logd_RLK: np.ndarray, requests: np.ndarray | None = None) -> np.ndarray:
        self.start(pi_RK, logd_RLK.shape[1], requests)
        return np.stack([self.row(lay, logd_RLK[:, lay]) for lay in range(logd_RLK.shape[1])])

    def _score(self, pi: np.ndarray, made: np.ndarray, keys: np.ndarray) -> None:
        """Add each mix's log-loss of the forecasts (pi (R, K), rows made (M, R, K)) against the keys used."""
        used = np.zeros(made.shape[-1], bool)
        used[keys] = True
        a = np.asarray(self.ALPHAS)[:, None, None, None]
        q = np.clip(self._q(a, pi, made).mean(1), 1e-4, 1 - 1e-4)  # (3, K)
        self.loss -= np.log(np.where(used, q, 1.0 - q)).sum(1)

    def observe(self, use: StepUse | None) -> None:
        if use is not None:
            due = self._due
            if due is not None and (due[2] is None or np.isin(due[2], use.requests).any()):
                made = due[1][~np.isnan(due[1][:, 0, 0])]  # (rows made, R, K): the same requests as the step before
                if len(made):
                    self._score(due[0], made, use.keys)
                for r in [] if due[2] is None else due[2].tolist():
                    self.pending.pop(r, None)
            else:  # none of the step before's requests (turns): each request's forecast at its own next step
                for i, r in enumerate(use.requests.tolist()):
                    got = self.pending.pop(r, None)
                    if got is not None:
                        self._score(got[0][None], got[1][:, None], use.keys[use.off[i]:use.off[i + 1]])
        self._due = None
        if self._hz is not None:
            self._due = (self._pi, self._hz, self._req)
            made = np.flatnonzero(~np.isnan(self._hz[:, 0, 0]))
            if len(made) and self._req is not None:
                for i, r in enumerate(self._req.tolist()):
                    for d in (self.pending, self.latest):
                        d.pop(r, None)  # re-inserted last: the oldest go first past KEEP
                    self.pending[r] = (self._pi[i], self._hz[made, i])
                    self.latest[r] = self._hz[made[-1], i]
                for d in (self.pending, self.latest):
                    while len(d) > self.KEEP:
                        del d[next(iter(d))]
        self._pi = self._hz = self._req = None


class ForecastEvictPolicy(BasePolicy):
    """(a) Belady on the forecast: evict the resident key with the farthest predicted next use (module docstring).

    L, E: the model's layers and experts (keys are layer·E + expert); forecaster: a ReuseForecast or
    SelectedForecast to share between pools (a SelectedForecast is made if None). Ties go to the least recently
    used key.
    """

    name = "fc-evict"

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
        self.qL: np.ndarray | None = None  # (L, K) with a reuse probe's forecast this step
        self._up: np.ndarray | None = None  # (R, K) use probabilities of the schedule's next steps (begin_step)
        self._mine: np.ndarray | None = None  # (R,) bool: that step batches this step's requests again
        self._req: np.ndarray | None = None  # the step's requests (reuse_row's rows follow them)
        self.layer = 0
        self.cur: set[int] = set()
        self.n = 0
        self.ver = 0  # bumped when the step or the running layer changes (victim's memo is valid within one)
        self._memo: tuple[int, int, list[int]] | None = None  # (layer, ver, order)
        victim_order(self.res, self.q, self.fset, self.last, 0, L, E)  # compiled (or loaded) now, not at a miss
        for dt in (np.float32, np.float64):  # the reuse probe's rows: float32 from the runtime, float64 in replays
            mix_row(np.zeros((1, 1), dt), np.zeros((1, 1)), 0.5)

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
                   reuse_RLK: np.ndarray | None = None, upcoming: Sequence[np.ndarray] | None = None) -> None:
        """reuse_RLK: a reuse probe's log d̂ for the step's `requests` (same order); row l is read only from
        layer l on. upcoming: the requests of each step of one period of the server's schedule after this one
        (this step's requests again where their turn comes back); None: every step batches `requests` (module
        docstring)."""
        self.q = self.fc.next_step_probs(requests)
        self._up, self._mine = None, None
        if upcoming is not None and len(upcoming) and requests is not None and len(requests):
            self._up, self._mine = schedule_probs(self._later_probs, upcoming, requests)
        self.fset = np.zeros(self.L * self.E, bool) if forecast_LE is None else np.asarray(forecast_LE, bool).ravel()
        self.qL = None
        self._req = None if requests is None else np.asarray(requests)
        if reuse_RLK is not None and requests is not None and len(requests):
            if reuse_RLK.shape != (len(requests), self.L, self.L * self.E):
                raise ValueError(f"fc-evict: reuse forecast has shape {reuse_RLK.shape}; expected "
                                 f"({len(requests)}, {self.L}, {self.L * self.E}), one row per request of the step.")
            self.qL = self.mix.probs(self.fc.request_probs(requests), reuse_RLK, requests)
        self.layer, self.cur = 0, set()
        self.ver += 1

    def _later_probs(self, requests: np.ndarray) -> np.ndarray:
        """(n, K) pi of requests at their next turns: the profiles, mixed as ReuseMix (the mix chosen now) with the
        hazards of the reuse probe's last row at the request's latest token where it had one."""
        pi = self.fc.request_probs(requests)
        a = ReuseMix.ALPHAS[self.mix.chosen]
        if a:
            for i, r in enumerate(np.asarray(requests).tolist()):
                hz = self.mix.latest.get(r)
                if hz is not None:
                    pi[i] = a * hz + (1.0 - a) * pi[i]
        return pi

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
            self.mix.start(self.fc.request_probs(self._req), self.L, self._req)
        self.qL[layer] = self.mix.row(layer, logd_RK)
        self.ver += 1  # the victim order's memo is stale

    def end_step(self, observed: StepUse | None = None) -> None:
        if observed is not None and self.owns_fc:
            self.fc.observe(observed)
        self.mix.observe(observed if self.qL is not None else None)

    def q_at(self, layer: int) -> np.ndarray:
        """(K,) the next-use probability whose 1/q - 1 is a key's expected whole steps to its next use from layer
        `layer` (module docstring): this step's q (with the reuse probe's row when given), through the schedule's
        later steps when begin_step had one."""
        q = self.q if self.qL is None else self.qL[layer]
        if self._up is None:
            return q
        p_up = np.where(self._mine[:, None], q[None], self._up)  # this step's requests again: their sharper row
        q0, q1 = schedule_q(q, p_up)
        return np.where(np.arange(self.L * self.E) // self.E > layer, q0, q1)

    def next_use(self, keys: np.ndarray, layer: int) -> np.ndarray:
        """(n,) predicted next use of `keys`, in accesses from layer `layer` of this step."""
        lk = keys // self.E
        off = np.where(lk > layer, lk - layer, self.L - layer + lk).astype(np.float64)
        q = self.q_at(layer)
        far = off + self.L * (1.0 / np.maximum(q[keys], 1e-9) - 1.0)
        return np.where(self.fset[keys] & (lk > layer), off, far)

    def victim(self, pinned: Callable[[int], bool], below: Rank | None = None, incoming: int = -1) -> int:
        layer = incoming // self.E if incoming >= 0 else self.layer
        # Farthest first, then least recent. Within one step and running layer (one `ver`) a key's distance is fixed
        # and only keys used in it (self.cur, never victims) change recency, so the order built at the first miss
        # holds for every later one: it is memoised and walked, skipping keys gone since.
        memo = self._memo
        if memo is None or memo[0] != layer or memo[1] != self.ver:
            memo = self._memo = self._order(layer)
        k = self._walk(memo[2], pinned)
        if k >= 0:
            return k
        # a pool smaller than the access: a computed key of it goes (the driver pins the others); the order is built
        # afresh, as keys admitted since the memo (all in self.cur) are candidates now
        return self._first_free(self._order(layer)[2], pinned, False)

    def _order(self, layer: int) -> tuple[int, int, list[int]]:
        """Resident keys farthest-then-least-recent from `layer` (next_use's distances; ties by key) -> memo.
        One compiled call (victim_order): as numpy it was about twenty small array operations, each costing the
        runtime's compute thread several µs cold inside a layer (benchmarks/offload.py)."""
        q = self.q_at(layer)
        return layer, self.ver, victim_order(self.res, q, self.fset, self.last, layer, self.L, self.E).tolist()

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



def round_robin(request_T: np.ndarray) -> list[list[np.ndarray]]:
    """The server's schedule as it stands at each decode token t of `request_T` (T,) (one token per step): the
    requests in flight (served before or now, not yet finished: their last token is not before t), the others
    least recently served first and t's own request last, each one step of one request -> per t, that period of
    steps (fc-evict's begin_step(upcoming=...)). Causal: it reads who has been served and who has finished, never
    a later token's routing. One request at a time (request order) gives [[its own id]] at every t."""
    req = np.asarray(request_T, np.int64)
    last = {int(r): int(t) for t, r in enumerate(req.tolist())}
    served: dict[int, int] = {}
    out = []
    for t, r in enumerate(req.tolist()):
        for q in [q for q in served if last[q] < t]:
            del served[q]
        served.pop(r, None)
        out.append([np.array([q], np.int64) for q in sorted(served, key=served.get)] + [np.array([r], np.int64)])
        served[r] = t
    return out


def schedule_probs(request_probs: Callable[[np.ndarray], np.ndarray], upcoming: Sequence[np.ndarray],
                   requests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The schedule's next steps -> p (R, K): each step's probability of using each key, 1 - prod over its requests
    of (1 - pi_rk) (request_probs: (n,) ids -> (n, K) pi); mine (R,) bool: the step batches exactly `requests`."""
    steps = [np.asarray(u, np.int64).ravel() for u in upcoming]
    n = np.array([len(u) for u in steps])
    flat = np.concatenate(steps)
    if not len(flat):
        raise ValueError("fc-evict: every step of the schedule batches no request; expected at least one each.")
    if (n == 0).any():
        raise ValueError(f"fc-evict: step {int(np.argmin(n))} of the schedule batches no request; expected one or more.")
    logs = np.log1p(-np.minimum(request_probs(flat), 0.999))
    p = -np.expm1(np.add.reduceat(logs, np.r_[0, np.cumsum(n)[:-1]], axis=0))
    me = np.sort(np.asarray(requests, np.int64).ravel())
    mine = np.array([len(u) == len(me) and bool((np.sort(u) == me).all()) for u in steps])
    return p, mine


def schedule_q(q_now: np.ndarray, p_up: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q0, q1 (K,) whose 1/q - 1 are the expected whole steps to a key's next use (module docstring): q1 from the next
    step on (p_up (R, K): one period of the schedule, repeating), q0 from this step on (q_now (K,) first)."""
    c = np.cumprod(1.0 - p_up, axis=0)  # c_m, m = 1..R
    e1 = c.sum(0) / np.maximum(1.0 - c[-1], 1e-12)
    e0 = (1.0 - q_now) * (1.0 + e1)
    return 1.0 / (1.0 + e0), 1.0 / (1.0 + e1)


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
                 E: int) -> np.ndarray:
    """Resident keys (res bool (K,)) ordered by ForecastEvictPolicy.next_use from `layer` descending, then `last`
    ascending, then key ascending: np.lexsort((last, -d)) of flatnonzero(res), in one pass and two stable sorts."""
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
    by_last = np.argsort(lst, kind="mergesort")
    return keys[by_last[np.argsort(-d[by_last], kind="mergesort")]]


@njit(cache=True, nogil=True)
def mix_row(logd_RK: np.ndarray, pi_RK: np.ndarray, a: float) -> tuple[np.ndarray, np.ndarray]:
    """ReuseMix.row's arithmetic in one pass: hazards hz = exp(-log d̂) (R, K) float64 and q (K,) = ReuseMix._q(a, pi,
    hz): pi' = min(a·hz + (1 - a)·pi, 0.999), q = pi' for one request, else 1 - prod_r (1 - pi'_r)."""
    R, K = logd_RK.shape
    hz = np.empty((R, K))
    q = np.empty(K)
    for k in range(K):
        s = 0.0
        for r in range(R):
            h = np.exp(-np.float64(logd_RK[r, k]))
            hz[r, k] = h
            m = min(a * h + (1.0 - a) * pi_RK[r, k], 0.999)
            if R == 1:
                q[k] = m
            else:
                s += np.log1p(-m)
        if R > 1:
            q[k] = -np.expm1(s)
    return hz, q
