"""docs/how-to/swap-the-model.md on the real CPU engine: a second model folder (the merged fine-tuned SmolLM2 that
`make test-vllm` writes) and a profile naming it, served by `--serve-llm` and loaded by the in-process vllm backend.
Each run's manifest names that folder's fingerprint, never the embedded SmolLM2's; the served run's also what the
server reported it serves."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from models.config import REPO_ROOT
from models.llm.profile import load_profile, write_profile
from models.llm.weights import fingerprint
from tests.vllm.conftest import MAX_MODEL_LEN, PROMPT_TOKENS, RUNS, folder

MERGED = RUNS / "smollm2-tuned" / "merged"
VENV_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"  # what make eval runs local_evaluation.py with


@pytest.fixture(scope="module")
def merged_profile(tmp_path_factory):
    """The merged folder's profile: the default's settings, its weights, the suite's lengths."""
    path = write_profile(tmp_path_factory.mktemp("profile") / "merged.yaml", load_profile(), folder(MERGED))
    path.write_text(path.read_text().replace("max_model_len: 4096", f"max_model_len: {MAX_MODEL_LEN}")
                    .replace("prompt_tokens: 2048", f"prompt_tokens: {PROMPT_TOKENS}"))
    assert load_profile(str(path)).max_model_len == MAX_MODEL_LEN
    return path


def test_serve_llm_serves_the_profile_s_folder_and_the_run_records_its_fingerprint_and_report(
        merged_profile, smollm2, tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([str(VENV_PYTHON), "local_evaluation.py", "--data", "data/crag_sample.jsonl", "--overlay",
                           "configs/overlays/vllm-cpu.yaml", "--set", f"llm.profile={merged_profile}", "--set",
                           "answer.gate=null", "--limit", "1", "--serve-llm", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"({MERGED.name} as smollm2, vLLM CPU build" in done.stderr  # the profile's folder is what was served
    written = json.loads((out / "manifest.json").read_text())
    assert written["answers"]["weights"]["fingerprint"] == fingerprint(MERGED)[0] != fingerprint(smollm2)[0]
    served = written["served"]  # what the engine's GET /v1/models said once it was up
    assert served["id"] == "smollm2" and served["max_model_len"] == MAX_MODEL_LEN
    assert Path(served["root"]).resolve() == MERGED.resolve()
    assert fingerprint(smollm2)[0] not in json.dumps(written)
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 1


def test_the_in_process_vllm_backend_loads_the_profile_s_folder_and_the_record_names_it(merged_profile, smollm2):
    from evaluation import manifest
    from models.llm.backend import GenParams
    from models.llm.backends import create_llm
    from models.loading import load_config

    config = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=[
        "llm.backend=vllm", f"llm.profile={merged_profile}", "llm.vllm.dtype=float32", "llm.vllm.enforce_eager=true"])
    weights = manifest.answer_inputs(config, REPO_ROOT / "data" / "crag_sample.jsonl", 30.0, False)["weights"]
    assert weights["fingerprint"] == fingerprint(MERGED)[0] != fingerprint(smollm2)[0]
    llm = create_llm(config.llm)
    try:
        assert llm.engine.llm_engine.model_config.model == str(MERGED)
        (sample,), = llm.generate([[{"role": "user", "content": "What is the capital of France?"}]],
                                  GenParams(max_tokens=8))
        assert sample.text
    finally:
        llm.close()
