"""MoESpec: the routing geometry of an MoE model (what a Trace's tensors are shaped by).

Legend used across routecast: T token-positions, L MoE layers, E experts per layer, K top-k,
H hidden size (router input), G expert-parallel ranks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from routecast.common.errors import TraceError

MAX_EXPERTS = 1 << 15  # experts_TLK is int16: ids 0..32767
MAX_LAYER_EXPERTS = 1 << 24  # L x E cells: counts_LE and predictor tables stay below ~128 MiB of int64


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """Geometry of an MoE model's routing.

    num_layers: L, MoE layers only (dense layers are not counted).
    num_experts: E routed experts per MoE layer (shared experts excluded).
    top_k: K experts chosen per token per layer.
    hidden_size: H, width of the router input (0 when unknown).
    expert_bytes: bytes of one routed expert's weights (0 when unknown).
    num_shared_experts: always-on experts per layer (not routed, not in the trace).
    layer_ids: model layer index of each MoE layer, length L (default 0..L-1).
    n_group, topk_group: grouped routing (DeepSeek-V3: 8 groups, 4 chosen); 1, 1 when ungrouped.
    name: model name, free text.
    """

    num_layers: int
    num_experts: int
    top_k: int
    hidden_size: int = 0
    expert_bytes: int = 0
    num_shared_experts: int = 0
    layer_ids: tuple[int, ...] = ()
    n_group: int = 1
    topk_group: int = 1
    name: str = ""

    def __post_init__(self) -> None:
        for field in ("num_layers", "num_experts", "top_k"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise TraceError(f"MoESpec.{field} is {v!r}; expected a positive integer.")
        for field in ("hidden_size", "expert_bytes", "num_shared_experts"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise TraceError(f"MoESpec.{field} is {v!r}; expected a non-negative integer.")
        if self.top_k > self.num_experts:
            raise TraceError(
                f"MoESpec.top_k is {self.top_k} but num_experts is {self.num_experts}; expected top_k <= num_experts."
            )
        if self.num_experts > MAX_EXPERTS:
            raise TraceError(f"MoESpec.num_experts is {self.num_experts}; expected at most {MAX_EXPERTS} (expert "
                             "ids are stored as int16).")
        if self.num_layers * self.num_experts > MAX_LAYER_EXPERTS:
            raise TraceError(f"MoESpec.num_layers x num_experts is {self.num_layers} x {self.num_experts}; expected "
                             f"at most {MAX_LAYER_EXPERTS} (per-layer expert tables are held in memory).")
        ids = self.layer_ids
        if not isinstance(ids, (tuple, list)) or not all(_is_int(i) for i in ids):
            bad = ids if not isinstance(ids, (tuple, list)) else next(i for i in ids if not _is_int(i))
            raise TraceError(f"MoESpec.layer_ids holds {bad!r}; expected integer model-layer indices.")
        ids = tuple(int(i) for i in ids) if ids else tuple(range(self.num_layers))
        object.__setattr__(self, "layer_ids", ids)
        if len(ids) != self.num_layers:
            raise TraceError(
                f"MoESpec.layer_ids has {len(ids)} entries; expected num_layers = {self.num_layers}."
            )
        if min(ids) < 0 or len(set(ids)) != len(ids):
            bad = min(ids) if min(ids) < 0 else next(i for i in ids if ids.count(i) > 1)
            raise TraceError(f"MoESpec.layer_ids holds {bad} {'below 0' if bad < 0 else 'twice'}; expected "
                             "distinct non-negative model-layer indices.")
        if self.n_group < 1 or self.num_experts % self.n_group:
            raise TraceError(
                f"MoESpec.n_group is {self.n_group}; expected a positive divisor of num_experts = {self.num_experts}."
            )
        if not 1 <= self.topk_group <= self.n_group:
            raise TraceError(f"MoESpec.topk_group is {self.topk_group}; expected 1..n_group = {self.n_group}.")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["layer_ids"] = list(self.layer_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "MoESpec") -> MoESpec:
        """Build from a JSON dict; unknown or missing keys raise a TraceError naming `where`."""
        if not isinstance(d, dict):
            raise TraceError(f"{where}: spec is {type(d).__name__}; expected a JSON object.")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise TraceError(f"{where}: unknown spec field(s) {unknown}; expected only {sorted(names)}.")
        for req in ("num_layers", "num_experts", "top_k"):
            if req not in d:
                raise TraceError(f"{where}: spec field '{req}' is missing.")
        kw = dict(d)
        if "layer_ids" in kw:
            if not isinstance(kw["layer_ids"], (list, tuple)):
                raise TraceError(f"{where}: spec field 'layer_ids' is {kw['layer_ids']!r}; expected a list.")
            kw["layer_ids"] = tuple(kw["layer_ids"])
        try:
            return cls(**kw)
        except TraceError as e:
            raise TraceError(f"{where}: {e}") from None
        except TypeError as e:
            raise TraceError(f"{where}: invalid spec ({e}).") from None
