"""Files a command reads besides traces: read and checked in one place, one sentence naming the file, the field
and what was expected (ConfigError, exit code 2).

    read_json(path, flag) / read_toml(path, flag) / read_jsonl(path, flag)   bytes -> documents; binary garbage,
                                       bad UTF-8, bad syntax, a missing file, a folder: one sentence each
    parse(Model, doc, path, flag)      a pydantic (v2) model of the document's scalars and structure
    int_array / float_array(...)       the document's big tables, checked vectorised with numpy (shape, dtype,
                                       range, finiteness) instead of element by element
    load_int_npy(path, flag, ...)      a .npy table of integers (e.g. --token-ranks): shape, integer dtype (float
                                       ranks are refused, not truncated), range; never unpickles

pydantic is used for the structure (field names, types, strict ints, nested shapes of small documents) because
its errors carry the field's location, which becomes the sentence; numeric tables of up to millions of values
are left to numpy, which checks them in one pass.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated, Any, TypeVar

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from routecast.common.errors import ConfigError

MAX_BYTES = 1 << 30  # a plan, a map, a profile or a prompt file beyond 1 GiB is not one routecast wrote
M = TypeVar("M", bound=BaseModel)


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError("a finite number")
    return v


Finite = Annotated[float, AfterValidator(_finite)]


class Strict(BaseModel):
    """Base of the file schemas: strict types (no '3' for 3, no 1.5 for an int), unknown keys kept out."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


def _read_bytes(path: str | os.PathLike, flag: str, what: str) -> bytes:
    p = Path(path)
    try:
        if p.is_dir():
            raise ConfigError(f"{flag} {p} is a folder; expected {what}.")
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(f"{flag} {p} is {size / 2**30:.1f} GiB; expected {what} under {MAX_BYTES >> 30} GiB.")
        return p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{flag} {p}: no such file; expected {what}.") from None
    except OSError as e:
        raise ConfigError(f"{flag} {p} cannot be read ({e.strerror or e}); expected {what}.") from None


def _text(raw: bytes, p: Path, flag: str, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{flag} {p} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                          f"expected {what}.") from None


def read_json(path: str | os.PathLike, flag: str, what: str = "a JSON file") -> Any:
    """The JSON document at path; one sentence for a missing/binary/invalid file."""
    p = Path(path)
    text = _text(_read_bytes(p, flag, what), p, flag, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag} {p} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                          f"expected {what}.") from None
    except (ValueError, RecursionError) as e:  # a 5000-digit integer, nesting deeper than the parser's stack
        raise ConfigError(f"{flag} {p} holds a value JSON readers refuse ({str(e)[:80]}); expected {what}.") from None


def read_toml(path: str | os.PathLike, flag: str, what: str = "a TOML file") -> dict[str, Any]:
    """The TOML document at path; one sentence for a missing/binary/invalid file."""
    import tomllib

    p = Path(path)
    text = _text(_read_bytes(p, flag, what), p, flag, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{flag} {p} is not valid TOML ({e}); expected {what}.") from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{flag} {p} holds a value TOML readers refuse ({str(e)[:80]}); expected {what}.") from None


def read_jsonl(path: str | os.PathLike, flag: str, what: str = "a JSON-lines file") -> list[tuple[int, Any]]:
    """(line number, object) for every non-blank line; one sentence naming the first bad line."""
    p = Path(path)
    text = _text(_read_bytes(p, flag, what), p, flag, what)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{flag} {p} line {n} is not valid JSON ({e.msg}); expected {what}.") from None
        except (ValueError, RecursionError) as e:
            raise ConfigError(f"{flag} {p} line {n} holds a value JSON readers refuse ({str(e)[:60]}); "
                              f"expected {what}.") from None
    return out


def _loc(loc: tuple[Any, ...]) -> str:
    s = ""
    for x in loc:
        s += f"[{x}]" if isinstance(x, int) else (f".{x}" if s else str(x))
    return s or "the document"


def parse(model: type[M], doc: Any, path: str | os.PathLike, flag: str, what: str = "") -> M:
    """doc validated by the pydantic model -> its instance; ConfigError naming the first bad field otherwise."""
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        msg = str(err.get("msg", "")).replace("Value error, ", "").replace("Input should be ", "")
        msg = msg[:1].lower() + msg[1:]
        if err.get("type") == "missing":
            return _raise(f"{flag} {path}: field {_loc(err['loc'])} is missing; expected "
                          f"{what or model.__doc__.split(':')[0].strip().rstrip('.')}.")
        shown = repr(err.get("input"))
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return _raise(f"{flag} {path}: field {_loc(err['loc'])} is {shown}; expected {msg}.")


def _raise(msg: str):
    raise ConfigError(msg)


def int_array(v: Any, field: str, path: Any, flag: str, *, ndim: int, lo: int | None = None, hi: int | None = None,
              shape: tuple[int | None, ...] | None = None, nonempty: bool = True) -> np.ndarray:
    """A nested list (or array) of integers as int64, checked: ndim, shape (None = any), lo <= v <= hi."""
    where = f"{flag} {path}: field {field}"
    try:
        a = np.asarray(v)
    except (ValueError, TypeError, OverflowError):
        raise ConfigError(f"{where} is not a rectangular table; expected {ndim}-D integers.") from None
    if a.dtype.kind == "O":
        raise ConfigError(f"{where} holds values that are not 64-bit integers (mixed types or beyond int64); "
                          f"expected {ndim}-D integers.")
    if a.dtype.kind not in "iu" and not (a.size == 0 and a.dtype.kind == "f"):
        kind = {"f": "floats", "b": "booleans", "U": "strings"}.get(a.dtype.kind, str(a.dtype))
        raise ConfigError(f"{where} holds {kind}; expected {ndim}-D integers.")
    if a.ndim != ndim:
        raise ConfigError(f"{where} has shape {a.shape}; expected {ndim}-D integers.")
    if nonempty and a.size == 0:
        raise ConfigError(f"{where} is empty; expected at least one value.")
    if shape is not None and any(s is not None and s != n for s, n in zip(shape, a.shape, strict=True)):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ConfigError(f"{where} has shape {a.shape}; expected {want}.")
    if a.dtype == np.uint64 and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ConfigError(f"{where} holds {int(a.max())}, beyond int64; expected values in range.")
    a = a.astype(np.int64)
    if a.size and ((lo is not None and int(a.min()) < lo) or (hi is not None and int(a.max()) > hi)):
        bad = int(a.min()) if lo is not None and int(a.min()) < lo else int(a.max())
        raise ConfigError(f"{where} holds {bad}; expected values in [{'-inf' if lo is None else lo}, "
                          f"{'inf' if hi is None else hi}].")
    return a


def float_array(v: Any, field: str, path: Any, flag: str, *, ndim: int, lo: float | None = None,
                hi: float | None = None, shape: tuple[int | None, ...] | None = None) -> np.ndarray:
    """A nested list of finite numbers as float64, checked: ndim, shape, lo <= v <= hi."""
    where = f"{flag} {path}: field {field}"
    try:
        a = np.asarray(v, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):
        raise ConfigError(f"{where} is not a rectangular table of numbers; expected {ndim}-D numbers.") from None
    if a.ndim != ndim and not (a.size == 0 and shape is not None):
        raise ConfigError(f"{where} has shape {a.shape}; expected {ndim}-D numbers.")
    if shape is not None:
        want = tuple(n if s is None else s for s, n in zip(shape, a.shape + (0,) * len(shape), strict=False))
        if a.size == 0 and 0 in want:
            a = a.reshape(want)
        if a.shape != want:
            raise ConfigError(f"{where} has shape {a.shape}; expected {want}.")
    if not np.isfinite(a).all():
        raise ConfigError(f"{where} holds NaN or infinity; expected finite numbers.")
    if a.size and ((lo is not None and a.min() < lo) or (hi is not None and a.max() > hi)):
        raise ConfigError(f"{where} holds values outside [{lo}, {hi}]; expected values in range.")
    return a


def load_int_npy(path: str | os.PathLike, flag: str, *, shapes: tuple[tuple[int, ...], ...] | None = None,
                 lo: int = 0, hi: int | None = None) -> np.ndarray:
    """A .npy of integers with one of the allowed shapes, values in [lo, hi], as int64; never unpickles."""
    p = Path(path)
    want = " or ".join(str(s) for s in shapes) if shapes else "any shape"
    what = f"a .npy of integers of shape {want} in [{lo}, {'inf' if hi is None else hi}]"
    raw = _read_bytes(p, flag, what)
    if not raw.startswith(b"\x93NUMPY"):
        raise ConfigError(f"{flag} {p} is not a .npy file (no NumPy header); expected {what}.")
    import io

    try:
        a = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise ConfigError(f"{flag} {p} cannot be read as .npy ({str(e)[:80]}); expected {what}.") from None
    if a.dtype.kind not in "iu":
        raise ConfigError(f"{flag} {p} holds {a.dtype} values; expected {what} (floats are refused, not truncated).")
    if shapes and a.shape not in shapes:
        raise ConfigError(f"{flag} {p} has shape {a.shape}; expected {what}.")
    return int_array(a, "(array)", p, flag, ndim=a.ndim, lo=lo, hi=hi)
