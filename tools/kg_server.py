"""A CRAG-compatible knowledge-graph server over fixture files, for tests and the offline demo.

Serves the 38 endpoints of the CRAG mock API (`POST /<domain>/<function>`, the organisers' request bodies,
reply {"result": ...}) from data/kg/{open,movie,finance,music,sports}.json. Name searches rank entities by string
similarity, as the real API's fuzzy and BM25 searches do; the sports calls answer in the pandas to_json layout
({column: {row: value}}) that the real API returns. Real evaluation points CRAG_MOCK_API_URL at the organisers'
server instead.

    python tools/kg_server.py --port 8000                 # then CRAG_MOCK_API_URL=http://127.0.0.1:8000
    python tools/kg_server.py --port 0 --faults           # tests: odd argument values trigger failures

With --faults, an argument "__slow__" delays the reply by --slow-s seconds, "__500__" answers HTTP 500,
"__garbage__" answers a body that is not JSON, and "__wrongtype__" answers a result of the wrong type.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from utils.kg_api import ENDPOINTS  # noqa: E402

DOMAINS = ("open", "movie", "finance", "music", "sports")
FAULTS = ("__slow__", "__500__", "__garbage__", "__wrongtype__")


def ranked(query: str, names: list[str], limit: int = 10) -> list[str]:
    """Names by similarity to the query (case-insensitive), best first; the ones sharing nothing are left out."""
    wanted = query.lower().strip()
    scored = []
    for name in names:
        lowered = name.lower()
        score = difflib.SequenceMatcher(None, wanted, lowered).ratio() + (1.0 if wanted == lowered else 0.0)
        score += 0.5 * bool(set(wanted.split()) & set(lowered.split()))
        if score > 0.45:
            scored.append((score, name))
    return [name for _, name in sorted(scored, key=lambda pair: -pair[0])[:limit]]


def frame(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """Rows in pandas' DataFrame.to_json() layout, {column: {row index: value}}; None for no rows."""
    if not rows:
        return None
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return {column: {str(i): row.get(column) for i, row in enumerate(rows)} for column in columns}


class KnowledgeGraph:
    """The fixture data and one function per endpoint, each taking the request body's fields."""

    def __init__(self, folder: Path) -> None:
        data = {}
        for domain in DOMAINS:
            path = folder / f"{domain}.json"
            data[domain] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        self.open, self.movie, self.finance = data["open"], data["movie"], data["finance"]
        self.music, self.sports = data["music"], data["sports"]
        self.people = {p["name"].lower(): p for p in self.movie.get("people", [])}
        self.movies = {m["title"].lower(): m for m in self.movie.get("movies", [])}
        self.artists = {name.lower(): (name, a) for name, a in self.music.get("artists", {}).items()}
        self.songs = {name.lower(): (name, s) for name, s in self.music.get("songs", {}).items()}
        self.companies = {c["name"].lower(): c["ticker"] for c in self.finance.get("companies", [])}

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {name: getattr(self, name) for name in ENDPOINTS}

    # open
    def open_search_entity_by_name(self, query: str) -> list[str]:
        return ranked(query, list(self.open.get("entities", {})))

    def open_get_entity(self, query: str) -> dict | None:
        return self.open.get("entities", {}).get(query)

    # movie
    def movie_get_person_info(self, query: str) -> list[dict]:
        return [self.people[n.lower()] for n in ranked(query, [p["name"] for p in self.people.values()])]

    def movie_get_movie_info(self, query: str) -> list[dict]:
        return [self.movies[n.lower()] for n in ranked(query, [m["title"] for m in self.movies.values()])]

    def movie_get_year_info(self, query: str) -> dict | None:
        return self.movie.get("years", {}).get(str(query))

    def movie_get_movie_info_by_id(self, query: int) -> dict | None:
        return next((m for m in self.movies.values() if m["id"] == query), None)

    def movie_get_person_info_by_id(self, query: int) -> dict | None:
        return next((p for p in self.people.values() if p["id"] == query), None)

    # finance
    def finance_get_company_name(self, query: str) -> list[str]:
        return ranked(query, [c["name"] for c in self.finance.get("companies", [])])

    def finance_get_ticker_by_name(self, query: str) -> str | None:
        return self.companies.get(query.lower())

    def _ticker(self, query: str, key: str) -> Any:
        return self.finance.get("tickers", {}).get(query.upper(), {}).get(key)

    def finance_get_price_history(self, query: str) -> dict | None:
        return self._ticker(query, "price_history")

    def finance_get_detailed_price_history(self, query: str) -> dict | None:
        return self._ticker(query, "detailed_price_history")

    def finance_get_dividends_history(self, query: str) -> dict | None:
        return self._ticker(query, "dividends")

    def finance_get_market_capitalization(self, query: str) -> float | None:
        return self._ticker(query, "market_cap")

    def finance_get_eps(self, query: str) -> float | None:
        return self._ticker(query, "eps")

    def finance_get_pe_ratio(self, query: str) -> float | None:
        return self._ticker(query, "pe_ratio")

    def finance_get_info(self, query: str) -> dict | None:
        return self._ticker(query, "info")

    # music
    def music_search_artist_entity_by_name(self, query: str) -> list[str]:
        return ranked(query, [name for name, _ in self.artists.values()])

    def music_search_song_entity_by_name(self, query: str) -> list[str]:
        return ranked(query, [name for name, _ in self.songs.values()])

    def _artist(self, query: str, key: str) -> Any:
        return self.artists.get(query.lower(), (None, {}))[1].get(key)

    def _song(self, query: str, key: str) -> Any:
        return self.songs.get(query.lower(), (None, {}))[1].get(key)

    def music_get_billboard_rank_date(self, rank: int, date: str | None = None) -> list[list[str]]:
        rows = [r for r in self.music.get("billboard", []) if r["rank"] == rank and (date is None or r["date"] == date)]
        return [[r["song"] for r in rows], [r["artist"] for r in rows]]

    def music_get_billboard_attributes(self, date: str, attribute: str, song_name: str) -> str | None:
        row = next((r for r in self.music.get("billboard", [])
                    if r["date"] == date and r["song"].lower() == song_name.lower()), None)
        return None if row is None or attribute not in row else str(row[attribute])

    def _grammy(self, year: int, category: str) -> list[str] | None:
        return self.music.get("grammy", {}).get(str(year), {}).get(category)

    def music_grammy_get_best_artist_by_year(self, query: int) -> list[str] | None:
        return self._grammy(query, "best_new_artist")

    def music_grammy_get_award_count_by_artist(self, query: str) -> int:
        return int(self._artist(query, "grammy_count") or 0)

    def music_grammy_get_award_count_by_song(self, query: str) -> int:
        return int(self._song(query, "grammy_count") or 0)

    def music_grammy_get_best_song_by_year(self, query: int) -> list[str] | None:
        return self._grammy(query, "song_of_the_year")

    def music_grammy_get_award_date_by_artist(self, query: str) -> list[int]:
        return self._artist(query, "grammy_years") or []

    def music_grammy_get_best_album_by_year(self, query: int) -> list[str] | None:
        return self._grammy(query, "album_of_the_year")

    def music_grammy_get_all_awarded_artists(self) -> list[str]:
        return [a for year in self.music.get("grammy", {}).values() for a in year.get("best_new_artist", [])]

    def music_get_artist_birth_place(self, query: str) -> str | None:
        return self._artist(query, "birth_place")

    def music_get_artist_birth_date(self, query: str) -> str | None:
        return self._artist(query, "birth_date")

    def music_get_members(self, query: str) -> list[str]:
        return self._artist(query, "members") or []

    def music_get_lifespan(self, query: str) -> list[str | None]:
        return self._artist(query, "lifespan") or [None, None]

    def music_get_song_author(self, query: str) -> str | None:
        return self._song(query, "author")

    def music_get_song_release_country(self, query: str) -> str | None:
        return self._song(query, "release_country")

    def music_get_song_release_date(self, query: str) -> str | None:
        return self._song(query, "release_date")

    def music_get_artist_all_works(self, query: str) -> list[str]:
        return self._artist(query, "works") or []

    # sports
    def _games(self, table: str, date: str, team_name: str | None, team_keys: tuple[str, ...]) -> dict | None:
        team = (team_name or "").lower()
        return frame([row for row in self.sports.get(table, []) if str(row.get("date", "")).startswith(date)
                      and (not team or any(team in str(row.get(key, "")).lower() for key in team_keys))])

    def sports_soccer_get_games_on_date(self, date: str, team_name: str | None = None) -> dict | None:
        return self._games("soccer", date, team_name, ("team",))

    def sports_nba_get_games_on_date(self, date: str, team_name: str | None = None) -> dict | None:
        return self._games("nba", date, team_name, ("team_name_home", "team_name_away"))

    def sports_nba_get_play_by_play_data_by_game_ids(self, game_ids: list[str]) -> dict | None:
        return frame([row for row in self.sports.get("nba_play_by_play", []) if row.get("game_id") in game_ids])


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
            raw = await request.body()
            try:
                body = json.loads(raw) if raw else {}
            except json.JSONDecodeError:
                return JSONResponse({"detail": "body is not JSON"}, status_code=422)
            if not isinstance(body, dict):
                return JSONResponse({"detail": "body is not a JSON object"}, status_code=422)
            keys = {arg.field or arg.name: arg.required for arg in endpoint.args}
            values = {key: body.get(key) for key in keys}
            missing = [key for key, required in keys.items() if required and values[key] is None]
            if missing:
                return JSONResponse({"detail": f"missing {missing}"}, status_code=422)
            fault = next((v for v in values.values() if faults and v in FAULTS), None)
            if fault == "__slow__":
                await asyncio.sleep(slow_s)
            elif fault == "__500__":
                return PlainTextResponse("Internal Server Error", status_code=500)
            elif fault == "__garbage__":
                return PlainTextResponse("<html>not json", media_type="application/json")
            elif fault == "__wrongtype__":
                return JSONResponse({"result": {"unexpected": True} if endpoint.returns != (dict,) else 42})
            try:
                result = functions[name](**{k: v for k, v in values.items() if v is not None})
            except (TypeError, ValueError, AttributeError, KeyError):
                result = None  # as the real API does for arguments it cannot use
            return JSONResponse({"result": result})

        handle.__name__ = name
        app.post(endpoint.path)(handle)

    for name in ENDPOINTS:
        route(name)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO / "data" / "kg", help="folder of the fixture files")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: a free port (printed)")
    parser.add_argument("--faults", action="store_true", help="odd argument values trigger failures (tests)")
    parser.add_argument("--slow-s", type=float, default=3.0, help="the delay of a __slow__ reply")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"error: {args.data}: no such fixture folder (give --data a folder of open/movie/finance/music/"
              "sports .json files)", file=sys.stderr)
        return 2
    try:
        app = create_app(args.data, args.faults, args.slow_s)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {args.data}: unreadable fixture ({err})", file=sys.stderr)
        return 2
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as err:
        print(f"error: cannot listen on {args.host}:{args.port} ({err}); choose another --port", file=sys.stderr)
        return 2
    print(f"KG server on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
