"""eMoE's task sensitivity profiling (§2.2.3, §3.4) on a real model, and the held-out text it runs on.

Text: windows of ``seq_len`` + 1 tokens cut from corpus documents (default: the shipped sample), ``per_task``
windows per task, spread over the split's documents round-robin (seeded). A "prompt" is one window; its
perplexity is measured teacher-forced on its own tokens.

Profiling, per task: the model runs the task's windows with the routing of MoE layers 0..j-1 (the j layers
nearest the input) replaced by random routing (``RoutingOverride.set_random``), j = 0..L. Measured against
the unmodified model (j = 0): output similarity = the share of positions where the next-token choice (argmax)
is the same, the mean cosine similarity of the next-token distributions, and perplexity. As in the paper,
layers 0..j-1 are routing-insensitive for the task when randomising them keeps similarity >= the threshold
(default 0.85); the largest such j counts, the other layers are sensitive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from routecast.common.errors import ConfigError
from routecast.models.corpus import load_corpus
from routecast.trace.override import RoutingOverride


@dataclass(frozen=True, kw_only=True)
class TextConfig:
    """Held-out text: split, windows per task, tokens per window (+1 for the last target), seed."""

    split: str = "val"
    per_task: int = 8
    seq_len: int = 64
    seed: int = 0
    corpus: str | None = None

    def __post_init__(self) -> None:
        if self.per_task < 1 or self.seq_len < 2:
            raise ConfigError(f"text config {self}: expected per_task >= 1 and seq_len >= 2 tokens.")


def text_windows(tokenizer: Any, cfg: TextConfig) -> tuple[list[str], torch.Tensor, np.ndarray, list[str]]:
    """-> (task names, int64 [W, seq_len + 1] windows, int (W,) task index, document of each window).

    Windows are in a seeded random order that mixes tasks (the arrival order of the prompts).
    """
    docs = load_corpus(cfg.split, root=cfg.corpus)
    rng = np.random.default_rng(cfg.seed)
    tasks = sorted({d.task for d in docs})
    rows, task_of, doc_of = [], [], []
    n = cfg.seq_len + 1
    encode = tokenizer.backend_tokenizer.encode
    for ti, task in enumerate(tasks):
        cuts: list[list[tuple[str, np.ndarray]]] = []
        mine = [d for d in docs if d.task == task]
        have = 0
        for k in rng.permutation(len(mine)):  # documents in a seeded order, tokenised only until enough windows
            d = mine[k]
            ids = np.asarray(encode(d.text, add_special_tokens=True).ids, np.int64)
            w = len(ids) // n
            if w:
                starts = rng.permutation(w)[: cfg.per_task] * n
                cuts.append([(f"{task}/{d.doc_id}", ids[s:s + n]) for s in starts])
                have += len(starts)
            if len(cuts) >= cfg.per_task or have >= 4 * cfg.per_task:
                break
        got = 0
        while got < cfg.per_task and any(cuts):  # round-robin over documents
            for c in cuts:
                if c and got < cfg.per_task:
                    doc, ids = c.pop(0)
                    rows.append(ids)
                    task_of.append(ti)
                    doc_of.append(doc)
                    got += 1
        if got == 0:
            raise ConfigError(f"corpus split {cfg.split!r} has no {task} document of {n}+ tokens; expected longer text.")
    order = rng.permutation(len(rows))
    return tasks, torch.from_numpy(np.stack(rows)[order]), np.asarray(task_of)[order], [doc_of[i] for i in order]


@torch.no_grad()
def window_nll(model: Any, windows: torch.Tensor, batch: int = 16) -> tuple[np.ndarray, torch.Tensor]:
    """-> (float (W,) summed next-token NLL per window in nats, log-probabilities [W, S, V] float32)."""
    nll, logp = [], []
    for i in range(0, len(windows), batch):
        x = windows[i:i + batch]
        lp = model(input_ids=x[:, :-1]).logits.float().log_softmax(-1)
        logp.append(lp)
        nll.append(-lp.gather(-1, x[:, 1:, None])[..., 0].sum(1).double().numpy())
    return np.concatenate(nll), torch.cat(logp)


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Per task and number j of randomised input-side layers (0..L): similarity, cosine, perplexity; sensitivity.

    agree_NJ / cosine_NJ / ppl_NJ float (N, L+1); sensitive_NL bool; insensitive_prefix_N int (the j chosen).
    """

    tasks: tuple[str, ...]
    agree_NJ: np.ndarray
    cosine_NJ: np.ndarray
    ppl_NJ: np.ndarray
    sensitive_NL: np.ndarray
    insensitive_prefix_N: np.ndarray
    threshold: float
    tokens_N: np.ndarray

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": list(self.tasks), "threshold": self.threshold, "tokens": self.tokens_N.tolist(),
                "agreement": self.agree_NJ.tolist(), "cosine": self.cosine_NJ.tolist(), "perplexity": self.ppl_NJ.tolist(),
                "sensitive": self.sensitive_NL.astype(int).tolist(),
                "insensitive_prefix": self.insensitive_prefix_N.tolist()}


def profile_sensitivity(model: Any, tasks: list[str], windows: torch.Tensor, task_of: np.ndarray, *,
                        threshold: float = 0.85, seed: int = 0, progress: bool = True) -> Profile:
    """Progressively randomise routing from the input side, per task (see the module docstring)."""
    if not 0 < threshold <= 1:
        raise ConfigError(f"--threshold is {threshold}; expected a similarity in (0, 1].")
    with RoutingOverride(model) as ov:
        L = ov.spec.num_layers
        N = len(tasks)
        agree, cos, ppl = np.zeros((N, L + 1)), np.zeros((N, L + 1)), np.zeros((N, L + 1))
        toks = np.zeros(N, np.int64)
        bar = tqdm(total=N * (L + 1), desc="profile", disable=not progress, leave=False)
        for n in range(N):
            x = windows[task_of == n]
            toks[n] = x[:, 1:].numel()
            ref = None
            for j in range(L + 1):
                ov.set_random(set(range(j)), seed=seed + 1000 * n + j)
                nll, lp = window_nll(model, x)
                if j == 0:
                    ref = lp
                agree[n, j] = float((lp.argmax(-1) == ref.argmax(-1)).double().mean())
                cos[n, j] = float(torch.nn.functional.cosine_similarity(lp.exp(), ref.exp(), dim=-1).double().mean())
                ppl[n, j] = float(np.exp(nll.sum() / toks[n]))
                bar.update(1)
        bar.close()
        ov.set_random(set())
    ok = agree >= threshold  # (N, L+1); j = 0 always passes
    prefix = np.array([int(np.max(np.flatnonzero(row))) for row in ok], np.int64)
    sensitive = np.arange(L)[None, :] >= prefix[:, None]
    return Profile(tasks=tuple(tasks), agree_NJ=agree, cosine_NJ=cos, ppl_NJ=ppl, sensitive_NL=sensitive,
                   insensitive_prefix_N=prefix, threshold=float(threshold), tokens_N=toks)


def format_profile(p: Profile) -> str:
    """Text table: per task, similarity (agreement) and perplexity with 0..L input-side layers randomised."""
    L = p.sensitive_NL.shape[1]
    head = f"{'task':<8} {'tokens':>6} | " + " ".join(f"{'rand ' + str(j):>13}" for j in range(L + 1)) + \
        " | sensitive MoE layers (0 = first)"
    lines = [f"similarity (next-token agreement) / perplexity with the first j MoE layers routed at random; "
             f"threshold {p.threshold:.2f}", head, "-" * len(head)]
    for n, t in enumerate(p.tasks):
        cells = " ".join(f"{p.agree_NJ[n, j]:>5.3f}/{p.ppl_NJ[n, j]:>7.1f}" for j in range(L + 1))
        sens = ",".join(str(x) for x in np.flatnonzero(p.sensitive_NL[n])) or "none"
        lines.append(f"{t:<8} {p.tokens_N[n]:>6} | {cells} | {sens}")
    return "\n".join(lines)
