"""pint against the hand-written unit table of models/kg/wiki_units.py: the {{convert}} renderings they give and
their speed (docs/decisions/infobox-units.md keeps the table on these numbers).

Every {{convert}} the table can render: each unit to the template's default output unit and to each unit of its
kind, 14 values (integers, decimals, negatives, thousands separators, exact ties), the default precision, 0, 1 and
2 decimals, and 3 significant figures. Each is rendered twice by `convert()`, once with the table's factors and once
with pint computing every conversion (through SI base units, as pint converts), and the texts are compared. pint's
`acre` is the US survey acre; Wikipedia's Convert, and the table, use the international acre: the pint run is made
with pint's acre and again with the international acre defined in pint's registry.

pint is not a dependency (this benchmark decided against it); install it beside the project to run this:

    .venv/bin/pip install --target /tmp/pintlib pint==0.25.3   # the newest on Python 3.11
    PYTHONPATH=/tmp/pintlib .venv/bin/python -m benchmarks.units_pint
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from models.kg import wiki_units
from models.kg.wiki_units import UNITS, Unit
from utils.cli import command
from utils.errors import HarnessError

PINT_NAMES = {"m": "meter", "km": "kilometer", "cm": "centimeter", "mm": "millimeter", "ft": "foot", "in": "inch",
              "yd": "yard", "mi": "mile", "nmi": "nautical_mile", "m²": "meter**2", "km²": "kilometer**2",
              "ha": "hectare", "sq ft": "foot**2", "sq mi": "mile**2", "acres": "acre", "kg": "kilogram", "g": "gram",
              "t": "tonne", "lb": "pound", "oz": "ounce", "°C": "degC", "°F": "degF", "K": "kelvin",
              "km/h": "kilometer/hour", "mph": "mile/hour", "m/s": "meter/second"}
VALUES = ["0", "1", "12", "37", "2737", "1200", "-40", "3.5", "0.25", "100000", "98.6", "5280", "1,234.5", "-273.15"]
PRECISIONS: list[tuple[str | None, str | None]] = [(None, None), ("0", None), ("1", None), ("2", None), (None, "3")]


class PintUnit(Unit):
    """A table unit whose conversions pint computes, to and from SI base units."""

    def __init__(self, unit: Unit, registry: Any, name: str) -> None:
        super().__init__(unit.symbol, unit.kind, unit.scale, unit.offset, unit.metric)
        self.registry, self.unit = registry, registry.Unit(name)
        self.base = registry.Quantity(1, self.unit).to_base_units().units

    def to_base(self, value: float) -> float:
        return float(self.registry.Quantity(value, self.unit).to(self.base).magnitude)

    def from_base(self, value: float) -> float:
        return float(self.registry.Quantity(value, self.base).to(self.unit).magnitude)


def cases() -> list[tuple[list[str], dict[str, str]]]:
    table = {unit.symbol: unit for unit in UNITS.values()}
    found = []
    for source, unit in sorted(table.items()):
        for target in [None, *(s for s, other in sorted(table.items()) if other.kind == unit.kind)]:
            for value in VALUES:
                for precision, sigfig in PRECISIONS:
                    positional = [value, source, *([target or ""] if target or precision else []),
                                  *([precision] if precision else [])]
                    found.append((positional, {"sigfig": sigfig} if sigfig else {}))
    return found


def render(table: dict[str, Unit], todo: list[tuple[list[str], dict[str, str]]]) -> tuple[list[str], float]:
    saved = dict(UNITS)
    UNITS.clear()
    UNITS.update(table)
    try:
        start = time.perf_counter()
        texts = [wiki_units.convert(positional, named) for positional, named in todo]
        return texts, time.perf_counter() - start
    finally:
        UNITS.clear()
        UNITS.update(saved)


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    try:
        import pint
    except ImportError:
        raise HarnessError("pint is not installed: see `python -m benchmarks.units_pint --help` for the two "
                           "commands that run this") from None
    todo = cases()
    ours, ours_s = render(dict(UNITS), todo)
    print(f"{len(todo)} {{{{convert}}}} renderings; the table: {ours_s / len(todo) * 1e6:.1f} us each")
    for label, acre in (("pint, its acre (US survey)", "acre"),
                        ("pint, the international acre", "international_acre")):
        start = time.perf_counter()
        registry = pint.UnitRegistry()
        registry_s = time.perf_counter() - start
        if acre == "international_acre":
            registry.define("international_acre = 4046.8564224 * meter ** 2")
        made: dict[int, Unit] = {}
        table = {alias: made.setdefault(id(unit), PintUnit(unit, registry, {**PINT_NAMES, "acres": acre}[unit.symbol]))
                 for alias, unit in UNITS.items()}
        theirs, theirs_s = render(table, todo)
        differ = [(case, a, b) for case, a, b in zip(todo, ours, theirs) if a != b]
        print(f"{label} {pint.__version__}: registry {registry_s:.2f} s, {theirs_s / len(todo) * 1e6:.1f} us each "
              f"({theirs_s / ours_s:.1f}x the table); {len(differ)} of {len(todo)} differ")
        pairs = Counter(f"{case[0][1]}->{case[0][2] if len(case[0]) > 2 and case[0][2] else 'default'}"
                        for case, _, _ in differ)
        print("  by units: " + ", ".join(f"{pair} {n}" for pair, n in pairs.most_common(8)))
        for (positional, named), a, b in differ[:6]:
            print(f"  {{{{convert|{'|'.join(positional)}{''.join(f'|{k}={v}' for k, v in named.items())}}}}}: "
                  f"table {a!r}, pint {b!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
