"""The forecasts of a key's next use that fc-evict (cache/forecast_evict.py) and +admit read.

Its forecasts, all causal (they use only routing already observed and what the request horizon allows):

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
  with no schedule (every step the same requests, as a batching server) E1 = E0 = 1/q_k - 1 as above. A request's
  pi in a later step of the schedule is mixed with the reuse probe's hazards of its latest token (ReuseMix.latest),
  as below, when the probe is read.

- **from a waiting request's next token** (optional, NextTokenMix; ``begin_step(next_use=...)``): under a schedule,
  a request waiting for its turn already has its next input token (sampled when its last step ended); a token table
  (predict/frequency.py's conditional-token, fitted on other text) gives nu_rk, the probability that a step of that
  token uses key k, and the request's pi_rk at its next turn becomes a·nu_rk + (1 - a)·pi_rk, a chosen among 0, 1/4,
  1/2 and 3/4 by the order each mix put the keys in on the waiting requests' steps scored so far: the largest sum of
  AUCs (the chance that a key the step used ranks above one it did not; eviction reads only that order), ties to the
  lower log-loss (0 to start: no token forecast until one is seen to pay). Chosen by log-loss alone it was 3/4, the
  better calibrated mix, and evicted worse than 1/2 (deepseek-v2-lite geometry replay, step order, 50%: 1.50x LRU
  over 32 tokens, 1.55x over 352, against 1.51x and 1.58x by AUC; docs/stages/cache.md has the command). Never 1: a
  token table knows nothing of the request's context, and with 1 allowed the first steps' log-loss chose it and the
  evictions got worse (Mixtral serving-order replay, 80 tokens: 1.48x LRU at 50% against 1.61x). The running
  request's own next token is not known yet: it never gets one. Its input token of this step is known as the step
  starts: with ``next_use`` holding it (known_next_use), its pi for this step (the keys of the layers after the
  running one) is mixed with that token's nu the same way, a second NextTokenMix scoring it on the step itself; its
  later turns keep the profile.

- **from the router inputs** (optional, ReuseMix): a reuse probe (predict/reuse_probe.py) reads each request's
  token at layer l of this step and gives d̂_rk, the tokens until request r next uses key k; 1/d̂_rk is a
  per-token hazard of reuse, mixed with the profile: pi'_rk = a/d̂_rk + (1 - a)·pi_rk, q_k as above, one q per
  layer (row l only once layer l has run). a is chosen each step among 0, 1/2 and 1 by the log-loss of the
  forecasts each made one step earlier for the step that followed, so a probe that does not transfer (text of
  another task) falls back to the profiles by itself.

round_robin gives the schedule of a server that serves one token of each request in flight in turn; schedule_probs and
schedule_q turn it into the distances above (schedule_q_at: the same, compiled, for one layer); mix_row is ReuseMix.row's arithmetic compiled (it runs inside a layer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit  # a dependency, as in cache/kernel.py


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


def step_probs(pi_nK: np.ndarray) -> np.ndarray:
    """(K,) probability that a step batching n requests uses each key: 1 - prod_r (1 - pi_rk), pi capped at 0.999.
    One compiled call (these run once per step on the runtime's compute thread, where each small numpy call costs
    several µs cold)."""
    return _step_probs(np.ascontiguousarray(pi_nK, np.float64))


@njit(cache=True, nogil=True)
def _step_probs(pi: np.ndarray) -> np.ndarray:
    n, K = pi.shape
    out = np.empty(K)
    for k in range(K):
        s = 0.0
        for r in range(n):
            s += np.log1p(-min(pi[r, k], 0.999))
        out[k] = -np.expm1(s)
    return out


def log_loss(q: np.ndarray, used: np.ndarray) -> np.ndarray | float:
    """Bernoulli log-loss of use probabilities q (..., K) against the keys used (K,) bool, summed over K (one value per
    leading row): each forecaster's score (SelectedForecast, ReuseMix, NextTokenMix); q clipped to [1e-4, 1 - 1e-4]."""
    q = np.clip(q, 1e-4, 1 - 1e-4)
    return -np.log(np.where(used, q, 1.0 - q)).sum(-1)


def auc(q: np.ndarray, used: np.ndarray) -> np.ndarray:
    """The AUC of use probabilities q (M, K) against the keys used (K,) bool -> (M,): per row the chance that a used key
    ranks above an unused one, ties counting half; 0 where no key or every key was used (no order to score)."""
    n1 = int(used.sum())
    n0 = used.size - n1
    out = np.zeros(q.shape[0])
    if not n1 or not n0:
        return out
    for m in range(q.shape[0]):
        u = np.sort(q[m, ~used])
        v = q[m, used]
        lo, hi = np.searchsorted(u, v, "left"), np.searchsorted(u, v, "right")
        out[m] = (lo.sum() + 0.5 * (hi - lo).sum()) / (n1 * n0)
    return out


@njit(cache=True, nogil=True)
def _log_loss_keys(q: np.ndarray, keys: np.ndarray) -> float:
    """log_loss of one q (K,) against the keys used, given as indices (repeats allowed): one compiled pass."""
    used = np.zeros(q.size, np.bool_)
    for k in keys:
        used[k] = True
    s = 0.0
    for k in range(q.size):
        x = min(max(q[k], 1e-4), 1 - 1e-4)
        s -= np.log(x if used[k] else 1.0 - x)
    return s


@njit(cache=True, nogil=True)
def _profile_row(c: np.ndarray, mass: float, prior: float, glob: np.ndarray, gtok: float, out: np.ndarray,
                 as_step: bool = False) -> None:
    """out = (c + prior·g) / (mass + prior), g = glob / gtok (0 before any step): one request's pi (ReuseForecast);
    as_step: that request's step_probs instead (the same arithmetic as step_probs of one row)."""
    for k in range(out.size):
        g = glob[k] / gtok if gtok > 0 else 0.0
        pi = (c[k] + prior * g) / (mass + prior)
        out[k] = -np.expm1(np.log1p(-min(pi, 0.999))) if as_step else pi


def warm_kernels() -> None:
    """Compile (or load) the per-step kernels of the profiles before a run times them."""
    z = np.zeros(2)
    _step_probs(np.zeros((1, 2)))
    _log_loss_keys(z, np.zeros(1, np.int64))
    _profile_row(z, 0.0, 1.0, z, 0.0, np.zeros(2))
    _profile_row(z, 0.0, 1.0, z, 0.0, np.zeros(2), True)
    _fold(np.zeros(2), 0.9, np.zeros(1, np.int64), np.zeros(1), np.zeros(2))


@njit(cache=True, nogil=True)
def _fold(c: np.ndarray, d: float, keys: np.ndarray, counts: np.ndarray, glob: np.ndarray) -> None:
    """One request's step folded into its profile c (decayed by d first) and the trace-wide key counts."""
    for k in range(c.size):
        c[k] *= d
    for i in range(keys.size):
        c[keys[i]] += counts[i]
        glob[keys[i]] += 1.0


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
        self._none = np.zeros(K)  # the profile of a request not seen yet

    def next_step_probs(self, requests: np.ndarray | None) -> np.ndarray:
        """(K,) probability that a step batching `requests` uses each key (trace-wide share for unknown ones)."""
        if requests is None or len(requests) == 0:
            return np.clip(self._glob(), 0.0, 1.0)
        if len(requests) == 1:  # one user at a time: pi and the step's q in one compiled pass
            q = np.empty(self.K)
            _profile_row(*self._profile(int(requests[0])), self.glob, self.glob_tokens, q, True)
            return q
        return step_probs(self.request_probs(requests))

    def _profile(self, r: int) -> tuple[np.ndarray, float, float]:
        """_profile_row's (c, mass, prior) of request r; one not seen yet: c = 0, mass = 0 and weight 1 on the
        trace-wide share, which gives exactly that share."""
        c = self.prof.get(r)
        return (self._none, 0.0, 1.0) if c is None else (c, self.mass[r], self.prior)

    def _glob(self) -> np.ndarray:
        return self.glob / self.glob_tokens if self.glob_tokens > 0 else np.zeros(self.K)

    def request_probs(self, requests: np.ndarray) -> np.ndarray:
        """(R, K) pi_rk: each request's share of recent tokens routed to each key (the trace-wide share mixed in)."""
        out = np.empty((len(requests), self.K))
        for i, r in enumerate(np.asarray(requests).tolist()):
            _profile_row(*self._profile(r), self.glob, self.glob_tokens, out[i])
        return out

    def folded(self, request: int, n: int, lo: int, width: int, keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """(width,) request_probs of keys lo..lo+width-1 once a step of `n` tokens of `request` routed counts (tokens
        per key) to `keys` (all within that range): what observe will fold at the step's end, for one layer, while
        the step still runs (ForecastEvictPolicy.routed)."""
        d = self.decay ** n
        c = self.prof.get(request)
        at = np.asarray(keys, np.int64) - lo
        out = np.zeros(width) if c is None else c[lo:lo + width] * d
        out[at] += counts
        g = self.glob[lo:lo + width].copy()  # the trace-wide share with this step counted, as observe counts it
        g[at] += 1.0
        mass = (self.mass[request] * d if c is not None else 0.0) + n
        return (out + self.prior * g / (self.glob_tokens + 1.0)) / (mass + self.prior)

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
            # trace-wide: the share of request-steps that use each key (a prefill counts once)
            _fold(c, d, use.keys[use.off[i]:use.off[i + 1]], np.asarray(use.counts[use.off[i]:use.off[i + 1]], np.float64),
                  self.glob)
            self.mass[r] = self.mass[r] * d + n
            self.seen[r] = self.step
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

    def folded(self, request: int, n: int, lo: int, width: int, keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """ReuseForecast.folded of the memory chosen now."""
        return self.subs[self.chosen].folded(request, n, lo, width, keys, counts)

    def observe(self, use: StepUse) -> None:
        if self._q is not None:  # score the forecasts made for this step, then learn from it
            for i, q in enumerate(self._q):
                self.loss[i] += _log_loss_keys(q, use.keys)
            self._q = None
        for f in self.subs:
            f.observe(use)


class ReuseMix:
    """Per-layer next-step use probabilities from a reuse probe's log d̂ mixed with request profiles (module
    docstring). start(pi (R, K), L, requests) opens a step; row(l, logd (R, K)) -> q (K,) of layer l for the mix
    chosen now (the runtime gives each row when its layer runs); probs(pi, logd (R, L, K), requests) -> q (L, K),
    every row at once (the replay). observe(StepUse) scores every mix's forecasts made a step earlier (the mean over
    the rows made) against the keys that step used, as SelectedForecast does: only the chosen mix is computed per
    row, the others when scored, once per step (also when the next step is other requests': scoring each request's
    forecast at its own next step instead was measured no better, and worse on the builtin-fine replay).
    latest: request -> the hazards of its latest row (for its later turns; oldest dropped past KEEP requests)."""

    ALPHAS = (0.0, 0.5, 1.0)
    KEEP = 1024

    def __init__(self) -> None:
        self.loss = np.zeros(len(self.ALPHAS))
        self._a = self.ALPHAS[0]
        self._pi: np.ndarray | None = None
        self._hz: np.ndarray | None = None  # (L, R, K) hazards 1/d̂ of this step's rows (NaN: a row not made)
        self._req: np.ndarray | None = None  # (R,) this step's requests
        self._due: tuple[np.ndarray, np.ndarray] | None = None  # (pi, hazards) made a step earlier, for this one
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

    def later(self, pi_nK: np.ndarray, requests: np.ndarray) -> np.ndarray:
        """(n, K) pi of `requests` at their later turns (pi_nK: their profiles, changed in place): a·hz + (1 - a)·pi
        with each one's latest hazards where it has them, a the mix chosen now (the cap at 0.999 is the reader's)."""
        a = self.ALPHAS[self.chosen]
        if a:
            for i, r in enumerate(np.asarray(requests).tolist()):
                hz = self.latest.get(r)
                if hz is not None:
                    pi_nK[i] = a * hz + (1.0 - a) * pi_nK[i]
        return pi_nK

    def _score(self, pi: np.ndarray, made: np.ndarray, keys: np.ndarray) -> None:
        """Add each mix's log-loss of the forecasts (pi (R, K), rows made (M, R, K)) against the keys used."""
        used = np.zeros(made.shape[-1], bool)
        used[keys] = True
        a = np.asarray(self.ALPHAS)[:, None, None, None]
        self.loss += log_loss(self._q(a, pi, made).mean(1), used)  # q (3, K)

    def observe(self, use: StepUse | None) -> None:
        if use is not None and self._due is not None:
            made = self._due[1][~np.isnan(self._due[1][:, 0, 0])]  # (rows made, R, K)
            if len(made):
                self._score(self._due[0], made, use.keys)
        self._due = None
        if self._hz is not None:
            self._due = (self._pi, self._hz)
            made = np.flatnonzero(~np.isnan(self._hz[:, 0, 0]))
            if len(made) and self._req is not None:
                for i, r in enumerate(self._req.tolist()):
                    self.latest.pop(r, None)  # re-inserted last: the oldest go first past KEEP
                    self.latest[r] = self._hz[made[-1], i]
                while len(self.latest) > self.KEEP:
                    del self.latest[next(iter(self.latest))]
        self._pi = self._hz = self._req = None


class NextTokenMix:
    """Waiting requests' next-turn use probabilities mixed with their next input token's forecast (module docstring).

    mix(pi_nK, requests, next_use, running) -> pi_nK changed in place: each request with a forecast nu (K,) in
    next_use (request id -> nu) and not among `running` gets a·nu + (1 - a)·pi, a = ALPHAS[chosen]; its (pi, nu) is
    kept until its own step ends. observe(StepUse) scores every kept pair of the requests that step ran against the
    keys each used (the AUC of each mix's order of the keys, and its Bernoulli log-loss, q clipped to [1e-4, 1 - 1e-4]),
    then drops them; chosen: the largest AUC sum, ties to the lowest log-loss.
    """

    ALPHAS = (0.0, 0.25, 0.5, 0.75)
    KEEP = 1024

    def __init__(self) -> None:
        self.auc = np.zeros(len(self.ALPHAS))
        self.loss = np.zeros(len(self.ALPHAS))
        self.pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def chosen(self) -> int:
        best = self.auc >= self.auc.max() - 1e-9
        return int(np.flatnonzero(best)[np.argmin(self.loss[best])])

    def mix(self, pi_nK: np.ndarray, requests: np.ndarray, next_use: Mapping[int, np.ndarray],
            running: set[int]) -> np.ndarray:
        a = self.ALPHAS[self.chosen]
        for i, r in enumerate(np.asarray(requests).tolist()):
            nu = next_use.get(r)
            if nu is None or r in running:  # the running request's next token is sampled only when its step ends
                continue
            self.pending.pop(r, None)  # re-inserted last: the oldest go first past KEEP
            self.pending[r] = (pi_nK[i].copy(), nu)
            if a:
                pi_nK[i] = a * nu + (1.0 - a) * pi_nK[i]
        while len(self.pending) > self.KEEP:
            del self.pending[next(iter(self.pending))]
        return pi_nK

    def observe(self, use: StepUse) -> None:
        alphas = np.asarray(self.ALPHAS)[:, None]
        for i, r in enumerate(use.requests.tolist()):
            got = self.pending.pop(r, None)
            if got is None:
                continue
            pi, nu = got
            used = np.zeros(pi.shape[0], bool)
            used[use.keys[use.off[i]:use.off[i + 1]]] = True
            q = alphas * nu + (1.0 - alphas) * pi
            self.loss += log_loss(q, used)
            self.auc += auc(q, used)


def check_next_use(next_use: Mapping[int, np.ndarray], K: int) -> None:
    """begin_step(next_use=...): request id -> (K,) probabilities in [0, 1]; one sentence naming the request otherwise."""
    for r, nu in next_use.items():
        nu = np.asarray(nu)
        if nu.shape != (K,) or nu.dtype.kind != "f" or not (np.isfinite(nu).all() and (nu >= 0).all() and (nu <= 1).all()):
            raise ValueError(f"fc-evict: the next-token forecast of request {r} has shape {nu.shape} (dtype {nu.dtype}, "
                             f"values in [0, 1]: {bool(np.isfinite(nu).all() and (nu >= 0).all() and (nu <= 1).all())}); "
                             f"expected ({K},) probabilities in [0, 1].")


def next_turns(request_T: np.ndarray) -> np.ndarray:
    """(T,) the index of each token's request's next token (-1 for its last): where a waiting request's next input
    token, known since its last turn, is found (its next-token forecast at any step before that index)."""
    req = np.asarray(request_T, np.int64)
    out = np.full(len(req), -1, np.int64)
    seen: dict[int, int] = {}
    for t in range(len(req) - 1, -1, -1):
        r = int(req[t])
        out[t] = seen.get(r, -1)
        seen[r] = t
    return out


def known_next_use(request_T: np.ndarray, use_TK: np.ndarray) -> list[dict[int, np.ndarray]]:
    """Per decode token t of `request_T` (one token per step), the forecast of each request's next step from its
    known input token (use_TK[j]: the forecast of token j from its input token id): every request that has run before
    t and is not finished, with its next token j (its next turn), and t's own, with t itself (this step):
    begin_step(next_use=...) under round_robin's schedule. Causal: a request's next input token is known once its
    previous step ended; t's own is the token it feeds in now, not the one it will sample."""
    req = np.asarray(request_T, np.int64)
    nxt = next_turns(req)
    pending: dict[int, int] = {}  # request -> its next token's index, once it has run
    out = []
    for t, r in enumerate(req.tolist()):
        pending.pop(r, None)
        out.append({q: use_TK[j] for q, j in pending.items()} | {r: use_TK[t]})
        if nxt[t] >= 0:
            pending[r] = int(nxt[t])
    return out


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


@njit(cache=True, nogil=True)
def schedule_q_at(q_now: np.ndarray, up_RK: np.ndarray, mine_R: np.ndarray, layer_K: np.ndarray,
                  layer: int) -> np.ndarray:
    """ForecastEvictPolicy.q_at's arithmetic in one pass (it runs inside a layer, once per layer and reuse row): p_up =
    up_RK with q_now in the rows of this step's requests (mine_R), then schedule_q's q0 for keys of a layer after
    `layer` (layer_K (K,) each key's layer), q1 for the others (the sums in turn, not pairwise: equal to rounding)."""
    R, K = up_RK.shape
    out = np.empty(K)
    for k in range(K):
        c = 1.0
        s = 0.0
        for m in range(R):
            c *= 1.0 - (q_now[k] if mine_R[m] else up_RK[m, k])
            s += c
        e1 = s / max(1.0 - c, 1e-12)
        out[k] = 1.0 / (1.0 + (1.0 - q_now[k]) * (1.0 + e1)) if layer_K[k] > layer else 1.0 / (1.0 + e1)
    return out


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
