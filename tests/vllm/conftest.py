"""The submission rehearsal's suite: vLLM's CPU build of the pinned release, in the venv requirements.txt builds
(`make test-vllm`, docs/decisions/vllm-rehearsal.md). The model folders are written by the project's own tools
before the suite runs (the Makefile): SmolLM2 by the embedded converter (.venv), its W4A16 by the quantizer
(.venv-quantize)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The CPU build sizes its KV cache from this (GiB); without it the engine reserves a share of host memory.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "runs" / "vllm"
SMOLLM2 = Path(os.environ.get("CRAG_VLLM_MODEL", RUNS / "smollm2"))
SMOLLM2_W4A16 = Path(os.environ.get("CRAG_VLLM_W4A16", RUNS / "smollm2-w4a16"))
MINILM = Path(os.environ.get("CRAG_VLLM_EMBEDDER", RUNS / "minilm"))
MAX_MODEL_LEN = 1024
PROMPT_TOKENS = 768  # the backend cuts a longer prompt to this, under MAX_MODEL_LEN


def folder(path: Path) -> Path:
    if not (path / "config.json").is_file():
        pytest.fail(f"{path}: no model folder; `make test-vllm` writes it before the suite runs")
    return path


def profile(path: Path, **settings):
    """The model profile of the folder `path` at the suite's lengths (`settings` over them)."""
    from models.llm.profile import folder_profile

    return folder_profile(path, **{"max_model_len": MAX_MODEL_LEN, "prompt_tokens": PROMPT_TOKENS, **settings})


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return folder(SMOLLM2)


@pytest.fixture(scope="session")
def minilm() -> Path:
    return folder(MINILM)


@pytest.fixture(scope="session")
def real(smollm2):
    """VLLMBackend on the real engine (float32, so log-probabilities compare with transformers'; eager, as CUDA
    graphs do not exist on a CPU) and a StepClock over its engine's steps."""
    from models.config import VLLMConfig
    from models.llm.vllm import VLLMBackend
    from tests.vllm_scenarios import StepClock

    assert "vllm_fake" not in str(getattr(sys.modules.get("vllm"), "__file__", "")), "the real vllm is needed"
    backend = VLLMBackend(VLLMConfig(dtype="float32", enforce_eager=True, enable_prompt_embeds=True, seed=0),
                          profile(smollm2))
    clock = StepClock(backend.engine.llm_engine)
    yield backend, clock
    backend.close()
