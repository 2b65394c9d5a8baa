"""Raw HTML to one parsed tree, cleaned once; robust to broken markup, odd encodings and huge pages."""

from __future__ import annotations

import codecs
import re

import lxml.etree
import lxml.html

_PARSER = lxml.html.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True, recover=True,
                               collect_ids=False, default_doctype=False)
# The seed removes script, style, meta, footer and button. These never hold text a reader sees:
NEVER_TEXT = ("script", "style", "meta", "noscript", "template", "svg", "iframe", "link", "object", "embed",
              "select", "textarea")
# These are removed when small. A big one is a parser artefact: libxml2 nests the rest of the page into an
# unclosed <button>, so removing it would remove the article. Then only the tag goes and its content stays.
SMALL_BOILERPLATE = ("head", "footer", "button")
SMALL_BOILERPLATE_CHARS = 2000
_BLOCK = ("p", "div", "section", "article", "li", "tr", "br", "h1", "h2", "h3", "h4", "h5", "h6",
          "table", "ul", "ol", "dl", "dt", "dd", "blockquote", "pre", "header", "main", "aside", "nav",
          "td", "th", "caption", "figcaption", "hr")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]+)""", re.IGNORECASE)
_ESCAPED = re.compile(r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})|\\u([0-9a-f]{4})", re.IGNORECASE)


def decode_html(raw: bytes) -> str:
    """Text of `raw`: a byte-order mark wins, then strict UTF-8, then the page's declared charset, then cp1252.

    A declared charset is tried after UTF-8 because pages often declare one they are not written in.
    """
    for bom, codec in (
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if raw.startswith(bom):
            return raw.decode(codec, errors="replace")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    declared = _META_CHARSET.search(raw[:8192])
    if declared:
        try:
            return raw.decode(declared.group(1).decode("ascii"), errors="replace")
        except LookupError:  # an unknown codec name: fall through to cp1252
            pass
    return raw.decode("cp1252", errors="replace")


# What JSON can carry in but no UTF-8 writer takes: lone surrogates (from "\ud800" escapes) and C0 control
# characters other than tab and line breaks (from "\u0000").
_UNWRITABLE = re.compile("[\ud800-\udfff\x00-\x08\x0b\x0c\x0e-\x1f]")


def clean_text(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD and control characters other than tab and line breaks
    removed: what a page's parser does to its text, for any string read from data."""
    return _UNWRITABLE.sub(lambda m: "" if m.group() < "\x20" else "\ufffd", text) if _UNWRITABLE.search(text) else text


def parse_html(raw: object, max_chars: int) -> lxml.html.HtmlElement | None:
    """A tree for `raw` (str or bytes, cut to max_chars), or None when there is nothing to parse."""
    if isinstance(raw, bytes):
        raw = decode_html(raw)
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:  # encoding with "replace" also drops lone surrogates that JSON may have carried in
        tree = lxml.html.document_fromstring(raw[:max_chars].encode("utf-8", errors="replace"), parser=_PARSER)
    except (lxml.etree.ParserError, ValueError):
        return None
    return tree if isinstance(tree, lxml.html.HtmlElement) else None


def remove_boilerplate(tree: lxml.html.HtmlElement) -> None:
    """Drop the elements that hold no readable text, keeping the text that follows them."""
    lxml.etree.strip_elements(tree, *NEVER_TEXT, with_tail=False)
    for element in list(tree.iter(*SMALL_BOILERPLATE)):
        if element.getparent() is None:
            continue
        if len(element.text_content()) <= SMALL_BOILERPLATE_CHARS:
            element.drop_tree()  # keeps the tail text
        else:
            element.drop_tag()


def lists_as_content(tree: lxml.html.HtmlElement, max_link_share: float = 0.5) -> None:
    """Mark every bulleted list that is not mostly link text as an ordered list. resiliparse's main-content rules
    drop each <ul> as navigation and keep each <ol>; a list of facts (members, dates, titles) is content."""
    for element in tree.iter("ul"):
        chars = len(element.text_content().strip())
        link_chars = sum(len(link.text_content()) for link in element.iter("a"))
        if chars and link_chars <= max_link_share * chars:
            element.tag = "ol"


def unescape_unicode(text: str) -> str:
    r"""Decode literal `\uXXXX` escapes (pairs of surrogates joined; a lone surrogate becomes U+FFFD)."""
    if "\\u" not in text and "\\U" not in text:
        return text

    def decode(match: re.Match[str]) -> str:
        if match.group(3) is None:
            high, low = int(match.group(1), 16), int(match.group(2), 16)
            return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
        code = int(match.group(3), 16)
        return "\ufffd" if 0xD800 <= code <= 0xDFFF else chr(code)

    return _ESCAPED.sub(decode, text)


def block_text(tree: lxml.html.HtmlElement) -> str:
    """Every text of `tree`, one block element per line, whitespace collapsed. Modifies `tree`.

    This is what BeautifulSoup's get_text("\n") gives, read from the tree already parsed.
    """
    for element in tree.iter(*_BLOCK):
        element.text = "\n" + (element.text or "")
        element.tail = "\n" + (element.tail or "")
    lines = (" ".join(line.split()) for line in tree.text_content().splitlines())
    return "\n".join(line for line in lines if line)
