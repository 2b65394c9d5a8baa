"""The KG stage's lookups (models/kg/kg_stage.py): the query's date, the domain rules that choose the API calls from
the extracted entities (rules path), the checked calls the LLM lists itself (functions path), and `Lookup`, which
makes one query's calls within the deadline, resolves names through the server's own searches and turns results into
rows (models/kg/rows.py).
"""


from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from loguru import logger
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

from models.config import DOMAINS
from models.kg import rows as rows_
from models.kg.client import ENDPOINTS, KGClient
from models.kg.settings import KGSettings
from utils.llm_json import parse_llm_json
from utils.names import MATCH, best_matches, fold, name_score
from utils.time_budget import Deadline

RELATIVE_DAYS = (("last night", -1), ("yesterday", -1), ("tonight", 0), ("today", 0), ("this morning", 0))
_DATE = re.compile(r"^\d{4}(-\d{2}(-\d{2})?)?$")
NAME_KEYS = frozenset({"company_name", "movie_name", "person", "artist_name", "band_name", "song_name", "team",
                       "main_entity"})


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


# --- names: resolved through the server's own searches ---

# Words a company's stored name adds that a question leaves out ("Apple Inc.", "Alphabet Inc. Class A").
LEGAL_WORDS = frozenset("inc incorporated corp corporation co company ltd limited plc llc sa ag nv se the holdings "
                        "group class a b c".split())
# Soccer teams as questions name them -> as the organisers' data (FBref) writes them. Names the data writes as
# questions do ("Arsenal", "Liverpool") need no entry; NBA teams match by their words ("lakers").
TEAM_ALIASES = {
    "manchester united": "Manchester Utd", "man united": "Manchester Utd", "man utd": "Manchester Utd",
    "man city": "Manchester City", "newcastle united": "Newcastle Utd", "newcastle": "Newcastle Utd",
    "sheffield united": "Sheffield Utd", "nottingham forest": "Nott'ham Forest", "west ham united": "West Ham",
    "tottenham hotspur": "Tottenham", "spurs": "Tottenham", "wolverhampton wanderers": "Wolves",
    "brighton and hove albion": "Brighton", "brighton hove albion": "Brighton", "paris saint germain": "Paris S-G",
    "psg": "Paris S-G", "inter milan": "Inter", "ac milan": "Milan", "atletico madrid": "Atlético Madrid",
}
_TICKER = re.compile(r"^[A-Za-z]{1,5}(?:\.[A-Za-z])?$")

# What each music call's value is, for its row.
MUSIC_LABELS = {
    "music_get_artist_birth_place": "birth country", "music_get_artist_birth_date": "birth date (a band: its start)",
    "music_get_members": "members", "music_grammy_get_award_count_by_artist": "grammy awards won",
    "music_grammy_get_award_date_by_artist": "grammy award years", "music_get_artist_all_works": "works",
    "music_get_song_author": "author", "music_get_song_release_country": "release country",
    "music_get_song_release_date": "release date", "music_grammy_get_award_count_by_song": "grammy awards won",
    "music_grammy_get_best_artist_by_year": "best new artist", "music_grammy_get_best_song_by_year":
    "song of the year", "music_grammy_get_best_album_by_year": "album of the year",
}
FINANCE_LABELS = {"finance_get_market_capitalization": "market capitalization", "finance_get_eps":
                  "earnings per share (eps)", "finance_get_pe_ratio": "price to earnings (p/e) ratio"}


@dataclass
class Lookup:
    """The calls of one query, made through the client before the deadline, and the rows their results give."""

    client: KGClient
    deadline: Deadline
    until: date | None
    settings: KGSettings
    query: str = ""
    dates: set[str] = field(default_factory=set)
    rows: list[rows_.Row] = field(default_factory=list)
    made: list[dict[str, Any]] = field(default_factory=list)  # {"call", "args", "answered"} per call sent
    cut: bool = False  # whether the deadline ended the lookup before all its calls were sent

    @property
    def calls(self) -> int:
        return len(self.made)

    def expired(self) -> bool:
        """Whether the deadline has passed; a lookup that asks after it is cut (`cut`)."""
        self.cut = self.cut or self.deadline.expired()
        return self.cut

    def get(self, name: str, **args: Any) -> Any:
        """The result of one call, or None (no time left, nothing found, a failure)."""
        if self.expired():
            return None
        result = self.client.call(name, args, self.deadline)
        self.made.append({"call": name, "args": args, "answered": rows_.present(result)})
        return result

    def show(self, name: str, **args: Any) -> Any:
        """Call `name` and add the rows of its result."""
        result = self.get(name, **args)
        if rows_.present(result):
            self.add(self.render(name, args, result))
        return result

    def add(self, texts: list[str]) -> None:
        self.rows.extend(rows_.as_rows(texts, len(self.rows)))

    def render(self, name: str, args: dict[str, Any], result: Any) -> list[str]:
        """The rows of one result; a movie or person search keeps only the entries whose name matches."""
        key = next(iter(args.values()), "")
        if name in ("finance_get_price_history", "finance_get_detailed_price_history", "finance_get_dividends_history"):
            label = {"finance_get_price_history": "daily price", "finance_get_detailed_price_history":
                     "price by minute", "finance_get_dividends_history": "dividend"}[name]
            keep = 4 if "dividend" in name else self.settings.price_days
            return rows_.dated_rows(f"{key} {label}", result, self.until, keep, self.dates) \
                if isinstance(result, dict) else []
        if name in FINANCE_LABELS:
            return [f"{key} {FINANCE_LABELS[name]}: {rows_.value(result)}"]
        if name == "finance_get_info" and isinstance(result, dict):
            return [f"{key} {rows_.label(k)}: {rows_.value(v)}" for k, v in result.items()
                    if isinstance(v, str | int | float) and not isinstance(v, bool)]
        if name in ("movie_get_movie_info", "movie_get_person_info") and isinstance(result, list):
            field_ = "title" if name == "movie_get_movie_info" else "name"
            entries = [e for e in result if isinstance(e, dict) and e.get(field_)]
            chosen = set(best_matches(str(key), [str(e[field_]) for e in entries], limit=2))
            render = rows_.movie_rows if field_ == "title" else rows_.person_rows
            return [row for e in entries if e[field_] in chosen for row in render(e)]
        if name == "movie_get_movie_info_by_id" and isinstance(result, dict):
            return rows_.movie_rows(result)
        if name == "movie_get_person_info_by_id" and isinstance(result, dict):
            return rows_.person_rows(result)
        if name == "movie_get_year_info" and isinstance(result, dict):
            return rows_.year_rows(str(key), result)
        if name == "open_get_entity" and isinstance(result, dict):
            return rows_.entity_rows(str(key), result)
        if name == "music_get_lifespan" and isinstance(result, list):
            born, died = (result + [None, None])[:2]
            return [f"{key} lifespan: {born or '?'} to {died or 'present'}"] if born or died else []
        if name == "music_get_billboard_rank_date" and isinstance(result, list) and len(result) == 2:
            songs, artists = (r if isinstance(r, list) else [] for r in result)
            when = args.get("date") or "some week"
            return [f"billboard hot 100 rank {args.get('rank')} on {when}: {s} by {a}"
                    for s, a in list(zip(songs, artists))[:rows_.MAX_CHART]]
        if name == "music_get_billboard_attributes":
            return [f"{args.get('song_name')} billboard {args.get('attribute')} on {args.get('date')}: "
                    f"{rows_.value(result)}"]
        if name in MUSIC_LABELS:
            subject = f"grammy {key}" if "by_year" in name else key
            return [f"{subject} {MUSIC_LABELS[name]}: {rows_.value(result)}"]
        if name == "sports_nba_get_play_by_play_data_by_game_ids" and isinstance(result, dict):
            return [rows_.play_row(event) for _, event in rows_.frame_rows(result)]
        if name in ("sports_soccer_get_games_on_date", "sports_nba_get_games_on_date") and isinstance(result, dict):
            return self.games(name, result, None)
        if name in SEARCHES:
            return []  # names to resolve, not facts
        arguments = ", ".join(f"{k}={v!r}" for k, v in args.items())
        return [f"{name}({arguments}): {rows_.value(result)}"]

    # resolution: a name as written -> the names the server stores

    def tickers(self, written: Any) -> list[str]:
        """The tickers a company name or ticker as written stands for: itself when the server knows it as a
        ticker, else those of the best-matching companies of the name search (a tie of two is kept)."""
        text = _text(written)
        if not text:
            return []
        if _TICKER.match(text) and self.get("finance_get_info", ticker_name=text.upper()) is not None:
            return [text.upper()]
        names = self.get("finance_get_company_name", query=text)
        matched = best_matches(text, names if isinstance(names, list) else [], LEGAL_WORDS, limit=2)
        found = [self.get("finance_get_ticker_by_name", company_name=n) for n in matched]
        return list(dict.fromkeys(t for t in found if isinstance(t, str) and t))

    def names(self, search: str, written: Any, limit: int) -> list[str]:
        """The stored names of `search`'s results (a search endpoint) that match the written name."""
        text = _text(written)
        if not text:
            return []
        found = self.get(search, **{next(iter(ENDPOINTS[search].args)).name: text})
        return best_matches(text, [n for n in found if isinstance(n, str)] if isinstance(found, list) else [],
                            limit=limit)

    def games(self, name: str, frame: dict[str, Any], team: Any) -> list[str]:
        """The rows of a games frame, only those of `team` (as written: aliases and words matched) when given."""
        wanted = _text(team)
        wanted = TEAM_ALIASES.get(fold(wanted), wanted) if wanted else None
        rows = []
        for key, game in rows_.frame_rows(frame):
            if name == "sports_soccer_get_games_on_date":
                side = rows_.soccer_team(key)
                teams, text = [side or ""], rows_.soccer_row(side, game)
            else:
                teams, text = [str(game.get("team_name_home")), str(game.get("team_name_away"))], rows_.nba_row(game)
            if wanted is None or any(name_score(wanted, t) >= MATCH for t in teams):
                rows.append((text, game))
        if name == "sports_nba_get_games_on_date" and wanted and 0 < len(rows) <= 2:
            ids = [str(g["game_id"]) for _, g in rows if g.get("game_id")]
            self.show("sports_nba_get_play_by_play_data_by_game_ids", game_ids=ids)
        return [text for text, _ in rows]


SEARCHES = frozenset({"open_search_entity_by_name", "finance_get_company_name", "music_search_artist_entity_by_name",
                      "music_search_song_entity_by_name", "finance_get_ticker_by_name"})


def _text(value: Any) -> str | None:
    return value.strip()[:100] if isinstance(value, str) and value.strip() else None


def _year(entities: dict[str, Any]) -> str | None:
    year = str(entities.get("year") or "").strip()
    return year if re.fullmatch(r"\d{4}", year) else None


# --- the rules path: the domain's calls for the extracted entities ---

def finance_rules(kg: Lookup, entities: dict[str, Any]) -> None:
    for ticker in kg.tickers(entities.get("ticker")) or kg.tickers(entities.get("company_name")):
        for name in ("finance_get_price_history", "finance_get_market_capitalization", "finance_get_eps",
                     "finance_get_pe_ratio", "finance_get_dividends_history", "finance_get_info"):
            kg.show(name, ticker_name=ticker)


def movie_rules(kg: Lookup, entities: dict[str, Any]) -> None:
    if movie := _text(entities.get("movie_name")):
        kg.show("movie_get_movie_info", movie_name=movie)
    if person := _text(entities.get("person")):
        kg.show("movie_get_person_info", person_name=person)
    if year := _year(entities):
        kg.show("movie_get_year_info", year=year)


def music_rules(kg: Lookup, entities: dict[str, Any]) -> None:
    written = _text(entities.get("artist_name")) or _text(entities.get("band_name"))
    for artist in kg.names("music_search_artist_entity_by_name", written, limit=2):
        for name in ("music_get_artist_birth_date", "music_get_artist_birth_place", "music_get_lifespan",
                     "music_get_members", "music_grammy_get_award_count_by_artist",
                     "music_grammy_get_award_date_by_artist", "music_get_artist_all_works"):
            kg.show(name, **({"band_name": artist} if name == "music_get_members" else {"artist_name": artist}))
    day = str(entities.get("date") or "").strip()
    day = day if re.fullmatch(r"\d{4}-\d{2}-\d{2}", day) else ""
    for song in kg.names("music_search_song_entity_by_name", entities.get("song_name"), limit=2):
        for name in ("music_get_song_author", "music_get_song_release_date", "music_get_song_release_country",
                     "music_grammy_get_award_count_by_song"):
            kg.show(name, song_name=song)
        for attribute in ("rank", "weeks_in_chart", "top_position") if day else ():
            kg.show("music_get_billboard_attributes", date=day, attribute=attribute, song_name=song)
    if year := _year(entities):
        for name in ("music_grammy_get_best_artist_by_year", "music_grammy_get_best_song_by_year",
                     "music_grammy_get_best_album_by_year"):
            kg.show(name, year=int(year))
    rank = str(entities.get("rank") or "").strip()
    if rank.isdigit() and 1 <= int(rank) <= 100:
        kg.show("music_get_billboard_rank_date", rank=int(rank), **({"date": day} if day else {}))


def sports_rules(kg: Lookup, entities: dict[str, Any], today: date | None) -> None:
    when = games_date(entities.get("date"), kg.query, today)
    if not when:
        return
    sport = str(entities.get("sport") or "").lower()
    for name in ("sports_soccer_get_games_on_date", "sports_nba_get_games_on_date"):
        if sport not in ("soccer", "nba") or sport in name:
            games_of(kg, name, when, entities.get("team"))


def games_of(kg: Lookup, name: str, when: str, team: Any) -> None:
    """The games of a date, asked without the team (the server wants its own spelling of it) and filtered here."""
    frame = kg.get(name, date=when)
    if isinstance(frame, dict):
        kg.add(kg.games(name, frame, team))


def open_rules(kg: Lookup, entities: dict[str, Any]) -> None:
    for entity in kg.names("open_search_entity_by_name", entities.get("main_entity"), limit=3):
        kg.show("open_get_entity", entity=entity)


def rule_lookup(kg: Lookup, domain: str, entities: dict[str, Any], today: date | None) -> None:
    if isinstance(entities.get("date"), str):
        kg.dates.add(entities["date"].strip())
    if domain == "finance":
        finance_rules(kg, entities)
    elif domain == "movie":
        movie_rules(kg, entities)
    elif domain == "music":
        music_rules(kg, entities)
    elif domain == "sports":
        sports_rules(kg, entities, today)
    else:
        open_rules(kg, entities)


# --- the spans path: no LLM; the question's own words as the predicted domain's names ---

# The names each domain's rules look up: a span is tried as each of them.
SPAN_KEYS = {"finance": ("company_name",), "movie": ("movie_name", "person"), "music": ("artist_name", "song_name"),
             "sports": ("team",), "open": ("main_entity",)}
_YEAR = re.compile(r"\b(?:19|20)\d{2}\b")
# Words that name no entity beyond English's stop words: auxiliaries, and the words of dates and times, which the
# question's year and named dates carry to the rules instead.
_NOT_NAMES = ENGLISH_STOP_WORDS | {"did", "does", "today", "yesterday", "tonight", "tomorrow", "night", "week",
                                   "month", "year", "january", "february", "march", "april", "june", "july", "august",
                                   "september", "october", "november", "december", "jan", "feb", "mar", "apr", "jun",
                                   "jul", "aug", "sep", "sept", "oct", "nov", "dec"}


def question_spans(query: str, limit: int) -> list[str]:
    """Where a name may be in the question: every part of each run of words between stop words, numbers and date
    words ("what's the market cap of meta?": "market cap", "meta", "market", "cap"), longer first, then in the
    question's order; at most `limit`, each once."""
    words = fold(query).split()
    stop = [w in _NOT_NAMES or w.isdigit() or len(w) == 1 for w in words]  # "s": "what's" folds to "what s"
    found = [(end - start, start, " ".join(words[start:end])) for start in range(len(words))
             for end in range(start + 1, len(words) + 1) if not any(stop[start:end])]
    return list(dict.fromkeys(text for _, _, text in sorted(found, key=lambda f: (-f[0], f[1]))))[:limit]


def span_lookup(kg: Lookup, domain: str, today: date | None, limit: int) -> None:
    """The spans path: each span of the question in turn as every name the domain's rules look up, until one
    brings rows; the question's year and named date go with each. A span that names nothing the server stores
    costs its searches and adds no row (names are resolved before any lookup)."""
    given: dict[str, Any] = {"date": min(kg.dates)} if kg.dates else {}
    if year := _YEAR.search(kg.query):
        given["year"] = year.group(0)
    for span in question_spans(kg.query, limit) or [""]:
        if kg.expired():
            return
        found = len(kg.rows)
        rule_lookup(kg, domain, {**given, **dict.fromkeys(SPAN_KEYS[domain], span)}, today)
        if len(kg.rows) > found:
            return


# --- the functions path: the LLM's calls, with its names resolved first ---

_RESOLVED_BY = {"artist_name": ("music_search_artist_entity_by_name", 2), "band_name":
                ("music_search_artist_entity_by_name", 2), "song_name": ("music_search_song_entity_by_name", 2),
                "entity": ("open_search_entity_by_name", 3)}


def function_lookup(kg: Lookup, calls: list[tuple[str, dict[str, Any]]]) -> None:
    """Make the LLM's calls with every name resolved as the rules path resolves it: a ticker or company name to
    the server's tickers, artist, song and entity names through their searches, a team by filtering the date's
    games. A call whose name matches nothing is not made (logged)."""
    for name, args in calls:
        if isinstance(args.get("date"), str):
            kg.dates.add(args["date"])
        if name in ("sports_soccer_get_games_on_date", "sports_nba_get_games_on_date"):
            games_of(kg, name, args["date"], args.get("team_name"))
            continue
        if name == "finance_get_ticker_by_name":
            kg.add([f"{args['company_name']} ticker: {t}" for t in kg.tickers(args["company_name"])])
            continue
        if name in SEARCHES:
            continue  # a search names candidates; the calls that read them resolve their own names
        variants = [dict(args)]
        for arg, value in args.items():
            if arg == "ticker_name":
                resolved = kg.tickers(value)
            elif arg in _RESOLVED_BY:
                search, limit = _RESOLVED_BY[arg]
                resolved = kg.names(search, value, limit=limit)
            else:
                continue
            if not resolved:
                logger.debug("KG call {}: {}={!r} matches nothing in the KG; not made", name, arg, value)
            variants = [dict(v, **{arg: r}) for v in variants for r in resolved]
        for values in variants:
            kg.show(name, **values)


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
        elif len(accepted) < max_calls and isinstance(name, str) and isinstance(args, dict):
            accepted.append((name, args))
        else:
            refused.append(f"{name!r}: over the limit of {max_calls} calls")
    return accepted, refused
