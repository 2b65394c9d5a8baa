from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest

from evaluation.kg_fixture.launch import fixture_kg
from models.config import EmbedderConfig, HFConfig, LLMConfig, SystemConfig
from models.llm.backend import LLM
from models.llm.hf import HFBackend, resolve_model_folder
from models.llm.profile import ModelProfile, load_profile
from models.retrieval.embedder import Embedder
from tests.servers import free_port, running


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


UNHURRIED_S = 3600.0  # a batch deadline and page timeout no test here comes near


def unhurried(config: SystemConfig) -> SystemConfig:
    """`config` with the batch deadline and the page timeout out of reach. Where the deadline is not under test, a
    busy machine must not skip or cut the stages a test asserts on (on 2 shared cores SmolLM2 has read 8 prompt
    tokens/s); the deadline is tested on model time (test_llm_real.py) and measured by `make bench`."""
    config.budget.per_query_s = UNHURRIED_S
    config.references.timeout_s = UNHURRIED_S
    return config


def _same_embedder(config: EmbedderConfig) -> bool:
    """The session's embedder serves `config`: the packaged MiniLM on the CPU (the batch size only changes how it is
    fed)."""
    return config.model is None and config.device == "cpu"


def same_llm(config: HFConfig, profile: ModelProfile) -> bool:
    """The session's SmolLM2 serves an hf backend of `config` and `profile`: on the CPU, the default profile's weights
    with its settings (a profile file elsewhere may name them; other weights, or another prompt limit, are another
    model)."""
    default = load_profile()
    return config.device == "cpu" and profile.weights == default.weights and profile.settings() == default.settings()


# Where a model is built from a config: the training tools and CragSystem (UserModel) when given none.
EMBEDDER_BUILDERS = ("tools.train_hash", "tools.train_r2former", "tools.train_attributes", "models.resources")
LLM_BUILDERS = ("models.llm.backends", "models.resources")


@pytest.fixture
def builders_share_the_embedder(monkeypatch, embedder) -> None:
    """Code that builds its embedder from a config gets the session's where the config names the same model, and
    builds any other."""
    for name in EMBEDDER_BUILDERS:
        build = importlib.import_module(name).Embedder
        monkeypatch.setattr(f"{name}.Embedder", lambda config, build=build: embedder if _same_embedder(config)
                            else build(config))


@pytest.fixture
def builders_share_the_llm(monkeypatch, hf_llm) -> None:
    """create_llm (how the tools and CragSystem build the config's LLM) gives the session's SmolLM2 where the config
    names the embedded default on the CPU, and builds any other."""
    for name in LLM_BUILDERS:
        build = importlib.import_module(name).create_llm

        def create_llm(config: LLMConfig, build=build) -> LLM:
            same = config.backend == "hf" and same_llm(config.hf, load_profile(config.profile))
            return hf_llm if same else build(config)

        monkeypatch.setattr(f"{name}.create_llm", create_llm)


@pytest.fixture(scope="session")
def served_model(tmp_path_factory):
    """`transformers serve` on a free loopback port, serving the cached SmolLM2 folder: (base_url, model, log)."""
    folder = str(resolve_model_folder())
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    executable = shutil.which("transformers", path=str(Path(sys.executable).parent)) or "transformers"
    with running([executable, "serve", folder, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                  "--log-level", "info"], f"http://127.0.0.1:{port}/health", log_path, "transformers serve"):
        yield f"http://127.0.0.1:{port}/v1", folder, log_path


@pytest.fixture(scope="session")
def kg_server():
    """evaluation/kg_fixture over data/kg on a free loopback port, with fault injection on: its base URL."""
    with fixture_kg("--faults", "--slow-s", "3") as url:
        yield url
