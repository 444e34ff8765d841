"""`routecast emoe profile|quality`: eMoE's task sensitivity and its perplexity under fallback, on a real model.

profile: per task, similarity and perplexity with the first j MoE layers routed at random (j = 0..L), and the
layers each task is sensitive to. quality: perplexity per domain with a budget of the experts resident, for
eMoE's choice, random, LRU and an oracle against the full model. Both print a table and write JSON to --out
(--json prints the JSON instead). See runtime/emoe/profile.py and runtime/emoe/quality.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from routecast.common import numbers as N
from routecast.common.errors import ConfigError
from routecast.common.outputs import writes


def add_parser(sub: Any) -> None:
    """Register `routecast emoe` on the top-level subparsers."""
    p = sub.add_parser("emoe", help="eMoE on a real model: task sensitivity profile, perplexity under expert fallback")
    p.add_argument("action", choices=("profile", "quality"),
                   help="profile: sensitivity table per task; quality: perplexity vs resident-expert budget")
    p.add_argument("--model", default="builtin-fine", help="'builtin', 'builtin-fine' or an HF MoE folder (default builtin-fine)")
    p.add_argument("--budget", type=N.budget_text(allow_list=True, allow_bytes=False), default="50%",
                   help="quality: share of each MoE layer's experts kept resident, e.g. 50%% (comma list allowed)")
    p.add_argument("--residency", default="emoe,random,lru,oracle",
                   help="quality: comma-separated choices of resident experts: emoe, emoe-flat, random, lru, oracle")
    p.add_argument("--period", type=N.positive(1 << 20), default=1,
                   help="quality: choose the resident experts again every p prompts (default 1)")
    p.add_argument("--reuse", default="", help="quality: extra periods p to run at the first budget, e.g. 5,20,40")
    p.add_argument("--per-task", type=N.positive(1 << 16), default=8,
                   help="prompts (text windows) per task in the evaluation and the warm-up text (default 8)")
    p.add_argument("--seq-len", type=N.positive(1 << 16), default=64, help="tokens per prompt (default 64)")
    p.add_argument("--threshold", type=N.real(0.0, 1.0, lo_open=True), default=0.85,
                   help="similarity above which randomised layers count as routing-insensitive (default 0.85)")
    p.add_argument("--split", default=None,
                   help="corpus split of the text (default: profile test, quality val; the warm-up is test)")
    p.add_argument("--epochs", type=N.positive(100000), default=300, help="eMoE predictor training epochs")
    p.add_argument("--seed", type=N.seed(), default=0, help="random seed (default 0)")
    p.add_argument("--out", default=None, help="JSON output file (default out/emoe/<action>.json)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--threads", type=N.threads(), default=1, help="torch CPU threads (default 1)")
    p.set_defaults(fn=emoe_main)


def _fractions(text: str) -> tuple[float, ...]:
    from routecast.cache.emoe import parse_fraction

    items = [x for x in str(text).split(",") if x.strip()]
    if not items:
        raise ConfigError(f"--budget is {text!r}; expected a share of the experts such as 50%.")
    return tuple(parse_fraction(x) for x in items)


def _periods(text: str) -> tuple[int, ...]:
    out = []
    for x in [x.strip() for x in str(text).split(",") if x.strip()]:
        if not x.isdigit() or int(x) < 1:
            raise ConfigError(f"--reuse holds {x!r}; expected whole numbers of prompts >= 1, e.g. 5,20,40.")
        out.append(int(x))
    return tuple(out)


@writes("--out", inputs=("--model",))
def emoe_main(a: argparse.Namespace) -> int:
    """Handler of `routecast emoe`: checks every argument before loading the model."""
    import torch

    from routecast.cache.emoe import check_residency
    from routecast.common.outputs import check_out_file, write_atomic
    from routecast.models.corpus import SPLITS
    from routecast.runtime.emoe.profile import TextConfig
    from routecast.trace.capture_inputs import load_model

    budgets = _fractions(a.budget)
    residency = tuple(check_residency([x.strip() for x in a.residency.split(",") if x.strip()]))
    reuse = _periods(a.reuse)
    if a.split is not None and a.split not in SPLITS:
        raise ConfigError(f"--split is {a.split!r}; expected one of {', '.join(SPLITS)}.")
    if not 0 < a.threshold <= 1:
        raise ConfigError(f"--threshold is {a.threshold}; expected a similarity in (0, 1].")
    out = check_out_file(a.out or f"out/emoe/{a.action}.json", "--out")
    torch.set_num_threads(max(1, a.threads))
    model, tokenizer = load_model(a.model)
    if a.action == "profile":
        from routecast.runtime.emoe.profile import format_profile, profile_sensitivity, text_windows

        text = TextConfig(split=a.split or "test", per_task=a.per_task, seq_len=a.seq_len, seed=a.seed)
        tasks, windows, task_of, _ = text_windows(tokenizer, text)
        prof = profile_sensitivity(model, tasks, windows, task_of, threshold=a.threshold, seed=a.seed,
                                   progress=not a.quiet)
        res = {"model": str(a.model), "split": text.split, **prof.as_dict()}
        table = format_profile(prof)
    else:
        from routecast.predict.emoe import EmoeConfig
        from routecast.runtime.emoe.quality import QualityConfig, format_quality, run_quality

        cfg = QualityConfig(
            budgets=budgets, residency=residency, period=a.period, reuse_periods=reuse, reuse_budget=budgets[0],
            threshold=a.threshold, seed=a.seed, predictor=EmoeConfig(epochs=a.epochs, seed=a.seed),
            eval_text=TextConfig(split=a.split or "val", per_task=a.per_task, seq_len=a.seq_len, seed=a.seed),
            warmup_text=TextConfig(split="test", per_task=a.per_task, seq_len=a.seq_len, seed=a.seed + 1))
        res = run_quality(model, tokenizer, cfg, progress=not a.quiet)
        table = format_quality(res)
    text_json = json.dumps(res, indent=1)
    write_atomic(out, text_json, "--out")
    print(text_json if a.json else f"{table}\nwrote {Path(out)}")
    return 0
