"""Commands that read a trace never join a lazy trace's shards (issue 10): each runs through the CLI on a
multi-shard trace read in tiny chunks, and no routing tensor is materialised (lazy.MATERIALISED stays put)."""

from __future__ import annotations

import pytest

import routecast.trace.trace as trace_mod
from routecast.cli import main
from routecast.trace import lazy, stats_bundle
from routecast.trace.io import write_trace
from tests.trace.test_lazy import serving_trace


@pytest.fixture(scope="module")
def lazy_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmd") / "t"
    tr = serving_trace(T=600, E=8, seed=5)  # Mixtral's 8 experts, so the model profiles accept it
    tr.tokens["phase"][:] = 0  # prompts only: a step holds several tokens of one request (rebatch splits decode steps)
    write_trace(tr, d, shard_tokens=64)
    return d


@pytest.mark.parametrize("argv", [
    ["stats", "{t}", "--ep", "4", "--seq-len", "16", "--json"],
    ["schedule", "cocluster", "{t}", "--ep", "4", "--method", "sts", "--max-tokens", "200", "--quiet", "--out",
     "{o}/cc.json", "--split", "request"],
    ["schedule", "rebatch", "{t}", "--max-tokens", "150", "--policy", "lru", "--expert-bytes", "4096", "--quiet",
     "--out", "{o}/rb.json", "--split", "request"],
    ["predict", "fit", "{t}", "--predictor", "probability", "--out", "{o}/fit", "--split", "request"],
    ["place", "export", "eplb", "--trace", "{t}", "--ep", "4", "--num-layers", "4", "--out", "{o}/eplb.json"],
    pytest.param(["advise", "--model-profile", "mixtral-8x7b", "--hardware", "a100-sxm-80gb", "--gpus", "4", "--trace",
                  "{t}", "--predictors", "distribution", "--seq", "32"], marks=pytest.mark.slow),  # imports torch
    ["serve-sim", "--trace", "{t}", "--rate", "5", "--budget", "50%", "--period", "1", "--requests", "6",
     "--out", "{o}/serve.json", "--quiet"],
], ids=["stats", "cocluster", "rebatch", "predict-fit", "place-export", "advise", "serve-sim"])
def test_command_streams_a_lazy_trace(lazy_dir, tmp_path, monkeypatch, argv, capsys):
    monkeypatch.setattr(trace_mod, "CHUNK_ROWS", 17)
    monkeypatch.setattr(stats_bundle, "SAMPLE_TOKENS", 200)  # every cap below the trace's 600 rows: a read of all
    # of them is then a whole read (lazy.MATERIALISED counts x[:], all-True masks, ...), not a capped sample
    before = lazy.MATERIALISED["count"]
    assert main([x.format(t=lazy_dir, o=tmp_path) for x in argv]) == 0, capsys.readouterr().err
    assert lazy.MATERIALISED["count"] == before
