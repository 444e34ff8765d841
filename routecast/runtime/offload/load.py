"""Load a model for offloaded inference without materialising its routed experts (issue 20: peak memory).

``load_without_experts(name)`` builds the model on the meta device (transformers' own constructor, no weights),
materialises every module except the experts modules of its MoE blocks (empty CPU storage, then the checkpoint's
tensors read one by one with safetensors' safe_open), re-initialises the non-persistent buffers the checkpoint does
not hold (rotary inv_freq: transformers' _init_weights on parameter-less modules), and ties the embeddings where the
config says so. The fused expert parameters stay on the meta device (shape and dtype only: no bytes) until
OffloadedModel removes them; the experts are then read from the same checkpoint into the fast tier's slots. Peak
memory is therefore the non-expert weights plus the --budget slots, never the whole model (tested by peak RSS in a
subprocess: tests/runtime/test_offload_memory.py).

Exactness: every non-expert tensor is the checkpoint's, bit for bit; the test compares every step's logits with
the model transformers loads itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from routecast.common.errors import ConfigError


def model_path(name: str | Path) -> Path:
    """A built-in name or a model folder -> the checkpoint folder (a folder is checked when it is loaded)."""
    from routecast.models.builtin import check_checkpoint, is_builtin_name

    if Path(str(name)).is_dir() or not is_builtin_name(str(name)):
        return Path(str(name))
    return Path(check_checkpoint(str(name)))


def load_without_experts(name: str | Path) -> tuple[nn.Module, Any]:
    """(model in eval mode, tokenizer) with every routed expert's fused tensors on the meta device (no bytes)."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from routecast.trace.capture_arch import adapter_for, find_blocks
    from routecast.trace.capture_inputs import check_model_dir

    path = model_path(name)
    check_model_dir(path)
    cfg = AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
    blocks = find_blocks(model, adapter_for(model))
    experts = {id(b.experts) for b in blocks}
    expert_prefixes = tuple(f"{n}." for n, m in model.named_modules() if id(m) in experts)
    for m in model.modules():
        if id(m) not in experts:
            m.to_empty(device="cpu", recurse=False)
    state = model.state_dict(keep_vars=True)
    loaded: set[str] = set()
    with torch.no_grad():
        for f in sorted(path.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    key = _model_key(name, state)
                    if key is None or key.startswith(expert_prefixes):
                        continue
                    dst = state[key]
                    src = st.get_tensor(name)
                    if tuple(src.shape) != tuple(dst.shape):
                        raise ConfigError(f"--model {path}: tensor {key} has shape {list(src.shape)} in {f.name}; "
                                          f"expected {list(dst.shape)} from its config.")
                    dst.copy_(src)
                    loaded.add(key)
        for m in model.modules():  # non-persistent buffers (rotary inv_freq) the checkpoint lacks
            if id(m) not in experts and not any(True for _ in m.parameters(recurse=False)) and \
                    any(True for _ in m.buffers(recurse=False)):
                model._init_weights(m)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
        loaded |= {k for k, v in model.state_dict(keep_vars=True).items()
                   if any(v is w for w in (model.get_input_embeddings().weight,))}
    missing = [k for k, v in model.state_dict(keep_vars=True).items()
               if k not in loaded and not k.startswith(expert_prefixes) and not _non_persistent(model, k)]
    if missing:
        raise ConfigError(f"--model {path}: the checkpoint holds no tensor {missing[0]} ({len(missing)} missing); "
                          "expected every non-expert weight of the model.")
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    return model.eval(), tok


_ALIASES = ((".block_sparse_moe.", ".mlp."),)  # checkpoint name -> transformers 5 module name (Mixtral)


def _model_key(name: str, state: dict) -> str | None:
    """The model's state-dict key of checkpoint tensor `name` (the name itself, or under a known alias), or None."""
    if name in state:
        return name
    for a, b in _ALIASES:
        if a in name and name.replace(a, b) in state:
            return name.replace(a, b)
    return None


def _non_persistent(model: nn.Module, key: str) -> bool:
    mod_name, _, buf = key.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    return buf in getattr(mod, "_non_persistent_buffers_set", ())
