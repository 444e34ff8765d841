"""Token embeddings for the neural predictors: the MoE model's own input embedding table.

MoE-GPS trains its FFN and LSTM predictors on the model's token embeddings. ``load_input_embeddings``
reads that table by name from a checkpoint's ``*.safetensors`` files without loading the model;
``resolve_model_dir`` decides which checkpoint belongs to a trace (an explicit directory, the word
"builtin" / "builtin-fine", or the trace's provenance naming a shipped model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError

# Tensor names of the input embedding table in common HF checkpoints, most common first.
EMBEDDING_NAMES = (
    "model.embed_tokens.weight",  # Mixtral, Qwen-MoE, DeepSeek, OLMoE, Llama-like
    "embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
    "transformer.wte.weight",  # GPT-2 style
    "gpt_neox.embed_in.weight",
    "shared.weight",  # T5 / Switch Transformer
    "encoder.embed_tokens.weight",
)

# Provenance keys a capture may use to name the model a trace came from.
_PROVENANCE_KEYS = ("model", "model_name", "model_dir", "model_path", "checkpoint")


def load_input_embeddings(model_dir: str | Path, names: tuple[str, ...] = EMBEDDING_NAMES) -> np.ndarray:
    """The model's input embedding table, float32 (V, D), found by tensor name in model_dir/*.safetensors.

    The first of `names` present in any shard wins; bf16/fp16 tables are widened to float32.
    """
    from safetensors import safe_open

    d = Path(model_dir)
    if not d.is_dir():
        raise ConfigError(f"model directory {d} does not exist; expected a checkpoint folder with *.safetensors files.")
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model directory {d} holds no *.safetensors file; expected the checkpoint's weight shards.")
    found: dict[str, Path] = {}
    for f in files:
        try:
            # "pt" because numpy has no bfloat16, the usual dtype of released checkpoints.
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    if k in names:
                        found.setdefault(k, f)
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise ConfigError(f"{f} could not be read as safetensors ({e}); expected a valid checkpoint shard.") from None
    for name in names:
        if name in found:
            with safe_open(str(found[name]), framework="pt") as h:
                t = h.get_tensor(name)
            if t.ndim != 2:
                raise ConfigError(f"{found[name]}: tensor {name} has shape {tuple(t.shape)}; expected (vocab, hidden).")
            return t.float().numpy()
    raise ConfigError(
        f"model directory {d}: none of the tensors {list(names)} is in its {len(files)} *.safetensors file(s); "
        "expected the model's input embedding table."
    )


def builtin_model_dir(name: str = "builtin") -> Path:
    """A shipped checkpoint's folder ('builtin' or 'builtin-fine'), or a ConfigError saying why it is not there."""
    try:
        from routecast.models.builtin import builtin_path
    except ImportError:
        raise ConfigError(
            f"--model {name}: routecast.models.builtin is not installed; expected the built-in model package."
        ) from None
    p = Path(builtin_path(name))
    if not p.is_dir() or not any(p.glob("*.safetensors")):
        raise ConfigError(f"--model {name}: {p} holds no trained checkpoint; expected *.safetensors (train it first).")
    return p


def _names_builtin(provenance: dict[str, Any]) -> str | None:
    """'builtin-fine' or 'builtin' when the provenance names a shipped model (the longer name first), else None."""
    vals = [str(provenance.get(k, "")).lower() for k in _PROVENANCE_KEYS]
    for name in ("builtin-fine", "builtin"):
        if any(name in v for v in vals):
            return name
    return None


def resolve_model_dir(model: str | Path | None, provenance: dict[str, Any] | None = None) -> Path | None:
    """Which checkpoint's embeddings to use: None means none (the neural predictors learn their own).

    model: a directory, "builtin", "builtin-fine", "none", or None = infer from the provenance: a trace whose
    provenance names a shipped model uses it when its checkpoint exists; a provenance model
    directory that exists and holds *.safetensors is used; otherwise None.
    """
    if model is not None:
        if str(model).lower() == "none":
            return None
        if str(model).lower() in ("builtin", "builtin-fine"):
            return builtin_model_dir(str(model).lower())
        p = Path(model)
        if not p.is_dir():
            raise ConfigError(f"--model {model}: no such directory; expected a checkpoint folder, 'builtin', "
                              "'builtin-fine' or 'none'.")
        _safetensors_only(p, f"--model {model}")
        return p
    prov = provenance or {}
    named = _names_builtin(prov)
    if named:
        try:
            return builtin_model_dir(named)
        except ConfigError:
            return None
    for k in _PROVENANCE_KEYS:
        v = prov.get(k)
        if isinstance(v, str) and v and Path(v).is_dir():
            _safetensors_only(Path(v), f"the trace's provenance field {k!r} ({v})")
            return Path(v)
    return None


def _safetensors_only(d: Path, what: str) -> None:
    # routecast reads weights from safetensors only: a folder of pickles (pytorch_model.bin) would make
    # transformers call torch.load, which can run code; refuse it here, before anything loads it.
    if not any(d.glob("*.safetensors")):
        pickles = sorted(p.name for p in d.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        held = f"only pickle weights ({', '.join(pickles[:3])})" if pickles else "no *.safetensors file"
        raise ConfigError(f"{what}: the model folder holds {held}; expected *.safetensors weights (routecast never "
                          "unpickles weights), or pass --model none.")
