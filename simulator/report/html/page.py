"""The shared page writer of the HTML reports: one self-contained file, Plotly's JS inlined once.

A page is a title, a few sections (a heading, paragraphs, tables, Plotly figures) and the data
the figures were drawn from, embedded as ``<script type="application/json" id="memwall-data">``
so a reader (or a test) can compare the page with ``--json`` output without parsing the charts.
Nothing is fetched at view time: plotly.js is written into the page (``include_plotlyjs=True``
on the first figure), MathJax is left out, and the page links to nothing.
"""

from __future__ import annotations

import html
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.errors import InputError
from simulator.files import atomic_write, check_output_path
from simulator.tabular import finite_or_none

HTML_SUFFIXES = (".html", ".htm")
INSTALL_HINT = "pip install 'memwall[html]'"
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


def require_plotly(option: str = "--html") -> None:
    """InputError (one line) when plotly is not installed, checked before any work."""
    if importlib.util.find_spec("plotly") is None:
        raise InputError(f"{option} needs plotly, which is not installed: {INSTALL_HINT} (or pip install 'plotly>=5.18')")


def check_html_path(path: str | Path, option: str = "--html") -> Path:
    """The report's path checked before the run (suffix .html/.htm, writable folder) and plotly importable."""
    out = check_output_path(path, option, HTML_SUFFIXES)
    require_plotly(option)
    return out


@dataclass
class Figure:
    """A Plotly figure (``plotly.graph_objects.Figure``) placed in a div with a fixed id."""

    div_id: str
    figure: Any
    caption: str = ""


@dataclass(frozen=True)
class Cell:
    text: str
    key: str | None = None
    value: Any = None


@dataclass
class Table:
    """Rows of cells; a cell may carry a ``data-key`` (the ``--json`` key its value comes from) and a
    ``data-value`` (that value exactly, as JSON) for readers that compare the page with the JSON."""

    headers: list[str]
    rows: list[list[Cell]]
    table_id: str = ""


@dataclass
class Section:
    heading: str
    paragraphs: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    code: list[str] = field(default_factory=list)  # preformatted blocks (launch commands)


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1150px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .6em 0; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
pre { background: #f6f6f6; padding: .7em; overflow-x: auto; font-size: .85em; }
.caption { color: #555; font-size: .85em; margin: 0 0 1em 0; }
.note { color: #555; font-size: .9em; }
"""


def _json_script(data: Any) -> str:
    """The data as strict JSON inside a script tag; '</' escaped so no value can close the tag."""
    text = json.dumps(finite_or_none(data), allow_nan=False, separators=(",", ":"))
    text = text.replace("</", "<\\/").replace("<!--", "<\\!--")
    return f'<script type="application/json" id="memwall-data">{text}</script>'


def _table_html(table: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.headers)
    body = []
    for row in table.rows:
        cells = []
        for cell in row:
            attribute = ""
            if cell.key:
                value = json.dumps(finite_or_none(cell.value), allow_nan=False)
                attribute = f' data-key="{html.escape(cell.key)}" data-value="{html.escape(value)}"'
            cells.append(f"<td{attribute}>{html.escape(cell.text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    ident = f' id="{html.escape(table.table_id)}"' if table.table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def page_html(title: str, sections: list[Section], data: dict[str, Any], subtitle: str = "") -> str:
    """The whole page as text (plotly.js inlined in the first figure's block)."""
    import plotly.io as pio

    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html.escape(title)}</title>", f"<style>{STYLE}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    if subtitle:
        parts.append(f'<p class="note">{html.escape(subtitle)}</p>')
    inlined = False
    for section in sections:
        parts.append(f"<h2>{html.escape(section.heading)}</h2>")
        parts += [f"<p>{html.escape(text)}</p>" for text in section.paragraphs]
        parts += [_table_html(table) for table in section.tables]
        parts += [f"<pre>{html.escape(block)}</pre>" for block in section.code]
        for figure in section.figures:
            parts.append(pio.to_html(figure.figure, include_plotlyjs=not inlined, full_html=False,
                                     div_id=figure.div_id, config=PLOTLY_CONFIG, include_mathjax=False))
            inlined = True
            if figure.caption:
                parts.append(f'<p class="caption">{html.escape(figure.caption)}</p>')
    parts += [_json_script(data), "</body></html>"]
    return "\n".join(parts) + "\n"


def write_page(path: str | Path, title: str, sections: list[Section], data: dict[str, Any], subtitle: str = "",
               option: str = "--html") -> Path:
    """Write the page whole or not at all (see :func:`simulator.files.atomic_write`)."""
    require_plotly(option)
    atomic_write(path, page_html(title, sections, data, subtitle), option)
    return Path(path)


def every_nth(count: int, limit: int) -> int:
    """The stride that keeps at most ``limit`` of ``count`` points (1: all of them): ceil(count / limit)."""
    return max(1, -(-count // limit))
