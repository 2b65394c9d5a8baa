"""The rows of an open-domain entity's infobox: which keys carry a fact (`is_fact_key`), and keys that belong
together rendered as one row (`pair_rows`), each value as the text a reader sees (models/kg/wikitext.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from models.kg.wiki_units import UNITS, show_input
from models.kg.wikitext import clean_value

__all__ = ["NO_FACT_KEYS", "is_fact_key", "pair_rows"]

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
    unit = UNITS.get(symbol)
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
        unit_key = next((k for s in _UNIT_NAME_SUFFIXES if (k := _find(lower, lkey + s))), "")
    if value_key and unit_key and value_key not in used and unit_key not in used:
        value, unit = cleaned(value_key), cleaned(unit_key)
        if value and _BARE_NUMBER.match(value):
            used.update((value_key, unit_key))
            known = UNITS.get(unit)
            return value_key, f"{show_input(value)} {known.symbol if known else unit}".strip()
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
        shown = show_input(value)
        parts.append((_unit_metric(symbol), f"{shown}/{symbol}" if per else f"{shown} {symbol}"))
    parts.sort(key=lambda p: not p[0])  # metric first; stable otherwise
    return base, parts[0][1] + "".join(f" ({text})" for _, text in parts[1:])
