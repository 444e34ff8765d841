"""A minimal reader for R's serialization format and lazy-load databases (no R needed).

R packages keep their data sets in a lazy-load database: ``data/Rdata.rdx`` (a gzip-compressed
serialized index: object name -> (byte offset, byte length) in ``Rdata.rdb``) and ``data/Rdata.rdb``
(concatenated blobs: a 4-byte big-endian uncompressed length, an optional 1-byte method tag
``Z`` xz / ``2`` bzip2 / ``0`` none, then the payload, zlib when there is no tag). Each payload is
an object in R's XDR serialization (format ``X\\n``, versions 2 and 3).

This reader supports what data packages hold: character, logical, integer, double, complex and
raw vectors, lists, pairlists (attributes), symbols, environments, references and ALTREP wrappers.
Vectors come back as Python lists/tuples; an object with attributes comes back as ``RObject``.
It is used to extract the novels from the Debian package ``r-cran-janeaustenr``.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from routecast.common.errors import ConfigError

# SEXP type codes (R Internals, "Serialization Formats").
_NIL, _SYM, _LIST, _CLO, _ENV, _PROM, _LANG, _CHAR = 254, 1, 2, 3, 4, 5, 6, 9
_LGL, _INT, _REAL, _CPLX, _STR, _DOT, _VEC, _EXPR, _RAW = 10, 13, 14, 15, 16, 17, 19, 20, 24
_REF, _ALTREP, _NAMESPACE, _PACKAGE = 255, 238, 249, 248
_SINGLETONS = {254, 253, 252, 251, 247, 242, 241}  # NULL, global/empty/base env, unbound, missing
_PAIRLIKE = {_LIST, _CLO, _PROM, _LANG, _DOT}


@dataclass
class RObject:
    """An R value with attributes: ``value`` (list/tuple/...) and ``attrs`` (name -> value)."""

    value: Any
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class RSymbol:
    name: str


class _Reader:
    def __init__(self, data: bytes, origin: str) -> None:
        self.data, self.pos, self.origin = data, 0, origin
        self.refs: list[Any] = []

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ConfigError(f"{self.origin}: R serialized data ends early at byte {self.pos}; expected {n} more bytes.")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def _int(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def _length(self) -> int:
        n = self._int()
        if n == -1:  # long vector: two more ints
            hi, lo = self._int(), self._int()
            n = (hi << 32) + lo
        return n

    def top(self) -> Any:
        magic = self._take(2)
        if magic != b"X\n":
            raise ConfigError(f"{self.origin}: R serialization format {magic!r} is not supported; expected XDR (b'X\\n').")
        version = self._int()
        self._int(), self._int()  # writer R version, minimal reader version
        if version == 3:
            self._take(self._int())  # native encoding name
        elif version != 2:
            raise ConfigError(f"{self.origin}: R serialization version {version} is not supported; expected 2 or 3.")
        return self.item()

    def item(self) -> Any:
        flags = self._int()
        kind = flags & 0xFF
        has_attr = bool(flags & (1 << 9))
        if kind in _SINGLETONS:
            return None
        if kind == _REF:
            idx = flags >> 8 or self._int()
            return self.refs[idx - 1]
        if kind == _SYM:
            sym = RSymbol(self.item())
            self.refs.append(sym)
            return sym
        if kind in (_NAMESPACE, _PACKAGE):
            self._int()  # always 0
            names = [self.item() for _ in range(self._int())]
            self.refs.append(names)
            return names
        if kind == _ENV:
            env: dict[str, Any] = {}
            self.refs.append(env)
            self._int()  # locked flag
            env["enclos"], env["frame"], env["hashtab"], env["attr"] = (self.item() for _ in range(4))
            return env
        if kind in _PAIRLIKE:
            return self._pairlist(flags)
        if kind == _CHAR:
            n = self._int()
            return None if n == -1 else self._take(n).decode("utf-8", "replace")
        if kind == _ALTREP:
            info, state, attr = self.item(), self.item(), self.item()
            return self._altrep(info, state, attr)
        value = self._vector(kind)
        if has_attr:
            return RObject(value, _attrs(self.item()))
        return value

    def _vector(self, kind: int) -> Any:
        n = self._length()
        if kind in (_LGL, _INT):
            return struct.unpack(f">{n}i", self._take(4 * n))
        if kind == _REAL:
            return struct.unpack(f">{n}d", self._take(8 * n))
        if kind == _CPLX:
            return struct.unpack(f">{2 * n}d", self._take(16 * n))
        if kind in (_STR, _VEC, _EXPR):
            return [self.item() for _ in range(n)]
        if kind == _RAW:
            return self._take(n)
        raise ConfigError(f"{self.origin}: R object type {kind} at byte {self.pos} is not supported by this reader.")

    def _pairlist(self, flags: int) -> RObject:
        # Iterative over the CDR chain so long pairlists do not recurse deeply.
        items: list[tuple[Any, Any]] = []
        attrs = None
        while True:
            if flags & (1 << 9):
                attrs = self.item()
            tag = self.item() if flags & (1 << 10) else None
            items.append((tag.name if isinstance(tag, RSymbol) else tag, self.item()))
            flags = self._int()
            if flags & 0xFF == _NIL:
                return RObject(items, _attrs(attrs) if attrs is not None else {})
            if flags & 0xFF not in _PAIRLIKE:
                self.pos -= 4
                items.append((None, self.item()))
                return RObject(items)

    @staticmethod
    def _altrep(info: Any, state: Any, attr: Any) -> Any:
        cls = info.value[0][1].name if isinstance(info, RObject) and info.value else ""
        if cls == "compact_intseq" or cls == "compact_realseq":
            n, start, step = (int(v) if cls == "compact_intseq" else v for v in state)
            value: Any = tuple(start + i * step for i in range(int(n)))
        elif cls.startswith("wrap_"):
            value = state[0] if isinstance(state, list) else state
        else:
            value = state
        return RObject(value, _attrs(attr)) if attr is not None else value


def _attrs(pairlist: Any) -> dict[str, Any]:
    if isinstance(pairlist, RObject):
        return {str(k): v for k, v in pairlist.value}
    return {}


def unserialize(data: bytes, origin: str = "<bytes>") -> Any:
    """Decode one R XDR-serialized object (bytes, already decompressed) into Python values."""
    return _Reader(data, origin).top()


def _inflate(blob: bytes, origin: str) -> bytes:
    tag = blob[4:5]
    if tag == b"Z":
        return lzma.decompress(blob[5:])
    if tag == b"2":
        return bz2.decompress(blob[5:])
    if tag == b"0":
        return blob[5:]
    try:
        return zlib.decompress(blob[4:])
    except zlib.error as exc:
        raise ConfigError(f"{origin}: lazy-load blob is not zlib/xz/bzip2 data ({exc}).") from exc


def read_lazyload(prefix: str | Path) -> dict[str, Any]:
    """Read every object of an R lazy-load database ``prefix.rdx`` + ``prefix.rdb`` -> {name: value}."""
    rdx, rdb = Path(f"{prefix}.rdx"), Path(f"{prefix}.rdb")
    for p in (rdx, rdb):
        if not p.is_file():
            raise ConfigError(f"{p}: R lazy-load file not found; expected the data/ folder of an installed R package.")
    index = unserialize(gzip.decompress(rdx.read_bytes()), str(rdx))
    if not isinstance(index, RObject) or "names" not in index.attrs:
        raise ConfigError(f"{rdx}: not a lazy-load index; expected a named list with 'variables'.")
    top = dict(zip(index.attrs["names"], index.value, strict=True))
    variables = top.get("variables")
    if not isinstance(variables, RObject):
        raise ConfigError(f"{rdx}: lazy-load index has no 'variables' entry.")
    blob = rdb.read_bytes()
    out: dict[str, Any] = {}
    for name, (offset, length) in zip(variables.attrs["names"], variables.value, strict=True):
        out[name] = unserialize(_inflate(blob[offset : offset + length], f"{rdb}:{name}"), f"{rdb}:{name}")
    return out
