"""ExpertFlow re-batching: halves are balanced, keep every token, cluster similar paths; the CLI prices both."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.cli import main
from routecast.common.errors import ConfigError
from routecast.predict.forecast import multi_hot
from routecast.schedule.rebatch import activated_experts, rebatch, split_step
from routecast.trace import DECODE, MoESpec, Trace, make_columns
from routecast.trace.io import write_trace


def two_kinds(steps=6, per_step=8, L=2, E=8, seed=0) -> Trace:
    """Each decode step mixes tokens of two kinds, interleaved: kind 0 routes to experts 0-1, kind 1 to 6-7."""
    rng = np.random.default_rng(seed)
    T = steps * per_step
    kind = np.arange(T) % 2
    ex = np.where(kind[:, None, None] == 0, np.array([0, 1]), np.array([6, 7]))
    ex = np.broadcast_to(ex, (T, L, 2)).astype(np.int16).copy()
    req = np.tile(np.arange(per_step), steps)
    return Trace(spec=MoESpec(num_layers=L, num_experts=E, top_k=2, expert_bytes=1 << 20),
                 tokens=make_columns(T, request=req, position=np.repeat(np.arange(steps), per_step),
                                     step=np.repeat(np.arange(steps), per_step), phase=np.full(T, DECODE),
                                     token_id=rng.integers(0, 9, T)),
                 experts_TLK=ex, weights_TLK=np.full((T, L, 2), 0.5, np.float32))


def test_clustering_separates_the_two_kinds_and_halves_activated_experts():
    tr = two_kinds()
    paths = multi_hot(tr.experts_TLK, tr.spec.num_experts)
    arr, clu = rebatch(tr, paths, "arrival"), rebatch(tr, paths, "clustered")
    a, c = activated_experts(arr), activated_experts(clu)
    assert len(a) == len(c) == 12
    assert a.mean() == 8 and c.mean() == 4  # 2 layers x (4 mixed experts) vs 2 layers x 2


@settings(max_examples=25, deadline=None)
@given(T=st.integers(2, 17), seed=st.integers(0, 1000), method=st.sampled_from(["arrival", "clustered"]))
def test_split_is_balanced(T, seed, method):
    paths = np.random.default_rng(seed).random((T, 12)) < 0.3
    half = split_step(paths, method, seed)
    assert sorted(np.bincount(half, minlength=2).tolist()) == sorted([T // 2, T - T // 2])


def test_rebatch_keeps_tokens_and_order_of_steps():
    tr = two_kinds()
    paths = multi_hot(tr.experts_TLK, tr.spec.num_experts)
    out = rebatch(tr, paths, "clustered", min_tokens=100)  # no step is large enough: nothing splits
    assert np.array_equal(out.step, 2 * tr.step)
    out = rebatch(tr, paths, "clustered")
    assert np.array_equal(out.step // 2, tr.step) and np.array_equal(out.experts_TLK, tr.experts_TLK)


def test_cli_rebatch_with_the_oracle_paths(tmp_path, capsys):
    d = write_trace(two_kinds(steps=10, per_step=40), tmp_path / "t")
    out = tmp_path / "r.json"
    assert main(["schedule", "rebatch", str(d), "--predictor", "oracle", "--policy", "lru", "--quiet", "--seed", "3",
                 "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    arr, clu = res["rows"]
    assert (clu["activated_per_batch"], arr["activated_per_batch"]) == (4.0, 8.0)  # seed 3: 4 + 4 of each kind
    assert main(["schedule", "rebatch", str(d), "--budget", "0", "--out", str(out)]) == 2
    assert "--budget" in capsys.readouterr().err


def test_min_tokens_below_two_is_one_sentence_exit_2(tmp_path, capsys):
    tr = two_kinds(steps=3, per_step=1)  # decode steps of one token each
    paths = multi_hot(tr.experts_TLK, tr.spec.num_experts)
    for m in (1, 0, -1):  # a one-token step cannot be split in two (it raised a bare sklearn ValueError)
        with pytest.raises(ConfigError, match=f"--min-tokens is {m}; expected at least 2"):
            rebatch(tr, paths, "clustered", min_tokens=m)
    assert rebatch(tr, paths, "clustered", min_tokens=2).num_tokens == 3
    d = write_trace(two_kinds(steps=10, per_step=40), tmp_path / "t")
    assert main(["schedule", "rebatch", str(d), "--predictor", "oracle", "--quiet", "--min-tokens", "-1",
                 "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("routecast schedule: error: --min-tokens is -1")
    assert not (tmp_path / "r.json").exists()
