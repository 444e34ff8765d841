"""Bad input through every command: one row per class; each must end in one sentence and exit code 2
(or a stated assumption), never a traceback, a hang or a deleted user file.

benchmarks/bad_input_sweep.py runs the large version of this table (hundreds of inputs, in subprocesses).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from routecast.cli import main
from routecast.trace.io import read_trace, write_trace
from tests.conftest import build_small_trace

KEEP = "KEEP-user-file.txt"


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> dict[str, Path]:
    """A trace, a JSONL routing log, a prompts file and a regular file, shared by the rows (read-only)."""
    d = tmp_path_factory.mktemp("bad-input")
    f = {"trace": write_trace(build_small_trace(num_requests=6, num_experts=8), d / "trace"),
         "file": d / "a-file.txt", "log": d / "log.jsonl", "prompts": d / "prompts.jsonl"}
    f["file"].write_text("a regular file\n")
    f["log"].write_text("".join(json.dumps({"request": 0, "layer": layer, "position": p, "experts": [1, 2],
                                            "weights": [0.5, 0.5]}) + "\n" for p in range(3) for layer in range(2)))
    f["prompts"].write_text(json.dumps({"prompt": "The cat sat on the"}) + "\n")
    return f


def _writers(ws: dict[str, Path]) -> dict[str, list[str]]:
    """Every command that writes a directory, with {OUT} for the directory (inputs small, runs quick)."""
    return {
        "synth": ["synth", "--preset", "mixtral-8x7b", "--requests", "2", "--out", "{OUT}"],
        "import": ["import", str(ws["log"]), "--out", "{OUT}", "--quiet"],
        "capture": ["capture", "--prompts", str(ws["prompts"]), "--max-new-tokens", "2", "--out", "{OUT}", "--quiet"],
        "demo": ["demo", "--synthetic", "mixtral-8x7b", "--requests", "4", "--out", "{OUT}"],
        "train-builtin": ["train-builtin", "--tiny", "--steps", "1", "--out", "{OUT}"],
        "predict fit": ["predict", "fit", str(ws["trace"]), "--predictor", "distribution", "--out", "{OUT}"],
        "place compare": ["place", "compare", "--trace", str(ws["trace"]), "--out", "{OUT}"],
    }


def _sub(argv: list[str], out: Path | str) -> list[str]:
    return [str(out) if a == "{OUT}" else a for a in argv]


def _clean_error(capsys, argv: list[str], *expect: str) -> str:
    """Run argv: it must exit 2 with exactly one `routecast CMD: error: ...` line on stderr naming expect."""
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, f"{argv}: exit {rc}, stderr {err!r}"
    assert len(lines) == 1 and lines[0].startswith("routecast ") and ": error: " in lines[0], err
    for e in expect:
        assert e in lines[0], f"{e!r} not in {lines[0]!r}"
    return lines[0]


# ------------------------------------------------------------------------------------ data loss
@pytest.mark.parametrize("cmd", ["synth", "import", "capture", "demo", "train-builtin", "predict fit", "place compare"])
def test_non_empty_out_is_refused_without_overwrite(cmd, ws, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / KEEP).write_text("mine")
    _clean_error(capsys, _sub(_writers(ws)[cmd], out), str(out), "not empty", "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == [KEEP] and (out / KEEP).read_text() == "mine"


@pytest.mark.parametrize("cmd", ["synth", "import", "capture", "train-builtin"])
def test_overwrite_never_deletes_a_file_routecast_did_not_write(cmd, ws, tmp_path, capsys):
    # These commands replace the whole directory, so a foreign file there is refused, not deleted.
    out = tmp_path / "out"
    out.mkdir()
    (out / KEEP).write_text("mine")
    sibling = tmp_path / "out.old"  # train-builtin used to rmtree <out>.old
    sibling.mkdir()
    (sibling / KEEP).write_text("mine too")
    _clean_error(capsys, [*_sub(_writers(ws)[cmd], out), "--overwrite"], KEEP, "did not write")
    assert (out / KEEP).read_text() == "mine" and (sibling / KEEP).read_text() == "mine too"


@pytest.mark.parametrize("cmd", ["predict fit", "place compare"])
def test_overwrite_replaces_only_own_files(cmd, ws, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / KEEP).write_text("mine")
    assert main([*_sub(_writers(ws)[cmd], out), "--overwrite"]) == 0
    assert (out / KEEP).read_text() == "mine" and len(list(out.iterdir())) > 1


def test_synth_overwrite_replaces_its_own_trace(tmp_path):
    out = tmp_path / "t"
    argv = ["synth", "--preset", "mixtral-8x7b", "--requests", "2", "--out", str(out)]
    assert main(argv) == 0
    assert main([*argv, "--overwrite", "--seed", "1"]) == 0
    assert read_trace(out).num_tokens > 0


# ------------------------------------------------------------------------------------ output paths
@pytest.mark.parametrize("cmd", ["synth", "import", "capture", "demo", "train-builtin", "predict fit", "place compare",
                                 "stats --plot", "calibrate"])
@pytest.mark.parametrize("where", ["under a regular file", "unwritable place", "full-disk device"])
def test_output_path_errors(cmd, where, ws, tmp_path, capsys):
    if where == "under a regular file":
        out = ws["file"] / "out"
    elif where == "unwritable place":
        out = Path("/proc/routecast-test/out")  # read-only even for root
    else:
        out = tmp_path / "full"
        try:
            os.mknod(out, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # a private /dev/full: writes fail with ENOSPC
        except (OSError, AttributeError):
            pytest.skip("mknod is not permitted here")
    argv = {"stats --plot": ["stats", str(ws["trace"]), "--plot", "{OUT}"],
            "calibrate": ["calibrate", "--quick", "--out", "{OUT}"]}.get(cmd) or _writers(ws)[cmd]
    _clean_error(capsys, _sub(argv, out), str(out))
    if where == "full-disk device":
        assert stat.S_ISCHR(out.stat().st_mode)  # the node is still there, not replaced by a file or directory


@pytest.mark.parametrize("argv", [["stats", "{T}", "--plot", "{D}"], ["calibrate", "--quick", "--out", "{D}"]])
def test_file_output_naming_a_directory(argv, ws, tmp_path, capsys):
    d = tmp_path / "adir"
    d.mkdir()
    (d / KEEP).write_text("mine")
    argv = [str(ws["trace"]) if a == "{T}" else str(d) if a == "{D}" else a for a in argv]
    _clean_error(capsys, argv, "is a directory", "expected a file path")
    assert (d / KEEP).read_text() == "mine"


def test_files_follow_the_umask(ws, tmp_path):
    old = os.umask(0o022)
    try:
        assert main(["synth", "--preset", "mixtral-8x7b", "--requests", "2", "--out", str(tmp_path / "t")]) == 0
        assert main(["predict", "fit", str(ws["trace"]), "--predictor", "distribution", "--out",
                     str(tmp_path / "p")]) == 0
        from routecast.report.html import write_report

        write_report(tmp_path / "r.html", "t", [])
    finally:
        os.umask(old)
    files = [*(tmp_path / "t").iterdir(), *(tmp_path / "p").iterdir(), tmp_path / "r.html"]
    assert len(files) >= 6
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in files} == {f.name: "0o644" for f in files}


# ------------------------------------------------------------------------------------ model folders
def _model_dir(tmp_path: Path, kind: str) -> Path:
    from routecast.models.builtin import check_checkpoint

    d = tmp_path / f"m-{kind}"
    shutil.copytree(check_checkpoint(), d)
    if kind == "bad-config":
        (d / "config.json").write_text("{ not json")
    elif kind == "truncated":
        w = d / "model.safetensors"
        w.write_bytes(w.read_bytes()[:4096])
    elif kind == "pickle-only":
        (d / "model.safetensors").unlink()
        (d / "pytorch_model.bin").write_bytes(b"\x80\x04not a real pickle")
    elif kind == "auto-map":
        cfg = json.loads((d / "config.json").read_text())
        cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "evil.py").write_text(f"open({str(tmp_path / 'code-ran')!r}, 'w').write('ran')\n"
                                   "from transformers import MixtralConfig as EvilConfig\n")
    return d


@pytest.mark.parametrize("kind,expect", [("bad-config", "config.json: is not valid JSON"),
                                         ("truncated", "model.safetensors is damaged"),
                                         ("pickle-only", "only pickle weights (pytorch_model.bin)")])
def test_capture_refuses_bad_model_folders(kind, expect, ws, tmp_path, capsys):
    m = _model_dir(tmp_path, kind)
    _clean_error(capsys, ["capture", "--model", str(m), "--prompts", str(ws["prompts"]), "--out",
                          str(tmp_path / "o"), "--quiet"], expect)
    assert not (tmp_path / "o").exists()


def test_capture_refuses_a_dense_model(ws, tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    from routecast.models.builtin import check_checkpoint

    d = tmp_path / "dense"
    LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(check_checkpoint()) / f, d / f)
    _clean_error(capsys, ["capture", "--model", str(d), "--prompts", str(ws["prompts"]), "--out",
                          str(tmp_path / "o"), "--quiet"], "model")


def test_auto_map_custom_code_never_runs(ws, tmp_path, capsys):
    m = _model_dir(tmp_path, "auto-map")
    out = tmp_path / "o"
    rc = main(["capture", "--model", str(m), "--prompts", str(ws["prompts"]), "--max-new-tokens", "1", "--out",
               str(out), "--quiet"])
    assert rc in (0, 2) and not (tmp_path / "code-ran").exists()


def test_pickle_only_model_is_refused_before_torch_load(ws, tmp_path, capsys, monkeypatch):
    import torch

    def no_load(*a, **k):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", no_load)
    m = _model_dir(tmp_path, "pickle-only")
    # via --model, and via a trace whose provenance names the folder (as capture records it)
    _clean_error(capsys, ["predict", "eval", str(ws["trace"]), "--predictors", "ffn", "--epochs", "1", "--quiet",
                          "--model", str(m)], "only pickle weights")
    t = tmp_path / "t"
    shutil.copytree(ws["trace"], t)
    meta = json.loads((t / "trace.json").read_text())
    meta["provenance"]["model"] = str(m)
    (t / "trace.json").write_text(json.dumps(meta))
    _clean_error(capsys, ["predict", "eval", str(t), "--predictors", "ffn", "--epochs", "1", "--quiet"],
                 "provenance field 'model'", "only pickle weights")
    _clean_error(capsys, ["advise", "--moe-gps", "--model-profile", "mixtral-8x7b", "--hardware", "h100-sxm", "--gpus", "4",
                          "--trace", str(t), "--predictors", "distribution"], "only pickle weights")


# ------------------------------------------------------------------------------------ capture inputs
@pytest.mark.parametrize("prompts,expect", [("corpus:test:1000000", "more than the"), ("corpus:test:0", "at least 1"),
                                            ("corpus:nosuch", "names neither")])
def test_corpus_prompt_counts(prompts, expect, tmp_path, capsys):
    _clean_error(capsys, ["capture", "--prompts", prompts, "--out", str(tmp_path / "o"), "--quiet"], expect)


def test_prompt_longer_than_the_context_is_refused(tmp_path, capsys):
    p = tmp_path / "long.jsonl"
    p.write_text(json.dumps({"prompt": " ".join(["word"] * 3000)}) + "\n")
    _clean_error(capsys, ["capture", "--prompts", str(p), "--out", str(tmp_path / "o"), "--quiet"],
                 "max_position_embeddings", "request 0")


def test_device_cuda_without_a_gpu(ws, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    _clean_error(capsys, ["capture", "--device", "cuda", "--prompts", str(ws["prompts"]), "--out",
                          str(tmp_path / "o"), "--quiet"], "--device cuda", "no CUDA device")
    _clean_error(capsys, ["capture", "--device", "tpu", "--prompts", str(ws["prompts"]), "--out",
                          str(tmp_path / "o"), "--quiet"], "--device 'tpu'")


def test_max_new_tokens_is_honoured_for_corpus_prompts_and_resume_checks_arguments(ws, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["capture", "--prompts", "corpus:test:3", "--max-new-tokens", "3", "--out", str(out), "--quiet"]) == 0
    t = read_trace(out)
    decoded = [int(((t.request == r) & (t.phase == 1)).sum()) for r in range(3)]
    assert max(decoded) <= 3 - 1 and t.provenance["max_new_tokens"] == 3  # the last token is never fed back
    before = (out / "trace.json").read_text()
    # a different prompt set (or budget) into the same trace: refused, provenance untouched
    _clean_error(capsys, ["capture", "--prompts", str(ws["prompts"]), "--max-new-tokens", "3", "--out", str(out),
                          "--quiet"], "--prompts", "expected the same arguments to resume")
    _clean_error(capsys, ["capture", "--prompts", "corpus:test:3", "--max-new-tokens", "5", "--out", str(out),
                          "--quiet"], "--max-new-tokens")
    assert (out / "trace.json").read_text() == before
    assert main(["capture", "--prompts", "corpus:test:3", "--max-new-tokens", "3", "--out", str(out), "--quiet"]) == 0


# ------------------------------------------------------------------------------------ nonsense priced anyway
@pytest.mark.parametrize("argv,expect", [
    (["--gpus", "3"], "does not divide the 8 experts"),
    (["--gpus", "4", "--threads", "0"], "--threads is 0"),
    (["--gpus", "4", "--threads", "-2"], "--threads is -2"),
    (["--gpus", "4", "--seq", "0"], "--seq is 0"),
    (["--gpus", "4", "--link-gbps", "-3"], "--link-gbps is -3"),
    (["--gpus", "4", "--skewness", "nan"], "--skewness is nan"),
])
def test_advise_refuses_nonsense(argv, expect, capsys):
    _clean_error(capsys, ["advise", "--model-profile", "mixtral-8x7b", "--hardware", "h100-sxm", *argv], expect)


def test_advise_refuses_a_trace_of_another_expert_count(ws, capsys):
    _clean_error(capsys, ["advise", "--model-profile", "deepseek-v3", "--hardware", "h100-sxm", "--gpus", "8",
                          "--trace", str(ws["trace"]), "--predictors", "distribution", "--model", "none"],
                 "routes over 8 experts", "has 256")


def test_advise_states_the_capacity_assumption(tmp_path, capsys):
    import routecast.sim.hardware as hwmod

    src = Path(hwmod.__file__).parent / "hardware" / "h100-sxm.toml"
    tiny = tmp_path / "tiny.toml"
    tiny.write_text("\n".join("capacity_gb = 0.5" if ln.strip().startswith("capacity_gb") else ln
                              for ln in src.read_text().splitlines()) + "\n")
    assert main(["advise", "--model-profile", "mixtral-8x7b", "--hardware", str(tiny), "--gpus", "4"]) == 0
    assert "assumed: each GPU holds its 2 experts" in capsys.readouterr().out


@pytest.mark.parametrize("argv,expect", [
    (["place", "compare", "--trace", "{T}", "--threads", "0", "--out", "{O}"], "--threads is 0"),
    (["place", "compare", "--trace", "{T}", "--model-profile", "deepseek-v3", "--out", "{O}"], "has 256 experts"),
    (["predict", "eval", "{T}", "--threads", "-1"], "--threads is -1"),
    (["demo", "--requests", "0", "--out", "{O}"], "--requests is 0"),
    (["calibrate", "--threads", "0", "--out", "{O}"], "--threads is 0"),
])
def test_flags_out_of_range(argv, expect, ws, tmp_path, capsys):
    argv = [str(ws["trace"]) if a == "{T}" else str(tmp_path / "o") if a == "{O}" else a for a in argv]
    _clean_error(capsys, argv, expect)


# ------------------------------------------------------------------------------------ messages and resume
def test_messages_name_cli_flags_not_python(ws, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "routing-00000.safetensors").write_bytes(b"")
    (out / "_writer.json").write_text("{}")
    line = _clean_error(capsys, ["synth", "--preset", "mixtral-8x7b", "--requests", "2", "--out", str(out)],
                        "unfinished", "--overwrite")
    assert "overwrite=True" not in line and "TraceWriter(" not in line
    line = _clean_error(capsys, ["stats", str(out)], "never finished")
    assert "rerun the same" in line
    # and synth recovers from its own interrupted run with --overwrite (generation is seeded)
    shutil.rmtree(out)
    out.mkdir()
    (out / "_writer.json").write_text("{}")
    (out / "routing-00000.safetensors").write_bytes(b"")
    assert main(["synth", "--preset", "mixtral-8x7b", "--requests", "2", "--out", str(out), "--overwrite"]) == 0
    assert read_trace(out).num_tokens > 0
