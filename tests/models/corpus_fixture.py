"""Writes the tiny corpus-source fixtures in tests/models/data/ (run as a script to regenerate them).

The Austen and KJV readers parse formats that only exist on machines with two Debian packages installed
(r-cran-janeaustenr, bible-kjv-text). These writers produce small files in the same formats so the readers
run in every test session:
- ``austen/Rdata.rdx`` + ``austen/Rdata.rdb``: an R lazy-load database (gzip'd XDR index; zlib blobs with a
  4-byte length) holding six novels as character vectors of lines, one of them with attributes and NAs;
- ``bible.data``: the 'EC02' container (header, block count, offsets) of Unix-compress (LZW) blocks holding
  one verse line per book for all 66 books.
The text is made up, except a few public-domain opening lines (Genesis 1:1, Revelation 22:21, Pride and
Prejudice's first sentence). Output is deterministic (gzip mtime 0), so a test can compare it to the
committed files.

Usage: python tests/models/corpus_fixture.py  (rewrites tests/models/data/)
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

from routecast.models.sources import _BOOKS

DATA = Path(__file__).parent / "data"

NOVELS = ("emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility")
PRIDE_FIRST = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
               "must be in want of a wife.")
GENESIS_1_1 = "In the beginning God created the heaven and the earth."
REVELATION_22_21 = "The grace of our Lord Jesus Christ be with you all. Amen."
BOOK_NAMES = list(_BOOKS)  # the reader's own list of the 66 books, in order


# ---- R XDR serialization (version 2) -----------------------------------------------------------------
def _i(*v: int) -> bytes:
    return struct.pack(f">{len(v)}i", *v)


def _charsxp(s: str | None) -> bytes:
    if s is None:
        return _i(9, -1)  # NA_character_
    b = s.encode()
    return _i(9 | (1 << 15), len(b)) + b  # UTF-8 flag, as R writes non-ASCII-safe strings


def _attrs(attrs: dict[str, bytes]) -> bytes:
    """A tagged pairlist (name -> already serialized value) terminated by NULL."""
    out = b""
    for name, value in attrs.items():
        out += _i(2 | (1 << 10)) + _i(1) + _charsxp(name) + value
    return out + _i(254)


def r_strings(values: list[str | None], attrs: dict[str, bytes] | None = None) -> bytes:
    """STRSXP body (no header), with attributes when given."""
    flags = 16 | ((1 << 9) if attrs else 0)
    body = _i(flags, len(values)) + b"".join(_charsxp(v) for v in values)
    return body + (_attrs(attrs) if attrs else b"")


def r_ints(values: list[int]) -> bytes:
    return _i(13, len(values), *values)


def r_named_list(items: dict[str, bytes]) -> bytes:
    """VECSXP of serialized items with a 'names' attribute."""
    body = _i(19 | (1 << 9), len(items)) + b"".join(items.values())
    return body + _attrs({"names": r_strings(list(items))})


def r_serialize(body: bytes) -> bytes:
    return b"X\n" + _i(2, 0x40200, 0x20300) + body


def write_lazyload(prefix: Path, objects: dict[str, bytes]) -> None:
    """prefix.rdb (4-byte length + zlib blob per object) and prefix.rdx (gzip'd index of offsets)."""
    rdb, where = b"", {}
    for name, body in objects.items():
        raw = r_serialize(body)
        blob = struct.pack(">I", len(raw)) + zlib.compress(raw, 9)
        where[name] = r_ints([len(rdb), len(blob)])
        rdb += blob
    index = r_named_list({"variables": r_named_list(where), "references": _i(19, 0), "compressed": _i(10, 1, 1)})
    prefix.with_suffix(".rdb").write_bytes(rdb)
    prefix.with_suffix(".rdx").write_bytes(gzip.compress(r_serialize(index), mtime=0))


def novel_lines(key: str, chapters: int) -> list[str | None]:
    """Title, then `chapters` chapters of hard-wrapped paragraphs (the janeaustenr layout)."""
    lines: list[str | None] = [key.upper(), "", "by Jane Austen", ""]
    for c in range(1, chapters + 1):
        lines += [f"CHAPTER {c}" if c % 2 else f"Chapter {'I' * c if c < 4 else c}", ""]
        if key == "prideprejudice" and c == 1:
            lines += [PRIDE_FIRST[:60], PRIDE_FIRST[60:], ""]
        lines += [f"Paragraph one of chapter {c} of {key},", "wrapped over two lines.", "", None,
                  f"Paragraph two of chapter {c}.", ""]
    return lines


# ---- 'EC02' LZW container ----------------------------------------------------------------------------
def lzw_literals(data: bytes) -> bytes:
    """A valid Unix-compress block-mode stream (no 3-byte header) that codes every byte as a literal.

    Codes are 9 bits, packed LSB-first in groups of 8 (9 bytes). The decoder grows its table by one entry
    per code and widens codes at 512 entries, so a CLEAR (256) goes out every 248 literals; the rest of the
    CLEAR's group is padding, as in real streams.
    """
    out = bytearray()
    codes = list(data)
    for start in range(0, len(codes), 248):
        chunk = codes[start : start + 248]
        for g in range(0, len(chunk), 8):
            group = chunk[g : g + 8]
            bits = sum(c << (9 * i) for i, c in enumerate(group))
            out += bits.to_bytes(9, "little")[: (9 * len(group) + 7) // 8 if len(group) < 8 else 9]
        if start + 248 < len(codes):
            out += (256).to_bytes(9, "little")  # CLEAR, then padding to the group end
    return bytes(out)


def write_bible(path: Path, block_size: int = 1024, books: tuple[str, ...] | list[str] = tuple(BOOK_NAMES)) -> None:
    """One or two verse lines per book in `books`, split into `block_size`-byte LZW blocks."""
    lines = []
    for i, name in enumerate(books):
        key = name.replace("_", "")[:5]
        if name == "Genesis":
            lines += [f"{key}1:1 {GENESIS_1_1}", f"{key}1:2 And a made-up second verse."]
        elif name == "Revelation":
            lines += [f"{key}22:21 {REVELATION_22_21}"]
        else:
            lines += [f"{key}1:1 Verse one of book {i + 1}.", f"{key}1:2 Verse two of book {i + 1}."]
    text = ("Header line that is not a verse\n" + "\n".join(lines) + "\n").encode("latin-1")
    blocks = [text[a : a + block_size] for a in range(0, len(text), block_size)]
    payloads = [lzw_literals(b) for b in blocks]
    header = b"EC02" + b"\0" * (0x54 - 4) + struct.pack(">II", block_size, len(blocks))
    offsets, pos = [], len(header) + 4 * (len(blocks) + 1)
    for p in payloads:
        offsets.append(pos)
        pos += len(p)
    offsets.append(pos)
    path.write_bytes(header + struct.pack(f">{len(offsets)}I", *offsets) + b"".join(payloads))


def write_all(root: Path = DATA) -> None:
    (root / "austen").mkdir(parents=True, exist_ok=True)
    objects = {}
    for i, key in enumerate(NOVELS):
        lines = novel_lines(key, chapters=2 + i % 3)
        # One novel carries attributes (an RObject on read), as some R character vectors do.
        objects[key] = r_strings(lines, {"class": r_strings(["character"])} if key == "emma" else None)
    objects["unrelated"] = r_ints([1, 2, 3])  # the database may hold other objects
    write_lazyload(root / "austen" / "Rdata", objects)
    write_bible(root / "bible.data")


if __name__ == "__main__":
    write_all()
    print(f"wrote {DATA}")
