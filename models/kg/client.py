"""Client of the CRAG mock knowledge-graph API: 38 `POST /<domain>/<function>` endpoints, reply {"result": ...}.

Every endpoint is a row of ENDPOINTS (its function name, path, arguments with their types and body keys, and the
result types it may return) and a method of KGClient with the same name, e.g.
`client.finance_get_price_history("AAPL")`. Calls time out (connect and read, and never past a caller's deadline),
are retried with backoff on connection errors, timeouts and the gateway errors HTTP 502/503/504, and are cached for
the client's life. HTTP 500 is the organisers' server raising on arguments it cannot use (an Oscar year out of
range, an unknown key): it would answer the same again, so it is one try and no result; so is a reply over
`max_reply_bytes`, refused as it arrives. A wrong request (HTTP 4xx) is one try and no result too.

Replies are read as they arrive, a read at a time, so the whole call ends by the caller's deadline (without one,
`connect_timeout_s + read_timeout_s` after each attempt starts) however slowly a server trickles its reply.

Down: `down_after` failures in a row without an answer (a call that could not connect, after its retries, or an
attempt that waited its whole read timeout, a trickling reply included) mark the server down: calls return None at
once, without a request. After `down_s` seconds the next call first sends a probe (`GET /`, waiting at most
PROBE_READ_S for the reply): calls resume only when it answers, and then one more failure marks the server down
again; a probe that gets no answer keeps it down another `down_s`. A reply of any kind (HTTP 4xx and 5xx
included) resets the count. `probe()` asks once, at start-up, whether a server is there. Down time and the time an
attempt without a deadline has left are read on the client's `clock` (time.monotonic unless a test injects one).
Why: docs/decisions/kg-server-down.md and docs/decisions/kg-reply-cap.md.

Nothing raises: a failure (server down, HTTP error, garbage JSON, a reply too large or too slow, a result of the
wrong type, a call that does not match the table) returns None and is logged once per endpoint and kind of failure.
"""

from __future__ import annotations

import http.client
import inspect
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests
import urllib3
from loguru import logger

from utils.retry import backoff
from utils.time_budget import Deadline

KG_URL_ENV = "CRAG_MOCK_API_URL"
DEFAULT_KG_URL = "http://localhost:8000"
TRANSIENT_STATUS = frozenset({502, 503, 504})  # a proxy or a server starting: worth another try
DEFAULT_MAX_REPLY_BYTES = 16_000_000  # KGSettings.max_reply_bytes's default; why: docs/decisions/kg-reply-cap.md
READ_CHUNK = 64 * 1024  # the most one read of a reply takes
PROBE_READ_S = 1.0  # the longest a probe of a server marked down waits for its reply (never past read_timeout_s)


@dataclass(frozen=True)
class Arg:
    name: str                 # the argument's name in a call (and in the function-calling prompt)
    type: type                # str, int or list (of str)
    required: bool = True
    field: str | None = None  # its key in the request body; None: the same as `name`

    def accepts(self, value: Any) -> bool:
        if self.type is int:
            return isinstance(value, int) and not isinstance(value, bool)
        if self.type is list:
            return isinstance(value, list) and all(isinstance(v, str) for v in value)
        return isinstance(value, self.type)


@dataclass(frozen=True)
class Endpoint:
    name: str
    path: str
    args: tuple[Arg, ...]
    returns: tuple[type, ...]
    doc: str

    def problem(self, values: dict[str, Any]) -> str | None:
        """Why `values` cannot be this endpoint's arguments, or None when they can."""
        known = {arg.name: arg for arg in self.args}
        unknown = sorted(set(values) - set(known))
        if unknown:
            return f"unknown argument(s) {unknown}"
        for arg in self.args:
            if arg.name not in values or values[arg.name] is None:
                if arg.required:
                    return f"missing argument '{arg.name}'"
            elif not arg.accepts(values[arg.name]):
                return f"argument '{arg.name}' must be {arg.type.__name__}, got {values[arg.name]!r}"
        return None

    def body(self, values: dict[str, Any]) -> dict[str, Any]:
        return {arg.field or arg.name: values.get(arg.name) for arg in self.args
                if values.get(arg.name) is not None or arg.required}

    def signature(self) -> str:
        """`name(arg: type, [optional: type])` for a prompt."""
        parts = [f"{a.name}: {a.type.__name__}" if a.required else f"[{a.name}: {a.type.__name__}]" for a in self.args]
        return f"{self.name}({', '.join(parts)})"


def _q(name: str, arg: str, kind: type, returns: tuple[type, ...], doc: str) -> Endpoint:
    """An endpoint whose one argument travels as {"query": value}."""
    domain, function = name.split("_", 1)
    return Endpoint(name, f"/{domain}/{function}", (Arg(arg, kind, field="query"),), returns, doc)


_NUMBER = (int, float)
ENDPOINTS: dict[str, Endpoint] = {e.name: e for e in [
    _q("open_search_entity_by_name", "query", str, (list,), "entity names that best match the query (at most 10)"),
    _q("open_get_entity", "entity", str, (dict,), "an entity's summary_text, summary_structured (infobox) "
                                                  "and raw_mediawiki"),
    _q("movie_get_person_info", "person_name", str, (list,), "people matching the name: birthday, acted and "
                                                             "directed movie ids, oscar awards"),
    _q("movie_get_movie_info", "movie_name", str, (list,), "movies matching the title: release date, budget, "
                                                           "revenue, rating, genres, cast, crew, oscar awards"),
    _q("movie_get_year_info", "year", str, (dict,), "a year (1990-2021): its movie ids and oscar awards"),
    _q("movie_get_movie_info_by_id", "movie_id", int, (dict,), "a movie by id"),
    _q("movie_get_person_info_by_id", "person_id", int, (dict,), "a person by id"),
    _q("finance_get_company_name", "query", str, (list,), "company names matching the query"),
    _q("finance_get_ticker_by_name", "company_name", str, (str,), "the ticker of a company"),
    _q("finance_get_price_history", "ticker_name", str, (dict,), "1 year of daily open, high, low, close, volume"),
    _q("finance_get_detailed_price_history", "ticker_name", str, (dict,), "the past 5 days, by minute"),
    _q("finance_get_dividends_history", "ticker_name", str, (dict,), "dividends by date"),
    _q("finance_get_market_capitalization", "ticker_name", str, _NUMBER, "market capitalisation"),
    _q("finance_get_eps", "ticker_name", str, _NUMBER, "earnings per share"),
    _q("finance_get_pe_ratio", "ticker_name", str, _NUMBER, "price-to-earnings ratio"),
    _q("finance_get_info", "ticker_name", str, (dict,), "ticker meta data"),
    _q("music_search_artist_entity_by_name", "artist_name", str, (list,), "artist names matching (top 10)"),
    _q("music_search_song_entity_by_name", "song_name", str, (list,), "song names matching (top 10)"),
    Endpoint("music_get_billboard_rank_date", "/music/get_billboard_rank_date",
             (Arg("rank", int), Arg("date", str, required=False)), (list,),
             "songs and artists at a Billboard rank (1-100) on a date (YYYY-MM-DD), or on every date"),
    Endpoint("music_get_billboard_attributes", "/music/get_billboard_attributes",
             (Arg("date", str), Arg("attribute", str), Arg("song_name", str)), (str, list, int),
             "a song's Billboard rank_last_week, weeks_in_chart, top_position or rank on a date"),
    _q("music_grammy_get_best_artist_by_year", "year", int, (list,), "Grammy Best New Artist of a year"),
    _q("music_grammy_get_award_count_by_artist", "artist_name", str, (int,), "Grammy awards won by an artist"),
    _q("music_grammy_get_award_count_by_song", "song_name", str, (int,), "Grammy awards won by a song"),
    _q("music_grammy_get_best_song_by_year", "year", int, (list,), "Grammy Song Of The Year of a year"),
    _q("music_grammy_get_award_date_by_artist", "artist_name", str, (list,), "the years an artist won a Grammy"),
    _q("music_grammy_get_best_album_by_year", "year", int, (list,), "Grammy Album Of The Year of a year"),
    Endpoint("music_grammy_get_all_awarded_artists", "/music/grammy_get_all_awarded_artists", (), (list,),
             "every Grammy Best New Artist"),
    _q("music_get_artist_birth_place", "artist_name", str, (str,), "an artist's birth country (ISO-3166 code)"),
    _q("music_get_artist_birth_date", "artist_name", str, (str,), "an artist's birth date, or a band's start"),
    _q("music_get_members", "band_name", str, (list,), "a band's members"),
    _q("music_get_lifespan", "artist_name", str, (list,), "an artist's birth and death dates"),
    _q("music_get_song_author", "song_name", str, (str,), "a song's author"),
    _q("music_get_song_release_country", "song_name", str, (str,), "a song's release country (ISO-3166 code)"),
    _q("music_get_song_release_date", "song_name", str, (str,), "a song's release date"),
    _q("music_get_artist_all_works", "artist_name", str, (list,), "all works of an artist"),
    Endpoint("sports_soccer_get_games_on_date", "/sports/soccer/get_games_on_date",
             (Arg("date", str), Arg("team_name", str, required=False)), (dict,),
             "soccer games on a date (YYYY-MM-DD, YYYY-MM or YYYY), optionally of one team"),
    Endpoint("sports_nba_get_games_on_date", "/sports/nba/get_games_on_date",
             (Arg("date", str), Arg("team_name", str, required=False)), (dict,),
             "NBA games on a date (YYYY-MM-DD, YYYY-MM or YYYY), optionally of one team"),
    Endpoint("sports_nba_get_play_by_play_data_by_game_ids", "/sports/nba/get_play_by_play_data_by_game_ids",
             (Arg("game_ids", list),), (dict,), "play-by-play rows of NBA games by game id"),
]}


class KGClient:
    """One client per run: its cache lives as long as it does. Safe to call from several threads."""

    def __init__(self, base_url: str | None = None, connect_timeout_s: float = 1.0, read_timeout_s: float = 5.0,
                 retries: int = 2, backoff_s: float = 0.2, down_after: int = 3, down_s: float = 30.0,
                 max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES, clock: Callable[[], float] = time.monotonic) -> None:
        self.base_url = (base_url or os.environ.get(KG_URL_ENV) or DEFAULT_KG_URL).rstrip("/")
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.retries, self.backoff_s = retries, backoff_s
        self.down_after, self.down_s = max(1, down_after), down_s
        self.max_reply_bytes = max_reply_bytes
        self._clock = clock
        self._failures = 0      # failures in a row without an answer (see the module docstring)
        self._down_until: float | None = None  # None: up; else down, and no probe before this time (on `clock`)
        self._probing = False   # a probe is in flight: the other calls return None meanwhile
        self.requests_sent = 0  # POSTs, retries included (probes are not counted here)
        self.probes_sent = 0    # probes of a server marked down
        self.bytes_received = 0  # reply bytes read, in all
        self._cache: dict[str, Any] = {}
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._local = threading.local()

    @classmethod
    def from_config(cls, settings: Any) -> KGClient:
        """A client with the connection settings of the `kg` section (models/kg/settings.py KGSettings)."""
        return cls(settings.base_url, settings.connect_timeout_s, settings.read_timeout_s, settings.retries,
                   settings.backoff_s, settings.down_after, settings.down_s, settings.max_reply_bytes)

    @property
    def down(self) -> bool:
        """Whether the server is marked down (calls answer None at once until a probe answers)."""
        return self._down_until is not None

    def probe(self) -> bool:
        """Whether a server answers at base_url (any HTTP reply counts), within the client's timeouts; logged."""
        answer = self._root((self.connect_timeout_s, self.read_timeout_s))
        if isinstance(answer, str):
            logger.warning("no KG server answers at {} ({}): the kg stage is off for this run", self.base_url, answer)
            return False
        logger.info("KG server at {} answers (HTTP {})", self.base_url, answer)
        return True

    def call(self, name: str, args: dict[str, Any] | None = None, deadline: Deadline | None = None) -> Any:
        """The result of endpoint `name` with `args`, or None (nothing found, a failure, the server down, or
        `deadline` passed)."""
        args = args or {}
        endpoint = ENDPOINTS.get(name)
        if endpoint is None:
            self._log(name, "unknown endpoint", f"no endpoint named {name!r}")
            return None
        problem = endpoint.problem(args)
        if problem:
            self._log(name, "bad arguments", problem)
            return None
        key = name + json.dumps(args, sort_keys=True)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        if not self._available(deadline):
            return None
        found, result = self._post(endpoint, endpoint.body(args), deadline)
        if found:
            with self._lock:
                self._cache[key] = result
        return result

    def _session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def _root(self, timeout: tuple[float, float]) -> int | str:
        """The HTTP status of `GET /` (its body is not read), or the name of the error when there is no reply."""
        try:
            with self._session().get(self.base_url + "/", timeout=timeout, stream=True) as reply:
                return reply.status_code
        except requests.RequestException as err:
            return type(err).__name__

    def _available(self, deadline: Deadline | None) -> bool:
        """Whether a call may go to the server: yes when it is not marked down; when it is, no until `down_s` has
        passed, then yes only if a probe (sent by this call alone, and only when `deadline` affords its
        timeouts) answers."""
        read_s = min(self.read_timeout_s, PROBE_READ_S)
        with self._lock:
            if self._down_until is None:
                return True
            if self._probing or self._clock() < self._down_until:
                return False
            if deadline is not None and not deadline.can_afford(self.connect_timeout_s + read_s):
                return False
            self._probing = True
            self.probes_sent += 1
        answer = self._root((self.connect_timeout_s, read_s))
        answered = not isinstance(answer, str)
        with self._lock:
            self._probing = False
            if answered:  # resume, on probation: one more failure marks it down again
                self._down_until, self._failures = None, self.down_after - 1
            else:
                self._down_until = self._clock() + self.down_s
        if answered:
            logger.info("KG server at {} answers a probe again (HTTP {}): KG calls resume", self.base_url, answer)
        else:
            logger.info("KG server at {} still down (probe: {}); next probe in {:.0f} s", self.base_url, answer,
                        self.down_s)
        return answered

    def _post(self, endpoint: Endpoint, body: dict[str, Any], deadline: Deadline | None) -> tuple[bool, Any]:
        """(True, result) for an answer of the server (None included: nothing found, and a reply refused for its
        size), (False, None) otherwise. Retried while the server is up and the deadline affords the pause."""
        url = self.base_url + endpoint.path
        retries = backoff(self.retries + 1, self.backoff_s, _Failed,
                          lambda wait: not self.down and (deadline is None or deadline.can_afford(wait)))
        failed: _Failed | None = None
        sent = 0
        try:
            for attempt in retries:
                with attempt:
                    if failed is not None and self.down:  # marked down by another call while this one waited
                        raise failed
                    sent += 1
                    try:
                        return self._attempt(endpoint, url, body, deadline)
                    except _Failed as err:
                        failed = err
                        raise
        except _Failed:
            pass
        assert failed is not None  # the loop ends by returning or by raising _Failed, which set it
        self._log(endpoint.name, failed.kind, f"{failed.failure} after {sent} attempt(s) at {url}")
        if failed.kind == "connection":
            self._count_failure(failed.kind)
        return False, None

    def _attempt(self, endpoint: Endpoint, url: str, body: dict[str, Any],
                 deadline: Deadline | None) -> tuple[bool, Any]:
        """One request: what _post returns, or _Failed for a failure another attempt may not meet."""
        time_left = self._time_left(deadline)
        left = time_left()
        if left <= 0:
            self._log(endpoint.name, "deadline", "no time left for the call")
            return False, None
        connect_s, read_s = min(self.connect_timeout_s, left), min(self.read_timeout_s, left)
        whole = connect_s >= self.connect_timeout_s and read_s >= self.read_timeout_s  # not cut by `deadline`
        with self._lock:
            self.requests_sent += 1
        try:
            reply = self._send(url, body, (connect_s, read_s))
        except requests.RequestException as err:
            failure = f"{type(err).__name__}: {err}"
            kind = "timeout" if isinstance(err, requests.Timeout) else "connection"
        else:
            with reply:
                if reply.status_code in TRANSIENT_STATUS:
                    self._answered()
                    kind, failure = "server error", f"HTTP {reply.status_code}"
                else:
                    content, kind, failure = self._content(reply, time_left, read_s)
                    if content is not None:
                        self._answered()
                        return self._read(endpoint, reply.status_code, content)
                    if kind == "too large":  # the same call would bring the same reply: no result, cached
                        self._answered()
                        self._log(endpoint.name, kind, failure)
                        return True, None
        if kind == "timeout" and whole:  # the server had its whole read timeout and did not answer
            self._count_failure(kind)
        raise _Failed(kind, failure)

    def _time_left(self, deadline: Deadline | None) -> Callable[[], float]:
        """The seconds left to an attempt starting now, as a function: `deadline`'s, or without one
        connect_timeout_s + read_timeout_s from now on the client's clock."""
        if deadline is not None:
            return deadline.remaining
        ends = self._clock() + self.connect_timeout_s + self.read_timeout_s
        return lambda: max(0.0, ends - self._clock())

    def _send(self, url: str, body: dict[str, Any], timeout: tuple[float, float]) -> requests.Response:
        """The HTTP send of one attempt: the reply, its body not yet read (raises requests' errors)."""
        return self._session().post(url, json=body, timeout=timeout, stream=True)

    def _content(self, reply: requests.Response, time_left: Callable[[], float],
                 read_s: float) -> tuple[bytes | None, str, str]:
        """(the reply's body, "", "") or (None, kind, why): "too large" over `max_reply_bytes` (announced or
        read), "timeout" when it is still arriving once `time_left()` is 0 or a read waits `read_s` in vain,
        "connection" when the connection breaks. One read at a time, each waiting no longer than `time_left()`,
        and no more than `max_reply_bytes` (and one read) held."""
        cap = self.max_reply_bytes
        announced = reply.headers.get("Content-Length", "")
        if announced.isdigit() and int(announced) > cap:
            return None, "too large", (f"reply of {int(announced)} bytes (Content-Length) is over "
                                       f"kg.max_reply_bytes ({cap} bytes): refused unread")
        raw = reply.raw
        read = getattr(raw, "read1", None) or raw.read  # read1: at most one socket read (urllib3 2)
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        body = bytearray()
        try:
            while True:
                left = time_left()
                if left <= 0:
                    return None, "timeout", (f"reply still arriving at the deadline, {len(body)} bytes read "
                                             f"(a server trickling its reply)")
                if sock is not None:
                    sock.settimeout(min(read_s, left))
                chunk = read(READ_CHUNK, decode_content=True)
                if not chunk:
                    break
                body += chunk
                with self._lock:
                    self.bytes_received += len(chunk)
                if len(body) > cap:
                    return None, "too large", (f"reply over kg.max_reply_bytes ({cap} bytes): refused after reading "
                                               f"{len(body)} bytes")
        except urllib3.exceptions.ReadTimeoutError as err:
            if time_left() <= 0:
                return None, "timeout", f"reply still arriving at the deadline, {len(body)} bytes read"
            return None, "timeout", f"reply stalled ({err}), {len(body)} bytes read"
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as err:
            return None, "connection", f"reply cut off ({type(err).__name__}: {err}), {len(body)} bytes read"
        return bytes(body), "", ""

    def _answered(self) -> None:
        with self._lock:
            self._failures = 0

    def _count_failure(self, kind: str) -> None:
        with self._lock:
            if self._down_until is not None:
                return
            self._failures += 1
            if self._failures < self.down_after:
                return
            self._down_until, self._failures = self._clock() + self.down_s, 0
        logger.warning("KG server at {} unreachable {} times in a row (last: {}): marked down; KG calls answer "
                       "nothing at once for {:.0f} s, then resume once a probe (GET /) answers", self.base_url,
                       self.down_after, kind, self.down_s)

    def _read(self, endpoint: Endpoint, status: int, content: bytes) -> tuple[bool, Any]:
        if status == 500:  # the server raised on these arguments: no result, and none next time
            self._log(endpoint.name, "server error", f"HTTP 500 (the server cannot use these arguments): "
                                                     f"{_text(content, 120)}")
            return True, None
        if status >= 400:
            self._log(endpoint.name, "client error", f"HTTP {status}: {_text(content, 200)}")
            return False, None
        try:
            data = json.loads(content)
        except ValueError:
            self._log(endpoint.name, "invalid JSON", f"reply starts {_text(content, 80)!r}")
            return False, None
        if not isinstance(data, dict) or "result" not in data:
            self._log(endpoint.name, "invalid reply", f"no 'result' in {str(data)[:80]!r}")
            return False, None
        result = data["result"]
        if result is not None and not isinstance(result, endpoint.returns):
            self._log(endpoint.name, "wrong type", f"result is {type(result).__name__}, expected "
                                                   f"{'/'.join(t.__name__ for t in endpoint.returns)}")
            return False, None
        return True, result

    def _log(self, endpoint: str, kind: str, detail: str) -> None:
        with self._lock:
            if (endpoint, kind) in self._logged:
                return
            self._logged.add((endpoint, kind))
        logger.warning("KG {} ({}): {}; answering without it", endpoint, kind, detail)


class _Failed(Exception):
    """An attempt that failed in a way another attempt may not: its kind (timeout, connection, server error) and
    what happened."""

    def __init__(self, kind: str, failure: str) -> None:
        super().__init__(failure)
        self.kind, self.failure = kind, failure


def _text(content: bytes, limit: int) -> str:
    return content[:limit].decode("utf-8", "replace")


def _method(endpoint: Endpoint):
    def call(self: KGClient, *args: Any, deadline: Deadline | None = None, **kwargs: Any) -> Any:
        values = dict(zip((a.name for a in endpoint.args), args), **kwargs)
        return self.call(endpoint.name, values, deadline)

    call.__name__ = call.__qualname__ = endpoint.name
    call.__doc__ = f"{endpoint.signature()}: {endpoint.doc}."
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=a.type,
                                 default=inspect.Parameter.empty if a.required else None) for a in endpoint.args]
    params.append(inspect.Parameter("deadline", inspect.Parameter.KEYWORD_ONLY, default=None))
    vars(call)["__signature__"] = inspect.Signature(params)  # what inspect.signature(client.method) reads
    return call


for _endpoint in ENDPOINTS.values():
    setattr(KGClient, _endpoint.name, _method(_endpoint))
