"""PROBE vs EPLB vs static EP on per-step routing: IR, skew, simulated MoE-layer latency, planner time, bytes.

Legend: T steps (forward passes), L MoE layers, E experts, G EP ranks, C = T x L simulated configurations.

Methods, each evaluated on the actual loads of every (step, layer):
  static      sharded EP placement (expert e on rank e // (E / G)), no replicas;
  eplb_once   EPLB one-shot: placement from the first `interval` steps' statistics, kept for the rest;
              before it, EPLB of uniform loads (no statistics yet);
  eplb_window EPLB as engines run it (vLLM --eplb-config): statistics over the last `window` steps,
              a rebalance every `interval` steps; both default to vLLM's 1000 / 3000 scaled to the trace
              (interval = T / 5, window = interval / 3). Both EPLB variants get `eplb_redundant` (2)
              redundant slots per rank, as in PROBE §6.1, and split an expert's tokens evenly over its copies;
  probe_oracle PROBE Algorithm 2 (place.probe.plan_layers) on this step's actual per-layer loads;
  probe_pred   PROBE Algorithm 2 on a causal forecast of this step's loads; the plan (placement and each
              expert's split over its copies) is then applied to the actual loads (tokens of an expert are
              split over ranks in the planned proportions; an expert predicted idle stays on its home rank).
Plus the lower bound on IR that any plan within PROBE's replica budget obeys (probe.load_lower_bound).

Forecast used by probe_pred (`transition_forecast`, horizon `layer`, as PROBE's lookahead): layer l's
counts at step t are this step's layer l-1 routing pushed through the inter-layer transition matrix
P(e_l | e_{l-1}) counted on steps < t (exponentially decayed by `decay` per step, so it follows drift and
shifts); layer 0, which has no previous layer, uses the decayed layer-0 distribution of past steps
scaled to this step's token count. Rows never seen fall back to uniform. It reads only this step's
routing of layers < l and past steps, so it is causal.

With router inputs (hidden_TLH) and the model, compare_lookahead runs two forecast arms on the held-out
requests of a chronological split by document (split_requests; by request when the trace records none): probe_lookahead, PROBE's gate-initialised
lookahead predictor (predict.lookahead, §4.2) fitted on the earlier requests, each layer's counts being the
sum of every token's predicted top-k set from its router input of the previous layer (lookahead_forecast);
and probe_transition, the forecast above with its statistics learnt on the same earlier requests first.

Latency: sim.cost.layer_cost with probe_options (DP attention, deduplicated all-to-all) on the per-rank
assignment each method produces; "MoE latency" is dispatch + FFN + combine + exposed transfer. Every expert
weight a method moves is charged through the cost model's transfer term, max_g max(0, T_trans,g - W_g)
(PROBE eq. 6 and §3.4: T_trans,g = max(experts received, experts sent by g) x W / B_link):
  hiding window W_g of MoE layer l at step t: rank g's expert compute (FFN) of layer l-1 at step t plus the
              attention of layer l (PROBE §4.4: a transfer starts with layer l-1's MoE compute, yields to its
              combine, and finishes during layer l's attention); layer 0 has only its attention. Attention is
              priced from the step's requests: batch = requests in the step, seq_len = its tokens / requests,
              context = their mean first position in the step (a loads array has no requests: one token per
              sequence, no context).
  PROBE       replicas are sent every step (the replica buffer is rewritten per layer). Algorithm 2's
              dual-side budget uses the same windows: layer l is planned after layer l-1 has been priced on
              the actual loads (as the runtime plans layer l while layer l-1 runs, its assignment known), so
              the budget follows the simulated compute. With `window_transfers` = N the budget is instead a
              fixed N transfers per rank (the earlier setting), still charged against the computed windows.
  EPLB        each rebalance moves, per layer, every expert a rank newly hosts (copies it already held are
              local) from one of its previous holders (the one with the fewest sends so far); all of them
              in the rebalance step, each layer's behind that layer's window, as PROBE's.
Bytes moved count expert copies received over the network (x W).

Memory: compare_methods reads, forecasts, plans and prices `window_steps` steps at a time (compare_stream.py:
a Trace is streamed step by step, EPLB is replayed from cumulative-load snapshots), so it holds one window's
(W, L, G, E) assignments and the per-step (T, L) results, not (T, L, G, E) arrays; the result is identical
for any window size.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.place.compare_stream import (
    WINDOW_STEPS,
    EplbReplay,
    TransitionForecaster,
    assignment,
    eplb_transfers,  # noqa: F401  (re-exported: part of this module's API)
    iter_steps,
    step_meta,
    step_windows,
)
from routecast.place.duplication import sharded_placement
from routecast.place.eplb import EPLBDeployment
from routecast.place.probe import load_lower_bound, plan_layers, planner_costs, replica_budget, spread_sources
from routecast.sim.cost import LayerCost, Workload, attention_time, layer_cost, probe_options
from routecast.sim.hardware import Hardware
from routecast.sim.models import ModelProfile
from routecast.trace.trace import NO_DOCUMENTS_NOTE, Trace

METHODS = ("static", "eplb_once", "eplb_window", "probe_oracle", "probe_pred")


def step_loads(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-step loads of a trace -> (loads_TLE int64, tokens_T int64, prefill_share_T float64).

    Steps are the trace's `step` values in increasing order; prefill_share is the fraction of a step's
    tokens in phase 0 (prefill). The (T, L, E) result is whole: compare_methods streams instead.
    """
    s = trace.spec
    tokens, pre = step_meta(trace)
    loads = np.zeros((tokens.size, s.num_layers, s.num_experts), np.int64)
    for t, (_, lo) in enumerate(iter_steps(trace)):
        loads[t] = lo
    return loads, tokens, pre


def transition_forecast(trace: Trace, *, decay: float = 0.8) -> np.ndarray:
    """Causal layer-ahead forecast of every step's per-layer expert counts -> (T, L, E) float64.

    See the module docstring. decay in [0, 1): weight of a past step's statistics per step of age.
    """
    s = trace.spec
    fc = TransitionForecaster(s.num_layers, s.num_experts, s.top_k, decay)
    tokens, _ = step_meta(trace)
    pred = np.empty((tokens.size, s.num_layers, s.num_experts))
    for t, (ids, loads) in enumerate(iter_steps(trace)):
        pred[t] = fc.forecast(loads, int(tokens[t]))
        fc.learn(ids, loads)
    return pred


def split_requests(trace: Trace, train_fraction: float, by: str = "document") -> tuple[Trace, Trace]:
    """Chronological split by document (by="request": by request) -> (train, held-out) traces.

    Documents in order of their first request id: the first round(train_fraction x D) train, the requests of
    the later ones are held out, so no held-out request shares a source document (text) with a training one,
    and a forecast for the held-out part never reads a token the predictor was fitted on. A trace that records
    no documents falls back to requests, with a printed note. by="request": the first round(train_fraction x R)
    requests in request-id (arrival) order train; in a trace captured batch by batch the held-out steps then
    come after the training steps.
    """
    if not 0.0 < train_fraction < 1.0:
        raise ConfigError(f"train_fraction is {train_fraction}; expected a value in (0, 1).")
    if by == "document" and not trace.has_documents:
        print(NO_DOCUMENTS_NOTE, file=sys.stderr)
        by = "request"
    req = trace.tokens["request"]
    if by == "document":
        trace.check_documents()  # every request names one document
        key = trace.tokens["document"]
        docs, inv = np.unique(key, return_inverse=True)
        first = np.full(docs.size, np.iinfo(np.int64).max)
        np.minimum.at(first, inv, req)
        groups = docs[np.argsort(first, kind="stable")]  # by first request id (arrival order)
    else:
        key, groups = req, np.unique(req)
    n = int(round(train_fraction * groups.size))
    if not 0 < n < groups.size:
        raise ConfigError(f"train_fraction {train_fraction} of {groups.size} {by}s leaves an empty part; "
                          f"expected at least one training and one held-out {by}.")
    train = np.isin(key, groups[:n])
    return trace.select(train), trace.select(~train)


def lookahead_forecast(trace: Trace, model_dir: Any, *, train_fraction: float = 0.5, seed: int = 0,
                       epochs: int = 8, counts: str = "topk") -> np.ndarray:
    """PROBE lookahead forecast of the held-out steps' per-layer expert counts -> (T_held, L, E).

    Fits predict.lookahead.LookaheadPredictor (routers cloned from model_dir: a directory, "builtin" or a
    loaded model; `epochs` distillation passes, `seed`) on the training part of
    split_requests(trace, train_fraction) and forecasts every step of the held-out part, aligned with
    step_loads(held-out part). Layer l >= 1 at step t: each of the step's tokens is predicted from its own
    router input of layer l-1 (hidden_TLH[:, l-1], known one layer ahead: horizon `layer`), then
    counts="topk" (default) adds the predicted top-k set of every token, as a top-k router picks whole sets
    (int64 counts, so the planner splits whole tokens, as on the actual loads); counts="probs" adds k x the
    predicted probabilities (float64 soft counts). Layer 0 has no earlier router input: the fitted layer-0
    slot shares x the step's tokens x k (with "topk" rounded to integers by largest remainder). Both conserve
    k slots per token.
    """
    from routecast.predict.lookahead import LookaheadConfig, LookaheadPredictor

    if counts not in ("topk", "probs"):
        raise ConfigError(f"counts is {counts!r}; expected 'topk' or 'probs'.")
    if trace.hidden_TLH is None or trace.logits_TLE is None:
        raise ConfigError("the trace has no hidden_TLH or logits_TLE; the lookahead forecast needs both: "
                          "capture with --hidden --logits (or use transition_forecast).")
    train, held = split_requests(trace, train_fraction)
    pred = LookaheadPredictor.from_model(model_dir, held.spec, config=LookaheadConfig(epochs=epochs, seed=seed))
    return lookahead_counts(pred.fit(train), held, counts=counts)


def lookahead_counts(pred: Any, held: Trace, *, counts: str = "topk") -> np.ndarray:
    """A fitted LookaheadPredictor's forecast of every step of `held` -> (T, L, E) counts (see lookahead_forecast).

    held needs hidden_TLH (the router inputs); steps in step_loads order.
    """
    import torch

    if counts not in ("topk", "probs"):
        raise ConfigError(f"counts is {counts!r}; expected 'topk' or 'probs'.")
    if held.hidden_TLH is None:
        raise ConfigError("the trace has no hidden_TLH; the lookahead forecast needs router inputs (--hidden).")
    s = held.spec
    L, E, K = s.num_layers, s.num_experts, s.top_k
    tokens, _ = step_meta(held)
    T = tokens.size
    _, step_idx = np.unique(held.tokens["step"], return_inverse=True)
    out = np.empty((T, L, E))
    out[:, 0] = pred.layer0_dist()[None, :] * (tokens * K)[:, None]
    if counts == "topk":  # largest remainder: floor, then one more slot to the largest fractional parts
        low = np.floor(out[:, 0])
        short = (tokens * K - low.sum(axis=1)).round().astype(np.int64)
        rank = np.argsort(np.argsort(low - out[:, 0], axis=1, kind="stable"), axis=1, kind="stable")
        out[:, 0] = low + (rank < short[:, None])
    with torch.no_grad():
        for layer in range(1, L):
            logits = torch.from_numpy(pred.predict_logits(layer, np.asarray(held.hidden_TLH[:, layer - 1])))
            probs = pred.rule.forecast(logits, pred.net.correction[layer - 1]).double()
            if counts == "topk":
                key, w = step_idx[:, None] * E + probs.topk(K, dim=1).indices.numpy(), None
            else:
                key, w = step_idx[:, None] * E + np.arange(E), K * probs.numpy().reshape(-1)
            out[:, layer] = np.bincount(key.reshape(-1), weights=w, minlength=T * E).reshape(T, E)
    return out.astype(np.int64) if counts == "topk" else out


def _transition_after(train: Trace, held: Trace, decay: float) -> np.ndarray:
    """transition_forecast of the held-out steps, statistics warmed on the training steps -> (T_held, L, E).

    The training requests' steps are placed before the held-out ones (both keep their own order), so the
    online forecast has learnt from the same requests the lookahead predictor was fitted on.
    """
    s_tr, s_ho = train.tokens["step"], held.tokens["step"]
    tokens = {k: np.concatenate([train.tokens[k], held.tokens[k]]) for k in held.tokens}
    tokens["step"] = np.concatenate([s_tr, s_ho + (int(s_tr.max()) + 1 - int(s_ho.min()))])
    both = Trace(spec=held.spec, tokens=tokens,
                 experts_TLK=np.concatenate([train.experts_TLK, held.experts_TLK]),
                 weights_TLK=np.concatenate([train.weights_TLK, held.weights_TLK]),
                 task_names=held.task_names, source_names=held.source_names)
    return transition_forecast(both, decay=decay)[np.unique(s_tr).size:]


def compare_lookahead(trace: Trace, model_dir: Any, *, ep: int, hw: Hardware, model: ModelProfile,
                      train_fraction: float = 0.5, seed: int = 0, epochs: int = 8, counts: str = "topk",
                      decay: float = 0.8, **kw: Any) -> dict[str, Any]:
    """compare_methods on the held-out part of split_requests(trace, train_fraction) with two forecast arms.

    probe_lookahead: lookahead_forecast (hidden states; predictor fitted on the training requests);
    probe_transition: transition_forecast, its statistics learnt on the training steps first, then online.
    Both plan the same held-out steps; the oracle, EPLB and static rows are as in compare_methods (kw).
    settings gains train / held-out request and step counts and each arm's forecast error
    sum |forecast - loads| / sum loads over the held-out steps and layers (0 = perfect; layer 0 included).
    """
    train, held = split_requests(trace, train_fraction)
    arms = {"probe_lookahead": lookahead_forecast(trace, model_dir, train_fraction=train_fraction, seed=seed,
                                                  epochs=epochs, counts=counts),
            "probe_transition": _transition_after(train, held, decay)}
    res = compare_methods(held, ep=ep, hw=hw, model=model, predicted=arms, decay=decay, **kw)
    loads = res["loads_TLE"]
    res["settings"].update({
        "train_fraction": train_fraction, "train_requests": int(np.unique(train.tokens["request"]).size),
        "held_out_requests": int(np.unique(held.tokens["request"]).size),
        "train_steps": int(np.unique(train.tokens["step"]).size), "lookahead_epochs": epochs,
        "lookahead_counts": counts, "lookahead_seed": seed,
        "forecast_error": {k: float(np.abs(v - loads).sum() / max(loads.sum(), 1)) for k, v in arms.items()},
    })
    return res


def step_work(trace: Trace) -> Workload:
    """Attention shape of every step -> Workload of (T,) arrays, steps in step_loads order.

    batch = distinct requests with tokens in the step, seq_len = the step's tokens / batch, context_len = the
    mean over those requests of their first position in the step (the cached tokens before it).
    """
    _, step_idx = np.unique(trace.tokens["step"], return_inverse=True)
    T = int(step_idx.max()) + 1
    req = trace.tokens["request"].astype(np.int64)
    req = req - req.min()
    pair, inv = np.unique(step_idx * (int(req.max()) + 1) + req, return_inverse=True)
    order = np.lexsort((trace.tokens["position"], inv))  # by pair, then position: a pair's first is its minimum
    first = trace.tokens["position"][order[np.searchsorted(inv[order], np.arange(pair.size))]].astype(np.float64)
    pstep = pair // (int(req.max()) + 1)
    batch = np.bincount(pstep, minlength=T).astype(np.float64)
    tokens = np.bincount(step_idx, minlength=T)
    ctx = np.bincount(pstep, weights=first, minlength=T) / batch
    return Workload(batch=batch, seq_len=np.maximum(tokens / batch, 1.0), context_len=np.maximum(ctx, 0.0))


def _windows(attn_T: np.ndarray, ffn_TLG: np.ndarray) -> np.ndarray:
    """Hiding window of every (step, layer, rank) -> (T, L, G) seconds: attention of layer l plus rank g's
    expert compute of layer l-1 (layer 0: attention only)."""
    win = np.empty_like(ffn_TLG)
    win[:] = attn_T[:, None, None]
    win[:, 1:] += ffn_TLG[:, :-1]
    return win


def _price(counts_CGE: np.ndarray, work: Workload, model: ModelProfile, hw: Hardware, link: str,
           xfer_bytes_CG: Any = 0.0, window_CG: Any = None) -> LayerCost:
    """layer_cost under probe_options(link), regime-priced (roofline "rank": a rank's expert time is the slower
    of its token compute and its distinct experts' weight reads), each rank's transfer bytes charged against
    its window."""
    opts = dataclasses.replace(probe_options(link), transfer_bytes=xfer_bytes_CG, hide_window_s=window_CG,
                               roofline="rank")
    return layer_cost(counts_CGE, model=model, hw=hw, work=work, opts=opts)


def _probe_run(loads: np.ndarray, plan_loads: np.ndarray, P0: np.ndarray, costs: Any, fixed_window: float | None,
               k_max: int, max_redundant: int, attn_T: np.ndarray, work: Workload, model: ModelProfile,
               hw: Hardware, link: str) -> tuple[np.ndarray, ...]:
    """Plan every (step, layer) on plan_loads (T, L, E), apply to loads and price it, layer by layer.

    Layer l's window needs layer l-1's compute under its own plan, so layers run in order and each layer's
    T steps are priced in one layer_cost call. One plan_layers call per (step, layer), as the runtime plans.
    Returns (counts_TLGE, moe_s_TL, exposed_s_TL, window_TLG, ffn_TLG, bytes_T, planner_s_T).
    """
    T, L, E = loads.shape
    G = P0.shape[1]
    counts, window, ffn = np.empty((T, L, G, E)), np.empty((T, L, G)), np.empty((T, L, G))
    moe, exposed = np.empty((T, L)), np.empty((T, L))
    bytes_T, plan_s = np.zeros(T), np.zeros(T)
    integral = np.issubdtype(plan_loads.dtype, np.integer)
    home = P0.astype(np.float64)
    plan_layers(spread_sources(plan_loads[0, :1], G), P0, costs=costs, hide_window_s=0.0)  # JIT warm-up
    ffn_prev = np.zeros((T, G))
    for lay in range(L):
        window[:, lay] = attn_T[:, None] + (ffn_prev if lay else 0.0)
        budget = window[:, lay] if fixed_window is None else np.full((T, G), fixed_window)
        xfer = np.empty((T, G))
        for t in range(T):
            c0 = time.thread_time()
            plan = plan_layers(spread_sources(plan_loads[t, lay:lay + 1], G), P0, costs=costs,
                               hide_window_s=budget[t:t + 1], k_max=k_max, max_redundant=max_redundant)
            plan_s[t] += time.thread_time() - c0
            bytes_T[t] += float(plan.bytes_moved_L[0])
            xfer[t] = plan.transfer_s_LG[0] * costs.link_bandwidth  # max(in, out) x W per rank
            if integral and plan_loads is loads:
                counts[t, lay] = plan.n_LEG[0].T
                continue
            n = plan.n_LEG[0].astype(np.float64)
            tot = n.sum(axis=1, keepdims=True)
            share = np.where(tot > 0, n / np.where(tot > 0, tot, 1.0), home)
            counts[t, lay] = (loads[t, lay, :, None] * share).T
        cost = _price(counts[:, lay], work, model, hw, link, xfer, window[:, lay])
        ffn_prev = ffn[:, lay] = cost.ffn_CG
        moe[:, lay] = cost.dispatch + cost.ffn + cost.combine + cost.transfer_exposed
        exposed[:, lay] = cost.transfer_exposed
    return counts, moe, exposed, window, ffn, bytes_T, plan_s


def compare_methods(loads: np.ndarray | Trace, *, ep: int, hw: Hardware, model: ModelProfile,
                    predicted: np.ndarray | dict[str, np.ndarray] | None = None, interval: int | None = None,
                    window: int | None = None, eplb_redundant: int = 2, window_transfers: int | None = None,
                    k_max: int = 16, max_redundant: int = 3,
                    decay: float = 0.8, link: str = "nvlink", eplb_groups: int = 1,
                    eplb_nodes: int = 1, window_steps: int = WINDOW_STEPS,
                    keep_loads: bool | None = None) -> dict[str, Any]:
    """Every method of the module docstring on T steps -> dict of per-step arrays and settings.

    loads: a Trace, or (T, L, E) int per-step expert counts (then `predicted` (T, L, E) is required: no
    token-level routing to learn transitions from). predicted: (T, L, E) forecast counts planned as
    "probe_pred", or {method name: (T, L, E)} for one PROBE row per forecast (e.g. compare_lookahead's arms);
    None = transition_forecast. ep: G ranks (E % G == 0); hw, model: sim profiles
    (model.num_experts == E). interval / window: EPLB rebalance interval and statistics window in steps
    (default T // 5 and interval // 3). eplb_groups, eplb_nodes: EPLB's hierarchical mode (expert groups
    packed onto nodes first, as DeepSeek's EPLB does for grouped routers; 1, 1 = global). window_transfers: None (default) = PROBE's budget is each rank's
    computed hiding window (module docstring); N = a fixed N expert transfers per rank per layer. link:
    "nvlink" or "pcie", the EP ranks' link (all-to-all and weight transfers).
    Steps are read, forecast, planned and priced `window_steps` at a time (a Trace is streamed), so memory
    holds one window's (W, L, G, E) assignments and per-step (T, L) results; keep_loads: also return the
    (T, L, E) loads and the per-rank (T, L, G) loads and windows (None = when they take under 256 MB).
    Returns {"methods": {name: {"ir_TL", "skew_TL", "moe_s_TL", "exposed_s_TL", "bytes_T", "planner_s_T"
    [, "load_TLG", "window_s_TLG"]}}, "ir_bound_TL", "loads_TLE" (or None), "tokens_T", "prefill_share_T",
    "settings"}; seconds, bytes, tokens.
    """
    arms = None if predicted is None else predicted if isinstance(predicted, dict) else {"probe_pred": predicted}
    if isinstance(loads, Trace):
        src, s = loads, loads.spec
        tokens, pre = step_meta(src)
        T, L, E = tokens.size, s.num_layers, s.num_experts
        if T == 0:
            raise ConfigError("the trace has no tokens; expected at least one step to compare placements on.")
        work = step_work(src)
    else:
        src = np.asarray(loads)
        if src.ndim != 3 or not np.issubdtype(src.dtype, np.integer) or (src < 0).any():
            raise ConfigError(f"loads has shape {src.shape} and dtype {src.dtype}; expected (T, L, E) counts >= 0.")
        if arms is None:
            raise ConfigError("predicted is None with a loads array; expected (T, L, E) forecast counts or a Trace.")
        T, L, E = src.shape
        tokens = np.maximum(src.sum(axis=2).max(axis=1) // max(model.top_k, 1), 1)
        pre = np.zeros(T)
        work = Workload(batch=tokens.astype(np.float64), seq_len=1, context_len=0)
    preds = None if arms is None else {k: np.asarray(v) for k, v in arms.items()}
    for k, v in (preds or {}).items():  # integer forecasts are planned in whole tokens
        preds[k] = v if np.issubdtype(v.dtype, np.integer) else v.astype(np.float64)
        if v.shape != (T, L, E) or k in METHODS[:4]:
            raise ConfigError(f"predicted[{k!r}] has shape {v.shape}; expected {(T, L, E)} like the loads "
                              f"and a name other than {METHODS[:4]}.")
    if E != model.num_experts or ep < 2 or E % ep:
        raise ConfigError(f"{E} experts at ep={ep} with model {model.name} ({model.num_experts} experts); "
                          "expected matching expert counts and ep >= 2 dividing them.")
    if window_transfers is not None and window_transfers < 0:
        raise ConfigError(f"window_transfers is {window_transfers}; expected None (computed windows) or >= 0.")
    if type(window_steps) is not int or window_steps < 1:
        raise ConfigError(f"window_steps is {window_steps!r}; expected a positive number of steps.")
    interval = interval or max(1, T // 5)
    window = window or max(1, interval // 3)
    P0 = sharded_placement(E, ep)
    costs = planner_costs(model, hw, link=link)
    fixed = None if window_transfers is None else window_transfers * costs.transfer_s
    eb = float(model.expert_bytes())
    attn = attention_time(model, hw, work, probe_options(), ep, T)[0]
    work_T = {f: np.broadcast_to(getattr(work, f), (T,)) for f in ("batch", "seq_len", "context_len")}
    n_runs = 4 + (1 if preds is None else len(preds))
    keep = keep_loads if keep_loads is not None else T * L * (E + 2 * ep * n_runs) * 8 < 256e6
    home = np.broadcast_to(P0.astype(np.float64), (L, E, ep))
    replays = {name: EplbReplay(EPLBDeployment(num_gpus=ep, redundant_per_gpu=eplb_redundant, window_steps=stats,
                                               rebalance_every=every, num_groups=eplb_groups, num_nodes=eplb_nodes),
                                T, L, E, eb)
               for name, every, stats in (("eplb_once", None, interval), ("eplb_window", interval, window))}
    parts: dict[str, dict[str, list[np.ndarray]]] = {}
    bound_parts, load_parts, win_sum = [], [], 0.0
    for t0, lw, pw in step_windows(src, window_steps, decay, preds):
        W = lw.shape[0]
        sl = slice(t0, t0 + W)
        work_w = Workload(**{f: v[sl] for f, v in work_T.items()})
        work_wl = Workload(**{f: np.repeat(v[sl], L) for f, v in work_T.items()})
        runs: dict[str, tuple[np.ndarray, ...]] = {}
        static = assignment(lw, home)
        cost = _price(static.reshape(W * L, ep, E), work_wl, model, hw, link)
        ffn = cost.ffn_CG.reshape(W, L, ep)
        runs["static"] = (static, (cost.dispatch + cost.ffn + cost.combine).reshape(W, L), np.zeros((W, L)),
                          _windows(attn[sl], ffn), ffn, np.zeros(W), np.zeros(W))
        for name, rep in replays.items():
            counts, xfer, bytes_W, plan_s = rep.window(lw, t0)
            flat = counts.reshape(W * L, ep, E)
            ffn = _price(flat, work_wl, model, hw, link).ffn_CG.reshape(W, L, ep)  # compute ignores transfers
            win = _windows(attn[sl], ffn)
            cost = _price(flat, work_wl, model, hw, link, xfer.reshape(W * L, ep) * eb, win.reshape(W * L, ep))
            runs[name] = (counts, (cost.dispatch + cost.ffn + cost.combine + cost.transfer_exposed).reshape(W, L),
                          cost.transfer_exposed.reshape(W, L), win, ffn, bytes_W, plan_s)
        args = (fixed, k_max, max_redundant, attn[sl], work_w, model, hw, link)
        runs["probe_oracle"] = _probe_run(lw, lw, P0, costs, *args)
        for k, v in pw.items():
            runs[k] = _probe_run(lw, v, P0, costs, *args)
        for name, (counts, moe_s, exposed, win, ffn, bytes_W, plan_s) in runs.items():
            rank_load = counts.sum(axis=3)
            mean = rank_load.mean(axis=2)
            part = {"ir_TL": np.where(mean > 0, rank_load.max(axis=2) / np.where(mean > 0, mean, 1.0), 1.0),
                    "skew_TL": ffn.max(axis=2) / ffn.mean(axis=2), "moe_s_TL": moe_s, "exposed_s_TL": exposed,
                    "bytes_T": bytes_W, "planner_s_T": plan_s}
            if keep:
                part.update(window_s_TLG=win, load_TLG=rank_load)
            for key, val in part.items():
                parts.setdefault(name, {}).setdefault(key, []).append(val)
        # the bound holds for any plan within the replica budget of the oracle's own windows
        oracle_win = runs["probe_oracle"][3]
        win_sum += float(oracle_win.sum())
        budget = replica_budget(costs, oracle_win.reshape(W * L, ep) if fixed is None else fixed, ep, k_max=k_max,
                                max_redundant=max_redundant)
        mean_load = lw.sum(axis=2) / ep
        bound = load_lower_bound(lw.reshape(W * L, E), P0, new_replicas=budget).reshape(W, L)
        bound_parts.append(np.where(mean_load > 0, bound / np.where(mean_load > 0, mean_load, 1.0), 1.0))
        if keep:
            load_parts.append(lw)
    out = {name: {k: np.concatenate(v) for k, v in d.items()} for name, d in parts.items()}
    return {"methods": out, "ir_bound_TL": np.concatenate(bound_parts),
            "loads_TLE": np.concatenate(load_parts) if keep else None, "tokens_T": tokens, "prefill_share_T": pre,
            "settings": {"ep": ep, "hardware": hw.name, "link": link, "model": model.name, "steps": T, "layers": L,
                         "experts": E, "eplb_interval": interval, "eplb_window": window,
                         "eplb_redundant_per_rank": eplb_redundant, "eplb_groups": eplb_groups,
                         "eplb_nodes": eplb_nodes,
                         "probe_hide_window": "computed" if fixed is None else f"{window_transfers} transfers",
                         "probe_mean_window_s": win_sum / (T * L * ep),
                         "expert_transfer_s": costs.transfer_s, "probe_window_transfers": window_transfers,
                         "k_max": k_max, "max_redundant": max_redundant, "forecast_decay": decay,
                         "window_steps": window_steps}}


def summarize(res: dict[str, Any], *, shift_step: int = -1, model_layers: int | None = None) -> list[dict[str, Any]]:
    """One row per method: means before / after `shift_step` (-1 = no shift: all steps are 'before').

    Columns: mean IR, skew, MoE latency (us) before / after (exposed transfer included), decode throughput
    (tokens/s over the MoE layers of all `model_layers` layers, steps with < half prefill tokens) relative to
    eplb_window, prefill speedup vs static (steps with >= half prefill), mean exposed transfer time per layer
    (us, all steps), bytes moved per step (MB), planner CPU ms per step (mean: EPLB's rebalances amortised; PROBE:
    all layers' calls of the step) and per call (median over the steps that planned).
    """
    T, L = res["ir_bound_TL"].shape
    t = np.arange(T)
    cut = shift_step if 0 <= shift_step < T else T
    before, after = t < cut, t >= cut
    pre = res["prefill_share_T"] >= 0.5
    dec = ~pre if (~pre).any() else np.ones(T, bool)
    n_layers = model_layers or L
    rows = []
    thr = {k: res["tokens_T"][dec].sum() / (m["moe_s_TL"][dec].mean(axis=1) * n_layers).sum()
           for k, m in res["methods"].items()}
    static_pre = res["methods"]["static"]["moe_s_TL"][pre].sum()
    for name, m in res["methods"].items():
        lat = m["moe_s_TL"].mean(axis=1)
        rows.append({
            "method": name,
            "IR": float(m["ir_TL"].mean()), "skew": float(m["skew_TL"].mean()),
            "moe_us_before": float(lat[before].mean() * 1e6) if before.any() else float("nan"),
            "moe_us_after": float(lat[after].mean() * 1e6) if after.any() else float("nan"),
            "decode_tok_s": float(thr[name]), "decode_vs_eplb": float(thr[name] / thr["eplb_window"]),
            "prefill_speedup": float(static_pre / m["moe_s_TL"][pre].sum()) if pre.any() else float("nan"),
            "exposed_us": float(m["exposed_s_TL"].mean() * 1e6),
            "MB_per_step": float(m["bytes_T"].mean() / 1e6),
            "planner_ms_per_step": float(m["planner_s_T"].mean() * 1e3),
            "planner_ms_per_call": float(np.median(m["planner_s_T"][m["planner_s_T"] > 0]) * 1e3)
            if (m["planner_s_T"] > 0).any() else 0.0,
        })
    rows.append({"method": "ir_lower_bound", "IR": float(res["ir_bound_TL"].mean())})
    return rows


def throughput_series(res: dict[str, Any], *, model_layers: int | None = None, smooth: int = 9) -> dict[str, np.ndarray]:
    """Per-step simulated tokens/s of each method (moving average over `smooth` steps) -> {name: (T,)}."""
    L = res["ir_bound_TL"].shape[1]
    k = np.ones(max(1, smooth)) / max(1, smooth)
    out = {}
    for name, m in res["methods"].items():
        tps = res["tokens_T"] / (m["moe_s_TL"].mean(axis=1) * (model_layers or L))
        pad = np.pad(tps, (k.size // 2, k.size - 1 - k.size // 2), mode="edge")
        out[name] = np.convolve(pad, k, mode="valid")
    return out
