"""The one output path: inputs never overwritten, links never followed, existing files kept without --overwrite,
temp-validate-rename, nothing deleted that the run did not create; and every writing command declares its outputs."""

from __future__ import annotations

import argparse
import ast
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.common import numbers as N
from routecast.common import outputs as O
from routecast.common.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2] / "routecast"


def _run(fn, **ns):
    a = argparse.Namespace(cmd="test", **ns)
    return fn(a)


def _writer(kind="file", inputs=("--trace",)):
    @O.writes("--out", inputs=inputs)
    def cmd(a):
        if kind == "file":
            O.write_atomic(O.check_out_file(a.out, "--out"), "new", "--out")
        else:
            d = O.check_out_dir(a.out, "--out", overwrite=a.overwrite)
            O.write_atomic(d / "x.json", "{}", "--out")
        return 0
    return cmd


@pytest.fixture
def tree(tmp_path):
    t = tmp_path / "trace"
    t.mkdir()
    (t / "trace.json").write_text("TRACE")
    (t / "shard-0.safetensors").write_text("SHARD")
    return tmp_path


@pytest.mark.parametrize("rel", ["trace/trace.json", "trace/shard-0.safetensors", "trace/new.json", "trace"])
def test_output_inside_or_equal_to_an_input_is_refused(tree, rel):
    with pytest.raises(ConfigError, match="the input --trace"):
        _run(_writer("file" if rel != "trace" else "dir"), out=str(tree / rel), trace=str(tree / "trace"),
             overwrite=True)
    assert (tree / "trace/trace.json").read_text() == "TRACE" and not (tree / "trace/new.json").exists()


def test_output_containing_an_input_is_refused(tree):
    with pytest.raises(ConfigError, match="contains the input"):
        _run(_writer("dir"), out=str(tree), trace=str(tree / "trace"), overwrite=True)


def test_input_reached_through_a_link_is_still_an_input(tree):
    (tree / "alias").symlink_to(tree / "trace")
    with pytest.raises(ConfigError, match="the input --trace"):
        _run(_writer(), out=str(tree / "alias" / "trace.json"), trace=str(tree / "trace"), overwrite=True)
    with pytest.raises(ConfigError, match="the input --trace"):
        _run(_writer(), out=str(tree / "trace" / "trace.json"), trace=str(tree / "alias"), overwrite=True)


def test_existing_file_needs_overwrite_and_a_link_is_never_followed(tree):
    out = tree / "o.json"
    out.write_text("old")
    with pytest.raises(ConfigError, match="exists; expected a new file"):
        _run(_writer(), out=str(out), trace=None, overwrite=False)
    assert out.read_text() == "old"
    _run(_writer(), out=str(out), trace=None, overwrite=True)
    assert out.read_text() == "new"
    target = tree / "target.txt"
    target.write_text("victim")
    (tree / "link.json").symlink_to(target)
    with pytest.raises(ConfigError, match="symbolic link"):
        _run(_writer(), out=str(tree / "link.json"), trace=None, overwrite=True)
    assert target.read_text() == "victim"


def test_validate_runs_before_the_rename(tree):
    out = tree / "o.json"
    out.write_text("good")

    def bad(tmp: Path) -> None:
        assert tmp.read_text() == "bad" and tmp != out
        raise ConfigError("refused")

    with pytest.raises(ConfigError, match="refused"):
        O.write_atomic(out, "bad", "--out", validate=bad)
    assert out.read_text() == "good" and sorted(p.name for p in tree.iterdir()) == ["o.json", "trace"]


def test_write_json_refuses_wrapped_counts_and_nan(tree):
    out = tree / "o.json"
    out.write_text("good")
    for bad in ({"count": 2**64}, {"x": [1.0, float("nan")]}, {"c": -(2**63) - 1}):
        with pytest.raises(ConfigError, match="nothing was written"):
            O.write_json(out, bad, "--out")
    assert out.read_text() == "good"
    O.write_json(out, {"count": 2**63 - 1}, "--out")
    assert json.loads(out.read_text()) == {"count": 2**63 - 1}


def test_two_outputs_naming_one_path_are_refused(tree):
    @O.writes("--out", "--plan")
    def cmd(a):
        O.check_out_file(a.out, "--out")
        O.check_out_file(a.plan, "--plan")
        return 0

    with pytest.raises(ConfigError, match="name the same place"):
        _run(cmd, out=str(tree / "x.json"), plan=str(tree / "." / "x.json"), overwrite=False)


def test_a_declared_output_written_around_the_helper_is_caught(tree):
    @O.writes("--out")
    def sneaky(a):
        Path(a.out).write_text("x")
        return 0

    with pytest.raises(RuntimeError, match="without being claimed"):
        _run(sneaky, out=str(tree / "s.json"), overwrite=False)

    @O.writes("--out")
    def unclaimed(a):
        O.check_out_file(a.out, "--out")
        O.write_atomic(tree / "elsewhere.json", "x", "--out")
        return 0

    with pytest.raises(RuntimeError, match="without claiming"):
        _run(unclaimed, out=str(tree / "s2.json"), overwrite=False)


def test_only_what_the_run_created_is_removed(tree):
    user = tree / ".out.partial"
    user.mkdir()
    (user / "mine").write_text("keep")
    d = O.scratch_dir(tree / "out", "--out")
    assert d != user and d.is_dir()
    O.remove_own(d)
    assert not d.exists() and (user / "mine").read_text() == "keep"
    with pytest.raises(RuntimeError, match="did not create"):
        O.remove_own(user)
    f = O.own_file(tree / "x.config.json", "--out")
    O.remove_own(f)
    (tree / "y.config.json").write_text("user")
    with pytest.raises(ConfigError, match="already exists"):
        O.own_file(tree / "y.config.json", "--out")
    assert (tree / "y.config.json").read_text() == "user"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "..", ".", "trace", "trace.json", "link"]), min_size=1, max_size=4),
       st.booleans())
def test_no_generated_path_reaches_an_input(tmp_path_factory, parts, overwrite):
    root = tmp_path_factory.mktemp("gen")
    (root / "trace").mkdir()
    (root / "trace" / "trace.json").write_text("TRACE")
    (root / "link").symlink_to(root / "trace")
    out = root.joinpath(*parts)
    try:
        _run(_writer(), out=str(out), trace=str(root / "trace"), overwrite=overwrite)
    except ConfigError:
        pass
    assert (root / "trace" / "trace.json").read_text() == "TRACE"
    assert sorted(p.name for p in (root / "trace").iterdir()) == ["trace.json"]


# ---------------------------------------------------------------- every writing command declares its outputs
# Flags that name a path the command reads, never writes (a test fails when a new flag looks like an output
# and is in neither the handler's declaration nor this list).
_WRITE_WORDS = ("output", "write", "json output", "folder for", "directory for")


def _commands():
    from routecast.cli import _FORWARDED, build_parser
    from routecast.models import corpus, train
    from routecast.place.export_cli import build_parser as export_parser
    from routecast.place.export_cli import run_export

    for cmd, p in N.walk(build_parser()):
        yield cmd, p, p._defaults.get("fn")
    yield "place export", export_parser(), run_export
    yield "train-builtin", train.build_parser(), _FORWARDED["train-builtin"]
    for cmd, p in N.walk(corpus.build_parser()):
        yield cmd, p, _FORWARDED["corpus"]


def _looks_like_output(act: argparse.Action) -> bool:
    h = (act.help or "").lower()
    return act.nargs != 0 and act.type is None and (
        act.dest in ("out", "plot", "write_profile", "sample_out") or any(w in h for w in _WRITE_WORDS))


def test_every_output_flag_of_every_subcommand_is_declared():
    missing, checked = [], 0
    for cmd, p, fn in _commands():
        outs = [a for a in p._actions if a.option_strings and _looks_like_output(a)]
        declared = set(getattr(fn, "routecast_writes", ()))
        inputs = set(getattr(fn, "routecast_inputs", ()))
        for a in outs:
            checked += 1
            if a.option_strings[-1] not in declared | inputs:
                missing.append(f"{cmd} {a.option_strings[-1]}")
        if declared and outs:
            assert any(a.option_strings == ["--overwrite"] for a in p._actions), f"{cmd} has no --overwrite"
    assert not missing, f"output flags not declared through routecast.common.outputs.writes: {missing}"
    assert checked >= 20, checked


# Modules allowed to write files directly, and why (each gets its path from a checked, claimed output or a
# scratch folder of its own). A new direct write anywhere else fails this test until it goes through outputs.
WRITERS_ALLOWED = {
    "common/outputs.py": "the shared path itself",
    "trace/io.py": "trace folders: temp shard, fsync, rename inside a folder check_out_dir claimed",
    "trace/shards.py": "shard files written by trace/io.py's writer",
    "trace/capture.py": "writes through trace/io.py into the claimed --out",
    "models/train.py": "checkpoint into a temp folder beside the claimed --out, swapped in whole",
    "models/corpus.py": "corpus build into the claimed --out",
    "schedule/permute.py": "checkpoint into a scratch_dir beside the claimed --out",
    "runtime/ep/worker.py": "rank results into the launcher's scratch folder",
    "runtime/ep/calibrate.py": "rank sweep into files the launcher created with own_file",
    "runtime/ep/launch.py": "rank configs into the launcher's scratch folder",
    "runtime/ep/ranks.py": "the ranks' stdout/stderr logs in a private temp folder, deleted when the ranks end",
    "runtime/ep/forward.py": "per-plan files inside the claimed --out folder",
    "report/results.py": "removes only docs/results pages it rendered whose benchmark JSON is gone",
    "runtime/ep/results.py": "per-plan files inside the claimed --out folder",
    "runtime/offload/tier.py": "the slow tier's expert file in a private temp folder",
    "runtime/offload/store.py": "the slow tier's expert file in a private temp folder",
    "report/html.py": "the report inside the claimed --out folder",
    "report/plots.py": "figures inside the claimed --out folder or a claimed --plot file",
    "report/placement.py": "figures inside the claimed --out folder",
    "predict/store.py": "predictor files inside the claimed --out folder",
    "demo.py": "the demo's files inside the claimed --out folder",
    "sim/calibrate.py": "the profile at the claimed --out (temp, rename)",
    "models/builtin.py": "the shipped checkpoint's cache",
    "models/tokenizer.py": "the tokenizer into train-builtin's temp checkpoint folder",
    "cache/stream.py": "Belady's next-use scratch file in a private temp folder, deleted after the replay",
    "trace/standard.py": "its lock file and its own standard traces under out/traces (made on first use)",
    "runtime/offload/geometry.py": "a synthetic production-geometry expert file in its own cache folder (temp, fsync, rename)",
}
_WRITE_CALLS = {"write_text", "write_bytes", "save_file", "savefig", "save_pretrained", "rmtree", "unlink"}


def _direct_writes(src: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in _WRITE_CALLS:
                found.append(f"{name} (line {node.lineno})")
            if name == "open" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                    and any(c in str(node.args[1].value) for c in "wax"):
                found.append(f"open(..., {node.args[1].value!r}) (line {node.lineno})")
    return found


def test_no_module_writes_around_the_shared_path():
    bad = {}
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        if rel in WRITERS_ALLOWED:
            continue
        hits = _direct_writes(f.read_text())
        if hits:
            bad[rel] = hits
    assert not bad, f"direct file writes outside routecast.common.outputs: {bad}"


def test_cli_refuses_output_onto_its_input(tmp_path, capsys):
    from routecast.cli import main
    from routecast.trace.io import write_trace
    from tests.conftest import build_small_trace

    t = write_trace(build_small_trace(num_requests=4, num_experts=8), tmp_path / "trace")
    before = {p.name: p.read_bytes() for p in t.iterdir()}
    for argv in (["cache", "replay", str(t), "--out", str(t / "trace.json"), "--overwrite", "--quiet"],
                 ["serve-sim", "--trace", str(t), "--out", str(t / "trace.json"), "--overwrite", "--quiet"],
                 ["schedule", "rebatch", str(t), "--out", str(t / "x.json"), "--quiet"],
                 ["schedule", "cocluster", str(t), "--ep", "2", "--out", str(tmp_path / "c.json"),
                  "--plan", str(t / "trace.json"), "--overwrite", "--quiet"],
                 ["schedule", "cocluster", str(t), "--ep", "2", "--out", str(tmp_path / "c.json"),
                  "--plan", str(tmp_path / "c.json"), "--quiet"],
                 ["stats", str(t), "--plot", str(t / "p.png")]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("input" in err[0] or "same place" in err[0]), err
    assert {p.name: p.read_bytes() for p in t.iterdir()} == before
    assert not os.path.exists(tmp_path / "c.json")


def test_a_declared_output_the_run_never_uses_is_one_sentence(tree):
    @O.writes("--out")
    def ignores(a):
        return 0

    with pytest.raises(ConfigError, match="writes nothing there"):
        _run(ignores, out=str(tree / "never.json"), overwrite=False)
    assert not (tree / "never.json").exists()


def test_a_folder_output_may_hold_its_own_parts(tree):
    @O.writes("--out")
    def demo_like(a):  # routecast demo claims --out, then its capture claims --out/trace.partial
        O.check_out_dir(a.out, "--out", overwrite=True)
        O.check_out_dir(Path(a.out) / "trace.partial", "--out", overwrite=True)
        return 0

    assert _run(demo_like, out=str(tree / "demo"), overwrite=True) == 0


def test_an_empty_path_flag_is_refused_before_the_handler_runs():
    import argparse

    from routecast.common.errors import ConfigError
    from routecast.common.outputs import writes

    ran = []

    @writes("--out", inputs=("--plan",))
    def handler(a):
        ran.append(a)
        return 0

    for ns, flag in ((argparse.Namespace(out="", plan=None), "--out"), (argparse.Namespace(out=None, plan=" "), "--plan")):
        with pytest.raises(ConfigError, match=f"^{flag} is empty; expected a path"):
            handler(ns)
    assert not ran


def test_a_nul_byte_in_any_argument_is_one_sentence(capsys):
    from routecast.cli import main

    assert main(["schedule", "cocluster", "t\0x", "--out", "o.json"]) == 2
    err = capsys.readouterr().err
    assert "argument 3" in err and "holds a NUL byte" in err and "Traceback" not in err
