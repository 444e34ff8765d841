"""eMoE's expert prediction (§3.2): task-type extraction, a small transformer over expert sequences, periodic invocation.

Legend: R requests (prompts), L MoE layers, E experts, K top-k, N task types, V vocabulary.

- Task-type extraction (§3.2.1): each task type has profiled keywords; a prompt gets the task whose keywords
  it matches most often. Our corpus prompts carry no instruction ("Summarize ..."), so the keywords are the
  token ids most characteristic of each task in the training requests (in-task frequency times the log-ratio
  of in-task to overall frequency, smoothed); ties and prompts with no match go to the most common training task. ``TaskExtractor``.
- The expert predictor (§3.2.2) is a transformer encoder over a sequence of per-layer expert tokens: a layer
  token is the expert-id embeddings of that layer weighted by the prompt's expert distribution there (the
  k-hot expert ids of its tokens, averaged), plus a layer and a task embedding; one head of E logits per
  layer, trained with soft cross-entropy on distributions. Two modes, as in the paper:
  * eMoE-A (request horizon): all layers of the next prompt from the previous prompt's whole sequence
    e_1..e_m (eq. 1), full attention;
  * eMoE-L (layer horizon): layer i from layer i-1 of the same prompt, e_i = f(e_{i-1}), causal attention over
    [previous prompt's e_1, e_1, ..., e_{i-1}]; layer 1 from the previous prompt's layer 1.
  "Previous prompt" is the newest prompt of the same (extracted) task, as far as its routing has been seen.
- Periodic invocation (§3.3): the predictor runs when prompt number 0, p, 2p, ... (in arrival order) starts;
  the forecast it made (one distribution per task type and layer, eMoE's Figure 11 array) is reused for every
  token until the next invocation. A token's forecast is its prompt's task row.

``EmoePredictor`` plugs into the causal harness as ``emoe`` (eMoE-A) and ``emoe-l`` (eMoE-L).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from routecast.common.errors import ConfigError
from routecast.predict.forecast import Forecast
from routecast.predict.harness import LAYER, REQUEST, Predictor, StepRouting, StepView
from routecast.predict.neural import torch_threads
from routecast.trace import MoESpec, Trace

MODES = ("A", "L")


# ------------------------------------------------------------------------------------------- task extraction
class TaskExtractor:
    """Keyword task-type extraction: fit(prompts, tasks) then extract(prompt) -> task index (or -1 before fit).

    keywords: keyword token ids kept per task; alpha: add-alpha smoothing of the frequency ratio.
    """

    def __init__(self, *, keywords: int = 64, alpha: float = 1.0, min_count: int = 2) -> None:
        self.keywords, self.alpha, self.min_count = int(keywords), float(alpha), int(min_count)
        self.table_NV: np.ndarray | None = None  # bool: token v is a keyword of task n
        self.default = -1

    def fit(self, prompts: list[np.ndarray], tasks: np.ndarray, num_tasks: int) -> TaskExtractor:
        """prompts: R int arrays of token ids; tasks: int (R,) true task (-1 = unknown, skipped)."""
        tasks = np.asarray(tasks, np.int64)
        ok = [i for i in range(len(prompts)) if 0 <= tasks[i] < num_tasks and len(prompts[i])]
        if not ok:
            raise ConfigError("task extraction: no training prompt has a known task; expected tasks in the trace.")
        V = int(max(int(np.max(prompts[i])) for i in ok)) + 1
        c_NV = np.zeros((num_tasks, V))
        for i in ok:
            np.add.at(c_NV[tasks[i]], np.asarray(prompts[i], np.int64), 1.0)
        tot = c_NV.sum(0)
        a = self.alpha
        p_NV = (c_NV + a) / (c_NV.sum(1, keepdims=True) + a * V)
        ratio = np.log(p_NV) - np.log((tot + a) / (tot.sum() + a * V))
        # Keyness: frequent in the task and specific to it (the token's term of KL(task || all)).
        score = np.where((c_NV >= self.min_count) & (ratio > 0), p_NV * ratio, -np.inf)
        top = np.argsort(-score, axis=1, kind="stable")[:, : self.keywords]
        table = np.zeros((num_tasks, V), bool)
        np.put_along_axis(table, top, np.isfinite(np.take_along_axis(score, top, 1)), axis=1)
        self.table_NV = table
        self.default = int(np.bincount(tasks[ok], minlength=num_tasks).argmax())
        return self

    def extract(self, prompt: np.ndarray) -> int:
        """Task index whose keywords the prompt's token ids match most often (ties: the most common task)."""
        if self.table_NV is None:
            return -1
        ids = np.asarray(prompt, np.int64)
        ids = ids[(ids >= 0) & (ids < self.table_NV.shape[1])]
        hits = self.table_NV[:, ids].sum(1)
        if hits.max(initial=0) == 0:
            return self.default
        best = np.flatnonzero(hits == hits.max())
        return self.default if self.default in best else int(best[0])


# ------------------------------------------------------------------------------------------- distributions
def request_table(trace: Trace) -> dict[str, Any]:
    """Per request, in arrival order: id, true task, prompt token ids, expert distribution (R, L, E).

    Arrival order = first step, then request id. Distribution: share of the request's routed slots per
    expert in each layer (dropped slots ignored; a layer with no slot is uniform).
    """
    req, step = trace.tokens["request"], trace.step
    ids, inv = np.unique(req, return_inverse=True)
    first = np.full(ids.size, np.iinfo(np.int64).max)
    np.minimum.at(first, inv, step.astype(np.int64))
    order = np.lexsort((ids, first))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    r = rank[inv]
    return {"request": ids[order], "task": _first_value(trace.tokens["task"].astype(np.int64), r, ids.size),
            "prompts": _prompts(trace, r, ids.size),
            "dist": dist_by_group(trace.experts_TLK, r, ids.size, trace.spec.num_experts)}


def _first_value(col: np.ndarray, r: np.ndarray, R: int) -> np.ndarray:
    out = np.full(R, -1, np.int64)
    out[r[::-1]] = col[::-1]  # the first row of each request wins
    return out


def _prompts(trace: Trace, r: np.ndarray, R: int) -> list[np.ndarray]:
    """Prefill token ids (phase 0, by position) of each request; its first row's token when it has no prefill."""
    tok = trace.tokens["token_id"].astype(np.int64)
    order = np.lexsort((trace.tokens["position"], r))
    pre = order[trace.tokens["phase"][order] == 0]
    parts = np.split(tok[pre], np.searchsorted(r[pre], np.arange(1, R)))
    first = np.full(R, -1, np.int64)
    first[r[order][::-1]] = tok[order][::-1]
    return [p if p.size else first[k:k + 1] for k, p in enumerate(parts)]


def counts_by_group(experts_TLK: np.ndarray, group_T: np.ndarray, G: int, E: int) -> np.ndarray:
    """float (G, L, E) routed slots per group, layer and expert (dropped slots, id -1, ignored)."""
    T, L, K = experts_TLK.shape
    ids = experts_TLK.astype(np.int64)
    ok = ids >= 0
    key = (np.asarray(group_T, np.int64)[:, None, None] * L + np.arange(L)[None, :, None]) * E + np.where(ok, ids, 0)
    return np.bincount(key[ok], minlength=G * L * E).reshape(G, L, E).astype(np.float64)


def dist_by_group(experts_TLK: np.ndarray, group_T: np.ndarray, G: int, E: int) -> np.ndarray:
    """(G, L, E) share of each group's routed slots per expert and layer (uniform where a group has none)."""
    c = counts_by_group(experts_TLK, group_T, G, E)
    tot = c.sum(-1, keepdims=True)
    return np.where(tot > 0, c / np.maximum(tot, 1.0), 1.0 / E)


# ------------------------------------------------------------------------------------------- the network
@dataclass(frozen=True, kw_only=True)
class EmoeConfig:
    """Transformer size and training: d_model, heads, layers, epochs (full batch Adam), lr, pairs per prompt, seed."""

    mode: str = "A"
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    epochs: int = 300
    lr: float = 3e-3
    history: int = 3  # training pairs per prompt: it and each of its last `history` same-task predecessors
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"eMoE mode {self.mode!r}; expected one of {MODES}.")
        if self.d_model % self.heads or self.epochs < 1 or self.history < 1:
            raise ConfigError(f"EmoeConfig {self} is invalid; expected d_model divisible by heads, epochs and history >= 1.")


class EmoeNet(nn.Module):
    """Sequence of L layer tokens (distribution-weighted expert-id embeddings + layer + task) -> (L, E) logits."""

    def __init__(self, L: int, E: int, N: int, cfg: EmoeConfig) -> None:
        super().__init__()
        self.L, self.E, self.causal = L, E, cfg.mode == "L"
        d = cfg.d_model
        self.expert = nn.Parameter(torch.randn(L, E, d) * 0.1)  # expert-id embeddings, one table per layer
        self.pos = nn.Parameter(torch.zeros(L, d))
        self.task = nn.Embedding(N + 1, d)  # index N = unknown task
        layer = nn.TransformerEncoderLayer(d, cfg.heads, 2 * d, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.head = nn.Parameter(torch.randn(L, d, E) * 0.05)
        self.bias = nn.Parameter(torch.zeros(L, E))
        mask = torch.triu(torch.full((L, L), float("-inf")), 1)
        self.register_buffer("mask", mask, persistent=False)

    def inputs(self, prev_BLE: torch.Tensor, cur_BLE: torch.Tensor | None) -> torch.Tensor:
        """Mode A: the previous prompt's L layers. Mode L: [previous layer 0, current layers 0..L-2]."""
        if not self.causal:
            return prev_BLE
        assert cur_BLE is not None
        return torch.cat([prev_BLE[:, :1], cur_BLE[:, :-1]], 1)

    def forward(self, seq_BLE: torch.Tensor, task_B: torch.Tensor) -> torch.Tensor:
        # Mode L's token j holds layer j-1's distribution: embed it with layer j-1's expert table.
        shift = torch.arange(self.L)
        if self.causal:
            shift = torch.clamp(shift - 1, min=0)
        x = torch.einsum("ble,lec->blc", seq_BLE, self.expert[shift]) + self.pos + self.task(task_B)[:, None]
        h = self.body(x, mask=self.mask if self.causal else None)
        return torch.einsum("bld,lde->ble", h, self.head) + self.bias


def training_pairs(dist_RLE: np.ndarray, tasks_R: np.ndarray, history: int) -> tuple[np.ndarray, np.ndarray]:
    """(prev index, target index) pairs: each prompt after each of its last `history` same-task predecessors."""
    prev, tgt = [], []
    for t in np.unique(tasks_R):
        idx = np.flatnonzero(tasks_R == t)
        for j in range(1, idx.size):
            for h in range(1, min(history, j) + 1):
                prev.append(idx[j - h])
                tgt.append(idx[j])
    return np.asarray(prev, np.int64), np.asarray(tgt, np.int64)


def fit_net(dist_RLE: np.ndarray, tasks_R: np.ndarray, N: int, cfg: EmoeConfig) -> EmoeNet:
    """Train an EmoeNet on a prompt sequence (arrival order): next same-task prompt's distribution from the last."""
    R, L, E = dist_RLE.shape
    tasks = np.where((tasks_R >= 0) & (tasks_R < N), tasks_R, N)
    prev, tgt = training_pairs(dist_RLE, tasks, cfg.history)
    with torch_threads(cfg.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        net = EmoeNet(L, E, N, cfg)
        if prev.size == 0:
            return net.eval()
        d = torch.as_tensor(dist_RLE, dtype=torch.float32)
        p_in = d[torch.from_numpy(prev)]
        y = d[torch.from_numpy(tgt)]
        cur = y if cfg.mode == "L" else None
        seq = net.inputs(p_in, cur)
        task = torch.from_numpy(tasks[tgt])
        opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
        for _ in range(cfg.epochs):
            opt.zero_grad()
            loss = -(y * net(seq, task).log_softmax(-1)).sum(-1).mean()
            loss.backward()
            opt.step()
    return net.eval()


# ------------------------------------------------------------------------------------------- the predictor
class EmoePredictor(Predictor):
    """eMoE-A (``emoe``, request horizon) or eMoE-L (``emoe-l``, layer horizon), invoked every `period` prompts.

    fit(trace): task keywords and the transformer on the training prompts (true tasks). Online state: each
    seen prompt's extracted task and its routing so far; at an invocation, one forecast per task type
    (N, L, E), reused until the next. Tokens of a prompt get its extracted task's row.
    """

    name: ClassVar[str] = "emoe"
    horizon: ClassVar[str] = REQUEST

    def __init__(self, spec: MoESpec, config: EmoeConfig | None = None, *, period: int = 1) -> None:
        super().__init__(spec)
        self.config = config or EmoeConfig()
        if int(period) < 1:
            raise ConfigError(f"eMoE period p = {period}; expected a whole number of prompts >= 1.")
        self.period = int(period)
        self.net: EmoeNet | None = None
        self.extractor = TaskExtractor()
        self.N = 0
        self.reset()

    def fit(self, trace: Trace) -> EmoePredictor:
        tab = request_table(trace)
        self.N = max(1, len(trace.task_names))
        self.extractor.fit(tab["prompts"], tab["task"], self.N)
        self.net = fit_net(tab["dist"], tab["task"], self.N, self.config)
        # Starting history: each task's latest training prompt (eMoE's predictor has seen the traffic before).
        L, E = self.spec.num_layers, self.spec.num_experts
        self._fit_last = np.full((self.N, L, E), 1.0 / E)
        for n in range(self.N):
            idx = np.flatnonzero(tab["task"] == n)
            if idx.size:
                self._fit_last[n] = tab["dist"][idx[-1]]
        self.reset()
        return self

    def reset(self) -> None:
        L, E = self.spec.num_layers, self.spec.num_experts
        self._task_of: dict[int, int] = {}  # request -> extracted task
        self._counts: dict[int, np.ndarray] = {}  # request -> (L, E) routed slots seen so far
        self._last: dict[int, int] = {}  # task -> newest request of that task
        self._arrival: dict[int, int] = {}  # request -> arrival index (order of first appearance)
        self._seen = 0
        last = getattr(self, "_fit_last", None)
        self._prev_NLE = None if last is None else last.copy()
        self._held_NLE = None if last is None else self._prev_NLE.copy()
        self._invoking = False  # eMoE-L: this step invokes the predictor
        self._prev_at_invoke: np.ndarray | None = None
        self._E, self._L = E, L

    # -- online bookkeeping
    def _new_requests(self, view: StepView) -> list[int]:
        """Register the view's unseen requests (extracting their task from their prompt tokens), in order."""
        reqs, first = np.unique(view.request, return_index=True)
        new = [int(r) for r in reqs[np.argsort(first, kind="stable")].tolist() if int(r) not in self._task_of]
        for r in new:  # per new prompt
            self._task_of[r] = self.extractor.extract(view.token_id[view.request == r])
            self._arrival[r] = len(self._arrival)
        return new

    def _previous(self) -> np.ndarray:
        """(N, L, E): each task's latest prompt's distribution so far (the fitted history where none seen)."""
        prev = self._prev_NLE.copy()
        for n, r in self._last.items():
            c = self._counts.get(r)
            if c is not None and 0 <= n < self.N:
                tot = c.sum(-1, keepdims=True)
                prev[n] = np.where(tot > 0, c / np.maximum(tot, 1.0), prev[n])
        return prev

    def _net_forecast(self, prev_NLE: np.ndarray, cur_NLE: np.ndarray | None) -> np.ndarray:
        with torch.no_grad(), torch_threads(self.config.threads):
            p = torch.as_tensor(prev_NLE, dtype=torch.float32)
            c = None if cur_NLE is None else torch.as_tensor(cur_NLE, dtype=torch.float32)
            out = self.net(self.net.inputs(p, c), torch.arange(self.N)).softmax(-1)
        return out.double().numpy()

    def _step_start(self, view: StepView) -> bool:
        """Bookkeeping at a step's first call; True when this step invokes the predictor."""
        if self.net is None or self._prev_NLE is None:
            raise ConfigError(f"predictor '{self.name}' is not fitted; call fit(train_trace) first.")
        invoke = False
        for _ in self._new_requests(view):
            invoke |= self._seen % self.period == 0
            self._seen += 1
        return invoke

    def _tasks_T(self, view: StepView) -> np.ndarray:
        """int (T,) extracted task of each token's prompt (the most common task where none was extracted)."""
        reqs, inv = np.unique(view.request, return_inverse=True)
        per = np.array([self._task_of[int(r)] for r in reqs.tolist()], np.int64)  # per request, not per token
        per = np.where((per >= 0) & (per < self.N), per, self.extractor.default)
        return per[inv]

    def _token_forecast(self, view: StepView, dist_NLE: np.ndarray) -> Forecast:
        return Forecast(top_k=self.spec.top_k, scores_TLE=dist_NLE[self._tasks_T(view)])

    def predict(self, view: StepView) -> Forecast:
        if self._step_start(view):
            self._held_NLE = self._net_forecast(self._previous(), None)
        return self._token_forecast(view, self._held_NLE)

    def observe(self, routing: StepRouting) -> None:
        reqs, local = np.unique(routing.request, return_inverse=True)
        got = counts_by_group(routing.experts_TLK, local, reqs.size, self._E)
        for i, r in enumerate(reqs.tolist()):  # per request of the step, not per token
            self._counts[r] = self._counts.get(r, 0.0) + got[i]
            n = self._task_of.get(r, -1)
            if n >= 0 and (n not in self._last or self._arrival[r] >= self._arrival[self._last[n]]):
                self._last[n] = r  # the newest prompt of its task seen so far
        keep = set(self._last.values())  # only each task's newest prompt is needed: memory stays O(N L E)
        self._counts = {r: c for r, c in self._counts.items() if r in keep}

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        if self.net is None or self.extractor.table_NV is None:
            raise ConfigError(f"predictor '{self.name}' is not fitted; nothing to save.")
        c = self.config
        meta = {"period": self.period, "tasks": self.N, "default_task": self.extractor.default,
                "config": {k: getattr(c, k) for k in ("mode", "d_model", "heads", "layers", "epochs", "lr",
                                                      "history", "seed", "threads")}}
        tensors = {f"net.{k}": v.detach().numpy().copy() for k, v in self.net.state_dict().items()}
        tensors["keywords"] = self.extractor.table_NV.astype(np.uint8)
        tensors["fit_last"] = self._fit_last
        return meta, tensors

    @classmethod
    def state_schema(cls, spec: MoESpec, meta: dict[str, Any]) -> dict[str, tuple]:
        L, E = spec.num_layers, spec.num_experts
        return {"keywords": (("N", "V"), "iu", ("nonneg",)), "fit_last": (("N", L, E), "f", ("nonneg",))}

    @classmethod
    def from_state(cls, spec: MoESpec, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> EmoePredictor:
        cfg = EmoeConfig(**meta["config"])
        p = EmoeLayerPredictor(spec, cfg, period=int(meta["period"])) if cfg.mode == "L" else \
            EmoePredictor(spec, cfg, period=int(meta["period"]))
        p.N = int(meta["tasks"])
        if tensors["keywords"].shape[0] != p.N:
            raise ValueError(f"keywords has {tensors['keywords'].shape[0]} tasks, meta says {p.N}")
        p.extractor.table_NV = tensors["keywords"].astype(bool)
        p.extractor.default = int(meta["default_task"])
        net = EmoeNet(spec.num_layers, spec.num_experts, p.N, cfg)
        net.load_state_dict({k[4:]: torch.from_numpy(np.array(v)) for k, v in tensors.items() if k.startswith("net.")})
        p.net = net.eval()
        p._fit_last = np.asarray(tensors["fit_last"], np.float64)
        p.reset()
        return p


class EmoeLayerPredictor(EmoePredictor):
    """eMoE-L: layer l of the invoking step from its own layer l-1 (see the module docstring)."""

    name: ClassVar[str] = "emoe-l"
    horizon: ClassVar[str] = LAYER

    def __init__(self, spec: MoESpec, config: EmoeConfig | None = None, *, period: int = 1) -> None:
        super().__init__(spec, replace(config or EmoeConfig(), mode="L"), period=period)

    def predict(self, view: StepView) -> Forecast:
        layer = int(view.layer or 0)
        if layer == 0:
            self._invoking = self._step_start(view)
            if self._invoking:
                self._prev_at_invoke = self._previous()
        if self._invoking:
            # This step's routing of layers < l, per extracted task; tasks absent from the step keep the
            # previous prompt's layers as their "current" ones.
            cur = self._prev_at_invoke.copy()
            if layer:
                tasks = self._tasks_T(view)
                got = dist_by_group(view.experts_TlK, tasks, self.N, self._E)  # (N, l, E)
                present = np.bincount(tasks, minlength=self.N) > 0
                cur[present, :layer] = got[present]
            out = self._net_forecast(self._prev_at_invoke, cur)
            held = self._held_NLE if self._held_NLE is not None else out
            held[:, layer] = out[:, layer]
            self._held_NLE = held
        fc = self._token_forecast(view, self._held_NLE[:, layer:layer + 1])
        return fc


def make_emoe(name: str, spec: MoESpec, *, period: int = 1, seed: int = 0, threads: int = 1,
              epochs: int | None = None) -> EmoePredictor:
    """'emoe' (eMoE-A) or 'emoe-l' (eMoE-L), unfitted."""
    cfg = EmoeConfig(seed=seed, threads=threads, **({} if epochs is None else {"epochs": epochs}))
    if name == "emoe":
        return EmoePredictor(spec, cfg, period=period)
    if name == "emoe-l":
        return EmoeLayerPredictor(spec, cfg, period=period)
    raise ConfigError(f"eMoE predictor {name!r} is unknown; expected 'emoe' or 'emoe-l'.")


def extraction_accuracy(extractor: TaskExtractor, trace: Trace) -> tuple[float, int]:
    """(share of the trace's prompts whose extracted task is their true task, prompts with a known task)."""
    tab = request_table(trace)
    known = tab["task"] >= 0
    got = np.array([extractor.extract(p) for p in tab["prompts"]], np.int64)
    n = int(known.sum())
    return (float((got[known] == tab["task"][known]).mean()) if n else float("nan")), n
