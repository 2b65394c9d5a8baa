"""A CRAG-compatible knowledge-graph server over fixture files, for tests and the offline demo.

Serves the 38 endpoints of the CRAG mock API (`POST /<domain>/<function>`, the organisers' request bodies,
reply {"result": ...}) from data/kg/{open,movie,finance,music,sports}.json, which hold the organisers' data
layout (see data/kg/README.md). Each endpoint behaves as the organisers' mock API does (facebookresearch/CRAG,
mock_api/server.py and mock_api/cragapi/*.py), so a client or stage that works here works there:

- Name searches are BM25, not fuzzy matching. The query and the names are normalised alike (lower case, "_" to
  a space, ASCII punctuation removed, whitespace collapsed: "Joseph Gordon-Levitt" -> "joseph gordonlevitt").
  movie_get_movie_info / movie_get_person_info return the top 10 entity dicts, finance_get_company_name and
  open_search_entity_by_name the top 10 names; all four use rank_bm25's BM25Okapi and leave out names scoring 0.
  The music searches use the organisers' own BM25 (k1 1.5, b 0.75, terms under an IDF cut-off dropped) and
  return every name sharing a kept term, at most 10.
- Every other key is matched exactly, case included: movie ids, tickers ("aapl" finds nothing), company names
  ("Apple Inc."), artist and song names, open entity names, Billboard dates, NBA team names (SQL `=`), soccer
  team names as the organisers' data writes them ("Manchester Utd", not "Manchester United").
- Nothing found is a null result (`{"result": null}`), except: music_get_lifespan [null, null];
  music_get_billboard_rank_date [null, null] for an unknown rank and [[], []] for a date without that rank;
  grammy counts 0; grammy by-year lists [] for a year in 1957-2019 without a row and null outside it.
- Errors are theirs: movie_get_year_info answers HTTP 500 for a year outside 1990-2021 or one that is not a
  number; a body that does not fit the endpoint's request model (missing key, wrong type) answers 422. The
  sports endpoints turn every failure into a null result, as theirs do.
- Shapes are theirs: the sports results are pandas DataFrame.to_json() layouts ({column: {row key: value}});
  soccer row keys are the str() of the (league, season, team, game) index tuple and dates are ISO strings with
  milliseconds; NBA row keys are "0", "1", ...

Where this server still differs from theirs, and why:
- The music searches drop terms whose IDF is at most 1.0, theirs at most 4: with the few dozen names of a
  fixture every term's IDF is under 4, and their cut-off would leave no term at all (their index then fails to
  build). Common words ("the") therefore still count here when they are rare in the fixture.
- music_get_members answers the stored members without duplicates in stored order; theirs goes through a set,
  whose order changes from one server process to the next.
- BM25 ties keep numpy's argsort order, as theirs do; numpy 2 (here) may order equal scores differently from
  the numpy 1 theirs pins.
- Pandas is not needed: the DataFrame layouts are written directly (as pandas 2 writes them) and the NBA tables
  live in an in-memory SQLite database queried with the organisers' SQL. Floats are written as Python writes
  them, where pandas rounds to 10 significant digits.
- An HTTP 500 here is a plain-text "Internal Server Error" written by this server (theirs: uvicorn's), and a
  422 names the problem in FastAPI's style without being byte-identical.

    python tools/kg_server.py --port 8000                 # then CRAG_MOCK_API_URL=http://127.0.0.1:8000
    python tools/kg_server.py --port 0 --faults           # tests: odd argument values trigger failures

With --faults, an argument "__slow__" delays the reply by --slow-s seconds, "__500__" answers HTTP 500 (as a
raising endpoint does), "__503__" answers HTTP 503 (a gateway or a starting server), "__garbage__" answers a body
that is not JSON, and "__wrongtype__" answers a result of the wrong type.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import os
import socket
import sqlite3
import string
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from loguru import logger
from pydantic import BaseModel, ValidationError
from rank_bm25 import BM25Okapi

from models.config import REPO_ROOT
from utils.cli import CommandParser, command
from utils.errors import ConfigError
from utils.kg_api import ENDPOINTS
from utils.processes import die_with_parent

DOMAINS = ("open", "movie", "finance", "music", "sports")
FAULTS = ("__slow__", "__500__", "__503__", "__garbage__", "__wrongtype__")
TOP_N = 10
MUSIC_IDF_CUTOFF = 1.0  # theirs: 4 (see the module docstring)
OSCAR_YEARS = range(1990, 2022)
GRAMMY_FIRST, GRAMMY_LAST = 1957, 2019
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """The organisers' name normalisation: lower case, "_" as a space, no ASCII punctuation, single spaces."""
    return " ".join(text.lower().replace("_", " ").translate(_PUNCTUATION).split())


# --- the request bodies (the organisers' pydantic models) ---

class Query(BaseModel):
    query: str


class IntQuery(BaseModel):
    query: int


class RankQuery(BaseModel):
    rank: int
    date: Optional[str] = None


class AttributeQuery(BaseModel):
    date: str
    attribute: str
    song_name: str


class GamesQuery(BaseModel):
    date: str
    team_name: Optional[str] = None


class GameIdsQuery(BaseModel):
    game_ids: list[str]


BODIES: dict[str, type[BaseModel] | None] = {name: Query for name in ENDPOINTS}
BODIES.update({
    "movie_get_movie_info_by_id": IntQuery, "movie_get_person_info_by_id": IntQuery,
    "music_grammy_get_best_artist_by_year": IntQuery, "music_grammy_get_best_song_by_year": IntQuery,
    "music_grammy_get_best_album_by_year": IntQuery, "music_get_billboard_rank_date": RankQuery,
    "music_get_billboard_attributes": AttributeQuery, "music_grammy_get_all_awarded_artists": None,
    "sports_soccer_get_games_on_date": GamesQuery, "sports_nba_get_games_on_date": GamesQuery,
    "sports_nba_get_play_by_play_data_by_game_ids": GameIdsQuery,
})


# --- searches ---

class OkapiSearch:
    """BM25Okapi over token lists; `top` gives the indices of the best non-zero scores, best first."""

    def __init__(self, corpus: list[list[str]]) -> None:
        self.corpus = corpus
        self.bm25 = BM25Okapi(corpus) if corpus else None

    def top(self, query: str, n: int = TOP_N) -> list[str]:
        """The normalised names (tokens joined by spaces) of the n best matches of the query."""
        if self.bm25 is None:
            return []
        scores = self.bm25.get_scores(normalize(query).split())
        best = np.argsort(scores)[::-1][:n]
        return [" ".join(self.corpus[i]) for i in best if scores[i] != 0]


class CutoffSearch:
    """The music domain's BM25: only terms whose IDF exceeds the cut-off are indexed, and every name sharing an
    indexed term with the query is ranked (best first, ties in the order the names were first scored)."""

    def __init__(self, corpus: list[list[str]], cutoff: float, k1: float = 1.5, b: float = 0.75) -> None:
        self.corpus, self.k1, self.b = corpus, k1, b
        self.lengths = [len(doc) for doc in corpus]
        self.average = sum(self.lengths) / len(corpus) if corpus else 0.0
        postings: dict[str, dict[int, int]] = {}
        for i, doc in enumerate(corpus):
            for term in doc:
                counts = postings.setdefault(term, {})
                counts[i] = counts.get(i, 0) + 1
        self.postings, self.idf = {}, {}
        for term, counts in postings.items():
            idf = math.log(len(corpus) - len(counts) + 0.5) - math.log(len(counts) + 0.5)
            if idf > cutoff:
                self.postings[term], self.idf[term] = counts, idf

    def top(self, query: str, n: int = TOP_N) -> list[list[str]]:
        scores: dict[int, float] = {}
        for term in normalize(query).split():
            for i, freq in self.postings.get(term, {}).items():
                norm = self.k1 * (1 - self.b + self.b * self.lengths[i] / self.average)
                scores[i] = scores.get(i, 0.0) + self.idf[term] * freq * (self.k1 + 1) / (freq + norm)
        return [self.corpus[i] for i in heapq.nlargest(n, scores, key=scores.__getitem__)]


def name_index(names: list[str], unique_sorted: bool) -> tuple[dict[str, list[str]], list[list[str]]]:
    """(normalised name -> the names that normalise to it, corpus of token lists). The finance corpus has one
    document per name in file order; the open and music corpora one per distinct normalised name, sorted."""
    key_map: dict[str, list[str]] = {}
    for name in names:
        key_map.setdefault(normalize(name), []).append(name)
    normalised = sorted(key_map) if unique_sorted else [normalize(name) for name in names]
    return key_map, [n.split() for n in normalised]


def frame(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, dict[str, Any]]:
    """Rows in pandas' DataFrame.to_json() layout, {column: {row key: value}}."""
    columns = list(dict.fromkeys(column for row in rows for column in row))
    return {column: {key: row.get(column) for key, row in zip(keys, rows)} for column in columns}


def _text(value: Any) -> str:
    """A grammy cell as the organisers' str(value) sees it: a missing cell is pandas' NaN, "nan"."""
    return "nan" if value is None else str(value)


class KnowledgeGraph:
    """The fixture data and one function per endpoint, each taking the request body's fields. `folder` None:
    a graph that holds nothing, whose endpoints answer what they answer for a name they do not hold."""

    def __init__(self, folder: Path | None) -> None:
        data = {}
        for domain in DOMAINS:
            path = folder / f"{domain}.json" if folder is not None else None
            data[domain] = json.loads(path.read_text(encoding="utf-8")) if path and path.is_file() else {}
        self._load_open(data["open"])
        self._load_movie(data["movie"])
        self._load_finance(data["finance"])
        self._load_music(data["music"])
        self._load_sports(data["sports"])

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {name: getattr(self, name) for name in ENDPOINTS}

    # --- loading ---

    def _load_open(self, data: dict) -> None:
        self.open_kg = {name: entity for name, entity in data.get("kg", [])}
        self.open_names, corpus = name_index(list(self.open_kg), unique_sorted=True)
        self.open_search = OkapiSearch(corpus)

    def _load_movie(self, data: dict) -> None:
        self.movie_db, self.person_db = data.get("movie_db", {}), data.get("person_db", {})
        self.year_db = data.get("year_db", {})
        for db in (self.movie_db, self.person_db):
            if bad := [key for key in db if key != normalize(key)]:
                raise ValueError(f"movie fixture keys must be normalised names: {bad[:3]}")
        self.movie_by_id = {v["id"]: v for v in self.movie_db.values() if "id" in v}
        self.person_by_id = {v["id"]: v for v in self.person_db.values() if "id" in v}
        self.movie_search = OkapiSearch([key.split() for key in self.movie_db])
        self.person_search = OkapiSearch([key.split() for key in self.person_db])

    def _load_finance(self, data: dict) -> None:
        self.tickers = {row["Name"]: row["Symbol"] for row in data.get("company_name", [])}
        self.company_names, corpus = name_index(list(self.tickers), unique_sorted=False)
        self.company_search = OkapiSearch(corpus)
        self.prices, self.detailed_prices = data.get("price", {}), data.get("detailed_price", {})
        self.dividends, self.market_caps = data.get("dividend", {}), data.get("marketcap", {})
        self.infos = data.get("info", {})

    def _load_music(self, data: dict) -> None:
        self.artists, self.songs = data.get("artist_dict_simplified", {}), data.get("song_dict_simplified", {})
        self.grammy = data.get("grammy_df", [])
        self.ranks, self.hot_songs = data.get("rank_dict_hot100", {}), data.get("song_dict_hot100", {})
        self.works = data.get("artist_work_dict", {})
        self.artist_names, corpus = name_index(list(self.artists), unique_sorted=True)
        self.artist_search = CutoffSearch(corpus, MUSIC_IDF_CUTOFF)
        self.song_names, corpus = name_index(list(self.songs), unique_sorted=True)
        self.song_search = CutoffSearch(corpus, MUSIC_IDF_CUTOFF)

    def _load_sports(self, data: dict) -> None:
        soccer = data.get("soccer_team_match_stats", {})
        self.soccer_index = soccer.get("index", ["league", "season", "team", "game"])
        rows = soccer.get("rows", [])
        self.soccer_teams = {row["team"] for row in rows}  # the index level, before the league filter
        self.soccer = [row for row in rows if row.get("league") is not None]
        self.nba = sqlite3.connect(":memory:", check_same_thread=False)
        for table, table_rows in data.get("nba", {}).items():
            columns = list(dict.fromkeys(c for row in table_rows for c in row))
            self.nba.execute(f"create table {table} ({', '.join(columns)})")
            self.nba.executemany(f"insert into {table} values ({', '.join('?' * len(columns))})",
                                 [[row.get(c) for c in columns] for row in table_rows])
        self.nba.commit()

    # --- open ---

    def open_search_entity_by_name(self, query: str) -> list[str]:
        return [name for key in self.open_search.top(query) for name in self.open_names[key]][:TOP_N]

    def open_get_entity(self, query: str) -> dict | None:
        return self.open_kg.get(query)

    # --- movie ---

    def movie_get_person_info(self, query: str) -> list[dict]:
        return [self.person_db[key] for key in self.person_search.top(query)]

    def movie_get_movie_info(self, query: str) -> list[dict]:
        return [self.movie_db[key] for key in self.movie_search.top(query)]

    def movie_get_year_info(self, query: str) -> dict | None:
        if int(query) not in OSCAR_YEARS:  # a year that is not a number raises too: HTTP 500, as theirs
            raise ValueError("Year must be between 1990 and 2021")
        return self.year_db.get(str(query))

    def movie_get_movie_info_by_id(self, query: int) -> dict | None:
        return self.movie_by_id.get(query)

    def movie_get_person_info_by_id(self, query: int) -> dict | None:
        return self.person_by_id.get(query)

    # --- finance ---

    def finance_get_company_name(self, query: str) -> list[str]:
        return [name for key in self.company_search.top(query) for name in self.company_names[key]][:TOP_N]

    def finance_get_ticker_by_name(self, query: str) -> str | None:
        return self.tickers.get(query)

    def finance_get_price_history(self, query: str) -> dict | None:
        return self.prices.get(query)

    def finance_get_detailed_price_history(self, query: str) -> dict | None:
        return self.detailed_prices.get(query)

    def finance_get_dividends_history(self, query: str) -> dict | None:
        return self.dividends.get(query)

    def finance_get_market_capitalization(self, query: str) -> float | None:
        return self.market_caps.get(query)

    def finance_get_eps(self, query: str) -> float | None:
        return self.infos.get(query, {}).get("forwardEps")

    def finance_get_pe_ratio(self, query: str) -> float | None:
        return self.infos.get(query, {}).get("forwardPE")

    def finance_get_info(self, query: str) -> dict | None:
        return self.infos.get(query)

    # --- music ---

    def music_search_artist_entity_by_name(self, query: str) -> list[str]:
        hits = self.artist_search.top(query)
        return [name for doc in hits for name in self.artist_names[" ".join(doc)]][:TOP_N]

    def music_search_song_entity_by_name(self, query: str) -> list[str]:
        hits = self.song_search.top(query)
        return [name for doc in hits for name in self.song_names[" ".join(doc)]][:TOP_N]

    def music_get_billboard_rank_date(self, rank: int, date: str | None = None) -> list:
        entries = self.ranks.get(str(rank))
        if entries is None:
            return [None, None]
        if date:
            entry = next((e for e in entries if e["Date"] == date), None)
            return [[entry["Song"]], [entry["Artist"]]] if entry else [[], []]
        return [[e["Song"] for e in entries], [e["Artist"] for e in entries]]

    def music_get_billboard_attributes(self, date: str, attribute: str, song_name: str) -> str | None:
        row = self.hot_songs.get(song_name, {}).get(date)
        if row is None:
            return None
        # a row is [.., rank, last week, peak, weeks]; a new entry's is [.., rank, peak, weeks, "-"]
        fields = ({"rank_last_week": 6, "weeks_in_chart": 5, "top_position": 4} if row[6] == "-" else
                  {"rank_last_week": 4, "weeks_in_chart": 6, "top_position": 5})
        return row[fields.get(attribute, 3)]  # any other attribute reads the rank, as theirs

    def _grammy_by_year(self, year: int, category: str) -> list | None:
        if year < GRAMMY_FIRST or year > GRAMMY_LAST:
            return None
        return [row.get("nominee") for row in self.grammy if row.get("category") == category
                and row.get("year") == year]

    def _grammy_rows_of(self, artist: str) -> list[tuple[str, int]]:
        """(column, row number) of every grammy cell that contains the name, case-sensitively."""
        return [(column, i) for column in ("nominee", "artist", "workers") for i, row in enumerate(self.grammy)
                if artist in _text(row.get(column))]

    def music_grammy_get_best_artist_by_year(self, query: int) -> list | None:
        return self._grammy_by_year(query, "Best New Artist")

    def music_grammy_get_award_count_by_artist(self, query: str) -> int:
        return len(self._grammy_rows_of(query))

    def music_grammy_get_award_count_by_song(self, query: str) -> int:
        return sum(row.get("nominee") == query for row in self.grammy)

    def music_grammy_get_best_song_by_year(self, query: int) -> list | None:
        return self._grammy_by_year(query, "Song Of The Year")

    def music_grammy_get_award_date_by_artist(self, query: str) -> list[int]:
        rows = {i for _, i in self._grammy_rows_of(query)}
        return [int(year) for year in set(self.grammy[i]["year"] for i in rows)]

    def music_grammy_get_best_album_by_year(self, query: int) -> list | None:
        return self._grammy_by_year(query, "Album Of The Year")

    def music_grammy_get_all_awarded_artists(self) -> list[str]:
        return list(dict.fromkeys(row["nominee"] for row in self.grammy
                                  if row.get("category") == "Best New Artist" and row.get("nominee") is not None))

    def _artist_field(self, name: str, field: str) -> Any:
        try:
            return self.artists[name][field] or None
        except (KeyError, TypeError):
            return None

    def _song_field(self, name: str, field: str) -> Any:
        try:
            return self.songs[name][field] or None
        except (KeyError, TypeError):
            return None

    def music_get_artist_birth_place(self, query: str) -> str | None:
        return self._artist_field(query, "country")

    def music_get_artist_birth_date(self, query: str) -> str | None:
        return self._artist_field(query, "birth_date")

    def music_get_members(self, query: str) -> list[str] | None:
        try:
            return list(dict.fromkeys(self.artists[query]["members"]))
        except (KeyError, TypeError):
            return None

    def music_get_lifespan(self, query: str) -> list:
        try:
            artist = self.artists[query]
            return [artist["birth_date"], artist["end_date"]]
        except (KeyError, TypeError):
            return [None, None]

    def music_get_song_author(self, query: str) -> str | None:
        return self._song_field(query, "author")

    def music_get_song_release_country(self, query: str) -> str | None:
        return self._song_field(query, "country")

    def music_get_song_release_date(self, query: str) -> str | None:
        return self._song_field(query, "date")

    def music_get_artist_all_works(self, query: str) -> list[str] | None:
        return self.works.get(query)

    # --- sports: every failure is a null result, as theirs ---

    def sports_soccer_get_games_on_date(self, date: str, team_name: str | None = None) -> dict | None:
        rows = self.soccer
        if team_name is not None:
            if team_name not in self.soccer_teams:
                return None  # theirs: KeyError from the index lookup, answered as null
            rows = [row for row in rows if row["team"] == team_name]
        width = {3: 10, 2: 7, 1: 4}.get(len(date.split("-")))
        if width is None:
            return None
        rows = [row for row in rows if str(row["date"])[:width] == date]
        if not rows:
            return None
        keys = [str(tuple(row[level] for level in self.soccer_index)) for row in rows]
        shown = [{column: (f"{value}T00:00:00.000" if column == "date" else value)
                  for column, value in row.items() if column not in self.soccer_index} for row in rows]
        return frame(shown, keys)

    def _sql(self, sql: str) -> dict | None:
        try:
            cursor = self.nba.execute(sql)
        except sqlite3.Error:
            return None
        columns = [c[0] for c in cursor.description]
        rows = [dict(zip(columns, values)) for values in cursor.fetchall()]
        return frame(rows, [str(i) for i in range(len(rows))]) if rows else None

    def sports_nba_get_games_on_date(self, date: str, team_name: str | None = None) -> dict | None:
        # the organisers' SQL, text pasted in as theirs does (an apostrophe in a name breaks it: null)
        parts = len(date.split("-"))
        when = ({3: f"strftime('%Y-%m-%d',game_date) = '{date}'", 2: f"strftime('%Y-%m',game_date) = '{date}'",
                 1: f"strftime('%Y',game_date) = '{date}'"}).get(parts, "1")
        if team_name is not None:
            team = f"(team_name_home = '{team_name}' or team_name_away = '{team_name}')"
            return self._sql(f"select * from game where {team} and {when}")
        return self._sql(f"select * from game where {when}")

    def sports_nba_get_play_by_play_data_by_game_ids(self, game_ids: list[str]) -> dict | None:
        ids = ", ".join(f"'{game_id}'" for game_id in game_ids)
        return self._sql(f"select * from play_by_play where game_id in ({ids})")


def read_body(name: str, raw: bytes) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """(the fields of a request body to endpoint `name`, None), or ({}, FastAPI's 422 detail) when the body does
    not fit the endpoint's request model (theirs: pydantic's validation, with its coercions)."""
    model = BODIES[name]
    if model is None:
        return {}, None
    try:
        return model.model_validate_json(raw or b"").model_dump(), None
    except ValidationError as err:
        return {}, [{"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"]} for e in err.errors()]


def answer(function: Callable[..., Any], name: str, values: dict[str, Any]) -> tuple[int, Any]:
    """(200, {"result": ...}) from an endpoint's function, or (500, "Internal Server Error") when it raises: theirs
    lets the exception through and uvicorn answers HTTP 500."""
    try:
        return 200, {"result": function(**values)}
    except Exception as err:  # noqa: BLE001 - any error of the endpoint is the 500 reply their server gives
        logger.debug("KG fixture {}({}) raised {!r}: HTTP 500", name, values, err)
        return 500, "Internal Server Error"


def create_app(folder: Path, faults: bool = False, slow_s: float = 3.0) -> FastAPI:
    graph = KnowledgeGraph(folder)
    functions = graph.functions()
    app = FastAPI(title="CRAG-compatible KG (fixtures)")

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"message": "The CRAG API service is running"}

    def route(name: str):
        endpoint = ENDPOINTS[name]

        async def handle(request: Request) -> Response:
            values, problem = read_body(name, await request.body())
            if problem is not None:
                return JSONResponse({"detail": problem}, status_code=422)
            fault = next((v for v in values.values() if faults and isinstance(v, str) and v in FAULTS), None)
            if fault == "__slow__":
                await asyncio.sleep(slow_s)
            elif fault == "__500__":
                return PlainTextResponse("Internal Server Error", status_code=500)
            elif fault == "__503__":
                return PlainTextResponse("Service Unavailable", status_code=503)
            elif fault == "__garbage__":
                return PlainTextResponse("<html>not json", media_type="application/json")
            elif fault == "__wrongtype__":
                return JSONResponse({"result": {"unexpected": True} if endpoint.returns != (dict,) else 42})
            status, content = answer(functions[name], name, values)
            return JSONResponse(content) if status == 200 else PlainTextResponse(content, status_code=status)

        handle.__name__ = name
        app.post(endpoint.path)(handle)

    for name in ENDPOINTS:
        route(name)
    return app


@command
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "data" / "kg", help="folder of the fixture files")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: a free port (printed)")
    parser.add_argument("--faults", action="store_true", help="odd argument values trigger failures (tests)")
    parser.add_argument("--slow-s", type=float, default=3.0, help="the delay of a __slow__ reply")
    parser.add_argument("--parent-pid", type=int, help="end when this process ends (evaluation/kg_server.py passes "
                        "its own pid, so a killed evaluation leaves no server behind)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535 or not 0 <= args.slow_s < float("inf"):
        raise ConfigError(f"--port {args.port}, --slow-s {args.slow_s}: the port must be in 0..65535 (0: a free one) "
                          "and --slow-s 0 or more seconds")
    if args.parent_pid is not None and args.parent_pid != os.getppid():
        raise ConfigError(f"--parent-pid {args.parent_pid}: not this server's parent process (give the pid of the "
                          "process that starts it, or leave it out)")
    if not args.data.is_dir():
        raise ConfigError(f"{args.data}: no such fixture folder (give --data a folder of open/movie/finance/music/"
                          "sports .json files)")
    try:
        app = create_app(args.data, args.faults, args.slow_s)
    except (OSError, ValueError, KeyError, TypeError, sqlite3.Error) as err:
        raise ConfigError(f"{args.data}: unreadable fixture ({err})") from None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as err:
        raise ConfigError(f"cannot listen on {args.host}:{args.port} ({err}); choose another --port") from None
    if args.parent_pid is not None:
        # a watcher thread, not the kernel's parent-death signal: that one follows the thread that started this
        # process, and the caller may start it from any thread
        die_with_parent(args.parent_pid, forked_by_main_thread=False)
    print(f"KG server on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
