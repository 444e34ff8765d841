"""Fixtures of the bad-input sweep (benchmarks/bad_input_sweep.py): broken traces, logs, specs, prompts and
model folders, built once in a work directory, each a mistake a user could make.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

SENTINEL = "KEEP-user-file.txt"
SENTINEL_TEXT = "a file the user wrote; routecast must not delete it\n"


@dataclass(kw_only=True)
class Row:
    """One command line. cls: the class of bad input; sentinels: files that must survive the run."""

    cmd: str
    cls: str
    argv: list[str]
    timeout: float = 0.0  # 0: the sweep's default
    sentinels: list[Path] = field(default_factory=list)
    valid: bool = False  # exit 0 is the right answer (e.g. --overwrite onto routecast's own output)
    may_assume: bool = False  # exit 0 is fine when the output states what was assumed
    marker: Path | None = None  # a file whose existence means custom model code ran
    frozen: list[Path] = field(default_factory=list)  # inputs whose content must be the same after the run


def _run_cli(args: list[str], env: dict[str, str], timeout: float = 300) -> None:
    r = subprocess.run([sys.executable, "-m", "routecast.cli", *args], env=env, capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"fixture command {args} failed ({r.returncode}): {r.stderr[-2000:]}")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _shard(d: Path) -> Path:
    return sorted(d.glob("routing-*.safetensors"))[0]


def _edit_json(f: Path, fn) -> None:
    d = json.loads(f.read_text())
    fn(d)
    f.write_text(json.dumps(d))


def build_traces(fx: Path, env: dict[str, str]) -> dict[str, Path]:
    """A good 8-expert trace and damaged copies of it (each a class of bad trace)."""
    good = fx / "good"
    _run_cli(["synth", "--preset", "mixtral-8x7b", "--requests", "3", "--out", str(good)], env)
    t: dict[str, Path] = {"good": good, "missing": fx / "no-such-trace", "empty_dir": fx / "empty-dir"}
    t["empty_dir"].mkdir()
    t["regular_file"] = fx / "a-file.txt"
    t["regular_file"].write_text("not a trace\n")

    def variant(name: str, fn) -> None:
        d = _copy(good, fx / f"trace-{name}")
        fn(d)
        t[name] = d

    variant("json_invalid", lambda d: (d / "trace.json").write_text("{"))
    variant("json_array", lambda d: (d / "trace.json").write_text("[1, 2]"))
    variant("json_missing", lambda d: (d / "trace.json").unlink())
    variant("json_binary", lambda d: (d / "trace.json").write_bytes(os.urandom(256)))
    variant("schema_version", lambda d: _edit_json(d / "trace.json", lambda m: m.update(schema_version=99)))
    variant("num_tokens_wrong", lambda d: _edit_json(d / "trace.json", lambda m: m.update(num_tokens=7)))
    variant("experts_1e12", lambda d: _edit_json(d / "trace.json", lambda m: m["spec"].update(num_experts=10**12)))
    variant("topk_0", lambda d: _edit_json(d / "trace.json", lambda m: m["spec"].update(top_k=0)))
    variant("layers_neg", lambda d: _edit_json(d / "trace.json", lambda m: m["spec"].update(num_layers=-1)))
    variant("layer_ids_dup", lambda d: _edit_json(
        d / "trace.json", lambda m: m["spec"].update(layer_ids=[0] * m["spec"]["num_layers"])))
    variant("layer_ids_float", lambda d: _edit_json(
        d / "trace.json", lambda m: m["spec"].update(layer_ids=[0.5] * m["spec"]["num_layers"])))
    variant("shard_missing", lambda d: _shard(d).unlink())

    def truncate(d: Path) -> None:
        s = _shard(d)
        s.write_bytes(s.read_bytes()[: s.stat().st_size // 2])

    variant("shard_truncated", truncate)

    def flip(d: Path) -> None:  # one bit inside the routing data, header untouched
        s = _shard(d)
        b = bytearray(s.read_bytes())
        n = int.from_bytes(b[:8], "little")
        i = 8 + n + (len(b) - 8 - n) // 3
        b[i] ^= 0x10
        s.write_bytes(bytes(b))

    variant("shard_bitflip", flip)
    variant("shard_zeroed", lambda d: _shard(d).write_bytes(b"\0" * _shard(d).stat().st_size))
    variant("tokens_missing", lambda d: (d / "tokens.parquet").unlink())
    variant("tokens_garbage", lambda d: (d / "tokens.parquet").write_bytes(b"PAR1" + os.urandom(200) + b"PAR1"))
    variant("extra_shard_gap", lambda d: shutil.copy(_shard(d), d / "routing-00007.safetensors"))
    return t


def _jsonl(f: Path, recs: list, gz: bool = False) -> Path:
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs)
    if gz:
        f.write_bytes(gzip.compress(text.encode()))
    else:
        f.write_text(text)
    return f


def build_logs(fx: Path) -> dict[str, Path]:
    """JSON-lines routing logs for `import`: one good, the rest one class of defect each."""
    def rec(p: int, layer: int, **kw) -> dict:
        return {"request": 0, "layer": layer, "position": p, "experts": [1, 2], "weights": [0.6, 0.4], **kw}

    good = [rec(p, layer) for p in range(4) for layer in range(2)]

    def bad(name: str, i: int, **kw) -> Path:
        recs = list(good)
        recs[i] = {**recs[i], **kw}
        return _jsonl(fx / f"log-{name}.jsonl", recs)

    logs = {"good": _jsonl(fx / "log-good.jsonl", good)}
    logs["id_65539"] = bad("id_65539", 3, experts=[65539, 1])
    logs["id_2e40"] = bad("id_2e40", 3, experts=[2**40, 1])
    logs["id_2e70"] = bad("id_2e70", 3, experts=[2**70, 1])
    logs["request_2e70"] = bad("request_2e70", 3, request=2**70)
    logs["position_2e70"] = bad("position_2e70", 3, position=2**70)
    logs["id_negative"] = bad("id_negative", 3, experts=[-7, 1])
    logs["id_float"] = bad("id_float", 3, experts=[1.5, 2])
    logs["dup_expert"] = bad("dup_expert", 3, experts=[2, 2])
    logs["weight_negative"] = bad("weight_negative", 3, weights=[-0.5, 0.4])
    logs["weight_nan"] = _jsonl(fx / "log-weight_nan.jsonl", [*map(json.dumps, good[:3]),
                                '{"request": 0, "layer": 1, "position": 1, "experts": [1, 2], "weights": [NaN, 0.4]}',
                                *map(json.dumps, good[4:])])
    logs["weight_inf"] = _jsonl(fx / "log-weight_inf.jsonl", [*map(json.dumps, good[:3]),
                                '{"request": 0, "layer": 1, "position": 1, "experts": [1, 2], "weights": [Infinity, 0]}',
                                *map(json.dumps, good[4:])])
    logs["request_negative"] = _jsonl(fx / "log-request_negative.jsonl",
                                      [{**r, "request": -3} for r in good])
    logs["position_negative"] = bad("position_negative", 2, position=-4)
    logs["step_negative"] = _jsonl(fx / "log-step_negative.jsonl", [{**r, "step": -1} for r in good])
    logs["steps_out_of_order"] = _jsonl(fx / "log-steps_order.jsonl",
                                        [{**r, "step": 10 - r["position"]} for r in good])
    logs["layer_negative"] = bad("layer_negative", 3, layer=-2)
    logs["missing_experts"] = _jsonl(fx / "log-missing_experts.jsonl", [{"request": 0, "layer": 0, "position": 0}])
    logs["experts_string"] = bad("experts_string", 3, experts="1,2")
    logs["not_json"] = _jsonl(fx / "log-not_json.jsonl", ["this is not json", "{"])
    logs["json_array_lines"] = _jsonl(fx / "log-array.jsonl", ["[1, 2, 3]"])
    logs["empty"] = _jsonl(fx / "log-empty.jsonl", [])
    logs["binary"] = fx / "log-binary.jsonl"
    logs["binary"].write_bytes(os.urandom(4096))
    logs["gz_good"] = _jsonl(fx / "log-good.jsonl.gz", good, gz=True)
    gz = logs["gz_good"].read_bytes()
    logs["gz_truncated"] = fx / "log-trunc.jsonl.gz"
    logs["gz_truncated"].write_bytes(gz[: len(gz) // 2])
    logs["gz_not_gzip"] = _jsonl(fx / "log-notgz.jsonl.gz", good)
    logs["gz_empty"] = fx / "log-empty.jsonl.gz"
    logs["gz_empty"].write_bytes(b"")
    logs["missing"] = fx / "no-such-log.jsonl"
    logs["directory"] = fx / "empty-dir"
    return logs


def build_specs(fx: Path) -> dict[str, Path]:
    base = {"num_layers": 2, "num_experts": 8, "top_k": 2}
    out = {}
    for name, d in {"dup_layer_ids": {**base, "layer_ids": [0, 0]}, "float_layer_ids": {**base, "layer_ids": [0.5, 1]},
                    "experts_1e12": {**base, "num_experts": 10**12}, "topk_gt_experts": {**base, "top_k": 9},
                    "negative_layers": {**base, "num_layers": -2}, "not_object": [1, 2]}.items():
        out[name] = fx / f"spec-{name}.json"
        out[name].write_text(json.dumps(d))
    out["not_json"] = fx / "spec-not_json.json"
    out["not_json"].write_text("{")
    return out


def build_prompts(fx: Path) -> dict[str, Path]:
    p = {"good": _jsonl(fx / "prompts-good.jsonl", [{"prompt": "The cat sat on the"}]),
         "good2": _jsonl(fx / "prompts-good2.jsonl", [{"prompt": "In the beginning"}, {"prompt": "def f(x):"}]),
         "not_json": _jsonl(fx / "prompts-bad.jsonl", ["{not json"]),
         "empty": _jsonl(fx / "prompts-empty.jsonl", []),
         "prompt_int": _jsonl(fx / "prompts-int.jsonl", [{"prompt": 5}]),
         "prompt_empty": _jsonl(fx / "prompts-emptystr.jsonl", [{"prompt": ""}]),
         "new_tokens_neg": _jsonl(fx / "prompts-neg.jsonl", [{"prompt": "hi", "max_new_tokens": -3}]),
         "dup_request": _jsonl(fx / "prompts-dup.jsonl", [{"prompt": "a", "request": 1}, {"prompt": "b", "request": 1}]),
         "too_long": _jsonl(fx / "prompts-long.jsonl", [{"prompt": " ".join(["word"] * 3000)}]),
         "missing": fx / "no-such-prompts.jsonl"}
    return p


def build_models(fx: Path, env: dict[str, str]) -> dict[str, Path]:
    """Model folders: bad config, truncated weights, a dense model, pickle-only weights, custom code."""
    code = r"""
import json, os, sys, shutil
from pathlib import Path
import torch
torch.manual_seed(0)
fx = Path(sys.argv[1])
from routecast.models.builtin import check_checkpoint
b = Path(check_checkpoint())
def clone(name):
    d = fx / name
    shutil.copytree(b, d)
    return d
(clone("m-badjson") / "config.json").write_text("{ not json")
d = clone("m-truncated"); w = d / "model.safetensors"; w.write_bytes(w.read_bytes()[: 4096])
d = clone("m-binonly"); (d / "model.safetensors").unlink()
torch.save({"x": torch.zeros(1)}, d / "pytorch_model.bin")
d = clone("m-automap"); c = json.loads((d / "config.json").read_text())
marker = fx / "automap-code-ran"
c["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
(d / "config.json").write_text(json.dumps(c))
(d / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nfrom transformers import MixtralConfig as EvilConfig\n")
d = clone("m-wrongtype"); c = json.loads((d / "config.json").read_text()); c["model_type"] = "no-such-arch"
(d / "config.json").write_text(json.dumps(c))
from transformers import LlamaConfig, LlamaForCausalLM
d = fx / "m-dense"
LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2)).save_pretrained(d)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(b / f, d / f)
"""
    r = subprocess.run([sys.executable, "-c", code, str(fx)], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"model fixtures failed: {r.stderr[-2000:]}")
    m = {k: fx / f"m-{k}" for k in ("badjson", "truncated", "binonly", "automap", "wrongtype", "dense")}
    m["missing"] = fx / "no-such-model"
    m["regular_file"] = fx / "a-file.txt"
    return m


def build_misc(fx: Path, env: dict[str, str], traces: dict[str, Path], models: dict[str, Path],
               prompts: dict[str, Path]) -> dict[str, Path]:
    """Saved predictors (good and damaged), hardware TOMLs, traces whose provenance names a model folder."""
    misc: dict[str, Path] = {}
    good_p = fx / "pred-good"
    _run_cli(["predict", "fit", str(traces["good"]), "--predictor", "conditional-token", "--out", str(good_p)], env)
    misc["pred_good"] = good_p
    code = r"""
import sys, numpy as np
from pathlib import Path
from safetensors.numpy import load_file, save_file
src, shape_dir, unsorted_dir = map(Path, sys.argv[1:4])
t = load_file(str(src / "predictor.safetensors"))
bad = {k: (v[..., :1] if v.ndim else v) if v.ndim and v.shape[-1] > 1 else np.zeros((3, 5), v.dtype) for k, v in t.items()}
save_file(bad, str(shape_dir / "predictor.safetensors"))
keys = [k for k, v in t.items() if v.ndim == 1 and v.dtype.kind in "iu" and v.size > 2]
if keys:
    u = dict(t); u[keys[0]] = v2 = t[keys[0]][::-1].copy(); save_file(u, str(unsorted_dir / "predictor.safetensors"))
"""
    for name in ("pred_shape", "pred_unsorted"):
        misc[name] = _copy(good_p, fx / name.replace("_", "-"))
    subprocess.run([sys.executable, "-c", code, str(good_p), str(misc["pred_shape"]), str(misc["pred_unsorted"])],
                   env=env, check=True, timeout=120)
    misc["pred_json_bad"] = _copy(good_p, fx / "pred-json-bad")
    (misc["pred_json_bad"] / "predictor.json").write_text("{")
    misc["pred_no_tensors"] = _copy(good_p, fx / "pred-no-tensors")
    (misc["pred_no_tensors"] / "predictor.safetensors").unlink()
    hw = Path(__import__("routecast.sim.hardware", fromlist=["x"]).__file__).parent / "hardware" / "h100-sxm.toml"
    text = hw.read_text() if hw.is_file() else ""
    misc["hw_tiny"] = fx / "hw-tiny.toml"
    misc["hw_tiny"].write_text("\n".join(("capacity_gb = 0.001" if ln.strip().startswith("capacity_gb") else ln)
                                         for ln in text.splitlines()) + "\n")
    misc["hw_bad"] = fx / "hw-bad.toml"
    misc["hw_bad"].write_text("[compute\npeak = ")
    for name, key, m in (("trace_prov_binonly", "model", models["binonly"]),
                         ("trace_prov_binonly_dir", "model_dir", models["binonly"])):
        d = _copy(traces["good"], fx / name.replace("_", "-"))
        _edit_json(d / "trace.json", lambda meta, key=key, m=m: meta["provenance"].update({key: str(m)}))
        misc[name] = d
    cap = fx / "cap-done"
    _run_cli(["capture", "--prompts", str(prompts["good"]), "--max-new-tokens", "2", "--out", str(cap), "--quiet"], env)
    misc["cap_done"] = cap
    return misc


def _can_mknod(fx: Path) -> Path | None:
    """A private full-disk device node (like /dev/full: writes fail with ENOSPC), or None without the right."""
    try:
        os.mknod(fx / "full", 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except OSError:
        return None
    return fx / "full"


