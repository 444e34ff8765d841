"""Rows of the bad-input sweep (benchmarks/bad_input_sweep.py) for the newer commands: `run` (offload,
prefetch, fallback), `cache replay`, `schedule cocluster/rebatch`, `permute-experts`, `serve-sim`,
`emoe quality/profile` and `ep run`. Each row is one command line a user could type by mistake; the
inputs are chosen to be refused before a model loads, so a row costs about one CLI start-up.
"""

from __future__ import annotations

from pathlib import Path

from bad_input_fixtures import SENTINEL, SENTINEL_TEXT, Row, _run_cli


def build_recent(fx: Path, env: dict[str, str], trace_good: Path, prompts_good: Path) -> dict[str, Path]:
    """Fixtures of these rows: a saved predictor and a co-clustering plan of other models than the rows use,
    bad plan files, and a small capture of builtin with hidden states."""
    other = fx / "switch-trace"
    _run_cli(["synth", "--preset", "switch-128", "--requests", "10", "--out", str(other)], env)
    pred_other = fx / "pred-switch"  # 12 layers x 128 experts, top-1: not the 8-expert trace nor builtin
    _run_cli(["predict", "fit", str(other), "--predictor", "conditional-token", "--out", str(pred_other)], env)
    plan_dir = fx / "plan-mixtral"  # 32 layers x 8 experts: not builtin's 4 MoE layers
    _run_cli(["schedule", "cocluster", str(trace_good), "--ep", "2", "--method", "random", "--quiet",
              "--out", str(plan_dir / "co.json")], env)
    bad_json = fx / "plan-bad.json"
    bad_json.write_text("{ not json")
    not_obj = fx / "plan-array.json"
    not_obj.write_text("[1, 2, 3]")
    cap = fx / "cap-hidden"  # `ep run` replays a capture with hidden states
    _run_cli(["capture", "--model", "builtin", "--prompts", str(prompts_good), "--max-new-tokens", "2", "--hidden",
              "--quiet", "--out", str(cap)], env)
    return {"cap_hidden": cap, "pred_other": pred_other, "plan_other": plan_dir / "co-plan.json", "plan_bad_json": bad_json,
            "plan_array": not_obj}


def _rows(cmd: str, base: list[str], cases: dict[str, list[str]], **kw) -> list[Row]:
    return [Row(cmd=cmd, cls=cls, argv=[*base, *extra], **kw) for cls, extra in cases.items()]


def recent_rows(ws: Path, fx: dict[str, Path], traces: dict[str, Path]) -> list[Row]:
    """Rows for run, cache replay, schedule, permute-experts, serve-sim, emoe and ep run."""
    o = ws / "rows" / "recent"
    o.mkdir(parents=True)
    n = iter(range(10**6))

    def out(suffix: str = "") -> str:
        return str(o / f"out-{next(n)}{suffix}")

    trace = str(fx["trace_good"])
    not_pred = str(traces["empty_dir"])
    corrupt = {k: str(traces[k]) for k in ("json_invalid", "shard_truncated", "regular_file", "missing")}
    rows: list[Row] = []

    # run: flags are checked before the model loads; builtin + 2 tokens keeps a wrongly accepted row short
    run = ["run", "--model", "builtin", "--prompts", str(fx["prompts_good"]), "--max-new-tokens", "2"]
    off = [*run, "--offload"]
    rows += _rows("run", off, {
        "--budget 0": ["--budget", "0"], "--budget -5%": ["--budget=-5%"], "--budget 200%": ["--budget", "200%"],
        "--budget abc": ["--budget", "abc"], "--budget 0%": ["--budget", "0%"], "--budget nan%": ["--budget", "nan%"],
        "--prefetch unknown": ["--prefetch", "nope"], "--prefetch-top -1": ["--prefetch", "lookahead", "--prefetch-top", "-1"],
        "--prefetch-top above experts": ["--prefetch", "lookahead", "--prefetch-top", "999"],
        "--prefetch-min-prob nan": ["--prefetch", "lookahead", "--prefetch-min-prob", "nan"],
        "--prefetch-min-prob 1.5": ["--prefetch", "lookahead", "--prefetch-min-prob", "1.5"],
        "--prefetch-min-prob -0.1": ["--prefetch", "lookahead", "--prefetch-min-prob", "-0.1"],
        "--prefetch-depth 0": ["--prefetch", "lookahead", "--prefetch-depth", "0"],
        "--batch-size 0": ["--batch-size", "0"], "--loader-threads 0": ["--loader-threads", "0"],
        "--loader-threads -2": ["--loader-threads", "-2"], "--threads 0": ["--threads", "0"],
        "--fallback, budget below layers x top-k": ["--fallback", "--budget", "1"],
        "--predictor a non-predictor folder": ["--prefetch", "expertflow", "--predictor", not_pred],
        "--predictor missing": ["--prefetch", "expertflow", "--predictor", str(ws / "no-such-predictor")],
        "--predictor of another model": ["--prefetch", "expertflow", "--predictor", str(fx["pred_other"])],
        "--fit-trace corrupt": ["--prefetch", "expertflow", "--fit-trace", corrupt["json_invalid"]],
        "--fit-trace of another model": ["--prefetch", "expertflow", "--fit-trace", trace],
        "--token-table with --policy lru": ["--policy", "lru", "--token-table"],
        "--token-table, --fit-trace corrupt": ["--policy", "fc-evict", "--token-table", "--fit-trace", corrupt["json_invalid"]],
        "--token-table, --fit-trace missing": ["--policy", "fc-evict", "--token-table", "--fit-trace", corrupt["missing"]],
        "--token-table, --fit-trace a file": ["--policy", "fc-evict", "--token-table", "--fit-trace", corrupt["regular_file"]],
        "--token-table, --fit-trace of another model": ["--policy", "fc-evict", "--token-table", "--fit-trace", trace],
        "--reader unknown": ["--reader", "fork"],
        "--lookahead-first -2": ["--prefetch", "lookahead", "--lookahead-first", "-2"],
        "--lookahead-first not a number": ["--prefetch", "lookahead", "--lookahead-first", "half"],
        "--write-profile without --hardware": ["--write-profile", out(".toml")],
        "--hardware unknown": ["--write-profile", out(".toml"), "--hardware", "nope"],
    }, timeout=45)
    rows += _rows("run", run, {
        "--fallback without --offload": ["--fallback"], "--prefetch without --offload": ["--prefetch", "lookahead"],
        "--model unknown": ["--model", "no-such-model"], "--max-new-tokens 0": ["--max-new-tokens", "0"],
        "--prompts corpus:nosuch": ["--prompts", "corpus:nosuch"],
    }, timeout=45)
    d = o / "run-out-dir"
    d.mkdir()
    (d / SENTINEL).write_text(SENTINEL_TEXT)
    rows.append(Row(cmd="run", cls="--out names a directory", argv=[*run, "--out", str(d)], timeout=45,
                    sentinels=[d / SENTINEL]))

    # cache replay
    cr = ["cache", "replay"]
    lru = ["--policies", "lru", "--quiet"]
    rows += _rows("cache replay", [*cr, trace], {
        "--budget 0": [*lru, "--budget", "0"], "--budget 0%": [*lru, "--budget", "0%"],
        "--budget -5%": [*lru, "--budget=-5%"], "--budget abc": [*lru, "--budget", "abc"],
        "--budget above all experts": [*lru, "--budget", "100000"], "--budget 150%": [*lru, "--budget", "150%"],
        "--budget nan%": [*lru, "--budget", "nan%"],
        "--policies unknown": ["--policies", "nope", "--quiet"], "--policies empty": ["--policies", "", "--quiet"],
        "--predictor of another model": ["--policies", "plec", "--predictor", str(fx["pred_other"]), "--quiet"],
        "--predictor a non-predictor folder": ["--policies", "plec", "--predictor", not_pred, "--quiet"],
        "--predictor unknown name": ["--policies", "plec", "--predictor", "nope", "--quiet"],
        "--plec-depth 0": ["--policies", "plec", "--plec-depth", "0", "--quiet"],
        "--dense-us -1": [*lru, "--dense-us", "-1"], "--dense-us nan": [*lru, "--dense-us", "nan"],
        "--expert-bytes -5": [*lru, "--expert-bytes", "-5"], "--train-fraction 1.5": [*lru, "--train-fraction", "1.5"],
        "--hardware unknown": [*lru, "--hardware", "nope"], "--hardware bad TOML": [*lru, "--hardware", str(fx["hw_bad"])],
        "--threads 0": [*lru, "--threads", "0"],
    }, may_assume=True)
    for name, t in corrupt.items():
        rows.append(Row(cmd="cache replay", cls=f"trace: {name.replace('_', ' ')}", argv=[*cr, t, *lru, "--out", out(".json")]))
    d = o / "cache-out-dir"
    d.mkdir()
    (d / SENTINEL).write_text(SENTINEL_TEXT)
    rows.append(Row(cmd="cache replay", cls="--out names a directory", argv=[*cr, trace, *lru, "--out", str(d)],
                    sentinels=[d / SENTINEL]))

    # schedule cocluster / rebatch
    co = ["schedule", "cocluster", trace, "--method", "random", "--quiet"]
    rows += _rows("schedule cocluster", co, {
        "--ep 0": ["--ep", "0"], "--ep -2": ["--ep", "-2"], "--ep 3 (8 experts)": ["--ep", "3"],
        "--ep 16 (more ranks than experts)": ["--ep", "16"], "--method unknown": ["--ep", "2", "--method", "nope"],
        "--max-tokens -1": ["--ep", "2", "--max-tokens", "-1"], "--beta 0": ["--ep", "2", "--beta", "0"],
        "--beta nan": ["--ep", "2", "--beta", "nan"], "--rho 0": ["--ep", "2", "--method", "smoe", "--rho", "0"],
        "--rho 1.5": ["--ep", "2", "--method", "smoe", "--rho", "1.5"],
        "--plan names a directory": ["--ep", "2", "--plan", str(traces["empty_dir"])],
    })
    rb = ["schedule", "rebatch", trace, "--predictor", "oracle", "--quiet"]
    rows += _rows("schedule rebatch", rb, {
        "--max-tokens -1": ["--max-tokens", "-1"], "--budget 0": ["--budget", "0"], "--budget -5%": ["--budget=-5%"],
        "--budget abc": ["--budget", "abc"], "--budget 200%": ["--budget", "200%"],
        "--policy unknown": ["--policy", "nope"], "--min-tokens -1": ["--min-tokens", "-1"], "--min-tokens 1": ["--min-tokens", "1"],
        "--predictor of another model": ["--predictor", str(fx["pred_other"])],
    }, may_assume=True)
    for name, t in corrupt.items():
        for sub in ("cocluster", "rebatch"):
            rows.append(Row(cmd=f"schedule {sub}", cls=f"trace: {name.replace('_', ' ')}",
                            argv=["schedule", sub, t, "--quiet", "--out", out(".json")]))

    # permute-experts
    pe = ["permute-experts", "--model", "builtin"]
    rows += _rows("permute-experts", pe, {
        "--plan missing": ["--plan", str(ws / "no-such-plan.json"), "--out", out()],
        "--plan not JSON": ["--plan", str(fx["plan_bad_json"]), "--out", out()],
        "--plan a JSON array": ["--plan", str(fx["plan_array"]), "--out", out()],
        "--plan a directory": ["--plan", str(traces["empty_dir"]), "--out", out()],
        "--plan of another model": ["--plan", str(fx["plan_other"]), "--out", out()],
    }, timeout=45)
    rows.append(Row(cmd="permute-experts", cls="--model unknown",
                    argv=["permute-experts", "--model", "no-such-model", "--plan", str(fx["plan_other"]), "--out", out()]))

    # serve-sim: small --requests so a wrongly accepted row ends quickly
    ss = ["serve-sim", "--requests", "50", "--quiet"]
    rows += _rows("serve-sim", ss, {
        "--rate 0": ["--rate", "0"], "--rate -1": ["--rate", "-1"], "--rate nan": ["--rate", "nan"],
        "--rate inf": ["--rate", "inf"], "--rates with a word": ["--rates", "1,abc"], "--rates empty": ["--rates", ""],
        "--rates with 0": ["--rates", "1,0"], "--scheduler unknown": ["--scheduler", "nope"],
        "--scheduler empty": ["--scheduler", ""], "--requests 0": ["--requests", "0"],
        "--budget 0%": ["--budget", "0%"], "--budget 150%": ["--budget", "150%"], "--budget abc": ["--budget", "abc"],
        "--cv 0 (gamma)": ["--arrival", "gamma", "--cv", "0"], "--gpus 0": ["--gpus", "0"], "--gpus -2": ["--gpus", "-2"],
        "--period 0": ["--period", "0"], "--slo-target 1.5": ["--slo-target", "1.5"],
        "--model-profile unknown": ["--model-profile", "nope"], "--hardware bad TOML": ["--hardware", str(fx["hw_bad"])],
    }, may_assume=True)
    for name, t in corrupt.items():
        rows.append(Row(cmd="serve-sim", cls=f"--trace {name.replace('_', ' ')}", argv=[*ss, "--trace", t]))

    # emoe quality / profile
    for action in ("quality", "profile"):
        base = ["emoe", action, "--per-task", "1", "--seq-len", "8", "--quiet"]
        rows += _rows(f"emoe {action}", base, {
            "--model unknown": ["--model", "no-such-model", "--out", out(".json")],
            "--model a non-model folder": ["--model", str(traces["empty_dir"]), "--out", out(".json")],
            "--per-task 0": ["--model", "builtin", "--per-task", "0", "--out", out(".json")],
            "--seq-len 0": ["--model", "builtin", "--seq-len", "0", "--out", out(".json")],
            "--split unknown": ["--model", "builtin", "--split", "nope", "--out", out(".json")],
        }, timeout=45)
    eq = ["emoe", "quality", "--model", "builtin", "--per-task", "1", "--seq-len", "8", "--quiet"]
    rows += _rows("emoe quality", eq, {
        "--budget 0%": ["--budget", "0%"], "--budget 150%": ["--budget", "150%"], "--budget abc": ["--budget", "abc"],
        "--budget -10%": ["--budget=-10%"], "--residency unknown": ["--residency", "nope"],
        "--period 0": ["--period", "0"], "--reuse with a word": ["--reuse", "5,abc"],
    }, timeout=45)

    # ep run / forward / calibrate: refused before torchrun starts
    ep = ["ep", "run", "--model", "builtin", "--trace", str(fx["cap_hidden"]), "--steps", "1", "--repeats", "1"]
    rows += _rows("ep run", ep, {
        "--nproc 0": ["--nproc", "0", "--out", out()], "--nproc -1": ["--nproc", "-1", "--out", out()],
        "--nproc 3 (8 experts)": ["--nproc", "3", "--out", out()],
        "--steps 0": ["--steps", "0", "--out", out()], "--plans unknown": ["--plans", "nope", "--out", out()],
        "--timeout 0": ["--timeout", "0", "--out", out()], "--repeats 0": ["--repeats", "0", "--out", out()],
        "--trace without hidden states": ["--trace", trace, "--out", out()],
        "--trace corrupt": ["--trace", corrupt["json_invalid"], "--out", out()],
        "--shuffle-plan not JSON": ["--shuffle-plan", str(fx["plan_bad_json"]), "--out", out()],
    }, timeout=60)
    rows.append(Row(cmd="ep forward", cls="--nproc 0", timeout=60,
                    argv=["ep", "forward", "--model", "builtin", "--trace", str(fx["cap_hidden"]), "--nproc", "0",
                          "--requests", "1", "--tokens", "2",
                          "--out", out()]))
    for k in ("0", "1"):
        rows.append(Row(cmd="ep calibrate", cls=f"--nproc {k}", timeout=60,
                        argv=["ep", "calibrate", "--nproc", k, "--repeats", "1", "--out", out(".toml")]))
    return rows
