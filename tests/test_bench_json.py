"""The shared benchmark JSON: written atomically, NaN-safe, read back with the renderer's checks."""

import json

import numpy as np
import pytest

from routecast.common.bench import read_bench, table, write_bench
from routecast.common.errors import ConfigError


def test_roundtrip(tmp_path):
    p = write_bench("x", title="X", headline=["a: 1"], tables=[table("t", [{"k": np.float32(1.5), "n": float("nan")}])],
                    data={"arr": np.arange(3)}, path=tmp_path / "x.json")
    d = read_bench(p)
    assert d["tables"][0]["rows"] == [{"k": 1.5, "n": None}] and d["data"]["arr"] == [0, 1, 2]
    assert d["headline"] == ["a: 1"] and d["machine"]["cpus"] >= 1


def test_bad_file_refused(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps({"benchmark": "b"}))
    with pytest.raises(ConfigError, match="lacks 'title'"):
        read_bench(tmp_path / "b.json")
    (tmp_path / "c.json").write_bytes(b"\xff\x00")
    with pytest.raises(ConfigError, match="cannot be read"):
        read_bench(tmp_path / "c.json")


def test_command_quotes_arguments_so_an_empty_one_stays_visible(monkeypatch):
    from routecast.common.bench import _command

    monkeypatch.setattr("sys.argv", ["benchmarks/offload.py", "--combine", "", "--prompts", "corpus:val:8 x"])
    assert _command("offload") == "python benchmarks/offload.py --combine '' --prompts 'corpus:val:8 x'"
