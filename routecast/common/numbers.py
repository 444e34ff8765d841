"""Numeric flags: one parser for type, finiteness, minimum and maximum, used as argparse `type=` by every flag.

    integer(lo, hi) / real(lo, hi, ...)   a Number: parse('12') -> 12; bad text -> one sentence, exit code 2
    seed(), threads(), loader_threads(), nproc(), fraction(), count_by_memory(bytes_each)
                                          the shared bounds (machine-derived where a flag starts work per unit)
    budget_text()                         '50%' / '96' / '12GB' checked for syntax and finiteness (the slot count
                                          is bounded by the model later, cache/replay.py parse_budget)
    check_max_new_tokens(n, context, prompt)   the bound that needs the model: new tokens <= context - prompt
    annotate_help(parser)                 appends each Number's range to its --help line (every subparser)

Why one parser: a flag parsed with plain `int` accepts -1, 0 and a 400-digit number, and `float` accepts NaN,
inf and 1e308; each of those used to reach numpy or torch as an OverflowError, a ZeroDivisionError, a segfault
(a million threads) or an unbounded allocation. A Number refuses them at parse time, before any work.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from routecast.common.errors import ConfigError

SEED_MAX = 2**32 - 1  # numpy's SeedSequence takes any int, but torch.manual_seed and MT19937 want 32 bits
_INT_RE = re.compile(r"[+-]?[0-9]+")
_MAX_TEXT = 40  # characters: no valid value of any flag is longer; a 400-digit number is refused unread
_BUDGET_RE = re.compile(r"([0-9]*\.?[0-9]+)\s*(%|[kmgt]i?b|b)?")


def cores() -> int:
    """CPU cores this process may run on (the affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def memory_bytes() -> int:
    """Physical memory of the machine, bytes (8 GiB when the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return 8 << 30


def _fmt(v: float | int) -> str:
    if isinstance(v, int):
        return f"{v:,}".replace(",", "_") if abs(v) >= 10**6 else str(v)
    return f"{v:g}"


@dataclass(frozen=True, kw_only=True)
class Number:
    """An argparse `type=` for one numeric flag: kind (int or float), finite, within [lo, hi] (open ends where
    lo_open / hi_open), with `why` saying where the upper bound comes from (shown in --help and errors)."""

    kind: type = int
    lo: float | int | None = None
    hi: float | int | None = None
    lo_open: bool = False
    hi_open: bool = False
    why: str = ""

    @property
    def __name__(self) -> str:  # argparse names the type in some messages
        return "integer" if self.kind is int else "number"

    def describe(self) -> str:
        """The accepted range as text, e.g. 'an integer in [1, 2] (the machine's cores)'."""
        what = "an integer" if self.kind is int else "a finite number"
        if self.lo is None and self.hi is None:
            return what
        a = "(" if self.lo_open else "["
        b = ")" if self.hi_open else "]"
        lo = "-inf" if self.lo is None else _fmt(self.lo)
        hi = "inf" if self.hi is None else _fmt(self.hi)
        return f"{what} in {a}{lo}, {hi}{b}" + (f" ({self.why})" if self.why else "")

    def parse(self, text: Any) -> int | float:
        """text (str, int or float) -> the value; ValueError('is TEXT, why; expected ...') otherwise."""
        exp = f"; expected {self.describe()}"
        if isinstance(text, bool):
            raise ValueError(f"is {text}, a boolean{exp}")
        if isinstance(text, float) and self.kind is int:
            raise ValueError(f"is {text!r}, not a whole number{exp}")
        if isinstance(text, int | float):
            v = self.kind(text)
        else:
            s = str(text).strip()
            if len(s) > _MAX_TEXT:
                raise ValueError(f"is a {len(s)}-character value ({s[:12]}...){exp}")
            if self.kind is int:
                if not _INT_RE.fullmatch(s):
                    raise ValueError(f"is {s!r}, not a whole number{exp}")
                v = int(s)
            else:
                try:
                    v = float(s)
                except ValueError:
                    raise ValueError(f"is {s!r}, not a number{exp}") from None
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"is {text}, not finite{exp}")
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            raise ValueError(f"is {text}{exp}")
        if self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)):
            raise ValueError(f"is {text}{exp}")
        return v

    def __call__(self, text: Any) -> int | float:
        try:
            return self.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{e}.") from None

    def check(self, value: Any, flag: str) -> int | float:
        """The same rules outside argparse (a value from a file or a Python caller): ConfigError naming flag."""
        try:
            return self.parse(value)
        except ValueError as e:
            raise ConfigError(f"{flag} {e}.") from None


def integer(lo: int | None = None, hi: int | None = None, *, why: str = "") -> Number:
    """An integer flag in [lo, hi]."""
    return Number(kind=int, lo=lo, hi=hi, why=why)


def real(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
         why: str = "") -> Number:
    """A finite float flag within the bounds (open ends where asked)."""
    return Number(kind=float, lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open, why=why)


def positive(hi: int = 10**9, *, why: str = "") -> Number:
    """An integer >= 1 (counts: epochs, steps, ranks, batch sizes); hi bounds the work it starts."""
    return integer(1, hi, why=why)


def nonneg(hi: int = 10**9, *, why: str = "") -> Number:
    """An integer >= 0 (offsets, optional caps where 0 means none)."""
    return integer(0, hi, why=why)


def seed() -> Number:
    """A random seed: [0, 2**32 - 1] (what torch and numpy's MT19937 accept)."""
    return integer(0, SEED_MAX, why="32-bit seeds")


def threads() -> Number:
    """Compute threads: 1 to 2 x the machine's cores (more only oversubscribes them)."""
    n = cores()
    return integer(1, 2 * n, why=f"2 x the {n} core(s) of this machine")


def loader_threads() -> Number:
    """I/O threads: 1 to 4 x the machine's cores (reads wait on the disk, so a few per core help; thousands do not)."""
    n = cores()
    return integer(1, 4 * n, why=f"4 x the {n} core(s) of this machine")


def nproc() -> Number:
    """Processes started on this machine: 1 to 4 x its cores (each holds the model; more only thrash)."""
    n = cores()
    return integer(1, 4 * n, why=f"4 x the {n} core(s) of this machine")


def count_by_memory(bytes_each: int, *, lo: int = 1, share: float = 0.5, what: str = "items") -> Number:
    """A count whose memory grows with it: at most share x this machine's memory / bytes_each."""
    mem = memory_bytes()
    hi = max(lo, int(mem * share // max(1, bytes_each)))
    return integer(lo, hi, why=f"{what} of ~{_fmt_bytes(bytes_each)} each in half of this machine's "
                               f"{mem / 2**30:.0f} GiB")


def _fmt_bytes(b: int) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= k:
            return f"{b / k:.3g} {unit}"
    return f"{b} B"


def fraction(*, lo_open: bool = True, hi_open: bool = False) -> Number:
    """A share in (0, 1] by default."""
    return real(0.0, 1.0, lo_open=lo_open, hi_open=hi_open)


def check_max_new_tokens(n: int, context: int, prompt: int, flag: str = "--max-new-tokens") -> int:
    """New tokens after a prompt of `prompt` tokens must fit the model's `context` positions. -> n."""
    room = int(context) - int(prompt)
    if room < 1:
        raise ConfigError(f"the longest prompt has {prompt} tokens, which fills the model's {context} positions; "
                          "expected shorter prompts.")
    if not 1 <= n <= room:
        raise ConfigError(f"{flag} is {n}; expected 1..{room} (the model's {context} positions minus the longest "
                          f"prompt's {prompt} tokens).")
    return n


@dataclass(frozen=True)
class BudgetText:
    """argparse `type=` for a budget: a percentage '50%', a count '96' or bytes '12GB' (comma lists where
    allow_list). Checks the syntax and that each value is finite and > 0; the bound by the model's experts
    (<= L x E) comes once the model is known."""

    allow_list: bool = False
    allow_bytes: bool = True

    def __call__(self, text: Any) -> str:
        s = str(text).strip()
        parts = [x.strip() for x in s.split(",")] if self.allow_list else [s]
        what = "a percentage ('50%'), an expert count ('96')" + (" or bytes ('12GB')" if self.allow_bytes else "")
        if len(s) > 4 * _MAX_TEXT or not all(parts):
            raise argparse.ArgumentTypeError(f"is {s[:24]!r}, not a budget; expected {what}.")
        for x in parts:
            m = _BUDGET_RE.fullmatch(x.lower())
            if len(x) > _MAX_TEXT or not m or (m.group(2) not in (None, "%") and not self.allow_bytes):
                raise argparse.ArgumentTypeError(f"is {x[:24]!r}, not a budget; expected {what}.")
            v = float(m.group(1))
            if not math.isfinite(v) or v <= 0:  # the upper bound needs the model: parse_budget checks it
                raise argparse.ArgumentTypeError(f"is {x!r}, out of range; expected {what} above 0.")
        return s


def budget_text(*, allow_list: bool = False, allow_bytes: bool = True) -> BudgetText:
    """See BudgetText."""
    return BudgetText(allow_list=allow_list, allow_bytes=allow_bytes)


NUMERIC_TYPES = (Number, BudgetText)


class UsageError(ConfigError):
    """A command line argparse refused; `prog` names the (sub)command."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """routecast's ArgumentParser: an unusable command line is one sentence (UsageError, exit code 2 in the CLI)
    instead of argparse's usage block; subparsers inherit the class. 'argument --x: is 0; expected ...' reads
    '--x is 0; expected ...'."""

    def error(self, message: str):  # type: ignore[override]
        m = re.fullmatch(r"argument ([^:]+): (.*)", message, re.S)
        if m:
            flag, rest = m.group(1).split("/")[-1], m.group(2)
            message = f"{flag} {rest}" if rest.startswith("is ") else f"{flag}: {rest}"
        message = message.rstrip(".") + "."
        raise UsageError(self.prog, message)


def _subparsers(p: argparse.ArgumentParser) -> Iterable[argparse.ArgumentParser]:
    for act in p._actions:
        if isinstance(act, argparse._SubParsersAction):
            yield from dict.fromkeys(act.choices.values())


def walk(p: argparse.ArgumentParser, prefix: str = "") -> Iterable[tuple[str, argparse.ArgumentParser]]:
    """(command path, parser) for p and every subparser below it."""
    yield prefix or p.prog, p
    for act in p._actions:
        if isinstance(act, argparse._SubParsersAction):
            for name, sp in act.choices.items():
                yield from walk(sp, f"{prefix} {name}".strip())


def annotate_help(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Append every Number flag's accepted range to its help line, in p and all its subparsers. -> p."""
    for _, sp in walk(p):
        for act in sp._actions:
            if isinstance(act.type, Number) and act.help and "[accepts" not in act.help:
                act.help = f"{act.help} [accepts {act.type.describe()}]"
    return p
