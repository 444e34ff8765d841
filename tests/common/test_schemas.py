"""Schemas of the files commands read: every malformed file is one ConfigError naming the file and the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.common import schemas as S
from routecast.common.errors import ConfigError
from routecast.schedule.cocluster import PLAN_VERSION, read_plan

BASE = {"version": PLAN_VERSION, "method": "smoe", "ep": 2, "beta": 1.1, "fit_s": [0.1], "meta": {},
        "expert_group_LE": [[0, 0, 1, 1]], "token_keys_U": [3, 5], "token_group_LU": [[0, 1]],
        "token_conf_LU": [[0.5, 0.9]]}


def _plan(tmp_path, **change):
    doc = {**BASE, **change}
    for k in [k for k, v in change.items() if v is ...]:
        del doc[k]
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    return p


def test_a_good_plan_reads(tmp_path):
    plan = read_plan(_plan(tmp_path))
    assert plan.ep == 2 and plan.expert_group_LE.shape == (1, 4) and plan.token_keys_U.tolist() == [3, 5]


@pytest.mark.parametrize("change,field", [
    ({"token_keys_U": [3, 2**70]}, "token_keys_U"), ({"beta": "abc"}, "beta"), ({"fit_s": 5}, "fit_s"),
    ({"meta": [1, 2]}, "meta"), ({"expert_group_LE": []}, "expert_group_LE"), ({"ep": 2.0}, "ep"),
    ({"ep": True}, "ep"), ({"ep": 0}, "ep"), ({"ep": ...}, "ep"), ({"beta": float("inf")}, "beta"),
    ({"expert_group_LE": [[0, 0, 1, 2]]}, "expert_group_LE"), ({"expert_group_LE": [[0, 0.5, 1, 1]]}, "expert_group_LE"),
    ({"token_group_LU": [[0]]}, "token_group_LU"), ({"token_group_LU": [[0], [1, 2]]}, "token_group_LU"),
    ({"token_conf_LU": [[0.5, "x"]]}, "token_conf_LU"), ({"token_keys_U": [-1, 5]}, "token_keys_U"),
    ({"token_group_LU": [[0, 7]]}, "token_group_LU"),
])
def test_malformed_plans_name_the_field(tmp_path, change, field):
    with pytest.raises(ConfigError) as e:
        read_plan(_plan(tmp_path, **change))
    msg = str(e.value)
    assert "--plan" in msg and field in msg and msg.count("\n") == 0, msg


@pytest.mark.parametrize("content", [b"\x00\xff\xfe binary", b"{not json", b"[1, 2]", b"", b"1" * 5000])
def test_unreadable_plan_files_are_one_sentence(tmp_path, content):
    p = tmp_path / "plan.json"
    p.write_bytes(content)
    with pytest.raises(ConfigError, match="--plan"):
        read_plan(p)


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(BASE)), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=12)))
def test_any_plan_document_reads_or_is_refused_in_one_sentence(tmp_path_factory, change):
    p = tmp_path_factory.mktemp("plan") / "plan.json"
    p.write_text(json.dumps({**BASE, **change}))
    try:
        read_plan(p)
    except ConfigError as e:
        assert "\n" not in str(e)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_as_json_or_toml_are_read_or_refused(tmp_path_factory, raw):
    p = tmp_path_factory.mktemp("raw") / "x.json"
    p.write_bytes(raw)
    for fn in (S.read_json, S.read_toml, S.read_jsonl):
        try:
            fn(p, "--x")
        except ConfigError as e:
            assert str(e).startswith("--x ") and "\n" not in str(e)


@pytest.mark.parametrize("make,expect", [
    (lambda: np.array([0, 1, 2, 1]), "in [0, 1]"), (lambda: np.array([0, 1]), "shape (2,)"),
    (lambda: np.zeros((4, 2, 2), np.int64), "shape (4, 2, 2)"), (lambda: np.array([0.0, 1.0, 0.0, 1.0]), "float64"),
    (lambda: np.array([0, 1, -1, 0]), "in [0, 1]"),
])
def test_token_ranks_are_checked_not_truncated(tmp_path, make, expect):
    p = tmp_path / "r.npy"
    np.save(p, make())
    with pytest.raises(ConfigError) as e:
        S.load_int_npy(p, "--token-ranks", shapes=((4,), (4, 3)), lo=0, hi=1)
    assert expect in str(e.value) and "--token-ranks" in str(e.value)


def test_token_ranks_refuse_pickles_and_non_npy(tmp_path):
    p = tmp_path / "r.npy"
    np.save(p, np.array([object(), 1], dtype=object), allow_pickle=True)
    with pytest.raises(ConfigError, match="--token-ranks"):
        S.load_int_npy(p, "--token-ranks", shapes=((2,),), lo=0, hi=1)
    p.write_text("0,1,0,1")
    with pytest.raises(ConfigError, match="not a .npy"):
        S.load_int_npy(p, "--token-ranks", shapes=((4,),), lo=0, hi=1)
    np.save(p, np.array([0, 1, 1, 0], np.int16))
    assert S.load_int_npy(p, "--token-ranks", shapes=((4,),), lo=0, hi=1).dtype == np.int64


def test_profiles_and_sglang_files_refuse_binary(tmp_path):
    from routecast.place.engines import read_sglang_file
    from routecast.sim.hardware import load_hardware

    p = tmp_path / "hw.toml"
    p.write_bytes(b"\x80\x81binary")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_hardware(p)
    q = tmp_path / "map.json"
    q.write_bytes(b"\x89PNG\r\n\x1a\n\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_sglang_file(q)
