"""The `routecast` command end to end on small inputs: exit codes, outputs, one-line errors."""

import json

import pytest

from routecast.cli import build_parser, main
from routecast.trace.io import read_trace, write_trace
from tests.conftest import build_small_trace


@pytest.fixture
def trace_dir(tmp_path):
    return write_trace(build_small_trace(num_requests=6, num_experts=8), tmp_path / "t")


def test_every_flag_has_help():
    ap = build_parser()
    sub = next(a for a in ap._actions if a.dest == "cmd")
    for name, p in sub.choices.items():
        for act in p._actions:
            if act.dest != "help":
                assert act.help, f"routecast {name} {act.option_strings or act.dest} has no help text"


def test_stats_json_and_plot(trace_dir, tmp_path, capsys):
    png = tmp_path / "s.png"
    assert main(["stats", str(trace_dir), "--ep", "4", "--json", "--plot", str(png)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["overall"] and png.stat().st_size > 1000


def test_inspect_valid_and_corrupt(trace_dir, capsys):
    assert main(["inspect", str(trace_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_tokens"] == 60
    (trace_dir / "tokens.parquet").write_bytes(b"garbage")
    capsys.readouterr()
    assert main(["inspect", str(trace_dir)]) == 2  # like every command: stderr and exit code 2
    err = capsys.readouterr().err
    assert err.startswith("routecast inspect: error: ") and "tokens.parquet" in err and err.count("\n") == 1


def test_bad_trace_is_one_line_exit_2(trace_dir, capsys):
    (trace_dir / "trace.json").write_text("{not json")
    assert main(["stats", str(trace_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "trace.json" in err and "Traceback" not in err


def test_stats_bad_ep_exit_2(trace_dir, capsys):
    assert main(["stats", str(trace_dir), "--ep", "3"]) == 2
    assert "ep" in capsys.readouterr().err


def test_import_round_trip(tmp_path):
    lines = []
    for tok in range(5):
        for layer in range(2):
            lines.append(json.dumps({"request": 1, "layer": layer, "token_idx": tok, "token_id": 100 + tok,
                                     "experts": [tok % 4, (tok + 1) % 4], "gating_probs": [0.7, 0.3]}))
    src = tmp_path / "log.jsonl"
    src.write_text("\n".join(lines) + "\n")
    assert main(["import", str(src), "--out", str(tmp_path / "imp"), "--quiet"]) == 0
    tr = read_trace(tmp_path / "imp")
    assert tr.num_tokens == 5 and tr.experts_TLK[:, 0, 0].tolist() == [0, 1, 2, 3, 0]
    src.write_text(lines[0] + "\n{\"request\": 1, \"layer\": 0, \"token_idx\": 9, \"experts\": [99, 1]}\n")
    assert main(["import", str(src), "--out", str(tmp_path / "imp2"), "--quiet", "--num-experts", "4"]) == 2


def test_place_compare_prices_builtin_fine_traces_as_deepseek_v2_lite():
    import numpy as np

    from routecast.place.compare_cli import profile_for as _profile_for
    from routecast.sim.models import load_model
    from routecast.trace import MoESpec, Trace, make_columns

    spec = MoESpec(num_layers=5, num_experts=64, top_k=6, n_group=8, topk_group=4, name="builtin-fine")
    t = Trace(spec=spec, tokens=make_columns(2), experts_TLK=np.tile(np.arange(6, dtype=np.int16), (2, 5, 1)),
              weights_TLK=np.full((2, 5, 6), 1 / 6, np.float32))
    m = _profile_for(t, load_model)
    assert m.name == "deepseek-v2-lite" and (m.num_experts, m.top_k) == (64, 6)
