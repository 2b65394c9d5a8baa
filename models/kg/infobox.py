"""Readable text from the raw MediaWiki infobox values of the organisers' open-domain KG.

`open_get_entity` returns an entity's infobox as `summary_structured`: the template's parameters as written in
Wikipedia's wikitext, e.g. `"length": "{{convert|2737|m|ft|abbr=on}}"` or `"location": "[[San Francisco Bay
Area|Bay Area]], California"`. Given to a model as is, the markup costs characters and reads badly, and some keys
(image, caption, map type) carry nothing a question can ask. This module turns one value into the text a reader of
the article sees (`clean_value`), tells which keys carry a fact (`is_fact_key`), and renders an infobox as rows,
keys that belong together as one row (`pair_rows`).

Parsing is mwparserfromhell's (MIT, C tokenizer): it handles nested templates, links inside template arguments,
tags, comments and entities, and leaves malformed markup as plain text instead of raising. On top of it:
unbalanced `{{`/`[[` are closed (and stray `}}`/`]]` dropped) before parsing, so a value cut short still gives its
text; whatever markup survives is stripped at the end; nothing here raises.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Mapping

import mwparserfromhell
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

__all__ = ["NO_FACT_KEYS", "clean_value", "is_fact_key", "pair_rows"]

# Marks a list-item boundary (<br>, "* item", {{ubl}} items) while rendering; resolved to ", " at the end, so
# empty items and items next to each other never give ", , ".
_SEP = "\x1f"

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


# ---------------------------------------------------------------------------------------------------------------
# Units ({{convert}} and unit-suffixed keys)

class _Unit:
    __slots__ = ("symbol", "kind", "scale", "offset", "metric")

    def __init__(self, symbol: str, kind: str, scale: float, offset: float = 0.0, metric: bool = True) -> None:
        self.symbol, self.kind, self.scale, self.offset, self.metric = symbol, kind, scale, offset, metric

    def to_base(self, value: float) -> float:
        return (value + self.offset) * self.scale

    def from_base(self, value: float) -> float:
        return value / self.scale - self.offset


_UNIT_LIST: list[tuple[tuple[str, ...], _Unit]] = [
    (("m", "metre", "metres", "meter", "meters"), _Unit("m", "length", 1.0)),
    (("km", "kilometre", "kilometres", "kilometer", "kilometers"), _Unit("km", "length", 1000.0)),
    (("cm", "centimetre", "centimetres", "centimeter", "centimeters"), _Unit("cm", "length", 0.01)),
    (("mm", "millimetre", "millimetres", "millimeter", "millimeters"), _Unit("mm", "length", 0.001)),
    (("ft", "foot", "feet"), _Unit("ft", "length", 0.3048, metric=False)),
    (("in", "inch", "inches"), _Unit("in", "length", 0.0254, metric=False)),
    (("yd", "yard", "yards"), _Unit("yd", "length", 0.9144, metric=False)),
    (("mi", "mile", "miles"), _Unit("mi", "length", 1609.344, metric=False)),
    (("nmi",), _Unit("nmi", "length", 1852.0, metric=False)),
    (("m2", "m²", "sqm", "sq m"), _Unit("m²", "area", 1.0)),
    (("km2", "km²", "sqkm", "sq km"), _Unit("km²", "area", 1e6)),
    (("ha", "hectare", "hectares"), _Unit("ha", "area", 1e4)),
    (("sqft", "sq ft", "ft2", "ft²"), _Unit("sq ft", "area", 0.09290304, metric=False)),
    (("sqmi", "sq mi", "mi2", "mi²"), _Unit("sq mi", "area", 2589988.110336, metric=False)),
    (("acre", "acres"), _Unit("acres", "area", 4046.8564224, metric=False)),
    (("kg", "kilogram", "kilograms"), _Unit("kg", "mass", 1.0)),
    (("g", "gram", "grams"), _Unit("g", "mass", 0.001)),
    (("t", "tonne", "tonnes"), _Unit("t", "mass", 1000.0)),
    (("lb", "lbs", "pound", "pounds"), _Unit("lb", "mass", 0.45359237, metric=False)),
    (("oz", "ounce", "ounces"), _Unit("oz", "mass", 0.028349523125, metric=False)),
    (("C", "°C", "c"), _Unit("°C", "temperature", 1.0, offset=273.15)),
    (("F", "°F", "f"), _Unit("°F", "temperature", 5 / 9, offset=459.67, metric=False)),
    (("K",), _Unit("K", "temperature", 1.0)),
    (("km/h", "kph", "kmh"), _Unit("km/h", "speed", 1 / 3.6)),
    (("mph",), _Unit("mph", "speed", 0.44704, metric=False)),
    (("m/s",), _Unit("m/s", "speed", 1.0)),
]
_UNITS: dict[str, _Unit] = {alias: unit for aliases, unit in _UNIT_LIST for alias in aliases}

# {{convert}}'s output unit when the template names none.
_DEFAULT_TARGET = {
    "m": "ft", "km": "mi", "cm": "in", "mm": "in", "ft": "m", "in": "cm", "yd": "m", "mi": "km", "nmi": "km",
    "m²": "sq ft", "km²": "sq mi", "ha": "acre", "sq ft": "m2", "sq mi": "km2", "acres": "ha",
    "kg": "lb", "g": "oz", "t": "lb", "lb": "kg", "oz": "g", "°C": "F", "°F": "C", "K": "C",
    "km/h": "mph", "mph": "km/h", "m/s": "km/h",
}

# Words a {{convert}} range puts between its two values, and how they read.
_RANGE_WORDS = {"-": "–", "–": "–", "to": " to ", "and": " and ", "or": " or ", "x": " × ", "×": " × ",
                "by": " by ", "to(-)": " to ", "and(-)": " and "}


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "").replace("−", "-").replace("\u2212", "-")
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _group(digits: str) -> str:
    """Thousands separators for a plain number string ("-2737.5" -> "-2,737.5")."""
    sign = "-" if digits.startswith("-") else ""
    integer, dot, decimals = digits.lstrip("-").partition(".")
    if integer.isdigit() and len(integer) > 3:
        integer = f"{int(integer):,}"
    return sign + integer + dot + decimals


def _show_input(text: str) -> str:
    value = _number(text)
    if value is None:
        return text.strip()
    plain = text.strip().replace(",", "").replace("−", "-")
    return _group(plain) if re.fullmatch(r"-?\d+(\.\d+)?", plain) else text.strip()


def _input_precision(text: str) -> int:
    """Decimal places the input was given to; trailing zeros of an integer count against it ("1200" -> -2)."""
    plain = text.strip().replace(",", "").lstrip("-−")
    integer, dot, decimals = plain.partition(".")
    if dot:
        return len(decimals)
    return -(len(integer) - len(integer.rstrip("0"))) if integer.strip("0") else 0


def _round_output(value: float, precision: int) -> str:
    if precision >= 0:
        return _group(f"{value:.{precision}f}")
    shift = 10 ** -precision
    return _group(f"{round(value / shift) * shift:.0f}")


def _default_precision(text_in: str, value_in: float, value_out: float, unit_in: _Unit, unit_out: _Unit) -> int:
    """The output precision Wikipedia's convert picks by default: about as precise as the input, and at least two
    significant figures (three in kelvins for temperatures), so 2737 m gives 8,980 ft and 12 m gives 39 ft."""
    precision = _input_precision(text_in)
    if unit_in.kind == "temperature":
        kelvin = abs(unit_in.to_base(value_in))
        least = 2 if kelvin < 1e-8 else 2 - math.floor(math.log10(kelvin) + 1e-14)
        return max(precision, least)
    if value_in == 0 or value_out == 0:
        return 0
    adjust = math.log10(abs(value_in / value_out)) + math.log10(2)
    least = 1 - math.floor(math.log10(abs(value_out)) + 1e-14)
    return max(math.floor(precision + adjust), least)


def _convert_text(values: list[str], joiner: str, unit_name: str, target_name: str | None,
                 precision: int | None = None, sigfig: int | None = None, disp: str = "") -> str:
    """`{{convert}}` as read: "2,737 m (8,980 ft)"; an unknown unit or a value that is not a number gives the
    value and the unit as written."""
    unit_in = _UNITS.get(unit_name.strip())
    shown_in = joiner.join(_show_input(v) for v in values)
    in_text = f"{shown_in} {unit_in.symbol if unit_in else unit_name.strip()}".strip()
    numbers = [_number(v) for v in values]
    if unit_in is None or any(n is None for n in numbers):
        return in_text
    target = (target_name or "").strip().split()[0] if (target_name or "").strip() else \
        _DEFAULT_TARGET.get(unit_in.symbol, "")
    unit_out = _UNITS.get(target)
    if unit_out is None or unit_out.kind != unit_in.kind or unit_out is unit_in:
        return in_text
    outs: list[str] = []
    converted = [unit_out.from_base(unit_in.to_base(n)) for n in numbers if n is not None]
    if precision is None and sigfig is None:
        # One precision for the whole range, the finest any of its values needs.
        precision = max(_default_precision(v, n, o, unit_in, unit_out)
                        for v, n, o in zip(values, numbers, converted) if n is not None)
    for out in converted:
        if sigfig is not None and out != 0:
            digits = max(1, sigfig) - 1 - math.floor(math.log10(abs(out)))
            outs.append(_round_output(out, digits))
        else:
            outs.append(_round_output(out, precision if precision is not None else 0))
    out_text = f"{joiner.join(outs)} {unit_out.symbol}"
    disp = disp.strip().lower()
    if disp in ("out", "output only"):
        return out_text
    if disp == "flip":
        return f"{out_text} ({in_text})"
    if disp == "or":
        return f"{in_text} or {out_text}"
    if disp in ("comma", "x"):
        return f"{in_text}, {out_text}"
    if disp == "slash":
        return f"{in_text}/{out_text}"
    if disp == "sqbr":
        return f"{in_text} [{out_text}]"
    return f"{in_text} ({out_text})"


def _convert(pos: list[str], named: dict[str, str]) -> str:
    if not pos:
        return ""
    values = [pos[0]]
    joiner = ""
    rest = pos[1:]
    # A range: {{convert|10|to|20|m|ft}}, {{convert|30|x|40|m}}.
    while len(rest) >= 2 and rest[0].strip() in _RANGE_WORDS and _number(rest[1]) is not None:
        joiner = _RANGE_WORDS[rest[0].strip()]
        values.append(rest[1])
        rest = rest[2:]
    if not rest:
        return joiner.join(_show_input(v) for v in values)
    unit_name, extra = rest[0], [r.strip() for r in rest[1:]]
    # {{convert|2737|m|0}}: a number where the output unit goes is the precision, the output unit the default.
    if extra and re.fullmatch(r"-?\d+", extra[0]):
        extra.insert(0, "")
    target = extra[0] if extra and extra[0] else None
    precision = int(extra[1]) if len(extra) > 1 and re.fullmatch(r"-?\d+", extra[1]) else None
    sigfig: int | None = None
    if named.get("sigfig", "").strip().isdigit():
        sigfig = int(named["sigfig"].strip())
    return _convert_text(values, joiner, unit_name, target, precision, sigfig, named.get("disp", ""))


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
    numbers = [_number(a) for a in args[:2]]
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
    return f"{_show_input(pos[0])} {unit}".strip()


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


_TEMPLATES: dict[str, Callable[[list[str], dict[str, str]], str]] = {
    "convert": _convert, "cvt": _convert,
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
            return _show_input(arg)
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
_SUPERSCRIPT = {"2": "²", "3": "³"}
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
    except Exception:  # whatever the parser or a renderer trips on, the value's text is still worth keeping
        try:
            return _tidy(html.unescape(text))
        except Exception:
            return " ".join(text.split())


# ---------------------------------------------------------------------------------------------------------------
# Keys

NO_FACT_KEYS: frozenset[str] = frozenset({
    "image", "image_size", "imagesize", "image_upright", "image_alt", "image_caption", "image_class",
    "alt", "caption", "map", "map_type", "map_caption", "map_alt", "map_size", "mapsize", "map_image",
    "image_map", "map_relief", "pushpin_map", "pushpin_map_alt", "pushpin_map_caption", "pushpin_mapsize",
    "pushpin_label", "pushpin_label_position", "pushpin_relief", "pushpin_outside", "logo", "logo_size",
    "logo_alt", "logo_caption", "logo_upright", "signature", "signature_alt", "signature_size",
    "signature_type", "coordinates_display", "coord_display", "display", "coordinates_type", "image_flag",
    "flag_size", "flag_alt", "flag_border", "flag_link", "image_seal", "seal_size", "seal_alt", "seal_type",
    "seal_link", "image_shield", "shield_size", "shield_alt", "shield_link", "image_skyline", "image_blank_emblem",
    "blank_emblem_size", "blank_emblem_type", "blank_emblem_alt", "blank_emblem_link", "dot_map",
    "image_dot_map", "dot_map_caption", "dot_map_size", "dot_map_alt", "embed", "embedded", "child", "module",
    "bodyclass", "bodystyle", "label_position", "relief", "mapframe", "mapframe_zoom", "mapframe_marker",
    "mapframe_caption", "mapframe_frame_width", "mapframe_frame_height", "mapframe_wikidata", "native_name_lang",
    "unit_pref", "onlysourced", "qid", "noicon", "nocat", "photo", "photo_size", "photo_caption", "photo_alt",
    "picture", "picture_size", "icon", "icon_size", "coat_of_arms", "coat_of_arms_size", "image_coat_of_arms",
    "footnotes_image", "anthem_image", "locator_map", "locator_map_caption",
})

# A key with any of these words (image2_size, map_caption, pushpin_relief) describes a picture or the layout.
_NO_FACT_WORDS = frozenset({"image", "img", "imagesize", "caption", "map", "mapsize", "mapframe", "pushpin",
                            "logo", "signature", "photo", "picture", "upright", "relief", "bodystyle", "bodyclass"})
# ... and these only as its last word (alt_name is a fact, image_alt is not).
_NO_FACT_LAST = frozenset({"alt", "display"})
# ... and "_size"/"_link"/"_border"/"_type" only after a picture's name (fleet_size is a fact).
_PICTURE_FIRST = frozenset({"flag", "seal", "shield", "emblem", "blank", "coat", "icon", "dot"})
_PICTURE_LAST = frozenset({"size", "link", "border", "type", "width", "height"})


def _key_words(key: str) -> list[str]:
    norm = re.sub(r"[\s\-]+", "_", key.strip().lower())
    norm = re.sub(r"\d+$", "", norm)
    return [w for w in re.sub(r"(?<=[a-z])\d+(?=_|$)", "", norm).split("_") if w]


def is_fact_key(key: str) -> bool:
    """Whether a key can carry a fact a question asks: image names, captions, alt text, map types, logos,
    signatures and display switches cannot, including their numbered and suffixed variants (image2,
    image_caption, logo_size)."""
    words = _key_words(key)
    if not words:
        return False
    if "_".join(words) in NO_FACT_KEYS:
        return False
    if any(w in _NO_FACT_WORDS for w in words):
        return False
    if len(words) > 1 and words[-1] in _NO_FACT_LAST:
        return False
    if len(words) > 1 and words[0] in _PICTURE_FIRST and words[-1] in _PICTURE_LAST:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# Rows

# Keys Wikipedia shows as one line "label: value": `<base>_title` or `<base>_type` with `<base>_name`, `<base>`
# or `<base>_date` (leader_title/leader_name, seat_type/seat, established_title/established_date), and
# `<base>_name` with `<base>_info` (blank_name_sec1/blank_info_sec1, where the name is the row's label). Each may
# be numbered (leader_title1/leader_name1) or in a section (_sec1).
_LABEL_KEY = re.compile(r"^(?P<base>.+?)_(?P<role>title|type)(?P<suffix>\d*|_sec\d+)$", re.I)
_NAME_KEY = re.compile(r"^(?P<base>.+?)_name(?P<suffix>\d*|_sec\d+)$", re.I)
_VALUE_ROLES = ("_name", "", "_date")

# A key that ends in a unit (elevation_m, area_total_km2, area_total_sq_mi) holds a bare number.
_KEY_UNITS = {"m": "m", "ft": "ft", "km": "km", "mi": "mi", "km2": "km²", "sq_km": "km²", "sqkm": "km²",
              "sq_mi": "sq mi", "sqmi": "sq mi", "mi2": "sq mi", "m2": "m²", "sq_m": "m²", "sq_ft": "sq ft",
              "sqft": "sq ft", "ha": "ha", "acre": "acres", "acres": "acres", "kg": "kg", "lb": "lb",
              "lbs": "lb", "kmh": "km/h", "km_h": "km/h", "mph": "mph"}
_UNIT_KEY = re.compile(r"^(?P<base>.+?)_(?P<unit>" + "|".join(sorted(map(re.escape, _KEY_UNITS), key=len,
                                                                          reverse=True)) + r")$", re.I)
_UNIT_NAME_SUFFIXES = ("_unit", "_units", "_uom")
_BARE_NUMBER = re.compile(r"^[-−+]?\d[\d.,]*(\s*(–|-|to)\s*\d[\d.,]*)?$")


def _find(keys: Mapping[str, str], name: str) -> str | None:
    """The key spelled `name` up to case, as the infobox spells it."""
    return keys.get(name.lower())


def _pairs(order: list[str]) -> dict[str, tuple[str, str, str]]:
    """Each paired key -> (row label, label key, value key); the row label is "" where the label key's value is
    the row's label (name + info)."""
    lower = {k.lower(): k for k in order}
    pairs: dict[str, tuple[str, str, str]] = {}
    for key in order:
        match = _LABEL_KEY.match(key)
        if match and key not in pairs:
            base, suffix = match["base"], match["suffix"]
            for role in _VALUE_ROLES:
                value_key = _find(lower, f"{base}{role}{suffix}")
                if value_key and value_key not in pairs and is_fact_key(value_key):
                    pairs[key] = pairs[value_key] = (base, key, value_key)
                    break
    for key in order:
        match = _NAME_KEY.match(key)
        if match and key not in pairs:
            info_key = _find(lower, f"{match['base']}_info{match['suffix']}")
            if info_key and info_key not in pairs and is_fact_key(info_key):
                pairs[key] = pairs[info_key] = ("", key, info_key)
    return pairs


def _unit_metric(symbol: str) -> bool:
    unit = _UNITS.get(symbol)
    return unit.metric if unit else True


def pair_rows(infobox: Mapping[str, str]) -> list[tuple[str, str]]:
    """An infobox as (label, text) rows in the infobox's order, values cleaned, no-fact keys and values that clean
    to nothing left out, and keys that belong together as one row, so a question that matches one half gets the
    other: `leader_title` + `leader_name` -> ("leader", "Governing Mayor: Kai Wegner"), `blank_name_sec1` +
    `blank_info_sec1` -> (name, info), `height` + `height_unit` -> ("height", "330 m"), and `elevation_m` +
    `elevation_ft` -> ("elevation", "34 m (112 ft)"): one row, metric first."""
    raw = {str(k): (v if isinstance(v, str) else str(v)) for k, v in infobox.items() if v is not None}
    order = [k for k in raw if is_fact_key(k)]
    lower = {k.lower(): k for k in order}
    pairs = _pairs(order)
    cache: dict[str, str] = {}

    def cleaned(key: str) -> str:
        if key not in cache:
            cache[key] = clean_value(raw[key])
        return cache[key]

    used: set[str] = set()
    rows: list[tuple[str, str]] = []
    for key in order:
        if key in used:
            continue
        row: tuple[str, str] | None = None
        if key in pairs:
            label_row, label_key, value_key = pairs[key]
            used.update((label_key, value_key))
            label, value = cleaned(label_key), cleaned(value_key)
            if not label_row:
                row = (label, value) if label and value else (label_key, label) if label else (value_key, value)
            else:
                row = (label_row, f"{label}: {value}" if label and value else label or value)
        else:
            row = _unit_row(key, order, lower, used, cleaned)
            if row is None:
                used.add(key)
                row = (key, cleaned(key))
        if row[1]:
            rows.append(row)
    return rows


def _unit_row(key: str, order: list[str], lower: Mapping[str, str], used: set[str],
              cleaned: Callable[[str], str]) -> tuple[str, str] | None:
    """One row for a value and its unit: `height` + `height_unit`, or the keys `<base>_<unit>` with a bare number
    each (elevation_m, elevation_ft); None where `key` is neither."""
    lkey = key.lower()
    if lkey.endswith(_UNIT_NAME_SUFFIXES):
        value_key = _find(lower, lkey.rsplit("_", 1)[0])
        unit_key = key
    else:
        value_key = key
        unit_key = next((k for s in _UNIT_NAME_SUFFIXES if (k := _find(lower, lkey + s))), None)
    if value_key and unit_key and value_key not in used and unit_key not in used:
        value, unit = cleaned(value_key), cleaned(unit_key)
        if value and _BARE_NUMBER.match(value):
            used.update((value_key, unit_key))
            known = _UNITS.get(unit)
            return value_key, f"{_show_input(value)} {known.symbol if known else unit}".strip()
    match = _UNIT_KEY.match(key)
    if not match or not _BARE_NUMBER.match(cleaned(key)):
        return None
    base = match["base"]
    per = "density" in base.lower()
    parts: list[tuple[bool, str]] = []
    for other in order:
        m = _UNIT_KEY.match(other)
        if not m or other in used or m["base"].lower() != base.lower():
            continue
        value = cleaned(other)
        if not _BARE_NUMBER.match(value):
            continue
        used.add(other)
        symbol = _KEY_UNITS[m["unit"].lower()]
        shown = _show_input(value)
        parts.append((_unit_metric(symbol), f"{shown}/{symbol}" if per else f"{shown} {symbol}"))
    parts.sort(key=lambda p: not p[0])  # metric first; stable otherwise
    return base, parts[0][1] + "".join(f" ({text})" for _, text in parts[1:])
