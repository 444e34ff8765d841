"""The command-line fuzzer's engine: every subcommand from the parser tree, argument vectors drawn from each
parser's own definition, and each case run in a forked child of the test process.

Discovery (commands()): walk routecast.cli.build_parser(); a positional with choices splits a command into
one leaf per choice ("cache replay", "ep run", ...); a command that forwards its arguments to a parser of
its own (argparse.REMAINDER: train-builtin, corpus; "place export") is asked for that parser by running
`routecast CMD --help` with ArgumentParser.parse_known_args intercepted, so new commands and flags are
drawn without a list here to update.

Drawing (draw_argv()): required arguments always, each optional flag with probability ~1/3; a value is
'plausible' (a fixture of the kind the flag's name suggests, a small number, one of its choices) or
'hostile' (0, -1, NaN, inf, 1e308, a 400-digit integer, a float where an int is expected, missing paths,
folders, symlinks, binary / truncated / wrong-schema / wrong-shape files, the command's own input, an
--out inside the input trace).

Running (run_case()): fork, chdir into the case's scratch folder, stdout/stderr to files, an address-space
cap, routecast.cli.main(argv); the parent kills the child at the time bound. Forking keeps each case's
global state (torch threads, signal handlers, the working directory) and crashes (a segfault) out of the
test process, and costs milliseconds because the parent imported everything first.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import pkgutil
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

HOSTILE_NUMBERS = ["0", "-1", "nan", "inf", "-inf", "1e308", "9" * 400, "-" + "9" * 400, "1.5", "0.0001",
                   "", "abc", "0x10", "2147483648", "1e-320"]
HOSTILE_TEXT = ["", " ", "nan", "-1", "9" * 400, "a" * 300, "%", ",,", "x,y,,z", "..", "1e308%", "-50%",
                "\x00"]
HOSTILE_PATHS = ["missing", "missing-dir", "folder", "user-folder", "user-file", "text", "binary", "empty",
                 "truncated", "wrong-shape", "wrong-schema", "huge-int-json", "toml-broken", "link-trace",
                 "link-file", "link-dangling", "trace-tampered", "trace-json", "trace-shard", "trace-inside",
                 "trace", "ranks-float", "ranks-3d", "ranks-object", "model-config", "plan-broken", "plan"]
# dest-name keyword -> plausible values ("@name": the fixture of that name; "{OUT}...": a fresh path in the
# case's scratch folder). A flag matching no keyword draws from the generic pool.
PLAUSIBLE = [
    (("trace", "train_extra", "fit_trace"), ["@trace", "@trace-small"]),
    (("out", "plot", "write_profile"), ["{OUT}/o", "{OUT}/o.json", "{OUT}/o.png", "{OUT}/o.toml"]),
    (("plan",), ["@plan", "{OUT}/plan.json", "static", "eplb"]),
    (("prompts",), ["@prompts", "corpus:test:2"]),
    (("model_profile",), ["mixtral-8x7b", "@model-toml"]),
    (("model",), ["builtin", "none", "@model-copy"]),
    (("hardware",), ["h100-sxm", "a100-sxm-80gb", "@toml"]),
    (("spec",), ["@spec"]),
    (("src",), ["@log"]),
    (("token_ranks",), ["@ranks"]),
    (("shuffle_plan",), ["@plan"]),
    (("budget",), ["50%", "3", "25%", "1GB"]),
    (("residency",), ["50%", "3"]),
    (("policies", "policy"), ["lru", "lru,lfu", "plec-correct", "belady"]),
    (("predictors",), ["distribution", "distribution,probability", "conditional-token"]),
    (("predictor",), ["distribution", "oracle", "conditional-token"]),
    (("preset", "synthetic"), ["mixtral-8x7b", "switch-128"]),
    (("scheduler",), ["emoe", "fcfs", "emoe,fcfs"]),
    (("rates",), ["1,2", "4"]),
    (("slo_ttft", "slo_tpot"), ["5x", "0.5"]),
    (("split",), ["document", "request", "none"]),
    (("method",), ["smoe", "metis"]),
    (("link",), ["nvlink", "pcie"]),
    (("device",), ["cpu"]),
    (("map",), ["req=request"]),
    (("set",), ["seed=1"]),
    (("plans",), ["static", "static,eplb"]),
    (("prefetch",), ["none", "lru"]),
    (("format",), ["sglang"]),
]
GENERIC_TEXT = ["1", "a", "builtin", "@trace", "{OUT}/o"]
SMALL_INT, SMALL_FLOAT = ["1", "2", "3"], ["0.5", "1", "2"]


@dataclass
class Leaf:
    """One subcommand: argv prefix (e.g. ['cache', 'replay']) and the argparse actions of its flags."""

    prefix: list[str]
    actions: list[argparse.Action] = field(default_factory=list)
    outputs: tuple[str, ...] = ()  # the output flags its handler declares (routecast.common.outputs.writes)

    @property
    def name(self) -> str:
        return " ".join(self.prefix)


class _Captured(BaseException):
    pass


def _owned_parser(main, prefix: list[str]) -> argparse.ArgumentParser | None:
    """The parser a forwarding command builds for itself, or None: run `routecast PREFIX --help` and catch the
    first parse_known_args call; main() parses with the whole tree (prog 'routecast') unless it forwards."""
    got: dict[str, argparse.ArgumentParser] = {}
    real = argparse.ArgumentParser.parse_known_args

    def grab(self, args=None, namespace=None):
        got["p"] = self
        raise _Captured

    argparse.ArgumentParser.parse_known_args = grab
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main([*prefix, "--help"])
    except (_Captured, SystemExit):
        pass
    finally:
        argparse.ArgumentParser.parse_known_args = real
    p = got.get("p")
    return None if p is None or p.prog == "routecast" else p


def _leaves(p: argparse.ArgumentParser, prefix: list[str], main, outs: tuple[str, ...] = ()) -> list[Leaf]:
    outs = tuple(getattr(p.get_default("fn"), "routecast_writes", ())) or outs
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if subs:
        return [leaf for a in subs for name, sp in a.choices.items()
                for leaf in _leaves(sp, [*prefix, name], main, outs)]
    acts = [a for a in p._actions if not isinstance(a, argparse._HelpAction)]
    pos = [a for a in acts if not a.option_strings]
    if pos and pos[0].nargs == argparse.REMAINDER:
        owned = _owned_parser(main, prefix)
        return [Leaf(prefix, acts, outs)] if owned is None else _leaves(owned, prefix, main, outs)
    if pos and pos[0].choices and len(prefix) == 1:
        out = []
        for choice in pos[0].choices:
            owned = _owned_parser(main, [*prefix, choice])
            if owned is not None:  # the choice forwards to a parser of its own (place export)
                out += _leaves(owned, [*prefix, choice], main, outs)
            else:
                out.append(Leaf([*prefix, choice], [a for a in acts if a is not pos[0]], outs))
        return out
    return [Leaf(prefix, acts, outs)]


def replaced_ok(leaf: Leaf, argv: list[str], fixtures_root: Path) -> Callable[[str], bool]:
    """Which fixture changes a case may make: with --overwrite, the path given to one of the command's declared
    output flags (or a path inside it), when no other argument names that path, a path inside it or a folder
    holding it (then it is an input too, and must be refused)."""
    outs: list[Path] = []
    others: list[Path] = []
    for i, tok in enumerate(argv[:-1]):
        if tok.startswith("-") and Path(argv[i + 1]).is_absolute():
            flag = tok.split("=")[0]
            names = next((a.option_strings for a in leaf.actions if flag in a.option_strings), [flag])
            (outs if set(names) & set(leaf.outputs) else others).append(Path(argv[i + 1]))
    others += [Path(t) for j, t in enumerate(argv) if Path(t).is_absolute() and (j == 0 or not argv[j - 1].startswith("-"))]
    mine = [o for o in outs if not any(o == x or o in x.parents or x in o.parents for x in others)]

    def ok(rel: str) -> bool:
        p = fixtures_root / rel
        return "--overwrite" in argv and any(p == o or o in p.parents for o in mine)

    return ok


def commands() -> list[Leaf]:
    """Every leaf subcommand of `routecast`, discovered from the parser tree."""
    from routecast.cli import build_parser, main

    return _leaves(build_parser(), [], main)


def _kind(a: argparse.Action) -> str:
    """'flag' (no value), 'int', 'float', 'num' (a custom numeric type) or 'text'."""
    if a.nargs == 0:
        return "flag"
    t = a.type
    if t is int or getattr(t, "kind", None) is int:
        return "int"
    if t is float or getattr(t, "kind", None) is float:
        return "float"
    return "text" if t is None or t is str else "num"


def _plausible(a: argparse.Action) -> list[str]:
    if a.choices:
        return [str(c) for c in a.choices]
    k = _kind(a)
    if k == "int":
        return SMALL_INT
    if k == "float":
        return SMALL_FLOAT
    dest = a.dest.lower()
    for keys, vals in PLAUSIBLE:
        if any(dest == key or dest.endswith("_" + key) or dest.startswith(key + "_") for key in keys):
            return vals
    return (SMALL_FLOAT + ["50%"]) if k == "num" else GENERIC_TEXT


def _hostile(a: argparse.Action) -> list[str]:
    k = _kind(a)
    if k in ("int", "float", "num"):
        return HOSTILE_NUMBERS
    return HOSTILE_TEXT + ["@" + n for n in HOSTILE_PATHS] + ["{OUT}"]


def value(a: argparse.Action) -> st.SearchStrategy[str]:
    """A value for flag a: plausible about 2 times in 3, hostile otherwise."""
    return st.one_of(st.sampled_from(_plausible(a)), st.sampled_from(_plausible(a)), st.sampled_from(_hostile(a)))


@st.composite
def draw_argv(draw, leaf: Leaf) -> list[str]:
    """An argument vector for leaf: positionals in order, required flags, ~1/3 of the optional flags.

    A case is 'clean' (every value plausible: it reaches the command's work), 'one' (exactly one value
    hostile: each check on its own) or 'free' (each value hostile with probability 1/3)."""
    mode = draw(st.sampled_from(["clean", "one", "one", "one", "free", "free"]))
    argv = list(leaf.prefix)
    picks: list[tuple[argparse.Action, str | None]] = []
    for a in leaf.actions:
        if a.option_strings:
            if not a.required and not draw(st.integers(0, 2)) == 0:
                continue
            opt = draw(st.sampled_from(a.option_strings))
            picks.append((a, None) if _kind(a) == "flag" else (a, opt))
            if _kind(a) == "flag":
                argv.append(opt)
            else:
                argv += [opt, ""]
        elif a.nargs in ("?", "*") and draw(st.booleans()):
            continue
        else:
            picks.append((a, None))
            argv.append("")
    valued = [i for i, (a, _) in enumerate(picks) if _kind(a) != "flag"]
    hostile = {draw(st.sampled_from(valued))} if mode == "one" and valued else set()
    slots = [i for i, s in enumerate(argv) if s == "" and i >= len(leaf.prefix)]
    for slot, i in zip(slots, valued, strict=True):
        a = picks[i][0]
        if mode == "free":
            argv[slot] = draw(value(a))
        else:
            argv[slot] = draw(st.sampled_from(_hostile(a) if i in hostile else _plausible(a)))
    if draw(st.integers(0, 9)) == 0:  # an unknown flag, or one twice
        argv.append(draw(st.sampled_from(["--no-such-flag", "--help", argv[-1]])))
    return argv


def resolve(argv: list[str], fixtures: dict[str, Path], out: Path) -> list[str]:
    """'@name' -> the fixture's path, '{OUT}' -> the case's scratch folder."""
    def one(s: str) -> str:
        if s.startswith("@") and s[1:] in fixtures:
            return str(fixtures[s[1:]])
        return s.replace("{OUT}", str(out))
    return [one(s) for s in argv]


def preload() -> None:
    """Import every routecast module (and what they import) once in the parent, so forked cases start warm."""
    import routecast

    for m in pkgutil.walk_packages(routecast.__path__, "routecast."):
        if m.name.endswith(("__main__", ".worker")):
            continue
        with contextlib.suppress(Exception):
            importlib.import_module(m.name)


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class WorkBudget(BaseException):
    """Raised in a case's child when its work budget is spent: it passed every check and was working."""


_FIRED: list[bool] = []  # set in the child when its budget alarm fired


def _numba_compiling() -> bool:
    """Whether this thread holds numba's compiler lock (compiling, or loading a kernel from numba's disk cache)."""
    lock = sys.modules.get("numba.core.compiler_lock")
    return bool(lock is not None and lock.global_compiler_lock.is_locked())


def _budget_spent(signum, frame):
    # Never inside numba: an exception raised while LLVM objects are half built leaves them to be freed by a later
    # garbage collection, which then crashes the process (SIGSEGV in llvmlite's dispose; seen in CI on a cold numba
    # cache). The alarm is re-armed until the compile ends: the work budget runs a little over, inside LIMIT_S.
    if _numba_compiling():
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        return
    # The alarm can land inside a ctypes callback (numba's object-cache hook while it compiles), where Python
    # prints the exception and drops it; the command then fails later for that reason (numba: "no compiled
    # object yet"). _FIRED records the alarm so whatever follows it counts as past the budget, not as a bug.
    _FIRED.append(True)
    raise WorkBudget


def run_case(argv: list[str], scratch: Path, *, budget_s: float, limit_s: float, mem_extra: int = 3 << 30) -> dict:
    """Run routecast.cli.main(argv) in a forked child with cwd = scratch.

    budget_s: after this long the child raises WorkBudget inside the command (SIGALRM): a command still
    working then has passed its checks (commands that train or generate would otherwise take minutes);
    limit_s: the hard bound: the child's process group is killed (a hang: it did not stop at the budget).
    -> {rc, signal, timed_out, budget, secs, stdout, stderr, exc}: rc the exit status (SystemExit
    included), exc the uncaught exception's traceback text (None when main returned or exited).
    """
    scratch.mkdir(parents=True, exist_ok=True)
    res_file = scratch.parent / f".{scratch.name}.result.json"
    out_f, err_f = scratch.parent / f".{scratch.name}.stdout", scratch.parent / f".{scratch.name}.stderr"
    cap = _vm_bytes() + mem_extra
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.monotonic()
    for attempt in range(40):  # EAGAIN: the machine's process table is momentarily full (a shared CI box)
        try:
            pid = os.fork()
            break
        except BlockingIOError:
            if attempt == 39:
                raise
            time.sleep(0.25)
    if pid == 0:  # the child: never returns
        code, exc, spent = 1, None, False
        try:
            os.setpgid(0, 0)  # its own group, so the parent can end everything it started
            os.chdir(scratch)
            for fd, f in ((1, out_f), (2, err_f)):
                h = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(h, fd)
                os.close(h)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGALRM, _budget_spent)
            from routecast.cli import main

            spent = False
            try:
                signal.setitimer(signal.ITIMER_REAL, budget_s)
                code = int(main(argv) or 0)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except WorkBudget:
                code, spent = 0, True
            except BaseException:
                exc = traceback.format_exc()
                sys.stderr.write(exc)
                code = 1
            if _FIRED:  # the budget was spent, whatever the command did after it is the interruption's doing
                code, exc, spent = 0, None, True
        except BaseException:
            exc = traceback.format_exc()
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
                signal.setitimer(signal.ITIMER_REAL, 0)
                Path(res_file).write_text(json.dumps({"rc": code, "exc": exc, "budget": spent}))
            os._exit(0)
    timed_out, status = False, 0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - t0 > limit_s:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.005)
    secs = time.monotonic() - t0
    with contextlib.suppress(ProcessLookupError):  # anything the case started and left running
        os.killpg(pid, signal.SIGKILL)
    try:
        r = json.loads(res_file.read_text())
    except (OSError, ValueError):
        r = {"rc": None, "exc": None, "budget": False}
    text = {k: (f.read_text(errors="replace") if f.exists() else "") for k, f in (("stdout", out_f), ("stderr", err_f))}
    for f in (res_file, out_f, err_f):
        f.unlink(missing_ok=True)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) and not timed_out else None
    return {"rc": r["rc"], "signal": sig, "timed_out": timed_out, "budget": r["budget"], "secs": secs,
            "exc": r["exc"], **text}


def outcome(r: dict) -> str:
    """One word for a case's result: ok (exit 0), working (still at work when its budget was spent),
    refused (exit 2, a one-line routecast error or argparse's usage error), or a failure: traceback, exit-N,
    crash (killed by a signal), hang (past the time bound), memory (past the address-space cap)."""
    if r["timed_out"]:
        return "hang"
    if r["budget"] and r["signal"] is None:
        return "working"
    if r["signal"] is not None:
        return "crash"
    err = r["stderr"]
    if r["exc"] or "Traceback (most recent call last)" in err:
        return "memory" if "MemoryError" in (r["exc"] or err) else "traceback"
    if r["rc"] == 0:
        return "ok"
    if r["rc"] == 2:
        return "memory" if "needs more memory than this machine has" in err else "refused"
    return f"exit-{r['rc']}"
