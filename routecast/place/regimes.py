"""Every placement method priced step by step in its regime, with the bounds of both objectives.

Legend: T steps, L MoE layers, E experts, G EP ranks, R replica slots per rank (E / G + R slots a rank).

A step is "prefill" (every token a prompt token), "decode" (every token a generated one) or "mixed". Each
step and layer is priced by sim.cost.layer_cost with the rank roofline (CostOptions.roofline = "rank"):
a rank's expert time is max(token compute, distinct experts x weight read) plus per-call work, and the
MoE layer is dispatch + that maximum over ranks + combine + exposed weight transfers. Decode steps are
weight-read bound (the distinct experts a rank reads set its time), large prefill steps compute bound.

Bounds per (step, layer), in the same units (no placement, replication or token split goes below them):
  tokens     perfect token balance: every rank computes the mean token work (sum over experts of their
             compute and activation work, / G), weight reads ignored;
  distinct   perfect distinct-expert balance: some rank runs at least ceil(D / G) of the D active experts,
             each a weight read and a call;
  bound      the larger of the two: what any placement is measured against.
Each adds the all-to-all at perfectly even assignments (the busiest rank receives at least T K / G
assignments) and the per-rank shared-expert and fixed work, which no placement changes.

Methods (all with the same R replica slots per rank):
  static, eplb_window, probe_oracle, probe_pred   as place.compare (EPLB's statistics window and rebalance
             interval scaled to the steps: interval T / 2, so one rebalance, charged, falls inside them; PROBE
             plans on the forecast below);
  eplb_once  EPLB on the training steps' total loads, placed before serving (no move charged), tokens split
             evenly over an expert's copies;
  moe_gps    MoE-GPS Algorithm 1 on the training steps' total loads (duplication, shares kept);
  coact      place.coact fitted on the training steps, replicated experts dispatched by the forecast;
  coact_step the coact home placement with per-step replica moves (place.coact_step) from the forecast;
  coact_step_oracle  the same moves decided on the actual loads (what a perfect forecast would reach).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.place.coact import RankPrice, coact_counts, fit_coact
from routecast.place.coact_step import step_hosts
from routecast.place.compare import (
    _price,
    _transition_after,
    compare_methods,
    step_loads,
    step_work,
)
from routecast.place.compare_stream import assignment, eplb_shares
from routecast.place.slot_plans import eplb_plan, moegps_plan
from routecast.sim.cost import Workload, attention_time, layer_cost, probe_options
from routecast.sim.hardware import Hardware
from routecast.sim.models import ModelProfile
from routecast.trace.trace import Trace

REGIMES = ("prefill", "decode", "mixed")
EXTRA = ("moe_gps", "coact", "coact_step", "coact_step_oracle")


def step_regime(prefill_share_T: np.ndarray) -> np.ndarray:
    """(T,) share of prompt tokens per step -> (T,) regime names ("prefill" / "decode" / "mixed")."""
    p = np.asarray(prefill_share_T, np.float64)
    return np.where(p >= 1.0, "prefill", np.where(p <= 0.0, "decode", "mixed"))


def _flat(work: Workload, T: int, L: int) -> Workload:
    return Workload(**{f: np.repeat(np.broadcast_to(getattr(work, f), (T,)), L)
                       for f in ("batch", "seq_len", "context_len")})


def step_bounds(loads_TLE: np.ndarray, work: Workload, *, ep: int, model: ModelProfile, hw: Hardware,
                link: str = "nvlink") -> dict[str, np.ndarray]:
    """The bounds of the module docstring -> {"tokens", "distinct", "bound"}: (T, L) seconds per MoE layer."""
    loads = np.asarray(loads_TLE, np.float64)
    T, L, E = loads.shape
    flat = loads.reshape(T * L, 1, E)
    opts = dataclasses.replace(probe_options(link), roofline="rank")
    w = _flat(work, T, L)
    # every expert split evenly over the G ranks: even all-to-all; no routed expert: shared + fixed work only
    even = layer_cost(np.repeat(flat / ep, ep, axis=1), model=model, hw=hw, work=w, opts=opts)
    base = layer_cost(np.zeros((T * L, ep, E)), model=model, hw=hw, work=w, opts=opts)
    price = RankPrice.of(model, hw)
    F, X, A = price.parts(loads)
    tokens = (F + A).sum(axis=2).reshape(-1) / ep
    distinct = np.ceil(X.sum(axis=2).reshape(-1) / ep) * (price.t_read + price.call)
    comm = even.dispatch + even.combine + base.ffn
    return {"tokens": (comm + tokens).reshape(T, L), "distinct": (comm + distinct).reshape(T, L),
            "bound": (comm + np.maximum(tokens, distinct)).reshape(T, L)}


def _price_layers(counts_TLGE: np.ndarray, work: Workload, attn_T: np.ndarray, model: ModelProfile, hw: Hardware,
                  link: str) -> np.ndarray:
    """MoE-layer seconds (T, L) of fixed assignments (no weight moves)."""
    T, L, G, E = counts_TLGE.shape
    c = _price(counts_TLGE.reshape(T * L, G, E), _flat(work, T, L), model, hw, link)
    return (c.dispatch + c.ffn + c.combine).reshape(T, L)


def _step_moves(plan, loads, decide, work, attn_T, model, hw, link, price) -> tuple[np.ndarray, np.ndarray]:
    """coact_step priced layer by layer (a layer's window is the previous layer's compute) -> (moe_s_TL, bytes_T)."""
    T, L, E = loads.shape
    G = plan.num_ranks
    eb = float(model.expert_bytes())
    t_x = eb / hw.link_bandwidth(link)
    moe, bytes_T = np.empty((T, L)), np.zeros(T)
    ffn_prev = np.zeros((T, G))
    wl = Workload(**{f: np.broadcast_to(getattr(work, f), (T,)) for f in ("batch", "seq_len", "context_len")})
    for lay in range(L):
        window = attn_T[:, None] + (ffn_prev if lay else np.zeros((T, G)))
        host, n_in, n_out = step_hosts(plan, lay, decide[:, lay], window, t_x, price)
        counts = np.zeros((T, G, E))
        counts[np.arange(T)[:, None], host, np.arange(E)[None]] = loads[:, lay]
        c = _price(counts, wl, model, hw, link, np.maximum(n_in, n_out) * eb, window)
        ffn_prev = c.ffn_CG
        moe[:, lay] = c.dispatch + c.ffn + c.combine + c.transfer_exposed
        bytes_T += n_in.sum(axis=1) * eb
    return moe, bytes_T


def evaluate(train: Trace | np.ndarray, held: Trace | np.ndarray, *, ep: int, replicas_per_rank: int, hw: Hardware,
             model: ModelProfile, link: str = "nvlink", decay: float = 0.8, seed: int = 0, methods: tuple[str, ...] | None = None,
             forecast_TLE: np.ndarray | None = None) -> dict[str, Any]:
    """Every method on the held-out steps, plans and forecasts from the training steps -> results dict.

    train / held: traces whose steps are batches (e.g. trace.decode_batches of training and held-out
    documents), or (N, L, E) / (T, L, E) int step loads (then every step is a decode step of loads / K
    tokens with no context, and the default forecast is the previous step's loads).
    forecast_TLE: the held-out steps' forecast counts that PROBE and coact plan on (e.g.
    compare.lookahead_counts of a predictor fitted on the training documents); None = the transition
    forecast, warmed on the training steps. methods: which of EXTRA to run (None = all).
    Returns {"moe_s_TL": {method: (T, L) s}, "bytes_T": {method: (T,)}, "bounds": step_bounds, "regime_T",
    "tokens_T", "plan": the coact SlotPlan (None when no coact method ran), "settings"}.
    """
    arrays = not isinstance(held, Trace)
    E_held = np.shape(held)[-1] if arrays else held.spec.num_experts
    if model.num_experts != E_held or ep < 2 or E_held % ep:
        raise ConfigError(f"ep {ep} with model {model.name} ({model.num_experts} experts) and steps of "
                          f"{E_held} experts; expected matching counts and ep >= 2 dividing them.")
    R = int(replicas_per_rank)
    if arrays:
        loads, train_loads = np.asarray(held), np.asarray(train)
        if loads.ndim != 3 or train_loads.shape[1:] != loads.shape[1:] or loads.dtype.kind not in "iu" \
                or train_loads.dtype.kind not in "iu" or (loads < 0).any() or (train_loads < 0).any():
            raise ConfigError(f"step loads have shapes {train_loads.shape} and {loads.shape}; expected integer "
                              "(steps, layers, experts) counts >= 0 with the same layers and experts.")
        tokens = np.maximum(loads.sum(axis=2).max(axis=1) // max(model.top_k, 1), 1)
        pre = np.zeros(loads.shape[0])
        work = Workload(batch=tokens.astype(np.float64), seq_len=1, context_len=0)
    else:
        loads, tokens, pre = step_loads(held)
        train_loads = step_loads(train)[0]
        work = step_work(held)
    T, L, E = loads.shape
    if forecast_TLE is not None:
        forecast = np.asarray(forecast_TLE)
        if forecast.shape != loads.shape:
            raise ConfigError(f"forecast_TLE has shape {forecast.shape}; expected {loads.shape} like the held-out loads.")
    elif arrays:  # the previous step's loads
        forecast = np.concatenate([train_loads[-1:], loads[:-1]])
    else:  # over the training steps, then the held-out ones: keep their request ids apart
        shifted = dict(held.tokens, request=held.tokens["request"] + int(train.tokens["request"].max()) + 1)
        forecast = _transition_after(train, dataclasses.replace(held, tokens=shifted), decay)
    src = loads if arrays else held
    res = compare_methods(src, ep=ep, hw=hw, model=model, predicted={"probe_pred": forecast}, eplb_redundant=R,
                          max_redundant=max(R, 1), decay=decay, link=link, keep_loads=False,
                          interval=max(1, T // 2))
    moe = {k: v["moe_s_TL"] for k, v in res["methods"].items()}
    byt = {k: v["bytes_T"] for k, v in res["methods"].items()}
    want = EXTRA if methods is None else tuple(m for m in EXTRA if m in methods)
    attn = attention_time(model, hw, work, probe_options(link), ep, T)[0]
    price = RankPrice.of(model, hw)
    once = eplb_plan(train_loads.sum(axis=0), ep, redundant_per_rank=R)
    moe["eplb_once"] = _price_layers(assignment(loads, eplb_shares(once.slots_LS, E, ep)), work, attn, model, hw, link)
    byt["eplb_once"] = np.zeros(T)
    if "moe_gps" in want:
        mg = moegps_plan(train_loads.sum(axis=0), ep, redundant_per_rank=R)
        share = np.zeros((L, E, ep))
        rank = mg.rank_of_slot()
        for lay in range(L):
            ok = mg.slots_LS[lay] >= 0
            np.add.at(share[lay], (mg.slots_LS[lay][ok], rank[ok]), mg.share_LS[lay][ok])
        tot = share.sum(axis=2, keepdims=True)
        home = np.zeros((E, ep))
        home[np.arange(E), np.arange(E) // (E // ep)] = 1.0
        share = np.where(tot > 0, share / np.where(tot > 0, tot, 1.0), home[None])
        moe["moe_gps"] = _price_layers(assignment(loads, share), work, attn, model, hw, link)
        byt["moe_gps"] = np.zeros(T)
    plan = None
    if any(m.startswith("coact") for m in want):
        plan = fit_coact(train_loads, num_ranks=ep, replicas_per_rank=R, price=price, seed=seed)
    if "coact" in want:
        moe["coact"] = _price_layers(coact_counts(plan, loads, price, forecast), work, attn, model, hw, link)
        byt["coact"] = np.zeros(T)
    for name, dec in (("coact_step", forecast), ("coact_step_oracle", loads)):
        if name in want:
            moe[name], byt[name] = _step_moves(plan, loads, dec, work, attn, model, hw, link, price)
    return {"moe_s_TL": moe, "bytes_T": byt, "bounds": step_bounds(loads, work, ep=ep, model=model, hw=hw, link=link),
            "regime_T": step_regime(pre), "tokens_T": tokens, "plan": None if plan is None else plan.slot_plan(),
            "settings": {"ep": ep, "replicas_per_rank": R, "slots": E + ep * R, "hardware": hw.name,
                         "model": model.name, "link": link, "steps": T, "layers": L, "train_steps": int(train_loads.shape[0])}}


def regime_table(res: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (regime present, method), then the three bounds: mean MoE-layer us and saving vs static (%)."""
    rows = []
    for reg in REGIMES:
        m = res["regime_T"] == reg
        if not m.any():
            continue
        st = float(res["moe_s_TL"]["static"][m].mean())
        for name, v in res["moe_s_TL"].items():
            us = float(v[m].mean())
            rows.append({"regime": reg, "method": name, "steps": int(m.sum()), "us": us * 1e6,
                         "vs_static_pct": 100.0 * (st - us) / st})
        for name in ("tokens", "distinct", "bound"):
            us = float(res["bounds"][name][m].mean())
            rows.append({"regime": reg, "method": f"bound_{name}", "steps": int(m.sum()), "us": us * 1e6,
                         "vs_static_pct": 100.0 * (st - us) / st})
    return rows


def advise_placement(source: Trace | np.ndarray, *, ep: int, slots: int | None = None, hw: Hardware,
                     model: ModelProfile, link: str = "nvlink", batch: int | None = None, steps: int = 64,
                     train_fraction: float = 0.5, forecast_TLE: np.ndarray | None = None, seed: int = 0
                     ) -> dict[str, Any]:
    """Per-method MoE-layer time by regime and the co-activation plan, for the advisor -> dict.

    source: a Trace (split chronologically by document, split_requests(train_fraction): plans and forecasts
      learn on the earlier documents, every method is priced on the later ones) or (T, L, E) int step loads
      (the first train_fraction of the steps train, the rest are priced; the forecast is the previous step).
    ep: EP ranks G; slots: physical expert slots per layer (default E + G: one replica slot a rank; must be
      E + G x R, R >= 0); hw, model: sim profiles (model.num_experts == E); link: "nvlink" | "pcie".
    batch: with a Trace, replay its decode tokens as `batch` concurrent requests (trace.decode_batches,
      2 x steps training steps, `steps` priced steps) instead of the trace's own steps.
    forecast_TLE: forecast counts of the priced steps (default: the transition forecast / previous step).
    Returns {"us": {method: {"decode" | "prefill" | "mixed": mean us per MoE layer, or None where the regime
    has no step}}, "bounds": {"tokens" | "distinct" | "bound": same}, "best": {regime: (method, saving % vs
    static)}, "plan": SlotPlan of the coact planner (layer ids 0..L-1), "settings"}.
    """
    from routecast.place.compare import split_requests
    from routecast.trace.decode_batches import decode_batches

    E = model.num_experts
    if slots is None:
        slots = E + ep
    if type(ep) is not int or ep < 2 or type(slots) is not int or slots < E or (slots - E) % ep:
        raise ConfigError(f"ep {ep!r} with {slots!r} slots for {E} experts; expected ep >= 2 and slots = E + ep x R, R >= 0.")
    if isinstance(source, Trace):
        train, held = split_requests(source, train_fraction)
        if batch is not None:
            train = decode_batches(train, batch=batch, steps=2 * steps, seed=seed)
            held = decode_batches(held, batch=batch, steps=steps, seed=seed + 1)
    else:
        x = np.asarray(source)
        cut = int(round(train_fraction * x.shape[0])) if x.ndim == 3 else 0
        if x.ndim != 3 or not 0 < cut < x.shape[0]:
            raise ConfigError(f"step loads have shape {x.shape}; expected (T, L, E) with at least 2 steps to split.")
        train, held = x[:cut], x[cut:]
    res = evaluate(train, held, ep=ep, replicas_per_rank=(slots - E) // ep, hw=hw, model=model, link=link,
                   seed=seed, forecast_TLE=forecast_TLE)
    us: dict[str, dict[str, float | None]] = {}
    for name, v in [*res["moe_s_TL"].items(), *(("bound_" + k, b) for k, b in res["bounds"].items())]:
        us[name] = {r: (float(v[res["regime_T"] == r].mean()) * 1e6 if (res["regime_T"] == r).any() else None)
                    for r in REGIMES}
    best = {}
    for r in REGIMES:
        have = {k: d[r] for k, d in us.items() if d[r] is not None and not k.startswith("bound_")}
        if have:
            k = min(have, key=have.get)
            best[r] = (k, 100.0 * (1.0 - have[k] / have["static"]))
    return {"us": {k: v for k, v in us.items() if not k.startswith("bound_")},
            "bounds": {k[6:]: v for k, v in us.items() if k.startswith("bound_")}, "best": best, "plan": res["plan"],
            "settings": res["settings"]}


def compare_regimes(res: dict[str, Any], trace: Trace, *, ep: int, model: ModelProfile, hw: Hardware,
                    link: str = "nvlink") -> list[dict[str, Any]]:
    """regime_table of place.compare.compare_methods' result on `trace` (its methods and the bounds)."""
    loads, _, pre = step_loads(trace)
    bounds = step_bounds(loads, step_work(trace), ep=ep, model=model, hw=hw, link=link)
    return regime_table({"moe_s_TL": {k: v["moe_s_TL"] for k, v in res["methods"].items()}, "bounds": bounds,
                         "regime_T": step_regime(pre)})


def regime_lines(rows: list[dict[str, Any]]) -> list[str]:
    """regime_table rows as printed lines: one header per regime, then each method's us and saving."""
    out, last = [], None
    for r in rows:
        if r["regime"] != last:
            last = r["regime"]
            out.append(f"{last} steps ({r['steps']}): MoE-layer us per method, saving vs static EP "
                       "(bound_tokens: perfect token balance; bound_distinct: perfect distinct-expert balance)")
        out.append(f"  {r['method']:<18} {r['us']:>10.2f} us  {r['vs_static_pct']:>+7.2f}%")
    return out
