"""Units in infobox values: MediaWiki's {{convert}} template as Wikipedia renders it (the value, its unit, the
converted value in parentheses, rounded as the template rounds), and the unit table that unit-suffixed keys
(elevation_m, area_total_km2) read their symbols from. Used by models/kg/wikitext.py and models/kg/infobox.py."""

from __future__ import annotations

import math
import re


class Unit:
    __slots__ = ("symbol", "kind", "scale", "offset", "metric")

    def __init__(self, symbol: str, kind: str, scale: float, offset: float = 0.0, metric: bool = True) -> None:
        self.symbol, self.kind, self.scale, self.offset, self.metric = symbol, kind, scale, offset, metric

    def to_base(self, value: float) -> float:
        return (value + self.offset) * self.scale

    def from_base(self, value: float) -> float:
        return value / self.scale - self.offset


_UNIT_LIST: list[tuple[tuple[str, ...], Unit]] = [
    (("m", "metre", "metres", "meter", "meters"), Unit("m", "length", 1.0)),
    (("km", "kilometre", "kilometres", "kilometer", "kilometers"), Unit("km", "length", 1000.0)),
    (("cm", "centimetre", "centimetres", "centimeter", "centimeters"), Unit("cm", "length", 0.01)),
    (("mm", "millimetre", "millimetres", "millimeter", "millimeters"), Unit("mm", "length", 0.001)),
    (("ft", "foot", "feet"), Unit("ft", "length", 0.3048, metric=False)),
    (("in", "inch", "inches"), Unit("in", "length", 0.0254, metric=False)),
    (("yd", "yard", "yards"), Unit("yd", "length", 0.9144, metric=False)),
    (("mi", "mile", "miles"), Unit("mi", "length", 1609.344, metric=False)),
    (("nmi",), Unit("nmi", "length", 1852.0, metric=False)),
    (("m2", "m²", "sqm", "sq m"), Unit("m²", "area", 1.0)),
    (("km2", "km²", "sqkm", "sq km"), Unit("km²", "area", 1e6)),
    (("ha", "hectare", "hectares"), Unit("ha", "area", 1e4)),
    (("sqft", "sq ft", "ft2", "ft²"), Unit("sq ft", "area", 0.09290304, metric=False)),
    (("sqmi", "sq mi", "mi2", "mi²"), Unit("sq mi", "area", 2589988.110336, metric=False)),
    (("acre", "acres"), Unit("acres", "area", 4046.8564224, metric=False)),
    (("kg", "kilogram", "kilograms"), Unit("kg", "mass", 1.0)),
    (("g", "gram", "grams"), Unit("g", "mass", 0.001)),
    (("t", "tonne", "tonnes"), Unit("t", "mass", 1000.0)),
    (("lb", "lbs", "pound", "pounds"), Unit("lb", "mass", 0.45359237, metric=False)),
    (("oz", "ounce", "ounces"), Unit("oz", "mass", 0.028349523125, metric=False)),
    (("C", "°C", "c"), Unit("°C", "temperature", 1.0, offset=273.15)),
    (("F", "°F", "f"), Unit("°F", "temperature", 5 / 9, offset=459.67, metric=False)),
    (("K",), Unit("K", "temperature", 1.0)),
    (("km/h", "kph", "kmh"), Unit("km/h", "speed", 1 / 3.6)),
    (("mph",), Unit("mph", "speed", 0.44704, metric=False)),
    (("m/s",), Unit("m/s", "speed", 1.0)),
]
UNITS: dict[str, Unit] = {alias: unit for aliases, unit in _UNIT_LIST for alias in aliases}

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


def read_number(text: str) -> float | None:
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


def show_input(text: str) -> str:
    value = read_number(text)
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


def _default_precision(text_in: str, value_in: float, value_out: float, unit_in: Unit, unit_out: Unit) -> int:
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
    unit_in = UNITS.get(unit_name.strip())
    shown_in = joiner.join(show_input(v) for v in values)
    in_text = f"{shown_in} {unit_in.symbol if unit_in else unit_name.strip()}".strip()
    numbers = [read_number(v) for v in values]
    if unit_in is None or any(n is None for n in numbers):
        return in_text
    target = (target_name or "").strip().split()[0] if (target_name or "").strip() else \
        _DEFAULT_TARGET.get(unit_in.symbol, "")
    unit_out = UNITS.get(target)
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


def convert(pos: list[str], named: dict[str, str]) -> str:
    if not pos:
        return ""
    values = [pos[0]]
    joiner = ""
    rest = pos[1:]
    # A range: {{convert|10|to|20|m|ft}}, {{convert|30|x|40|m}}.
    while len(rest) >= 2 and rest[0].strip() in _RANGE_WORDS and read_number(rest[1]) is not None:
        joiner = _RANGE_WORDS[rest[0].strip()]
        values.append(rest[1])
        rest = rest[2:]
    if not rest:
        return joiner.join(show_input(v) for v in values)
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
