"""The built-in MoE model shipped with routecast: where it lives and how to load it.

Two checkpoints ship, both trained on the corpus of ``corpus.py`` by ``train.py``; ``training.json``
beside each records the config, seed, data, steps, tokens seen, wall time and per-task validation/test NLL.

- ``builtin`` (``routecast/models/builtin/``): a Hugging Face ``MixtralForCausalLM`` (4 layers, 8 SwiGLU
  experts routed top-2 per layer, hidden 128, byte-level BPE vocabulary 4096). Rebuild it with::

    python -m routecast.models.train --out routecast/models/builtin --minutes 40 --seed 0 \\
        --threads 1 --corpus corpus_build

- ``builtin-fine`` (``routecast/models/builtin-fine/``): a ``DeepseekV3ForCausalLM`` with fine-grained
  experts (6 layers, the first dense; 64 routed experts top-6 in 8 groups of which 4 are eligible,
  sigmoid scores with the correction bias, 1 shared expert, hidden 128, the same tokenizer)::

    python -m routecast.models.train --arch deepseek-v3 --out routecast/models/builtin-fine --minutes 40 \\
        --seed 0 --threads 1 --corpus corpus_build

Loading needs no network: ``load_builtin()`` -> (model in eval mode, tokenizer); ``load_model(dir)`` loads any
checkpoint ``train.py`` saved (it lives here, not in train.py, so training imports loading and not the reverse).
"""

from __future__ import annotations

import json
from pathlib import Path

from routecast.common.errors import ConfigError

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
FINE_DIR = Path(__file__).resolve().parent / "builtin-fine"
# --model names of the shipped checkpoints -> their folders (the folder name is also the trace's spec.name).
BUILTIN_MODELS = {"builtin": BUILTIN_DIR, "builtin-fine": FINE_DIR}
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def is_builtin_name(name: object) -> bool:
    """True for 'builtin' and 'builtin-fine' (any case): names of the shipped checkpoints."""
    return str(name).lower() in BUILTIN_MODELS


def builtin_path(name: str = "builtin") -> Path:
    """Directory of a shipped checkpoint ('builtin' or 'builtin-fine'), whether or not it is present."""
    if not is_builtin_name(name):
        raise ConfigError(f"--model {name!r} is not a built-in model; expected one of {', '.join(BUILTIN_MODELS)}.")
    return BUILTIN_MODELS[str(name).lower()]


def check_checkpoint(model_dir: str | Path | None = None) -> Path:
    """Path of a complete checkpoint dir (default: the built-in one; a built-in name is resolved); ConfigError naming the missing file."""
    if model_dir is not None and is_builtin_name(model_dir):
        model_dir = builtin_path(str(model_dir))
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
    """-> (MixtralForCausalLM, or DeepseekV3ForCausalLM for 'builtin-fine', in eval mode, fp32, CPU; tokenizer), offline.

    model_dir: a checkpoint folder or a built-in name; None = 'builtin'.

    threads: torch intra-op threads to set (1 is fastest on small shared machines; None leaves it).
    """
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    return load_model(check_checkpoint(model_dir))


def load_model(model_dir: str | Path):
    """A saved checkpoint dir -> (its HF causal LM, Mixtral or DeepSeek-V3, in eval mode; tokenizer), offline."""
    import torch
    from transformers import AutoModelForCausalLM

    from routecast.models.tokenizer import load_tokenizer

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file() or not (model_dir / "model.safetensors").is_file():
        raise ConfigError(f"{model_dir} holds no config.json + model.safetensors; expected a checkpoint saved by train_builtin.")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    model.eval()
    return model, load_tokenizer(model_dir)
