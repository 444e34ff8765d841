"""The HTML report: sections of text, tables and embedded PNG figures in one self-contained file.

A section is a title plus a list of HTML fragments built by `paragraph`, `table` and `figure`; the
report embeds every figure as base64 so the file can be mailed or opened offline.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from routecast.common.outputs import fix_mode

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;
     padding:0 1em;color:#1b1b1b;line-height:1.45}
h1{border-bottom:2px solid #444;padding-bottom:.2em} h2{margin-top:2em;border-bottom:1px solid #bbb}
table{border-collapse:collapse;margin:1em 0;font-size:.9em} th,td{border:1px solid #ccc;padding:.25em .6em}
th{background:#f0f0f0} td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:1em 0} figcaption{font-size:.85em;color:#555} img{max-width:100%}
.meta{color:#666;font-size:.85em} nav a{margin-right:1em}
"""


@dataclass
class Section:
    """One report section: an anchor id, a title, and HTML fragments in order."""

    key: str
    title: str
    parts: list[str] = field(default_factory=list)


def paragraph(text: str) -> str:
    return f"<p>{html.escape(text)}</p>"


def _fmt(v: Any, digits: int) -> tuple[str, bool]:
    if isinstance(v, bool) or v is None:
        return html.escape(str(v)), False
    if isinstance(v, int):
        return f"{v:,}", True
    if isinstance(v, float):
        if v != v:  # NaN
            return "–", True
        return (f"{v:.{digits}f}" if abs(v) < 1e6 else f"{v:.3g}"), True
    return html.escape(str(v)), False


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, digits: int = 3) -> str:
    """An HTML table from a list of dicts (columns default to the first row's keys)."""
    if not rows:
        return "<p><em>(no rows)</em></p>"
    cols = list(columns or rows[0].keys())
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for c in cols:
            txt, num = _fmt(r.get(c), digits)
            cells.append(f'<td class="num">{txt}</td>' if num else f"<td>{txt}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def figure(png: str | Path, caption: str = "") -> str:
    """Embed a PNG file as base64 (the report stays one self-contained file)."""
    data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">{cap}</figure>'


def preformatted(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"


def render(title: str, sections: Sequence[Section], meta: dict[str, Any] | None = None) -> str:
    """The whole report as an HTML string."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    meta_txt = " · ".join(f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in (meta or {}).items())
    nav = "".join(f'<a href="#{html.escape(s.key)}">{html.escape(s.title)}</a>' for s in sections)
    body = "".join(
        f'<section id="{html.escape(s.key)}"><h2>{html.escape(s.title)}</h2>{"".join(s.parts)}</section>'
        for s in sections
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p class='meta'>generated {stamp}{' · ' + meta_txt if meta_txt else ''}</p><nav>{nav}</nav>{body}"
        "</body></html>"
    )


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write a file via a temp file + rename so a reader never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        fix_mode(tmp)  # mkstemp creates 0600; reports are for sharing, so follow the umask
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_report(path: str | Path, title: str, sections: Sequence[Section], meta: dict[str, Any] | None = None) -> Path:
    """Render and write the report atomically; returns the path."""
    return write_atomic(path, render(title, sections, meta))
