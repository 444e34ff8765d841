"""Errors that reach the user as one clear sentence.

Every error raised on bad input names the file or argument, the value, and what was expected.
The CLI turns these into a one-line message on stderr and exit code 2.
"""

from __future__ import annotations


class RoutecastError(Exception):
    """Base class: an error whose message is meant for the user as is."""


class TraceError(RoutecastError, ValueError):
    """A trace (in memory or on disk) is malformed: wrong shape, dtype, id range, NaN, version, file."""


class ConfigError(RoutecastError, ValueError):
    """A configuration, preset, CLI argument or model name is invalid."""


def check(cond: bool, cls: type[RoutecastError], msg: str) -> None:
    """Raise cls(msg) unless cond holds (a one-line guard for validation code)."""
    if not cond:
        raise cls(msg)
