"""Reuse probe: from a token's router inputs, how many tokens until its request next uses each expert.

Legend: T tokens, L MoE layers, E experts per layer, K = L·E keys (layer·E + expert), H hidden size, n rows,
R requests of one step.

The cache's beyond-step forecast (cache/reuse.py) knows a request's recent experts; it does not know
where the text goes next. The router inputs of the token a request is decoding carry that: the next token is
sampled from them. For each layer l, a ridge regression maps the router inputs of layers 0..l of a request's
token t (concatenated, with a bias) to log d_k, d_k = positions from t to the request's next token routed to
key k, capped at `cap` (also when the request ends first), through a target transform g:

    g(d̂_Lk(t)) = [h_0(t), ..., h_l(t), 1] · W_l[:, k]        W_l = (XᵀX + λI)⁻¹ Xᵀ g(D)

g is log d ("log") or 1/√d ("inv-sqrt", which weighs the long distances less than log does and the short ones
more); predict turns either back into log d̂. Measured on the builtin-fine task replay (benchmarks/
cache_policies.py, and the grid in benchmarks/probe_adapt.py), the adapting probe transfers better with inv-sqrt,
cap 256: it is the adapting default, the fixed probe keeps log, cap 32.

Row l needs only the router inputs up to layer l, so a cache evicting at layer l of a step reads row l of the
step's forecast and nothing it could not know yet (DESIGN's causality rule). Fitted on training documents
only; the replay reads the held-out ones (adapting_probe_steps: and keeps learning on them, causally, as their
distances become known). 1/d̂ is then a per-token hazard of reuse, which the cache mixes with
the request's profile (cache/reuse.py ReuseMix).

    fit_reuse_probe(trace, rows=None, cap=32, lam=1.0, target="log") -> ReuseProbe
    ReuseProbe.predict(hidden_nLH) -> log d̂ (n, L, K)
    probe_steps(probe, trace, rows=None) -> one (R, L, K) float32 array per step (requests in ascending order)
    adapting_probe_steps(trace, train, rows, weight=16.0, every=32, cap=256, target="inv-sqrt") -> the same, the
        probe refitted as it replays
    causal_joins(trace, rows, cap=32, every=32) -> per step: its forecast rows, and the rows that joined the fit
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from routecast.common.errors import ConfigError
from routecast.trace import Trace

TARGETS = ("log", "inv-sqrt")  # g(d) the ridge fits: log d, or 1/sqrt(d)


def _target(d: np.ndarray, target: str) -> np.ndarray:
    """Capped distances (>= 1) -> what the ridge fits."""
    return np.log(d) if target == "log" else 1.0 / np.sqrt(d)


def _to_log(y: np.ndarray, target: str, cap: int) -> np.ndarray:
    """The ridge's output -> log d̂ in [0, log cap] (1/sqrt(d) clipped to [1/sqrt(cap), 1] first)."""
    if target == "inv-sqrt":
        y = -2.0 * np.log(np.clip(y, 1.0 / np.sqrt(cap), 1.0))
    return np.clip(y, 0.0, np.log(cap))


@dataclass(frozen=True)
class ReuseProbe:
    """W_l (one per layer, ((l+1)·H + 1, K) float64): ridge weights from router inputs to g(tokens-to-reuse)."""

    weights: tuple[np.ndarray, ...]
    cap: int
    num_layers: int
    num_experts: int
    hidden_size: int
    target: str = "log"  # g of the module docstring: "log" or "inv-sqrt"

    def __post_init__(self) -> None:
        if self.target not in TARGETS:  # predict would read any other name as log d
            raise ConfigError(f"reuse probe: target {self.target!r}; expected one of {', '.join(TARGETS)}.")

    def predict(self, hidden_nLH: np.ndarray) -> np.ndarray:
        """Router inputs (n, L, H) -> log d̂ (n, L, K) float32, clipped to [0, log cap] (row l reads layers <= l)."""
        h = np.asarray(hidden_nLH, np.float64)
        n, L, H = h.shape
        if (L, H) != (self.num_layers, self.hidden_size):
            raise ConfigError(f"reuse probe: router inputs have shape (n, {L}, {H}); expected (n, {self.num_layers}, "
                              f"{self.hidden_size}), the shape it was fitted on.")
        out = np.empty((n, L, self.num_layers * self.num_experts), np.float32)
        for lay, w in enumerate(self.weights):
            out[:, lay] = _to_log(_features(h, lay) @ w, self.target, self.cap)
        return out


def _features(h_nLH: np.ndarray, layer: int) -> np.ndarray:
    n = h_nLH.shape[0]
    return np.hstack([h_nLH[:, :layer + 1].reshape(n, -1), np.ones((n, 1))])


def _router_inputs(trace: Trace, where: str) -> np.ndarray:
    if trace.hidden_TLH is None:
        raise ConfigError(f"{where}: the trace has no router inputs (hidden_TLH); expected a trace captured with "
                          "hidden states (routecast capture --hidden) or read with load_hidden=True.")
    return trace.hidden_TLH


def reuse_distances(request_n: np.ndarray, position_n: np.ndarray, keys_nLK: np.ndarray, E: int,
                    cap: int) -> np.ndarray:
    """Rows sorted by (request, position); experts (n, L, k) (-1 = dropped) -> d (n, L·E) float64: positions to
    the same request's next row routed to each key, capped at cap (cap where it never is)."""
    n, L, _ = keys_nLK.shape
    used = np.zeros((n, L * E), bool)
    ok = keys_nLK >= 0
    rows = np.broadcast_to(np.arange(n)[:, None, None], keys_nLK.shape)[ok]
    used[rows, (np.arange(L)[None, :, None] * E + keys_nLK)[ok]] = True
    # next row (strictly after) using each key: a reversed running minimum of the row index where used; a hit in
    # a later request is no reuse (its rows come after all of this request's)
    idx = np.where(used, np.arange(n)[:, None], n)
    nxt = np.minimum.accumulate(idx[::-1], axis=0)[::-1]
    nxt = np.vstack([nxt[1:], np.full((1, L * E), n)])
    req = np.append(np.asarray(request_n), -1)
    pos = np.append(np.asarray(position_n, np.float64), np.inf)
    same = req[nxt] == req[:n, None]
    return np.where(same, np.minimum(pos[nxt] - pos[:n, None], cap), float(cap))


def _probe_row(x_BF: np.ndarray, h_BH: np.ndarray, w_FK: np.ndarray, layer: int, cap_log: float,
               inv_sqrt: bool = False) -> np.ndarray:
    """The runtime's row: x_BF = [1, h_0, h_1, ...] per batch row (float32, layers written as they run), h_BH this
    layer's router inputs written into it, w_FK the layer's weights with the bias row first ((1 + (layer+1)·H, K)),
    inv_sqrt: the probe's target is 1/sqrt(d). -> log d̂ (B, K) float32 clipped to [0, cap_log]: the same row as
    ReuseProbe.predict (float32 sums)."""
    B, H = h_BH.shape
    F, K = w_FK.shape
    x_BF[:, 1 + layer * H:1 + (layer + 1) * H] = h_BH
    out = np.zeros((B, K), np.float32)
    for b in range(B):
        for i in range(F):  # k innermost: independent sums, so the loop vectorises without reordering any of them
            xi = x_BF[b, i]
            for k in range(K):
                out[b, k] += xi * w_FK[i, k]
        if inv_sqrt:  # y = 1/sqrt(d) clipped to [1/sqrt(cap), 1] -> log d = -2 log y
            lo = np.float32(np.exp(-0.5 * cap_log))
            for k in range(K):
                out[b, k] = np.float32(-2.0) * np.log(min(max(out[b, k], lo), np.float32(1.0)))
        for k in range(K):
            out[b, k] = min(max(out[b, k], np.float32(0.0)), np.float32(cap_log))
    return out


try:  # numba is a dependency; the fallback keeps a broken install correct, only slow
    from numba import njit
except ImportError:  # pragma: no cover
    njit = None
probe_row = _probe_row if njit is None else njit(cache=True, nogil=True)(_probe_row)


CHUNK_ROWS = 16384  # fit_reuse_probe: tokens per chunk (whole requests), so memory does not grow with the trace


def _check_fit(cap: int, lam: float, target: str) -> None:
    if cap < 2 or not np.isfinite(lam) or lam <= 0:
        raise ConfigError(f"reuse probe: cap {cap} and lam {lam}; expected cap >= 2 tokens and lam > 0.")
    if target not in TARGETS:
        raise ConfigError(f"reuse probe: target {target!r}; expected one of {', '.join(TARGETS)}.")


def _by_request(trace: Trace, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids of `rows` sorted by (request, position), with their requests and positions."""
    idx = np.arange(trace.num_tokens) if rows is None else np.flatnonzero(np.asarray(rows, bool))
    req = np.asarray(trace.tokens["request"])[idx]
    pos = np.asarray(trace.tokens["position"])[idx]
    o = np.lexsort((pos, req))
    return idx[o], req[o], pos[o]


def _add_rows(xtx: list[np.ndarray], xty: list[np.ndarray], h_nLH: np.ndarray, y_nK: np.ndarray,
              weight: float = 1.0) -> None:
    """Add rows (router inputs, g of their distances) to each layer's normal equations, in place."""
    h = np.asarray(h_nLH, np.float64)
    for lay in range(len(xtx)):
        x = _features(h, lay)
        xtx[lay] += weight * (x.T @ x)
        xty[lay] += weight * (x.T @ y_nK)


def _solve(xtx: list[np.ndarray], xty: list[np.ndarray], lam: float) -> list[np.ndarray]:
    return [np.linalg.solve(a + lam * np.eye(len(a)), b) for a, b in zip(xtx, xty, strict=True)]


def _normal_equations(trace: Trace, rows: np.ndarray | None, cap: int, chunk_rows: int,
                      target: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each layer's XᵀX and Xᵀ g(D) over `rows`, summed over chunks of whole requests (about chunk_rows tokens
    each), so the memory is bounded by a chunk, not the trace (a mmap'd trace is read chunk by chunk)."""
    hid = _router_inputs(trace, "reuse probe")
    s = trace.spec
    idx, req, pos = _by_request(trace, rows)
    if len(idx) < 2:
        raise ConfigError(f"reuse probe: {len(idx)} training tokens; expected at least 2.")
    L, H = s.num_layers, hid.shape[2]
    F = [(lay + 1) * H + 1 for lay in range(L)]
    xtx = [np.zeros((f, f)) for f in F]
    xty = [np.zeros((f, L * s.num_experts)) for f in F]
    starts = np.flatnonzero(np.append(True, req[1:] != req[:-1]))  # each request's first row
    cuts = [0]
    for st in starts[1:]:
        if st - cuts[-1] >= chunk_rows:
            cuts.append(int(st))
    cuts.append(len(idx))
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        sl = idx[a:b]
        d = reuse_distances(req[a:b], pos[a:b], np.asarray(trace.experts_TLK[sl], np.int64), s.num_experts, cap)
        _add_rows(xtx, xty, hid[sl], _target(d, target))
    return xtx, xty


def fit_reuse_probe(trace: Trace, rows: np.ndarray | None = None, *, cap: int = 32, lam: float = 1.0,
                    target: str = "log", chunk_rows: int = CHUNK_ROWS) -> ReuseProbe:
    """Fit the probe on `rows` (bool (T,); None = all) of a trace with router inputs (module docstring); the
    normal equations are summed over chunks of whole requests (a reuse never crosses a request)."""
    _check_fit(cap, lam, target)
    xtx, xty = _normal_equations(trace, rows, cap, chunk_rows, target)
    s = trace.spec
    return ReuseProbe(weights=tuple(_solve(xtx, xty, lam)), cap=cap, num_layers=s.num_layers,
                      num_experts=s.num_experts, hidden_size=trace.hidden_TLH.shape[2], target=target)


def _step_rows(trace: Trace, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The rows the replay's forecasts come from: each (step, request)'s last token of `rows`, in (step, request)
    order, and the start of each step's run among them."""
    idx = np.arange(trace.num_tokens) if rows is None else np.flatnonzero(np.asarray(rows, bool))
    step = np.asarray(trace.step)[idx]
    req = np.asarray(trace.tokens["request"])[idx]
    pos = np.asarray(trace.tokens["position"])[idx]
    if len(idx) == 0:
        return idx, np.zeros(0, np.int64)
    o = np.lexsort((pos, req, step))
    idx, step, req = idx[o], step[o], req[o]
    last = np.append((step[1:] != step[:-1]) | (req[1:] != req[:-1]), True)
    cut = np.flatnonzero(np.append(True, step[last][1:] != step[last][:-1]))
    return idx[last], cut


def probe_steps(probe: ReuseProbe, trace: Trace, rows: np.ndarray | None = None) -> list[np.ndarray]:
    """One (R, L, K) float32 log d̂ per step of `rows` (steps ascending, as objreplay.step_uses): row r is the
    step's request r (ascending ids), forecast from its last token in the step."""
    hid = _router_inputs(trace, "reuse probe")
    last, cut = _step_rows(trace, rows)
    if len(last) == 0:
        return []
    return np.split(probe.predict(hid[last]), cut[1:])


def _known_from(step_n: np.ndarray, req_n: np.ndarray, pos_n: np.ndarray, cap: int) -> np.ndarray:
    """Rows sorted by (request, position) -> the step after which each row's capped distances are all known: the
    step of its request's first row at position >= pos + cap, else the request's last step."""
    out = np.empty(len(step_n), np.int64)
    starts = np.flatnonzero(np.append(True, req_n[1:] != req_n[:-1]))
    for a, b in zip(starts, np.append(starts[1:], len(step_n)), strict=True):
        j = np.searchsorted(pos_n[a:b], pos_n[a:b] + cap) + a
        out[a:b] = np.where(j < b, step_n[np.minimum(j, b - 1)], step_n[a:b].max())
    return out


def adapting_probe_steps(trace: Trace, train: np.ndarray, rows: np.ndarray, *, weight: float = 16.0,
                         every: int = 32, cap: int = 256, lam: float = 1.0,
                         target: str = "inv-sqrt") -> list[np.ndarray]:
    """probe_steps of a probe fitted on `train` that keeps learning on the replayed `rows`, causally.

    A replayed token joins the fit, with `weight` times a training token's weight, once every distance of its
    row is known: from the step after its request reached position p + cap (or ended), a step whose routing
    the replay has seen in full. The weights are solved again each time `every` such rows have joined, so the
    forecast for step s reads the router inputs of step s and the routing of steps before it, never later ones
    (DESIGN's causality rule). weight 0 gives probe_steps(fit_reuse_probe(trace, train, cap=cap, target=target),
    trace, rows).
    Measured on the builtin-fine replay (benchmarks/cache_policies.py): a probe fitted on four corpus tasks
    transfers badly to the fifth, and learning on the fifth as it is served recovers part of it.
    """
    _check_fit(cap, lam, target)
    if not (np.isfinite(weight) and weight >= 0) or every < 1:
        raise ConfigError(f"reuse probe: adapting weight {weight} and every {every}; expected weight >= 0 and "
                          "every >= 1 row.")
    hid = _router_inputs(trace, "reuse probe")
    s = trace.spec
    xtx, xty = _normal_equations(trace, train, cap, CHUNK_ROWS, target)

    def solved() -> ReuseProbe:
        return ReuseProbe(weights=tuple(_solve(xtx, xty, lam)), cap=cap, num_layers=s.num_layers,
                          num_experts=s.num_experts, hidden_size=hid.shape[2], target=target)

    probe = solved()
    out = []
    for last, joins in causal_joins(trace, rows, cap=cap, every=every):
        if joins is not None and weight > 0:
            _add_rows(xtx, xty, hid[joins[0]], _target(joins[1], target), weight)
            probe = solved()
        out.append(probe.predict(hid[last]))
    return out


def causal_joins(trace: Trace, rows: np.ndarray, *, cap: int = 32, every: int = 32):
    """The schedule of adapting_probe_steps, for any model that learns on the replayed rows: yields, per step of `rows`
    (ascending), (last, joins): `last` the token ids of the step's forecast rows (probe_steps' order) and `joins`
    None, or (token ids, capped distances (n, L·E)) of the rows whose distances all became known after a step before
    this one, given once at least `every` have (the model refits on them before forecasting this step)."""
    last_all, cut = _step_rows(trace, rows)
    if len(last_all) == 0:
        return
    idx, req, pos = _by_request(trace, rows)
    known = _known_from(np.asarray(trace.step)[idx], req, pos, cap)
    order = np.argsort(known, kind="stable")  # rows in the order they become known
    joined = 0  # rows of `order` given so far
    steps = np.asarray(trace.step)[last_all[cut]]
    for g, (a, b) in enumerate(zip(cut, np.append(cut[1:], len(last_all)), strict=True)):
        ready = int(np.searchsorted(known[order], steps[g], side="left"))  # known after a step before this one
        joins = None
        if ready - joined >= every:
            new = np.sort(order[joined:ready])
            joins = (idx[new], _distances_of(new, idx, req, pos, trace, cap))
            joined = ready
        yield last_all[a:b], joins


def _distances_of(new: np.ndarray, idx: np.ndarray, req: np.ndarray, pos: np.ndarray, trace: Trace,
                  cap: int) -> np.ndarray:
    """reuse_distances of the rows `new` (ascending positions into the (request, position) order), each computed
    over its request's rows up to cap positions past the last new one (a capped distance looks no further)."""
    E = trace.spec.num_experts
    out = np.empty((len(new), trace.spec.num_layers * E))
    starts = np.flatnonzero(np.append(True, req[new][1:] != req[new][:-1]))
    for a, b in zip(starts, np.append(starts[1:], len(new)), strict=True):
        lo, hi = int(new[a]), int(new[b - 1])
        r_end = int(np.searchsorted(req, req[lo], side="right"))
        end = lo + int(np.searchsorted(pos[lo:r_end], pos[hi] + cap, side="right"))
        d = reuse_distances(req[lo:end], pos[lo:end], np.asarray(trace.experts_TLK[idx[lo:end]], np.int64), E, cap)
        out[a:b] = d[new[a:b] - lo]
    return out
