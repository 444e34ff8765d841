"""The real routing that drives the geometry's layers (geometry.py): a captured trace's decode tokens mapped to a
production expert geometry, with PROBE's forecast and the reuse probe's, and saved to a file another machine reads.

``trace_routing`` takes the decode tokens of a captured trace (builtin-fine's, DeepSeek-V3 architecture, 64 experts
top-6) in the trace's serving order (one token of each request in flight in turn) or one request after the other
(``order``), geometry layer g taking trace layer g mod L_trace. Expert ids (``map_routing``): a 64-expert geometry
(DeepSeek-V2-Lite) uses the trace's ids as they are; an 8-expert one (Mixtral-8x7B) maps trace expert e to e // 8 and
keeps the first two distinct groups in the router's weight order (top-2, weights renormalised). Prediction: PROBE's
frozen-gate lookahead of builtin-fine applied to the trace's recorded router input of layer g (the next trace layer's
gate, one matmul), mapped to the geometry's ids as the routing is. With ``reuse_probe``, the reuse probe's forecast
(predict/reuse_probe.py, fitted on the trace's documents that are not driven): row g from the recorded router inputs
of trace layers 0..g mod L_trace, a geometry expert's distance the least of its trace experts' (``map_reuse``);
and the token table's forecast of each token from its token id (``token_use``: predict/frequency.py's
conditional-token, fitted on the same documents; a geometry expert's share the sum of its trace experts', its
probability of use top-k times that share, at most 0.99), which fc-evict reads for a waiting request's next token.

``save_routing`` / ``load_routing`` write and read one such routing as a single .npz (arrays plus a JSON header):
a machine that holds the trace computes it, and one that does not (a lent GPU machine) drives its layers with it;
the forecasts' seconds per token are the ones measured where they were computed.
"""

from __future__ import annotations

import io
import json
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from routecast.common.errors import ConfigError
from routecast.runtime.offload.geometry import Geometry


def map_routing(experts_TLK: np.ndarray, weights_TLK: np.ndarray, geom: Geometry, trace_E: int) -> tuple[np.ndarray, np.ndarray]:
    """Trace routing (T, Lt, Kt) -> the geometry's (T, geom.layers, geom.top_k) ids and weights (module docstring).
    A dropped trace slot (id -1) routes nothing; a token with fewer distinct groups than top-k gets -1 (weight 0) in
    the rest, which every user of the ids skips."""
    Lt = experts_TLK.shape[1]
    lay = np.arange(geom.layers) % Lt
    ids, w = experts_TLK[:, lay].astype(np.int64), weights_TLK[:, lay].astype(np.float32)
    w = np.where(ids >= 0, w, 0.0).astype(np.float32)  # a dropped slot (-1) routes nothing
    if geom.experts == trace_E and geom.top_k <= ids.shape[-1]:
        return np.where(ids >= 0, ids, -1)[..., :geom.top_k], w[..., :geom.top_k]
    if trace_E % geom.experts:
        raise ConfigError(f"--geometry {geom.name}: {geom.experts} experts do not divide the trace's {trace_E}.")
    g = np.where(ids >= 0, ids // (trace_E // geom.experts), -1)
    order = np.argsort(-w, axis=-1, kind="stable")
    g, w = np.take_along_axis(g, order, -1), np.take_along_axis(w, order, -1)
    T, L, K = g.shape
    out_i, out_w = np.zeros((T, L, geom.top_k), np.int64), np.zeros((T, L, geom.top_k), np.float32)
    first = g >= 0
    for k in range(1, K):  # a group seen at an earlier (heavier) slot is not new
        first[..., k] &= ~(g[..., :k] == g[..., k:k + 1]).any(-1)
    rank = np.cumsum(first, -1) - 1
    for j in range(geom.top_k):
        sel = first & (rank == j)
        has = sel.any(-1)
        at = sel.argmax(-1)
        out_i[..., j] = np.where(has, np.take_along_axis(g, at[..., None], -1)[..., 0], -1)  # fewer groups: -1
        out_w[..., j] = np.where(has, (w * (g == out_i[..., j:j + 1])).sum(-1), 0.0)
    out_w /= np.maximum(out_w.sum(-1, keepdims=True), 1e-9)
    return out_i, out_w


def map_reuse(logd_nLK: np.ndarray, geom: Geometry, trace_L: int, trace_E: int) -> np.ndarray:
    """A reuse probe's log d̂ over the trace's keys (n, L_trace, L_trace·E_trace) -> (n, geom.layers, geom.layers·
    geom.experts): geometry layer g reads trace row g mod L_trace; a geometry key (g', e) is used when any of its trace
    experts (layer g' mod L_trace, ids e·m .. e·m + m - 1, m = E_trace / geom.experts) is, so its distance is their least."""
    n = logd_nLK.shape[0]
    m = trace_E // geom.experts
    lay = np.arange(geom.layers) % trace_L
    per = logd_nLK.reshape(n, trace_L, trace_L, geom.experts, m).min(-1)  # (n, row, trace layer, E_geom)
    return np.ascontiguousarray(per[:, lay][:, :, lay].reshape(n, geom.layers, geom.layers * geom.experts))



ORDERS = ("step", "request")


def check_order(order: str) -> None:
    """--geometry-order: one of ORDERS (trace_routing's docstring)."""
    if order not in ORDERS:
        raise ConfigError(f"--geometry-order is {order!r}; expected one of {', '.join(ORDERS)}.")


def trace_routing(trace_path: str | Path, geom: Geometry, tokens: int, *, forecast: bool = True,
                  order: str = "step", reuse_probe: bool = False, token_table: bool = False) -> dict[str, Any]:
    """The first `tokens` decode tokens of a captured trace -> {'ids', 'w' (T, L, K) the geometry's
    routing; 'request' (T,) each token's request; 'pred' bool (T, L, E) PROBE's frozen-gate forecast of each layer
    from the previous trace layer's recorded router input (layer 0's: the trace's layer-0 routing frequencies),
    mapped as the routing, and 'pred_rank' uint8 (T, L, E) each forecast expert's rank in it (1 = the most likely,
    0 = not forecast: geometry.prefetch_sets' confidence gate); 'predict_s' seconds of those forecasts per token (the predictor's own time, charged to
    every prefetching run)}. forecast=False: no forecast ('pred' all False, 'predict_s' 0), so a trace without
    router inputs, or of another model than the built-in ones whose gates PROBE uses, drives demand policies.
    order: 'step' = the trace's own order (its serving schedule: one decode token of each request in flight in
    turn), 'request' = each request's decode tokens in a row, one request after the other (one user at a time,
    as an offloading runtime on one machine serves them and as benchmarks/offload.py's builtin-fine runs do).
    reuse_probe: also 'reuse' (T, L, L·E) the reuse probe's log d̂ per token (map_reuse), the probe fitted on every
    token of the documents none of the driven tokens comes from, and 'reuse_s' its seconds per token; and
    'token_use' (T, L·E) the token table's probability that each token uses each key (fitted on the same documents),
    'token_s' its seconds per token: fc-evict's forecasts. token_table: 'token_use' and 'token_s' without the probe
    (absent when no other document is left to fit the table on)."""
    check_order(order)
    from routecast.trace import DECODE
    from routecast.trace.io import read_trace

    trace = read_trace(trace_path, load_hidden=forecast or reuse_probe)
    rows = np.flatnonzero(trace.phase == DECODE)
    if order == "request":
        rows = rows[np.lexsort((np.asarray(trace.position)[rows], np.asarray(trace.request)[rows]))]
    rows = rows[:tokens]
    if len(rows) < tokens:
        raise ConfigError(f"--routing {trace_path}: {len(rows)} decode tokens; expected at least {tokens}.")
    spec = trace.spec
    ids, w = map_routing(np.asarray(trace.experts_TLK[rows]), np.asarray(trace.weights_TLK[rows]), geom,
                         spec.num_experts)
    base = {"ids": ids, "w": w, "tokens": len(rows), "request": np.asarray(trace.request[rows], np.int64),
            "trace": str(trace_path), "trace_layers": spec.num_layers, "order": order}
    if reuse_probe:
        base.update(_reuse(trace, rows, geom, trace_path))
    if reuse_probe or token_table:
        base.update(_token_use(trace, rows, geom))
    if not forecast:
        return {**base, "pred": np.zeros((len(rows), geom.layers, geom.experts), bool),
                "pred_rank": np.zeros((len(rows), geom.layers, geom.experts), np.uint8), "predict_s": 0.0}
    if trace.hidden_TLH is None:
        raise ConfigError(f"--routing {trace_path}: the trace holds no router inputs; lookahead prefetch needs a "
                          "capture with --hidden (or run without prefetch).")
    if spec.name not in ("builtin", "builtin-fine"):
        raise ConfigError(f"--routing {trace_path}: a trace of {spec.name!r}; lookahead prefetch on a geometry uses the "
                          "gates of builtin or builtin-fine, expected a trace of one of them (or run without prefetch).")
    from routecast.predict.lookahead import LookaheadPredictor

    la = LookaheadPredictor.from_model(spec.name, spec)
    hid = torch.from_numpy(np.asarray(trace.hidden_TLH[rows], np.float32))  # (T, Lt, H)
    Kt = spec.top_k
    t0 = time.perf_counter()
    with torch.no_grad():  # every target trace layer j >= 1 from layer j-1's router input: one batched matmul
        logits = torch.einsum("tlh,leh->tle", hid[:, :-1], la.net.prior_W) + la.net.prior_b
        probs = la.rule.forecast(logits, la.net.correction)  # (T, Lt-1, E)
        w_f, i_f = probs.topk(Kt, dim=-1)
    predict_s = (time.perf_counter() - t0) / len(rows)
    l0 = np.argsort(-np.bincount(np.asarray(trace.experts_TLK[:, 0]).reshape(-1), minlength=spec.num_experts))[:Kt]
    f_ids = np.concatenate([np.broadcast_to(l0, (len(rows), 1, Kt)), i_f.numpy()], 1)
    f_w = np.concatenate([np.full((len(rows), 1, Kt), 1.0 / Kt, np.float32), w_f.numpy()], 1)
    g_ids, _ = map_routing(f_ids, f_w, geom, spec.num_experts)
    rank = np.zeros((len(rows), geom.layers, geom.experts), np.uint8)
    t, lay, k = np.nonzero(g_ids >= 0)  # map_routing keeps each token's forecast in weight order: k is its rank
    rank[t, lay, g_ids[t, lay, k]] = k + 1
    return {**base, "pred": rank > 0, "pred_rank": rank, "predict_s": predict_s}


def _reuse(trace, rows: np.ndarray, geom: Geometry, trace_path: str | Path) -> dict[str, Any]:
    """trace_routing's 'reuse' and 'reuse_s': the probe fitted on the documents the driven rows do not come from."""
    from routecast.predict.reuse_probe import fit_reuse_probe

    if trace.hidden_TLH is None:
        raise ConfigError(f"--routing {trace_path}: the trace holds no router inputs; the reuse probe reads them: "
                          "expected a capture with --hidden (or run without --reuse-probe).")
    doc = np.asarray(trace.tokens["document"])
    train = ~np.isin(doc, doc[rows])
    if train.sum() < 2:
        raise ConfigError(f"--routing {trace_path}: no document is left to fit the reuse probe on beside the "
                          f"{len(rows)} tokens driven; expected a trace with more documents.")
    probe = fit_reuse_probe(trace, train)
    t0 = time.perf_counter()
    logd = probe.predict(np.asarray(trace.hidden_TLH[rows]))
    reuse_s = (time.perf_counter() - t0) / len(rows)
    s = trace.spec
    return {"reuse": map_reuse(logd, geom, s.num_layers, s.num_experts), "reuse_s": reuse_s,
            "reuse_train_tokens": int(train.sum())}


def _token_use(trace, rows: np.ndarray, geom: Geometry) -> dict[str, Any]:
    """trace_routing's 'token_use' and 'token_s': the conditional-token table fitted on the documents the driven rows
    do not come from, each row's forecast mapped to the geometry's keys (module docstring); {} when there are none."""
    from routecast.predict.frequency import ConditionalPredictor

    doc = np.asarray(trace.tokens["document"])
    # -1: an unknown document (a schema-1 trace) or token id (an imported trace without them)
    train = ~np.isin(doc, doc[rows]) & (doc >= 0) & (np.asarray(trace.token_id) >= 0)
    if not train.any():
        return {}
    table = ConditionalPredictor(trace.spec).fit_rows(trace, train)
    tok = np.asarray(trace.token_id)[rows].astype(np.int64)
    t0 = time.perf_counter()
    share = table.shares(tok)
    token_s = (time.perf_counter() - t0) / len(rows)
    n, Lt, Et = share.shape
    groups = share.reshape(n, Lt, geom.experts, Et // geom.experts).sum(-1)[:, np.arange(geom.layers) % Lt]
    use = np.minimum(geom.top_k * groups.astype(np.float64), 0.99).reshape(n, geom.layers * geom.experts)
    return {"token_use": use, "token_s": token_s}


def first_tokens(routing: dict[str, Any], n: int) -> dict[str, Any]:
    """The first n tokens of a trace_routing result (n <= its tokens)."""
    if not 1 <= n <= routing["tokens"]:
        raise ConfigError(f"{n} geometry tokens asked of a routing of {routing['tokens']}; expected 1..{routing['tokens']}.")
    keys = [k for k in _ARRAYS if k in routing]
    return {**routing, **{k: routing[k][:n] for k in keys}, "tokens": n}


_ARRAYS = ("ids", "w", "request", "pred", "pred_rank", "reuse", "token_use")
_META = ("tokens", "trace", "trace_layers", "order", "predict_s", "reuse_s", "reuse_train_tokens", "token_s")


def save_routing(path: str | Path, routing: dict[str, Any], geom: Geometry) -> Path:
    """One trace_routing result of `geom` -> path (.npz: its arrays, and a JSON header with the geometry it was mapped
    to and the scalars), written atomically."""
    from routecast.common.outputs import write_atomic

    path = Path(path)
    meta = {"geometry": {"name": geom.name, "experts": geom.experts, "top_k": geom.top_k, "layers": geom.layers},
            **{k: routing[k] for k in _META if k in routing}}
    arrays = {k: routing[k] for k in _ARRAYS if k in routing}
    buf = io.BytesIO()  # built in memory: the shared writer puts it on disk (temp file, fsync, rename)
    np.savez_compressed(buf, header=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
    write_atomic(path, buf.getvalue(), "--save-routing")
    return path


def load_routing(path: str | Path, geom: Geometry) -> dict[str, Any]:
    """A save_routing file, checked against `geom` (its layers, experts and top-k; every array's shape; ids in
    range) -> the trace_routing dict it holds. One sentence naming the file and what is wrong otherwise."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["header"]).decode())
            got = {k: z[k] for k in _ARRAYS if k in z.files}
    except FileNotFoundError:
        raise ConfigError(f"--routing-file {path}: no such file; expected one written by save_routing "
                          "(benchmarks/offload.py --save-routing).") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, zipfile.BadZipFile) as e:
        raise ConfigError(f"--routing-file {path}: not a routing file ({type(e).__name__}); expected one written by "
                          "save_routing.") from None
    want = {"name": geom.name, "experts": geom.experts, "top_k": geom.top_k, "layers": geom.layers}
    if not isinstance(meta, dict) or meta.get("geometry") != want:
        raise ConfigError(f"--routing-file {path}: mapped to {meta.get('geometry') if isinstance(meta, dict) else None}; "
                          f"expected {want}.")
    T = meta.get("tokens")
    L, E, K = geom.layers, geom.experts, geom.top_k
    shapes = {"ids": (T, L, K), "w": (T, L, K), "request": (T,), "pred": (T, L, E), "pred_rank": (T, L, E),
              "reuse": (T, L, L * E), "token_use": (T, L * E)}
    for k in ("ids", "w", "request", "pred"):
        if k not in got:
            raise ConfigError(f"--routing-file {path}: no {k!r} array; expected ids, w, request and pred.")
    for k, a in got.items():
        if a.shape != shapes[k]:
            raise ConfigError(f"--routing-file {path}: {k!r} has shape {a.shape}; expected {shapes[k]}.")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ConfigError(f"--routing-file {path}: {k!r} holds NaN or infinite values; expected finite ones.")
    if "token_use" in got and ((got["token_use"] < 0) | (got["token_use"] > 1)).any():
        raise ConfigError(f"--routing-file {path}: 'token_use' holds values outside [0, 1]; expected probabilities.")
    if "pred_rank" in got and (got["pred_rank"].dtype != np.uint8 or (got["pred_rank"] > K).any()
                               or ((got["pred_rank"] > 0) != got["pred"]).any()):
        raise ConfigError(f"--routing-file {path}: 'pred_rank' is not ranks 0..{K} (uint8) of the 'pred' sets; expected "
                          "the forecast's ranks, 0 where nothing is forecast.")
    ids = got["ids"]
    if ((ids < -1) | (ids >= E)).any():
        raise ConfigError(f"--routing-file {path}: expert ids outside -1..{E - 1}; expected the geometry's ids.")
    return {**meta, **got}
