"""The report as Markdown and as one HTML page: sections of tables and figures, plus the
per-probe rows. Pure rendering from summary frames; no I/O but what the caller writes."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import polars as pl


@dataclass
class Section:
    title: str
    intro: str = ""
    tables: list[tuple[str, pl.DataFrame]] = field(default_factory=list)  # (caption, frame)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (file name, alt text)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "n/a" if v != v else f"{v:.3g}" if abs(v) < 1e-3 and v != 0 else f"{v:.3f}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def markdown_table(df: pl.DataFrame) -> str:
    if df.is_empty():
        return "_no rows_\n"
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    for row in df.iter_rows():
        lines.append("| " + " | ".join(_cell(v).replace("|", "\\|").replace("\n", " ") for v in row) + " |")
    return "\n".join(lines) + "\n"


def html_table(df: pl.DataFrame, cls: str = "") -> str:
    if df.is_empty():
        return "<p class='none'>no rows</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in df.iter_rows())
    return f"<table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_markdown(title: str, header: list[str], sections: list[Section], probes: pl.DataFrame) -> str:
    out = [f"# {title}", "", *header, ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        if s.intro:
            out += [s.intro, ""]
        for caption, df in s.tables:
            out += ([f"**{caption}**", ""] if caption else []) + [markdown_table(df)]
        out += [f"![{alt}]({name})\n" for name, alt in s.figures]
    out += ["## Per probe", "", markdown_table(probes)]
    return "\n".join(out)


_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0}
td{max-width:420px}
.probes td{font-size:12px}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.meta{color:#555;font-size:14px}
nav a{margin-right:1em}
"""


def render_html(title: str, header: list[str], sections: list[Section], probes: pl.DataFrame) -> str:
    anchors = [f"s{i}" for i in range(len(sections))]
    nav = "".join(f"<a href='#{a}'>{html.escape(s.title)}</a>" for a, s in zip(anchors, sections))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             "".join(f"<p class='meta'>{html.escape(h)}</p>" for h in header),
             f"<nav>{nav}<a href='#probes'>Per probe</a></nav>"]
    for a, s in zip(anchors, sections):
        parts.append(f"<h2 id='{a}'>{html.escape(s.title)}</h2>")
        if s.intro:
            parts.append(f"<p>{html.escape(s.intro)}</p>")
        for caption, df in s.tables:
            if caption:
                parts.append(f"<h3>{html.escape(caption)}</h3>")
            parts.append(html_table(df))
        parts += [f"<img src='{html.escape(name)}' alt='{html.escape(alt)}'>" for name, alt in s.figures]
    parts += ["<h2 id='probes'>Per probe</h2>", html_table(probes, "probes"), "</body></html>"]
    return "\n".join(parts)
