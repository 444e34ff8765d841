"""Output paths: the one path every writing command goes through. Check before any work, write atomically with
the user's umask, validate before the rename, never clobber, never touch what the run did not create.

A command handler is wrapped by @writes("--out", ..., inputs=("trace", "--model", ...)): that opens a
CommandIO for the run, records the real paths of its inputs, and every check_out_file / check_out_dir the run
makes claims its output there. A claimed output is refused when it
  - is a symbolic link (routecast never writes through one: rename replaces a link, it never follows it);
  - is, lies inside, or contains an input of the command (compared as resolved real paths);
  - names the same path as (or lies inside) another output of the same command;
  - is an existing file and the command was not given --overwrite.
write_atomic / write_json write a temp file created fresh beside the target (O_EXCL: never one that existed),
fsync it, run the caller's validate(temp) and only then rename it over the target, so --overwrite never
replaces a good file with a bad one. remove_own() and scratch_dir() delete and create only what this run made.
After the handler returns, every declared output flag with a value must have been claimed (else a bug: a
command that writes around this module); tests/common/test_outputs.py checks the declarations cover every
output flag of every subcommand. The older rules, kept:
  - a directory output that exists and is not empty is refused unless the user passed --overwrite;
    even then routecast replaces only the files it writes (`owned`) and never deletes anything else;
  - an output whose parent is a regular file, that cannot be created or written (read-only place,
    permissions), or that is a directory where a file is expected (or the reverse) is refused;
  - files are created with mode 0o666 & ~umask (tempfile.mkstemp and safetensors create 0600 files,
    which teammates sharing a trace could not read).
os_error() turns an OSError met while writing (a full disk, a vanished directory) into the same kind of
one-sentence ConfigError.
"""

from __future__ import annotations

import contextvars
import errno
import functools
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from routecast.common.errors import ConfigError


def file_mode() -> int:
    """The mode a new regular file gets from open(): 0o666 & ~umask (the umask is read, then restored)."""
    old = os.umask(0o022)
    os.umask(old)
    return 0o666 & ~old


def fix_mode(path: str | os.PathLike) -> None:
    """Give a file written through mkstemp or safetensors (mode 0600) the mode the umask asks for."""
    os.chmod(path, file_mode())


def os_error(e: OSError, flag: str, path: str | os.PathLike | None = None) -> ConfigError:
    """One sentence for an OSError met while writing an output named by `flag`."""
    where = Path(path if path is not None else (e.filename or "?"))
    why = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exhausted",
           errno.EROFS: "the file system is read-only", errno.EACCES: "permission is denied",
           errno.EPERM: "the operation is not permitted", errno.ENOTDIR: "a parent is not a directory",
           errno.EISDIR: "it is a directory"}.get(e.errno, e.strerror or type(e).__name__)
    return ConfigError(f"{flag} {where}: cannot be written ({why}); expected a writable path with free space.")


def _nearest_existing(p: Path) -> Path:
    q = p
    while not q.exists() and q != q.parent:
        if q.is_symlink():  # a dangling link: its parent is where creation would fail
            break
        q = q.parent
    return q


def _check_parent(p: Path, flag: str, kind: str) -> None:
    """The path's closest existing ancestor must be a writable directory (no regular file on the way)."""
    q = _nearest_existing(p.parent if p.parent != p else p)
    if q.exists() and not q.is_dir():
        raise ConfigError(f"{flag} {p}: {q} is a regular file, not a directory; expected a {kind} path whose "
                          "parents are directories.")
    if not os.access(q, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {p}: {q} is not writable; expected a {kind} path in a writable directory.")
    _probe(q, flag, p)


def _probe(q: Path, flag: str, p: Path) -> None:
    """Create and remove a temp file in directory q: the one test that holds for root and read-only mounts."""
    probe = q / f".routecast-write-test-{os.getpid()}"
    try:  # os.access says yes to root even on read-only or pseudo file systems (/proc, /sys)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except FileExistsError:
        pass
    except OSError as e:
        raise os_error(e, flag, p) from None


def _refuse_link(p: Path, flag: str) -> None:
    if p.is_symlink():
        raise ConfigError(f"{flag} {p} is a symbolic link (to {os.readlink(p)}); expected a plain path "
                          "(routecast never writes through a link).")


def check_out_file(path: str | os.PathLike, flag: str) -> Path:
    """A file output (a PNG, a TOML): not a directory, parents directories, writable. -> Path."""
    p = Path(path)
    _refuse_link(p, flag)
    if str(path) == "" or p.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a directory; expected a file path.")
    if p.exists() and not p.is_file():
        raise ConfigError(f"{flag} {p} is not a regular file (a device or a pipe); expected a file path.")
    io = _ACTIVE.get()
    if io is not None:
        io.claim(flag, p, "file")
    if p.is_file() and not os.access(p, os.W_OK):
        raise ConfigError(f"{flag} {p} is not writable; expected a file routecast may replace.")
    _check_parent(p, flag, "file")
    return p


def check_out_dir(path: str | os.PathLike, flag: str, *, overwrite: bool,
                  owned: Callable[[str], bool] | None = None, replaces_dir: bool = False) -> Path:
    """A directory output: refuse a regular file, an unwritable place, a non-empty directory without
    --overwrite. With overwrite and replaces_dir (the command swaps the whole directory), every entry
    must be one routecast writes (owned(name) is True), since the others would be lost. -> Path.
    """
    p = Path(path)
    if str(path) == "":
        raise ConfigError(f"{flag} is empty; expected a directory path.")
    _refuse_link(p, flag)
    io = _ACTIVE.get()
    if io is not None:
        io.claim(flag, p, "dir")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {p} is a regular file (or a device); expected a directory path.")
    if not p.is_dir():
        _check_parent(p, flag, "directory")
        return p
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {p} is not writable; expected a directory routecast may write into.")
    _probe(p, flag, p)
    entries = sorted(x.name for x in p.iterdir())
    if entries and not overwrite:
        raise ConfigError(f"{flag} {p} is not empty (it holds {entries[0]!r}); expected a new or empty directory "
                          "(pass --overwrite to replace routecast's own files there).")
    if entries and replaces_dir:
        foreign = [n for n in entries if owned is None or not owned(n)]
        if foreign:
            raise ConfigError(f"{flag} {p} holds {foreign[0]!r}, which routecast did not write; expected only "
                              "routecast's output there (move it away: --overwrite never deletes other files).")
    return p


def names_matcher(names: Iterable[str], prefixes: Iterable[str] = ()) -> Callable[[str], bool]:
    """owned() for check_out_dir: exact names, or names starting with one of the prefixes."""
    exact, pre = frozenset(names), tuple(prefixes)
    return lambda n: n in exact or n.startswith(pre)


def write_atomic(path: str | os.PathLike, data: bytes | str, flag: str,
                 validate: Callable[[Path], None] | None = None) -> Path:
    """Write data to path: a fresh temp file beside it (O_EXCL), fsync, validate(temp) (raises to refuse), rename,
    fsync the directory; mode per umask; errors as one sentence. Within a command, path must be claimed."""
    p = Path(path)
    io = _ACTIVE.get()
    if io is not None:
        io.require_claimed(p, flag)
    if p.is_symlink():
        raise ConfigError(f"{flag} {p} is a symbolic link; expected a plain path (routecast never writes through a link).")
    tmp = None
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        tmp = Path(name)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        fix_mode(tmp)
        if validate is not None:
            validate(tmp)
        os.replace(tmp, p)  # replaces a link that appeared meanwhile, never its target
        tmp = None
        _fsync_dir(p.parent)
    except OSError as e:
        raise os_error(e, flag, p) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    return p


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


INT64 = (-(2**63), 2**63 - 1)


def check_json_value(obj: Any, where: str, flag: str) -> None:
    """Refuse what JSON readers would misread: NaN/inf (not JSON), ints outside int64 (wrap in C readers)."""
    stack = [(obj, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, bool) or v is None or isinstance(v, str):
            continue
        if isinstance(v, int):
            if not INT64[0] <= v <= INT64[1]:
                raise ConfigError(f"{flag}: {at} is {v}, outside int64; expected counts that fit 64-bit readers "
                                  "(nothing was written).")
        elif isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise ConfigError(f"{flag}: {at} is {v}; expected finite numbers (nothing was written).")
        elif isinstance(v, dict):
            stack.extend((x, f"{at}.{k}") for k, x in v.items())
        elif isinstance(v, list | tuple):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))


def write_json(path: str | os.PathLike, obj: Any, flag: str, *, indent: int | None = 1, finite: bool = True,
               validate: Callable[[Path], None] | None = None, default: Callable[[Any], Any] | None = None) -> Path:
    """obj as JSON through write_atomic; numpy scalars/arrays become numbers/lists; with finite, NaN/inf and
    ints beyond int64 are refused before anything is written."""
    text = json.dumps(obj, indent=indent, default=default or _json_default)
    if finite:
        check_json_value(json.loads(text), Path(path).name, flag)
    return write_atomic(path, text, flag, validate=validate)


def _json_default(v: Any) -> Any:
    import numpy as np

    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, Path):
        return str(v)
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


# ------------------------------------------------------------------ one command's inputs and outputs
_ACTIVE: contextvars.ContextVar[CommandIO | None] = contextvars.ContextVar("routecast_command_io", default=None)
# value -> path for names that stand for files (built-in model names): callables, or "module:function" strings
# imported on first use (cli.py registers one without importing its stage at start-up)
NAME_RESOLVERS: list[Callable[[str], Path | None] | str] = []


def _resolve_name(v: str) -> list[Path]:
    import importlib

    out = []
    for r in NAME_RESOLVERS:
        if isinstance(r, str):
            mod, fn = r.split(":")
            r = getattr(importlib.import_module(mod), fn)
        q = r(v)
        if q is not None:
            out.append(Path(q))
    return out


def _real(p: Path) -> Path:
    """The real path of p, every link on the way resolved except p itself when p is a link (rename replaces a
    link, so the link is what a write would touch); '..' is resolved after the links before it, as the OS does."""
    p = Path(p)
    if p.name in ("", ".", ".."):
        return Path(os.path.realpath(p))
    full = Path(os.path.realpath(p.parent)) / p.name
    return full if full.is_symlink() else Path(os.path.realpath(full))


def claim(path: str | os.PathLike, flag: str, kind: str = "file") -> Path:
    """Claim path as an output of the running command (inputs, links, duplicates checked); no-op outside one."""
    p = Path(path)
    _refuse_link(p, flag)
    io = _ACTIVE.get()
    if io is not None:
        io.claim(flag, p, kind)
    return p


@dataclass
class CommandIO:
    """The declared inputs and claimed outputs of one command run, and what the run created."""

    cmd: str
    overwrite: bool = False
    inputs: list[tuple[str, Path, Path]] = field(default_factory=list)  # (flag, as given, real)
    outputs: list[tuple[str, Path, Path, str]] = field(default_factory=list)  # (flag, as given, real, kind)
    created: set[Path] = field(default_factory=set)

    def input(self, flag: str, value: Any) -> None:
        """Record an input: a path (or comma list of paths) that exists, or a name a resolver maps to one."""
        if value is None or value is False or value == "":
            return
        for v in dict.fromkeys([str(value), *str(value).split(",")]):
            v = v.strip()
            if not v:
                continue
            paths = [Path(v)] if os.path.lexists(v) else _resolve_name(v)
            for q in paths:
                self.inputs.append((flag, Path(v), _real(q)))
                if Path(q).is_symlink():
                    self.inputs.append((flag, Path(v), Path(os.path.realpath(q))))

    def claim(self, flag: str, p: Path, kind: str) -> Path:
        """Check p as an output of kind 'file' or 'dir' against the rules (see the module doc) and record it."""
        _refuse_link(p, flag)
        real = _real(p)
        for iflag, given, ireal in self.inputs:
            rel = ("is" if real == ireal else "lies inside" if ireal in real.parents
                   else "contains" if real in ireal.parents else None)
            if rel:
                raise ConfigError(f"{flag} {p} {rel} the input {iflag} {given}; expected an output path outside "
                                  "every input of the command (the input would be overwritten).")
        for oflag, given, oreal, okind in self.outputs:
            if oflag == flag and (oreal == real or (okind == "dir" and oreal in real.parents)):
                return p  # the same flag checked twice (a handler and its library), or a part of its own folder
            if oreal == real or oreal in real.parents or real in oreal.parents:
                raise ConfigError(f"{flag} {p} and {oflag} {given} name the same place; expected distinct outputs.")
        if kind == "file" and not self.overwrite and p.is_file():
            raise ConfigError(f"{flag} {p} exists; expected a new file (pass --overwrite to replace it).")
        self.outputs.append((flag, p, real, kind))
        return p

    def claimed(self, flag: str) -> bool:
        return any(f == flag for f, *_ in self.outputs)

    def require_claimed(self, p: Path, flag: str) -> None:
        """A write inside a command must land on, or inside, a claimed output."""
        real = _real(p)
        if not any(real == o or (k == "dir" and o in real.parents) or (k == "file" and real.parent == o.parent
                   and real.name.startswith(f".{o.name}")) for _, _, o, k in self.outputs):
            raise RuntimeError(f"routecast {self.cmd} wrote {p} ({flag}) without claiming it through "
                               "routecast.common.outputs; every output must be checked first.")


def current() -> CommandIO | None:
    """The CommandIO of the running command (None outside one)."""
    return _ACTIVE.get()


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def writes(*flags: str, inputs: Iterable[str] = ()) -> Callable:
    """Decorator of a command handler fn(args) -> int: declares its output flags and its input flags (dest names
    or --flags). Runs fn with a CommandIO active; after it returns, each declared output flag with a value must
    have been claimed."""
    ins = tuple(inputs)

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(a: Any) -> Any:
            io = CommandIO(cmd=str(getattr(a, "cmd", fn.__name__)), overwrite=bool(getattr(a, "overwrite", False)))
            for f in (*flags, *ins):  # an empty path is the current folder to pathlib: never what was meant
                v = getattr(a, _dest(f), None)
                if any(isinstance(x, str) and not x.strip() for x in (v if isinstance(v, (list, tuple)) else (v,))):
                    raise ConfigError(f"{f} is empty; expected a path.")
            for f in ins:
                io.input(f, getattr(a, _dest(f), None))
            given = {f: getattr(a, _dest(f), None) for f in flags}
            before = {f: _stamp(v) for f, v in given.items() if v not in (None, False)}
            token = _ACTIVE.set(io)
            try:
                rc = fn(a)
            finally:
                _ACTIVE.reset(token)
            missing = [f for f in before if not io.claimed(f) and f not in getattr(a, "_unclaimed_ok", ())]
            if missing and not rc:
                touched = [f for f in missing if _stamp(given[f]) != before[f]]
                if touched:
                    raise RuntimeError(f"routecast {io.cmd}: {', '.join(touched)} written without being claimed "
                                       "through routecast.common.outputs (a bug).")
                f = missing[0]  # given, never used: the user asked for a file this run does not make
                raise ConfigError(f"{f} {given[f]} was given, but `routecast {io.cmd}` with these arguments writes "
                                  f"nothing there; expected {f} only where the command writes it (see --help).")
            return rc

        run.routecast_writes = flags  # type: ignore[attr-defined]
        run.routecast_inputs = ins  # type: ignore[attr-defined]
        return run

    return deco


def _stamp(v: Any) -> tuple[bool, int, int]:
    """(exists, size, mtime_ns) of an output path as given, to tell a write from no write."""
    try:
        st = os.lstat(str(v))
    except (OSError, ValueError):
        return (False, 0, 0)
    return (True, st.st_size, st.st_mtime_ns)


def declare_inputs(a: Any, flags: Iterable[str]) -> None:
    """Record a's values of flags as inputs of the running command (for handlers that parse their own flags)."""
    io = _ACTIVE.get()
    if io is not None:
        for f in flags:
            io.input(f, getattr(a, _dest(f), None))
        io.overwrite = io.overwrite or bool(getattr(a, "overwrite", False))


def add_overwrite_flags(parser: Any) -> Any:
    """Give every subcommand whose handler declares outputs (@writes) an --overwrite flag if it lacks one."""
    import argparse

    stack = [parser]
    while stack:
        p = stack.pop()
        for act in p._actions:
            if isinstance(act, argparse._SubParsersAction):
                stack.extend(dict.fromkeys(act.choices.values()))
        fn = p._defaults.get("fn")
        flags = getattr(fn, "routecast_writes", ())
        if flags and "--overwrite" not in p._option_string_actions:
            p.add_argument("--overwrite", action="store_true",
                           help=f"replace existing output files ({', '.join(flags)}); without it they are refused")
    return parser


def scratch_dir(out: str | os.PathLike, flag: str) -> Path:
    """A new, uniquely named folder beside out for a write to finish in (a folder that already exists there,
    e.g. a user's .OUT.partial, is never reused or deleted). Recorded as created by this run."""
    p = Path(out)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        d = Path(tempfile.mkdtemp(dir=p.parent, prefix=f".{p.name}.partial-"))
    except OSError as e:
        raise os_error(e, flag, p) from None
    return _record_created(d)


def own_file(path: str | os.PathLike, flag: str) -> Path:
    """Create path exclusively (refused if anything is there) and record it as created by this run. -> path."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode())
        os.close(fd)
    except FileExistsError:
        raise ConfigError(f"{flag}: {p} already exists; expected to create it (routecast never replaces a file "
                          "it did not write; move it away).") from None
    except OSError as e:
        raise os_error(e, flag, p) from None
    return _record_created(p)


_CREATED: set[Path] = set()


def _record_created(p: Path) -> Path:
    """Note p as made by this process (and by the running command): only such paths may remove_own delete."""
    _CREATED.add(_real(p))
    io = _ACTIVE.get()
    if io is not None:
        io.created.add(_real(p))
    return p


def remove_own(path: str | os.PathLike) -> None:
    """Delete a file or folder this process created (own_file / scratch_dir); anything else is a bug."""
    import shutil

    p = Path(path)
    real = _real(p)
    io = _ACTIVE.get()
    if real not in _CREATED and (io is None or real not in io.created):
        raise RuntimeError(f"routecast would delete {p}, which this run did not create (a bug).")
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
    _CREATED.discard(real)
    if io is not None:
        io.created.discard(real)
