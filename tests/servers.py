"""Real servers for tests: a server process run for a block (started, waited for on its health URL, stopped and its
process group cleared). Standard library and pytest only: the rehearsal suite (tests/vllm, .venv-vllm) uses it as
the integration suite does."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from evaluation.kg_fixture.launch import stop
from utils.servers import free_port, wait_until_healthy

__all__ = ["free_port", "running"]

STARTUP_LIMIT_S = 600  # a guard against a server that hangs, not a timing


@contextlib.contextmanager
def running(argv: list[str], health_url: str, log_path: Path, what: str,
            env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """`argv` as a server writing to `log_path`, yielded once `health_url` answers; the test fails with the log's
    end when it exits first or never answers. Started in a session of its own, so that what it started (vLLM's
    engine core) is killed with it when it does not stop on its own. `env`: its environment (default: this one's,
    offline)."""
    with log_path.open("w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=env or {**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        wait_until_healthy(process, health_url, STARTUP_LIMIT_S,
                           lambda why: pytest.fail.Exception(f"{what} {why}:\n{log_path.read_text()[-3000:]}"))
        yield process
    finally:
        stop(process)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
