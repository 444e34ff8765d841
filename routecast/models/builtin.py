"""The built-in MoE model shipped with routecast: where it lives and how to load it.

The checkpoint in ``routecast/models/builtin/`` is a real Hugging Face ``MixtralForCausalLM``
(4 layers, 8 SwiGLU experts routed top-2 per layer, hidden 128, byte-level BPE vocabulary 4096)
trained on the corpus of ``corpus.py`` by ``train.py``; ``training.json`` beside it records the
config, seed, data, steps, tokens seen, wall time and per-task validation/test NLL. Rebuild it with::

    python -m routecast.models.train --out routecast/models/builtin --minutes 40 --seed 0 \\
        --threads 1 --corpus corpus_build

Loading needs no network: ``load_builtin()`` -> (model in eval mode, tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path

from routecast.common.errors import ConfigError

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def builtin_path() -> Path:
    """Directory of the shipped checkpoint (routecast/models/builtin), whether or not it is present."""
    return BUILTIN_DIR


def check_checkpoint(model_dir: str | Path | None = None) -> Path:
    """Path of a complete checkpoint dir (default: the built-in one); ConfigError naming the missing file."""
    model_dir = Path(model_dir) if model_dir is not None else BUILTIN_DIR
    for name in REQUIRED_FILES:
        if not (model_dir / name).is_file():
            raise ConfigError(
                f"model checkpoint file {model_dir / name} is missing; expected a checkpoint saved by "
                "`routecast train-builtin` (python -m routecast.models.train --out DIR).")
    return model_dir


def builtin_info(model_dir: str | Path | None = None) -> dict:
    """training.json of the checkpoint (config, steps, tokens, per-task losses) -> dict ({} if absent)."""
    path = check_checkpoint(model_dir) / "training.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def load_builtin(model_dir: str | Path | None = None, *, threads: int | None = 1):
    """-> (MixtralForCausalLM in eval mode, fp32, on CPU; its tokenizer), loaded offline.

    threads: torch intra-op threads to set (1 is fastest on small shared machines; None leaves it).
    """
    import torch

    from routecast.models.train import load_model

    if threads is not None:
        torch.set_num_threads(threads)
    return load_model(check_checkpoint(model_dir))
