"""The engine held to the stack that trains and converts the model: vLLM's CPU build of the pinned release scores,
by `prompt_logprobs`, the greedy continuations .venv's transformers 5 wrote in float32 for make eval's reasoning
prompts (tests/engine_reference.py, run by `make test-vllm` first), on the same folder, in float32. The two must
agree as vLLM's own model tests require (evaluation/engine_agreement.py): each token's log-probability within
TOLERANCE, and where the most likely tokens differ, each in the other's top k.

The engine is vllm.LLM itself, not VLLMBackend: the backend refuses a folder whose RoPE the engine would misread
before it loads, and this test must also show what such a folder does (CRAG_VLLM_MODEL=<folder> runs it there)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from evaluation.engine_agreement import largest_gap, logprob_mismatches, perplexity, vllm_scores
from tests.vllm.conftest import RUNS, SMOLLM2, folder
from utils.model_folders import weights_hash

# Nats. The largest gap on the embedded and the merged folders, float32 on both sides, is some fifty times smaller
# (the test prints it); the embedded folder served at the RoPE base transformers 4 defaults to moves tokens by
# nats (docs/decisions/model-folders.md).
TOLERANCE = 1e-3
MAX_MODEL_LEN = 2048
CASES = {"embedded": (SMOLLM2, RUNS / "reference-smollm2.json"),
         "merged": (Path(os.environ.get("CRAG_VLLM_TUNED", RUNS / "smollm2-tuned")) / "merged",
                    RUNS / "reference-smollm2-merged.json")}


def engine_scores(model: Path, reference: dict) -> list:
    import vllm

    llm = vllm.LLM(model=str(model), dtype="float32", max_model_len=MAX_MODEL_LEN, enforce_eager=True, seed=0)
    try:
        return vllm_scores(llm, reference["sequences"], reference["starts"], reference["top_k"])
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_engine_s_log_probabilities_are_the_training_stack_s(case):
    model, path = CASES[case]
    folder(model)
    if not path.is_file():
        pytest.fail(f"{path}: no reference; `make test-vllm` writes it with tests/engine_reference.py first")
    reference = json.loads(path.read_text())
    assert reference["weights_sha256"] == weights_hash(model), f"{path} was written for other weights"
    assert reference["transformers"].startswith("5.")
    scores = engine_scores(model, reference)
    found = logprob_mismatches(reference["scores"], scores, TOLERANCE)
    tokens = sum(len(s) for s in scores)
    print(f"{case}: {len(scores)} prompts, {tokens} tokens: largest gap {largest_gap(reference['scores'], scores):.2e}"
          f" nats; perplexity transformers {perplexity(reference['scores']):.4f}, vLLM {perplexity(scores):.4f}; "
          f"{len(found)} mismatches")
    assert not found, f"{len(found)} of {tokens} tokens: " + "; ".join(found[:5])
