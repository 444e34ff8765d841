"""The fuzzer's fixture tree: tiny inputs of every kind a command reads, good and broken, built once.

Everything lives under one root so the fuzzer can snapshot it (names, sizes, mtimes, content hashes)
before and after each case: nothing in it may change. Broken inputs are the mistakes issue 20 lists:
truncated, binary, wrong schema, valid JSON of the wrong shape, symlinks, folders, missing paths and a
trace whose shard values were changed with a matching CRC-32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np

from routecast.trace.io import write_trace
from tests.conftest import build_small_trace
from tests.fuzz.tamper import set_value, tamper_shard

KEEP = "KEEP-user-file.txt"


def build_fixtures(root: Path) -> dict[str, Path]:
    """Write the fixture tree under root -> name -> path (paths that must not exist are included)."""
    root.mkdir(parents=True, exist_ok=True)
    f: dict[str, Path] = {}
    # the built-in model's geometry (4 MoE layers, 8 experts, top-2, H 128), so model commands accept it
    tr = build_small_trace(num_requests=6, prompt_len=5, decode_len=4, num_layers=4, num_experts=8, logits=True,
                           hidden=128)
    tr = dataclasses.replace(tr, spec=dataclasses.replace(tr.spec, expert_bytes=393216))  # builtin's expert size
    f["trace"] = write_trace(tr, root / "trace", shard_tokens=20)  # 54 rows, 3 shards: the lazy path
    f["trace-small"] = write_trace(build_small_trace(num_requests=3, prompt_len=3, decode_len=2, num_experts=4),
                                   root / "trace-small")
    f["trace-tampered"] = Path(shutil.copytree(f["trace"], root / "trace-tampered"))
    tamper_shard(f["trace-tampered"], 1, "experts_TLK", set_value(2, 1, 0, 8))  # id 8 of 8 experts, CRC updated
    f["trace-json"] = f["trace"] / "trace.json"
    f["trace-shard"] = f["trace"] / "routing-00000.safetensors"
    f["trace-inside"] = f["trace"] / "new-output"
    f["missing"] = root / "no-such-file"
    f["missing-dir"] = root / "no-such-dir" / "x"
    f["folder"] = root / "empty-folder"
    f["folder"].mkdir()
    f["user-folder"] = root / "user-folder"
    f["user-folder"].mkdir()
    (f["user-folder"] / KEEP).write_text("a file the user wrote\n")
    f["user-file"] = f["user-folder"] / KEEP
    f["text"] = root / "notes.txt"
    f["text"].write_text("plain text, not any format routecast reads\n")
    f["binary"] = root / "binary.json"
    f["binary"].write_bytes(bytes(range(256)) * 4)
    f["empty"] = root / "empty.json"
    f["empty"].write_bytes(b"")
    f["truncated"] = root / "truncated.json"
    f["truncated"].write_text('{"layers": [[0, 1], [2')
    f["wrong-shape"] = root / "list.json"
    f["wrong-shape"].write_text("[1, 2, 3]")
    f["wrong-schema"] = root / "object.json"
    f["wrong-schema"].write_text(json.dumps({"beta": "abc", "meta": [1, 2], "fit_s": 5, "2361183241434822606848": 1}))
    f["huge-int-json"] = root / "huge.json"
    f["huge-int-json"].write_text(json.dumps({"num_layers": 10**400 // 10**390, "num_experts": -1, "top_k": 1.5}))
    f["spec"] = root / "spec.json"
    f["spec"].write_text(json.dumps({"num_layers": 3, "num_experts": 8, "top_k": 2}))
    f["log"] = root / "log.jsonl"
    f["log"].write_text("".join(json.dumps({"request": 0, "layer": layer, "position": p, "experts": [1, 2],
                                            "weights": [0.5, 0.5]}) + "\n" for p in range(3) for layer in range(3)))
    f["prompts"] = root / "prompts.jsonl"
    f["prompts"].write_text(json.dumps({"prompt": "The cat sat on the", "max_new_tokens": 2}) + "\n")
    f["ranks"] = root / "ranks.npy"
    np.save(f["ranks"], np.arange(tr.num_tokens) % 2)
    f["ranks-float"] = root / "ranks-float.npy"
    np.save(f["ranks-float"], (np.arange(tr.num_tokens) % 2) + 0.5)
    f["ranks-3d"] = root / "ranks-3d.npy"
    np.save(f["ranks-3d"], np.zeros((2, 2, 2), np.int64))
    f["ranks-object"] = root / "ranks-object.npy"
    np.save(f["ranks-object"], np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    f["toml"] = root / "hw.toml"
    src = Path(__file__).resolve().parents[2] / "routecast" / "sim" / "hardware" / "h100-sxm.toml"
    f["toml"].write_text(src.read_text())
    f["toml-broken"] = root / "broken.toml"
    f["toml-broken"].write_text("[gpu\nhbm_gbps = 'fast'\n")
    f["model-copy"] = Path(shutil.copytree(Path(__file__).resolve().parents[2] / "routecast" / "models" / "builtin",
                                           root / "model"))
    f["model-config"] = f["model-copy"] / "config.json"
    f["model-toml"] = root / "model.toml"
    f["model-toml"].write_text((src.parents[1] / "models" / "mixtral-8x7b.toml").read_text())
    f["plan"] = root / "plan.json"
    from routecast.cli import main

    scratch = root.parent / "fixture-scratch"
    argv = ["schedule", "cocluster", str(f["trace"]), "--ep", "2", "--in-sample", "--quiet", "--out",
            str(scratch / "c.json"), "--plan", str(f["plan"])]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, argv
    shutil.rmtree(scratch)
    plan = json.loads(f["plan"].read_text())
    f["plan-broken"] = root / "plan-broken.json"
    plan.update(beta="abc", meta=[1, 2], expert_group_LE=[])
    plan["token_keys_U"][0] = 2**70
    f["plan-broken"].write_text(json.dumps(plan))
    f["link-trace"] = root / "link-to-trace"
    os.symlink(f["trace"], f["link-trace"])
    f["link-file"] = root / "link-to-notes"
    os.symlink(f["text"], f["link-file"])
    f["link-dangling"] = root / "dangling-link"
    os.symlink(root / "nowhere", f["link-dangling"])
    return f


_HASHES: dict[tuple, str] = {}


def _hash(p: Path, st: os.stat_result) -> str:
    """blake2b of a file's content, recomputed only when its inode, size, mtime or ctime changed (any write
    changes ctime, which no user-level call can set back)."""
    key = (str(p), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _HASHES:
        _HASHES[key] = hashlib.blake2b(p.read_bytes()).hexdigest()
    return _HASHES[key]


def snapshot(root: Path) -> dict[str, tuple]:
    """relative path -> (kind, size, mtime_ns, blake2b of the content or the link target) of everything under
    root, symlinks not followed."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", 0, 0, os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", 0, 0, "")
            else:
                out[rel] = ("file", st.st_size, st.st_mtime_ns, _hash(p, st))
    return out


def diff(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """Sentences for what was created, changed or deleted between two snapshots."""
    out = [f"created {k}" for k in sorted(after.keys() - before.keys())]
    out += [f"deleted {k}" for k in sorted(before.keys() - after.keys())]
    out += [f"changed {k}" for k in sorted(before.keys() & after.keys()) if before[k] != after[k]]
    return out
