"""Per-architecture adapters: where a Hugging Face MoE model keeps its router and experts, how to read them.

Verified against the transformers 5.23 sources (``models/*/modeling_*.py``). Almost every MoE block is a
module with a router child (``gate`` or ``router``) returning ``(logits[T,E], weights[T,K], ids[T,K])`` and
an ``experts`` child called as ``experts(hidden[T,H], ids[T,K], weights[T,K])``, T = batch x seq
flattened. The routing the experts actually execute is read from a forward pre-hook on ``experts``; the
router input hidden state and the logits from a forward hook on the router. Exceptions handled here:

- DBRX: the router returns bare logits and top-k happens in the block; ids/weights still reach
  ``experts(hidden[B,S,H], ids[T,K], weights[T,K])``.
- Switch Transformers: top-1 with a per-sequence capacity; ``experts`` (a ModuleDict) receives a one-hot
  dispatch mask [T,1,E] whose all-zero rows are dropped tokens (recorded as -1, weight 0); the router
  returns ``(dispatch, probs, logits)``. Encoder-decoder: see ``capture.py`` for how tokens map.
- Llama 4: the router returns ``(scores[T,E], logits[T,E])`` with sigmoid scores that are 0 outside the
  top-k, and every expert runs on every token scaled by them; ids/weights are the top-k of those scores.

Not every layer is MoE (``first_k_dense_replace``, ``mlp_only_layers``, ``decoder_sparse_step``): the
layer index comes from the module path (the first integer in it), so MoESpec.layer_ids is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from routecast.common.errors import ConfigError
from routecast.trace.spec import MoESpec

# How the executed routing reaches the experts.
TOPK, DISPATCH, DENSE = "topk", "dispatch", "dense"


@dataclass(frozen=True, kw_only=True)
class Adapter:
    """How to read one architecture's MoE blocks.

    router: name of the block's router child. logits_at: index of logits [T,E] in the router's output
    tuple, None when the router returns the logits tensor itself. read: TOPK (ids/weights are the
    experts' integer and float arguments), DISPATCH (one-hot capacity-limited mask, Switch) or DENSE
    (dense scores from the router, Llama 4). top_k: fixed K when the model keeps none (0 = read it).
    """

    router: str
    logits_at: int | None = 0
    read: str = TOPK
    top_k: int = 0


ADAPTERS: dict[str, Adapter] = {
    "mixtral": Adapter(router="gate"),
    "qwen2_moe": Adapter(router="gate"),
    "qwen3_moe": Adapter(router="gate"),
    "olmoe": Adapter(router="gate"),
    "deepseek_v2": Adapter(router="gate"),
    "deepseek_v3": Adapter(router="gate"),
    "glm4_moe": Adapter(router="gate"),
    "gpt_oss": Adapter(router="router"),
    "phimoe": Adapter(router="router"),
    "granitemoe": Adapter(router="router"),
    "dbrx": Adapter(router="router", logits_at=None),
    "switch_transformers": Adapter(router="router", logits_at=2, read=DISPATCH, top_k=1),
    "llama4_text": Adapter(router="router", logits_at=1, read=DENSE),
}
SUPPORTED = tuple(sorted(ADAPTERS))


@dataclass(frozen=True)
class MoEBlock:
    """One MoE block found in a model: its path, modules, stack and model layer index."""

    path: str
    block: nn.Module
    router: nn.Module
    experts: nn.Module
    stack: int  # index of the layer stack (decoder-only: 0; encoder-decoder: 0 encoder, 1 decoder)
    layer_path: str  # path of the enclosing decoder/encoder layer, e.g. "model.layers.3"
    layer_id: int  # model layer index; encoder-decoder: decoder layers continue after the encoder's


def model_type(model: nn.Module) -> str:
    """The transformers model_type of model (its text config's for multimodal wrappers), '' if none."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return ""
    mt = getattr(cfg, "model_type", "") or ""
    if mt not in ADAPTERS and hasattr(cfg, "get_text_config"):
        mt = getattr(cfg.get_text_config(), "model_type", mt) or mt
    return mt


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter for model's architecture; ConfigError listing the supported ones otherwise."""
    mt = model_type(model)
    if mt not in ADAPTERS:
        raise ConfigError(
            f"model: architecture {mt or type(model).__name__!r} is not supported for routing capture; "
            f"expected one of {', '.join(SUPPORTED)}."
        )
    return ADAPTERS[mt]


def _split_layer(path: str) -> tuple[str, int] | None:
    """'model.layers.3.mlp' -> ('model.layers', 3): the layer list path and index (first integer)."""
    parts = path.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[:i]), int(p)
    return None


def find_blocks(model: nn.Module, adapter: Adapter | None = None) -> list[MoEBlock]:
    """Every MoE block of model in forward order (stack, then layer), with its model layer index."""
    adapter = adapter or adapter_for(model)
    found: list[tuple[str, nn.Module, str, int]] = []
    for path, mod in model.named_modules():
        router = mod._modules.get(adapter.router)
        experts = mod._modules.get("experts")
        if router is None or experts is None:
            continue
        where = _split_layer(path)
        if where is None:
            raise ConfigError(f"model: MoE block {path!r} is not inside a numbered layer list; expected '<stack>.<i>...'.")
        found.append((path, mod, where[0], where[1]))
    if not found:
        raise ConfigError(
            f"model: no MoE block with a '{adapter.router}' router and an 'experts' child was found in "
            f"{type(model).__name__}; expected a {model_type(model)} model built by transformers 5.x."
        )
    stacks: list[str] = []
    for _, _, lst, _ in found:
        if lst not in stacks:
            stacks.append(lst)
    offsets, off = {}, 0
    for lst in stacks:  # decoder layers of an encoder-decoder model are numbered after the encoder's
        offsets[lst] = off
        off += len(model.get_submodule(lst))
    blocks = [
        MoEBlock(path=p, block=m, router=m._modules[adapter.router], experts=m._modules["experts"],
                 stack=stacks.index(lst), layer_path=f"{lst}.{i}", layer_id=offsets[lst] + i)
        for p, m, lst, i in found
    ]
    return sorted(blocks, key=lambda b: (b.stack, b.layer_id))


def _num_experts(b: MoEBlock) -> int:
    n = getattr(b.experts, "num_experts", None)
    if isinstance(n, int) and n > 0:
        return n
    if isinstance(b.experts, (nn.ModuleDict, nn.ModuleList)):
        return len(b.experts)
    raise ConfigError(f"model: cannot tell the number of experts of {b.path}.experts; expected a num_experts attribute.")


def _top_k(b: MoEBlock, adapter: Adapter, cfg) -> int:
    if adapter.top_k:
        return adapter.top_k
    for obj, attr in ((b.router, "top_k"), (b.block, "top_k"), (cfg, "num_experts_per_tok"), (cfg, "moe_top_k")):
        k = getattr(obj, attr, None)
        if isinstance(k, int) and k > 0:
            return k
    raise ConfigError(f"model: cannot tell top-k of {b.path}; expected router.top_k or config.num_experts_per_tok.")


def _router_width(b: MoEBlock, num_experts: int) -> int:
    """H: the input width of the router's [E, H] weight."""
    for p in b.router.parameters():
        if p.ndim == 2 and p.shape[0] == num_experts:
            return int(p.shape[1])
    return 0


def expert_bytes(b: MoEBlock, num_experts: int) -> int:
    """Bytes of one routed expert: every parameter and buffer of the experts module / E."""
    tensors = list(b.experts.parameters()) + list(b.experts.buffers())
    return sum(t.numel() * t.element_size() for t in tensors) // num_experts


def _shared(b: MoEBlock, cfg) -> int:
    for attr in ("n_shared_experts", "num_shared_experts"):
        n = getattr(cfg, attr, None)
        if isinstance(n, int) and n > 0:
            return n
    return int(any(name in b.block._modules for name in ("shared_expert", "shared_experts")))


def _groups(b: MoEBlock) -> tuple[int, int]:
    """(n_group, topk_group) of a grouped router (DeepSeek-V3 style), (1, 1) otherwise."""
    r = b.router
    if getattr(r, "topk_method", "group_limited_greedy") == "greedy":  # DeepSeek-V2 'greedy' ignores groups
        return 1, 1
    n = getattr(r, "num_group", getattr(r, "n_group", None))
    k = getattr(r, "topk_group", None)
    if isinstance(n, int) and isinstance(k, int) and n > 1:
        return n, k
    return 1, 1


def spec_from_model(model: nn.Module, blocks: list[MoEBlock] | None = None) -> MoESpec:
    """MoESpec of model: MoE layers only, E, K, H, bytes per expert, shared experts, layer ids, groups."""
    adapter = adapter_for(model)
    blocks = blocks if blocks is not None else find_blocks(model, adapter)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    geo = []
    for b in blocks:
        e = _num_experts(b)
        geo.append((e, _top_k(b, adapter, cfg), _router_width(b, e), expert_bytes(b, e), _shared(b, cfg), _groups(b)))
    if len(set(geo)) != 1:
        raise ConfigError(
            f"model: MoE layers differ in (experts, top-k, hidden, bytes, shared, groups): {sorted(set(geo))}; "
            "expected one geometry for all layers."
        )
    e, k, h, nbytes, shared, (ng, kg) = geo[0]
    # A local checkpoint path is long and machine-specific: name the model by its folder (hub ids stay whole).
    path = str(getattr(model.config, "name_or_path", "") or "")
    name = (Path(path).name if Path(path).is_dir() else path) or model_type(model)
    return MoESpec(num_layers=len(blocks), num_experts=e, top_k=k, hidden_size=h, expert_bytes=nbytes,
                   num_shared_experts=shared, layer_ids=tuple(b.layer_id for b in blocks), n_group=ng,
                   topk_group=kg, name=str(name))


def router_correction_bias(blocks: list[MoEBlock]) -> list[list[float]] | None:
    """Every router's ``e_score_correction_bias`` (DeepSeek-V3 / GLM-4-MoE sigmoid routers) as L lists of E floats, else None."""
    rows = [getattr(b.router, "e_score_correction_bias", None) for b in blocks]
    if not rows or any(r is None for r in rows):
        return None
    return [r.detach().float().cpu().tolist() for r in rows]


def read_experts_args(adapter: Adapter, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, weights) as passed to experts(): TOPK -> ids [T,K] int, weights [T,K]; DISPATCH -> mask [T,1,E], probs [T,1].

    Arguments are found by kind, not position, so keyword calls work too: ids are the first integer
    tensor, weights the first float tensor of the ids' leading shape that is not the hidden state.
    """
    tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    ids = next((t for t in tensors if not t.is_floating_point()), None)
    if ids is None:
        raise ConfigError("experts(): no integer routing tensor among its arguments; expected (hidden, ids, weights).")
    rest = [t for t in tensors if t.is_floating_point()][1:]  # the first float argument is the hidden state
    w = next((t for t in rest if t.shape[0] == ids.shape[0]), None)
    if w is None:
        raise ConfigError(f"experts(): no routing-weight tensor with {ids.shape[0]} rows; expected (hidden, ids, weights).")
    return ids, w


def decode_routing(
    adapter: Adapter, ids: torch.Tensor, w: torch.Tensor | None, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recorded tensors -> (ids [T,K] int64 with -1 = dropped, weights [T,K] float32).

    TOPK: (ids, weights) as given to experts(). DENSE: ids is the router's score tensor [T,E], w unused. DISPATCH: ids = the one hot column, -1 (weight 0) where capacity dropped the token.
    DENSE: the top-k of the dense scores the experts were scaled by (never recomputed from logits).
    """
    if adapter.read == TOPK:
        return ids.reshape(-1, top_k).long(), w.reshape(-1, top_k).float()
    if adapter.read == DISPATCH:
        mask = ids.reshape(ids.shape[0], -1)  # [T, E]
        kept = mask.sum(-1, keepdim=True) > 0
        eid = torch.where(kept, mask.argmax(-1, keepdim=True), torch.full_like(kept, -1, dtype=torch.long))
        assert w is not None
        return eid.long(), torch.where(kept, w.reshape(-1, 1).float(), torch.zeros((), dtype=torch.float32))
    val, idx = ids.reshape(-1, ids.shape[-1]).float().topk(top_k, dim=-1)
    return idx, val
