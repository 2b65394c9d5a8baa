"""What `tools/train_llm.py train` writes, loaded where the submission loads models: the merged folder in the image's
transformers 4.x and in the pinned vLLM, and the adapter through vLLM's LoRA support (llm.vllm.lora) on its CPU
build. The Makefile trains SmolLM2 on tests/vllm/finetune_data for two steps (.venv) before this suite runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from models.config import VLLMConfig
from models.llm.backend import GenParams
from models.llm.vllm import VLLMBackend
from tests.vllm.conftest import RUNS, folder, profile
from utils.model_folders import weights_hash

TUNED = Path(os.environ.get("CRAG_VLLM_TUNED", RUNS / "smollm2-tuned"))
QUESTION = [{"role": "system", "content": "Answer the question in as few words as possible."},
            {"role": "user", "content": "Question: what is the capital of italy?\nAnswer:"}]
TOKENS = 8


@pytest.fixture(scope="module")
def merged() -> Path:
    return folder(TUNED / "merged")


def greedy(model: Path, **engine) -> tuple[str, ...]:
    """The greedy tokens of the folder `model` on the engine, in float32 (`engine`: llm.vllm settings)."""
    backend = VLLMBackend(VLLMConfig(dtype="float32", enforce_eager=True, seed=0, **engine), profile(model))
    try:
        sample = backend.generate([QUESTION], GenParams(max_tokens=TOKENS, logprobs=True))[0][0]
    finally:
        backend.close()
    return sample.tokens


def test_the_merged_folder_names_its_base_and_loads_in_the_image_s_transformers(merged, smollm2):
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert transformers.__version__.startswith("4.")
    assert json.loads((merged / "merged_from.json").read_text())["base_weights_sha256"] == weights_hash(smollm2)
    assert weights_hash(merged) != weights_hash(smollm2)
    tokenizer = AutoTokenizer.from_pretrained(merged)
    model = AutoModelForCausalLM.from_pretrained(merged, torch_dtype=torch.float32).eval()
    assert model.config.rope_theta == 100000.0  # SmolLM2's base, written by transformers 5 as rope_parameters
    ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt")
    out = model.generate(ids, max_new_tokens=TOKENS, do_sample=False)
    assert out.shape[1] > ids.shape[1]


def test_vllm_serves_the_merged_folder_and_the_adapter_on_its_base_alike(merged, smollm2):
    """The adapter applied by the engine (enable_lora, a LoRARequest per request) gives the merged folder's greedy
    tokens, both in float32."""
    from_merged = greedy(merged)
    from_adapter = greedy(smollm2, lora=str(folder_of_adapter()))
    assert from_merged and from_adapter == from_merged


def folder_of_adapter() -> Path:
    adapter = TUNED / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        pytest.fail(f"{adapter}: no adapter; `make test-vllm` trains it before the suite runs")
    return adapter
