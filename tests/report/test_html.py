import base64
import re

import pytest

from routecast.report.html import Section, figure, paragraph, render, table, write_atomic, write_report

PNG_1x1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def test_table_formats_numbers_and_escapes_text():
    html = table([{"name": "<a>", "x": 1234, "y": 0.5, "z": float("nan")}])
    assert "&lt;a&gt;" in html and "1,234" in html and "0.500" in html and "–" in html
    assert table([]) == "<p><em>(no rows)</em></p>"


def test_figure_embeds_png(tmp_path):
    p = tmp_path / "f.png"
    p.write_bytes(PNG_1x1)
    frag = figure(p, "cap")
    data = re.search(r"base64,([A-Za-z0-9+/=]+)", frag).group(1)
    assert base64.b64decode(data) == PNG_1x1 and "<figcaption>cap</figcaption>" in frag


def test_report_has_sections_and_nav(tmp_path):
    s = [Section("a", "Alpha", [paragraph("hello & bye")]), Section("b", "Beta", [table([{"k": 1}])])]
    out = write_report(tmp_path / "r" / "report.html", "T", s, meta={"trace": "x"})
    txt = out.read_text()
    assert txt.startswith("<!doctype html>") and 'href="#a"' in txt and 'id="b"' in txt
    assert "hello &amp; bye" in txt and "trace: x" in txt
    assert render("T", []).count("<section") == 0


def test_write_atomic_keeps_old_file_on_failure(tmp_path):
    p = write_atomic(tmp_path / "x.txt", "old")

    class Boom(str):
        def encode(self, *_):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_atomic(p, Boom("new"))
    assert p.read_text() == "old"
    assert [f.name for f in tmp_path.iterdir()] == ["x.txt"]
