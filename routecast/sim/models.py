"""Model profiles: the shapes of an MoE model that the cost model needs, loaded from a TOML data file.

Shipped profiles live in `routecast/sim/models/*.toml` (each cites the HF config it was read from). The name
`builtin` resolves to the project's own checkpoint config, `routecast/models/builtin/config.json`, through
`model_profile_from_hf_config`, so the profile can never disagree with the shipped model.

Schema: top level (schema, name, description, source, dtype_bytes, vocab_size); [layers] (num_layers,
first_moe_layer, moe_layer_step); [moe] (hidden_size, num_experts, top_k, expert_ffn, activation,
num_shared_experts, shared_ffn, n_group, topk_group); [attention] (type, num_heads, num_kv_heads, head_dim,
sliding_window, sliding_fraction, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from routecast.common.errors import ConfigError
from routecast.sim.hardware import read_profile_toml
from routecast.trace.spec import MoESpec

MODELS_DIR = Path(__file__).parent / "models"
BUILTIN_CONFIG = Path(__file__).resolve().parents[1] / "models" / "builtin" / "config.json"
# The shipped checkpoints priced as model profiles: name -> their config.json.
BUILTIN_CONFIGS = {"builtin": BUILTIN_CONFIG,
                   "builtin-fine": Path(__file__).resolve().parents[1] / "models" / "builtin-fine" / "config.json"}
SCHEMA_VERSION = 1
ACTIVATIONS = {"swiglu": 3, "relu": 2, "gelu": 2}  # weight matrices per expert
ATTENTION_TYPES = ("mha", "gqa", "mla")


@dataclass(frozen=True, kw_only=True)
class ModelProfile:
    """Shapes of an MoE transformer (counts, sizes in elements; dtype_bytes per weight/activation element).

    num_layers: decoder layers; the MoE ones are `moe_layer_ids` (first_moe_layer, every moe_layer_step).
    hidden_size H, num_experts E (routed), top_k K, expert_ffn I (one routed expert's intermediate size),
    activation: swiglu (3 matrices) | relu | gelu (2); shared experts: num_shared_experts of size shared_ffn.
    attention: "mha" | "gqa" | "mla"; num_heads, num_kv_heads, head_dim; sliding_window (0 = none) on a
    sliding_fraction of layers; MLA ranks (q_lora_rank 0 = no query compression) and head dims.
    """

    name: str
    description: str = ""
    source: str = ""
    dtype_bytes: int = 2
    vocab_size: int
    num_layers: int
    first_moe_layer: int = 0
    moe_layer_step: int = 1
    hidden_size: int
    num_experts: int
    top_k: int
    expert_ffn: int
    activation: str = "swiglu"
    num_shared_experts: int = 0
    shared_ffn: int = 0
    n_group: int = 1
    topk_group: int = 1
    attention: str = "gqa"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int = 0
    sliding_fraction: float = 1.0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        where = self.source or self.name
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ConfigError(f"{where}: model field '{f.name}' is {v!r}; expected a non-negative integer.")
        for f in ("num_layers", "hidden_size", "num_experts", "top_k", "expert_ffn", "num_heads", "num_kv_heads",
                  "dtype_bytes", "moe_layer_step", "n_group", "topk_group"):
            if getattr(self, f) < 1:
                raise ConfigError(f"{where}: model field '{f}' is {getattr(self, f)}; expected a positive integer.")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"{where}: model field 'activation' is {self.activation!r}; expected one of {list(ACTIVATIONS)}.")
        if self.attention not in ATTENTION_TYPES:
            raise ConfigError(f"{where}: model field 'attention' is {self.attention!r}; expected one of {list(ATTENTION_TYPES)}.")
        if self.top_k > self.num_experts:
            raise ConfigError(f"{where}: model field 'top_k' is {self.top_k}; expected at most num_experts = {self.num_experts}.")
        if self.first_moe_layer >= self.num_layers:
            raise ConfigError(
                f"{where}: model field 'first_moe_layer' is {self.first_moe_layer}; expected < num_layers = {self.num_layers}."
            )
        if not 0.0 <= self.sliding_fraction <= 1.0:
            raise ConfigError(f"{where}: model field 'sliding_fraction' is {self.sliding_fraction}; expected a fraction in [0, 1].")
        if self.attention == "mla" and min(self.kv_lora_rank, self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim) < 1:
            raise ConfigError(f"{where}: MLA needs positive kv_lora_rank, qk head dims and v_head_dim; expected them set.")

    # ---- derived sizes -------------------------------------------------------------------------------
    @property
    def moe_layer_ids(self) -> tuple[int, ...]:
        """Model layer index of each MoE layer."""
        return tuple(range(self.first_moe_layer, self.num_layers, self.moe_layer_step))

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layer_ids)

    @property
    def matrices_per_expert(self) -> int:
        return ACTIVATIONS[self.activation]

    def expert_params(self, *, two_matrix: bool = False) -> int:
        """Weights of one routed expert: matrices x H x I. `two_matrix` counts 2 matrices as MoE-GPS §5 does."""
        mats = 2 if two_matrix else self.matrices_per_expert
        return mats * self.hidden_size * self.expert_ffn

    def expert_bytes(self, *, two_matrix: bool = False) -> int:
        """Bytes of one routed expert (Mixtral-8x7B: 352 MB; 235 MB with `two_matrix`, MoE-GPS §5's count)."""
        return self.expert_params(two_matrix=two_matrix) * self.dtype_bytes

    @property
    def expert_flops_per_token(self) -> int:
        """FLOPs one token costs in one routed expert: 2 x matrices x H x I (multiply-add = 2 FLOPs)."""
        return 2 * self.matrices_per_expert * self.hidden_size * self.expert_ffn

    @property
    def shared_flops_per_token(self) -> int:
        """FLOPs one token costs in all shared experts of one layer."""
        return 2 * self.matrices_per_expert * self.hidden_size * self.shared_ffn * self.num_shared_experts

    @property
    def shared_bytes(self) -> int:
        """Bytes of all shared experts of one layer."""
        return self.matrices_per_expert * self.hidden_size * self.shared_ffn * self.num_shared_experts * self.dtype_bytes

    def to_moespec(self, *, two_matrix: bool = False) -> MoESpec:
        """The routing geometry (MoESpec) of this model; expert_bytes per `expert_bytes(two_matrix=...)`."""
        return MoESpec(
            num_layers=self.num_moe_layers,
            num_experts=self.num_experts,
            top_k=self.top_k,
            hidden_size=self.hidden_size,
            expert_bytes=self.expert_bytes(two_matrix=two_matrix),
            num_shared_experts=self.num_shared_experts,
            layer_ids=self.moe_layer_ids,
            n_group=self.n_group,
            topk_group=self.topk_group,
            name=self.name,
        )


# ---- loading --------------------------------------------------------------------------------------------
def list_models() -> list[str]:
    """Names of the shipped model profiles plus 'builtin' and 'builtin-fine', sorted."""
    return sorted({p.stem for p in MODELS_DIR.glob("*.toml")} | set(BUILTIN_CONFIGS))


def load_model(name_or_path: str | Path) -> ModelProfile:
    """A model profile by name (see `list_models()`), or from a profile .toml, an HF config.json, or a
    checkpoint directory holding config.json. Raises ConfigError naming the file and field on bad input."""
    p = Path(name_or_path)
    if p.is_dir():
        return model_profile_from_hf_config(p / "config.json")
    if p.suffix == ".json":
        return model_profile_from_hf_config(p)
    if p.suffix == ".toml" or p.is_file():
        if not p.is_file():
            raise ConfigError(f"model profile {str(p)!r} does not exist; expected a TOML file.")
        return _parse_toml(p)
    name = str(name_or_path).lower()
    if name in BUILTIN_CONFIGS:
        cfg_path = BUILTIN_CONFIGS[name]
        if not cfg_path.is_file():
            raise ConfigError(
                f"model {name!r} reads {cfg_path}, which does not exist; expected the built-in checkpoint's config.json."
            )
        return dataclasses.replace(model_profile_from_hf_config(cfg_path), name=name)
    path = MODELS_DIR / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown model {str(name_or_path)!r}; expected one of {list_models()} or a path to a .toml or config.json.")
    return _parse_toml(path)


def _parse_toml(path: Path) -> ModelProfile:
    r = read_profile_toml(path, SCHEMA_VERSION)

    def i(key: str) -> int:
        return int(r.number(key, integer=True))

    return ModelProfile(
        name=r.string("name"),
        description=r.string("description"),
        source=str(path),
        dtype_bytes=i("dtype_bytes"),
        vocab_size=i("vocab_size"),
        num_layers=i("layers.num_layers"),
        first_moe_layer=i("layers.first_moe_layer"),
        moe_layer_step=i("layers.moe_layer_step"),
        hidden_size=i("moe.hidden_size"),
        num_experts=i("moe.num_experts"),
        top_k=i("moe.top_k"),
        expert_ffn=i("moe.expert_ffn"),
        activation=r.string("moe.activation"),
        num_shared_experts=i("moe.num_shared_experts"),
        shared_ffn=i("moe.shared_ffn"),
        n_group=i("moe.n_group"),
        topk_group=i("moe.topk_group"),
        attention=r.string("attention.type"),
        num_heads=i("attention.num_heads"),
        num_kv_heads=i("attention.num_kv_heads"),
        head_dim=i("attention.head_dim"),
        sliding_window=i("attention.sliding_window"),
        sliding_fraction=float(r.number("attention.sliding_fraction")),
        q_lora_rank=i("attention.q_lora_rank"),
        kv_lora_rank=i("attention.kv_lora_rank"),
        qk_nope_head_dim=i("attention.qk_nope_head_dim"),
        qk_rope_head_dim=i("attention.qk_rope_head_dim"),
        v_head_dim=i("attention.v_head_dim"),
    )


# HF config key for each profile field, per model_type; the first key present wins.
_HF_KEYS: dict[str, tuple[str, ...]] = {
    "num_experts": ("num_local_experts", "n_routed_experts", "num_experts"),
    "top_k": ("num_experts_per_tok", "experts_per_token", "num_selected_experts"),
    "expert_ffn": ("moe_intermediate_size", "intermediate_size", "d_ff"),
    "hidden_size": ("hidden_size", "d_model"),
    "num_heads": ("num_attention_heads", "num_heads"),
    "vocab_size": ("vocab_size",),
}


def model_profile_from_hf_config(path: str | Path) -> ModelProfile:
    """Build a ModelProfile from a Hugging Face config.json (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, OLMoE,
    GPT-OSS, Switch Transformers, and other configs with the common MoE keys)."""
    path = Path(path)
    from routecast.common.schemas import read_json

    cfg = read_json(path, "HF config", "an HF config.json")
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: holds a {type(cfg).__name__}; expected a JSON object (an HF config.json).")
    mtype = str(cfg.get("model_type", ""))

    def pick(field: str, default: int | None = None) -> int:
        for key in _HF_KEYS[field]:
            if cfg.get(key) is not None:
                return int(cfg[key])
        if default is not None:
            return default
        raise ConfigError(f"{path}: none of the keys {list(_HF_KEYS[field])} is present; expected one for '{field}'.")

    hidden, heads = pick("hidden_size"), pick("num_heads")
    kw: dict[str, Any] = dict(
        name=str(cfg.get("_name_or_path") or path.parent.name or mtype),
        description=f"from HF config ({mtype or 'unknown model_type'})",
        source=str(path),
        dtype_bytes=4 if cfg.get("torch_dtype", cfg.get("dtype")) == "float32" else 2,
        vocab_size=pick("vocab_size"),
        hidden_size=hidden,
        num_experts=pick("num_experts"),
        # Switch Transformers route top-1 and have no top-k key.
        top_k=pick("top_k", 1 if mtype == "switch_transformers" else None),
        expert_ffn=pick("expert_ffn"),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg.get("d_kv") or hidden // heads),
        sliding_window=int(cfg.get("sliding_window") or 0),
        n_group=int(cfg.get("n_group") or 1),
        topk_group=int(cfg.get("topk_group") or 1),
    )
    kw["attention"] = "mha" if kw["num_kv_heads"] == heads else "gqa"
    layers = cfg.get("num_hidden_layers", cfg.get("num_layers"))
    if layers is None:
        raise ConfigError(f"{path}: key 'num_hidden_layers' is missing; expected the number of decoder layers.")
    kw["num_layers"] = int(layers)
    if mtype.startswith("deepseek"):
        kw.update(
            attention="mla",
            num_shared_experts=int(cfg.get("n_shared_experts") or 0),
            first_moe_layer=int(cfg.get("first_k_dense_replace") or 0),
            moe_layer_step=int(cfg.get("moe_layer_freq") or 1),
            q_lora_rank=int(cfg.get("q_lora_rank") or 0),
            kv_lora_rank=int(cfg["kv_lora_rank"]),
            qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
            qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
            v_head_dim=int(cfg["v_head_dim"]),
        )
        kw["head_dim"] = kw["qk_nope_head_dim"] + kw["qk_rope_head_dim"]
        kw["shared_ffn"] = kw["expert_ffn"] if kw["num_shared_experts"] else 0
    elif mtype in ("qwen2_moe", "qwen3_moe"):
        shared = int(cfg.get("shared_expert_intermediate_size") or 0)
        kw.update(num_shared_experts=1 if shared else 0, shared_ffn=shared,
                  moe_layer_step=int(cfg.get("decoder_sparse_step") or 1))
        kw["first_moe_layer"] = kw["moe_layer_step"] - 1
    elif mtype == "gpt_oss":
        types = cfg.get("layer_types") or []
        if types:
            kw["sliding_fraction"] = sum(t == "sliding_attention" for t in types) / len(types)
    elif mtype == "switch_transformers":
        kw.update(
            num_layers=int(cfg.get("num_layers", 12)) + int(cfg.get("num_decoder_layers") or cfg.get("num_layers", 12)),
            activation="gelu" if "gelu" in str(cfg.get("dense_act_fn", "relu")) else "relu",
            first_moe_layer=int(cfg.get("encoder_sparse_step") or 2) - 1,
            moe_layer_step=int(cfg.get("encoder_sparse_step") or 2),
        )
    if kw["sliding_window"] and "sliding_fraction" not in kw:
        kw["sliding_fraction"] = 1.0
    try:
        return ModelProfile(**kw)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: cannot build a model profile ({e}).") from None
