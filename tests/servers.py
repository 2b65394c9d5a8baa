"""Real servers for tests: a free loopback port, and a server process run for a block (started, waited for on its
health URL, stopped and its process group cleared). Standard library and pytest only: the rehearsal suite
(tests/vllm, .venv-vllm) uses it as the integration suite does."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from evaluation.kg_server import stop

STARTUP_LIMIT_S = 600  # a guard against a server that hangs, not a timing


def free_port() -> int:
    """A loopback port nothing listens on once it returns."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running(argv: list[str], health_url: str, log_path: Path, what: str) -> Iterator[subprocess.Popen]:
    """`argv` as a server writing to `log_path`, yielded once `health_url` answers; the test fails with the log's
    end when it exits first or never answers. Started in a session of its own, so that what it started (vLLM's
    engine core) is killed with it when it does not stop on its own."""
    with log_path.open("w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        limit = time.monotonic() + STARTUP_LIMIT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"{what} exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(health_url, timeout=2):
                    break
            except OSError:
                if time.monotonic() > limit:
                    pytest.fail(f"{what} did not come up:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
        yield process
    finally:
        stop(process)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
