"""Rows of the bad-input sweep for the classes issue 20 found (benchmarks/bad_input_sweep.py runs them).

  out inside input     --out / --plan / --plot naming the input trace's own files or the model's config
  symlink at out       --out is a symlink to a file the user keeps
  CRC-matching values  a shard's ids or weights changed and trace.json's CRC-32 updated to match
  giant numbers        400-digit budgets, 1e308, --seed -1, --threads 0 / 10**6, --requests 10**9, --nproc 64
  malformed files      co-clustering plans with bad fields, --token-ranks tables of the wrong shape or dtype,
                       a binary file named .json
Rows whose inputs are files routecast must never change list them in `frozen` (content compared after).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
from bad_input_fixtures import SENTINEL, SENTINEL_TEXT, Row  # a sibling script: benchmarks/ is sys.path[0]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fuzz.tamper: the repository root
from tests.fuzz.tamper import duplicate_first, set_value, tamper_shard  # noqa: E402

BIG = "9" * 400


def _frozen(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file())


def issue20_rows(ws: Path, fx: dict[str, Path]) -> list[Row]:
    """Rows for issue 20's classes; builds their fixtures (copies of the sweep's good trace and of builtin)."""
    o = ws / "rows" / "issue20"
    o.mkdir(parents=True)
    n = iter(range(10**6))

    def out(suffix: str = "") -> str:
        return str(o / f"out-{next(n)}{suffix}")

    def trace_copy(tag: str) -> Path:
        return Path(shutil.copytree(fx["trace_good"], o / f"trace-{tag}-{next(n)}"))

    rows: list[Row] = []
    cr = ["cache", "replay"]
    lru = ["--policies", "lru", "--quiet"]
    # ---- out inside the input (each row on its own copy: a row that destroys it spoils no other row)
    for cls, make in {
        "cache replay --out TRACE/trace.json": lambda t: [*cr, str(t), *lru, "--out", str(t / "trace.json")],
        "cache replay --out inside TRACE": lambda t: [*cr, str(t), *lru, "--out", str(t / "sub" / "r.json")],
        "schedule rebatch --out a shard": lambda t: ["schedule", "rebatch", str(t), "--quiet", "--out",
                                                     str(t / "routing-00000.safetensors")],
        "schedule cocluster --plan TRACE/trace.json": lambda t: ["schedule", "cocluster", str(t), "--ep", "2", "--quiet",
                                                                "--out", out(".json"), "--plan", str(t / "trace.json")],
        "schedule cocluster --out X --plan X": lambda t: ["schedule", "cocluster", str(t), "--ep", "2", "--quiet",
                                                          "--out", str(o / "same.json"), "--plan", str(o / "same.json")],
        "serve-sim --trace T --out T/trace.json": lambda t: ["serve-sim", "--requests", "20", "--quiet", "--trace",
                                                             str(t), "--out", str(t / "trace.json")],
        "stats --plot TRACE/tokens.parquet": lambda t: ["stats", str(t), "--plot", str(t / "tokens.parquet")],
        "predict fit --out TRACE": lambda t: ["predict", "fit", str(t), "--predictor", "distribution", "--out", str(t),
                                             "--overwrite"],
    }.items():
        t = trace_copy("in")
        rows.append(Row(cmd=cls.split(" -")[0], cls=f"out inside input: {cls}", argv=make(t), frozen=_frozen(t),
                        timeout=45))
    model = Path(shutil.copytree(fx["model_builtin"], o / "model-copy")) if "model_builtin" in fx else None
    if model is not None:
        rows.append(Row(cmd="run", cls="out inside input: run --out MODEL/config.json", frozen=_frozen(model), timeout=60,
                        argv=["run", "--model", str(model), "--prompts", str(fx["prompts_good"]), "--max-new-tokens", "2",
                              "--out", str(model / "config.json")]))
        rows.append(Row(cmd="permute-experts", cls="out inside input: permute-experts --out MODEL", frozen=_frozen(model),
                        argv=["permute-experts", "--model", str(model), "--plan", str(fx["plan_other"]), "--out",
                              str(model), "--overwrite"], timeout=45))
    # ---- a symlink at --out pointing at a file the user keeps
    for cmd, argv in {
        "schedule rebatch": ["schedule", "rebatch", str(fx["trace_good"]), "--quiet", "--out"],
        "cache replay": [*cr, str(fx["trace_good"]), *lru, "--out"],
        "serve-sim": ["serve-sim", "--requests", "20", "--quiet", "--out"],
    }.items():
        keep = o / f"{SENTINEL}-{next(n)}"
        keep.write_text(SENTINEL_TEXT)
        link = o / f"link-{next(n)}.json"
        link.symlink_to(keep)
        rows.append(Row(cmd=cmd, cls="symlink at --out", argv=[*argv, str(link)], sentinels=[keep], timeout=45))
    # ---- values changed with a CRC-32 that matches
    for kind, tensor, edit in (("expert id = E", "experts_TLK", set_value(0, 0, 0, 8)),
                               ("expert id 32767", "experts_TLK", set_value(1, 0, 0, 32767)),
                               ("expert id -7", "experts_TLK", set_value(0, 1, 1, -7)),
                               ("duplicate id in a top-k", "experts_TLK", duplicate_first(2, 0)),
                               ("NaN weight", "weights_TLK", set_value(0, 0, 0, float("nan")))):
        t = trace_copy("crc")
        tamper_shard(t, 0, tensor, edit)
        for cmd, argv in {"inspect": ["inspect", str(t)],
                          "cache replay": [*cr, str(t), *lru, "--out", out(".json")],
                          "serve-sim": ["serve-sim", "--requests", "20", "--quiet", "--trace", str(t), "--out",
                                        out(".json")],
                          "schedule cocluster": ["schedule", "cocluster", str(t), "--ep", "2", "--quiet", "--out",
                                                 out(".json")]}.items():
            rows.append(Row(cmd=cmd, cls=f"CRC-matching shard: {kind}", argv=argv, timeout=45))
    # ---- giant and degenerate numbers
    tr, cap = str(fx["trace_good"]), str(fx["cap_hidden"])
    run = ["run", "--model", "builtin", "--prompts", str(fx["prompts_good"]), "--max-new-tokens", "2"]
    ep = ["ep", "run", "--model", "builtin", "--trace", cap, "--steps", "1", "--repeats", "1", "--plans", "static"]
    for cmd, cls, argv in (
            ("cache replay", "--budget 400 digits", [*cr, tr, *lru, "--budget", BIG, "--out", out(".json")]),
            ("schedule rebatch", "--budget 400 digits", ["schedule", "rebatch", tr, "--quiet", "--budget", BIG,
                                                         "--out", out(".json")]),
            ("run", "--budget 400 digits", [*run, "--offload", "--budget", BIG]),
            ("cache replay", "--seed -1", [*cr, tr, *lru, "--seed", "-1", "--out", out(".json")]),
            ("schedule cocluster", "--seed -1", ["schedule", "cocluster", tr, "--ep", "2", "--quiet", "--seed", "-1",
                                                 "--out", out(".json")]),
            ("schedule rebatch", "--seed -1", ["schedule", "rebatch", tr, "--quiet", "--seed", "-1", "--out", out(".json")]),
            ("emoe", "--seed -1", ["emoe", "profile", "--model", "builtin", "--seed", "-1", "--out", out(".json")]),
            ("ep run", "--threads 0", [*ep, "--threads", "0", "--out", out()]),
            ("ep calibrate", "--threads 0", ["ep", "calibrate", "--threads", "0", "--out", out(".toml")]),
            ("cache replay", "--threads 1000000", [*cr, tr, *lru, "--threads", "1000000", "--out", out(".json")]),
            ("serve-sim", "--cv 1e308", ["serve-sim", "--requests", "20", "--arrival", "gamma", "--cv", "1e308",
                                         "--quiet", "--out", out(".json")]),
            ("serve-sim", "--requests 10**9", ["serve-sim", "--requests", str(10**9), "--quiet", "--out", out(".json")]),
            ("run", "--loader-threads 10000", [*run, "--offload", "--loader-threads", "10000"]),
            ("run", "--max-new-tokens 100000", ["run", "--model", "builtin", "--prompts", str(fx["prompts_good"]),
                                                "--max-new-tokens", "100000"]),
            ("place export", "--num-layers 2000000", ["place", "export", "static", "--trace", tr, "--ep", "2",
                                                      "--num-layers", "2000000", "--out", out(".json")]),
            ("place export", "--redundant 100000", ["place", "export", "eplb", "--trace", tr, "--ep", "2",
                                                    "--redundant", "100000", "--out", out(".json")]),
            ("ep run", "--nproc 64", [*ep, "--nproc", "64", "--out", out()]),
            ("serve-sim", "--rate 1e308", ["serve-sim", "--requests", "20", "--rate", "1e308", "--quiet", "--out",
                                           out(".json")]),
            ("cache replay", "--expert-bytes 400 digits", [*cr, tr, *lru, "--expert-bytes", BIG, "--out", out(".json")])):
        rows.append(Row(cmd=cmd, cls=f"number: {cls}", argv=argv, timeout=60, may_assume=cmd == "place export"))
    # ---- malformed plans, rank tables and binary JSON
    plan = json.loads(Path(fx["plan_other"]).read_text())
    for cls, change in {"token key 2**70": lambda p: p["token_keys_U"].__setitem__(0, 2**70),
                        "beta 'abc'": lambda p: p.update(beta="abc"), "fit_s 5": lambda p: p.update(fit_s=5),
                        "meta [1, 2]": lambda p: p.update(meta=[1, 2]),
                        "empty expert_group_LE": lambda p: p.update(expert_group_LE=[])}.items():
        bad = json.loads(json.dumps(plan))
        change(bad)
        f = o / f"plan-{next(n)}.json"
        f.write_text(json.dumps(bad))
        rows.append(Row(cmd="permute-experts", cls=f"plan: {cls}", timeout=45,
                        argv=["permute-experts", "--model", "builtin", "--plan", str(f), "--out", out()]))
        rows.append(Row(cmd="ep run", cls=f"--shuffle-plan: {cls}", timeout=60,
                        argv=[*ep, "--shuffle-plan", str(f), "--out", out()]))
    rows_n = int(json.loads((Path(cap) / "trace.json").read_text())["num_tokens"])
    for cls, arr in {"out of range": np.full(rows_n, 7), "short": np.zeros(max(1, rows_n // 2), np.int64),
                     "3-D": np.zeros((2, 2, 2), np.int64), "float ranks": np.full(rows_n, 0.5),
                     "object dtype": np.array([{"a": 1}] * 2, dtype=object)}.items():
        f = o / f"ranks-{next(n)}.npy"
        np.save(f, arr, allow_pickle=True)
        rows.append(Row(cmd="ep run", cls=f"--token-ranks {cls}", timeout=60,
                        argv=[*ep, "--token-ranks", str(f), "--out", out()]))
    notnpy = o / "ranks.txt"
    notnpy.write_text("0 1 0 1\n")
    rows.append(Row(cmd="ep run", cls="--token-ranks not .npy", argv=[*ep, "--token-ranks", str(notnpy), "--out", out()],
                    timeout=60))
    binary = o / "binary.json"
    binary.write_bytes(bytes(range(256)) * 8)
    rows.append(Row(cmd="place export", cls="binary .json plan", argv=["place", "export", str(binary), "--out",
                                                                        out(".json")]))
    rows.append(Row(cmd="permute-experts", cls="binary .json plan", argv=["permute-experts", "--model", "builtin",
                                                                           "--plan", str(binary), "--out", out()]))
    rows.append(Row(cmd="serve-sim", cls="binary .toml hardware", argv=["serve-sim", "--requests", "20", "--quiet",
                                                                         "--hardware", str(binary), "--out", out(".json")]))
    return rows
