"""Capture real routing from Hugging Face MoE models (transformers 5.x) into a trace.

Shapes (legend in spec.py): a forward pass over a (B, S) batch routes T = B*S rows (padding included)
through L MoE layers; the recorder returns per forward experts_TLK int16 (-1 = dropped or layer not on
this token's path), weights_TLK float32, optional logits_TLE float32 and hidden_TLH (router input).

How it works: ``RoutingRecorder`` puts a forward pre-hook on every MoE block's ``experts`` (the ids and
weights the experts actually execute; never recomputed from logits, bf16 ties would differ) and, when
logits or hidden states are wanted, a forward hook on its router (input = router input hidden state,
output holds the logits). Hooks only keep references to the tensors; stacking, dtype conversion and
the mapping of rows to tokens happen after ``generate`` returns. Adapters per architecture live in
``capture_arch.py``.

``capture`` runs greedy ``generate`` (use_cache=True) batch by batch and writes one trace row per token
the model processed for a request: the prompt tokens (phase 0, one step: the prefill forward) and every
generated token that was fed back (phase 1, one step per decode forward). Rows the model computed but
no request needs are left out: padding, and rows of requests that already finished (after their EOS or
their own max_new_tokens) while others in the batch go on. Decoder-only models are left-padded.
Encoder-decoder models (Switch Transformers) are right-padded (capacity counts along the sequence, so
padding must come last); their L = encoder MoE layers then decoder MoE layers; prompt tokens pass the
encoder and generated tokens (starting with the decoder start token, at positions after the prompt)
pass the decoder, each holding -1 (weight 0, logits/hidden 0) in the other stack's layers.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from routecast.common.errors import ConfigError, TraceError
from routecast.trace.capture_arch import (
    DENSE,
    SUPPORTED,
    adapter_for,
    decode_routing,
    find_blocks,
    read_experts_args,
    router_correction_bias,
    spec_from_model,
)
from routecast.trace.capture_inputs import (
    RESUME_KEYS,
    _int,
    _records,
    check_resume,
    corpus_config,
    document_ids,
    load_model,
    load_prompts,
    prompts_digest,
)
from routecast.trace.spec import MoESpec
from routecast.trace.trace import DECODE, PREFILL, make_columns

__all__ = ["RESUME_KEYS", "SUPPORTED", "ForwardRouting", "RoutingRecorder", "capture", "capture_to_disk",
           "load_prompts", "load_model", "spec_from_model"]


@dataclass(frozen=True, kw_only=True)
class ForwardRouting:
    """Routing of one forward pass of one layer stack: T rows = batch x seq flattened (padding included).

    experts_TLK int16 (-1 = dropped by capacity, or a layer of another stack), weights_TLK float32,
    logits_TLE float32 | None, hidden_TLH float32/float16 | None. stack: 0 (decoder-only model or
    encoder), 1 (decoder of an encoder-decoder model).
    """

    stack: int
    experts_TLK: np.ndarray
    weights_TLK: np.ndarray
    logits_TLE: np.ndarray | None = None
    hidden_TLH: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return int(self.experts_TLK.shape[0])


def _check(t: torch.Tensor, v: int, what: str) -> torch.Tensor:
    if v >= 0 and t._version != v:
        raise TraceError(
            f"recorder: the {what} tensor was modified in place after its hook ran (version {v} -> {t._version}); "
            "expected the model to leave router inputs and routing tensors untouched."
        )
    return t


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version  # inference tensors keep no version counter


class RoutingRecorder:
    """Context manager recording the routing of every forward pass of an HF MoE model.

    with RoutingRecorder(model, logits=True) as rec:
        model(input_ids)
    fw = rec.forwards()   # list[ForwardRouting], in call order

    spec: the model's MoESpec (MoE layers only). Records accumulate until reset().
    """

    def __init__(self, model: nn.Module, *, hidden: bool = False, logits: bool = False) -> None:
        self.model = model
        self.adapter = adapter_for(model)
        self.blocks = find_blocks(model, self.adapter)
        self._spec = spec_from_model(model, self.blocks)
        self.hidden, self.logits = bool(hidden), bool(logits)
        self._handles: list[Any] = []
        # First layer of each stack marks the start of that stack's forward pass.
        self._first = {b.stack: i for i, b in reversed(list(enumerate(self.blocks)))}
        self.reset()

    @property
    def spec(self) -> MoESpec:
        return self._spec

    def reset(self) -> None:
        """Forget everything recorded so far (hooks stay installed)."""
        # Per layer and kind: the tensors (references, no copies) and their version counters in two flat
        # lists, so a hook allocates no new tracked objects (tuples of tensors made Python's cyclic GC cost
        # more than the hook itself once thousands accumulated).
        n = len(self.blocks)
        self._ids: list[list] = [[] for _ in range(n)]
        self._w: list[list] = [[] for _ in range(n)]
        self._lg: list[list] = [[] for _ in range(n)]
        self._hd: list[list] = [[] for _ in range(n)]
        self._ver: dict[str, list[list[int]]] = {k: [[] for _ in range(n)] for k in ("ids", "w", "lg", "hd")}
        self._starts: dict[int, list[int]] = {s: [] for s in self._first}
        self._tick = 0

    # ------------------------------------------------------------------ hooks
    def _mark(self, layer: int) -> None:
        stack = self.blocks[layer].stack
        if self._first[stack] == layer:
            self._starts[stack].append(self._tick)
            self._tick += 1

    def _put(self, kind: str, store: list[list], layer: int, t: torch.Tensor) -> None:
        # detach only when needed: under no_grad the model's own tensor object is kept as is
        store[layer].append(t.detach() if t.requires_grad else t)
        self._ver[kind][layer].append(_version(t))

    def _experts_hook(self, layer: int):
        adapter = self.adapter

        def hook(_mod: nn.Module, args: tuple, kwargs: dict) -> None:
            if len(args) >= 3 and not args[1].is_floating_point():
                ids, w = args[1], args[2]  # the usual experts(hidden, ids, weights) call
            else:
                ids, w = read_experts_args(adapter, args, kwargs)
            self._mark(layer)
            self._put("ids", self._ids, layer, ids)
            self._put("w", self._w, layer, w)

        return hook

    def _router_hook(self, layer: int):
        adapter, want_h, want_lg = self.adapter, self.hidden, self.logits

        def hook(_mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            if adapter.read == DENSE:
                self._mark(layer)
                self._put("ids", self._ids, layer, out[0])
            if want_h:
                self._put("hd", self._hd, layer, args[0] if args else next(iter(kwargs.values())))
            if want_lg:
                self._put("lg", self._lg, layer, out if adapter.logits_at is None else out[adapter.logits_at])

        return hook

    def install(self) -> RoutingRecorder:
        if self._handles:
            return self
        for i, b in enumerate(self.blocks):
            if self.adapter.read != DENSE:
                self._handles.append(b.experts.register_forward_pre_hook(self._experts_hook(i), with_kwargs=True))
            if self.adapter.read == DENSE or self.hidden or self.logits:
                self._handles.append(b.router.register_forward_hook(self._router_hook(i), with_kwargs=True))
        return self

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self) -> RoutingRecorder:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # ------------------------------------------------------------------ results
    def _get(self, kind: str, layer: int, call: int) -> torch.Tensor:
        store = {"ids": self._ids, "w": self._w, "lg": self._lg, "hd": self._hd}[kind]
        what = {"ids": "routing ids", "w": "routing weights", "lg": "router logits", "hd": "router input"}[kind]
        return _check(store[layer][call], self._ver[kind][layer][call], what)

    @property
    def num_forwards(self) -> int:
        return sum(len(v) for v in self._starts.values())

    def forwards(self) -> list[ForwardRouting]:
        """Every recorded forward pass in call order, converted to numpy (one stack per layer per forward)."""
        s, blocks = self._spec, self.blocks
        L, K, E = s.num_layers, s.top_k, s.num_experts
        out: list[tuple[int, ForwardRouting]] = []
        for stack, starts in self._starts.items():
            layers = [i for i, b in enumerate(blocks) if b.stack == stack]
            calls = {len(self._ids[i]) for i in layers}
            if calls != {len(starts)}:
                raise TraceError(
                    f"recorder: MoE layers of stack {stack} saw {sorted(calls)} calls for {len(starts)} forward passes; "
                    "expected each MoE layer to run exactly once per forward pass."
                )
            for c, tick in enumerate(starts):
                pairs = [
                    decode_routing(self.adapter, self._get("ids", i, c),
                                   self._get("w", i, c) if self._w[i] else None, K)
                    for i in layers
                ]
                T = pairs[0][0].shape[0]
                if any(p[0].shape[0] != T for p in pairs):
                    raise TraceError(f"recorder: forward {c} of stack {stack} routed different row counts per layer.")
                ids = np.full((T, L, K), -1, dtype=np.int16)
                wts = np.zeros((T, L, K), dtype=np.float32)
                ids[:, layers] = torch.stack([p[0] for p in pairs], 1).to(torch.int16).cpu().numpy()
                wts[:, layers] = torch.stack([p[1] for p in pairs], 1).cpu().numpy()
                lg = hd = None
                if self.logits:
                    lg = np.zeros((T, L, E), dtype=np.float32)
                    lg[:, layers] = torch.stack(
                        [self._get("lg", i, c).reshape(T, E).float() for i in layers], 1
                    ).cpu().numpy()
                if self.hidden:
                    hs = [self._get("hd", i, c).reshape(T, -1) for i in layers]
                    dt = torch.float16 if hs[0].dtype == torch.float16 else torch.float32
                    hd = np.zeros((T, L, hs[0].shape[1]), dtype=np.float16 if dt == torch.float16 else np.float32)
                    hd[:, layers] = torch.stack([h.to(dt) for h in hs], 1).cpu().numpy()
                out.append((tick, ForwardRouting(stack=stack, experts_TLK=ids, weights_TLK=wts, logits_TLE=lg,
                                                 hidden_TLH=hd)))
        return [f for _, f in sorted(out, key=lambda x: x[0])]


# ---------------------------------------------------------------------- generate + bookkeeping
def _generation_setup(model: nn.Module, tokenizer: Any) -> tuple[Any, int, np.ndarray]:
    """(greedy GenerationConfig, pad id, eos ids) shared by generate and the row bookkeeping."""
    from transformers import GenerationConfig

    base = getattr(model, "generation_config", None) or GenerationConfig.from_model_config(model.config)
    gc = copy.deepcopy(base)
    eos = gc.eos_token_id
    eos_ids = np.asarray([] if eos is None else ([eos] if isinstance(eos, int) else list(eos)), dtype=np.int64)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else gc.pad_token_id
    pad = pad if pad is not None else (int(eos_ids[0]) if eos_ids.size else 0)
    # Greedy, one forward per new token: no sampling, beams, chunked prefill or returned extras.
    gc.do_sample, gc.num_beams, gc.use_cache, gc.pad_token_id = False, 1, True, int(pad)
    gc.temperature = gc.top_p = gc.top_k = None
    gc.return_dict_in_generate = gc.output_scores = gc.output_logits = False
    gc.output_hidden_states = gc.output_attentions = False
    if hasattr(gc, "prefill_chunk_size"):
        gc.prefill_chunk_size = None
    return gc, int(pad), eos_ids


def _pad(seqs: list[list[int]], pad: int, left: bool) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists -> (input_ids [B,S] int64, attention mask [B,S] int64), left or right padded."""
    S = max(len(s) for s in seqs)
    ids = np.full((len(seqs), S), pad, dtype=np.int64)
    mask = np.zeros((len(seqs), S), dtype=np.int64)
    for b, s in enumerate(seqs):  # per request, not per token
        sl = slice(S - len(s), S) if left else slice(0, len(s))
        ids[b, sl], mask[b, sl] = s, 1
    return ids, mask


def _run(model: nn.Module, ids: np.ndarray, mask: np.ndarray, budgets: np.ndarray, gc: Any,
         enc_dec: bool) -> np.ndarray | None:
    """Prefill + greedy decode of one batch; returns generate's sequences, None when nothing is generated."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class RowBudget(StoppingCriteria):
        # Each request stops at its own max_new_tokens (generate alone knows one budget per batch).
        def __init__(self, start: int, budgets_B: torch.Tensor) -> None:
            self.start, self.budgets = start, budgets_B

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kw: Any) -> torch.Tensor:
            return (input_ids.shape[1] - self.start) >= self.budgets

    dev = next(model.parameters()).device
    x, m = torch.from_numpy(ids).to(dev), torch.from_numpy(mask).to(dev)
    with torch.no_grad():
        if budgets.max() == 0:
            if enc_dec:
                model.get_encoder()(input_ids=x, attention_mask=m)
            else:
                model(input_ids=x, attention_mask=m, use_cache=False)
            return None
        g = copy.deepcopy(gc)
        g.max_new_tokens = int(budgets.max())
        crit = StoppingCriteriaList([RowBudget(1 if enc_dec else ids.shape[1], torch.from_numpy(budgets).to(dev))])
        out = model.generate(input_ids=x, attention_mask=m, generation_config=g, stopping_criteria=crit)
    return out.cpu().numpy()


def _assemble(fw: list[ForwardRouting], ids: np.ndarray, mask: np.ndarray, seqs: np.ndarray | None,
              budgets: np.ndarray, eos: np.ndarray, enc_dec: bool) -> tuple[dict[str, np.ndarray], list, int]:
    """Map the rows of one batch's forwards to tokens.

    Returns (per-token arrays b, position, token_id, phase, step_offset; [experts, weights, logits, hidden]
    parts in trace order; forwards consumed). Trace order: prefill tokens by row, then decode step-major.
    """
    B, S = mask.shape
    if not fw or fw[0].num_rows != B * S:
        got = fw[0].num_rows if fw else 0
        raise TraceError(f"capture: the prefill forward routed {got} rows; expected batch x seq = {B * S}.")
    keep = mask.reshape(-1).astype(bool)
    P = mask.sum(1)
    b = [np.repeat(np.arange(B), S)[keep]]
    pos = [(np.cumsum(mask, 1) - 1).reshape(-1)[keep]]
    tok = [ids.reshape(-1)[keep]]
    off = [np.zeros(int(keep.sum()), dtype=np.int64)]
    parts = [[f[keep] if f is not None else None for f in (fw[0].experts_TLK, fw[0].weights_TLK,
                                                           fw[0].logits_TLE, fw[0].hidden_TLH)]]
    F = 0
    if seqs is not None:
        gen = seqs[:, 1:] if enc_dec else seqs[:, S:]
        G = gen.shape[1]
        hit = np.isin(gen, eos)
        n_gen = np.minimum(np.where(hit.any(1), hit.argmax(1) + 1, G), budgets)
        # Decoder-only: decode forward c feeds generated token c; encoder-decoder: decoder token c (start first).
        dec_tok, n_dec = (seqs[:, :G], n_gen) if enc_dec else (gen[:, : G - 1], np.maximum(n_gen - 1, 0))
        F = dec_tok.shape[1]
        dec = fw[1 : 1 + F]
        if len(dec) < F or any(f.num_rows != B for f in dec):
            raise TraceError(
                f"capture: generate ran {len(fw) - 1} decode forwards of rows {sorted({f.num_rows for f in dec})}; "
                f"expected at least {F} forwards of {B} rows (one token per request per step)."
            )
        if F:
            valid = np.arange(F)[:, None] < n_dec[None, :]  # [F, B]; nonzero() walks it step-major
            fi, bi = np.nonzero(valid)
            b.append(bi)
            pos.append(P[bi] + fi)
            tok.append(dec_tok[bi, fi])
            off.append(1 + fi.astype(np.int64))
            parts.append([None if getattr(dec[0], n) is None else np.stack([getattr(f, n) for f in dec])[valid]
                          for n in ("experts_TLK", "weights_TLK", "logits_TLE", "hidden_TLH")])
    n_pre = len(tok[0])
    cols = {"b": np.concatenate(b), "position": np.concatenate(pos), "token_id": np.concatenate(tok),
            "step_offset": np.concatenate(off)}
    cols["phase"] = np.where(np.arange(len(cols["b"])) < n_pre, PREFILL, DECODE)
    return cols, parts, 1 + F


def _check_context(model: nn.Module, tokenizer: Any, recs: list[dict[str, Any]]) -> None:
    """Refuse a request whose prompt + new tokens exceed the model's context (max_position_embeddings):
    generate would run past the positions the model was trained on, with only a warning."""
    ctx = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(ctx, int) or ctx < 1 or not recs or getattr(model.config, "is_encoder_decoder", False):
        return
    enc = tokenizer([r["prompt"] for r in recs], add_special_tokens=True, verbose=False)["input_ids"]
    lens = [len(x) for x in enc]
    for r, n in zip(recs, lens, strict=True):
        if n + r["max_new_tokens"] > ctx:
            raise ConfigError(f"prompts: request {r['request']} has {n} prompt tokens + {r['max_new_tokens']} new "
                              f"tokens = {n + r['max_new_tokens']}; expected at most the model's context of {ctx} "
                              "tokens (max_position_embeddings): shorten the prompt or --max-new-tokens.")


def capture(model: nn.Module, tokenizer: Any, prompts: Sequence[Any], writer: Any, *, max_new_tokens: int = 32,
            batch_size: int = 8, hidden: bool = False, logits: bool = False, progress: bool = True) -> dict[str, Any]:
    """Run greedy generate over prompts batch by batch and write every processed token's routing to writer.

    prompts: records with 'prompt' and optional 'task', 'source', 'max_new_tokens', 'arrival_s',
    'request' (default: the record's index), 'document' (the prompt's source document, a string or an id;
    recorded in the trace's document column by document_ids' numbering, -1 when absent). Requests in writer.committed_requests() are skipped, so an
    interrupted capture resumes. Each batch is appended and flushed as one shard. Steps continue from
    writer.num_tokens, which keeps them unique across resumed runs.
    Returns {requests, skipped, tokens, prefill_tokens, decode_tokens, forwards, seconds, tokens_per_s}.
    """
    from tqdm import tqdm

    _int(batch_size, "batch_size", 1)
    recs = _records(prompts, _int(max_new_tokens, "max_new_tokens"), "prompts")
    names = {k: tuple(getattr(writer, f"{k}_names", ()) or ()) for k in ("task", "source")}
    for r in recs:
        for k in ("task", "source"):
            if r[k] is not None and r[k] not in names[k]:
                raise ConfigError(
                    f"prompts: request {r['request']} has {k} {r[k]!r}; expected one of the writer's {k}_names {list(names[k])}."
                )
    for r, d in zip(recs, document_ids(recs)[0], strict=True):
        r["document_id"] = d
    done = {int(x) for x in np.asarray(writer.committed_requests()).ravel().tolist()}
    todo = [r for r in recs if r["request"] not in done]
    _check_context(model, tokenizer, todo)
    model.eval()
    enc_dec = bool(getattr(model.config, "is_encoder_decoder", False))
    gc, pad, eos = _generation_setup(model, tokenizer)
    step = int(writer.num_tokens)
    stats = {"requests": 0, "skipped": len(recs) - len(todo), "tokens": 0, "prefill_tokens": 0, "decode_tokens": 0,
             "forwards": 0}
    t0 = time.perf_counter()
    with RoutingRecorder(model, hidden=hidden, logits=logits) as rec, tqdm(
        total=len(todo), unit="req", disable=not progress, desc="capture"
    ) as bar:
        for i in range(0, len(todo), batch_size):
            batch = todo[i : i + batch_size]
            lists = tokenizer([r["prompt"] for r in batch], add_special_tokens=True)["input_ids"]
            for r, s in zip(batch, lists, strict=True):
                if not s:
                    raise ConfigError(f"prompts: request {r['request']} tokenizes to no tokens; expected a non-empty prompt.")
            ids, mask = _pad([list(s) for s in lists], pad, left=not enc_dec)
            budgets = np.asarray([r["max_new_tokens"] for r in batch], dtype=np.int64)
            rec.reset()
            seqs = _run(model, ids, mask, budgets, gc, enc_dec)
            cols, parts, used = _assemble(rec.forwards(), ids, mask, seqs, budgets, eos, enc_dec)
            rec.reset()  # drop the references to this batch's activations
            meta = {k: np.asarray([r[k] for r in batch]) for k in ("request", "arrival_s", "document_id")}
            for k in ("task", "source"):
                meta[k] = np.asarray([names[k].index(r[k]) if r[k] is not None else -1 for r in batch])
            bi = cols["b"]
            tokens = make_columns(len(bi), request=meta["request"][bi], position=cols["position"],
                                  token_id=cols["token_id"], phase=cols["phase"], step=step + cols["step_offset"],
                                  task=meta["task"][bi], source=meta["source"][bi], arrival_s=meta["arrival_s"][bi],
                                  document=meta["document_id"][bi])
            cat = [None if p[0] is None else np.concatenate(p) for p in zip(*parts, strict=True)]
            writer.append(tokens, cat[0], cat[1], logits_TLE=cat[2], hidden_TLH=cat[3])
            writer.flush()
            step += used
            n_pre = int((cols["phase"] == PREFILL).sum())
            stats["requests"] += len(batch)
            stats["tokens"] += len(bi)
            stats["prefill_tokens"] += n_pre
            stats["decode_tokens"] += len(bi) - n_pre
            stats["forwards"] += used
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{stats['tokens'] / max(time.perf_counter() - t0, 1e-9):.0f}")
    stats["seconds"] = time.perf_counter() - t0
    stats["tokens_per_s"] = stats["tokens"] / max(stats["seconds"], 1e-9)
    return stats


def capture_to_disk(model_dir_or_builtin: str | Path, prompts_or_path: str | Path | Sequence[Mapping[str, Any]],
                    out: str | Path, *, max_new_tokens: int | None = None, batch_size: int = 8, hidden: bool = False,
                    logits: bool = False, threads: int = 1, resume: bool = True, progress: bool = True,
                    overwrite: bool = False, device: str = "cpu") -> Path:
    """`routecast capture`: load the model and prompts, capture every batch into a trace directory at out.

    max_new_tokens: every request's decode budget; None keeps each record's own (a JSONL record's
    'max_new_tokens', else 32; corpus prompts: their task's length draw, routecast.models.prompts).
    threads: torch CPU threads (1 is fastest on small shared machines). device: "cpu" or "cuda[:N]".
    resume: continue a trace already at out, skipping its committed requests, when it was started with the
    same model, prompts, budget and recorded tensors (else refused). overwrite: replace a trace at out
    once the new one is complete. Every argument and the output path are checked before the model loads.
    """
    from routecast.trace.io import (  # the on-disk format; imported only when writing
        TraceWriter,
        check_trace_out,
    )

    torch.set_num_threads(_int(threads, "--threads", 1))
    if max_new_tokens is not None:
        _int(max_new_tokens, "--max-new-tokens")
    _int(batch_size, "--batch-size", 1)
    dev = _device(device)
    check_trace_out(out, overwrite=overwrite, resume=resume and not overwrite)
    if not progress:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Loading weights" bars on stderr
    from_corpus = isinstance(prompts_or_path, str) and prompts_or_path.startswith("corpus:")
    if from_corpus:
        corpus_config(prompts_or_path[len("corpus:"):])  # a bad spec or count fails before the model loads
    records = [] if from_corpus else load_prompts(prompts_or_path)  # a bad file fails before the model loads
    model, tokenizer = load_model(model_dir_or_builtin, device=dev)
    if from_corpus:
        records = load_prompts(prompts_or_path, tokenizer)
    if max_new_tokens is not None:  # the flag is every request's budget, corpus prompts included
        records = [{**r, "max_new_tokens": max_new_tokens} for r in records]
    records = _records(records, 32, "prompts")
    spec = spec_from_model(model)
    task_names = tuple(sorted({r["task"] for r in records if r.get("task") is not None}))
    source_names = tuple(sorted({r["source"] for r in records if r.get("source") is not None}))
    import transformers

    provenance = {
        "tool": "routecast.trace.capture",
        "model": str(model_dir_or_builtin),
        "model_type": getattr(model.config, "model_type", ""),
        "prompts": str(prompts_or_path) if isinstance(prompts_or_path, (str, Path)) else f"{len(records)} records",
        "prompts_sha256": prompts_digest(records),
        "max_new_tokens": max_new_tokens if max_new_tokens is not None else "per request (prompts' own budgets)",
        "hidden": bool(hidden), "logits": bool(logits),
        "batch_size": batch_size, "decoding": "greedy", "threads": threads, "device": str(dev),
        "transformers": transformers.__version__, "torch": torch.__version__,
        "dtype": str(next(model.parameters()).dtype),
    }
    if (bias := router_correction_bias(find_blocks(model))) is not None:  # lets `stats` tell bias from group limit
        provenance["router_correction_bias_LE"] = bias
    doc_ids, doc_names = document_ids(records)
    # Which text each document id stands for (string documents only; absent ones are -1 in the trace).
    provenance["documents"] = list(doc_names) if doc_names else (
        "integer ids from the prompts" if any(d >= 0 for d in doc_ids) else "none given (unknown)")
    if resume and not overwrite:
        check_resume(out, provenance)
    # On an exception the writer keeps the committed shards, so running again with resume=True goes on.
    with TraceWriter(out, spec, task_names=task_names, source_names=source_names, provenance=provenance,
                     resume=resume and not overwrite, overwrite=overwrite) as writer:
        capture(model, tokenizer, records, writer, max_new_tokens=32, batch_size=batch_size,
                hidden=hidden, logits=logits, progress=progress)
    return writer.close()


def _device(device: str) -> torch.device:
    """--device cpu | cuda[:N] -> torch.device; CUDA that this machine lacks is refused here, not mid-capture."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"--device {device!r} is not a device name; expected cpu or cuda[:N].") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: {dev.type} is not supported; expected cpu or cuda[:N].")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {device}: no CUDA device is available here (torch.cuda.is_available() is "
                              "False); expected cpu on this machine.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                              "expected an index below that.")
    return dev
