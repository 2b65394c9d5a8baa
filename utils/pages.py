"""One search result (a CRAG page dict) to text chunks with its metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from utils.chunking import group_sentences, split_sentences
from utils.html import parse_html, visible_text


@dataclass
class PageText:
    name: str
    url: str
    last_modified: str
    snippet: str
    chunks: list[str] = field(default_factory=list)


def _field(page: dict[str, Any], key: str) -> str:
    value = page.get(key)
    return value.strip() if isinstance(value, str) else ""


def page_text(page: dict[str, Any], chunk_chars: int, max_page_chars: int) -> PageText:
    """Chunks of the page's visible text; a page with no usable HTML yields no chunks."""
    tree = parse_html(page.get("page_result"), max_page_chars)
    chunks = group_sentences(split_sentences(visible_text(tree)), chunk_chars) if tree is not None else []
    snippet = " ".join(_field(page, "page_snippet").split())
    return PageText(_field(page, "page_name"), _field(page, "page_url"), _field(page, "page_last_modified"),
                    snippet, chunks)
