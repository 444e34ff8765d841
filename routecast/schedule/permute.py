"""Speculative expert pre-grouping (s-EG, s-MoE Appendix B): apply a co-clustering plan's expert permutation offline.

Legend: L MoE layers, E experts, K top-k. perm_LE[l, j] = the old expert that new slot j of layer l holds
(CoclusterPlan.expert_permutation_LE: rank g's experts fill slots g*E/G .. (g+1)*E/G - 1, so plain contiguous
EP sharding of the permuted model realises the plan's expert groups).

- permute_trace: the same routing with expert ids renamed (experts_TLK, logits_TLE columns, the recorded router
  correction bias), so every downstream stage sees the pre-grouped layout.
- permute_checkpoint (`routecast permute-experts --model DIR --plan PLAN --out DIR2`): loads a transformers
  checkpoint (safetensors only), permutes every MoE block's experts (fused [E, ...] tensors or a list of expert
  modules; found through the capture adapters) and the router's rows (weight, bias, DeepSeek-V3's
  e_score_correction_bias), and saves it with its tokenizer. The router then scores expert slot j with old
  expert perm[j]'s row and slot j runs old expert perm[j]'s weights: the same function, so greedy generations
  are identical (tests/schedule/test_permute.py).
- Grouped routers (DeepSeek-V3 n_group > 1) choose among contiguous expert groups first: a permutation that
  moved an expert into another group's block would change which experts are eligible, so it is refused unless
  it maps whole groups onto whole group blocks (plans made with `--respect-groups` do).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from routecast.common.errors import ConfigError
from routecast.trace import MoESpec, Trace


def check_permutation(perm_LE: np.ndarray, spec: MoESpec, where: str = "--plan") -> np.ndarray:
    """perm_LE as int64 (L, E) after checking every row is a permutation that keeps router groups whole."""
    p = np.asarray(perm_LE)
    L, E = spec.num_layers, spec.num_experts
    if p.shape != (L, E) or not np.issubdtype(p.dtype, np.integer):
        raise ConfigError(f"{where}: expert permutation has shape {p.shape}; expected ({L}, {E}) integers.")
    p = p.astype(np.int64)
    if not np.array_equal(np.sort(p, axis=1), np.broadcast_to(np.arange(E), (L, E))):
        raise ConfigError(f"{where}: a layer's expert permutation repeats or misses an expert; expected each of 0..{E - 1} once.")
    if spec.n_group > 1:
        gs = E // spec.n_group
        old_group = (p // gs).reshape(L, spec.n_group, gs)
        if np.any(old_group != old_group[:, :, :1]):
            raise ConfigError(
                f"{where}: the permutation moves experts between the router's {spec.n_group} expert groups (of {gs}), "
                "which would change the group-limited routing; expected a plan made with --respect-groups.")
    return p


def permute_trace(trace: Trace, perm_LE: np.ndarray) -> Trace:
    """The trace with expert ids renamed by perm_LE (new slot j = old expert perm[l, j]); routing unchanged."""
    s = trace.spec
    p = check_permutation(perm_LE, s, "permute_trace")
    inv_LE = np.argsort(p, axis=1)  # old expert -> new slot
    ex = np.asarray(trace.experts_TLK)
    layer = np.arange(s.num_layers)[None, :, None]
    new = np.where(ex >= 0, inv_LE[layer, np.maximum(ex, 0)], -1).astype(np.int16)
    logits = None
    if trace.logits_TLE is not None:
        logits = np.take_along_axis(np.asarray(trace.logits_TLE), p[None], axis=2)
    prov = dict(trace.provenance)
    bias = prov.get("router_correction_bias_LE")
    if isinstance(bias, list) and np.shape(bias) == (s.num_layers, s.num_experts):
        prov["router_correction_bias_LE"] = np.take_along_axis(np.asarray(bias, float), p, axis=1).tolist()
    prov["expert_permutation_LE"] = p.tolist()
    return Trace(spec=s, tokens={k: np.asarray(v) for k, v in trace.tokens.items()}, experts_TLK=new,
                 weights_TLK=np.asarray(trace.weights_TLK), logits_TLE=logits,
                 hidden_TLH=None if trace.hidden_TLH is None else np.asarray(trace.hidden_TLH),
                 task_names=trace.task_names, source_names=trace.source_names, provenance=prov)


def permute_model(model, perm_LE: np.ndarray) -> int:
    """Permute a loaded transformers MoE model in place; returns the number of tensors permuted."""
    import torch
    from torch import nn

    from routecast.trace.capture_arch import find_blocks, spec_from_model

    blocks = find_blocks(model)
    spec = spec_from_model(model, blocks)
    p = check_permutation(perm_LE, spec)
    E, n = spec.num_experts, 0
    with torch.no_grad():
        for layer, b in enumerate(blocks):
            idx = torch.as_tensor(p[layer])
            if isinstance(b.experts, nn.ModuleList):
                mods = list(b.experts)
                for j, old in enumerate(p[layer]):
                    b.experts[j] = mods[int(old)]
                n += len(mods)
            else:
                for mod in (b.experts,):
                    for _, t in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
                        if t.ndim >= 1 and t.shape[0] == E:
                            t.copy_(t[idx])
                            n += 1
            for t in list(b.router.parameters()) + list(b.router.buffers()):
                if t.ndim >= 1 and t.shape[0] == E:
                    t.copy_(t[idx])
                    n += 1
    return n


def permute_checkpoint(model_dir: str | Path, perm_LE: np.ndarray, out_dir: str | Path, *,
                       overwrite: bool = False) -> Path:
    """Write the permuted checkpoint of model_dir to out_dir (weights as safetensors, tokenizer and configs copied)."""
    from transformers import AutoModelForCausalLM

    from routecast.common.outputs import check_out_dir, os_error
    from routecast.predict.embeddings import resolve_model_dir

    src = resolve_model_dir(str(model_dir))
    if src is None:
        raise ConfigError("--model none: permute-experts needs a checkpoint folder, 'builtin' or 'builtin-fine'.")
    out = check_out_dir(out_dir, "--out", overwrite=overwrite)
    if out.resolve() == Path(src).resolve():
        raise ConfigError(f"--out {out} is the --model folder; expected a new folder (the original is kept).")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(src), use_safetensors=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--model {model_dir}: could not be loaded by transformers ({e}); expected a "
                          "safetensors checkpoint of a supported MoE architecture.") from None
    permute_model(model, perm_LE)
    from routecast.common.outputs import remove_own, scratch_dir

    tmp = scratch_dir(out, "--out")  # a new folder: a .OUT.partial that already exists is never touched
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        for f in Path(src).iterdir():  # tokenizer, generation config, training notes: everything but weights
            if f.is_file() and f.suffix != ".safetensors" and not (tmp / f.name).exists() and f.name != "model.safetensors.index.json":
                shutil.copy2(f, tmp / f.name)
        out.mkdir(parents=True, exist_ok=True)
        for f in tmp.iterdir():
            f.replace(out / f.name)
    except OSError as e:
        raise os_error(e, "--out", out) from None
    finally:
        remove_own(tmp)
    return out
