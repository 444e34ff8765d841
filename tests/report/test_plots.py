"""Plot functions write real PNGs from arrays and from routing_stats output; bad shapes are one sentence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.report import plots
from routecast.trace import MoESpec, Trace, make_columns
from routecast.trace.stats_bundle import routing_stats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(p: Path) -> bool:
    return p.is_file() and p.stat().st_size > 1000 and p.read_bytes()[:8] == PNG_MAGIC


def small_trace(L: int = 3, T: int = 240, E: int = 8, K: int = 2, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    ex = np.argsort(rng.random((T, L, E)), axis=-1)[..., :K].astype(np.int16)
    spec = MoESpec(num_layers=L, num_experts=E, top_k=K, name="plot-test")
    cols = make_columns(T, request=np.arange(T) // 20, step=np.arange(T) // 12, token_id=rng.integers(0, 9, T))
    return Trace(spec=spec, tokens=cols, experts_TLK=ex, weights_TLK=rng.random(ex.shape).astype(np.float32))


def test_each_plot_writes_a_png_and_returns_its_path(tmp_path):
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 50, (6, 16))
    counts[2] = 0  # an empty layer must not break the heatmap
    ir = 1 + rng.random((40, 6))
    ir[5, 1] = np.nan  # a step with no tokens at a layer
    P = rng.dirichlet(np.ones(16), size=16)
    out = [
        plots.plot_expert_load(counts, tmp_path / "load.png", layer_ids=[1, 3, 5, 7, 9, 11]),
        plots.plot_ir_steps(ir, tmp_path / "ir.png", ep=4, pool=2),
        plots.plot_transition(P, tmp_path / "sub" / "tr.png", layer=3),
        plots.plot_popularity(counts, tmp_path / "pop.png"),
    ]
    assert [p.name for p in out] == ["load.png", "ir.png", "tr.png", "pop.png"]
    assert all(is_png(p) for p in out)


def test_stats_figure_from_routing_stats(tmp_path):
    d = routing_stats(small_trace(), ep=4)
    p = plots.stats_figure(d, tmp_path / "stats.png")
    assert p == tmp_path / "stats.png" and is_png(p)
    # One MoE layer: no transition panel, still a figure.
    d1 = routing_stats(small_trace(L=1), ep=2)
    assert d1["transition"] is None and is_png(plots.stats_figure(d1, tmp_path / "one.png"))


def test_bad_input_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"counts_LE has shape \(5,\); expected a non-empty 2-D array"):
        plots.plot_expert_load(np.ones(5), tmp_path / "x.png")
    with pytest.raises(ConfigError, match="no 'counts_LE'"):
        plots.stats_figure({"steps": {}, "ep": 8}, tmp_path / "y.png")
    assert not (tmp_path / "x.png").exists()
