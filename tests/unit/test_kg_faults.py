"""The KG client against a misbehaving server on a loopback port: a server that hangs is marked down until a
probe answers, a huge reply is refused as it arrives, a trickling reply ends at the deadline; and the kg stage's
calls of one batch are in flight together. Time is the test's own clock: no assertion reads a duration."""

from __future__ import annotations

import json
import threading
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from evaluation.kg_fixture.app import answer, read_body
from evaluation.kg_fixture.graph import KnowledgeGraph
from models.config import REPO_ROOT
from models.kg.client import ENDPOINTS, READ_CHUNK, KGClient
from models.kg.settings import KGSettings
from tests.conftest import to_batch
from tests.fakes import ScriptedLLM, by_prompt
from utils.time_budget import Deadline

NAMES = {endpoint.path: endpoint.name for endpoint in ENDPOINTS.values()}
HUGE = 50_000_000  # bytes of the huge reply
TRICKLE_BYTES, TRICKLE_GAP_S = 100_000, 0.05  # a trickled reply: one byte per gap of the test's clock
WAIT_S = 10.0  # the longest a fake server holds a request: far past every timeout and deadline the tests set


class ManualClock:
    """time.monotonic's stand-in: it moves only when the test, or a fake server, moves it."""

    def __init__(self) -> None:
        self.now = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class FakeKG(ThreadingHTTPServer):
    """The organisers' routes and reply shape (`GET /` answers a message, `POST /<domain>/<function>` with a JSON
    body answers {"result": ...}), misbehaving as `mode` says: "ok" answers {"result": <the request body>},
    "kg" answers as evaluation/kg_fixture over data/kg (its `read_body` and `answer`), "hang" answers nothing until
    `release` is set (`GET /` included; "hang-posts": only the endpoints hang), "422" refuses the body, "huge"
    streams a 50 MB result (chunked, no length announced), "huge-announced" the same with its Content-Length,
    "trickle" sends a reply too long to finish one byte at a time, moving `clock` on TRICKLE_GAP_S a byte.
    With `meet` n, a POST is held until n of them are in flight together (once WAIT_S passed, none is). Logs
    each request (`requests`, waited on by `seen`), when each POST arrived and when it was let go to be answered
    (`events`), and counts the reply bytes it got out."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.mode = "ok"
        self.clock = ManualClock()
        self.meet = 0
        self.requests: list[tuple[str, str]] = []
        self.events: list[tuple[str, int, str]] = []  # ("start" or "end", request number, path)
        self.sent = 0
        self.release = threading.Event()
        self.replied = threading.Event()  # set when a reply ended (written or cut off)
        self.met = threading.Event()
        self.in_flight = 0
        self.graph: KnowledgeGraph | None = None
        self.changed = threading.Condition()  # guards the logs; notified as a request arrives

    def log(self, method: str, path: str) -> None:
        with self.changed:
            self.requests.append((method, path))
            self.changed.notify_all()

    def seen(self, count: int) -> list[tuple[str, str]]:
        """The request log once it holds `count` requests (a handler logs as it starts), or after WAIT_S."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.requests) >= count, WAIT_S)
            return list(self.requests)

    def overlaps(self) -> set[tuple[str, str]]:
        """The pairs of paths (sorted) of two POSTs in flight together, from the start and end events."""
        in_flight: dict[int, str] = {}
        pairs = set()
        for kind, number, path in list(self.events):
            if kind == "start":
                pairs |= {tuple(sorted((path, other))) for other in in_flight.values()}
                in_flight[number] = path
            else:
                in_flight.pop(number, None)
        return pairs


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeKG

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.server.log("GET", self.path)
        self.answer({"message": "The CRAG API service is running"})

    def do_POST(self) -> None:
        self.server.log("POST", self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.changed:
            number = len(self.server.events)
            self.server.events.append(("start", number, self.path))
            self.server.in_flight += 1
            if self.server.meet and self.server.in_flight >= self.server.meet:
                self.server.met.set()
        if self.server.meet and not self.server.met.wait(WAIT_S):
            self.server.met.set()  # no call came to meet it: answered, and the later ones are not held
        with self.server.changed:  # before the reply goes out, so a call the client sends after it starts after this
            self.server.events.append(("end", number, self.path))
            self.server.in_flight -= 1
        self.post(raw)

    def post(self, raw: bytes) -> None:
        body = json.loads(raw or b"{}")
        if self.path not in NAMES:
            self.answer({"detail": "Not Found"}, 404)
        elif self.server.mode == "kg":
            name = NAMES[self.path]
            values, problem = read_body(name, raw)
            status, content = (422, {"detail": problem}) if problem is not None else \
                answer(self.server.graph.functions()[name], name, values)
            self.answer(content, status)
        elif self.server.mode == "422":
            self.answer({"detail": [{"type": "missing", "loc": ["body", "query"], "msg": "Field required"}]}, 422)
        elif self.server.mode in ("huge", "huge-announced"):
            self.huge(announced=self.server.mode == "huge-announced")
        elif self.server.mode == "trickle":
            self.trickle(json.dumps({"result": body}).encode())
        else:
            self.answer({"result": body})

    def answer(self, data: dict | str, status: int = 200) -> None:
        """`data` as JSON, or as plain text when it is a string (an HTTP 500 of evaluation/kg_fixture)."""
        if self.server.mode == "hang" or (self.server.mode == "hang-posts" and self.command == "POST"):
            self.server.release.wait(WAIT_S)
        text = isinstance(data, str)
        payload = data.encode() if text else json.dumps(data).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            pass  # the client gave up
        self.server.replied.set()

    def huge(self, announced: bool) -> None:
        head, tail, block = b'{"result": {"raw_mediawiki": "', b'"}}', b"x" * 65536
        blocks, rest = divmod(HUGE - len(head) - len(tail), len(block))
        parts = [head, *([block] * blocks), block[:rest], tail]
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header(*(("Content-Length", str(HUGE)) if announced else ("Transfer-Encoding", "chunked")))
            self.end_headers()
            for part in parts:
                self.wfile.write(part if announced else b"%x\r\n%s\r\n" % (len(part), part))
                self.server.sent += len(part)
            if not announced:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client closed the connection
        self.server.replied.set()

    def trickle(self, payload: bytes) -> None:
        # The client checks its time before each read of at most READ_CHUNK bytes; before its last read the clock
        # is (TRICKLE_BYTES - READ_CHUNK) gaps on, past every budget the tests give, so the reply is never whole.
        padded = payload.rjust(TRICKLE_BYTES)  # leading spaces: still the same JSON
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(padded)))
            self.end_headers()
            for i in range(len(padded)):
                self.server.clock.advance(TRICKLE_GAP_S)
                self.wfile.write(padded[i:i + 1])
                self.server.sent += 1
        except OSError:
            pass
        self.server.replied.set()


@pytest.fixture
def fake_kg():
    server = FakeKG()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.met.set()
    server.shutdown()
    server.server_close()


def test_a_hanging_server_is_marked_down_until_a_probe_answers(fake_kg, caplog_loguru):
    clock = ManualClock()
    # a 1 s read (PROBE_READ_S): time enough for a busy machine's server thread to answer, and a tenth of a hang
    client = KGClient(fake_kg.url, connect_timeout_s=1.0, read_timeout_s=1.0, retries=0, down_after=3, down_s=2.0,
                      clock=clock)
    fake_kg.mode = "hang"
    batch = Deadline(30, clock=clock)
    for i in range(3):  # each waits its whole read timeout: a failure of the server
        assert client.open_get_entity(f"e{i}", deadline=batch) is None
        assert client.requests_sent == i + 1 and client.down == (i == 2)
    assert "unreachable 3 times in a row (last: timeout)" in caplog_loguru.text
    assert [client.open_get_entity(f"e{i}", deadline=batch) for i in range(3, 20)] == [None] * 17
    assert client.requests_sent == 3 and client.probes_sent == 0  # the rest of the batch: no request at all
    assert fake_kg.seen(3) == [("POST", "/open/get_entity")] * 3

    clock.advance(1.0)  # within down_s: no probe yet
    assert client.open_get_entity("e20", deadline=Deadline(30, clock=clock)) is None and client.probes_sent == 0
    clock.advance(1.0)  # down_s has passed, the server still hangs: a probe gets no answer, so no call goes out
    assert client.open_get_entity("e21", deadline=Deadline(30, clock=clock)) is None
    assert client.probes_sent == 1 and client.requests_sent == 3 and client.down
    assert fake_kg.seen(4)[3:] == [("GET", "/")]
    assert client.open_get_entity("e22", deadline=Deadline(30, clock=clock)) is None  # down another down_s
    assert client.probes_sent == 1 and client.requests_sent == 3

    fake_kg.mode = "hang-posts"  # the root answers again, the endpoints still hang
    clock.advance(2.0)  # a probe answers, so a call goes out; on probation, its timeout marks the server down again
    assert client.open_get_entity("e23", deadline=Deadline(30, clock=clock)) is None and client.down
    assert client.probes_sent == 2 and client.requests_sent == 4
    assert fake_kg.seen(6)[4:] == [("GET", "/"), ("POST", "/open/get_entity")]
    assert client.open_get_entity("e24", deadline=Deadline(30, clock=clock)) is None
    assert client.probes_sent == 2 and client.requests_sent == 4

    fake_kg.mode = "ok"
    fake_kg.release.set()
    clock.advance(2.0)  # the server is back: a probe answers, and only then the call is sent
    assert client.open_get_entity("e25", deadline=Deadline(30, clock=clock)) == {"query": "e25"}
    assert fake_kg.seen(8)[6:] == [("GET", "/"), ("POST", "/open/get_entity")] and not client.down
    assert client.probes_sent == 3 and client.requests_sent == 5


def test_timeouts_count_per_attempt_and_a_call_stops_retrying_once_the_server_is_down(fake_kg):
    fake_kg.mode = "hang"
    client = KGClient(fake_kg.url, connect_timeout_s=0.2, read_timeout_s=0.3, retries=2, backoff_s=0.01,
                      down_after=2, clock=ManualClock())
    assert client.finance_get_eps("AAPL", deadline=Deadline(30, clock=ManualClock())) is None
    assert client.requests_sent == 2 and client.down  # the third attempt is not sent


def test_what_does_not_mark_the_server_down(fake_kg):
    """Regression guards (true before and after): a wrong request (HTTP 4xx) is one try, no result and not a
    failure of the server; a timeout cut short by the caller's deadline says nothing about the server."""
    fake_kg.mode = "422"
    client = KGClient(fake_kg.url, retries=2, backoff_s=0.01, down_after=2)
    assert [client.open_get_entity(f"e{i}") for i in range(4)] == [None] * 4
    assert client.requests_sent == 4 and not client.down
    fake_kg.mode = "hang"
    client = KGClient(fake_kg.url, read_timeout_s=5.0, retries=0, down_after=2)
    short = Deadline(0.2, clock=ManualClock())  # 0.2 s left for every call: each read waits 0.2 s, not 5
    assert [client.open_get_entity(f"e{i}", deadline=short) for i in range(3)] == [None] * 3
    assert client.requests_sent == 3 and not client.down


@pytest.mark.parametrize("mode", ["huge", "huge-announced"])
def test_a_huge_reply_is_refused_as_it_arrives(fake_kg, caplog_loguru, mode):
    fake_kg.mode = mode
    cap = 1_000_000
    client = KGClient(fake_kg.url, retries=2, backoff_s=0.01, max_reply_bytes=cap, clock=ManualClock())
    tracemalloc.start()
    try:
        result = client.open_get_entity("Wikipedia", deadline=Deadline(20, clock=ManualClock()))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result is None
    assert peak < 4 * cap  # the reply is not held: at most the cap and one read
    assert fake_kg.replied.wait(WAIT_S)
    assert fake_kg.sent < HUGE // 2  # the client stopped reading: the server could not send the rest
    assert client.bytes_received <= (0 if mode == "huge-announced" else cap + READ_CHUNK)
    assert f"kg.max_reply_bytes ({cap} bytes)" in caplog_loguru.text
    assert ("50000000 bytes (Content-Length)" if mode == "huge-announced" else "refused after reading") \
        in caplog_loguru.text
    assert client.requests_sent == 1  # not retried, and not asked again: it would be the same reply
    assert client.open_get_entity("Wikipedia") is None and client.requests_sent == 1


def test_a_trickling_reply_ends_at_the_deadline(fake_kg, caplog_loguru):
    fake_kg.mode = "trickle"
    clock = fake_kg.clock  # the server moves it on as it trickles
    client = KGClient(fake_kg.url, read_timeout_s=30.0, retries=2, backoff_s=0.01, down_after=1, clock=clock)
    assert client.open_get_entity("slow", deadline=Deadline(10, clock=clock)) is None
    assert fake_kg.replied.wait(WAIT_S) and fake_kg.sent < TRICKLE_BYTES  # the client hung up mid-reply
    assert caplog_loguru.text.count("reply still arriving at the deadline") == 1
    assert client.requests_sent == 1 and not client.down  # the deadline cut it: no retry, no failure of the server
    # without a deadline an attempt lasts at most connect_timeout_s + read_timeout_s, and has then waited its
    # whole read timeout: a failure of the server
    fake_kg.replied.clear()
    fake_kg.sent = 0
    client = KGClient(fake_kg.url, connect_timeout_s=1.0, read_timeout_s=30.0, retries=0, down_after=1, clock=clock)
    assert client.open_get_entity("slower") is None
    assert fake_kg.replied.wait(WAIT_S) and fake_kg.sent < TRICKLE_BYTES
    assert caplog_loguru.text.count("reply still arriving at the deadline") == 2
    assert client.requests_sent == 1 and client.down


def test_the_calls_of_a_batch_are_in_flight_together(fake_kg, make_system, cpu_config, sample_examples):
    """The kg stage runs the lookups of a batch's queries at once (kg.concurrency): the server holds each call
    until two are in flight, and its log shows a movie and a music call in flight together. A stage that made
    them one after the other would leave the first held WAIT_S, then answered, and no two in flight."""
    fake_kg.mode, fake_kg.meet, fake_kg.graph = "kg", 2, KnowledgeGraph(REPO_ROOT / "data" / "kg")
    # no deadline near
    cpu_config.task, cpu_config.section("kg").concurrency, cpu_config.budget.per_query_s = 2, 2, 300.0
    settings = KGSettings(base_url=fake_kg.url, read_timeout_s=60.0, retries=0)  # a held call is never resent

    def extraction(conversation):
        if "inception" in conversation[1]["content"]:
            return '{"domain": "movie", "entities": {"movie_name": "inception"}}'
        return '{"domain": "music", "entities": {"artist_name": "taylor swift"}}'

    system = make_system(ScriptedLLM(by_prompt(kg_entities=extraction)), kg=KGClient.from_config(settings))
    result = system.answer_batch(to_batch(sample_examples[:2]))  # inception's director; taylor swift's album
    assert ("/movie/get_movie_info", "/music/search_artist_entity_by_name") in fake_kg.overlaps()
    records = result.trace
    assert [[r["status"] for r in t["stages"] if r["stage"] == "kg"] for t in records] == [["ok"], ["ok"]]
    assert records[0]["kg_calls"][0] == {"call": "movie_get_movie_info", "args": {"movie_name": "inception"},
                                         "answered": True}
    assert any("Christopher Nolan" in line for line in records[0]["kg_results"])
    assert any("Taylor Swift" in line for line in records[1]["kg_results"])


def test_the_new_settings_come_from_the_kg_config():
    settings = KGSettings(base_url="http://127.0.0.1:9", connect_timeout_s=0.5, read_timeout_s=2.0, retries=1,
                        backoff_s=0.1, down_after=5, down_s=12.0, max_reply_bytes=4096)
    client = KGClient.from_config(settings)
    assert (client.base_url, client.connect_timeout_s, client.read_timeout_s, client.retries, client.backoff_s,
            client.down_after, client.down_s, client.max_reply_bytes) == ("http://127.0.0.1:9", 0.5, 2.0, 1, 0.1,
                                                                          5, 12.0, 4096)
    defaults = KGClient("http://127.0.0.1:9")
    assert (defaults.down_after, defaults.down_s, defaults.max_reply_bytes) == (
        KGSettings().down_after, KGSettings().down_s, KGSettings().max_reply_bytes)
