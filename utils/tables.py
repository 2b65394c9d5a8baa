"""HTML tables to Markdown, one table per reference, taken out of the tree so the main text does not repeat them.

A table becomes Markdown when it holds data: at least two non-empty rows and no cell of running prose. A layout
table (prose in a cell, or a single row) is turned into plain blocks instead, so its text stays in the main text.
Inner tables are handled before the tables around them, so a nested table is never rendered twice.
"""

from __future__ import annotations

import lxml.etree
import lxml.html

from utils.html import unescape_unicode

MAX_COLSPAN = 20
MAX_ROWSPAN = 100
_STRUCTURE = ("table", "thead", "tbody", "tfoot", "tr", "td", "th", "caption")


def _cell_text(cell: lxml.html.HtmlElement) -> str:
    return unescape_unicode(" ".join(cell.text_content().split())).replace("|", "\\|")


def _span(cell: lxml.html.HtmlElement, name: str, limit: int) -> int:
    try:
        return max(1, min(int(cell.get(name, "1").strip() or 1), limit))
    except ValueError:
        return 1


def _own_rows(table: lxml.html.HtmlElement) -> list[lxml.html.HtmlElement]:
    """The `tr` elements of `table` itself, not of tables nested in it."""
    return [row for row in table.iter("tr") if next(row.iterancestors("table"), None) is table]


def _grid(rows: list[lxml.html.HtmlElement]) -> list[list[str]]:
    """Cell texts laid out on a grid: a colspan repeats its text across columns, a rowspan down rows."""
    grid: list[list[str]] = []
    carried: dict[int, tuple[str, int]] = {}  # column -> (text, rows still to fill)

    def take_carried(row: list[str], column: int) -> None:
        text, left = carried.pop(column)
        row.append(text)
        if left > 1:
            carried[column] = (text, left - 1)

    for tr in rows:
        row: list[str] = []
        for cell in tr:
            if not isinstance(cell.tag, str) or cell.tag not in ("td", "th"):
                continue
            while len(row) in carried:
                take_carried(row, len(row))
            text = _cell_text(cell)
            rowspan = _span(cell, "rowspan", MAX_ROWSPAN)
            for _ in range(_span(cell, "colspan", MAX_COLSPAN)):
                if rowspan > 1:
                    carried[len(row)] = (text, rowspan - 1)
                row.append(text)
        for column in sorted(c for c in carried if c >= len(row)):
            row.extend([""] * (column - len(row)))
            take_carried(row, column)
        grid.append(row)
    return grid


def _trim(grid: list[list[str]]) -> list[list[str]]:
    """Rows padded to one width; empty rows and empty columns removed."""
    rows = [row for row in grid if any(row)]
    width = max((len(row) for row in rows), default=0)
    rows = [row + [""] * (width - len(row)) for row in rows]
    keep = [c for c in range(width) if any(row[c] for row in rows)]
    return [[row[c] for c in keep] for row in rows]


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _render(rows: list[list[str]], title: str, max_chars: int) -> list[str]:
    """Markdown parts of at most max_chars, each with the title and the header row; rows are never cut.

    A row that cannot fit even in a part of its own is left out.
    """
    head = f"{title}\n{_line(rows[0])}\n{_line(['---'] * len(rows[0]))}"
    if len(head) > max_chars:
        return []
    parts: list[str] = []
    current = head
    for row in rows[1:]:
        line = _line(row)
        if len(current) + 1 + len(line) <= max_chars:
            current += "\n" + line
        elif len(head) + 1 + len(line) <= max_chars:
            parts.append(current)
            current = head + "\n" + line
    if current != head:
        parts.append(current)
    return parts


def _unwrap(table: lxml.html.HtmlElement, rows: list[lxml.html.HtmlElement]) -> None:
    """Turn a layout table's own structure into blocks, so its text reads as ordinary text."""
    for element in [table, *rows, *(cell for row in rows for cell in row)]:
        if isinstance(element.tag, str) and element.tag in _STRUCTURE:
            element.tag = "div"


def extract_tables(tree: lxml.html.HtmlElement, page_name: str, max_chars: int, max_parts: int,
                   prose_chars: int = 600) -> list[str]:
    """Markdown of the page's data tables, in page order, at most max_parts parts; the tables leave the tree.

    `prose_chars`: a cell with more text than this is prose, and its table is a layout table.
    """
    found: list[list[str]] = []
    for table in reversed(list(tree.iter("table"))):  # inner tables first
        rows = _own_rows(table)
        grid = _trim(_grid(rows))
        if not grid:
            table.drop_tree()  # keeps the tail text
            continue
        if len(grid) < 2 or any(len(cell) > prose_chars for row in grid for cell in row):
            _unwrap(table, rows)
            continue
        caption = table.find("caption")
        caption_text = _cell_text(caption) if caption is not None else ""
        title = f"Page name: {page_name}" + (f"\nTable: {caption_text}" if caption_text else "")
        found.append(_render(grid, title, max_chars))
        table.drop_tree()
    parts = [part for table_parts in reversed(found) for part in table_parts]
    return parts[:max_parts]
