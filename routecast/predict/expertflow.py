"""ExpertFlow's routing-path predictor: a small T5-like encoder-decoder over a request's token ids.

Shapes: P prompt tokens, S tokens of the request so far (prompt + generated), L MoE layers, E experts.
The encoder reads the prompt with full self-attention (the whole prompt is known at admission); the
decoder runs over the request's tokens with causal self-attention and cross-attention to the encoded
prompt; one linear head of L·E logits (L separate heads of E logits, one per MoE layer) gives each
token's whole routing path in one pass. Trained with binary cross-entropy on the multi-hot (L, E) paths
(ExpertFlow eq. 3); the predicted experts of a token at a layer are its K largest logits.

Sizes: the paper's predictor is d_model 32, d_ff 2048 (7.21 MB); the default here is d_model 64, d_ff 256,
2 encoder and 1 decoder layers, learned absolute positions instead of T5's relative bias; AdamW with the
paper's weight decay 0.01 and cosine schedule, but batches of 8 requests at lr 2e-3 instead of 16 at 1e-3
(twice the optimizer steps for the same compute). The paper's sizes and training (`paper_config()`, at 2+1
layers) reach top-k accuracy 0.486 on the fine-grained trace where the default reaches 0.677 and d_model 96 /
d_ff 384 / 2+2 layers 0.730 (README, predictor configurations). Epochs by default: 3 M token passes over the
training tokens, clamped to 8..30. Batches are drawn from length-sorted chunks of the shuffled requests
(`bucket`), which cuts the padding of random batches (~55% over the tokens of a 2,000-request capture).
More data and a wider decoder are what help: benchmarks/expertflow_predictor.py --train-extra --expertflow.

Horizon `request`: a step's forecast uses the step's token ids and positions plus the token ids of the
request's earlier steps (revealed by observe); never any routing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from routecast.common.errors import ConfigError
from routecast.predict.forecast import Forecast, multi_hot
from routecast.predict.harness import REQUEST, Predictor, StepRouting, StepView
from routecast.trace import PREFILL, MoESpec, Trace


@dataclass(frozen=True, kw_only=True)
class ExpertFlowConfig:
    """Predictor size and training (see the module docstring for the paper's values)."""

    d_model: int = 64
    d_ff: int = 256
    heads: int = 4
    enc_layers: int = 2
    dec_layers: int = 1
    max_len: int = 512
    epochs: int | None = None  # None: token_passes / training tokens, clamped to 8..30
    token_passes: int = 3_000_000
    batch_size: int = 8
    lr: float = 2e-3
    weight_decay: float = 0.01
    seed: int = 0
    threads: int = 1
    progress: bool = False  # a tqdm bar over epochs (loss in the postfix)
    bucket: int = 32  # batches per length-sorted chunk of the shuffled requests (1 = plain random batches)

    def __post_init__(self) -> None:
        for f in ("d_model", "d_ff", "heads", "enc_layers", "dec_layers", "max_len", "epochs", "batch_size", "threads",
                  "token_passes", "bucket"):
            if getattr(self, f) is not None and getattr(self, f) < 1:
                raise ConfigError(f"ExpertFlowConfig.{f} is {getattr(self, f)}; expected a positive integer.")
        if self.d_model % self.heads:
            raise ConfigError(f"ExpertFlowConfig.d_model {self.d_model} is not divisible by heads {self.heads}.")
        if not (self.lr > 0 and self.weight_decay >= 0):
            raise ConfigError(f"ExpertFlowConfig lr {self.lr} / weight_decay {self.weight_decay}; expected lr > 0 and "
                              "weight_decay >= 0.")


def paper_config(**overrides: Any) -> ExpertFlowConfig:
    """ExpertFlow §5.2's predictor: d_model 32, d_ff 2048, Adam(W) lr 1e-3, weight decay 0.01, cosine, batch 16
    (layer counts as this module's default, 2 encoder + 1 decoder; the paper does not state them)."""
    return ExpertFlowConfig(**{"d_model": 32, "d_ff": 2048, "lr": 1e-3, "batch_size": 16, **overrides})


def parse_config(text: str, **base: Any) -> ExpertFlowConfig:
    """'paper' | 'default' | 'paper,epochs=20' | 'd_model=128,dec_layers=2' -> ExpertFlowConfig (over `base`)."""
    fields = {f.name: f.type for f in dataclasses.fields(ExpertFlowConfig)}
    items = [x.strip() for x in text.split(",") if x.strip()]
    preset = items.pop(0) if items and "=" not in items[0] else "default"
    if preset not in ("default", "paper"):
        raise ConfigError(f"--expertflow preset is {preset!r}; expected 'default' or 'paper' (then KEY=VALUE pairs).")
    kw: dict[str, Any] = dict(base)
    for item in items:
        key, _, val = item.partition("=")
        if key not in fields or key == "progress" or "=" not in item:
            raise ConfigError(f"--expertflow item {item!r}; expected KEY=VALUE with KEY one of "
                              f"{', '.join(k for k in fields if k != 'progress')}.")
        try:
            kw[key] = float(val) if key in ("lr", "weight_decay") else int(val)
        except ValueError:
            raise ConfigError(f"--expertflow {key}={val!r} is not a number.") from None
    return paper_config(**kw) if preset == "paper" else ExpertFlowConfig(**kw)


def _length_batches(lengths: np.ndarray, batch: int, bucket: int, g: torch.Generator) -> list[np.ndarray]:
    """Request indices in batches of `batch`: shuffled, then sorted by length inside chunks of `bucket` batches
    (less padding: random batches of 8 requests pad ~55% over the tokens here), batch order shuffled."""
    perm = torch.randperm(len(lengths), generator=g).numpy()
    chunk = batch * bucket
    parts = [p[np.argsort(lengths[p], kind="stable")] for p in np.split(perm, range(chunk, len(perm), chunk))]
    batches = [b for p in parts for b in np.split(p, range(batch, len(p), batch))]
    order = torch.randperm(len(batches), generator=g).numpy()
    return [batches[i] for i in order]


class _Net(nn.Module):
    def __init__(self, cfg: ExpertFlowConfig, vocab: int, L: int, E: int) -> None:
        super().__init__()
        d = cfg.d_model
        self.pad = vocab + 1  # vocab = unknown token, vocab + 1 = padding
        self.emb = nn.Embedding(vocab + 2, d, padding_idx=self.pad)
        self.pos = nn.Embedding(cfg.max_len, d)
        self.enc = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, cfg.heads, cfg.d_ff, dropout=0.0, batch_first=True, norm_first=True),
            cfg.enc_layers, enable_nested_tensor=False)
        self.dec = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(d, cfg.heads, cfg.d_ff, dropout=0.0, batch_first=True, norm_first=True),
            cfg.dec_layers)
        self.head = nn.Linear(d, L * E)
        self.L, self.E, self.max_len = L, E, cfg.max_len

    def forward(self, prompt: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        """prompt (B, P), seq (B, S) int64 rows (padding = self.pad) -> logits (B, S, L, E)."""
        B, P = prompt.shape
        S = seq.shape[1]
        pp = torch.arange(P).clamp(max=self.max_len - 1)
        sp = torch.arange(S).clamp(max=self.max_len - 1)
        p_pad = prompt == self.pad
        mem = self.enc(self.emb(prompt) + self.pos(pp)[None], src_key_padding_mask=p_pad)
        causal = torch.triu(torch.ones((S, S), dtype=torch.bool), diagonal=1)
        h = self.dec(self.emb(seq) + self.pos(sp)[None], mem, tgt_mask=causal, tgt_key_padding_mask=seq == self.pad,
                     memory_key_padding_mask=p_pad)
        return self.head(h).view(B, S, self.L, self.E)

    def encode(self, prompt_P: torch.Tensor) -> torch.Tensor:
        """One request's prompt rows (P,) -> encoder memory (1, P, d)."""
        pp = torch.arange(prompt_P.shape[0]).clamp(max=self.max_len - 1)
        return self.enc(self.emb(prompt_P[None]) + self.pos(pp)[None])

    def extend(self, mem: torch.Tensor, xs: list[torch.Tensor], rows_n: torch.Tensor, start: int):
        """The decoder on n new tokens of one request (positions start..start+n-1), its earlier tokens' layer
        inputs xs[l] (start, d) kept from previous calls -> (logits (n, L, E), new xs (start + n, d) per layer).
        The same arithmetic as forward() for those tokens (causal self-attention over every earlier token,
        cross-attention to mem, pre-norm), computed for the new queries only."""
        n = rows_n.shape[0]
        x = self.emb(rows_n) + self.pos((start + torch.arange(n)).clamp(max=self.max_len - 1))
        mask = torch.arange(start + n)[None, :] > (start + torch.arange(n))[:, None]  # True = not attended
        out = []
        for layer, kept in zip(self.dec.layers, xs, strict=True):
            full = torch.cat([kept, x]) if kept.shape[0] else x
            out.append(full)
            kv = layer.norm1(full)[None]
            x = x + layer.self_attn(layer.norm1(x)[None], kv, kv, attn_mask=mask, need_weights=False)[0][0]
            x = x + layer._mha_block(layer.norm2(x)[None], mem, None, None)[0]
            x = x + layer._ff_block(layer.norm3(x))
        return self.head(x).view(n, self.L, self.E), out


def _pad(rows: list[np.ndarray], pad: int) -> torch.Tensor:
    n = max(1, max(len(r) for r in rows))
    out = np.full((len(rows), n), pad, np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return torch.from_numpy(out)


class ExpertFlowPredictor(Predictor):
    """ExpertFlow routing-path predictor (request horizon); see the module docstring."""

    name: ClassVar[str] = "expertflow"
    horizon: ClassVar[str] = REQUEST
    learns: ClassVar[bool] = True

    def __init__(self, spec: MoESpec, config: ExpertFlowConfig | None = None) -> None:
        super().__init__(spec)
        self.config = config or ExpertFlowConfig()
        self._net: _Net | None = None
        self._vocab = 0
        self._hist: dict[int, tuple[list[int], list[int]]] = {}
        self._cache: dict[int, dict[str, Any]] = {}  # request -> encoder memory + decoder inputs (see _extend)
        self.fit_log: list[float] = []

    def _ids(self, token_id: np.ndarray) -> np.ndarray:
        t = np.asarray(token_id, np.int64)
        return np.where((t >= 0) & (t < self._vocab), t, self._vocab)

    def fit(self, trace: Trace) -> ExpertFlowPredictor:
        cfg = self.config
        if trace.num_tokens == 0:
            raise ConfigError("expertflow: the training trace has no tokens; expected at least one request.")
        self._vocab = int(trace.token_id.max()) + 1
        prompts, seqs, targets = [], [], []
        experts = np.asarray(trace.experts_TLK)  # (T, L, K) ids; a batch's multi-hot targets are built per batch
        for _, idx in trace.requests():
            idx = idx[np.argsort(trace.position[idx], kind="stable")]
            ids = self._ids(trace.token_id[idx])
            pre = ids[trace.phase[idx] == PREFILL]
            prompts.append(pre if len(pre) else np.array([self._vocab]))  # no prompt: one unknown token
            seqs.append(ids)
            targets.append(experts[idx])
        prev = torch.get_num_threads()
        torch.set_num_threads(cfg.threads)
        try:
            g = torch.Generator().manual_seed(cfg.seed)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                net = _Net(cfg, self._vocab, self.spec.num_layers, self.spec.num_experts)
            opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
            n_batches = math.ceil(len(seqs) / cfg.batch_size)
            lengths = np.array([len(x) for x in seqs])
            epochs = cfg.epochs or min(30, max(8, round(cfg.token_passes / trace.num_tokens)))
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * n_batches)
            net.train()
            bar = tqdm(range(epochs), desc="expertflow fit", unit="epoch", disable=not cfg.progress)
            for _ in bar:
                total = 0.0
                for sel in _length_batches(lengths, cfg.batch_size, cfg.bucket, g):
                    seq = _pad([seqs[i] for i in sel], net.pad)
                    prm = _pad([prompts[i] for i in sel], net.pad)
                    tgt = torch.zeros((len(sel), seq.shape[1], self.spec.num_layers, self.spec.num_experts))
                    for j, i in enumerate(sel):
                        tgt[j, : len(targets[i])] = torch.from_numpy(multi_hot(targets[i], self.spec.num_experts))
                    valid = (seq != net.pad)[:, :, None, None].float()
                    loss = (F.binary_cross_entropy_with_logits(net(prm, seq), tgt, reduction="none") * valid).sum()
                    loss = loss / (valid.sum() * self.spec.num_layers * self.spec.num_experts)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    sched.step()
                    total += float(loss.detach())
                self.fit_log.append(total / n_batches)
                bar.set_postfix(loss=f"{self.fit_log[-1]:.4f}")
            net.eval()
        finally:
            torch.set_num_threads(prev)
        self._net = net
        self._hist.clear()
        self._cache.clear()
        return self

    def reset(self) -> None:
        self._hist.clear()
        self._cache.clear()

    def _seqs(self, view: StepView | StepRouting) -> list[tuple[int, np.ndarray, list[int], list[int]]]:
        """Per request of the step: (request, its token indices in the step, prompt ids, sequence ids)."""
        out = []
        order = np.lexsort((view.position, view.request))
        req = view.request[order]
        for r in np.unique(req):
            idx = order[req == r]
            prompt, seq = self._hist.get(int(r), ([], []))
            ids = self._ids(view.token_id[idx]).tolist()
            pre = [t for t, ph in zip(ids, view.phase[idx].tolist(), strict=True) if ph == PREFILL]
            out.append((int(r), idx, prompt + pre, seq + ids))
        return out

    def _prompt(self, prompt: list[int]) -> np.ndarray:
        return np.asarray(prompt if prompt else [self._vocab], np.int64)  # no prompt: one unknown token

    def predict(self, view: StepView) -> Forecast:
        if self._net is None:
            raise ConfigError("predictor 'expertflow' is not fitted; call fit(train_trace) or load a saved one.")
        L, E = self.spec.num_layers, self.spec.num_experts
        scores = np.empty((view.num_tokens, L, E), np.float32)
        with torch.inference_mode():
            for r, idx, prompt, seq in self._seqs(view):
                scores[idx] = torch.sigmoid(self._extend(r, prompt, seq, len(idx))).numpy()
        scores /= np.maximum(scores.sum(axis=-1, keepdims=True), 1e-30)
        return Forecast(top_k=self.spec.top_k, scores_TLE=scores)

    def _extend(self, r: int, prompt: list[int], seq: list[int], n: int) -> torch.Tensor:
        """Logits (n, L, E) of request r's last n tokens. The prompt's encoding and the decoder inputs of the
        tokens before them are kept per request from the previous step (when the prompt and those tokens
        are unchanged), so a decode step costs one token's decoder pass, not the whole request's."""
        net, c = self._net, self._cache.get(r)
        p, s = self._prompt(prompt), np.asarray(seq, np.int64)
        start = len(s) - n
        if c is None or c["S"] != start or not np.array_equal(c["prompt"], p) or not np.array_equal(c["seq"], s[:start]):
            c = {"prompt": p, "mem": net.encode(torch.from_numpy(p)), "S": 0,
                 "xs": [torch.zeros(0, net.emb.embedding_dim) for _ in net.dec.layers]}
        logits, c["xs"] = net.extend(c["mem"], c["xs"], torch.from_numpy(s[c["S"]:]), c["S"])
        c["S"], c["seq"] = len(s), s
        self._cache[r] = c
        return logits[-n:]

    def observe(self, routing: StepRouting) -> None:
        for r, _, prompt, seq in self._seqs(routing):
            self._hist[r] = (prompt, seq)

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        if self._net is None:
            raise ConfigError("predictor 'expertflow' is not fitted; nothing to save.")
        tensors = {f"net.{k}": v.detach().numpy() for k, v in self._net.state_dict().items()}
        return {"config": dataclasses.asdict(self.config), "vocab": self._vocab, "fit_log": self.fit_log}, tensors

    @classmethod
    def from_state(cls, spec: MoESpec, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> ExpertFlowPredictor:
        p = cls(spec, ExpertFlowConfig(**meta["config"]))
        p._vocab = int(meta["vocab"])
        p.fit_log = list(meta.get("fit_log", []))
        net = _Net(p.config, p._vocab, spec.num_layers, spec.num_experts)
        net.load_state_dict({k[4:]: torch.from_numpy(np.array(v)) for k, v in tensors.items() if k.startswith("net.")})
        net.eval()
        p._net = net
        return p
