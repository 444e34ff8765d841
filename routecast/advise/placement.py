"""Expert-parallel strategies on a trace: placement (static, EPLB, MoE-GPS, PROBE) and s-MoE token shuffling.

    placement_candidates(trace, dep, regime) -> (list[Candidate], PlacementRun)
    shuffle_candidates(trace, dep, regime, steps_T=...) -> (list[Candidate], {method: CoclusterPlan})

Every strategy is priced by the same cost model (sim.cost.layer_cost, PROBE's setting: DP attention,
deduplicated all-to-all) on the same steps of the trace, and reported as µs per token over all MoE layers of
the model: per step, attention + dispatch + expert compute + combine + exposed weight transfer of the mean
traced layer, times the model's MoE layers; summed over steps, over the trace's tokens.

- static EP, EPLB one-shot and windowed, PROBE (causal transition forecast; the oracle on the step's own
  loads is listed as a bound) come from place.compare.compare_methods;
- MoE-GPS distribution duplication: MoE-GPS Algorithm 1 (place.slot_plans.moegps_plan) on the loads of the
  first fifth of the steps (the statistics EPLB one-shot also sees), fixed for the rest, each expert's tokens
  split over its copies in the planned proportions; the one-time weight copy is not charged (amortised);
- MoE-GPS token-to-expert: the MoE-GPS advisor's (advise.moegps) time ratio of its best achievable
  token-to-expert configuration to no prediction, at the trace's skewness and mean step size, applied to
  static EP's time (a token-level predictor changes the dispatch, which a loads trace cannot replay);
- Speculative MoE: schedule.cocluster plans (expert pre-grouping + token table) fitted on 80% of the requests,
  scored on the held-out rest; the best partitioner's held-out local activation rate prices each layer's
  all-to-all (CostOptions.local_fraction) with its expert groups as the placement.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from routecast.advise.candidate import Candidate, not_applicable
from routecast.advise.regime import Deployment, Regime
from routecast.place.compare import compare_methods, step_work
from routecast.place.compare_stream import assignment, step_meta, step_windows
from routecast.place.slot_plans import eplb_plan, moegps_plan, static_plan
from routecast.place.slots import SlotPlan
from routecast.sim.cost import Workload, attention_time, layer_cost, probe_options
from routecast.trace.trace import Trace

WINDOW = 64  # steps priced per layer_cost call
SHUFFLE_METHODS = ("smoe", "metis", "sts")
SHUFFLE_FIT_TOKENS = 20000
NAMES = {"static": ("static EP", "EP baseline"), "eplb_once": ("EPLB one-shot", "DeepSeek EPLB"),
         "eplb_window": ("EPLB windowed", "DeepSeek EPLB (SGLang/vLLM default)"),
         "probe_pred": ("PROBE", "PROBE"), "probe_oracle": ("PROBE on the step's own loads (bound)", "PROBE")}


@dataclass(frozen=True, kw_only=True)
class PlacementRun:
    """What the placement evaluation kept for the artifacts: the statistics (L, E) of the whole trace and of the
    first fifth, the MoE-GPS and EPLB slot plans, and per-step attention (T,) seconds and tokens (T,)."""

    loads_LE: np.ndarray
    early_LE: np.ndarray
    plans: dict[str, SlotPlan]
    attn_T: np.ndarray
    tokens_T: np.ndarray


def plan_shares(plan: SlotPlan) -> np.ndarray:
    """(L, E, G) share of each expert's tokens served by each rank under a slot plan (its slot shares)."""
    L, S = plan.slots_LS.shape
    G, E = plan.num_ranks, plan.num_experts
    rank = np.arange(S) // plan.slots_per_rank
    out = np.zeros((L, E, G))
    ok = plan.slots_LS >= 0
    lay = np.repeat(np.arange(L), S).reshape(L, S)
    np.add.at(out, (lay[ok], plan.slots_LS[ok], np.broadcast_to(rank, (L, S))[ok]), plan.share_LS[ok])
    tot = out.sum(axis=2, keepdims=True)
    return np.where(tot > 0, out / np.where(tot > 0, tot, 1.0), 1.0 / G)


def _per_token(moe_TL: np.ndarray, attn_T: np.ndarray, tokens_T: np.ndarray, model_layers: int) -> float:
    """Σ_t layers x mean_l(attention + MoE) / Σ_t tokens, in µs."""
    step = model_layers * (attn_T + moe_TL.mean(axis=1))
    return float(step.sum() / max(tokens_T.sum(), 1) * 1e6)


def price_steps(trace: Trace, dep: Deployment, counts_fn: Any, *, local_L: np.ndarray | None = None) -> np.ndarray:
    """(T, L) MoE seconds (dispatch + FFN + combine, regime-priced: roofline "rank") of every step and layer.

    counts_fn(loads (W, L, E), forecast (W, L, E)) -> (W, L, G, E) tokens per rank of a window of steps (the
    forecast is the causal layer-ahead transition forecast PROBE's arm uses); local_L: the all-to-all's local
    activation rate per layer (None = 1/G)."""
    s = trace.spec
    tokens, _ = step_meta(trace)
    work = step_work(trace)
    T, L = tokens.size, s.num_layers
    work_T = {f: np.broadcast_to(getattr(work, f), (T,)) for f in ("batch", "seq_len", "context_len")}
    out = np.empty((T, L))
    opts = dataclasses.replace(probe_options(dep.link), roofline="rank")
    for t0, lw, pw in step_windows(trace, WINDOW, 0.8, None):
        W = lw.shape[0]
        counts = counts_fn(lw, pw["probe_pred"]).reshape(W * L, dep.ep, s.num_experts)
        wl = Workload(**{f: np.repeat(v[t0:t0 + W], L) for f, v in work_T.items()})
        o = opts if local_L is None else dataclasses.replace(opts, local_fraction=np.tile(local_L, W))
        c = layer_cost(counts, model=dep.model, hw=dep.hw, work=wl, opts=o)
        out[t0:t0 + W] = (c.dispatch + c.ffn + c.combine).reshape(W, L)
    return out


def price_shares(trace: Trace, dep: Deployment, share_LEG: np.ndarray, *, local_L: np.ndarray | None = None
                 ) -> np.ndarray:
    """price_steps with each expert's tokens split by share_LEG (L, E, G)."""
    return price_steps(trace, dep, lambda lw, _: assignment(lw, share_LEG), local_L=local_L)


def placement_candidates(trace: Trace, dep: Deployment, regime: Regime) -> tuple[list[Candidate], PlacementRun | None]:
    """Static EP, EPLB (one-shot, windowed), MoE-GPS (distribution, token), PROBE on the trace (module docstring)."""
    names = [*NAMES.values(), ("MoE-GPS distribution duplication", "MoE-GPS"),
             ("MoE-GPS token-to-expert duplication", "MoE-GPS"),
             ("co-activation planner (weight-read bound)", "routecast place (decode regime)")]
    if dep.ep < 2:
        return [not_applicable(n, sy, "placement", "EP 1: every expert is on one device, nothing to place")
                for n, sy in names], None
    if not regime.fits:
        return [not_applicable(n, sy, "placement", f"the experts do not fit ({regime.resident_share:.0%} resident): "
                               "replication needs spare memory; see caching") for n, sy in names], None
    s, m = trace.spec, dep.model
    t0 = time.perf_counter()
    res = compare_methods(trace, ep=dep.ep, hw=dep.hw, model=m, link=dep.link, keep_loads=False)
    cmp_s = time.perf_counter() - t0
    tokens = res["tokens_T"].astype(np.float64)
    T = tokens.size
    work = step_work(trace)
    attn = attention_time(m, dep.hw, work, probe_options(dep.link), dep.ep, T)[0]
    L_m = m.num_moe_layers
    out: list[Candidate] = []
    for key, (name, system) in NAMES.items():
        r = res["methods"][key]
        out.append(Candidate(
            name=name, system=system, family="placement", value=_per_token(r["moe_s_TL"], attn, tokens, L_m),
            deployable=key != "probe_oracle",
            artifact={"static": "nothing to deploy (the engine's default sharding)",
                      "eplb_once": "sglang-init-expert-location.json (EPLB of the first steps) + sglang-flags.txt",
                      "eplb_window": "sglang-flags.txt (--enable-eplb, rebalance interval)",
                      "probe_pred": "routecast ep run --plans probe (no engine runs PROBE yet)",
                      "probe_oracle": "none (needs the step's routing before it runs)"}[key],
            detail={"ir": float(r["ir_TL"].mean()), "exposed_us_per_layer": float(r["exposed_s_TL"].mean() * 1e6),
                    "mb_moved_per_step": float(r["bytes_T"].mean() / 1e6),
                    "planner_ms_per_step": float(r["planner_s_T"].mean() * 1e3)}))
    # statistics for MoE-GPS and the exported plans: the whole trace's and the first fifth's loads
    interval = int(res["settings"]["eplb_interval"])
    tot = np.zeros((s.num_layers, s.num_experts))
    early = np.zeros_like(tot)
    early_steps: list[np.ndarray] = []
    for a, lw, _ in step_windows(trace, WINDOW, 0.8, {}):
        tot += lw.sum(axis=0)
        early += lw[: max(0, interval - a)].sum(axis=0)
        early_steps.append(lw[: max(0, interval - a)])
    redundant = max(1, min(2, regime.spare_slots_per_rank))
    mg = moegps_plan(early, dep.ep, redundant_per_rank=redundant, layer_ids=s.layer_ids)
    moe = price_shares(trace, dep, plan_shares(mg))
    out.append(Candidate(name="MoE-GPS distribution duplication", system="MoE-GPS", family="placement",
                         value=_per_token(moe, attn, tokens, L_m),
                         artifact="moegps-plan.json (slot plan; `routecast ep run --plans moegps`)",
                         detail={"redundant_per_rank": redundant, "statistics_steps": interval}))
    out.append(_token_candidate(dep, regime, out[0].value))
    out.append(_coact_candidate(trace, dep, np.concatenate(early_steps), redundant, attn, tokens, interval))
    plans = {"static": static_plan(s.num_layers, s.num_experts, dep.ep, s.layer_ids), "moe-gps": mg,
             "eplb_once": eplb_plan(early, dep.ep, redundant_per_rank=2, layer_ids=s.layer_ids),
             "eplb_window": eplb_plan(tot, dep.ep, redundant_per_rank=2, layer_ids=s.layer_ids)}
    for c in out:
        c.detail["compare_s"] = cmp_s
    return out, PlacementRun(loads_LE=tot, early_LE=early, plans=plans, attn_T=attn, tokens_T=tokens)


def _coact_candidate(trace: Trace, dep: Deployment, early_NLE: np.ndarray, redundant: int, attn: np.ndarray,
                     tokens: np.ndarray, interval: int) -> Candidate:
    """The weight-read-bound planner (place.coact): fitted on the first steps' loads, copies chosen per step
    by the causal transition forecast, priced like the rest."""
    from routecast.place.coact import RankPrice, coact_counts, fit_coact

    price = RankPrice.of(dep.model, dep.hw)
    t0 = time.perf_counter()
    plan = fit_coact(early_NLE, num_ranks=dep.ep, replicas_per_rank=redundant, price=price)
    fit_s = time.perf_counter() - t0
    moe = price_steps(trace, dep, lambda lw, fc: coact_counts(plan, lw, price, fc))
    return Candidate(name="co-activation planner (weight-read bound)", system="routecast place (decode regime)",
                     family="placement", value=_per_token(moe, attn, tokens, dep.model.num_moe_layers),
                     artifact="coact plan (`routecast ep run`; no engine dispatches per step yet)",
                     detail={"fit_s": fit_s, "replicas_per_rank": redundant, "statistics_steps": interval})


def _token_candidate(dep: Deployment, regime: Regime, static_us: float) -> Candidate:
    """MoE-GPS token-to-expert: its advisor's ratio to no prediction, applied to static EP (module docstring)."""
    from routecast.advise.moegps import advise
    from routecast.common.errors import ConfigError

    name, system = "MoE-GPS token-to-expert duplication", "MoE-GPS"
    try:
        adv = advise(model_profile=dep.model, hardware=dep.hw, gpus=dep.ep, link=dep.link,
                     skewness=max(regime.skewness, 1.0), seq=max(int(round(regime.mean_step_tokens)), 1))
    except ConfigError as e:
        return not_applicable(name, system, "placement", f"the MoE-GPS setting refuses it: {e}")
    toks = [o for o in adv.options if o.strategy == "token" and o.achievable]
    if not toks:
        return not_applicable(name, system, "placement", "no measured token-level predictor accuracy to price")
    best = min(toks, key=lambda o: o.total_us)
    ratio = best.total_us / adv.baseline.total_us
    return Candidate(name=name, system=system, family="placement", value=static_us * ratio,
                     artifact="a token-to-expert predictor in the serving engine (no engine runs it yet)",
                     detail={"moegps_option": best.label, "ratio_to_none": ratio, "accuracy": best.accuracy})


def shuffle_candidates(trace: Trace, dep: Deployment, regime: Regime, *, methods: tuple[str, ...] = SHUFFLE_METHODS,
                       seed: int = 0, attn_T: np.ndarray | None = None, tokens_T: np.ndarray | None = None,
                       ) -> tuple[list[Candidate], dict[str, Any]]:
    """Speculative MoE token shuffling with the best of `methods` (held-out all-to-all bytes) -> one candidate."""
    from routecast.schedule.ceo import CEOConfig
    from routecast.schedule.cocluster import cocluster, evaluate_plan, fit_sample

    name, system = "Speculative MoE token shuffling", "Speculative MoE"
    if dep.ep < 2:
        return [not_applicable(name, system, "shuffle", "EP 1: no all-to-all to shorten")], {}
    if not regime.fits:
        return [not_applicable(name, system, "shuffle", "the experts do not fit: pre-grouping needs every expert "
                               "resident on its rank")], {}
    s = trace.spec
    (train, test), used, _ = trace.heldout_masks("document", (0.8, 0.2), seed=seed)
    if not train.any() or not test.any():
        (train, test), used, _ = trace.heldout_masks("request", (0.8, 0.2), seed=seed)
    fit_rows, _ = fit_sample(trace, train, SHUFFLE_FIT_TOKENS, seed)
    respect = s.n_group > 1 and s.n_group % dep.ep == 0
    scored, plans = [], {}
    for meth in methods:
        t0 = time.perf_counter()
        plan = cocluster(trace, dep.ep, meth, rows=fit_rows, config=CEOConfig(seed=seed), respect_groups=respect)
        fit_s = time.perf_counter() - t0
        ev = evaluate_plan(plan, trace, rows=test)
        plans[meth] = plan
        scored.append((ev["a2a_bytes"], meth, ev, fit_s))
    scored.sort(key=lambda r: r[0])
    _, best, ev, fit_s = scored[0]
    plan = plans[best]
    share = np.zeros((s.num_layers, s.num_experts, dep.ep))
    np.put_along_axis(share, plan.expert_group_LE[:, :, None].astype(np.int64), 1.0, axis=2)
    lar = np.asarray(ev["per_layer"]["lar"], np.float64)
    if attn_T is None or tokens_T is None:
        tokens_T = step_meta(trace)[0].astype(np.float64)
        attn_T = attention_time(dep.model, dep.hw, step_work(trace), probe_options(dep.link), dep.ep, tokens_T.size)[0]
    moe = price_shares(trace, dep, share, local_L=np.where(np.isfinite(lar), lar, 1.0 / dep.ep))
    value = _per_token(moe, attn_T, tokens_T, dep.model.num_moe_layers)
    perm = "routecast permute-experts --model MODEL --plan cocluster-plan.json --out MODEL-permuted"
    return [Candidate(name=f"{name} ({best})", system=system, family="shuffle", value=value,
                      artifact=f"cocluster-plan.json + `{perm}`",
                      detail={"partitioner": best, "split": used, "held_out_lar": float(np.nanmean(lar)),
                              "fit_s": fit_s, "respect_groups": respect,
                              "partitioners": {m: {"a2a_bytes": b, "lar": e["lar"], "fit_s": f}
                                               for b, m, e, f in scored}})], {"plan": plan, "method": best}


def finite(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x)
