"""Hardware profiles: one accelerator (or CPU) as the cost model sees it, loaded from a TOML data file.

The shipped profiles live in `routecast/sim/hardware/*.toml`; `routecast calibrate` writes the same schema
for the machine it runs on. Numbers live only in those files (each with its source in a comment); this
module converts units and validates.

Schema (units in the file; `Hardware` holds SI units: FLOP/s, bytes/s, bytes, seconds):

    schema = 1
    name, kind ("gpu" | "cpu"), description
    [compute]      dtype, peak_tflops                      dense peak of `dtype`
    [memory]       bandwidth_gbps, derate, capacity_gb     HBM (or DRAM); derate = achievable fraction
                   weight_mb = [...], weight_gbps = [...]  optional: measured expert weight-read bandwidth vs
                                                           expert size (empty or absent: bandwidth x derate)
    [interconnect] nvlink_gbps, pcie_gbps, h2d_gbps, alpha_us   per direction; 0 = not applicable
    [gemm]         tile_m, tokens = [...], eta = [...]      efficiency curve vs tokens per expert
    [overhead]     moe_layer_us                            fixed router/permutation cost per MoE layer
                   expert_call_us                          optional: fixed cost per active expert call (the
                                                           launch / dispatch floor of an eager expert loop)
                   activation_ns                           optional: cost per non-GEMM activation value of an
                                                           expert call (n x (3 hidden + 2 ffn) values)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError

HARDWARE_DIR = Path(__file__).parent / "hardware"
SCHEMA_VERSION = 1
LINKS = ("nvlink", "pcie")


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One device of an expert-parallel group (SI units throughout).

    peak_flops: dense peak FLOP/s of `dtype`.
    mem_bandwidth: bytes/s of device memory (HBM, or DRAM for a CPU); mem_derate: achievable fraction.
    mem_capacity: bytes of device memory.
    nvlink_bandwidth, pcie_bandwidth: bytes/s per direction per device (0 = no such link).
    h2d_bandwidth: bytes/s host-to-device (0 = not applicable, e.g. a CPU).
    alpha: seconds of fixed latency per collective step.
    eta_tokens (P,), eta_values (P,): GEMM efficiency (achieved / peak) at P token counts, increasing.
    tile_m: GEMM tile rows for the staircase option (0 = no staircase).
    moe_layer_overhead: seconds of fixed router/permutation cost per MoE layer (0 when not modelled).
    weight_bytes (S,), weight_bandwidth (S,): measured bytes/s of reading one expert's weights at S expert
      sizes, increasing (empty: every size reads at mem_effective).
    expert_call_overhead: seconds of fixed cost per active expert call (0 when not modelled).
    activation_cost: seconds per activation value an expert call touches outside its GEMMs (gather, SiLU x up,
      scale, scatter-add: n (3 hidden + 2 ffn) values per call; 0 when not modelled).
    """

    name: str
    kind: str
    description: str
    dtype: str
    peak_flops: float
    mem_bandwidth: float
    mem_derate: float
    mem_capacity: float
    nvlink_bandwidth: float
    pcie_bandwidth: float
    h2d_bandwidth: float
    alpha: float
    eta_tokens: tuple[float, ...]
    eta_values: tuple[float, ...]
    tile_m: int = 0
    moe_layer_overhead: float = 0.0
    weight_bytes: tuple[float, ...] = ()
    weight_bandwidth: tuple[float, ...] = ()
    expert_call_overhead: float = 0.0
    activation_cost: float = 0.0
    source: str = ""

    @property
    def mem_effective(self) -> float:
        """Achievable device-memory bandwidth, bytes/s (bandwidth x derate)."""
        return self.mem_bandwidth * self.mem_derate

    def weight_read_time(self, nbytes: Any) -> np.ndarray:
        """Seconds to stream `nbytes` of expert weights (any shape) -> same shape, float64.

        With a measured curve: nbytes / B(nbytes), B piecewise linear in log(bytes) between the measured sizes
        and flat beyond both ends (small matrices do not reach the streaming rate). Without: nbytes / mem_effective.
        """
        w = np.asarray(nbytes, dtype=np.float64)
        if not self.weight_bytes:
            return w / self.mem_effective
        with np.errstate(divide="ignore"):
            bw = np.interp(np.log(np.maximum(w, 1.0)), np.log(self.weight_bytes), self.weight_bandwidth)
        return w / bw

    def link_bandwidth(self, link: str) -> float:
        """Per-direction bandwidth of `link` ("nvlink" | "pcie") in bytes/s."""
        if link not in LINKS:
            raise ConfigError(f"link is {link!r}; expected one of {list(LINKS)}.")
        return self.nvlink_bandwidth if link == "nvlink" else self.pcie_bandwidth

    def eta(self, tokens: Any, *, staircase: bool = False) -> np.ndarray:
        """GEMM efficiency in (0, 1] at `tokens` rows (any shape, float or int) -> same shape, float64.

        Piecewise linear in log(tokens) between table points, flat beyond both ends. With `staircase`, a
        GEMM of n rows costs as much as one of ceil(n / tile_m) * tile_m rows, so the efficiency is the
        table value at the padded count scaled by n / padded (A100: m=129 takes ~2x the time of m=128).
        Non-positive counts get the first table value (they do no work; the caller masks them).
        """
        n = np.asarray(tokens, dtype=np.float64)
        if staircase and self.tile_m > 0:
            padded = np.ceil(n / self.tile_m) * self.tile_m
            pos = n > 0
            safe = np.where(pos, padded, 1.0)
            base = np.interp(np.log(safe), self._log_tokens, self._eta_arr)
            return np.where(pos, base * (n / safe), self._eta_arr[0])
        # log of 0 is -inf, which np.interp clamps to the first value: no masking needed.
        with np.errstate(divide="ignore"):
            return np.interp(np.log(np.maximum(n, 0.0)), self._log_tokens, self._eta_arr)

    @property
    def _log_tokens(self) -> np.ndarray:
        return np.log(np.asarray(self.eta_tokens, dtype=np.float64))

    @property
    def _eta_arr(self) -> np.ndarray:
        return np.asarray(self.eta_values, dtype=np.float64)

    def to_toml(self, comments: dict[str, str] | None = None) -> str:
        """The profile as TOML text in the file schema; `comments` maps 'table.key' to a trailing comment."""
        c = comments or {}

        def line(key: str, table: str, value: Any) -> str:
            note = c.get(f"{table}.{key}" if table else key)
            text = f"{key} = {_toml_value(value)}"
            return f"{text:<40} # {note}" if note else text

        lines = [
            "# Units: TFLOP/s, GB/s (1 GB = 1e9 bytes), GB, microseconds; link figures per direction.",
            line("schema", "", SCHEMA_VERSION),
            line("name", "", self.name),
            line("kind", "", self.kind),
            line("description", "", self.description),
            "",
            "[compute]",
            line("dtype", "compute", self.dtype),
            line("peak_tflops", "compute", self.peak_flops / 1e12),
            "",
            "[memory]",
            line("bandwidth_gbps", "memory", self.mem_bandwidth / 1e9),
            line("derate", "memory", self.mem_derate),
            line("capacity_gb", "memory", self.mem_capacity / 1e9),
            line("weight_mb", "memory", [w / 1e6 for w in self.weight_bytes]),
            line("weight_gbps", "memory", [v / 1e9 for v in self.weight_bandwidth]),
            "",
            "[interconnect]",
            line("nvlink_gbps", "interconnect", self.nvlink_bandwidth / 1e9),
            line("pcie_gbps", "interconnect", self.pcie_bandwidth / 1e9),
            line("h2d_gbps", "interconnect", self.h2d_bandwidth / 1e9),
            line("alpha_us", "interconnect", self.alpha * 1e6),
            "",
            "[gemm]",
            line("tile_m", "gemm", self.tile_m),
            line("tokens", "gemm", list(self.eta_tokens)),
            line("eta", "gemm", [round(v, 4) for v in self.eta_values]),
            "",
            "[overhead]",
            line("moe_layer_us", "overhead", self.moe_layer_overhead * 1e6),
            line("expert_call_us", "overhead", self.expert_call_overhead * 1e6),
            line("activation_ns", "overhead", self.activation_cost * 1e9),
        ]
        return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        # Integral values print as ints (token counts); others keep 6 significant digits.
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(float(f"{v:.6g}"))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def list_hardware() -> list[str]:
    """Names of the shipped hardware profiles, sorted."""
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.toml"))


def load_hardware(name_or_path: str | Path) -> Hardware:
    """A shipped profile by name (see `list_hardware()`) or any profile TOML by path -> Hardware.

    Raises ConfigError naming the file and the field for a missing or invalid field, and listing the known
    names for an unknown name.
    """
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.is_file():
        if not p.is_file():
            raise ConfigError(f"hardware profile {str(p)!r} does not exist; expected a TOML file.")
        return _parse(p)
    name = str(name_or_path).lower()
    path = HARDWARE_DIR / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(
            f"unknown hardware {str(name_or_path)!r}; expected one of {list_hardware()} or a path to a .toml profile."
        )
    return _parse(path)


def read_profile_toml(path: Path, schema: int) -> _Reader:
    """Parse a profile TOML and check its schema version; errors name the file (and field)."""
    from routecast.common.schemas import read_toml

    doc = read_toml(path, "profile", "a routecast profile TOML")  # binary, bad UTF-8, bad TOML: one sentence
    r = _Reader(doc, path)
    if r.number("schema", integer=True) != schema:
        raise ConfigError(f"{path}: field 'schema' is {doc.get('schema')!r}; expected {schema}.")
    return r


def _parse(path: Path) -> Hardware:
    r = read_profile_toml(path, SCHEMA_VERSION)
    kind = r.string("kind")
    if kind not in ("gpu", "cpu"):
        raise ConfigError(f"{path}: field 'kind' is {kind!r}; expected 'gpu' or 'cpu'.")
    tokens = r.number_list("gemm.tokens")
    eta = r.number_list("gemm.eta")
    if len(tokens) != len(eta):
        raise ConfigError(
            f"{path}: field 'gemm.eta' has {len(eta)} values but 'gemm.tokens' has {len(tokens)}; expected equal lengths."
        )
    if any(t <= 0 for t in tokens) or any(b <= a for a, b in zip(tokens, tokens[1:], strict=False)):
        raise ConfigError(f"{path}: field 'gemm.tokens' is {tokens}; expected positive, strictly increasing counts.")
    if any(not 0.0 < v <= 1.0 for v in eta):
        raise ConfigError(f"{path}: field 'gemm.eta' is {eta}; expected efficiencies in (0, 1].")
    weight_mb = r.number_list("memory.weight_mb", optional=True)
    weight_gbps = r.number_list("memory.weight_gbps", optional=True)
    if len(weight_mb) != len(weight_gbps):
        raise ConfigError(
            f"{path}: field 'memory.weight_gbps' has {len(weight_gbps)} values but 'memory.weight_mb' has "
            f"{len(weight_mb)}; expected equal lengths."
        )
    if any(w <= 0 for w in weight_mb) or any(b <= a for a, b in zip(weight_mb, weight_mb[1:], strict=False)):
        raise ConfigError(f"{path}: field 'memory.weight_mb' is {weight_mb}; expected positive, strictly increasing sizes.")
    if any(v <= 0 for v in weight_gbps):
        raise ConfigError(f"{path}: field 'memory.weight_gbps' is {weight_gbps}; expected positive bandwidths.")
    derate = r.number("memory.derate")
    if not 0.0 < derate <= 1.0:
        raise ConfigError(f"{path}: field 'memory.derate' is {derate}; expected a fraction in (0, 1].")
    return Hardware(
        name=r.string("name"),
        kind=kind,
        description=r.string("description"),
        dtype=r.string("compute.dtype"),
        peak_flops=r.number("compute.peak_tflops", positive=True) * 1e12,
        mem_bandwidth=r.number("memory.bandwidth_gbps", positive=True) * 1e9,
        mem_derate=derate,
        mem_capacity=r.number("memory.capacity_gb", positive=True) * 1e9,
        nvlink_bandwidth=r.number("interconnect.nvlink_gbps") * 1e9,
        pcie_bandwidth=r.number("interconnect.pcie_gbps") * 1e9,
        h2d_bandwidth=r.number("interconnect.h2d_gbps") * 1e9,
        alpha=r.number("interconnect.alpha_us") * 1e-6,
        eta_tokens=tuple(float(t) for t in tokens),
        eta_values=tuple(float(v) for v in eta),
        tile_m=int(r.number("gemm.tile_m", integer=True)),
        moe_layer_overhead=r.number("overhead.moe_layer_us") * 1e-6,
        weight_bytes=tuple(w * 1e6 for w in weight_mb),
        weight_bandwidth=tuple(v * 1e9 for v in weight_gbps),
        expert_call_overhead=r.number("overhead.expert_call_us", default=0.0) * 1e-6,
        activation_cost=r.number("overhead.activation_ns", default=0.0) * 1e-9,
        source=str(path),
    )


class _Reader:
    """Typed access to dotted keys of a parsed TOML document; every failure names the file and the key."""

    def __init__(self, doc: dict[str, Any], path: Path):
        self.doc, self.path = doc, path

    def get(self, dotted: str, default: Any = None) -> Any:
        """The value at `dotted`; a missing key gives `default` when one is given, else a ConfigError."""
        node: Any = self.doc
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                if default is not None:
                    return default
                raise ConfigError(f"{self.path}: field '{dotted}' is missing.")
            node = node[part]
        return node

    def string(self, dotted: str) -> str:
        v = self.get(dotted)
        if not isinstance(v, str):
            raise ConfigError(f"{self.path}: field '{dotted}' is {v!r}; expected a string.")
        return v

    def number(self, dotted: str, *, positive: bool = False, integer: bool = False, default: float | None = None) -> float:
        v = self.get(dotted, default)
        ok = isinstance(v, int) if integer else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok or not math.isfinite(v) or v < 0 or (positive and v <= 0):
            what = "integer" if integer else "number"
            raise ConfigError(
                f"{self.path}: field '{dotted}' is {v!r}; expected a {'positive' if positive else 'non-negative'} {what}."
            )
        return v

    def number_list(self, dotted: str, *, optional: bool = False) -> list[float]:
        """A non-empty list of finite numbers; with `optional`, an absent key or an empty list gives []."""
        v = self.get(dotted, [] if optional else None)
        if optional and v == []:
            return []
        if (
            not isinstance(v, list)
            or not v
            or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) for x in v)
        ):
            raise ConfigError(f"{self.path}: field '{dotted}' is {v!r}; expected a non-empty list of numbers.")
        return [float(x) for x in v]


def capacity_note(model: Any, hw: Hardware, ranks: int) -> str | None:
    """None when one rank's share of the routed (and shared) expert weights fits hw's memory, else the
    sentence saying the price assumes it does (no offloading is modelled). model: a sim ModelProfile."""
    per_rank = -(-model.num_experts // ranks)
    need = model.num_moe_layers * (per_rank * model.expert_bytes() + model.shared_bytes)
    if need <= hw.mem_capacity:
        return None
    return (f"assumed: each GPU holds its {per_rank} experts x {model.num_moe_layers} MoE layers "
            f"({need / 1e9:.1f} GB of weights), more than {hw.name}'s {hw.mem_capacity / 1e9:.1f} GB; priced as if "
            "they fit (no offloading is modelled)")


def named_file(name: str) -> Path | None:
    """The file or folder a name stands for on a command line (a built-in model, a shipped hardware, model or
    link profile), so an output can be refused when it would overwrite it; None for other names."""
    from routecast.models.builtin import builtin_path, is_builtin_name

    if is_builtin_name(name):
        return Path(builtin_path(name))
    for kind in ("hardware", "models", "links"):
        q = Path(__file__).parent / kind / f"{name}.toml"
        if q.is_file():
            return q
    return None
