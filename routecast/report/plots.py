"""Routing-statistics plots: expert-load heatmap, IR over steps, inter-layer transitions, popularity.

Every public function takes arrays (shapes in the names: L layers, E experts, S steps) and a path,
writes one PNG and returns the path. Figures are built on matplotlib's object API with the Agg canvas
(no pyplot, no global backend switch), so plotting is safe in tests, threads and headless machines.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from routecast.common.errors import ConfigError

DPI = 110


def _array(x: object, ndim: int, name: str, where: str) -> np.ndarray:
    """float64 array of the given rank (None entries, as JSON NaN, become NaN) or a ConfigError."""
    a = np.array(x, dtype=np.float64)
    if a.ndim != ndim or 0 in a.shape:
        raise ConfigError(f"{where}: {name} has shape {a.shape}; expected a non-empty {ndim}-D array.")
    return a


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Render a matplotlib Figure to a PNG at path (parents created); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(p, format="png", dpi=DPI)
    return p


def _layer_ticks(ax: Axes, L: int, labels: Sequence[int] | None, axis: str = "y") -> None:
    # At most ~12 tick labels: a 58-layer heatmap with every layer labelled is unreadable.
    step = max(1, int(np.ceil(L / 12)))
    idx = np.arange(0, L, step)
    names = [str(labels[i]) if labels is not None else str(i) for i in idx]
    (ax.set_yticks if axis == "y" else ax.set_xticks)(idx, names)


# ---------------------------------------------------------------------------------------- drawers
def draw_expert_load(ax: Axes, counts_LE: np.ndarray, *, layer_ids: Sequence[int] | None = None) -> None:
    """Heatmap of each expert's load relative to its layer's mean (1 = even share), layers as rows."""
    c = _array(counts_LE, 2, "counts_LE", "draw_expert_load")
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = c / c.mean(axis=1, keepdims=True)
    # Colour range capped at the 99th percentile so one hot expert does not wash out the rest.
    vmax = max(2.0, float(np.nanpercentile(rel, 99))) if np.isfinite(rel).any() else 2.0
    im = ax.imshow(rel, aspect="auto", interpolation="nearest", cmap="magma", vmin=0.0, vmax=vmax)
    ax.figure.colorbar(im, ax=ax, label="load / layer mean")
    ax.set_xlabel("expert")
    ax.set_ylabel("MoE layer")
    _layer_ticks(ax, c.shape[0], layer_ids)
    ax.set_title("expert load per layer")


def draw_ir_steps(ax: Axes, ir_SL: np.ndarray, *, ep: int | None = None, pool: int = 1) -> None:
    """IR of every layer over steps (thin, light) and its mean over layers (bold)."""
    ir = _array(ir_SL, 2, "ir_SL", "draw_ir_steps")
    x = np.arange(ir.shape[0]) * max(1, int(pool))
    ax.plot(x, ir, color="tab:blue", alpha=float(np.clip(3.0 / ir.shape[1], 0.12, 0.5)), linewidth=0.6)
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(ir)
        mean = np.where(finite.any(axis=1), np.where(finite, ir, 0).sum(1) / np.maximum(finite.sum(1), 1), np.nan)
    ax.plot(x, mean, color="tab:red", linewidth=2.0, label=f"mean over {ir.shape[1]} layers")
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle=":")
    ax.set_xlabel("step" + (f" (mean of {pool} steps per point)" if pool > 1 else ""))
    ax.set_ylabel("imbalance ratio (max / mean rank load)")
    ax.set_title(f"PROBE IR per step, ep={ep}" if ep else "PROBE IR per step")
    ax.legend(loc="upper right", fontsize="small")


def draw_transition(ax: Axes, P_EE: np.ndarray, *, layer: int = 0) -> None:
    """Heatmap of P(expert b at layer l+1 | expert a at layer l), rows a, columns b."""
    P = _array(P_EE, 2, "P_EE", "draw_transition")
    im = ax.imshow(P, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0)
    ax.figure.colorbar(im, ax=ax, label="P(next | this)")
    ax.set_xlabel(f"expert at layer {layer + 1}")
    ax.set_ylabel(f"expert at layer {layer}")
    ax.set_title(f"inter-layer transitions {layer} -> {layer + 1}")


def draw_popularity(ax: Axes, counts_LE: np.ndarray) -> None:
    """Sorted expert share per layer (light) and the mean curve (bold), against the even share 1/E."""
    c = _array(counts_LE, 2, "counts_LE", "draw_popularity")
    with np.errstate(invalid="ignore", divide="ignore"):
        share = -np.sort(-(c / c.sum(axis=1, keepdims=True)), axis=1)
    rank = np.arange(1, c.shape[1] + 1)
    ax.plot(rank, share.T, color="tab:green", alpha=0.2, linewidth=0.6)
    ax.plot(rank, np.nanmean(share, axis=0) if np.isfinite(share).any() else share[0], color="black",
            linewidth=2.0, label="mean over layers")
    ax.axhline(1.0 / c.shape[1], color="gray", linewidth=0.8, linestyle=":", label="even share 1/E")
    ax.set_xscale("log")
    ax.set_xlabel("expert rank (most popular first)")
    ax.set_ylabel("share of routed slots")
    ax.set_title("expert popularity curve")
    ax.legend(loc="upper right", fontsize="small")


# ---------------------------------------------------------------------------------------- one file each
def plot_expert_load(counts_LE: np.ndarray, path: str | Path, *, layer_ids: Sequence[int] | None = None) -> Path:
    """counts_LE: (L, E) slot counts -> PNG heatmap of load / layer mean at path. Returns the path."""
    fig = Figure(figsize=(8, 5))
    draw_expert_load(fig.add_subplot(), counts_LE, layer_ids=layer_ids)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_ir_steps(ir_SL: np.ndarray, path: str | Path, *, ep: int | None = None, pool: int = 1) -> Path:
    """ir_SL: (S, L) imbalance ratio per step and layer -> PNG line plot at path. Returns the path."""
    fig = Figure(figsize=(8, 4.5))
    draw_ir_steps(fig.add_subplot(), ir_SL, ep=ep, pool=pool)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_transition(P_EE: np.ndarray, path: str | Path, *, layer: int = 0) -> Path:
    """P_EE: (E, E) transition matrix layer -> layer+1 -> PNG heatmap at path. Returns the path."""
    fig = Figure(figsize=(6, 5))
    draw_transition(fig.add_subplot(), P_EE, layer=layer)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_popularity(counts_LE: np.ndarray, path: str | Path) -> Path:
    """counts_LE: (L, E) -> PNG of sorted expert shares per layer at path. Returns the path."""
    fig = Figure(figsize=(6, 4.5))
    draw_popularity(fig.add_subplot(), counts_LE)
    fig.tight_layout()
    return save_figure(fig, path)


def stats_figure(trace_stats: dict, out_png: str | Path) -> Path:
    """One 2x2 figure from routing_stats output: load heatmap, IR over steps, transitions, popularity."""
    for key in ("counts_LE", "steps", "ep"):
        if key not in trace_stats:
            raise ConfigError(f"stats_figure: trace_stats has no '{key}'; expected the dict from routing_stats.")
    d = trace_stats
    fig = Figure(figsize=(14, 9.5))
    axes = fig.subplots(2, 2)
    draw_expert_load(axes[0, 0], d["counts_LE"], layer_ids=d.get("layer_ids"))
    draw_ir_steps(axes[0, 1], d["steps"]["ir_SL"], ep=d["ep"], pool=d["steps"].get("pool", 1))
    tr = d.get("transition")
    if tr is not None:
        draw_transition(axes[1, 0], tr["P_EE"], layer=int(tr["layer"]))
    else:
        axes[1, 0].set_axis_off()
        axes[1, 0].text(0.5, 0.5, "one MoE layer: no transitions", ha="center", va="center")
    draw_popularity(axes[1, 1], d["counts_LE"])
    o = d.get("overall", {})

    def fmt(k: str) -> str:
        return "-" if o.get(k) is None else f"{o[k]:.2f}"

    fig.suptitle(
        f"{d.get('model') or 'moe'}: T={d.get('num_tokens')} L={d.get('num_layers')} E={d.get('num_experts')} "
        f"K={d.get('top_k')}  skewness {fmt('skewness')}  IR/step {fmt('ir_step_mean')} (ep={d['ep']})  "
        f"H/Hmax {fmt('entropy_norm')}"
    )
    fig.tight_layout()
    return save_figure(fig, out_png)
