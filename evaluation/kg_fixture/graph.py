"""The fixture knowledge graph: the CRAG mock API's 38 endpoints as methods over data/kg's files, their request
bodies, and the searches they use (the package's docstring says how each follows the organisers' mock API)."""


from __future__ import annotations

import heapq
import json
import math
import sqlite3
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel
from rank_bm25 import BM25Okapi

from models.kg.client import ENDPOINTS

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
