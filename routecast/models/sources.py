"""Readers that turn the raw corpus sources into documents: (doc_id, text) pairs, one list per task.

| task     | source on a Debian 12 machine                                  | one document       |
|----------|----------------------------------------------------------------|--------------------|
| `code`   | CPython standard library ``/usr/lib/python3.11/**/*.py``       | a source file      |
| `docs`   | ``python3.11-doc``: ``/usr/share/doc/python3.11/html/_sources``| an ``.rst.txt`` page |
| `austen` | ``r-cran-janeaustenr``: R lazy-load database of six novels     | a chapter          |
| `bible`  | ``bible-kjv-text``: ``/usr/lib/bible.data`` (LZW blocks)       | a book             |
| `wiki`   | gensim wheel test data: a shortened enwiki XML dump (bz2)      | an article         |

Every reader is deterministic (sorted file order, no randomness), so a rebuild on another machine
with the same package versions gives byte-identical documents.
"""

from __future__ import annotations

import bz2
import html
import re
import struct
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

from routecast.common.errors import ConfigError
from routecast.models.rdata import RObject, read_lazyload

Docs = list[tuple[str, str]]

# Library folders that are not representative hand-written code (test suites, generated codec tables,
# a giant docstring dump) or are not the standard library at all.
_CODE_SKIP = ("test", "tests", "idlelib", "lib2to3", "encodings", "pydoc_data", "site-packages",
              "dist-packages", "__pycache__", "ensurepip", "turtledemo")


def _require_dir(path: Path, what: str, hint: str) -> Path:
    if not path.is_dir():
        raise ConfigError(f"{what} folder {path} does not exist; {hint}")
    return path


def read_code(root: str | Path = "/usr/lib/python3.11") -> Docs:
    """Python source files under root (str paths, UTF-8 text) -> [(relative path, text)]."""
    root = _require_dir(Path(root), "code", "expected a CPython standard library (e.g. /usr/lib/python3.11).")
    docs = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if any(part in _CODE_SKIP or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        if rel.name.startswith("_sysconfigdata"):
            continue  # machine-specific build configuration, not code anyone wrote
        text = p.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            docs.append((rel.as_posix(), text))
    return docs


def read_docs(root: str | Path = "/usr/share/doc/python3.11/html/_sources") -> Docs:
    """reStructuredText sources of the Python documentation -> [(relative path, text)]."""
    root = _require_dir(Path(root), "docs", "install it with `apt-get install python3.11-doc`.")
    docs = []
    for p in sorted(root.rglob("*.rst.txt")):
        text = p.read_text(encoding="utf-8", errors="replace")
        if len(text.strip()) >= 200:  # skip stub index pages that hold only a toctree
            docs.append((p.relative_to(root).as_posix(), text))
    return docs


_AUSTEN_TITLES = {
    "emma": "Emma", "mansfieldpark": "Mansfield Park", "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion", "prideprejudice": "Pride and Prejudice",
    "sensesensibility": "Sense and Sensibility",
}
_CHAPTER = re.compile(r"^\s*chapter\s+([0-9]+|[ivxlc]+)\b", re.IGNORECASE)


def _unwrap(lines: list[str]) -> str:
    """Hard-wrapped lines (Project Gutenberg style) -> one line per paragraph."""
    paras, cur = [], []
    for line in lines:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    if cur:
        paras.append(" ".join(cur))
    return "\n\n".join(paras)


def read_austen(data_dir: str | Path = "/usr/lib/R/site-library/janeaustenr/data") -> Docs:
    """Jane Austen's six novels from the R package's lazy-load database -> one document per chapter."""
    data_dir = _require_dir(Path(data_dir), "austen", "install it with `apt-get install r-cran-janeaustenr`.")
    objects = read_lazyload(data_dir / "Rdata")
    docs = []
    for key, title in _AUSTEN_TITLES.items():
        lines = objects.get(key)
        if isinstance(lines, RObject):
            lines = lines.value
        if not isinstance(lines, list):
            raise ConfigError(f"{data_dir}: R object '{key}' is missing or not a character vector of lines.")
        lines = [line or "" for line in lines]
        starts = [i for i, line in enumerate(lines) if _CHAPTER.match(line)]
        for n, (a, b) in enumerate(zip(starts, starts[1:] + [len(lines)], strict=True), start=1):
            body = _unwrap(lines[a + 1 : b])
            if body:
                docs.append((f"{key}/chapter{n:03d}", f"{title}\n\nChapter {n}\n\n{body}\n"))
    return docs


def unlzw(data: bytes, max_bits: int = 16) -> bytes:
    """Decode a Unix ``compress`` (LZW, block mode) stream without its 3-byte header (bytes -> bytes).

    Codes are packed LSB-first in groups of 8; when the code width grows or a CLEAR (256) arrives,
    the rest of the current group is padding, which is why reading goes group by group.
    """
    out = bytearray()
    n_bits, table = 9, [bytes([i]) for i in range(256)] + [b""]
    prev: bytes | None = None
    pos = 0
    while pos < len(data):
        group = data[pos : pos + n_bits]
        pos += n_bits
        bits, width = int.from_bytes(group, "little"), n_bits
        for i in range(len(group) * 8 // width):
            code = (bits >> (i * width)) & ((1 << width) - 1)
            if code == 256:
                table, prev, n_bits = table[:257], None, 9
                break
            if code < len(table):
                entry = table[code]
                if prev is not None:
                    table.append(prev + entry[:1])
            elif code == len(table) and prev is not None:
                entry = prev + prev[:1]
                table.append(entry)
            else:
                raise ConfigError(f"LZW stream has code {code} at byte {pos} beyond table size {len(table)}.")
            out += entry
            prev = entry
            if len(table) > (1 << n_bits) - 1 and n_bits < max_bits:
                n_bits += 1
                break
    return bytes(out)


_BOOKS = (
    "Genesis Exodus Leviticus Numbers Deuteronomy Joshua Judges Ruth 1_Samuel 2_Samuel 1_Kings 2_Kings "
    "1_Chronicles 2_Chronicles Ezra Nehemiah Esther Job Psalms Proverbs Ecclesiastes Song_of_Solomon "
    "Isaiah Jeremiah Lamentations Ezekiel Daniel Hosea Joel Amos Obadiah Jonah Micah Nahum Habakkuk "
    "Zephaniah Haggai Zechariah Malachi Matthew Mark Luke John Acts Romans 1_Corinthians 2_Corinthians "
    "Galatians Ephesians Philippians Colossians 1_Thessalonians 2_Thessalonians 1_Timothy 2_Timothy "
    "Titus Philemon Hebrews James 1_Peter 2_Peter 1_John 2_John 3_John Jude Revelation"
).split()
_VERSE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def read_bible_text(path: str | Path = "/usr/lib/bible.data") -> str:
    """The ``bible-kjv-text`` data file (header, block offsets, LZW blocks) -> its plain text (str)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"bible file {path} does not exist; install it with `apt-get install bible-kjv-text`.")
    raw = path.read_bytes()
    if not raw.startswith(b"EC02"):
        raise ConfigError(f"{path}: header {raw[:4]!r} is not the bible-kjv 'EC02' compressed format.")
    # Header: 84 bytes of magic, then block size and block count, then count+1 big-endian offsets.
    n_blocks = struct.unpack(">I", raw[0x58:0x5C])[0]
    offsets = struct.unpack(f">{n_blocks + 1}I", raw[0x5C : 0x5C + 4 * (n_blocks + 1)])
    text = b"".join(unlzw(raw[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True))
    return text.decode("latin-1")


def read_bible(path: str | Path = "/usr/lib/bible.data") -> Docs:
    """King James Bible -> one document per book (66), verses as '<chapter>:<verse> text' lines."""
    books: dict[str, list[str]] = {}
    for line in read_bible_text(path).splitlines():
        m = _VERSE.match(line)
        if m:
            books.setdefault(m.group(1), []).append(f"{m.group(2)}:{m.group(3)} {m.group(4)}")
    if len(books) != len(_BOOKS):
        raise ConfigError(f"{path}: found {len(books)} books of the Bible; expected {len(_BOOKS)}.")
    docs = []
    for i, verses in enumerate(books.values()):
        name = _BOOKS[i].replace("_", " ")
        docs.append((f"{i + 1:02d}_{_BOOKS[i]}", f"The Book of {name}\n\n" + "\n".join(verses) + "\n"))
    return docs


WIKI_MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


def _strip_nested(text: str, open_: str, close: str) -> str:
    """Remove balanced open_ ... close spans (nesting allowed), e.g. templates {{ ... }}."""
    out, depth, i = [], 0, 0
    while i < len(text):
        if text.startswith(open_, i):
            depth, i = depth + 1, i + len(open_)
        elif depth and text.startswith(close, i):
            depth, i = depth - 1, i + len(close)
        else:
            if not depth:
                out.append(text[i])
            i += 1
    return "".join(out)


def _drop_file_links(text: str) -> str:
    """Remove [[File:...]] / [[Image:...]] / [[Category:...]] links, whose captions nest other links."""
    pattern = re.compile(r"\[\[(?:File|Image|Category|[a-z]{2,3}(?:-[a-z]+)?):", re.IGNORECASE)
    while (m := pattern.search(text)) is not None:
        depth, i = 0, m.start()
        while i < len(text):
            if text.startswith("[[", i):
                depth, i = depth + 1, i + 2
            elif text.startswith("]]", i):
                depth, i = depth - 1, i + 2
                if depth == 0:
                    break
            else:
                i += 1
        text = text[: m.start()] + text[i:]
    return text


def strip_wiki_markup(text: str) -> str:
    """MediaWiki source (str) -> readable plain text: templates, tables, refs, files and tags removed."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)
    text = re.sub(r"<ref[^>/]*/>", "", text)
    text = re.sub(r"<ref[^>]*>.*?</ref>", "", text, flags=re.DOTALL)
    text = re.sub(r"<(gallery|math|timeline|imagemap|score)[^>]*>.*?</\1>", "", text, flags=re.DOTALL)
    text = _strip_nested(text, "{{", "}}")
    text = _strip_nested(text, "{|", "|}")
    text = _drop_file_links(text)
    text = re.sub(r"\[\[([^\[\]|]*)\|([^\[\]]*)\]\]", r"\2", text)
    text = re.sub(r"\[\[([^\[\]]*)\]\]", r"\1", text)
    text = re.sub(r"\[(?:https?|ftp)://\S+ ([^\]]*)\]", r"\1", text)
    text = re.sub(r"\[(?:https?|ftp)://\S+\]", "", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"^(=+)\s*(.*?)\s*\1\s*$", r"\2", text, flags=re.MULTILINE)
    text = re.sub(r"</?[a-zA-Z][^>]*>", "", text)
    text = html.unescape(text)
    text = re.sub(r"^[*#:;]+\s*", "", text, flags=re.MULTILINE)
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def read_wiki(wheel: str | Path, member: str = WIKI_MEMBER, min_chars: int = 500) -> Docs:
    """Articles (namespace 0, not redirects) of the enwiki dump inside a gensim wheel -> [(title, text)]."""
    wheel = Path(wheel)
    if not wheel.is_file():
        raise ConfigError(f"gensim wheel {wheel} does not exist; fetch it with `pip download --no-deps gensim==4.4.0`.")
    with zipfile.ZipFile(wheel) as zf:
        try:
            raw = bz2.decompress(zf.read(member))
        except KeyError as exc:
            raise ConfigError(f"{wheel}: member {member} not found; expected gensim's enwiki test dump.") from exc
    root = ET.fromstring(raw)
    ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
    docs = []
    for page in root.iter(f"{ns}page"):
        if page.findtext(f"{ns}ns") != "0" or page.find(f"{ns}redirect") is not None:
            continue
        title = page.findtext(f"{ns}title") or ""
        body = strip_wiki_markup(page.findtext(f"{ns}revision/{ns}text") or "")
        if len(body) >= min_chars:
            docs.append((title.replace("/", "_"), f"{title}\n\n{body}\n"))
    return docs
