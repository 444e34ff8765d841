"""Bad-input sweep: hundreds of malformed inputs through every `routecast` command, each in a subprocess.

Every row is one command line (plus the files it needs, built once in a work directory) that a user
could type by mistake. A row's outcome is one of:
  clean      exit 2, stderr ends in one `routecast ...: error:` line, no traceback
  assumed    exit 0 and the output says what was assumed (rows that may be priced with a stated assumption)
  ok         exit 0 on a row whose input is valid (e.g. --overwrite onto a directory routecast wrote)
  traceback  'Traceback' in the output, or an exit code that is neither 0 nor 2 (1: inspect's old exit)
  hang       still running at the row's timeout (killed)
  data_loss  a sentinel file the row put beside or inside the output vanished or changed
  silent     exit 0 on input that should have been refused (no assumption stated)
  executed   a model folder's custom code (auto_map) ran
Prints the counts per outcome and per class, writes JSON (--json), and states the machine.

  PYTHONPATH=. python benchmarks/bad_input_sweep.py [--quick] [--jobs 2] [--timeout 20] [--json out/bad_input_sweep.json]
--quick (make bench) runs only the rows of issue 20's classes (bad_input_rows_issue20.py); the counts go to
out/bench/bad_input_sweep.json (common/bench.py) and every row to --json. Run it against another tree (e.g. main before a change) with PYTHONPATH pointing there.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from bad_input_fixtures import (  # a sibling script: benchmarks/ is sys.path[0]
    SENTINEL,
    SENTINEL_TEXT,
    Row,
    _can_mknod,
    build_logs,
    build_misc,
    build_models,
    build_prompts,
    build_specs,
    build_traces,
)
from bad_input_rows_issue20 import issue20_rows
from bad_input_rows_recent import build_recent, recent_rows

# ------------------------------------------------------------------------------------------ rows
WRITERS = {  # command -> (argv with {OUT}, output kind, extra flags that make it quick)
    "synth": (["synth", "--preset", "mixtral-8x7b", "--requests", "2", "--out", "{OUT}"], "dir"),
    "import": (["import", "{LOG}", "--out", "{OUT}", "--quiet"], "dir"),
    "capture": (["capture", "--prompts", "{PROMPTS}", "--max-new-tokens", "2", "--out", "{OUT}", "--quiet"], "dir"),
    "calibrate": (["calibrate", "--quick", "--out", "{OUT}"], "file"),
    "demo": (["demo", "--synthetic", "mixtral-8x7b", "--requests", "4", "--out", "{OUT}"], "dir"),
    "train-builtin": (["train-builtin", "--tiny", "--steps", "1", "--out", "{OUT}"], "dir"),
    "predict fit": (["predict", "fit", "{TRACE}", "--predictor", "distribution", "--out", "{OUT}"], "dir"),
    "place compare": (["place", "compare", "--trace", "{TRACE}", "--out", "{OUT}"], "dir"),
    "stats --plot": (["stats", "{TRACE}", "--plot", "{OUT}"], "file"),
}
SLOW = {"demo": 150.0, "train-builtin": 90.0, "calibrate": 60.0, "capture": 45.0, "place compare": 45.0}


def writer_rows(ws: Path, fx: dict[str, Path]) -> list[Row]:
    rows: list[Row] = []
    regular = ws / "fx" / "a-file.txt"
    for cmd, (tmpl, kind) in WRITERS.items():
        def argv(out: Path | str, extra: tuple[str, ...] = (), tmpl=tmpl) -> list[str]:
            sub = {"{LOG}": str(fx["log_good"]), "{PROMPTS}": str(fx["prompts_good"]), "{TRACE}": str(fx["trace_good"])}
            return [str(out) if a == "{OUT}" else sub.get(a, a) for a in tmpl] + list(extra)

        t = SLOW.get(cmd, 0.0)
        slug = cmd.replace(" --", "-").replace(" ", "-")
        base = ws / "rows" / slug
        base.mkdir(parents=True)
        rows.append(Row(cmd=cmd, cls="out under a regular file", argv=argv(regular / "out"), timeout=t))
        rows.append(Row(cmd=cmd, cls="out in an unwritable place", argv=argv("/proc/routecast-sweep/out"), timeout=t))
        if fx.get("full") is not None:  # a private copy of /dev/full: old code replaced the node it was given
            node = base / "full"
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
            rows.append(Row(cmd=cmd, cls="out on a full disk (a /dev/full node)", argv=argv(node), timeout=t))
        if kind == "dir":
            f = base / "out-is-a-file"
            f.write_text(SENTINEL_TEXT)
            rows.append(Row(cmd=cmd, cls="--out names a regular file", argv=argv(f), timeout=t, sentinels=[f]))
            for ov in (False, True):
                d = base / f"nonempty{'-ov' if ov else ''}"
                d.mkdir()
                (d / SENTINEL).write_text(SENTINEL_TEXT)
                sib = d.with_name(d.name + ".old")
                sib.mkdir()
                (sib / SENTINEL).write_text(SENTINEL_TEXT)
                # With --overwrite, exit 0 is right as long as the user's files survive (data_loss is checked first).
                rows.append(Row(cmd=cmd, cls="non-empty out" + (" + --overwrite" if ov else ""),
                                argv=argv(d, ("--overwrite",) if ov else ()), timeout=t, valid=ov,
                                sentinels=[d / SENTINEL, sib / SENTINEL]))
        else:
            d = base / "a-directory"
            d.mkdir()
            (d / SENTINEL).write_text(SENTINEL_TEXT)
            rows.append(Row(cmd=cmd, cls="file output names a directory", argv=argv(d), timeout=t,
                            sentinels=[d / SENTINEL]))
    return rows


TRACE_READERS = {
    "stats": ["stats", "{T}"],
    "inspect": ["inspect", "{T}"],
    "predict eval": ["predict", "eval", "{T}", "--predictors", "distribution,conditional-token", "--quiet"],
    "predict fit": ["predict", "fit", "{T}", "--predictor", "distribution", "--out", "{OUT}"],
    "place compare": ["place", "compare", "--trace", "{T}", "--out", "{OUT}"],
    "advise": ["advise", "--model-profile", "mixtral-8x7b", "--hardware", "h100-sxm", "--gpus", "4", "--trace", "{T}",
               "--predictors", "distribution", "--model", "none"],
}


def trace_rows(ws: Path, traces: dict[str, Path]) -> list[Row]:
    rows = []
    for cmd, tmpl in TRACE_READERS.items():
        for name, path in traces.items():
            if name == "good":
                continue
            out = ws / "rows" / "readers" / f"{cmd.replace(' ', '-')}-{name}"
            argv = [str(path) if a == "{T}" else str(out) if a == "{OUT}" else a for a in tmpl]
            rows.append(Row(cmd=cmd, cls=f"trace: {name.replace('_', ' ')}", argv=argv))
    return rows


def _flag_rows(cmd: str, base: list[str], cases: dict[str, list[str]], **kw) -> list[Row]:
    return [Row(cmd=cmd, cls=cls, argv=base + extra, **kw) for cls, extra in cases.items()]


def input_rows(ws: Path, fx: dict[str, Path], logs: dict[str, Path], specs: dict[str, Path],
               prompts: dict[str, Path], models: dict[str, Path]) -> list[Row]:
    rows: list[Row] = []
    o = ws / "rows" / "inputs"
    o.mkdir(parents=True)
    n = iter(range(10**6))

    def out() -> str:
        return str(o / f"out-{next(n)}")

    trace = str(fx["trace_good"])
    # import: every malformed log, bad flags and bad --spec files
    for name, p in logs.items():
        if name in ("good", "gz_good"):
            continue
        rows.append(Row(cmd="import", cls=f"log: {name.replace('_', ' ')}", argv=["import", str(p), "--out", out(), "--quiet"],
                        may_assume=name == "gz_not_gzip"))  # plain JSON lines named .gz: read, and the note says so
    for cls, extra in {"--num-experts 0": ["--num-experts", "0"], "--num-experts -1": ["--num-experts", "-1"],
                       "--num-experts 1e12": ["--num-experts", str(10**12)], "--num-experts below max id": ["--num-experts", "2"],
                       "--top-k 0": ["--top-k", "0"], "--top-k 1 below data": ["--top-k", "1"],
                       "--window 0": ["--window", "0"], "--shard-tokens 0": ["--shard-tokens", "0"],
                       "--shard-tokens -5": ["--shard-tokens", "-5"], "--map without =": ["--map", "experts"],
                       "--map unknown target": ["--map", "experts=nonsense"], "--spec missing file": ["--spec", "/nonexistent.json"]
                       }.items():
        rows.append(Row(cmd="import", cls=cls, argv=["import", str(logs["good"]), "--out", out(), "--quiet", *extra]))
    for name, p in specs.items():
        rows.append(Row(cmd="import", cls=f"--spec {name.replace('_', ' ')}",
                        argv=["import", str(logs["good"]), "--out", out(), "--quiet", "--spec", str(p)]))
    # import --overwrite onto a directory that is not a trace
    d = o / "import-not-a-trace"
    d.mkdir()
    (d / SENTINEL).write_text(SENTINEL_TEXT)
    rows.append(Row(cmd="import", cls="--overwrite onto a non-trace directory",
                    argv=["import", str(logs["good"]), "--out", str(d), "--quiet", "--overwrite"], sentinels=[d / SENTINEL]))

    # synth
    base = ["synth", "--preset", "mixtral-8x7b"]
    for cls, extra in {"--preset unknown": ["--preset", "nope", "--requests", "2"], "--requests 0": ["--requests", "0"],
                       "--requests -1": ["--requests", "-1"], "--tokens 0": ["--tokens", "0"], "--tokens -5": ["--tokens", "-5"],
                       "--set unknown knob": ["--requests", "2", "--set", "nonsense=3"],
                       "--set bad value": ["--requests", "2", "--set", "num_experts=abc"],
                       "--set without =": ["--requests", "2", "--set", "num_experts"],
                       "--set num_experts 0": ["--requests", "2", "--set", "num_experts=0"],
                       "--set top_k above experts": ["--requests", "2", "--set", "top_k=99"],
                       "--set nan": ["--requests", "2", "--set", "drift_sigma=nan"],
                       "no --out": ["--requests", "2"]}.items():
        argv = base + extra + ([] if cls == "no --out" else ["--out", out()])
        if cls == "--preset unknown":
            argv = ["synth", *extra, "--out", out()]
        rows.append(Row(cmd="synth", cls=cls, argv=argv))
    # stats flags
    for cls, extra in {"--ep 0": ["--ep", "0"], "--ep -2": ["--ep", "-2"], "--ep 3 (does not divide 8)": ["--ep", "3"],
                       "--ep 1e6": ["--ep", "1000000"], "--window 0": ["--window", "0"], "--window -3": ["--window", "-3"],
                       "--seq-len 0": ["--seq-len", "0"], "--seq-len -5": ["--seq-len", "-5"]}.items():
        rows.append(Row(cmd="stats", cls=cls, argv=["stats", trace, *extra], may_assume=True))
    # capture: prompts, models, flags, resume
    cap = ["capture", "--max-new-tokens", "2", "--quiet"]
    for name, p in prompts.items():
        if name in ("good", "good2"):
            continue
        rows.append(Row(cmd="capture", cls=f"prompts: {name.replace('_', ' ')}", timeout=45,
                        argv=[*cap, "--prompts", str(p), "--out", out()]))
    for cls, spec in {"corpus:test:1000000": "corpus:test:1000000", "corpus:nosuch": "corpus:nosuch",
                      "corpus:test:abc": "corpus:test:abc", "corpus:test:0": "corpus:test:0",
                      "corpus:test:-3": "corpus:test:-3", "corpus:": "corpus:"}.items():
        rows.append(Row(cmd="capture", cls=f"prompts {cls}", timeout=45, argv=[*cap, "--prompts", spec, "--out", out()]))
    for name, m in models.items():
        marker = ws / "fx" / "automap-code-ran" if name == "automap" else None
        # auto_map: loading the known model_type natively is right, as long as the custom code never runs
        rows.append(Row(cmd="capture", cls=f"model: {name.replace('_', ' ')}", timeout=45, marker=marker,
                        valid=name == "automap",
                        argv=[*cap, "--model", str(m), "--prompts", str(prompts["good"]), "--out", out()]))
    for cls, extra in {"--max-new-tokens -1": ["--max-new-tokens", "-1"], "--batch-size 0": ["--batch-size", "0"],
                       "--batch-size -4": ["--batch-size", "-4"], "--threads 0": ["--threads", "0"],
                       "--threads -1": ["--threads", "-1"], "--device bogus": ["--device", "tpu"],
                       "--device cuda without a GPU": ["--device", "cuda"]}.items():
        rows.append(Row(cmd="capture", cls=cls, timeout=45,
                        argv=[*cap, "--prompts", str(prompts["good"]), "--out", out(), *extra]))
    rows.append(Row(cmd="capture", cls="resume with different --prompts", timeout=45,
                    argv=[*cap, "--prompts", str(prompts["good2"]), "--out", str(fx["cap_done"])]))
    rows.append(Row(cmd="capture", cls="resume with different --max-new-tokens", timeout=45,
                    argv=["capture", "--max-new-tokens", "5", "--quiet", "--prompts", str(prompts["good"]),
                          "--out", str(fx["cap_done"])]))
    # predict eval / fit
    for cls, extra in {"--predictors unknown": ["--predictors", "nope"], "--predictors empty": ["--predictors", ""],
                       "--train-fraction 0": ["--train-fraction", "0"], "--train-fraction 1.5": ["--train-fraction", "1.5"],
                       "--train-fraction -1": ["--train-fraction", "-1"], "--train-fraction nan": ["--train-fraction", "nan"],
                       "--epochs 0": ["--predictors", "ffn", "--epochs", "0"], "--epochs -2": ["--predictors", "ffn", "--epochs", "-2"],
                       "--threads 0": ["--threads", "0"], "--threads -3": ["--threads", "-3"],
                       "saved predictor: bad JSON": ["--predictors", str(fx["pred_json_bad"])],
                       "saved predictor: tensors missing": ["--predictors", str(fx["pred_no_tensors"])],
                       "saved predictor: wrong tensor shapes": ["--predictors", str(fx["pred_shape"])],
                       "saved predictor: unsorted lookup keys": ["--predictors", str(fx["pred_unsorted"])],
                       "--model pickle-only folder": ["--predictors", "ffn", "--epochs", "1", "--model", str(models["binonly"])],
                       "--model missing": ["--predictors", "ffn", "--model", str(models["missing"])],
                       "--model truncated safetensors": ["--predictors", "ffn", "--epochs", "1", "--model", str(models["truncated"])],
                       }.items():
        rows.append(Row(cmd="predict eval", cls=cls, timeout=45,
                        argv=["predict", "eval", trace, "--quiet", *(["--predictors", "distribution"] if "--predictors" not in extra else []), *extra]))
    for t in ("trace_prov_binonly", "trace_prov_binonly_dir"):
        rows.append(Row(cmd="predict eval", cls=f"provenance names a pickle-only folder ({t[-3:]})", timeout=45,
                        argv=["predict", "eval", str(fx[t]), "--quiet", "--predictors", "ffn", "--epochs", "1"]))
        # the advisor prices with --model-profile and never loads the provenance's model: exit 0 is right, so
        # long as no pickle ran (the marker) and the folder is untouched
        rows.append(Row(cmd="advise", cls=f"provenance names a pickle-only folder ({t[-3:]})", timeout=45, valid=True,
                        argv=["advise", "--model-profile", "mixtral-8x7b", "--hardware", "h100-sxm", "--gpus", "4",
                              "--trace", str(fx[t]), "--predictors", "distribution"]))
    for cls, extra in {"--predictor unknown": ["--predictor", "nope", "--out", out()], "no --out": ["--predictor", "ffn"],
                       "no --predictor": ["--out", out()], "--epochs 0": ["--predictor", "ffn", "--epochs", "0", "--out", out()],
                       "--threads 0": ["--predictor", "distribution", "--threads", "0", "--out", out()]}.items():
        rows.append(Row(cmd="predict fit", cls=cls, argv=["predict", "fit", trace, *extra]))
    # advise: nonsense that must be refused or priced with its assumption printed
    adv = ["advise", "--model-profile", "mixtral-8x7b", "--hardware", "h100-sxm"]
    for cls, extra in {"--gpus 0": ["--gpus", "0"], "--gpus -1": ["--gpus", "-1"],
                       "8 experts on --gpus 3": ["--gpus", "3"], "--gpus 1000": ["--gpus", "1000"],
                       "--model-profile unknown": ["--gpus", "4", "--model-profile", "nope"],
                       "--hardware unknown": ["--gpus", "4", "--hardware", "nope"],
                       "--hardware bad TOML": ["--gpus", "4", "--hardware", str(fx["hw_bad"])],
                       "--hardware capacity cannot hold the experts": ["--gpus", "4", "--hardware", str(fx["hw_tiny"])],
                       "--threads 0": ["--gpus", "4", "--threads", "0"], "--threads -2": ["--gpus", "4", "--threads", "-2"],
                       "--seq 0": ["--gpus", "4", "--seq", "0"], "--seq -5": ["--gpus", "4", "--seq", "-5"],
                       "--batch 0": ["--gpus", "4", "--batch", "0"], "--skewness -1": ["--gpus", "4", "--skewness", "-1"],
                       "--skewness nan": ["--gpus", "4", "--skewness", "nan"], "--skewness 0.5": ["--gpus", "4", "--skewness", "0.5"],
                       "--link-gbps 0": ["--gpus", "4", "--link-gbps", "0"], "--link-gbps -3": ["--gpus", "4", "--link-gbps", "-3"],
                       "--link-gbps inf": ["--gpus", "4", "--link-gbps", "inf"],
                       "--epochs 0": ["--gpus", "4", "--trace", trace, "--predictors", "ffn", "--epochs", "0", "--model", "none"],
                       "--model pickle-only folder": ["--gpus", "4", "--trace", trace, "--predictors", "distribution",
                                                      "--model", str(models["binonly"])],
                       "--model-profile 256 experts, 8-expert trace": ["--gpus", "4", "--model-profile", "deepseek-v3",
                                                                       "--trace", trace, "--predictors", "distribution", "--model", "none"],
                       }.items():
        argv = adv + extra
        if "--model-profile" in extra:  # the later flag wins in argparse; keep only the row's
            argv = ["advise", "--hardware", "h100-sxm", *extra] if "--hardware" not in extra else ["advise", *extra]
        if "--hardware" in extra and "--model-profile" not in extra:
            argv = ["advise", "--model-profile", "mixtral-8x7b", *extra]
        rows.append(Row(cmd="advise", cls=cls, argv=argv, timeout=45, may_assume=True))
    # place compare
    pc = ["place", "compare", "--trace", trace]
    for cls, extra in {"--ep 0": ["--ep", "0"], "--ep -1": ["--ep", "-1"], "--ep 3 (8 experts)": ["--ep", "3"],
                       "--ep 64 (more ranks than experts)": ["--ep", "64"], "--hardware unknown": ["--hardware", "nope"],
                       "--hardware bad TOML": ["--hardware", str(fx["hw_bad"])],
                       "--hardware capacity cannot hold the experts": ["--hardware", str(fx["hw_tiny"])],
                       "--model-profile unknown": ["--model-profile", "nope"],
                       "--model-profile 256 experts, 8-expert trace": ["--model-profile", "deepseek-v3"],
                       "--shift-step beyond the trace": ["--shift-step", "100000000"],
                       "--threads 0": ["--threads", "0"], "--threads -1": ["--threads", "-1"]}.items():
        rows.append(Row(cmd="place compare", cls=cls, argv=[*pc, *extra, "--out", out()], may_assume=True))
    # calibrate, demo, train-builtin, corpus, inspect flags
    for cls, extra in {"--device bogus": ["--device", "tpu"], "--device cuda without a GPU": ["--device", "cuda"],
                       "--device cuda:99": ["--device", "cuda:99"], "--threads 0": ["--threads", "0"],
                       "--threads -1": ["--threads", "-1"]}.items():
        rows.append(Row(cmd="calibrate", cls=cls, argv=["calibrate", "--quick", "--out", out() + ".toml", *extra], timeout=60))
    for cls, extra in {"--synthetic unknown": ["--synthetic", "nope"], "--requests 0": ["--synthetic", "mixtral-8x7b", "--requests", "0"],
                       "--requests -1": ["--synthetic", "mixtral-8x7b", "--requests", "-1"],
                       "--threads 0": ["--synthetic", "mixtral-8x7b", "--requests", "4", "--threads", "0"],
                       "--threads -1": ["--synthetic", "mixtral-8x7b", "--requests", "4", "--threads", "-1"]}.items():
        rows.append(Row(cmd="demo", cls=cls, argv=["demo", "--out", out(), *extra], timeout=150))
    for cls, extra in {"--minutes -1": ["--minutes", "-1"], "--steps 0": ["--steps", "0"], "--steps -5": ["--steps", "-5"],
                       "--corpus missing": ["--corpus", str(ws / "no-corpus"), "--steps", "1"],
                       "--corpus a file": ["--corpus", str(ws / "fx" / "a-file.txt"), "--steps", "1"],
                       "--corpus empty dir": ["--corpus", str(ws / "fx" / "empty-dir"), "--steps", "1"],
                       "--threads 0": ["--threads", "0", "--steps", "1"], "no --out": []}.items():
        argv = ["train-builtin", "--tiny", *extra] + ([] if cls == "no --out" else ["--out", out()])
        rows.append(Row(cmd="train-builtin", cls=cls, argv=argv, timeout=90))
    for cls, extra in {"sources missing": ["--out", out(), "--gensim-wheel", "/nonexistent.whl",
                                           "--code-dir", "/nonexistent", "--docs-dir", "/nonexistent"],
                       "no subcommand": []}.items():
        rows.append(Row(cmd="corpus", cls=cls, argv=["corpus", *(["build"] if extra else []), *extra]))
    return rows


# ------------------------------------------------------------------------------------------ running
def _digest(p: Path) -> str | None:
    try:
        return hashlib.blake2b(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
    except OSError:
        return None


def classify(row: Row, rc: int | None, out: str, err: str, before: dict[Path, str | None] | None = None) -> str:
    lost = [s for s in row.sentinels if not s.is_file() or s.read_text() != SENTINEL_TEXT]
    lost += [p for p, h in (before or {}).items() if _digest(p) != h]
    if lost:
        return "data_loss"
    if row.marker is not None and row.marker.exists():
        return "executed"
    if rc is None:
        return "hang"
    if "Traceback (most recent call last)" in out + err:
        return "traceback"
    if rc == 2:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        return "clean" if lines and "error" in lines[-1] else "traceback"
    if rc == 0:
        if row.valid:
            return "ok"
        if row.may_assume and "assum" in (out + err).lower():
            return "assumed"
        return "silent"
    return "traceback"  # exit 1, a signal, a crash: not the promised one-sentence exit 2


def run_row(row: Row, env: dict[str, str], timeout: float, cwd: Path) -> dict:
    t0 = time.perf_counter()
    before = {p: _digest(p) for p in row.frozen}
    try:
        r = subprocess.run([sys.executable, "-m", "routecast.cli", *row.argv], env=env, cwd=cwd, capture_output=True,
                           text=True, timeout=row.timeout or timeout, errors="replace")
        rc, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, str(e.stdout or ""), str(e.stderr or "")
    outcome = classify(row, rc, out, err, before)
    tail = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or [""]
    return {"cmd": row.cmd, "class": row.cls, "argv": row.argv, "rc": rc, "outcome": outcome,
            "seconds": round(time.perf_counter() - t0, 2), "stderr_last": tail[0][:300]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="rows run at once (default 2)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per row unless the row says more (default 20)")
    ap.add_argument("--json", default="out/bad_input_sweep.json", help="where to write every row's outcome")
    ap.add_argument("--work", default=None, help="work directory (default: a temp dir, removed at the end)")
    ap.add_argument("--timeout-scale", type=float, default=1.0,
                    help="multiply every row's timeout (a loaded machine: imports alone take tens of seconds)")
    ap.add_argument("--issue20", action="store_true", help="run only the rows of issue 20's classes "
                    "(bad_input_rows_issue20.py)")
    ap.add_argument("--only", default=None, help="run only rows whose command contains one of these comma-separated strings")
    ap.add_argument("--quick", action="store_true", help="only issue 20's rows, as --issue20 (make bench)")
    a = ap.parse_args()
    a.issue20 = a.issue20 or a.quick
    from routecast.common.machine import machine_info

    ws = Path(a.work or tempfile.mkdtemp(prefix="routecast-sweep-"))
    if a.work is not None and ws.exists():
        shutil.rmtree(ws)  # the sweep's own scratch directory from an earlier run
    fxd = ws / "fx"
    fxd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    try:
        traces = build_traces(fxd, env)
        logs, specs, prompts = build_logs(fxd), build_specs(fxd), build_prompts(fxd)
        models = build_models(fxd, env)
        misc = build_misc(fxd, env, traces, models, prompts)
        misc.update(build_recent(fxd, env, traces["good"], prompts["good"]))
        fx = {"trace_good": traces["good"], "log_good": logs["good"], "prompts_good": prompts["good"], **misc,
              "full": _can_mknod(fxd)}
        rows = writer_rows(ws, fx) + trace_rows(ws, traces) + input_rows(ws, fx, logs, specs, prompts, models)
        rows += recent_rows(ws, fx, traces)
        fx["model_builtin"] = Path(__file__).resolve().parents[1] / "routecast" / "models" / "builtin"
        new = issue20_rows(ws, fx)
        rows = new if a.issue20 else rows + new
        if a.only:
            rows = [r for r in rows if any(s in r.cmd for s in a.only.split(","))]
        print(f"fixtures built in {time.perf_counter() - t0:.0f} s; running {len(rows)} rows, {a.jobs} at a time",
              flush=True)
        cwd = ws / "cwd"
        cwd.mkdir(exist_ok=True)
        with cf.ThreadPoolExecutor(a.jobs) as pool:
            for r in rows:
                r.timeout = (r.timeout or a.timeout) * a.timeout_scale
            results = list(pool.map(lambda r: run_row(r, env, a.timeout, cwd), rows))
    finally:
        if a.work is None:
            shutil.rmtree(ws, ignore_errors=True)
    counts = Counter(r["outcome"] for r in results)
    by_cmd: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        by_cmd[r["cmd"]][r["outcome"]] += 1
    kinds = ["clean", "assumed", "ok", "traceback", "hang", "data_loss", "silent", "executed"]
    print(f"\n{'command':<20}" + "".join(f"{k:>10}" for k in ["tried", *kinds]))
    for cmd, c in sorted(by_cmd.items()):
        print(f"{cmd:<20}{sum(c.values()):>10}" + "".join(f"{c[k]:>10}" for k in kinds))
    print(f"{'all':<20}{len(results):>10}" + "".join(f"{counts[k]:>10}" for k in kinds))
    bad = [r for r in results if r["outcome"] not in ("clean", "assumed", "ok")]
    if bad:
        print("\nrows that did not end cleanly:")
        for r in bad:
            print(f"  {r['outcome']:<10} {r['cmd']:<18} {r['class']:<44} rc={r['rc']} {r['stderr_last'][:110]}")
    info = machine_info()
    print(f"\n{len(results)} inputs in {time.perf_counter() - t0:.0f} s on {info.get('cpu', info)}; "
          f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"machine": info, "counts": dict(counts), "tried": len(results),
                                        "by_command": {k: dict(v) for k, v in by_cmd.items()}, "rows": results},
                                       indent=1))
    from routecast.common.bench import table, write_bench

    load = os.getloadavg()[0]
    which = "issue 20's rows" if a.issue20 else "every row"
    head = [f"{len(results)} malformed inputs ({which}) through the routecast commands: "
            + ", ".join(f"{k} {counts[k]}" for k in kinds if counts[k]),
            f"{len(bad)} did not end cleanly; load average {load:.1f}; every row in {a.json}"]
    write_bench("bad_input_sweep", title="Bad-input sweep: malformed inputs, one subprocess each", headline=head,
                tables=[table("outcomes per command", [{"command": cmd, "tried": sum(c.values()),
                                                         **{k: c[k] for k in kinds}} for cmd, c in sorted(by_cmd.items())]),
                        table("rows that did not end cleanly", [{"outcome": r["outcome"], "command": r["cmd"],
                                                                 "class": r["class"], "rc": r["rc"],
                                                                 "stderr": r["stderr_last"][:110]} for r in bad])],
                data={"counts": dict(counts), "tried": len(results), "issue20_only": a.issue20}, quick=a.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
