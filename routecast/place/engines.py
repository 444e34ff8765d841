"""Plans out to serving engines and their load statistics in: SGLang's expert-location JSON, SGLang's recorder dumps.

Legend: L MoE layers, N all decoder layers of the model (dense ones included), E logical experts, S physical slots,
W recorded steps.

SGLang (python/sglang/srt/eplb/expert_location.py, `--init-expert-location FILE.json`):
  {"physical_to_logical_map": [[...] x S] x N}  -> ExpertLocationMetadata.init_by_mapping(**data): the file must
      hold that one key; S = E + --ep-num-redundant-experts, divisible by --ep-size (slot s on rank s // (S / G));
  {"logical_count": [[...] x E] x N} (or [W, N, E]) -> init_by_eplb: SGLang runs its own EPLB on the counts.
  Rows are indexed by the model's layer index over ALL num_hidden_layers (ModelConfigForExpertLocation.num_layers
  = config.num_hidden_layers for DeepSeek-V2/V3), so DeepSeek's first_k_dense_replace dense layers have rows
  too: written here as SGLang's trivial map (slot s -> expert s % E) and zero counts, and skipped on reading.
  routecast numbers MoE layers 0..L-1 and keeps the model index of each in MoESpec.layer_ids.
SGLang's expert-distribution recorder in "stat" mode dumps (torch.save) {"rank", "logical_count" [W, N, E],
  "average_utilization_rate_over_window"}; that .pt (or a JSON with "logical_count") reads back as loads.
vLLM keeps its EPLB load window in memory (indexed by MoE layer only) and documents no file format for it or for
  a placement, so there is nothing to export to or import from vLLM here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.place.slots import SlotPlan


def model_num_layers(model_dir: str | Path) -> int:
    """num_hidden_layers of a checkpoint's config.json (text_config's for multimodal wrappers)."""
    p = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"model config {p} cannot be read ({e}); expected a Hugging Face config.json.") from None
    cfg = cfg.get("text_config", cfg)
    n = cfg.get("num_hidden_layers")
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"model config {p} has num_hidden_layers {n!r}; expected a positive integer.")
    return n


def _check_layers(layer_ids: tuple[int, ...], num_model_layers: int) -> None:
    if not layer_ids or min(layer_ids) < 0 or max(layer_ids) >= num_model_layers:
        raise ConfigError(f"MoE layer ids {list(layer_ids)} do not fit a model of {num_model_layers} layers; "
                          f"expected ids in 0..{num_model_layers - 1}.")


def sglang_mapping(plan: SlotPlan, num_model_layers: int) -> dict[str, Any]:
    """{'physical_to_logical_map': (N, S)} for SGLang's --init-expert-location (module docstring)."""
    plan.validate()
    _check_layers(plan.layer_ids, num_model_layers)
    empty = int((plan.slots_LS < 0).sum())
    if empty:
        raise ConfigError(f"plan '{plan.method}' leaves {empty} slots empty; SGLang fills every physical slot, so "
                          "export a plan with full ranks (static or EPLB) or its logical counts.")
    S = plan.num_slots
    m = np.tile(np.arange(S) % plan.num_experts, (num_model_layers, 1))
    m[list(plan.layer_ids)] = plan.slots_LS
    return {"physical_to_logical_map": m.tolist()}


def sglang_counts(load_LE: Any, layer_ids: tuple[int, ...], num_model_layers: int) -> dict[str, Any]:
    """{'logical_count': (N, E)} integer counts, zero rows for the dense layers."""
    a = np.asarray(load_LE)
    if a.ndim != 2 or a.shape[0] != len(layer_ids) or (a < 0).any() or not np.isfinite(a).all():
        raise ConfigError(f"loads have shape {a.shape}; expected ({len(layer_ids)}, experts) finite counts >= 0.")
    if a.size and float(a.max()) >= 2.0**63:  # np.rint(...).astype(int64) would wrap to a negative count
        raise ConfigError(f"loads hold a count of {float(a.max()):.3g}; expected counts below 2**63 (int64).")
    _check_layers(layer_ids, num_model_layers)
    out = np.zeros((num_model_layers, a.shape[1]), np.int64)
    out[list(layer_ids)] = np.rint(a).astype(np.int64)
    return {"logical_count": out.tolist()}


def _matrix(v: Any, name: str, where: str, ndim: tuple[int, ...]) -> np.ndarray:
    try:
        a = np.asarray(v.numpy() if hasattr(v, "numpy") else v, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {name} is not a numeric array; expected nested lists of numbers.") from None
    if a.ndim not in ndim or 0 in a.shape or not np.isfinite(a).all():
        raise ConfigError(f"{where}: {name} has shape {a.shape}; expected a finite array of {ndim} dimensions.")
    return a


def read_sglang_file(path: str | Path) -> dict[str, Any]:
    """A SGLang expert-location / recorder file (.json, or .pt loaded with weights_only) -> its dict."""
    p = Path(path)
    if p.suffix == ".pt":
        import torch

        try:
            d = torch.load(p, weights_only=True, map_location="cpu")
        except Exception as e:  # noqa: BLE001 - torch raises many types for a corrupt or foreign file
            raise ConfigError(f"{p}: not a torch file SGLang wrote ({type(e).__name__}).") from None
    else:
        from routecast.common.schemas import read_json

        d = read_json(p, "PLAN")
    if not isinstance(d, dict) or not ({"physical_to_logical_map", "logical_count"} & set(d)):
        raise ConfigError(f"{p}: holds neither physical_to_logical_map nor logical_count; expected a SGLang "
                          "--init-expert-location file or expert-distribution dump.")
    return d


def plan_from_sglang(path: str | Path, *, layer_ids: tuple[int, ...], num_experts: int, num_ranks: int) -> SlotPlan:
    """Read a physical_to_logical_map file back as a SlotPlan of the MoE layers `layer_ids` (even shares)."""
    d = read_sglang_file(path)
    if "physical_to_logical_map" not in d:
        raise ConfigError(f"{path}: holds logical_count, not a placement; expected physical_to_logical_map.")
    m = _matrix(d["physical_to_logical_map"], "physical_to_logical_map", str(path), (2,))
    if m.shape[0] <= max(layer_ids):
        raise ConfigError(f"{path}: physical_to_logical_map has {m.shape[0]} rows; expected one per model layer "
                          f"(MoE layers {list(layer_ids)}).")
    if (m != np.rint(m)).any():
        raise ConfigError(f"{path}: physical_to_logical_map holds a non-integer id; expected expert ids.")
    slots = m[list(layer_ids)].astype(np.int64)
    return SlotPlan(slots_LS=slots, share_LS=np.ones(slots.shape), num_ranks=num_ranks, num_experts=num_experts,
                    layer_ids=tuple(layer_ids), method="sglang").validate(str(path))


def loads_from_sglang(path: str | Path, *, layer_ids: tuple[int, ...], num_experts: int, per_step: bool = False
                      ) -> np.ndarray:
    """logical_count of a SGLang file -> (L, E) loads of the MoE layers (summed over recorded steps), or (W, L, E)."""
    d = read_sglang_file(path)
    if "logical_count" not in d:
        raise ConfigError(f"{path}: holds a placement, not loads; expected logical_count.")
    a = _matrix(d["logical_count"], "logical_count", str(path), (2, 3))
    a = a[None] if a.ndim == 2 else a
    if a.shape[1] <= max(layer_ids) or a.shape[2] != num_experts:
        raise ConfigError(f"{path}: logical_count has shape {a.shape}; expected (steps, >{max(layer_ids)} model layers, "
                          f"{num_experts} experts).")
    if (a < 0).any():
        raise ConfigError(f"{path}: logical_count holds a negative count; expected counts >= 0.")
    out = a[:, list(layer_ids)]
    return out if per_step else out.sum(axis=0)
