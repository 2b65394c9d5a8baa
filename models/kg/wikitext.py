"""Readable text from one raw MediaWiki value of the organisers' open-domain KG (`clean_value`).

`open_get_entity` returns an entity's infobox as `summary_structured`: the template's parameters as written in
Wikipedia's wikitext, e.g. `"length": "{{convert|2737|m|ft|abbr=on}}"` or `"location": "[[San Francisco Bay
Area|Bay Area]], California"`. Given to a model as is, the markup costs characters and reads badly. This module
turns one value into the text a reader of the article sees; models/kg/infobox.py decides which keys carry a fact
and how they pair into rows.

Parsing is mwparserfromhell's (MIT, C tokenizer): it handles nested templates, links inside template arguments,
tags, comments and entities, and leaves malformed markup as plain text instead of raising. On top of it:
unbalanced `{{`/`[[` are closed (and stray `}}`/`]]` dropped) before parsing, so a value cut short still gives its
text; whatever markup survives is stripped at the end. A value the parser or a renderer trips on is logged and
kept as its unescaped text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

import mwparserfromhell
from loguru import logger
from mwparserfromhell.nodes import (
    Argument,
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Template,
    Text,
    Wikilink,
)
from mwparserfromhell.wikicode import Wikicode

from models.kg.wiki_units import convert, read_number, show_input

__all__ = ["clean_value"]

# Marks a list-item boundary (<br>, "* item", {{ubl}} items) while rendering; resolved to ", " at the end, so
# empty items and items next to each other never give ", , ".
_SEP = "\x1f"

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


# ---------------------------------------------------------------------------------------------------------------
# Other templates

def _coord(pos: list[str], named: dict[str, str]) -> str:
    args = [p.strip() for p in pos if p.strip() and ":" not in p and "=" not in p]
    hemis = [i for i, a in enumerate(args) if a.upper() in ("N", "S", "E", "W")]
    if len(hemis) >= 2 and args[hemis[0]].upper() in "NS" and args[hemis[1]].upper() in "EW":
        i, j = hemis[0], hemis[1]

        def dms(parts: list[str], hemi: str) -> str:
            marks = ("°", "′", "″")
            return "".join(p + marks[k] for k, p in enumerate(parts[:3])) + hemi.upper()

        return f"{dms(args[:i], args[i])} {dms(args[i + 1:j], args[j])}"
    numbers = [read_number(a) for a in args[:2]]
    if len(numbers) == 2 and None not in numbers:
        lat, lon = numbers[0], numbers[1]
        assert lat is not None and lon is not None

        def deg(value: float, raw: str, plus: str, minus: str) -> str:
            return f"{raw.strip().lstrip('-−').lstrip('+')}°{plus if value >= 0 else minus}"

        return f"{deg(lat, args[0], 'N', 'S')} {deg(lon, args[1], 'E', 'W')}"
    return " ".join(args)


def _date_parts(args: list[str]) -> tuple[int, int | None, int | None] | None:
    try:
        year = int(args[0].strip())
    except (IndexError, ValueError):
        return None
    month = day = None
    if len(args) > 1 and args[1].strip():
        raw = args[1].strip()
        if raw.isdigit() and 1 <= int(raw) <= 12:
            month = int(raw)
        elif raw.capitalize() in _MONTHS:
            month = _MONTHS.index(raw.capitalize()) + 1
        else:
            return None
    if month and len(args) > 2 and args[2].strip().isdigit() and 1 <= int(args[2].strip()) <= 31:
        day = int(args[2].strip())
    return year, month, day


def _show_date(parts: tuple[int, int | None, int | None], day_first: bool) -> str:
    year, month, day = parts
    if month is None:
        return str(year)
    if day is None:
        return f"{_MONTHS[month - 1]} {year}"
    return f"{day} {_MONTHS[month - 1]} {year}" if day_first else f"{_MONTHS[month - 1]} {day}, {year}"


def _day_first(named: dict[str, str]) -> bool:
    return named.get("df", "").strip().lower() in ("y", "yes", "true", "1")


def _date(pos: list[str], named: dict[str, str]) -> str:
    parts = _date_parts(pos)
    if parts is None:
        return " ".join(p.strip() for p in pos if p.strip())
    return _show_date(parts, _day_first(named))


def _death_date_and_age(pos: list[str], named: dict[str, str]) -> str:
    death, birth = _date_parts(pos[:3]), _date_parts(pos[3:6])
    if death is None:
        return _date(pos, named)
    text = _show_date(death, _day_first(named))
    if birth is not None:
        (dy, dm, dd), (by, bm, bd) = death, birth
        if dm and dd and bm and bd:
            text += f" (aged {dy - by - ((dm, dd) < (bm, bd))})"
    return text


def _start_end(pos: list[str], named: dict[str, str]) -> str:
    start, end = _date_parts(pos[:3]), _date_parts(pos[3:6])
    if start is None:
        return _date(pos, named)
    first = _show_date(start, _day_first(named))
    return f"{first} – {_show_date(end, _day_first(named))}" if end else first


def _items(pos: list[str], named: dict[str, str]) -> str:
    return _SEP.join(p for p in pos if p.strip())


def _marriage(pos: list[str], named: dict[str, str]) -> str:
    if not pos:
        return ""
    years = "–".join(p.strip() for p in pos[1:3] if p.strip())
    return f"{pos[0].strip()} (m. {years})" if years else pos[0].strip()


def _val(pos: list[str], named: dict[str, str]) -> str:
    if not pos:
        return ""
    unit = named.get("u", named.get("ul", "")).strip()
    return f"{show_input(pos[0])} {unit}".strip()


def _height(pos: list[str], named: dict[str, str]) -> str:
    order = ("m", "cm", "ft", "in")
    return " ".join(f"{named[u].strip()} {u}" for u in order if named.get(u, "").strip())


def _frac(pos: list[str], named: dict[str, str]) -> str:
    parts = [p.strip() for p in pos]
    if len(parts) == 3:
        return f"{parts[0]} {parts[1]}/{parts[2]}"
    if len(parts) == 2:
        return f"{parts[0]}/{parts[1]}"
    return f"1/{parts[0]}" if parts else ""


def _jct(pos: list[str], named: dict[str, str]) -> str:
    """{{jct|state=CA|US|101|SR|1}}: road type and number pairs, "US 101, SR 1"."""
    args = [p.strip() for p in pos if p.strip()]
    return ", ".join(" ".join(args[i:i + 2]) for i in range(0, len(args), 2))


def _first(pos: list[str], named: dict[str, str]) -> str:
    return pos[0] if pos else ""


def _second(pos: list[str], named: dict[str, str]) -> str:
    return pos[1] if len(pos) > 1 else (pos[0] if pos else "")


def _prefixed(prefix: str) -> Callable[[list[str], dict[str, str]], str]:
    def render(pos: list[str], named: dict[str, str]) -> str:
        return f"{prefix}{pos[0].strip()}" if pos and pos[0].strip() else ""

    return render


def _const(text: str) -> Callable[[list[str], dict[str, str]], str]:
    return lambda pos, named: text


def _url(pos: list[str], named: dict[str, str]) -> str:
    if len(pos) > 1 and pos[1].strip():
        return pos[1]
    if not pos:
        return ""
    return re.sub(r"^(https?:)?//", "", pos[0].strip()).rstrip("/")


_SUPERSCRIPT = {"2": "²", "3": "³"}
_TEMPLATES: dict[str, Callable[[list[str], dict[str, str]], str]] = {
    "convert": convert, "cvt": convert,
    "coord": _coord, "coor": _coord,
    "lang": _second, "langx": _second, "native name": _second, "nativename": _second, "transl": _second,
    "transliteration": _second, "script": _second,
    "small": _first, "smaller": _first, "big": _first, "larger": _first, "nowrap": _first, "nobr": _first,
    "nobold": _first, "noitalic": _first, "resize": _second, "abbr": _first, "keep together": _first,
    "ubl": _items, "unbulleted list": _items, "ublist": _items, "unbulleted": _items, "plainlist": _items,
    "plain list": _items, "flatlist": _items, "flat list": _items, "hlist": _items, "bulleted list": _items,
    "bulletedlist": _items, "blist": _items, "collapsible list": _items, "enum": _items, "nowrap list": _items,
    "start date": _date, "end date": _date, "birth date": _date, "death date": _date, "dob": _date,
    "birth date and age": _date, "bda": _date, "start date and age": _date, "end date and age": _date,
    "birth year and age": _date, "film date": _date, "release date": _date, "date": _date,
    "death date and age": _death_date_and_age, "dda": _death_date_and_age,
    "start and end dates": _start_end,
    "jct": _jct, "marriage": _marriage, "val": _val, "height": _height, "frac": _frac, "fraction": _frac,
    "url": _url, "official website": _url, "official url": _url,
    "circa": _prefixed("c. "), "c.": _prefixed("c. "), "as of": _prefixed("As of "),
    "us$": _prefixed("US$"), "usd": _prefixed("US$"), "€": _prefixed("€"), "eur": _prefixed("€"),
    "£": _prefixed("£"), "gbp": _prefixed("£"), "¥": _prefixed("¥"), "inrconvert": _prefixed("₹"),
    "br": _const(_SEP), "break": _const(_SEP), "·": _const(_SEP), "dot": _const(_SEP), "middot": _const(_SEP),
    "•": _const(_SEP), "bull": _const(_SEP), "endplainlist": _const(""), "endflatlist": _const(""),
    "sup": lambda pos, named: _SUPERSCRIPT.get(pos[0].strip(), pos[0]) if pos else "",
    "nbsp": _const(" "), "ndash": _const("–"), "snd": _const(" – "), "spaced ndash": _const(" – "),
    "mdash": _const("—"), "spaced en dash": _const(" – "),
}

# Templates with one positional argument that is not the text a reader sees: notes, citations, icons.
_DROP = frozenset({
    "efn", "efn-ua", "efn-lr", "efn-lg", "refn", "sfn", "sfnp", "harvnb", "r", "rp", "ref", "ref label", "note",
    "notetag", "note label", "citation needed", "cn", "fact", "dubious", "clarify", "when", "update needed",
    "better source needed", "flagicon", "flagicon image", "flagdeco", "icon", "increase", "decrease", "steady",
    "decrease positive", "increase negative", "pp", "pp-protected", "anchor", "wikidata",
    "inflation", "inflation-fn", "infobox mapframe", "location map", "commons", "commons category",
    "portal", "efn-la", "inflation-year",
})

_MAGIC_NUMBER = ("formatnum", "#expr")


def _template_name(template: Template) -> str:
    name = " ".join(_render(template.name).replace("_", " ").split()).lower()
    return name[len("template:"):].strip() if name.startswith("template:") else name


def _render_template(template: Template) -> str:
    name = _template_name(template)
    if ":" in name:
        # A parser function like {{formatnum:1234}}: the name holds the argument.
        func, _, arg = _render(template.name).partition(":")
        if func.strip().lower() in _MAGIC_NUMBER:
            return show_input(arg)
        return ""
    pos: list[str] = []
    named: dict[str, str] = {}
    for param in template.params:
        value = _render(param.value)
        if param.showkey:
            named[" ".join(str(param.name).split()).lower()] = value
        else:
            pos.append(value)
    handler = _TEMPLATES.get(name)
    if handler is None and name.startswith("lang-"):
        handler = _first
    if handler is not None:
        if handler is _items:
            return _list_text(_items(pos, named))
        return handler(pos, named)
    if name in _DROP or name.startswith(("cite ", "citation", "infobox", "#")):
        return ""
    plain = [p for p in pos if p.strip()]
    return plain[0] if len(plain) == 1 and len(pos) == 1 else ""


# ---------------------------------------------------------------------------------------------------------------
# Nodes

_DROP_TAGS = frozenset({"ref", "references", "gallery", "timeline", "imagemap", "templatestyles", "score",
                        "graph", "mapframe", "maplink", "indicator", "section", "syntaxhighlight", "source"})
_BREAK_TAGS = frozenset({"br", "hr", "li", "dt", "dd", "p", "div", "tr", "td", "th", "ul", "ol", "dl", "table"})
_LINK_DROP_NAMESPACES = ("file:", "image:", "media:", "category:")


def _render_tag(tag: Tag) -> str:
    name = str(tag.tag).strip().lower()
    if name in _DROP_TAGS:
        return ""
    inner = _render(tag.contents) if tag.contents is not None and not tag.self_closing else ""
    if name == "sup" and inner.strip() in _SUPERSCRIPT:
        return _SUPERSCRIPT[inner.strip()]
    if name in _BREAK_TAGS:
        return f"{_SEP}{inner}{_SEP}" if inner else _SEP
    return inner


def _render_link(link: Wikilink) -> str:
    title = _render(link.title).strip()
    if title.lower().startswith(_LINK_DROP_NAMESPACES):
        return ""
    title = title.lstrip(":")
    if link.text is not None:
        label = _render(link.text)
        if label.strip():
            return label
        # The pipe trick: [[Foo (bar)|]] reads "Foo".
        return re.sub(r"\s*\([^)]*\)$", "", title.split(":", 1)[-1])
    return title


def _render(code: Wikicode | None) -> str:
    if code is None:
        return ""
    out: list[str] = []
    for node in code.nodes:
        if isinstance(node, Text):
            out.append(node.value)
        elif isinstance(node, Template):
            out.append(_render_template(node))
        elif isinstance(node, Wikilink):
            out.append(_render_link(node))
        elif isinstance(node, ExternalLink):
            if node.title is not None and str(node.title).strip():
                out.append(_render(node.title))
            elif not node.brackets:
                out.append(str(node.url))
        elif isinstance(node, Tag):
            out.append(_render_tag(node))
        elif isinstance(node, HTMLEntity):
            # Kept apart from markup until _tidy has stripped tags: &lt;b&gt; is text, not a tag.
            out.append(node.normalize().translate(_HIDE))
        elif isinstance(node, Comment):
            continue
        elif isinstance(node, Heading):
            out.append(_render(node.title))
        elif isinstance(node, Argument):
            out.append(_render(node.default))
        else:
            out.append(str(node))
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------------
# Before and after parsing

_HIDE = str.maketrans({"<": "\ue000", ">": "\ue001", "[": "\ue002", "]": "\ue003", "{": "\ue004",
                       "}": "\ue005", "'": "\ue006"})
_SHOW = str.maketrans({v: k for k, v in _HIDE.items()})
_OPENERS = {"{{": "}}", "[[": "]]"}
_CLOSERS = {"}}": "{{", "]]": "[["}


def _balance(raw: str) -> str:
    """Close `{{`/`[[` left open and drop `}}`/`]]` that close nothing, so a truncated or mistyped value still
    parses into its templates and links rather than staying raw text."""
    out: list[str] = []
    stack: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        pair = raw[i:i + 2]
        if pair in _OPENERS:
            stack.append(pair)
            out.append(pair)
            i += 2
        elif pair in _CLOSERS:
            opener = _CLOSERS[pair]
            if opener in stack:
                while stack:
                    top = stack.pop()
                    out.append(_OPENERS[top])
                    if top == opener:
                        break
            i += 2
        else:
            out.append(raw[i])
            i += 1
    out.extend(_OPENERS[top] for top in reversed(stack))
    return "".join(out)


_LEFTOVER = [
    (re.compile(r"<ref\b[^>]*?/>", re.I), ""),
    (re.compile(r"<ref\b[^>]*>.*?(</ref\s*>|$)", re.I | re.S), ""),
    (re.compile(r"<ref\b[^>]*$", re.I), ""),
    (re.compile(r"<!--.*?(-->|$)", re.S), ""),
    (re.compile(r"<br\s*/?>", re.I), _SEP),
    (re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*\b[^<>]*>"), ""),
    (re.compile(r"\[(?:https?:)?//[^\s\]]*\s*([^\]]*)\]?"), r"\1"),
    (re.compile(r"\{\{|\}\}|\[\[|\]\]|'{2,}"), ""),
]


def _tidy(text: str) -> str:
    """Markup the parser left as text removed; items split at _SEP, each with whitespace collapsed, joined by
    ", " (a space after an item that ends in a colon, "Designers: A, B")."""
    for pattern, repl in _LEFTOVER:
        text = pattern.sub(repl, text)
    text = text.replace("\n", " ").translate(_SHOW)
    items = []
    for item in text.split(_SEP):
        item = " ".join(item.split())
        item = re.sub(r"\(\s*\)", "", item)
        item = re.sub(r"\(\s+", "(", item)
        item = re.sub(r"\s+([,;.)])", r"\1", item)
        item = item.strip(" ,;")
        if item:
            items.append(item)
    joined = ""
    for item in items:
        joined += item if not joined else (" " if joined.endswith(":") else ", ") + item
    return joined


def _list_text(text: str) -> str:
    """A list template's items, empty ones dropped, joined by _SEP without one at either end."""
    return _SEP.join(part for part in text.split(_SEP) if part.strip())


def clean_value(raw: str) -> str:
    """The text a reader sees for one raw infobox value: templates rendered or dropped, links as their labels,
    refs and comments removed, entities decoded, list items joined by ", ", whitespace collapsed. Never raises:
    markup it cannot place is stripped and the rest kept."""
    if raw is None:
        return ""
    text = raw if isinstance(raw, str) else str(raw)
    if not any(c in text for c in "{}[]<&'\n"):
        return " ".join(text.split())
    try:
        return _tidy(_render(mwparserfromhell.parse(_balance(text))))
    except Exception as err:  # whatever the parser or a renderer trips on, the value's text is still worth keeping
        logger.warning("infobox value kept unrendered ({}: {}): {!r}", type(err).__name__, err, text[:80])
        return _tidy(html.unescape(text))
