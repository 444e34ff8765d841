"""`routecast stats` (report/stats.py): table, JSON and --plot on a trace read from disk."""

from __future__ import annotations

import io
import json

import pytest

from routecast.common.errors import ConfigError
from routecast.report.stats import stats_main
from tests.trace.test_stats import random_trace


def test_stats_main_prints_table_json_and_plot(monkeypatch, tmp_path):
    import routecast.trace.io as tio

    tr = random_trace(8, T=200)
    monkeypatch.setattr(tio, "read_trace", lambda path, **kw: tr)
    buf = io.StringIO()
    assert stats_main("x", ep=2, window=None, as_json=False, plot=tmp_path / "s.png", out=buf) == 0
    assert "routing statistics" in buf.getvalue() and (tmp_path / "s.png").stat().st_size > 0
    buf = io.StringIO()
    assert stats_main("x", ep=2, window=3, as_json=True, plot=None, out=buf) == 0
    assert json.loads(buf.getvalue())["window"] == 3


def test_stats_main_on_a_trace_written_to_disk(tmp_path, capsys):
    from routecast.trace.io import write_trace

    tr = random_trace(9, T=150)
    write_trace(tr, tmp_path / "t")
    assert stats_main(tmp_path / "t", ep=4, window=2) == 0
    out = capsys.readouterr().out
    assert out.startswith("routing statistics: test  T=150  L=3  E=8  K=2")
    with pytest.raises(ConfigError, match="ep is 3"):
        stats_main(tmp_path / "t", ep=3)
