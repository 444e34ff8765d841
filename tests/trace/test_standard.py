"""Standard traces: made once under the root, reused after, unknown names refused with one sentence."""

import pytest

from routecast.common.errors import ConfigError
from routecast.trace.io import read_trace
from routecast.trace.standard import standard_names, standard_trace


def test_preset_made_once_then_reused(tmp_path):
    p = standard_trace("mixtral-8x7b", tmp_path, requests=2, progress=False)
    assert p == tmp_path / "mixtral-8x7b-r2" and (p / "trace.json").is_file()
    stamp = (p / "trace.json").stat().st_mtime_ns
    assert standard_trace("mixtral-8x7b", tmp_path, requests=2) == p
    assert (p / "trace.json").stat().st_mtime_ns == stamp  # not made again
    assert not (tmp_path / "mixtral-8x7b-r2.partial").exists()
    assert read_trace(p).spec.num_experts == 8


def test_env_root(tmp_path, monkeypatch):
    monkeypatch.setenv("ROUTECAST_TRACES", str(tmp_path / "shared"))
    assert standard_trace("mixtral-8x7b", requests=2, progress=False).parent == tmp_path / "shared"


def test_unknown_name_refused(tmp_path):
    assert "fine" in standard_names() and "deepseek-v3" in standard_names()
    with pytest.raises(ConfigError, match="unknown"):
        standard_trace("nope", tmp_path)
    with pytest.raises(ConfigError, match="presets only"):
        standard_trace("fine", tmp_path, requests=3)


def test_captured_name_of_a_built_in_model():
    from routecast.trace.standard import captured_name_of

    assert captured_name_of("builtin-fine") == "fine" and captured_name_of("builtin") == "builtin"
    assert captured_name_of("some/local/checkpoint") is None
