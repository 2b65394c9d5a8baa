from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from evaluation.kg_server import fixture_kg, stop
from models.config import EmbedderConfig, HFConfig
from models.llm.hf import HFBackend, resolve_model_folder
from models.retrieval.embedder import Embedder


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def hf_llm() -> HFBackend:
    return HFBackend(HFConfig())


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return Embedder(EmbedderConfig())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def served_model(tmp_path_factory):
    """`transformers serve` on a free loopback port, serving the cached SmolLM2 folder: (base_url, model, log)."""
    folder = str(resolve_model_folder(HFConfig()))
    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    executable = shutil.which("transformers", path=str(Path(sys.executable).parent)) or "transformers"
    with log_path.open("w") as log:
        process = subprocess.Popen([executable, "serve", folder, "--host", "127.0.0.1", "--port", str(port),
                                    "--device", "cpu", "--log-level", "info"],
                                   stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                pytest.fail(f"transformers serve exited with {process.returncode}:\n{log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"transformers serve did not come up:\n{log_path.read_text()[-2000:]}")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", folder, log_path
    finally:
        stop(process)


@pytest.fixture(scope="session")
def kg_server():
    """tools/kg_server.py over data/kg on a free loopback port, with fault injection on: its base URL."""
    with fixture_kg("--faults", "--slow-s", "3") as url:
        yield url
