"""eMoE's quality on a real model: perplexity per domain with only some experts resident and fallback routing.

Legend: W prompts (text windows of S tokens), N task types, L MoE layers, E experts, K top-k.

Setup (``run_quality``): the model sees a stream of held-out prompts (``TextConfig``: windows of corpus
documents, tasks mixed in a seeded arrival order; default the val split, which the built-in models never
trained on). Before it, a warm-up stream from other documents (the test split) is run on the full model:
its routing fits eMoE's predictor (``predict/emoe.py``: keyword task extraction and the eMoE-A transformer),
seeds the predictor's and LRU's history, and its text is the sensitivity profile's (``profile.py``).

Every p prompts the resident experts are chosen again, the same number per layer for every choice
(``cache/emoe.py``), and the next p prompts run with them (``RoutingOverride``: a token routed to a non-resident
expert falls back to its best resident one):
- emoe: eq. 2 over the p prompts to come (their input tokens per extracted task, W_o = 0: perplexity is
  measured teacher-forced, nothing is generated), f from the eMoE-A forecast of each task from its latest
  prompt, s from the profile; top-L per layer, routing-sensitive layers kept fuller;
- emoe-flat: the same without the task-aware part (s = 1 everywhere, the same L in every layer);
- random: L experts per layer drawn uniformly (seeded);
- lru: the L experts each layer's router asked for most recently;
- oracle: the L experts the full model actually uses most on the p prompts to come (an upper bound for a
  predictor, not a policy).
Reported per choice and budget: perplexity per domain and overall, next-token agreement with the full model
(the paper's accuracy is similarity to the full model's output), and the share of routed slots that fell back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from routecast.cache.emoe import (
    LRUState,
    check_residency,
    expected_tokens,
    layer_budgets,
    random_resident,
    sensitivity_weights,
    top_l,
)
from routecast.common.errors import ConfigError
from routecast.predict.emoe import EmoeConfig, EmoeNet, TaskExtractor, dist_by_group, fit_net
from routecast.runtime.emoe.profile import Profile, TextConfig, profile_sensitivity, text_windows, window_nll
from routecast.trace.override import RoutingOverride


@dataclass(frozen=True, kw_only=True)
class QualityConfig:
    """What to measure: budgets (shares of each layer's experts resident), choices, refresh periods p, texts."""

    budgets: tuple[float, ...] = (0.25, 0.5, 0.75)
    residency: tuple[str, ...] = ("emoe", "random", "lru", "oracle")
    period: int = 1
    reuse_periods: tuple[int, ...] = ()  # extra p values, run at reuse_budget for every choice
    reuse_budget: float = 0.5
    threshold: float = 0.85
    eval_text: TextConfig = field(default_factory=TextConfig)
    warmup_text: TextConfig = field(default_factory=lambda: TextConfig(split="test"))
    predictor: EmoeConfig = field(default_factory=EmoeConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        check_residency(list(self.residency))
        for b in (*self.budgets, self.reuse_budget):
            if not 0 < b <= 1:
                raise ConfigError(f"budget {b}; expected a share of the experts in (0, 1].")
        if self.period < 1 or any(p < 1 for p in self.reuse_periods):
            raise ConfigError(f"period {self.period} / {self.reuse_periods}; expected whole numbers of prompts >= 1.")


class _Stream:
    """Runs prompts through the model under a RoutingOverride and keeps what the routers asked for."""

    def __init__(self, model: Any, ov: RoutingOverride, windows: torch.Tensor) -> None:
        self.model, self.ov, self.windows = model, ov, windows
        self.S = windows.shape[1] - 1

    def run(self, idx: np.ndarray, resident_LE: np.ndarray | None) -> tuple[np.ndarray, torch.Tensor, np.ndarray]:
        """-> (NLL per window, argmax next tokens [w, S], desired routing (w, L, E) distributions)."""
        self.ov.set_resident(resident_LE)
        self.ov.desired()  # forget anything earlier
        nll, lp = window_nll(self.model, self.windows[torch.from_numpy(idx)])
        ids = np.concatenate(self.ov.desired())  # (w * S, L, K): window-major rows
        group = np.repeat(np.arange(len(idx)), self.S)
        return nll, lp.argmax(-1), dist_by_group(ids, group, len(idx), self.ov.spec.num_experts)


def _forecast(net: EmoeNet, prev_NLE: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        p = torch.as_tensor(prev_NLE, dtype=torch.float32)
        return net(net.inputs(p, None), torch.arange(prev_NLE.shape[0])).softmax(-1).double().numpy()


def _one_run(st: _Stream, choice: str, frac: float, period: int, ctx: dict[str, Any], seed: int) -> dict[str, Any]:
    """Stream the eval prompts with one residency choice, budget and period -> per-window NLL and agreement."""
    s = st.ov.spec
    L, E, K, N = s.num_layers, s.num_experts, s.top_k, len(ctx["tasks"])
    W = len(st.windows)
    nll = np.zeros(W)
    agree = np.zeros(W)
    prev = ctx["warm_last_NLE"].copy()
    lru = LRUState(L, E)
    for i, d in enumerate(ctx["warm_ids"]):  # the warm-up traffic, oldest first
        lru.observe(d, tick=i - len(ctx["warm_ids"]))
    rng = np.random.default_rng(seed)
    resident_share, st.ov.rerouted_L[:], st.ov.slots_L[:] = [], 0, 0
    for a in range(0, W, period):
        idx = np.arange(a, min(W, a + period))
        ext = ctx["extracted"][idx]
        tokens_N = np.bincount(ext, minlength=N).astype(np.float64) * st.S
        if choice in ("emoe", "emoe-flat"):
            sens = ctx["sensitive_NL"] if choice == "emoe" else np.ones_like(ctx["sensitive_NL"])
            budgets = layer_budgets(frac, L, E, K, sensitivity_weights(sens, tokens_N))
            f = _forecast(ctx["net"], prev)
            res = top_l(expected_tokens(f, tokens_N, sens), budgets, expected_tokens(f, tokens_N, np.ones_like(sens)))
        else:
            budgets = layer_budgets(frac, L, E, K)
            if choice == "random":
                res = random_resident(budgets, E, rng)
            elif choice == "lru":
                res = lru.resident(budgets)
            else:  # oracle: what the full model uses on these prompts
                res = top_l(ctx["true_WLE"][idx].sum(0), budgets)
        resident_share.append(res.sum() / (L * E))
        out, top1, dist = st.run(idx, res)
        nll[idx] = out
        agree[idx] = (top1 == ctx["full_top1"][idx]).double().mean(1).numpy()
        for j, w in enumerate(idx):  # history: the routers' own choices on these prompts
            prev[ctx["extracted"][w]] = dist[j]
        ids_TLK = _dist_to_ids(dist)
        for j in range(len(idx)):
            lru.observe(ids_TLK[j:j + 1], tick=float(a + j))
    return {"nll": nll, "agree": agree, "resident_share": float(np.mean(resident_share)),
            "fallback_share": float(st.ov.rerouted_L.sum() / max(1, st.ov.slots_L.sum()))}


def _dist_to_ids(dist_WLE: np.ndarray) -> np.ndarray:
    """(W, L, E) distributions -> (W, L, E) 'ids' where expert e appears iff it was used (-1 elsewhere)."""
    E = dist_WLE.shape[-1]
    return np.where(dist_WLE > 0, np.arange(E)[None, None, :], -1).astype(np.int64)


def _summary(tasks: list[str], task_of: np.ndarray, nll: np.ndarray, agree: np.ndarray, S: int) -> dict[str, Any]:
    per = {t: {"ppl": float(np.exp(nll[task_of == n].sum() / (S * (task_of == n).sum()))),
               "agreement": float(agree[task_of == n].mean())} for n, t in enumerate(tasks)}
    return {"per_task": per, "ppl": float(np.exp(nll.sum() / (S * len(nll)))), "agreement": float(agree.mean())}


def run_quality(model: Any, tokenizer: Any, cfg: QualityConfig, *, progress: bool = True,
                profile: Profile | None = None) -> dict[str, Any]:
    """Measure perplexity under fallback for every (choice, budget) and the reuse periods (module docstring)."""
    tasks, warm, warm_task, _ = text_windows(tokenizer, cfg.warmup_text)
    etasks, evalw, eval_task, edocs = text_windows(tokenizer, cfg.eval_text)
    if etasks != tasks:
        raise ConfigError(f"eval text has tasks {etasks}, warm-up text {tasks}; expected the same task types.")
    N = len(tasks)
    with RoutingOverride(model, record=True) as ov:
        s = ov.spec
        low = [b for b in (*cfg.budgets, *([cfg.reuse_budget] if cfg.reuse_periods else [])) if b * s.num_experts < s.top_k - 1e-9]
        if low:
            raise ConfigError(f"--budget {low[0]:.1%} keeps fewer than top-k = {s.top_k} of {s.num_experts} experts per "
                              f"layer; expected at least {s.top_k / s.num_experts:.1%} so every token keeps {s.top_k} experts.")
        if profile is None:
            profile = profile_sensitivity(model, tasks, warm, warm_task, threshold=cfg.threshold, seed=cfg.seed,
                                          progress=progress)
        warm_st = _Stream(model, ov, warm)
        _, _, warm_dist = warm_st.run(np.arange(len(warm)), None)
        extractor = TaskExtractor().fit([w.numpy() for w in warm], warm_task, N)
        net = fit_net(warm_dist, warm_task, N, cfg.predictor)
        last = np.full((N, s.num_layers, s.num_experts), 1.0 / s.num_experts)
        for i, t in enumerate(warm_task):
            last[t] = warm_dist[i]
        st = _Stream(model, ov, evalw)
        full_nll, full_top1, true_dist = st.run(np.arange(len(evalw)), None)
        extracted = np.array([extractor.extract(w[:-1].numpy()) for w in evalw], np.int64)
        ctx = {"tasks": tasks, "warm_last_NLE": last, "warm_ids": [_dist_to_ids(warm_dist[i:i + 1]) for i in range(len(warm))],
               "extracted": extracted, "sensitive_NL": profile.sensitive_NL, "net": net, "true_WLE": true_dist,
               "full_top1": full_top1}
        runs = [(c, b, cfg.period) for b in cfg.budgets for c in cfg.residency]
        runs += [(c, cfg.reuse_budget, p) for p in cfg.reuse_periods for c in cfg.residency
                 if (c, cfg.reuse_budget, p) not in runs]
        rows = []
        for c, b, p in tqdm(runs, desc="quality", disable=not progress, leave=False):
            r = _one_run(st, c, b, p, ctx, cfg.seed)
            rows.append({"choice": c, "budget": b, "period": p, "resident_share": r["resident_share"],
                         "fallback_share": r["fallback_share"],
                         **_summary(tasks, eval_task, r["nll"], r["agree"], st.S)})
    S = st.S
    full = _summary(tasks, eval_task, full_nll, np.ones(len(evalw)), S)
    model_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    return {"model": s.name, "layers": s.num_layers, "experts": s.num_experts, "top_k": s.top_k,
            "routed_expert_bytes": int(s.expert_bytes * s.num_layers * s.num_experts), "model_bytes": int(model_bytes),
            "tasks": tasks, "eval": {"split": cfg.eval_text.split, "windows": len(evalw), "tokens_per_window": S,
                                     "tokens": int(len(evalw) * S), "documents": len(set(edocs))},
            "warmup": {"split": cfg.warmup_text.split, "windows": len(warm), "tokens": int(len(warm) * S)},
            "task_extraction_accuracy": float((extracted == eval_task).mean()),
            "profile": profile.as_dict(), "full": full, "rows": rows}


def format_quality(res: dict[str, Any]) -> str:
    """Perplexity table: one row per (budget, period, choice) plus the full model; columns the domains."""
    tasks = res["tasks"]
    head = f"{'budget':>6} {'p':>3} {'choice':<9} | " + " ".join(f"{t:>7}" for t in tasks) + \
        f" | {'all':>7} {'vs full':>8} {'agree':>6} {'fallback':>8}"
    full = res["full"]
    lines = [f"{res['model']}: perplexity on {res['eval']['tokens']} held-out tokens ({res['eval']['windows']} prompts "
             f"of {res['eval']['tokens_per_window']} tokens, {res['eval']['split']} split, {res['eval']['documents']} "
             f"documents); task extraction accuracy {res['task_extraction_accuracy']:.3f}; routed experts are "
             f"{res['routed_expert_bytes'] / res['model_bytes']:.1%} of the model's parameter bytes", head, "-" * len(head),
             f"{'100%':>6} {'-':>3} {'full':<9} | " + " ".join(f"{full['per_task'][t]['ppl']:>7.2f}" for t in tasks)
             + f" | {full['ppl']:>7.2f} {'':>8} {1.0:>6.3f} {0.0:>8.3f}"]
    for r in res["rows"]:
        lines.append(f"{r['budget']:>6.0%} {r['period']:>3} {r['choice']:<9} | "
                     + " ".join(f"{r['per_task'][t]['ppl']:>7.2f}" for t in tasks)
                     + f" | {r['ppl']:>7.2f} {r['ppl'] / full['ppl'] - 1:>+8.1%} {r['agreement']:>6.3f} "
                       f"{r['fallback_share']:>8.3f}")
    return "\n".join(lines)
