"""Raw HTML to a parsed tree and to visible text; robust to broken markup, odd encodings and huge pages."""

from __future__ import annotations

import lxml.etree
import lxml.html

_PARSER = lxml.html.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True, recover=True)
_DROP = ("script", "style", "noscript", "meta", "footer", "button", "template", "svg", "iframe", "head")
_BLOCK = ("p", "div", "section", "article", "li", "tr", "br", "h1", "h2", "h3", "h4", "h5", "h6",
          "table", "ul", "ol", "dl", "dt", "dd", "blockquote", "pre", "header", "main", "aside", "nav",
          "td", "th", "caption", "figcaption", "hr")


def parse_html(raw: object, max_chars: int) -> lxml.html.HtmlElement | None:
    """A tree for `raw` (str or bytes, cut to max_chars), or None when there is nothing to parse."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:
        return lxml.html.document_fromstring(raw[:max_chars].encode("utf-8", errors="replace"), parser=_PARSER)
    except (lxml.etree.ParserError, ValueError):
        return None


def visible_text(tree: lxml.html.HtmlElement) -> str:
    """Text a reader sees, one block element per line, whitespace collapsed. Modifies `tree`."""
    for element in list(tree.iter(*_DROP)):
        if element.getparent() is not None:
            element.drop_tree()
    for element in tree.iter(*_BLOCK):
        element.text = "\n" + (element.text or "")
        element.tail = "\n" + (element.tail or "")
    lines = (" ".join(line.split()) for line in tree.text_content().splitlines())
    return "\n".join(line for line in lines if line)
