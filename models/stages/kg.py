"""kg: the KG module (section 4.5 of the seed paper) over the CRAG mock API, for tasks 2 and 3.

Rules path (`kg.method: rules`): one LLM call for the batch extracts each query's domain and entities as JSON
(repaired, or dropped when it cannot be read); domain rules choose the API calls. Functions path
(`kg.method: functions`): the LLM lists the calls itself; each is checked against the endpoint table (name,
argument names and types) before anything is sent, and at most `kg.max_calls` are made. Either way the calls of
the batch run concurrently within the stage's deadline, and each result is shrunk (the price rows up to the
question's date, the first match of a search, no raw wiki text) and rendered as one compact line; a query's
lines are cut to `kg.max_chars` and reach the calculator and reasoning prompts as knowledge-graph results.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from loguru import logger

from models.config import DOMAINS, KGConfig
from models.llm.base import GenParams
from models.stages.base import StageContext
from models.state import QueryState
from utils.kg_api import ENDPOINTS, KGClient
from utils.llm_json import parse_llm_json

RELATIVE_DAYS = (("last night", -1), ("yesterday", -1), ("tonight", 0), ("today", 0), ("this morning", 0))
_DATE = re.compile(r"^\d{4}(-\d{2}(-\d{2})?)?$")
_TICKER = re.compile(r"^[A-Z][A-Z.\-]{0,5}$")
NAME_KEYS = frozenset({"company_name", "movie_name", "person", "artist_name", "band_name", "song_name", "team",
                       "main_entity"})
MAX_LIST = 20
MAX_SUMMARY = 400


def query_date(query_time: str) -> date | None:
    """The date of a CRAG query time ("03/01/2024, 10:00:00 PT") or of an ISO one; None when there is none."""
    text = query_time or ""
    try:
        if match := re.search(r"(\d{1,2})/(\d{1,2})/(\d{4})", text):
            return date(int(match.group(3)), int(match.group(1)), int(match.group(2)))
        if match := re.search(r"(\d{4})-(\d{2})-(\d{2})", text):
            return date(int(match.group(1)), int(match.group(2)), int(match.group(3)))
    except ValueError:
        return None
    return None


def games_date(given: Any, query: str, today: date | None) -> str | None:
    """The date for a games lookup: the query time shifted by a relative word of the question ("last night"),
    else the extracted date if it is well formed, else the month of the query time."""
    lowered = query.lower()
    for words, shift in RELATIVE_DAYS:
        if today and re.search(rf"\b{words}\b", lowered):
            return (today + timedelta(days=shift)).isoformat()
    if isinstance(given, str) and _DATE.match(given.strip()):
        return given.strip()
    return today.strftime("%Y-%m") if today else None


# --- shrinking and rendering results ---

def frame_rows(frame: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of a pandas to_json() frame ({column: {row: value}}), in row order."""
    index = sorted({row for column in frame.values() if isinstance(column, dict) for row in column},
                   key=lambda r: (len(r), r))
    return [{c: v[r] for c, v in frame.items() if isinstance(v, dict) and r in v} for r in index]


def _dated(history: dict[str, Any], until: date | None, keep: int) -> dict[str, Any]:
    """The last `keep` entries of a {"YYYY-MM-DD ...": value} history, up to `until` when given."""
    rows = sorted((k, v) for k, v in history.items() if until is None or k[:10] <= until.isoformat())
    return dict(rows[-keep:])


def _oscars(awards: list[dict[str, Any]]) -> list[str]:
    return [f"{a.get('year_ceremony')} {a.get('category')}: {a.get('name')} ({a.get('film')}, "
            f"{'won' if a.get('winner') else 'nominated'})" for a in awards or [] if isinstance(a, dict)]


def _movie(m: dict[str, Any]) -> dict[str, Any]:
    crew = m.get("crew") or []
    return {"title": m.get("title"), "release_date": m.get("release_date"), "budget": m.get("budget"),
            "revenue": m.get("revenue"), "rating": m.get("rating"),
            "genres": [g.get("name") for g in m.get("genres") or [] if isinstance(g, dict)],
            "directors": [c.get("name") for c in crew if isinstance(c, dict) and c.get("job") == "Director"],
            "cast": [f"{c.get('name')} as {c.get('character')}" for c in (m.get("cast") or [])[:5]
                     if isinstance(c, dict)],
            "oscar_awards": _oscars(m.get("oscar_awards"))}


def _person(p: dict[str, Any]) -> dict[str, Any]:
    return {"name": p.get("name"), "birthday": p.get("birthday"), "oscar_awards": _oscars(p.get("oscar_awards")),
            "acted_movies": len(p.get("acted_movies") or []), "directed_movies": len(p.get("directed_movies") or [])}


def shrink(name: str, result: Any, until: date | None, price_days: int) -> Any:
    """What of a result reaches the prompt: the parts that answer questions, in a bounded size."""
    if name in ("finance_get_price_history", "finance_get_detailed_price_history") and isinstance(result, dict):
        return _dated(result, until, price_days)
    if name == "finance_get_dividends_history" and isinstance(result, dict):
        return _dated(result, until, 4)
    if name in ("movie_get_movie_info", "movie_get_person_info") and isinstance(result, list):
        first = next((r for r in result if isinstance(r, dict)), None)
        return None if first is None else shrink(name + "_by_id", first, until, price_days)
    if name == "movie_get_movie_info_by_id" and isinstance(result, dict):
        return _movie(result)
    if name == "movie_get_person_info_by_id" and isinstance(result, dict):
        return _person(result)
    if name == "movie_get_year_info" and isinstance(result, dict):
        won = [a for a in result.get("oscar_awards") or [] if isinstance(a, dict) and a.get("winner")]
        return {"movies": len(result.get("movie_list") or []), "oscar_winners": _oscars(won)}
    if name == "open_get_entity" and isinstance(result, dict):
        return {"summary": str(result.get("summary_text") or "")[:MAX_SUMMARY],
                **(result.get("summary_structured") or {})}
    if name.startswith("sports_") and isinstance(result, dict):
        return frame_rows(result)[:MAX_LIST]
    return result


def compact(value: Any) -> str:
    """A short, LLM-readable rendering: "k: v; ..." for mappings, comma lists, plain numbers."""
    if isinstance(value, dict):
        return "; ".join(f"{k}: ({compact(v)})" if isinstance(v, dict) else f"{k}: {compact(v)}"
                         for k, v in value.items() if v not in (None, "", [], {}))
    if isinstance(value, list):
        shown = [f"({compact(v)})" if isinstance(v, dict | list) else compact(v) for v in value[:MAX_LIST]]
        return ", ".join(shown) + (f" (and {len(value) - MAX_LIST} more)" if len(value) > MAX_LIST else "")
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e18:
            return str(int(value))
        return f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


def fit_lines(lines: list[str], max_chars: int) -> list[str]:
    """Whole lines while they fit in max_chars together; the first one cut to fit when it alone is too long."""
    kept: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) > max_chars:
            if not kept:
                kept.append(line[:max(max_chars - 1, 0)] + "…")
            break
        kept.append(line)
        used += len(line)
    return kept


# --- making the calls of one query ---

@dataclass
class Lookup:
    """The calls of one query: made through the client before the deadline, rendered as they answer."""

    client: KGClient
    deadline: float
    until: date | None
    settings: KGConfig
    lines: list[str] = field(default_factory=list)
    calls: int = 0

    def get(self, name: str, show: bool = True, **args: Any) -> Any:
        if time.monotonic() >= self.deadline:
            return None
        self.calls += 1
        result = self.client.call(name, args, self.deadline)
        if show and result not in (None, "", [], {}):
            shown = shrink(name, result, self.until, self.settings.price_days)
            if shown not in (None, "", [], {}):
                arguments = ", ".join(f"{k}={v!r}" for k, v in args.items())
                self.lines.append(f"{name}({arguments}): {compact(shown)}")
        return result


def _text(value: Any) -> str | None:
    return value.strip()[:100] if isinstance(value, str) and value.strip() else None


def _year(entities: dict[str, Any]) -> str | None:
    year = str(entities.get("year") or "").strip()
    return year if re.fullmatch(r"\d{4}", year) else None


def _first(results: Any) -> str | None:
    return results[0] if isinstance(results, list) and results and isinstance(results[0], str) else None


def finance_rules(kg: Lookup, entities: dict[str, Any]) -> None:
    ticker = _text(entities.get("ticker"))
    ticker = ticker.upper() if ticker and _TICKER.match(ticker.upper()) else None
    company = _text(entities.get("company_name"))
    if not ticker and company:
        ticker = kg.get("finance_get_ticker_by_name", show=False, company_name=company)
        if not ticker and (match := _first(kg.get("finance_get_company_name", show=False, query=company))):
            ticker = kg.get("finance_get_ticker_by_name", show=False, company_name=match)
    if isinstance(ticker, str) and ticker:
        for name in ("finance_get_price_history", "finance_get_market_capitalization", "finance_get_eps",
                     "finance_get_pe_ratio", "finance_get_dividends_history", "finance_get_info"):
            kg.get(name, ticker_name=ticker)


def movie_rules(kg: Lookup, entities: dict[str, Any]) -> None:
    if movie := _text(entities.get("movie_name")):
        kg.get("movie_get_movie_info", movie_name=movie)
    if person := _text(entities.get("person")):
        kg.get("movie_get_person_info", person_name=person)
    if year := _year(entities):
        kg.get("movie_get_year_info", year=year)


def music_rules(kg: Lookup, entities: dict[str, Any]) -> None:
    if artist := _text(entities.get("artist_name")) or _text(entities.get("band_name")):
        artist = _first(kg.get("music_search_artist_entity_by_name", show=False, artist_name=artist)) or artist
        for name in ("music_get_artist_birth_date", "music_get_artist_birth_place", "music_get_lifespan",
                     "music_get_members", "music_grammy_get_award_count_by_artist",
                     "music_grammy_get_award_date_by_artist", "music_get_artist_all_works"):
            kg.get(name, **({"band_name": artist} if name == "music_get_members" else {"artist_name": artist}))
    day = str(entities.get("date") or "").strip()
    day = day if re.fullmatch(r"\d{4}-\d{2}-\d{2}", day) else None
    if song := _text(entities.get("song_name")):
        song = _first(kg.get("music_search_song_entity_by_name", show=False, song_name=song)) or song
        for name in ("music_get_song_author", "music_get_song_release_date", "music_get_song_release_country",
                     "music_grammy_get_award_count_by_song"):
            kg.get(name, song_name=song)
        for attribute in ("rank", "weeks_in_chart", "top_position") if day else ():
            kg.get("music_get_billboard_attributes", date=day, attribute=attribute, song_name=song)
    if year := _year(entities):
        for name in ("music_grammy_get_best_artist_by_year", "music_grammy_get_best_song_by_year",
                     "music_grammy_get_best_album_by_year"):
            kg.get(name, year=int(year))
    rank = str(entities.get("rank") or "").strip()
    if rank.isdigit() and 1 <= int(rank) <= 100:
        kg.get("music_get_billboard_rank_date", rank=int(rank), **({"date": day} if day else {}))


def sports_rules(kg: Lookup, entities: dict[str, Any], query: str, today: date | None) -> None:
    when = games_date(entities.get("date"), query, today)
    if not when:
        return
    sport = str(entities.get("sport") or "").lower()
    team = _text(entities.get("team"))
    for name in ("sports_soccer_get_games_on_date", "sports_nba_get_games_on_date"):
        if sport not in ("soccer", "nba") or sport in name:
            kg.get(name, date=when, **({"team_name": team} if team else {}))


def open_rules(kg: Lookup, entities: dict[str, Any]) -> None:
    if entity := _text(entities.get("main_entity")):
        match = _first(kg.get("open_search_entity_by_name", show=False, query=entity))
        if match:
            kg.get("open_get_entity", entity=match)


def rule_lookup(kg: Lookup, domain: str, entities: dict[str, Any], query: str, today: date | None) -> None:
    if domain == "finance":
        finance_rules(kg, entities)
    elif domain == "movie":
        movie_rules(kg, entities)
    elif domain == "music":
        music_rules(kg, entities)
    elif domain == "sports":
        sports_rules(kg, entities, query, today)
    else:
        open_rules(kg, entities)


def grounded(value: Any, query: str) -> bool:
    """Whether a name shares a word (3+ letters or a number) with the question: models copy names from the
    prompt's examples or make them up, and a lookup of those only adds noise."""
    words = {w for w in re.findall(r"\w+", str(value).lower()) if len(w) >= 3 or w.isdigit()} - {"the", "and"}
    return bool(words & set(re.findall(r"\w+", query.lower())))


def read_entities(output: str, predicted: str | None, query: str) -> tuple[str, dict[str, Any]] | None:
    """(domain, entities) from the extraction output, or None when it cannot be read. A domain outside the five
    falls back to the attribute predictor's; entity values that are not short strings or numbers are dropped, and
    so are names that share no word with the question."""
    data = parse_llm_json(output, dict)
    if data is None:
        return None
    domain = str(data.get("domain") or "").strip().lower()
    domain = domain if domain in DOMAINS else (predicted if predicted in DOMAINS else "open")
    raw = data.get("entities") if isinstance(data.get("entities"), dict) else {}
    entities = {str(k): v for k, v in raw.items()
                if isinstance(v, int | float | str) and not isinstance(v, bool) and str(v).strip()
                and (k not in NAME_KEYS or grounded(v, query))}
    return domain, entities


def read_calls(output: str, max_calls: int) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """(calls to make, reasons for the ones refused): each call is checked against the endpoint table."""
    accepted: list[tuple[str, dict[str, Any]]] = []
    refused: list[str] = []
    items = parse_llm_json(output, list)
    if items is None:
        return [], ["no JSON list of calls in the output"]
    for item in items:
        if not isinstance(item, dict):
            refused.append(f"{item!r}: not a call object")
            continue
        name = item.get("function_name", item.get("name"))
        args = item.get("args", item.get("arguments", {}))
        endpoint = ENDPOINTS.get(name) if isinstance(name, str) else None
        problem = ("unknown function" if endpoint is None else
                   "args is not an object" if not isinstance(args, dict) else endpoint.problem(args))
        if problem:
            refused.append(f"{name!r}: {problem}")
        elif len(accepted) < max_calls:
            accepted.append((name, args))
        else:
            refused.append(f"{name!r}: over the limit of {max_calls} calls")
    return accepted, refused


class KGStage:
    name = "kg"
    prompt_names = ("kg_entities", "kg_functions")

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        if ctx.kg is None:
            raise RuntimeError("kg stage without a KG client (task 1 never calls the KG)")
        settings = ctx.config.kg
        work = ctx.work_deadline(self.name)
        params = GenParams(max_tokens=settings.max_tokens, temperature=0.0, n=1, deadline=work)
        if settings.method == "functions":
            prompt = ctx.prompts.get("kg_functions")
            functions = [f"{e.signature()}: {e.doc}" for e in ENDPOINTS.values()]
            conversations = [prompt.render(query=s.query, query_time=s.query_time, functions=functions,
                                           max_calls=settings.max_calls) for s in states]
        else:
            prompt = ctx.prompts.get("kg_entities")
            conversations = [prompt.render(query=s.query, query_time=s.query_time, domain=s.domain) for s in states]
        outputs = ctx.llm.generate(conversations, params)
        deadline = time.monotonic() + work.remaining()
        jobs = []
        for state, samples in zip(states, outputs):
            output = samples[0] if samples else ""
            today = query_date(state.query_time)
            kg = Lookup(ctx.kg, deadline, today, settings)
            if settings.method == "functions":
                calls, refused = read_calls(output, settings.max_calls)
                if refused:
                    logger.info("{}: KG calls refused before sending: {}", state.interaction_id, refused)
                jobs.append((state, kg, lambda kg=kg, calls=calls: [kg.get(n, **a) for n, a in calls]))
                continue
            read = read_entities(output, state.domain, state.query)
            if read is None:
                logger.info("{}: KG entity extraction unreadable; no KG lookup", state.interaction_id)
                continue
            domain, entities = read
            jobs.append((state, kg, lambda kg=kg, d=domain, e=entities, q=state.query, t=today:
                         rule_lookup(kg, d, e, q, t)))
        with ThreadPoolExecutor(max_workers=max(1, settings.concurrency)) as pool:
            futures = [pool.submit(job) for _, _, job in jobs]
        for (state, kg, _), future in zip(jobs, futures):
            if error := future.exception():  # one query's lookup bug leaves the others their results
                logger.opt(exception=error).error("{}: KG lookup failed: {}", state.interaction_id, error)
            state.kg_results = fit_lines(kg.lines, settings.max_chars)
            logger.debug("{}: {} KG calls, {} results kept", state.interaction_id, kg.calls, len(state.kg_results))
