"""MoE-GPS neural token-to-expert predictors (Appendix B): the FFN and the LSTM with sparse attention.

Both start from a token embedding: the MoE model's own input table (frozen, ``embedding="model"``,
read by embeddings.load_input_embeddings) compressed by a linear layer to 128, or a 128-wide table
learned from scratch (``embedding="learned"``) for traces without a model. Then:
- FFN: ReLU -> Linear(128, 64) -> one linear head per MoE layer (64 -> E).
- LSTM: ReLU -> 2-layer LSTM (hidden 64) -> causal self-attention over the LSTM outputs (query = key =
  value, sparse: each token sees at most the last ``window`` tokens of its request) + residual
  Linear(128, 64) of the compressed input -> per-layer heads.
Training: cross-entropy against the k true experts as a multi-label target (1/k on each, so top-1
routing is the paper's case), Adam, early stopping on held-out requests. The prediction is the
softmax over each layer's logits; the predicted set its top-K.

After training the first layer is folded into a per-token table (frozen table x compress weights),
so a saved predictor does not need the checkpoint and inference starts with one gather.

Causality: the LSTM predicts a step before it runs. It keeps, per request, the LSTM state and the
last window outputs of the tokens of past steps (revealed by observe); the step's own tokens are
visible (request horizon), so a prefill step attends causally within itself.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from tqdm.auto import tqdm

from routecast.common.errors import ConfigError
from routecast.predict.forecast import Forecast, multi_hot
from routecast.predict.harness import REQUEST, Predictor, StepRouting, StepView
from routecast.trace import MoESpec, Trace

ARCHS = ("ffn", "lstm")
EMBEDDINGS = ("model", "learned")


@dataclass(frozen=True, kw_only=True)
class NeuralConfig:
    """Architecture, training and inference settings (sizes in elements).

    batch_size: token ids per optimiser step (FFN) or sequences per step (LSTM, each <= window tokens).
    unk_rate: share of training tokens replaced by the unknown-token row (learned embeddings only), so
    that row learns the average routing that unseen tokens get at inference.
    max_cached_requests: requests whose LSTM state is kept between steps (least recently used dropped).
    """

    arch: str = "ffn"
    embedding: str = "model"
    proj_dim: int = 128
    hidden_dim: int = 64
    lstm_layers: int = 2
    window: int = 512
    epochs: int = 40
    patience: int = 3
    val_fraction: float = 0.1
    batch_size: int = 256
    lr: float = 1e-3
    unk_rate: float = 0.02
    seed: int = 0
    threads: int = 1
    progress: bool = True
    max_cached_requests: int = 256

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ConfigError(f"NeuralConfig.arch is {self.arch!r}; expected one of {ARCHS}.")
        if self.embedding not in EMBEDDINGS:
            raise ConfigError(f"NeuralConfig.embedding is {self.embedding!r}; expected one of {EMBEDDINGS}.")
        for f in ("proj_dim", "hidden_dim", "lstm_layers", "epochs", "batch_size", "threads", "max_cached_requests"):
            if getattr(self, f) < 1:
                raise ConfigError(f"NeuralConfig.{f} is {getattr(self, f)}; expected a positive integer.")
        if self.window < 2:
            raise ConfigError(f"NeuralConfig.window is {self.window}; expected at least 2 (a token and one before it).")
        if not 0 <= self.val_fraction < 1 or not 0 <= self.unk_rate < 1 or self.lr <= 0 or self.patience < 1:
            raise ConfigError(
                f"NeuralConfig has val_fraction {self.val_fraction}, unk_rate {self.unk_rate}, lr {self.lr}, "
                f"patience {self.patience}; expected fractions in [0, 1), lr > 0 and patience >= 1."
            )


def ffn_preset(**overrides: Any) -> NeuralConfig:
    """The paper's FFN: 128 -> ReLU -> 64 -> heads; Adam 1e-3, up to 40 epochs with early stopping."""
    return dataclasses.replace(NeuralConfig(arch="ffn"), **overrides)


def lstm_preset(**overrides: Any) -> NeuralConfig:
    """The paper's LSTM: 128 -> ReLU -> 2x LSTM(64) -> attention + residual -> heads, window 512."""
    return dataclasses.replace(NeuralConfig(arch="lstm", batch_size=16), **overrides)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with n torch CPU threads, restoring the caller's setting afterwards."""
    prev = torch.get_num_threads()
    torch.set_num_threads(max(1, int(n)))
    try:
        yield
    finally:
        torch.set_num_threads(prev)


class _Net(nn.Module):
    """First layer (frozen table + compress, or a learned/folded table) and the FFN or LSTM body."""

    def __init__(self, cfg: NeuralConfig, L: int, E: int, n_rows: int, table: torch.Tensor | None) -> None:
        super().__init__()
        self.L, self.E, self.arch = L, E, cfg.arch
        if table is not None:
            self.register_buffer("table", table, persistent=False)
            self.compress = nn.Linear(table.shape[1], cfg.proj_dim)
            self.first: nn.Embedding | None = None
        else:
            self.first = nn.Embedding(n_rows, cfg.proj_dim)
        if cfg.arch == "ffn":
            self.mid = nn.Linear(cfg.proj_dim, cfg.hidden_dim)
        else:
            self.lstm = nn.LSTM(cfg.proj_dim, cfg.hidden_dim, num_layers=cfg.lstm_layers, batch_first=True)
            self.skip = nn.Linear(cfg.proj_dim, cfg.hidden_dim)
        # One Linear for all L heads: the same as L separate 64 -> E heads, in one matmul.
        self.heads = nn.Linear(cfg.hidden_dim, L * E)

    def embed(self, rows: torch.Tensor) -> torch.Tensor:
        if self.first is not None:
            return self.first(rows)
        return self.compress(self.table[rows])

    def fold(self) -> None:
        """Replace frozen table + compress by their product, one row per token (same function)."""
        if self.first is None:
            with torch.no_grad():
                w = self.compress(self.table)
            del self.compress, self.table
            self.first = nn.Embedding.from_pretrained(w, freeze=True)

    def ffn(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (N,) -> logits (N, L, E)."""
        return self.heads(self.mid(F.relu(self.embed(rows)))).view(-1, self.L, self.E)

    def seq(self, rows_BS: torch.Tensor) -> torch.Tensor:
        """Whole sequences from a zero state, full causal attention: rows (B, S) -> logits (B, S, L, E)."""
        x = F.relu(self.embed(rows_BS))
        out, _ = self.lstm(x)
        att = F.scaled_dot_product_attention(out, out, out, is_causal=True)
        B, S = rows_BS.shape
        return self.heads(att + self.skip(x)).view(B, S, self.L, self.E)


def _soft_targets(experts_xLK: np.ndarray, E: int) -> tuple[np.ndarray, np.ndarray]:
    """Multi-label target 1/k on each of the k true experts: float32 (..., L, E) and validity (..., L)."""
    hot = multi_hot(experts_xLK, E).astype(np.float32)
    n = hot.sum(axis=-1)
    return hot / np.maximum(n, 1)[..., None], (n > 0).astype(np.float32)


def _soft_ce(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    ce = -(target * F.log_softmax(logits, dim=-1)).sum(-1)
    return (ce * weight).sum() / weight.sum().clamp_min(1e-12)


class RequestStates:
    """Saved LSTM state of each request, for causal incremental inference, in preallocated pools.

    Slot s holds one request's h, c (layers, H) after its last token, its last R = window-1 LSTM outputs
    in a ring (position = absolute token index mod R) with their absolute indices (-1 = empty), and its
    token count. Pools grow by doubling up to `capacity` slots (at least the number of requests of one
    step); beyond that the least recently used request is dropped and restarts from a zero state.
    """

    def __init__(self, *, layers: int, hidden: int, window: int, capacity: int) -> None:
        self.nl, self.H, self.R, self.capacity = layers, hidden, window - 1, capacity
        self._slot: OrderedDict[int, int] = OrderedDict()
        self._alloc(0)

    def _alloc(self, n: int) -> None:
        old = getattr(self, "h", None)
        h, c = torch.zeros(self.nl, n, self.H), torch.zeros(self.nl, n, self.H)
        out, abs_ = torch.zeros(n, self.R, self.H), torch.full((n, self.R), -1, dtype=torch.int64)
        count = np.zeros(n, np.int64)
        if old is not None:
            m = old.shape[1]
            h[:, :m], c[:, :m], out[:m], abs_[:m], count[:m] = self.h, self.c, self.out, self.abs, self.count
        self.h, self.c, self.out, self.abs, self.count = h, c, out, abs_, count

    def clear(self) -> None:
        self._slot.clear()
        self.abs.fill_(-1)
        self.count[:] = 0

    def gather(self, requests: np.ndarray):
        """States of requests (B,): h0, c0 (layers, B, H), context outputs (B, C, H) with absolute indices
        (B, C) (-1 = none), and tokens seen so far (B,) int64; unknown requests get zeros."""
        slot = np.fromiter((self._slot.get(r, -1) for r in requests.tolist()), np.int64, len(requests))
        have = slot >= 0
        B = len(requests)
        if not have.any():
            return (torch.zeros(self.nl, B, self.H), torch.zeros(self.nl, B, self.H), torch.zeros(B, 0, self.H),
                    torch.zeros(B, 0, dtype=torch.int64), np.zeros(B, np.int64))
        idx = np.where(have, slot, 0)
        seen = np.where(have, self.count[idx], 0)
        s, have_t = torch.from_numpy(idx), torch.from_numpy(have)
        C = min(self.R, int(seen.max()))
        h0 = self.h[:, s] * have_t[None, :, None]
        c0 = self.c[:, s] * have_t[None, :, None]
        ctx_abs = torch.where(have_t[:, None], self.abs[s, :C], -1)
        return h0, c0, self.out[s, :C], ctx_abs, seen

    def _slots_for(self, requests: list[int]) -> np.ndarray:
        for r in requests:  # touch the step's known requests first, so none of them is evicted below
            if r in self._slot:
                self._slot.move_to_end(r)
        cap = max(self.capacity, len(requests))
        out = np.empty(len(requests), np.int64)
        for i, r in enumerate(requests):
            if r in self._slot:
                out[i] = self._slot[r]
                continue
            if len(self._slot) < cap:
                s = len(self._slot)
                if s >= self.h.shape[1]:
                    self._alloc(min(cap, max(8, 2 * self.h.shape[1])))
            else:
                s = self._slot.popitem(last=False)[1]
            self.abs[s] = -1
            self.count[s] = 0
            self._slot[r] = s
            out[i] = s
        return out

    def commit(self, requests, hn, cn, out_BSH, lengths, seen) -> None:
        """Save the step's new states: requests (B,), hn/cn (layers, B, H), outputs (B, S, H), lengths (B,)."""
        slots = self._slots_for(requests.tolist())
        s = torch.from_numpy(slots)
        self.h[:, s], self.c[:, s] = hn, cn
        if self.R > 0:
            b_of = np.repeat(np.arange(len(slots)), lengths)
            j_of = np.arange(len(b_of)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            absolute = seen[b_of] + j_of
            keep = absolute >= seen[b_of] + lengths[b_of] - self.R  # only a request's last R outputs fit
            b_k, j_k, a_k = b_of[keep], j_of[keep], absolute[keep]
            dst, ring = torch.from_numpy(slots[b_k]), torch.from_numpy(a_k % self.R)
            self.out[dst, ring] = out_BSH[torch.from_numpy(b_k), torch.from_numpy(j_k)]
            self.abs[dst, ring] = torch.from_numpy(a_k)
        self.count[slots] = seen + lengths


class NeuralPredictor(Predictor):
    """FFN or LSTM token-to-expert predictor (request horizon); see the module docstring."""

    horizon = REQUEST
    learns = True

    def __init__(
        self, spec: MoESpec, config: NeuralConfig | None = None, *, embeddings: np.ndarray | None = None,
        embedding_source: str = "",
    ) -> None:
        super().__init__(spec)
        self.config = config or NeuralConfig()
        self.name = self.config.arch
        self.embedding_source = embedding_source if self.config.embedding == "model" else "learned"
        self._emb = embeddings
        self._net: _Net | None = None
        self._vocab: np.ndarray | None = None  # learned embeddings: token id of each table row
        self._n_rows = 0
        self._states = RequestStates(
            layers=self.config.lstm_layers, hidden=self.config.hidden_dim, window=self.config.window,
            capacity=self.config.max_cached_requests,
        )
        self._pending: tuple[int, tuple] | None = None
        self.fit_log: list[dict[str, float]] = []

    # ------------------------------------------------------------------------------------------- rows
    def _rows(self, token_id: np.ndarray) -> np.ndarray:
        """Token ids -> table rows; unknown ids (out of range, or unseen when learned) -> the last row."""
        unk = self._n_rows - 1
        t = np.asarray(token_id, dtype=np.int64)
        if self._vocab is None:
            return np.where((t >= 0) & (t < unk), t, unk)
        pos = np.minimum(np.searchsorted(self._vocab, t), max(len(self._vocab) - 1, 0))
        return np.where(self._vocab[pos] == t, pos, unk) if len(self._vocab) else np.full(t.shape, unk)

    # ------------------------------------------------------------------------------------------- fit
    def fit(self, trace: Trace) -> NeuralPredictor:
        cfg, s = self.config, self.spec
        table = None
        if cfg.embedding == "model":
            if self._emb is None:
                raise ConfigError(
                    f"predictor '{self.name}' uses the model's embeddings but none were given; expected "
                    "--model DIR|builtin, or embedding='learned' for a trace without a model."
                )
            V = self._emb.shape[0]
            if trace.num_tokens and int(trace.token_id.max()) >= V:
                raise ConfigError(
                    f"trace token ids reach {int(trace.token_id.max())} but the embedding table "
                    f"({self.embedding_source or 'given'}) has {V} rows; expected the model the trace was captured from."
                )
            self._vocab, self._n_rows = None, V + 1
            table = torch.cat([torch.from_numpy(np.asarray(self._emb, np.float32)), torch.zeros(1, self._emb.shape[1])])
        else:
            self._vocab = np.unique(trace.token_id[trace.token_id >= 0]).astype(np.int64)
            self._n_rows = len(self._vocab) + 1
        train, val = trace, None
        n_req = len(np.unique(trace.request)) if trace.num_tokens else 0
        if cfg.val_fraction > 0 and n_req >= 2:
            train, val = trace.split("request", (1 - cfg.val_fraction, cfg.val_fraction), seed=cfg.seed)
            if val.num_tokens == 0 or train.num_tokens == 0:
                train, val = trace, None
        rng = np.random.default_rng(cfg.seed)
        with torch_threads(cfg.threads), torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            net = _Net(cfg, s.num_layers, s.num_experts, self._n_rows, table)
            data = self._batches_data(train)
            val_data = None if val is None else self._batches_data(val)
            opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=cfg.lr)
            best, best_state, bad = float("inf"), None, 0
            self.fit_log = []
            bar = tqdm(range(cfg.epochs), desc=f"fit {self.name}", disable=not cfg.progress, leave=False)
            for epoch in bar:
                net.train()
                tr_loss = self._epoch(net, data, rng, opt)
                net.eval()
                with torch.no_grad():
                    v_loss = tr_loss if val_data is None else self._epoch(net, val_data, None, None)
                self.fit_log.append({"epoch": epoch, "train_loss": tr_loss, "val_loss": v_loss})
                bar.set_postfix(train=f"{tr_loss:.4f}", val=f"{v_loss:.4f}")
                if v_loss < best - 1e-6:
                    best, bad = v_loss, 0
                    best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
                else:
                    bad += 1
                    if val_data is not None and bad >= cfg.patience:
                        break
            if best_state is not None:
                net.load_state_dict(best_state)
            net.fold()
            net.eval()
        self._net = net
        self.reset()
        return self

    def _batches_data(self, trace: Trace) -> dict[str, np.ndarray]:
        """Training arrays. FFN: every token is an example (rows (T,), experts (T, L, K)). LSTM: each
        request's tokens in (step, trace) order, cut into sequences of <= window tokens: the tokens laid
        out sequence after sequence, with each sequence's start and length (padded per batch)."""
        rows = self._rows(trace.token_id)
        if self.config.arch == "ffn":
            return {"n": np.array(trace.num_tokens), "rows": rows, "experts": trace.experts_TLK}
        order = np.lexsort((np.arange(trace.num_tokens), trace.step, trace.request))
        req = trace.request[order]
        new_req = np.r_[True, req[1:] != req[:-1]] if len(req) else np.zeros(0, bool)
        req_start = np.maximum.accumulate(np.where(new_req, np.arange(len(req)), 0)) if len(req) else req
        starts = np.flatnonzero(new_req | ((np.arange(len(req)) - req_start) % self.config.window == 0))
        lengths = np.diff(np.r_[starts, len(req)])
        return {"n": np.array(len(starts)), "rows": rows[order], "experts": trace.experts_TLK[order],
                "start": starts, "lengths": lengths}

    def _batch(self, data: dict[str, np.ndarray], idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows and expert ids of the examples idx: (B,) and (B, L, K), or padded (B, S) and (B, S, L, K)."""
        if self.config.arch == "ffn":
            return data["rows"][idx], data["experts"][idx]
        lengths = data["lengths"][idx]
        S = int(lengths.max())
        valid = np.arange(S)[None, :] < lengths[:, None]
        tok = np.where(valid, data["start"][idx][:, None] + np.arange(S)[None, :], 0)
        rows = np.where(valid, data["rows"][tok], self._n_rows - 1)
        experts = np.where(valid[..., None, None], data["experts"][tok], -1)
        return rows, experts

    def _epoch(self, net: _Net, data: dict[str, np.ndarray], rng: np.random.Generator | None, opt) -> float:
        """One pass (shuffled and optimised when rng/opt are given, else evaluation); mean loss."""
        n = int(data["n"])
        order = rng.permutation(n) if rng is not None else np.arange(n)
        total, weight = 0.0, 0.0
        for b0 in range(0, n, self.config.batch_size):
            rows, experts = self._batch(data, order[b0 : b0 + self.config.batch_size])
            t_np, w_np = _soft_targets(experts, self.spec.num_experts)
            tgt, w = torch.from_numpy(t_np), torch.from_numpy(w_np)
            if rng is not None and self._vocab is not None and self.config.unk_rate > 0:
                rows = np.where(rng.random(rows.shape) < self.config.unk_rate, self._n_rows - 1, rows)
            rows_t = torch.from_numpy(np.ascontiguousarray(rows))
            logits = net.ffn(rows_t) if self.config.arch == "ffn" else net.seq(rows_t)
            loss = _soft_ce(logits, tgt, w)
            if opt is not None:
                opt.zero_grad()
                loss.backward()
                opt.step()
            total += float(loss.detach()) * float(w.sum())
            weight += float(w.sum())
        return total / weight if weight else float("nan")

    # ------------------------------------------------------------------------------------------- predict
    def reset(self) -> None:
        self._states.clear()
        self._pending = None

    def _require_net(self) -> _Net:
        if self._net is None:
            raise ConfigError(f"predictor '{self.name}' is not fitted; call fit(train_trace) or load a saved one.")
        return self._net

    def predict(self, view: StepView) -> Forecast:
        net = self._require_net()
        with torch.inference_mode():
            if self.config.arch == "ffn":
                rows = torch.from_numpy(self._rows(view.token_id))
                scores = torch.softmax(net.ffn(rows), dim=-1).numpy()
            else:
                scores, update = self._advance(net, view.request, view.token_id)
                self._pending = (view.step, update)
        return Forecast(top_k=self.spec.top_k, scores_TLE=scores)

    def observe(self, routing: StepRouting) -> None:
        if self.config.arch != "lstm":
            return
        if self._pending is not None and self._pending[0] == routing.step:
            update = self._pending[1]
        else:
            with torch.inference_mode():
                _, update = self._advance(self._require_net(), routing.request, routing.token_id)
        self._pending = None
        self._states.commit(*update)

    def _advance(self, net: _Net, request: np.ndarray, token_id: np.ndarray) -> tuple[np.ndarray, tuple]:
        """Run the step's tokens, grouped by request, on from each request's saved state.

        Returns scores (T, L, E) float32 in the step's token order, and the arguments of
        RequestStates.commit that would save the requests' new states.
        """
        W = self.config.window
        order = np.argsort(request, kind="stable")
        uniq, start, counts = np.unique(request[order], return_index=True, return_counts=True)
        B, S, T = len(uniq), int(counts.max()), len(order)
        b_of = np.repeat(np.arange(B), counts)
        j_of = np.arange(T) - start[b_of]
        rows = np.full((B, S), self._n_rows - 1, np.int64)
        rows[b_of, j_of] = self._rows(token_id[order])
        h0, c0, ctx, ctx_abs, seen = self._states.gather(uniq)
        x = F.relu(net.embed(torch.from_numpy(rows)))
        if (counts == S).all():  # decode steps and single requests: no padding, no packing needed
            out, (hn, cn) = net.lstm(x, (h0, c0))
        else:
            packed = pack_padded_sequence(x, torch.from_numpy(counts), batch_first=True, enforce_sorted=False)
            out_p, (hn, cn) = net.lstm(packed, (h0, c0))
            out, _ = pad_packed_sequence(out_p, batch_first=True, total_length=S)
        # Keys are the saved outputs (in ring order: attention does not depend on key order) and the
        # step's own outputs; the mask uses absolute token indices within the request. Padding gets
        # the indices it would have, so it is always in a valid query's future and every row has a key.
        q_abs = torch.from_numpy(seen)[:, None] + torch.arange(S)[None, :]
        k_abs = torch.cat([ctx_abs, q_abs], dim=1)
        gap = q_abs[:, :, None] - k_abs[:, None, :]
        mask = (k_abs[:, None, :] >= 0) & (gap >= 0) & (gap < W)
        keys = torch.cat([ctx, out], dim=1)
        att = F.scaled_dot_product_attention(out, keys, keys, attn_mask=mask)
        probs = torch.softmax(net.heads(att + net.skip(x)).view(B, S, self.spec.num_layers, -1), dim=-1)
        scores = np.empty((T, self.spec.num_layers, self.spec.num_experts), np.float32)
        scores[order] = probs[torch.from_numpy(b_of), torch.from_numpy(j_of)].numpy()
        return scores, (uniq, hn, cn, out, counts, seen)

    # ------------------------------------------------------------------------------------------- store
    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        net = self._require_net()
        tensors = {f"net.{k}": v.detach().numpy() for k, v in net.state_dict().items()}
        if self._vocab is not None:
            tensors["vocab_ids"] = self._vocab
        meta = {"config": dataclasses.asdict(self.config), "embedding_source": self.embedding_source,
                "n_rows": self._n_rows, "fit_log": self.fit_log}
        return meta, tensors

    @classmethod
    def state_schema(cls, spec: MoESpec, meta: dict[str, Any]) -> dict[str, tuple]:
        # vocab_ids is binary-searched (sorted); the embedding table has one row per id plus the unknown row.
        # The net.* shapes are checked by load_state_dict, whose size-mismatch message store.py shortens.
        n = meta.get("n_rows")
        return {"vocab_ids": ((n - 1 if type(n) is int else "V",), "iu", ("sorted", "optional"))}

    @classmethod
    def from_state(cls, spec: MoESpec, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> NeuralPredictor:
        p = cls(spec, NeuralConfig(**meta["config"]), embedding_source=meta.get("embedding_source", ""))
        p._n_rows = int(meta["n_rows"])
        p._vocab = tensors["vocab_ids"].astype(np.int64) if "vocab_ids" in tensors else None
        p.fit_log = list(meta.get("fit_log", []))
        with torch.random.fork_rng(devices=[]):
            net = _Net(p.config, spec.num_layers, spec.num_experts, p._n_rows, None)
        state = {k[4:]: torch.from_numpy(np.array(v)) for k, v in tensors.items() if k.startswith("net.")}
        net.load_state_dict(state)
        net.first.weight.requires_grad_(False)
        net.eval()
        p._net = net
        return p
