"""The fixture KG server (`python -m evaluation.kg_fixture` over data/kg) as a child process on a free loopback
port."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

from models.config import REPO_ROOT
from utils.errors import HarnessError


class KGServerError(HarnessError, RuntimeError):
    """The fixture KG server did not start; the message holds the end of its output."""


@contextlib.contextmanager
def fixture_kg(*extra_args: str, startup_s: float = 60.0) -> Iterator[str]:
    """Run the fixture KG server for the block; yields its base URL. `extra_args` go to the server's command
    (evaluation/kg_fixture/serve.py). The server ends with this process, kill -9 included (`--parent-pid`)."""
    command = [sys.executable, "-m", "evaluation.kg_fixture", "--port", "0", "--parent-pid", str(os.getpid()),
               *extra_args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT)
    output: collections.deque[str] = collections.deque(maxlen=40)
    announced = threading.Event()

    def drain() -> None:  # the pipe is read to its end, so the server never blocks on a full pipe
        assert process.stdout is not None  # stdout=PIPE
        for line in process.stdout:
            output.append(line)
            if line.startswith("KG server on "):
                announced.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline = time.monotonic() + startup_s
        url = None
        while url is None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise KGServerError(f"the fixture KG server did not start: {''.join(output)[-1000:]}")
            if announced.wait(0.1):
                url = next(m.group(1) for line in list(output) if (m := re.match(r"KG server on (\S+)", line)))
        while True:
            try:
                with urllib.request.urlopen(url + "/", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise KGServerError(
                        f"the fixture KG server does not answer at {url}: {''.join(output)[-1000:]}"
                    ) from None
                time.sleep(0.1)
        yield url
    finally:
        stop(process)


def stop(process: subprocess.Popen, grace_s: float = 20.0) -> None:
    """Terminate a child server, and kill it if it has not exited after `grace_s`."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
