"""Train a built-in MoE model on the multi-domain corpus: Hugging Face ``MixtralForCausalLM`` or ``DeepseekV3ForCausalLM``.

Model (arch "mixtral", the built-in model): ``num_layers`` decoder layers, each with an MoE block of
``num_experts`` SwiGLU experts routed top-``top_k`` (Mixtral's router: softmax over experts, top-k,
renormalised), trained with the auxiliary load-balancing loss (``output_router_logits=True``,
``router_aux_loss_coef``). Arch "deepseek-v3" (builtin-fine, ``fine_config``): fine-grained experts with
a shared expert and group-limited sigmoid routing, balanced the DeepSeek-V3 way (``train_v3.py``:
correction-bias updates after each step plus a small sequence-wise loss).

Data: every train document becomes ``<|bos|> tokens <|eos|>``; documents of a task are concatenated
into one token stream per task. Each training sequence (``seq_len + 1`` tokens) picks its task
uniformly at random and a random offset in that task's stream, so small tasks are seen as often as
large ones (the smallest, wiki, is revisited about 1.5 times in a 40-minute run).

Determinism: the model init, the task/offset draws and the optimiser are seeded; a run with a given
``steps`` is bit-for-bit reproducible on one machine with one thread (the cosine learning-rate
schedule follows the step count). With ``steps=None`` training runs for ``minutes`` of wall time and
the schedule follows elapsed time, so a busy shared machine still completes the decay; such a run
sees the same data in the same order, but its step count (recorded in training.json) depends on speed.

Outputs (``out_dir``): config.json, generation_config.json, model.safetensors (fp32), tokenizer.json,
tokenizer_config.json, special_tokens_map.json, training.json. They are written to a temporary
sibling folder and moved into place at the end, so a half-trained model never sits in out_dir.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from routecast.common import numbers as N
from routecast.common.errors import ConfigError
from routecast.common.outputs import check_out_dir, declare_inputs, fix_mode, names_matcher
from routecast.models.builtin import check_checkpoint, load_model
from routecast.models.corpus import SPLITS, Document, load_corpus, read_manifest
from routecast.models.tokenizer import balanced_texts, load_tokenizer, train_tokenizer
from routecast.models.train_v3 import (
    ARCHES,
    RouterTap,
    deepseek_v3_config,
    sequence_balance_loss,
    update_correction_bias,
)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Model shape, data and optimiser settings of one training run (sizes in elements, time in minutes)."""

    vocab_size: int = 4096
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    num_experts: int = 8
    top_k: int = 2
    seq_len: int = 256
    max_position_embeddings: int = 1024
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    aux_loss_coef: float = 0.02
    # "per_layer": Switch-style balance loss averaged over layers; "global": transformers' Mixtral loss,
    # which pools usage over all layers and so lets single layers collapse onto a few experts.
    aux_loss_kind: str = "per_layer"
    tie_embeddings: bool = False
    # "mixtral" (the built-in model) or "deepseek-v3" (builtin-fine); the fields below apply to deepseek-v3 only.
    arch: str = "mixtral"
    moe_intermediate_size: int = 64
    num_shared_experts: int = 1
    n_group: int = 1
    topk_group: int = 1
    first_k_dense: int = 1
    bias_update_rate: float = 1e-3  # gamma of the aux-loss-free bias update
    minutes: float = 40.0
    steps: int | None = None
    eval_every: int = 200
    val_seqs_per_task: int = 8
    final_eval_tokens_per_task: int = 65_536
    tokenizer_bytes_per_task: int = 2_000_000
    max_train_bytes_per_task: int | None = None

    def __post_init__(self) -> None:
        if self.arch not in ARCHES:
            raise ConfigError(f"--arch {self.arch!r} is not supported; expected one of {', '.join(ARCHES)}.")
        if self.arch == "deepseek-v3" and (self.num_experts % self.n_group or not 1 <= self.topk_group <= self.n_group
                                           or self.top_k > self.topk_group * self.num_experts // self.n_group):
            raise ConfigError(f"n_group {self.n_group} / topk_group {self.topk_group} do not fit {self.num_experts} "
                              f"experts top-{self.top_k}; expected n_group | E and top_k <= topk_group * E / n_group.")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}.")
        if self.aux_loss_kind not in ("per_layer", "global"):
            raise ConfigError(f"aux_loss_kind is {self.aux_loss_kind!r}; expected 'per_layer' or 'global'.")
        if not 1 <= self.top_k <= self.num_experts:
            raise ConfigError(f"top_k {self.top_k} is out of range; expected 1..num_experts ({self.num_experts}).")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"steps {self.steps} must be a positive number of optimiser steps (or None).")
        if self.minutes <= 0:
            raise ConfigError(f"minutes {self.minutes} must be positive.")


def builtin_config(**overrides) -> TrainConfig:
    """The shipped model: d128, 4 layers, 8 experts top-2, SwiGLU I=256, BPE 4096, seq 256 (~18 MB fp32)."""
    return dataclasses.replace(TrainConfig(), **overrides)


def fine_config(**overrides) -> TrainConfig:
    """builtin-fine: DeepSeek-V3, d128, 6 layers (first dense), 64 experts top-6 + 1 shared, I=64, 8 groups / 4 (~38 MB)."""
    base = TrainConfig(arch="deepseek-v3", num_layers=6, num_experts=64, top_k=6, moe_intermediate_size=64,
                       intermediate_size=448, num_shared_experts=1, n_group=8, topk_group=4, first_k_dense=1,
                       aux_loss_coef=1e-3, bias_update_rate=2e-3, final_eval_tokens_per_task=16_384)
    return dataclasses.replace(base, **overrides)


def tiny_config(**overrides) -> TrainConfig:
    """Test-sized: d64, 4 layers, 8 experts top-2, BPE 1024, seq 128, 100 steps (~30 s on one core)."""
    base = TrainConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=4,
                       seq_len=128, max_position_embeddings=512, batch_size=8, lr=5e-3, warmup_steps=10,
                       steps=100, eval_every=50, val_seqs_per_task=2, final_eval_tokens_per_task=2048,
                       tokenizer_bytes_per_task=150_000, max_train_bytes_per_task=300_000)
    return dataclasses.replace(base, **overrides)


# Test-sized DeepSeek-V3: the tiny preset's data and schedule with 16 experts top-4 in 4 groups of 4 / 2.
_TINY_FINE = dict(vocab_size=1024, hidden_size=64, num_layers=3, num_experts=16, top_k=4, n_group=4, topk_group=2,
                  moe_intermediate_size=32, intermediate_size=128, seq_len=128, max_position_embeddings=512,
                  batch_size=8, lr=5e-3, warmup_steps=10, steps=100, eval_every=50, val_seqs_per_task=2,
                  final_eval_tokens_per_task=2048, tokenizer_bytes_per_task=150_000, max_train_bytes_per_task=300_000)


def model_config(cfg: TrainConfig, tokenizer):
    """TrainConfig + tokenizer -> transformers.MixtralConfig (routing logits on) or DeepseekV3Config (arch)."""
    from transformers import MixtralConfig

    if cfg.arch == "deepseek-v3":
        return deepseek_v3_config(cfg, tokenizer)
    return MixtralConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=cfg.max_position_embeddings,
        num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.top_k, output_router_logits=True,
        router_aux_loss_coef=cfg.aux_loss_coef, tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, sliding_window=None, hidden_act="silu",
    )


def encode_streams(tokenizer, docs: list[Document], *, max_bytes_per_task: int | None = None) -> dict[str, np.ndarray]:
    """Docs -> {task: int32[N] stream of '<|bos|> doc <|eos|>' token ids} in document order."""
    by_task: dict[str, list[str]] = {}
    used: dict[str, int] = {}
    for d in docs:
        n = len(d.text.encode())
        if max_bytes_per_task is not None and used.get(d.task, 0) + n > max_bytes_per_task and d.task in used:
            continue
        by_task.setdefault(d.task, []).append(d.text)
        used[d.task] = used.get(d.task, 0) + n
    eos = tokenizer.eos_token_id
    out = {}
    for task, texts in by_task.items():
        # The backend tokenizer skips transformers' per-call length warning; its post-processor adds <|bos|>.
        encs = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=True)
        out[task] = np.fromiter((t for e in encs for t in (*e.ids, eos)), dtype=np.int32)
    return out


def windows(stream: np.ndarray, seq_len: int, max_windows: int | None = None) -> torch.Tensor:
    """int32[N] stream -> int64[W, seq_len + 1] consecutive windows overlapping by one token."""
    n = (len(stream) - 1) // seq_len
    if max_windows is not None:
        n = min(n, max_windows)
    if n < 1:
        raise ConfigError(f"token stream of {len(stream)} tokens is shorter than one sequence of {seq_len + 1}.")
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    return torch.from_numpy(stream[idx].astype(np.int64))


@torch.no_grad()
def mean_nll(model, seqs: torch.Tensor, batch_size: int = 16) -> float:
    """int64[W, S+1] windows -> mean next-token negative log-likelihood (nats per token) under model."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(seqs), batch_size):
        batch = seqs[i : i + batch_size]
        logits = model(input_ids=batch[:, :-1], output_router_logits=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 batch[:, 1:].reshape(-1), reduction="sum")
        total += float(loss)
        count += batch[:, 1:].numel()
    model.train(was_training)
    return total / count


def per_layer_balance_loss(router_logits_L: tuple[torch.Tensor, ...], top_k: int) -> torch.Tensor:
    """Switch-style load-balancing loss per MoE layer, averaged over layers.

    router_logits_L: L tensors (T, E). Per layer: E * sum_e f_e * P_e with f_e the share of top-k slots
    routed to e and P_e the mean router probability of e; 1.0 when perfectly balanced.
    """
    losses = []
    for logits_TE in router_logits_L:
        probs_TE = torch.softmax(logits_TE.float(), dim=-1)
        E = probs_TE.shape[-1]
        ids_TK = probs_TE.topk(top_k, dim=-1).indices
        f_E = torch.zeros(E, device=probs_TE.device).scatter_add_(
            0, ids_TK.reshape(-1), torch.ones(ids_TK.numel(), device=probs_TE.device)
        ) / ids_TK.numel()
        losses.append(E * (f_E * probs_TE.mean(dim=0)).sum())
    return torch.stack(losses).mean()


def _lr_at(step: int, done: float, cfg: TrainConfig) -> float:
    """Learning rate: linear warmup over warmup_steps, then cosine to min_lr_ratio * lr as done -> 1."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, max(0.0, done))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _sample_batch(rng: np.random.Generator, streams: list[np.ndarray], cfg: TrainConfig) -> torch.Tensor:
    tasks = rng.integers(0, len(streams), size=cfg.batch_size)
    rows = []
    for t in tasks:
        s = streams[t]
        start = int(rng.integers(0, len(s) - cfg.seq_len - 1))
        rows.append(s[start : start + cfg.seq_len + 1])
    return torch.from_numpy(np.stack(rows).astype(np.int64))


# What a checkpoint directory holds (save_pretrained + tokenizer + training.json): --overwrite replaces
# a directory holding only these and refuses one holding anything else.
CHECKPOINT_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                    "training.json")


def _move_into_place(tmp: Path, out: Path) -> None:
    # The previous checkpoint goes to a hidden name of our own (never a user's `<out>.old`) until tmp is in.
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    if old.exists():
        shutil.rmtree(old)


def train_builtin(out_dir: str | Path, *, minutes: float | None = None, seed: int = 0, threads: int = 1,
                  config: TrainConfig | None = None, corpus_root: str | Path | None = None,
                  steps: int | None = None, progress: bool = True, tokenizer_dir: str | Path | None = None,
                  command: str | None = None, overwrite: bool = False) -> dict:
    """Train tokenizer + model (Mixtral or DeepSeek-V3, config.arch) on corpus_root; save to out_dir -> training record.

    minutes/steps override the config's values; threads sets torch's intra-op threads (1 is fastest
    on a shared 2-core machine); tokenizer_dir reuses a saved tokenizer instead of training one (the
    fine-grained model shares the built-in model's); command is recorded in training.json. A non-empty
    out_dir is refused unless overwrite, and even then when it holds anything but checkpoint files
    (CHECKPOINT_FILES): the new checkpoint replaces the directory as a whole.
    """
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    cfg = config or builtin_config()
    if minutes is not None:
        cfg = dataclasses.replace(cfg, minutes=minutes)
    if steps is not None:
        cfg = dataclasses.replace(cfg, steps=steps)
    if threads < 1:
        raise ConfigError(f"--threads {threads} must be at least 1.")
    if cfg.steps is not None and cfg.steps < 1:
        raise ConfigError(f"--steps is {cfg.steps}; expected a positive number of steps.")
    if not cfg.minutes > 0:
        raise ConfigError(f"--minutes is {cfg.minutes}; expected a positive number of minutes.")
    if corpus_root is not None and not Path(corpus_root).is_dir():
        raise ConfigError(f"--corpus {corpus_root}: not a directory; expected a corpus built by `routecast corpus "
                          "build`.")
    torch.set_num_threads(threads)
    out_dir = check_out_dir(out_dir, "--out", overwrite=overwrite, owned=names_matcher(CHECKPOINT_FILES),
                            replaces_dir=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    t_start = time.time()

    manifest = read_manifest(corpus_root)
    train_docs = load_corpus("train", root=corpus_root)
    if tokenizer_dir is not None:
        tokenizer = load_tokenizer(tokenizer_dir)
    else:
        tokenizer = train_tokenizer(balanced_texts(train_docs, cfg.tokenizer_bytes_per_task),
                                    vocab_size=cfg.vocab_size, model_max_length=cfg.max_position_embeddings)
    tokenizer.save_pretrained(str(tmp))
    train_streams = encode_streams(tokenizer, train_docs, max_bytes_per_task=cfg.max_train_bytes_per_task)
    task_names = sorted(train_streams)
    streams = [train_streams[t] for t in task_names]
    val_streams = encode_streams(tokenizer, load_corpus("val", root=corpus_root))
    val_seqs = {t: windows(s, cfg.seq_len, cfg.val_seqs_per_task) for t, s in sorted(val_streams.items())}
    t_data = time.time() - t_start

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config(cfg, tokenizer))
    fine = cfg.arch == "deepseek-v3"
    tap = RouterTap(model) if fine else None
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "norm" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(seed)

    history: list[dict] = []
    tokens_per_step = cfg.batch_size * cfg.seq_len
    budget_s = cfg.minutes * 60
    bar = tqdm(total=cfg.steps, disable=not progress, dynamic_ncols=True, desc="train", mininterval=5.0)
    t_loop, step, elapsed = time.time(), 0, 0.0
    loss_ema = None
    while (step < cfg.steps) if cfg.steps is not None else (elapsed < budget_s):
        # Steps mode: the schedule follows steps (bit-reproducible). Minutes mode: it follows wall time,
        # so a shared machine that speeds up or slows down still gets a full decay inside the budget.
        done = step / cfg.steps if cfg.steps is not None else elapsed / budget_s
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, done, cfg)
        batch = _sample_batch(rng, streams, cfg)
        out = model(input_ids=batch[:, :-1], output_router_logits=not fine)
        # Our own loss over all seq_len targets (HF's labels path would drop the window's last target).
        lm_loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]),
                                                    batch[:, 1:].reshape(-1))
        if fine:
            aux = sequence_balance_loss(tap.logits, tap.ids, cfg.batch_size)
        elif cfg.aux_loss_kind == "per_layer":
            aux = per_layer_balance_loss(out.router_logits, cfg.top_k)
        else:
            aux = out.aux_loss
        loss = lm_loss + cfg.aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if fine:  # DeepSeek-V3's aux-loss-free balancing on this step's executed loads
            loads_LE = update_correction_bias(tap.gates, tap.ids, cfg.bias_update_rate)
        step += 1
        lm = float(lm_loss.detach())
        loss_ema = lm if loss_ema is None else 0.98 * loss_ema + 0.02 * lm
        elapsed = time.time() - t_loop
        postfix = {"loss": f"{loss_ema:.3f}", "tok/s": f"{step * tokens_per_step / elapsed:.0f}"}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            val = {t: mean_nll(model, s) for t, s in val_seqs.items()}
            history.append({"step": step, "tokens": step * tokens_per_step, "minutes": elapsed / 60,
                            "lr": opt.param_groups[0]["lr"], "train_loss": loss_ema,
                            "aux_loss": float(aux.detach()), "val_loss": val})
            if fine:  # max/mean load of this step per MoE layer, and the bias spread
                history[-1]["load_max_over_mean"] = (loads_LE.max(1).values / loads_LE.mean(1)).tolist()
                history[-1]["bias_abs_max"] = [float(g.e_score_correction_bias.abs().max()) for g in tap.gates]
            postfix["val"] = f"{np.mean(list(val.values())):.3f}"
            if cfg.steps is None:
                bar.total = int(step * budget_s / elapsed)  # estimated steps in the budget
        bar.set_postfix(postfix, refresh=False)
        bar.update(1)
    bar.close()
    train_minutes = (time.time() - t_loop) / 60

    model.eval()
    if tap is not None:
        tap.remove()
    final = {}
    for split in ("val", "test"):
        streams_s = val_streams if split == "val" else encode_streams(tokenizer, load_corpus(split, root=corpus_root))
        final[split] = {t: mean_nll(model, windows(s, cfg.seq_len, cfg.final_eval_tokens_per_task // cfg.seq_len))
                        for t, s in sorted(streams_s.items())}
    model.config.output_router_logits = False  # capture code asks for router logits explicitly
    model.save_pretrained(str(tmp), safe_serialization=True)
    record = {
        "config": dataclasses.asdict(cfg), "seed": seed, "threads": threads, "steps": step,
        "schedule": "steps" if cfg.steps is not None else "wall time", "tokens_seen": step * tokens_per_step,
        "train_minutes": train_minutes, "data_prep_minutes": t_data / 60,
        "tokens_per_s": step * tokens_per_step / max(1e-9, train_minutes * 60),
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus": {"root": str(corpus_root) if corpus_root else "routecast/models/data (shipped sample)",
                   "kind": manifest.get("kind"), "seed": manifest.get("seed"),
                   "train_tokens_per_task": {t: int(len(s)) for t, s in train_streams.items()},
                   "sources": {t: {k: v[k] for k in ("source", "license")} for t, v in manifest["tasks"].items()}},
        "val_loss_per_task": final["val"], "test_loss_per_task": final["test"],
        "eval_tokens_per_task": cfg.final_eval_tokens_per_task, "history": history,
        "torch": torch.__version__, "command": command,
        "tokenizer": str(tokenizer_dir) if tokenizer_dir is not None else "trained with the model",
    }
    (tmp / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    for f in tmp.iterdir():
        fix_mode(f)  # safetensors writes 0600; the checkpoint ships inside the package
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _move_into_place(tmp, out_dir)
    return record


def eval_per_domain(model_dir: str | Path, split: str = "val", *, root: str | Path | None = None,
                    max_tokens_per_task: int = 65_536, seq_len: int | None = None, threads: int = 1) -> dict[str, float]:
    """Mean next-token NLL (nats/token) per task on a corpus split (default: the shipped sample) -> {task: nll}."""
    if split not in SPLITS:
        raise ConfigError(f"split '{split}' is not one of {list(SPLITS)}.")
    torch.set_num_threads(threads)
    model, tokenizer = load_model(model_dir)
    if seq_len is None:
        rec = Path(model_dir) / "training.json"
        seq_len = json.loads(rec.read_text())["config"]["seq_len"] if rec.is_file() else 256
    streams = encode_streams(tokenizer, load_corpus(split, root=root))
    return {t: mean_nll(model, windows(s, seq_len, max(1, max_tokens_per_task // seq_len)))
            for t, s in sorted(streams.items())}


def build_parser():
    """The parser of `routecast train-builtin`."""

    p = N.Parser(prog="routecast train-builtin", description="Train the built-in MoE model.")
    p.add_argument("--out", required=True, help="output checkpoint directory (replaced atomically at the end)")
    p.add_argument("--minutes", type=N.real(0.0, 1e6, lo_open=True), default=40.0, help="training wall time in minutes (default 40)")
    p.add_argument("--steps", type=N.positive(10**9), default=None, help="fixed number of steps (overrides --minutes; reproducible)")
    p.add_argument("--seed", type=N.seed(), default=0, help="seed of init and data order (default 0)")
    p.add_argument("--threads", type=N.threads(), default=1, help="torch threads (default 1: fastest on 2 shared cores)")
    p.add_argument("--corpus", default=None, help="corpus directory (default: the shipped sample)")
    p.add_argument("--tiny", action="store_true", help="use the test-sized preset (d64, BPE 1024, 100 steps)")
    p.add_argument("--arch", choices=ARCHES, default="mixtral",
                   help="mixtral: the built-in model (default); deepseek-v3: builtin-fine (64 experts top-6, grouped)")
    p.add_argument("--tokenizer", default=None,
                   help="reuse this checkpoint's tokenizer (default for deepseek-v3: the built-in model's; else train one)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the checkpoint at a non-empty --out (refused if it holds other files)")
    return N.annotate_help(p)


def main(argv: list[str] | None = None) -> int:
    """`python -m routecast.models.train --out DIR [--minutes M] [--steps N] [--seed S] [--threads T] [--corpus DIR]`."""
    import sys

    try:
        args = build_parser().parse_args(argv)
    except N.UsageError as e:
        print(f"{e.prog}: error: {e}", file=sys.stderr)
        return 2
    declare_inputs(args, ("--corpus", "--tokenizer"))  # --out may not be, hold or lie inside either
    if args.arch == "deepseek-v3":
        cfg = fine_config(**(_TINY_FINE if args.tiny else {}))
    else:
        cfg = tiny_config() if args.tiny else builtin_config()
    tok = args.tokenizer
    if tok is None and args.arch == "deepseek-v3" and not args.tiny:
        tok = check_checkpoint()
    try:
        rec = train_builtin(args.out, minutes=args.minutes, steps=args.steps, seed=args.seed,
                            threads=args.threads, config=cfg, corpus_root=args.corpus, tokenizer_dir=tok,
                            overwrite=args.overwrite,
                            command=" ".join(["routecast train-builtin", *(argv if argv is not None else sys.argv[1:])]))
    except ConfigError as exc:
        print(f"routecast train-builtin: error: {exc}", file=sys.stderr)
        return 2
    val = ", ".join(f"{t} {v:.3f}" for t, v in rec["val_loss_per_task"].items())
    print(f"saved {args.out}: {rec['steps']} steps, {rec['tokens_seen']} tokens, "
          f"{rec['train_minutes']:.1f} min; val NLL {val}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
