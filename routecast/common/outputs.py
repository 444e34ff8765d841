"""Output paths: check them before any work, write files atomically with the user's umask, never clobber.

Every command that writes checks its output first (check_out_dir / check_out_file), so a wrong path
costs one sentence and exit code 2 instead of a traceback after minutes of work. The rules:
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

import errno
import os
from collections.abc import Callable, Iterable
from pathlib import Path

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


def check_out_file(path: str | os.PathLike, flag: str) -> Path:
    """A file output (a PNG, a TOML): not a directory, parents directories, writable. -> Path."""
    p = Path(path)
    if str(path) == "" or p.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a directory; expected a file path.")
    if p.exists() and not p.is_file():
        raise ConfigError(f"{flag} {p} is not a regular file (a device or a pipe); expected a file path.")
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


def write_atomic(path: str | os.PathLike, data: bytes | str, flag: str) -> Path:
    """Write data to path via a temp file beside it, fsync, rename; mode per umask; errors as one sentence."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise os_error(e, flag, p) from None
    return p
