"""The KG client against a misbehaving server on a loopback port: a server that hangs is marked down until a
probe answers, a huge reply is refused as it arrives, a trickling reply ends at the deadline."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from models.config import KGConfig
from utils.deadline import Deadline
from utils.kg_api import ENDPOINTS, READ_CHUNK, KGClient

PATHS = {endpoint.path for endpoint in ENDPOINTS.values()}
HUGE = 50_000_000  # bytes of the huge reply
TRICKLE_S, TRICKLE_GAP_S = 6.0, 0.05  # a trickled reply: one byte every gap, for this long


class FakeKG(ThreadingHTTPServer):
    """The organisers' routes and reply shape (`GET /` answers a message, `POST /<domain>/<function>` with a JSON
    body answers {"result": ...}), misbehaving as `mode` says: "ok" answers {"result": <the request body>},
    "hang" answers nothing until `release` is set (`GET /` included; "hang-posts": only the endpoints hang),
    "422" refuses the body, "huge" streams a 50 MB result (chunked, no length announced), "huge-announced" the
    same with its Content-Length, "trickle" sends a small reply one byte at a time. Records each request and
    counts the reply bytes it got out."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.mode = "ok"
        self.requests: list[tuple[str, str]] = []
        self.sent = 0
        self.release = threading.Event()
        self.replied = threading.Event()  # set when a reply ended (written or cut off)

    def count(self, method: str) -> int:
        return sum(m == method for m, _ in self.requests)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeKG

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.server.requests.append(("GET", self.path))
        self.answer({"message": "The CRAG API service is running"})

    def do_POST(self) -> None:
        self.server.requests.append(("POST", self.path))
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path not in PATHS:
            self.answer({"detail": "Not Found"}, 404)
        elif self.server.mode == "422":
            self.answer({"detail": [{"type": "missing", "loc": ["body", "query"], "msg": "Field required"}]}, 422)
        elif self.server.mode in ("huge", "huge-announced"):
            self.huge(announced=self.server.mode == "huge-announced")
        elif self.server.mode == "trickle":
            self.trickle(json.dumps({"result": body}).encode())
        else:
            self.answer({"result": body})

    def answer(self, data: dict, status: int = 200) -> None:
        if self.server.mode == "hang" or (self.server.mode == "hang-posts" and self.command == "POST"):
            self.server.release.wait(10)
        payload = json.dumps(data).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
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
        padded = payload.rjust(int(TRICKLE_S / TRICKLE_GAP_S))  # leading spaces: still the same JSON
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(padded)))
            self.end_headers()
            for i in range(len(padded)):
                self.wfile.write(padded[i:i + 1])
                self.server.sent += 1
                time.sleep(TRICKLE_GAP_S)
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
    server.shutdown()
    server.server_close()


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_a_hanging_server_is_marked_down_until_a_probe_answers(fake_kg, caplog_loguru):
    client = KGClient(fake_kg.url, connect_timeout_s=0.2, read_timeout_s=0.3, retries=0, down_after=3, down_s=0.6)
    fake_kg.mode = "hang"
    batch = Deadline(30)
    for i in range(3):  # each waits its whole read timeout
        result, seconds = timed(lambda: client.open_get_entity(f"e{i}", deadline=batch))
        assert result is None and 0.25 < seconds < 2.0
    results, seconds = timed(lambda: [client.open_get_entity(f"e{i}", deadline=batch) for i in range(3, 20)])
    assert results == [None] * 17 and seconds < 0.2  # the rest of the batch: at once, without a request
    assert fake_kg.requests == [("POST", "/open/get_entity")] * 3 and client.down
    assert "unreachable 3 times in a row (last: timeout)" in caplog_loguru.text

    time.sleep(0.65)  # a later batch, the server still hanging: a probe gets no answer, so no call goes out
    result, seconds = timed(lambda: client.open_get_entity("e20", deadline=Deadline(30)))
    assert result is None and seconds < 2.0
    assert fake_kg.requests[3:] == [("GET", "/")] and client.probes_sent == 1
    assert client.open_get_entity("e21", deadline=Deadline(30)) is None and client.probes_sent == 1  # down_s again

    fake_kg.mode = "hang-posts"  # the root answers again, the endpoints still hang
    time.sleep(0.65)  # a probe answers, so a call goes out; on probation, its timeout marks the server down again
    assert client.open_get_entity("e22", deadline=Deadline(30)) is None and client.down
    assert fake_kg.requests[4:] == [("GET", "/"), ("POST", "/open/get_entity")]
    assert client.open_get_entity("e23", deadline=Deadline(30)) is None and len(fake_kg.requests) == 6

    fake_kg.mode = "ok"
    fake_kg.release.set()
    time.sleep(0.65)  # the server is back: a probe answers, and only then the call is sent
    assert client.open_get_entity("e24", deadline=Deadline(30)) == {"query": "e24"}
    assert fake_kg.requests[6:] == [("GET", "/"), ("POST", "/open/get_entity")] and not client.down
    assert client.probes_sent == 3


def test_timeouts_count_per_attempt_and_a_call_stops_retrying_once_the_server_is_down(fake_kg):
    fake_kg.mode = "hang"
    client = KGClient(fake_kg.url, connect_timeout_s=0.2, read_timeout_s=0.3, retries=2, backoff_s=0.01,
                      down_after=2)
    assert client.finance_get_eps("AAPL", deadline=Deadline(30)) is None
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
    assert [client.open_get_entity(f"e{i}", deadline=Deadline(0.2)) for i in range(3)] == [None] * 3
    assert client.requests_sent == 3 and not client.down


@pytest.mark.parametrize("mode", ["huge", "huge-announced"])
def test_a_huge_reply_is_refused_as_it_arrives(fake_kg, caplog_loguru, mode):
    fake_kg.mode = mode
    cap = 1_000_000
    client = KGClient(fake_kg.url, retries=2, backoff_s=0.01, max_reply_bytes=cap)
    tracemalloc.start()
    try:
        result = client.open_get_entity("Wikipedia", deadline=Deadline(20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result is None
    assert peak < 4 * cap  # the reply is not held: at most the cap and one read
    assert fake_kg.replied.wait(10)
    assert fake_kg.sent < HUGE // 2  # the client stopped reading: the server could not send the rest
    assert client.bytes_received <= (0 if mode == "huge-announced" else cap + READ_CHUNK)
    assert f"kg.max_reply_bytes ({cap} bytes)" in caplog_loguru.text
    assert ("50000000 bytes (Content-Length)" if mode == "huge-announced" else "refused after reading") \
        in caplog_loguru.text
    assert client.requests_sent == 1  # not retried, and not asked again: it would be the same reply
    assert client.open_get_entity("Wikipedia") is None and client.requests_sent == 1


def test_a_trickling_reply_ends_at_the_deadline(fake_kg, caplog_loguru):
    fake_kg.mode = "trickle"
    client = KGClient(fake_kg.url, read_timeout_s=1.0, retries=2, backoff_s=0.01)
    result, seconds = timed(lambda: client.open_get_entity("slow", deadline=Deadline(2.0)))
    assert result is None and seconds < 2.0 + 1.5  # a contract, not a speed figure: the margin is generous
    assert "still arriving at the deadline" in caplog_loguru.text
    assert client.requests_sent == 1 and not client.down  # the deadline cut it, not the server's read timeout
    # without a deadline an attempt lasts at most connect_timeout_s + read_timeout_s
    client = KGClient(fake_kg.url, connect_timeout_s=0.2, read_timeout_s=0.5, retries=0)
    result, seconds = timed(lambda: client.open_get_entity("slower"))
    assert result is None and seconds < 0.7 + 1.5


def test_the_new_settings_come_from_the_kg_config():
    settings = KGConfig(base_url="http://127.0.0.1:9", connect_timeout_s=0.5, read_timeout_s=2.0, retries=1,
                        backoff_s=0.1, down_after=5, down_s=12.0, max_reply_bytes=4096)
    client = KGClient.from_config(settings)
    assert (client.base_url, client.connect_timeout_s, client.read_timeout_s, client.retries, client.backoff_s,
            client.down_after, client.down_s, client.max_reply_bytes) == ("http://127.0.0.1:9", 0.5, 2.0, 1, 0.1,
                                                                          5, 12.0, 4096)
    defaults = KGClient("http://127.0.0.1:9")
    assert (defaults.down_after, defaults.down_s, defaults.max_reply_bytes) == (
        KGConfig().down_after, KGConfig().down_s, KGConfig().max_reply_bytes)
