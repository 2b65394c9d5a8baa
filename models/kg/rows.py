"""What of a KG result reaches the prompt: each result split into rows (one attribute, one award, one game, one
day's prices), the rows of a query ranked by relevance to its question, and whole rows kept within a budget.

A row names its entity ("Inception", "AAPL", "Manchester Utd"), so a row read alone still says what it is about.
Relevance adds three signals: the question's words (folded, cut to five letters so "directed" meets "director")
found in the row; three more for a date the question names; and, where the stage could embed them, the cosine of
question and row scaled by SIMILARITY_WEIGHT, so "how tall" finds a "height" row that shares no word with it.
Ties keep the order in which the results came.

An open-domain entity's infobox comes as raw MediaWiki values; its rows are the cleaned ones of models/kg/infobox.py
(templates rendered, links as labels, picture and layout keys left out, `*_title` + `*_name` as one row).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from typing import Any

from models.kg.infobox import pair_rows
from utils.names import fold

MAX_ROW = 400  # characters of one row (a long summary or list is cut here, never a whole query's budget)
MAX_CAST = 15  # cast members of a film
MAX_CHART = 15  # Billboard entries of a rank asked without a date
# One unit of cosine counts as this many shared words: a row that means what the question asks outranks one that
# only shares a word more with it, while the entity's name (shared by all its rows) still picks the entity.
SIMILARITY_WEIGHT = 4.0
# Infobox keys that restate the entity's name, already at the start of each of its rows.
NAME_KEYS = frozenset({"name", "title", "common_name", "conventional_long_name", "official_name"})
_STOP = frozenset("a an and are at be by did do does for from has have how in is it of on or the to was were what "
                  "when where which who whom whose why with s".split())
_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
                                       "dec"), start=1)}
_MONTH = r"(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_MONTH_DAY = re.compile(rf"\b{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s+(\d{{4}}))?\b")
_DAY_MONTH = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}(?:,?\s+(\d{{4}}))?\b")


@dataclass(frozen=True)
class Row:
    text: str
    order: int  # where it came among the query's rows: ties in relevance keep this order



def present(value: object) -> bool:
    """Whether a KG value says something: not None, "", [] or {}."""
    return value not in (None, "", [], {})

def named_dates(text: str, today: date | None) -> set[str]:
    """The ISO dates a question names: "2024-01-16", "jan 16 2024", "16th of january", "march 2, 2024"; a day
    without a year takes the year of `today`."""
    lowered = text.lower()
    found = {m.group(0) for m in _ISO.finditer(lowered)}
    for regex, month_group, day_group in ((_MONTH_DAY, 1, 2), (_DAY_MONTH, 2, 1)):
        for match in regex.finditer(lowered):
            year = int(match.group(3)) if match.group(3) else (today.year if today else None)
            month, day = _MONTHS[match.group(month_group)[:3]], int(match.group(day_group))
            try:
                found.add(date(year, month, day).isoformat()) if year else None
            except ValueError:  # "feb 30"
                continue
    return found


def terms(text: str) -> set[str]:
    """Content words, folded and cut to five letters."""
    return {word[:5] for word in fold(text).split() if word not in _STOP}


def rank(rows: list[Row], question: str, dates: set[str], similarity: list[float] | None = None) -> list[Row]:
    """`rows` by relevance to the question, most relevant first; `similarity[i]`, where given, is the cosine of
    the question and rows[i] (a row without one, say the embedding ran out of time, scores on words and dates)."""
    wanted = terms(question)
    cosine = similarity or []

    def score(index: int) -> float:
        row = rows[index]
        meaning = SIMILARITY_WEIGHT * cosine[index] if index < len(cosine) else 0.0
        return len(wanted & terms(row.text)) + 3 * any(d in row.text for d in dates) + meaning

    return [rows[i] for i in sorted(range(len(rows)), key=lambda i: (-score(i), rows[i].order))]


def fit(rows: Iterable[Row], max_chars: int) -> list[str]:
    """The texts of whole rows, in the order given, while they fit in max_chars together (a row that does not fit
    is passed over for smaller ones after it)."""
    kept: list[str] = []
    used = 0
    for row in rows:
        if used + len(row.text) <= max_chars:
            kept.append(row.text)
            used += len(row.text)
    return kept


def value(item: Any) -> str:
    """A short rendering: plain numbers (no trailing ".0"), comma lists, "k: v; ..." for mappings."""
    if isinstance(item, float):
        return str(int(item)) if item.is_integer() and abs(item) < 1e18 else f"{item:.4f}".rstrip("0").rstrip(".")
    if isinstance(item, dict):
        return "; ".join(f"{k}: {value(v)}" for k, v in item.items() if present(v))
    if isinstance(item, list):
        return ", ".join(value(v) for v in item if present(v))
    return str(item)


def label(key: str) -> str:
    """A field name as words: "original_title" and "fullTimeEmployees" read "original title", "full time employees"."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", key).replace("_", " ").lower()


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ROW else text[:MAX_ROW - 1] + "…"


def _oscar(award: dict[str, Any]) -> str:
    outcome = "won" if award.get("winner") else "nominated"
    return (f"{award.get('year_ceremony')} oscar {str(award.get('category', '')).lower()}: {award.get('name')} "
            f"({award.get('film')}), {outcome}")


def movie_rows(movie: dict[str, Any]) -> list[str]:
    title = movie.get("title")
    rows = [f"{title} {label(k)}: {value(movie[k])}" for k in ("release_date", "original_title", "original_language",
                                                                "budget", "revenue", "rating")
            if movie.get(k) not in (None, "")]
    genres = [g.get("name") for g in movie.get("genres") or [] if isinstance(g, dict)]
    if genres:
        rows.append(f"{title} genres: {', '.join(map(str, genres))}")
    jobs: dict[str, list[str]] = {}
    for member in movie.get("crew") or []:
        if isinstance(member, dict) and member.get("job"):
            jobs.setdefault(str(member["job"]).lower(), []).append(str(member.get("name")))
    rows += [f"{title} {job}: {', '.join(names)}" for job, names in jobs.items()]
    rows += [f"{title} cast: {c.get('name')} as {c.get('character')}" for c in (movie.get("cast") or [])[:MAX_CAST]
             if isinstance(c, dict)]
    rows += [f"{title}: {_oscar(a)}" for a in movie.get("oscar_awards") or [] if isinstance(a, dict)]
    return rows


def person_rows(person: dict[str, Any]) -> list[str]:
    name = person.get("name")
    rows = [f"{name} birthday: {person['birthday']}"] if person.get("birthday") else []
    rows += [f"{name} {label(k)}: {len(person.get(k) or [])}" for k in ("acted_movies", "directed_movies")
             if person.get(k)]
    rows += [f"{name}: {_oscar(a)}" for a in person.get("oscar_awards") or [] if isinstance(a, dict)]
    return rows


def year_rows(year: str, info: dict[str, Any]) -> list[str]:
    """One row per award (winners first) and one naming every film that won, with its count: a set question ("which
    films won an oscar in 2020") is answered by that row alone, where the award rows would not fit the budget."""
    awards = [a for a in info.get("oscar_awards") or [] if isinstance(a, dict)]
    won = Counter(str(a.get("film")) for a in awards if a.get("winner") and present(a.get("film")))
    rows = [f"{year} oscars, films that won (awards): {', '.join(f'{film} ({n})' for film, n in won.items())}"
            ] if won else []
    rows += [_oscar(a) for a in sorted(awards, key=lambda a: not a.get("winner"))]  # winners first
    if info.get("movie_list"):
        rows.append(f"{year} movies in the KG: {len(info['movie_list'])}")
    return rows


def entity_rows(name: str, entity: dict[str, Any]) -> list[str]:
    """The lead, then one row per fact of the infobox (raw MediaWiki values made readable)."""
    rows = [f"{name}: {entity['summary_text']}"] if entity.get("summary_text") else []
    structured = entity.get("summary_structured")
    if not isinstance(structured, dict):
        return rows
    readable = {str(k): v if isinstance(v, str) else value(v) for k, v in structured.items()
                if present(v) and str(k).lower() not in NAME_KEYS}
    return rows + [f"{name} {label(key)}: {text}" for key, text in pair_rows(readable)]


def dated_rows(label: str, history: dict[str, Any], until: date | None, keep: int, dates: set[str]) -> list[str]:
    """The last `keep` entries of a {"YYYY-MM-DD ...": value} history up to `until`, and those on a named date."""
    entries = sorted((k, v) for k, v in history.items() if until is None or k[:10] <= until.isoformat())
    chosen = [e for e in entries if e[0][:10] in dates] + entries[-keep:]
    return [f"{label} {k[:10] if k.endswith('00:00:00 EST') else k}: {value(v)}"
            for k, v in dict(chosen).items()]


def frame_rows(frame: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(row key, row) of a pandas to_json() frame ({column: {row key: value}}), in row order."""
    keys = list(dict.fromkeys(k for column in frame.values() if isinstance(column, dict) for k in column))
    keys.sort(key=lambda k: (len(k), k) if k.isdigit() else (0, k))
    return [(k, {c: v[k] for c, v in frame.items() if isinstance(v, dict) and k in v}) for k in keys]


def soccer_team(key: str) -> str | None:
    """The team of a soccer row key, the str() of its (league, season, team, game) index."""
    try:
        parts = ast.literal_eval(key)
    except (ValueError, SyntaxError):
        return None
    return str(parts[2]) if isinstance(parts, tuple) and len(parts) == 4 else None


def soccer_row(team: str | None, game: dict[str, Any]) -> str:
    when = str(game.get("date") or "")[:10]
    score = f"{value(game.get('GF'))}-{value(game.get('GA'))}"
    where = ", ".join(str(game[k]) for k in ("venue", "round") if game.get(k))
    return (f"soccer {when}: {team} vs {game.get('opponent')}" + (f" ({where})" if where else "") +
            f": {game.get('result')} {score}" + (f", captain {game['Captain']}" if game.get("Captain") else ""))


def nba_row(game: dict[str, Any]) -> str:
    when = str(game.get("game_date") or "")[:10]
    return (f"nba {when}: {game.get('team_name_home')} {value(game.get('pts_home'))} - "
            f"{value(game.get('pts_away'))} {game.get('team_name_away')} (home {game.get('wl_home')}, "
            f"{game.get('season_type')}, game {game.get('game_id')})")


def play_row(event: dict[str, Any]) -> str:
    said = next((event[k] for k in ("homedescription", "visitordescription", "neutraldescription") if event.get(k)),
                "")
    who = f" ({event['player1_name']})" if event.get("player1_name") else ""
    return f"nba game {event.get('game_id')} period {event.get('period')} {event.get('pctimestring')}: {said}{who}"


def as_rows(texts: Iterable[str], start: int) -> list[Row]:
    return [Row(_cut(text), start + i) for i, text in enumerate(texts)]
