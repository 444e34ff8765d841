"""SGLang plan export / import: --init-expert-location JSON round trip, all-layer row indexing (DeepSeek's dense
first layer), recorder dumps as loads, refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from routecast.cli import main
from routecast.common.errors import ConfigError
from routecast.place.engines import (
    loads_from_sglang,
    plan_from_sglang,
    sglang_counts,
    sglang_mapping,
)
from routecast.place.slot_plans import eplb_plan, moegps_plan

LAYER_IDS = (1, 2, 3)  # a DeepSeek-style model: layer 0 dense (first_k_dense_replace = 1), layers 1-3 MoE


def _plan():
    rng = np.random.default_rng(0)
    return eplb_plan(rng.integers(0, 50, (3, 8)), 2, redundant_per_rank=1, layer_ids=LAYER_IDS)


def test_mapping_round_trip_with_dense_rows(tmp_path):
    plan = _plan()
    doc = sglang_mapping(plan, num_model_layers=4)
    assert list(doc) == ["physical_to_logical_map"]  # SGLang calls init_by_mapping(**data): one key only
    m = np.array(doc["physical_to_logical_map"])
    assert m.shape == (4, 10)  # [all model layers, E + redundant]
    assert m[0].tolist() == (np.arange(10) % 8).tolist()  # the dense layer: SGLang's trivial map
    assert (m[1:] == plan.slots_LS).all()  # MoE layer l sits at its model index, not at l
    (tmp_path / "p.json").write_text(json.dumps(doc))
    back = plan_from_sglang(tmp_path / "p.json", layer_ids=LAYER_IDS, num_experts=8, num_ranks=2)
    assert (back.slots_LS == plan.slots_LS).all() and back.layer_ids == LAYER_IDS


def test_counts_and_recorder_dump(tmp_path):
    import torch

    load = np.arange(24).reshape(3, 8)
    doc = sglang_counts(load, LAYER_IDS, 4)
    assert np.array(doc["logical_count"])[0].sum() == 0
    (tmp_path / "c.json").write_text(json.dumps(doc))
    assert (loads_from_sglang(tmp_path / "c.json", layer_ids=LAYER_IDS, num_experts=8) == load).all()
    # the "stat" recorder dump: {"rank", "logical_count" [steps, all layers, E], ...} written with torch.save
    steps = torch.zeros(5, 4, 8, dtype=torch.int32)
    steps[:, 1:] = torch.from_numpy(load).int()
    torch.save({"rank": 0, "logical_count": steps, "average_utilization_rate_over_window": None}, tmp_path / "d.pt")
    got = loads_from_sglang(tmp_path / "d.pt", layer_ids=LAYER_IDS, num_experts=8, per_step=True)
    assert got.shape == (5, 3, 8) and (got.sum(axis=0) == 5 * load).all()


def test_refusals(tmp_path):
    plan = moegps_plan(np.array([[90, 5, 3, 2, 0, 0, 0, 0]] * 3), 2, redundant_per_rank=2, layer_ids=LAYER_IDS)
    if (plan.slots_LS < 0).any():
        with pytest.raises(ConfigError, match="slots empty"):
            sglang_mapping(plan, 4)
    with pytest.raises(ConfigError, match="do not fit a model of 3 layers"):
        sglang_mapping(_plan(), 3)
    (tmp_path / "x.json").write_text(json.dumps({"foo": 1}))
    with pytest.raises(ConfigError, match="neither physical_to_logical_map nor logical_count"):
        plan_from_sglang(tmp_path / "x.json", layer_ids=LAYER_IDS, num_experts=8, num_ranks=2)
    bad = sglang_mapping(_plan(), 4)
    bad["physical_to_logical_map"][2][0] = 9
    (tmp_path / "b.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="holds expert 9"):
        plan_from_sglang(tmp_path / "b.json", layer_ids=LAYER_IDS, num_experts=8, num_ranks=2)
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    with pytest.raises(ConfigError, match="not a torch file"):
        loads_from_sglang(tmp_path / "bad.pt", layer_ids=LAYER_IDS, num_experts=8)


def test_cli_export_round_trip(tmp_path, capsys, small_trace):
    import dataclasses

    from routecast.trace.io import write_trace

    t = small_trace(num_requests=6, num_layers=3, num_experts=8)
    write_trace(dataclasses.replace(t, spec=dataclasses.replace(t.spec, layer_ids=LAYER_IDS)), tmp_path / "tr")
    out = tmp_path / "plan.json"
    argv = ["place", "export", "eplb", "--trace", str(tmp_path / "tr"), "--ep", "2", "--num-layers", "4",
            "--format", "sglang", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "[4 layers, 10 physical experts]" in text and "read back: identical" in text
    assert "--ep-size 2 --ep-num-redundant-experts 2" in text
    m = np.array(json.loads(out.read_text())["physical_to_logical_map"])
    assert m.shape == (4, 10) and (m[0] == np.arange(10) % 8).all()
    assert main(argv) == 2 and "exists" in capsys.readouterr().err
    conv = tmp_path / "again.json"  # a SGLang file converts back into the same file
    assert main(["place", "export", str(out), "--trace", str(tmp_path / "tr"), "--ep", "2", "--num-layers", "4",
                 "--out", str(conv)]) == 0
    assert json.loads(conv.read_text()) == json.loads(out.read_text())
    assert main(["place", "export", "eplb", "--trace", str(tmp_path / "tr"), "--ep", "3", "--num-layers", "4",
                 "--out", str(tmp_path / "z.json")]) == 2
    assert "ranks (--ep / --nproc) is 3" in capsys.readouterr().err
