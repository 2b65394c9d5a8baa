"""Local HTTP servers run as child processes: a free loopback port, and the wait for a started server to answer."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable

LOOPBACK = "127.0.0.1"

# vLLM's own address for its processes (vllm/utils/network_utils.py get_ip): the engine core's torch.distributed
# init method (tcp://ADDRESS:PORT) and its gloo sockets. Unset, it is the host's outward address. torch's store at
# that port binds every interface all the same; the served engine holds it to loopback (evaluation/engine_site/).
ENGINE_ON_LOOPBACK = {"VLLM_HOST_IP": LOOPBACK}


def free_port() -> int:
    """A loopback port nothing listens on once it returns."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def wait_until_healthy(process: subprocess.Popen, health_url: str, limit_s: float,
                       failed: Callable[[str], Exception]) -> None:
    """Return once `health_url` answers; raise `failed(why)` when `process` exits first or `limit_s` passes."""
    deadline = time.monotonic() + limit_s
    while True:
        if process.poll() is not None:
            raise failed(f"exited with {process.returncode}")
        try:
            with urllib.request.urlopen(health_url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise failed(f"did not answer at {health_url} within {limit_s:.0f} s") from None
            time.sleep(0.5)
