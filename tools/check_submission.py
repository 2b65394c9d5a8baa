"""Check a submission before sending it, not after: aicrowd.json, the config and its weights, the requirements
files, the image (the Dockerfile's CUDA base against the vLLM pin), the GPUs aicrowd.json asks for against the
config, the model folder's quantization against the config's, the per-T4 memory plan, R2AG's prompt embeddings,
the import of UserModel, the batch-size contract, sample queries within their time limit, the budget plan at
the measured speed of the configured LLM, and (GPU configs, where `make test-vllm` has built .venv-vllm) the
rehearsal: the grader's loop over the sample on vLLM's CPU build in the image's environment (tools/rehearse.py).

    python tools/check_submission.py              # the Dockerfile's config (CRAG_CONFIG) and its backend
    python tools/check_submission.py --cpu        # the embedded CPU default instead (no GPU, no weights needed)
    make check                                    # = --cpu

The model is imported and run in a child process (as the grader does, with the repository as its working
folder), so a UserModel that fails to import or hangs is reported, not fatal. Prints a pass/fail table; exits 1
when any check fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.config import MAX_BATCH_SIZE, REPO_ROOT, ConfigError
from utils.cli import CommandParser, command, interrupted

CHALLENGES = {  # the id of each task's challenge; aicrowd.json names one
    "meta-kdd-cup-24-crag-retrieval-summarization": "Task 1: retrieval summarization",
    "meta-kdd-cup-24-crag-knowledge-graph-and-web-retrieval": "Task 2: knowledge graph and web retrieval",
    "meta-kdd-cup-24-crag-end-to-end-retrieval-augmented-generation": "Task 3: end-to-end RAG",
}
PLACEHOLDER_AUTHOR = "your-aicrowd-username"
CPU_CONFIG = "configs/cpu.yaml"
REHEARSAL_PYTHON = ".venv-vllm/bin/python"  # make vllm-venv
REHEARSAL_MODEL = "runs/vllm/smollm2"  # make test-vllm

# The CUDA each pinned vLLM wheel is built with (the Dockerfile's nvidia/cuda base image should match it). Source
# for 0.14.1: its vllm/_C.abi3.so says "Cuda compilation tools, release 12.9, V12.9.86" (strings) and needs
# libcudart.so.12 (readelf -d). A new pin: read the same from its wheel and add a row.
VLLM_WHEEL_CUDA = {"0.14.1": "12.9"}
# The grader's GPU: a T4 (16 GB board; nvidia-smi reports 15109 MiB with ECC on, as on AWS g4dn). An assumption:
# the ECC-off figure is 15360 MiB.
T4_BYTES = 15109 * 2**20
# vLLM 0.14.1's max_num_batched_tokens for vllm.LLM on a GPU under 70 GiB (vllm/engine/arg_utils.py, 8192): the
# most tokens one forward pass reads, which sets the activation peak.
VLLM_BATCHED_TOKENS = 8192
FIXED_MARGIN_BYTES = 2**30  # CUDA context, cuBLAS workspaces, NCCL buffers per GPU: assumed, not measured
CUDA_GRAPHS_BYTES = 2**29  # vLLM's captured CUDA graphs (none with enforce_eager): assumed, not measured
# What each kind of model folder accepts as llm.vllm.quantization (None: vLLM reads quantization_config). A
# mismatch is refused at load (vllm/config/model.py _verify_quantization); GPTQ folders may also take the Marlin
# kernel by name.
QUANTIZATION_ACCEPTS = {
    "compressed-tensors": (None, "compressed-tensors"),  # tools/quantize.py (llm-compressor W4A16)
    "gptq": (None, "gptq", "gptq_marlin"),
    "awq": (None, "awq", "awq_marlin"),
    None: (None,),  # an unquantized folder
}
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    warn: bool = False  # passed, with something to look at

def check_aicrowd(repo: Path, task: int | None) -> Check:
    path = repo / "aicrowd.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        return Check("aicrowd.json", False, f"unreadable: {err}")
    problems = []
    if not isinstance(data, dict):
        return Check("aicrowd.json", False, "must be a JSON object")
    challenge = data.get("challenge_id")
    if challenge not in CHALLENGES:
        problems.append(f"challenge_id {challenge!r} is not one of {sorted(CHALLENGES)}")
    elif task is not None and not CHALLENGES[challenge].startswith(f"Task {task}"):
        problems.append(f"challenge_id is {CHALLENGES[challenge].split(':')[0]} but the config says task {task}")
    authors = data.get("authors")
    if not (isinstance(authors, list) and authors and all(isinstance(a, str) and a.strip() for a in authors)):
        problems.append("authors must be a non-empty list of AIcrowd usernames")
    if data.get("gpu") is not True:
        problems.append("gpu must be true")
    if not (isinstance(data.get("gpu_count"), int) and 1 <= data["gpu_count"] <= 4):
        problems.append("gpu_count must be an integer in 1..4 (4 T4s)")
    if not isinstance(data.get("description"), str) or not data["description"].strip():
        problems.append("description must be a non-empty string")
    if problems:
        return Check("aicrowd.json", False, "; ".join(problems))
    placeholder = PLACEHOLDER_AUTHOR in authors
    note = " (authors is still the placeholder: put your username)" if placeholder else ""
    return Check("aicrowd.json", True, f"{CHALLENGES[challenge]}{note}", warn=placeholder)


def dockerfile_config(repo: Path) -> str | None:
    """The CRAG_CONFIG the Dockerfile sets, relative to the repository, or None."""
    try:
        text = (repo / "Dockerfile").read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"CRAG_CONFIG=(\S+)", text)
    if not match:
        return None
    path = match.group(1)
    return "configs/" + path.rsplit("/configs/", 1)[1] if "/configs/" in path else path


def _weights(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (any(folder.glob("*.safetensors")) or any(folder.glob("*.bin")))


def check_config(repo: Path, config_path: str) -> tuple[Check, Check, Any]:
    """(config check, weights check, the loaded config or None)."""
    from models.config import ConfigError, load_config

    try:
        config = load_config(repo / config_path)
    except ConfigError as err:
        return Check("config", False, str(err)), Check("weights", False, "config not loaded"), None
    needed: list[tuple[str, Path, str]] = []  # (key, path, kind)
    backend = config.llm.backend
    if backend == "vllm":
        needed.append(("llm.vllm.model", Path(config.llm.vllm.model), "model"))
    elif backend == "hf" and config.llm.hf.model:
        needed.append(("llm.hf.model", Path(config.llm.hf.model), "model"))
    if config.embedder.model:
        needed.append(("embedder.model", Path(config.embedder.model), "folder"))
    if config.references.rerank.model:
        needed.append(("references.rerank.model", Path(config.references.rerank.model), "folder"))
    if config.attributes.method == "svm":
        needed.append(("attributes.svm_model", Path(config.attributes.svm_model), "file"))
    if config.r2ag.enabled and config.r2ag.checkpoint:
        needed.append(("r2ag.checkpoint", Path(config.r2ag.checkpoint), "file"))
    if config.references.retriever == "hash":
        needed.append(("references.hash.model", Path(config.references.hash.model), "file"))
    missing = []
    for key, path, kind in needed:
        full = path if path.is_absolute() else repo / path
        if kind == "file" and not full.is_file() or kind == "folder" and not full.is_dir():
            missing.append(f"{key}: {path} not found")
        elif kind == "model" and not (full.suffix == ".gguf" and full.is_file() or full.is_dir() and _weights(full)):
            missing.append(f"{key}: {path} holds no model weights (config.json and *.safetensors)")
    config_check = Check("config", True, f"{config_path}: backend {backend}, task {config.task}, "
                                         f"batch_size {config.batch_size}")
    detail = "; ".join(missing) if missing else f"{len(needed)} paths present"
    return config_check, Check("weights", not missing, detail), config


def _resolve(repo: Path, path: str) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else repo / candidate


def pinned(repo: Path, name: str) -> str | None:
    """The version requirements.txt pins `name` to with ==, or None."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        lines = (repo / "requirements.txt").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            requirement = Requirement(line.split("#", 1)[0].strip())
        except InvalidRequirement:
            continue
        if requirement.name.lower() == name:
            return next((spec.version for spec in requirement.specifier if spec.operator == "=="), None)
    return None


def check_image(repo: Path) -> Check:
    """The Dockerfile's final base image: its CUDA against the wheel's of the vllm pin, its Python against the
    release's Requires-Python (from data/vllm/engine_api-<pin>.json)."""
    try:
        text = (repo / "Dockerfile").read_text(encoding="utf-8")
    except OSError as err:
        return Check("image", False, f"Dockerfile unreadable: {err}")
    bases = re.findall(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)", text, flags=re.MULTILINE)
    if not bases:
        return Check("image", False, "the Dockerfile has no FROM line")
    base, version = bases[-1], pinned(repo, "vllm")
    if version is None:
        return Check("image", True, f"{base}; requirements.txt pins no vllm (needed only by llm.backend vllm)",
                     warn=True)
    wheel = VLLM_WHEEL_CUDA.get(version)
    if wheel is None:
        return Check("image", False, f"vllm=={version} is not in VLLM_WHEEL_CUDA (tools/check_submission.py): read "
                                     "its wheel's CUDA (strings vllm/_C.abi3.so | grep 'Cuda compilation') and add it")
    match = re.fullmatch(r"(?:docker\.io/)?nvidia/cuda:(\d+)\.(\d+)(?:\.\d+)?-.+", base)
    if match is None:
        return Check("image", False, f"base image {base} is not nvidia/cuda:X.Y.Z-...: the vllm {version} wheel "
                                     f"is built with CUDA {wheel}; use nvidia/cuda:{wheel}.x-runtime-ubuntu22.04")
    image = f"{match.group(1)}.{match.group(2)}"
    problems, notes = [], []
    if image.split(".")[0] != wheel.split(".")[0]:
        problems.append(f"base image CUDA {image}, the vllm {version} wheel's {wheel}: use nvidia/cuda:{wheel}.x")
    elif image != wheel:
        notes.append(f"base image CUDA {image}, the vllm {version} wheel's {wheel} (same major: runs under minor "
                     f"version compatibility; nvidia/cuda:{wheel}.x matches)")
    python = re.search(r"\bpython3\.(\d+)\b", text)
    extract = repo / "data" / "vllm" / f"engine_api-{version}.json"
    if python and extract.is_file():
        from packaging.specifiers import SpecifierSet

        wanted = json.loads(extract.read_text(encoding="utf-8")).get("requires_python") or ""
        if f"3.{python.group(1)}" not in SpecifierSet(wanted):
            problems.append(f"python3.{python.group(1)} in the image, vllm {version} requires Python {wanted}")
    elif not extract.is_file():
        notes.append(f"no data/vllm/engine_api-{version}.json: run tools/vllm_engine_args.py on the wheel")
    if problems:
        return Check("image", False, "; ".join(problems))
    detail = f"{base}: CUDA {image} for vllm=={version} (wheel CUDA {wheel})"
    return Check("image", True, "; ".join([detail, *notes]), warn=bool(notes))


def check_gpus(repo: Path, config: Any) -> Check | None:
    """aicrowd.json's gpu_count against what the config's LLM uses (None when aicrowd.json is unreadable: its own
    check says why)."""
    try:
        count = json.loads((repo / "aicrowd.json").read_text(encoding="utf-8")).get("gpu_count")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(count, int):
        return None
    backend = config.llm.backend
    if backend == "openai":
        return Check("GPUs", True, f"llm.backend openai ({config.llm.openai.base_url}): the grader starts no "
                                   "server; this is a local config, not a submission's", warn=True)
    if backend != "vllm":
        return Check("GPUs", True, f"aicrowd.json asks for {count}; llm.backend {backend}")
    size = config.llm.vllm.tensor_parallel_size
    if size > count:
        return Check("GPUs", False, f"llm.vllm.tensor_parallel_size {size} needs {size} GPUs, aicrowd.json's "
                                    f"gpu_count is {count}: raise gpu_count or lower tensor_parallel_size")
    detail = f"tensor_parallel_size {size} of gpu_count {count}"
    return Check("GPUs", True, detail + ("" if size == count else f": {count - size} GPU(s) idle for the LLM"),
                 warn=size != count)


def model_config(folder: Path) -> dict | None:
    """The folder's config.json (a multimodal one's text_config merged over it), or None."""
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return {**data, **data.get("text_config", {})} if isinstance(data, dict) else None


def folder_quantization(data: dict) -> dict:
    """{method, bits, group_size, symmetric, ignore, format} of a config.json's quantization_config (method None:
    not quantized). compressed-tensors: its first config group's weights (tools/quantize.py writes one)."""
    quant = data.get("quantization_config") or {}
    method = quant.get("quant_method")
    if method == "compressed-tensors":
        weights = next(iter(quant.get("config_groups", {}).values()), {}).get("weights") or {}
        return {"method": method, "bits": weights.get("num_bits"), "group_size": weights.get("group_size"),
                "symmetric": weights.get("symmetric", True), "ignore": quant.get("ignore", []),
                "format": quant.get("format")}
    if method:
        return {"method": method, "bits": quant.get("bits"), "group_size": quant.get("group_size"),
                "symmetric": quant.get("sym", True), "ignore": ["lm_head"], "format": quant.get("checkpoint_format")}
    return {"method": None, "bits": None, "group_size": None, "symmetric": True, "ignore": [], "format": None}


def check_quantization(repo: Path, config: Any) -> Check | None:
    """llm.vllm.quantization against the model folder's quantization_config (vllm backend only)."""
    if config.llm.backend != "vllm":
        return None
    settings = config.llm.vllm
    folder = _resolve(repo, settings.model)
    data = model_config(folder)
    if data is None:
        return Check("quantization", True, f"{settings.model}: no config.json, not checked (see weights)", warn=True)
    quant = folder_quantization(data)
    method, chosen = quant["method"], settings.quantization
    accepted = QUANTIZATION_ACCEPTS.get(method, (None, method))
    what = ("unquantized" if method is None else
            f"{method} {quant['format'] or ''} {quant['bits']}-bit, group {quant['group_size']}".replace("  ", " "))
    if chosen not in accepted:
        fix = " or ".join("null" if a is None else a for a in accepted)
        return Check("quantization", False, f"llm.vllm.quantization is {chosen!r} but {settings.model} is {what}: "
                                            f"set it to {fix} (vLLM refuses the mismatch at load)")
    return Check("quantization", True, f"{settings.model}: {what}; llm.vllm.quantization "
                                       f"{'null (read from the folder)' if chosen is None else chosen}")


def safetensors_bytes(folder: Path) -> int | None:
    """The tensor bytes the folder's *.safetensors declare (their headers' data offsets), or None without any."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with file.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        total += sum(end - start for name, entry in header.items() if name != "__metadata__"
                     for start, end in [entry["data_offsets"]])
    return total


@dataclass
class MemoryPlan:
    weights: float  # bytes per GPU
    weights_source: str
    kv_per_token: float  # bytes per token per GPU
    margin: float  # bytes per GPU
    budget: float  # bytes per GPU vLLM may use
    sequences: int  # sequences the configured batch runs at once
    max_model_len: int

    def kv_room_tokens(self) -> int:
        return max(int((self.budget - self.weights - self.margin) // self.kv_per_token), 0)


def estimated_weight_bytes(data: dict, quant: dict) -> float:
    """The weights of a Llama-style decoder from config.json: attention and MLP Linear layers at the quantized bits
    plus one 16-bit scale per group (and, for GPTQ, a zero point per group), the embeddings, lm_head (unless tied
    or quantized) and norms in 16 bits (4 for a float32 folder)."""
    hidden, layers = data["hidden_size"], data["num_hidden_layers"]
    heads = data["num_attention_heads"]
    head_dim = data.get("head_dim") or hidden // heads
    kv_heads = data.get("num_key_value_heads") or heads
    vocab, inter = data["vocab_size"], data["intermediate_size"]
    wide = DTYPE_BYTES.get(str(data.get("torch_dtype") or data.get("dtype") or "bfloat16"), 2)
    linear = layers * (hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 3 * hidden * inter)
    quantized = wide  # bytes per weight of a quantized Linear layer
    if quant["method"] is not None and quant["bits"]:
        group = quant["group_size"] if quant["group_size"] and quant["group_size"] > 0 else hidden
        quantized = (quant["bits"] + 16 / group + (quant["bits"] / group if quant["method"] == "gptq" else 0)) / 8
    head = 0 if data.get("tie_word_embeddings") else vocab * hidden
    head_bytes = head * (wide if "lm_head" in quant["ignore"] else quantized)
    return linear * quantized + vocab * hidden * wide + head_bytes + (2 * layers + 1) * hidden * wide


def memory_plan(repo: Path, config: Any) -> MemoryPlan | str:
    """The per-GPU plan of the config's vLLM engine on T4s, or why none can be made."""
    settings = config.llm.vllm
    folder = _resolve(repo, settings.model)
    data = model_config(folder)
    if data is None:
        return f"{settings.model}: no config.json to plan from"
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")
    if any(not isinstance(data.get(k), int) for k in keys):
        return f"{settings.model}/config.json lacks {', '.join(k for k in keys if not isinstance(data.get(k), int))}"
    tp = settings.tensor_parallel_size
    declared = safetensors_bytes(folder)
    if declared is not None:
        total, source = declared, "the folder's safetensors"
    else:
        total, source = estimated_weight_bytes(data, folder_quantization(data)), "config.json x bits"
    heads = data["num_attention_heads"]
    head_dim = data.get("head_dim") or data["hidden_size"] // heads
    kv_heads = data.get("num_key_value_heads") or heads
    wide = DTYPE_BYTES.get(settings.dtype, DTYPE_BYTES.get(str(data.get("torch_dtype")), 2))
    kv_bytes = 1 if settings.kv_cache_dtype.startswith("fp8") else wide
    kv_per_token = 2 * data["num_hidden_layers"] * max(1, kv_heads // tp) * head_dim * kv_bytes
    activations = VLLM_BATCHED_TOKENS * (4 * data["hidden_size"] + 2 * data["intermediate_size"] / tp) * wide
    margin = FIXED_MARGIN_BYTES + (0 if settings.enforce_eager else CUDA_GRAPHS_BYTES) + activations
    return MemoryPlan(total / tp, source, kv_per_token, margin, T4_BYTES * settings.gpu_memory_utilization,
                      config.batch_size, settings.max_model_len)


def check_memory(repo: Path, config: Any) -> Check | None:
    """Per T4: weights / tensor_parallel_size + KV cache for batch_size sequences of max_model_len + a margin,
    against 15109 MiB x gpu_memory_utilization (vllm backend only)."""
    if config.llm.backend != "vllm":
        return None
    plan = memory_plan(repo, config)
    if isinstance(plan, str):
        return Check("GPU memory", True, f"{plan}: no plan", warn=True)
    gb = 1e9
    kv_batch = plan.kv_per_token * plan.sequences * plan.max_model_len
    figures = (f"per T4: weights {plan.weights / gb:.1f} GB ({plan.weights_source} / tensor_parallel_size) + KV "
               f"{kv_batch / gb:.1f} GB ({plan.sequences} x {plan.max_model_len} tokens at "
               f"{plan.kv_per_token / 1024:.0f} KiB/token) + margin {plan.margin / gb:.1f} GB = "
               f"{(plan.weights + kv_batch + plan.margin) / gb:.1f} GB of {plan.budget / gb:.1f} GB "
               f"(15109 MiB x gpu_memory_utilization {config.llm.vllm.gpu_memory_utilization})")
    room = plan.kv_room_tokens()
    if room < plan.max_model_len:
        return Check("GPU memory", False, f"{figures}: KV room {room} tokens, under one max_model_len sequence "
                                          "(vLLM refuses to start): lower max_model_len or use more GPUs")
    if room < plan.sequences * plan.max_model_len:
        return Check("GPU memory", True, f"{figures}: KV room for {room // plan.max_model_len} full-length "
                                         f"sequences of {plan.sequences} (vLLM queues the rest; shorter prompts "
                                         "fit more)", warn=True)
    return Check("GPU memory", True, figures)


def uses_prompt_embeddings(config: Any) -> bool:
    """R2AG prompt mode in the chosen strategy: its retrieval embeddings reach the reasoning prompt."""
    stages = config.strategy_names()
    return config.r2ag.enabled and config.r2ag.mode == "prompt" and "r2ag" in stages and "reasoning" in stages


def check_prompt_embeds(repo: Path, config: Any) -> Check | None:
    """llm.vllm.enable_prompt_embeds on exactly when R2AG prompt mode is in use (vllm backend only)."""
    if config.llm.backend != "vllm":
        return None
    wanted, enabled = uses_prompt_embeddings(config), config.llm.vllm.enable_prompt_embeds
    if wanted and not enabled:
        return Check("prompt embeddings", False, "r2ag.mode prompt needs llm.vllm.enable_prompt_embeds: true (else "
                                                 "R2AG falls back to relevance mode)")
    if enabled and not wanted:
        return Check("prompt embeddings", True, "llm.vllm.enable_prompt_embeds is on without R2AG prompt mode: it "
                                                "costs host memory and keeps the embedding layer out of vLLM's CUDA "
                                                "graphs; set it to false", warn=True)
    if not enabled:
        return Check("prompt embeddings", True, "off (R2AG prompt mode not used)")
    data = model_config(_resolve(repo, config.llm.vllm.model)) or {}
    size = (f"{data['vocab_size'] * data['hidden_size'] * 2 / 1e9:.2f} GB" if isinstance(data.get("vocab_size"), int)
            and isinstance(data.get("hidden_size"), int) else "vocabulary x hidden x 2 bytes")
    return Check("prompt embeddings", True, f"on for R2AG prompt mode: the input embeddings take {size} of host "
                                            "memory in the driver process")


def check_finetuned(repo: Path, config: Any) -> Check | None:
    """What tools/train_llm.py wrote, where the config names it: a LoRA adapter (llm.vllm.lora) with its
    adapter_config.json and weights, on an unquantized base; a merged folder (merged_from.json), by the base and
    adapter it was merged from (vllm backend only)."""
    if config.llm.backend != "vllm":
        return None
    settings = config.llm.vllm
    merged = _resolve(repo, settings.model) / "merged_from.json"
    if settings.lora:
        adapter = _resolve(repo, settings.lora)
        try:
            rank = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))["r"]
        except (OSError, ValueError, KeyError, TypeError):
            return Check("fine-tuned", False, f"llm.vllm.lora {settings.lora}: no adapter_config.json with a rank; "
                                              "give the adapter/ folder of `tools/train_llm.py train`")
        if not any(adapter.glob("adapter_model.*")):
            return Check("fine-tuned", False, f"llm.vllm.lora {settings.lora}: no adapter_model.safetensors")
        method = folder_quantization(model_config(_resolve(repo, settings.model)) or {})["method"]
        if method is not None:
            return Check("fine-tuned", True, f"LoRA rank {rank} on a {method} base: merge it into the fp16 base and "
                                             "quantize the merged folder instead (docs/how-to/fine-tune.md)", warn=True)
        return Check("fine-tuned", True, f"LoRA adapter {settings.lora}, rank {rank}, applied by the engine")
    if merged.is_file():
        origin = json.loads(merged.read_text(encoding="utf-8"))
        return Check("fine-tuned", True, f"{settings.model}: merged from base {origin['base_weights_sha256'][:12]} "
                                         f"and adapter {origin['adapter_weights_sha256'][:12]}")
    return None


def gpu_checks(repo: Path, config: Any) -> list[Check]:
    """The checks of a GPU submission that need the config (those that do not apply are left out)."""
    checks = [check_gpus(repo, config), check_quantization(repo, config), check_memory(repo, config),
              check_prompt_embeds(repo, config), check_finetuned(repo, config)]
    return [c for c in checks if c is not None]


def check_requirements(repo: Path) -> Check:
    from packaging.requirements import InvalidRequirement, Requirement

    problems, count = [], 0
    for name in ("requirements.txt", "requirements-local.txt"):
        try:
            lines = (repo / name).read_text(encoding="utf-8").splitlines()
        except OSError as err:
            problems.append(f"{name}: {err}")
            continue
        for number, line in enumerate(lines, start=1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                requirement = Requirement(line)
            except InvalidRequirement as err:
                problems.append(f"{name}:{number}: {err}")
                continue
            count += 1
            if not any(spec.operator == "==" for spec in requirement.specifier):
                problems.append(f"{name}:{number}: {requirement.name} is not pinned with ==")
    return Check("requirements", not problems, "; ".join(problems) or f"{count} pinned requirements parse")


def probe(args: argparse.Namespace) -> int:
    """The child: import UserModel, check its batch size, run sample queries; one JSON line on stdout."""
    report: dict[str, Any] = {}
    sys.path.insert(0, os.getcwd())  # the submission's own models/, ahead of the checker's repository
    try:
        from models.user_config import UserModel
    except BaseException as err:  # the report names what the grader would see
        print(json.dumps({"import_error": f"{type(err).__name__}: {err}"}))
        return 0
    try:
        started = time.perf_counter()
        model = UserModel()
        report["load_s"] = time.perf_counter() - started
        size = model.get_batch_size()
        report["batch_size"] = size
        if not (isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= MAX_BATCH_SIZE):
            print(json.dumps(report))
            return 0
        lines = Path(args.data).read_text(encoding="utf-8").splitlines()
        examples = [json.loads(line) for line in lines[:args.queries]]
        batches = []
        for start in range(0, len(examples), size):
            part = examples[start:start + size]
            # the grader's fields (utils/batch.py), written out: nothing of this repository is imported before the
            # submission's own packages, so that it imports as the grader imports it
            batch = {key: [e[key] for e in part] for key in ("interaction_id", "query", "search_results", "query_time")}
            started = time.perf_counter()
            answers = model.batch_generate_answer(batch)
            seconds = time.perf_counter() - started
            trace = getattr(model, "last_batch_trace", None) or []  # a CragSystem's: seconds of each stage
            pages = max((s["seconds"] for t in trace for s in t["stages"] if s["stage"] == "references"), default=None)
            batches.append({"size": len(part), "seconds": seconds, "pages_s": pages,
                            "answers": answers if isinstance(answers, list) else repr(answers)})
        report["batches"] = batches
        report["speed"] = measure_speed(model)
    except BaseException as err:
        report["run_error"] = f"{type(err).__name__}: {err}"
    print(json.dumps(report, default=str))
    return 0


def measure_speed(model: Any) -> dict[str, float] | None:
    """Prefill tokens per second and seconds per decode step of the model's LLM (a CragSystem's), or None."""
    llm = getattr(model, "llm", None)
    size = model.get_batch_size()
    if llm is None:
        return None
    from models.llm.backend import GenParams

    text = "The quick brown fox jumps over the lazy dog. " * 50  # about 500 tokens
    conversations = [[{"role": "user", "content": f"{text}\nRepeat the first sentence, word by word, many times."}]
                     for _ in range(size)]
    timings = []
    for tokens in (1, 9):
        started = time.perf_counter()
        llm.generate(conversations, GenParams(max_tokens=tokens, temperature=0.0))
        timings.append(time.perf_counter() - started)
    prompt_tokens = size * len(text) / 4
    return {"prefill_tps": prompt_tokens / max(timings[0], 1e-6), "step_s": max(timings[1] - timings[0], 0.0) / 8}


def run_probe(repo: Path, config_path: str, queries: int, data: Path, timeout_s: float) -> dict[str, Any]:
    env = {**os.environ, "CRAG_CONFIG": str(repo / config_path), "PYTHONPATH": str(repo)}
    command = [sys.executable, str(Path(__file__).resolve()), "--probe", "--queries", str(queries), "--data", str(data)]
    try:
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"run_error": f"no answer within {timeout_s:.0f} s (loading and the sample queries)"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"run_error": f"the child exited with {done.returncode}: {done.stderr.strip()[-500:]}"}
    return json.loads(lines[-1])


def model_checks(report: dict[str, Any], per_query_s: float) -> list[Check]:
    if "import_error" in report:
        return [Check("import UserModel", False, report["import_error"])]
    checks = [Check("import UserModel", True, f"built in {report.get('load_s', 0):.1f} s")]
    size = report.get("batch_size")
    valid = isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= MAX_BATCH_SIZE
    detail = f"get_batch_size() = {size!r}" + ("" if valid else f", not in 1..{MAX_BATCH_SIZE}")
    checks.append(Check("batch size", valid, detail))
    if "run_error" in report:
        return checks + [Check("sample queries", False, report["run_error"])]
    if not valid:
        return checks
    from utils.grader_tokens import GRADER_MAX_TOKENS, over_grader_limit

    problems, slowest = [], 0.0
    for batch in report.get("batches", []):
        answers, limit = batch["answers"], batch["size"] * per_query_s
        slowest = max(slowest, batch["seconds"] / batch["size"])
        if not isinstance(answers, list) or len(answers) != batch["size"]:
            problems.append(f"returned {answers!r} for {batch['size']} queries")
        elif not all(isinstance(a, str) for a in answers):
            problems.append("answers must be strings")
        elif any(over_grader_limit(a) for a in answers):
            problems.append(f"an answer is longer than the {GRADER_MAX_TOKENS} Llama-2 tokens the grader keeps")
        if batch["seconds"] > limit:
            problems.append(f"a batch of {batch['size']} took {batch['seconds']:.1f} s, over its {limit:.0f} s")
    detail = "; ".join(problems) or f"{len(report.get('batches', []))} batch(es), slowest {slowest:.1f} s/query"
    return checks + [Check("sample queries", not problems, detail)]


def format_table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    return "\n".join(f"{'FAIL' if not c.ok else 'WARN' if c.warn else 'PASS'}  {c.name:<{width}}  {c.detail}"
                     for c in checks)


@command
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the submission's folder")
    parser.add_argument("--config", default=None, help="config, relative to --repo (default: the Dockerfile's)")
    parser.add_argument("--cpu", action="store_true", help=f"check with {CPU_CONFIG} (the embedded default)")
    parser.add_argument("--queries", type=int, default=2, help="sample queries to run")
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "data" / "crag_sample.jsonl")
    parser.add_argument("--per-query-s", type=float, default=30.0, help="the grader's seconds per query")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="the longest the child may take")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        return probe(args)
    problem = argument_problem(args)
    if problem:
        raise ConfigError(problem)
    try:
        return check(args)
    except KeyboardInterrupt:
        return interrupted("no check finished; nothing was written")


def argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, in one line, or None (checked before any check runs)."""
    from evaluation.data import DataError, check_data_file

    if not args.repo.is_dir():
        return f"--repo {args.repo}: no such folder; give the submission's folder"
    if not args.cpu and not (args.config or dockerfile_config(args.repo.resolve())):
        return "name a config with --config (the Dockerfile sets no CRAG_CONFIG), or use --cpu"
    if args.queries < 1 or args.per_query_s <= 0 or args.timeout_s <= 0:
        return (f"--queries {args.queries}, --per-query-s {args.per_query_s}, --timeout-s {args.timeout_s}: "
                "each must be positive")
    if args.data.suffix != ".jsonl":
        return f"--data {args.data}: give a plain CRAG .jsonl file (the probe reads it as the grader's batches)"
    try:
        check_data_file(args.data, examples=True)
    except DataError as err:
        return str(err)
    return None


def check(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    repo = args.repo.resolve()
    config_path = CPU_CONFIG if args.cpu else (args.config or dockerfile_config(repo))
    with tqdm(total=4, desc="config: ", unit="check", disable=None, dynamic_ncols=True,
              bar_format="{desc}{n}/{total} checks [{elapsed}]", leave=False) as progress:
        config_check, weights_check, config = check_config(repo, config_path)
        progress.update(1)
        progress.set_description("aicrowd.json and requirements")
        checks = [check_aicrowd(repo, config.task if config else None), config_check, weights_check,
                  check_requirements(repo), check_image(repo), *(gpu_checks(repo, config) if config else [])]
        progress.update(1)
        if config is not None and weights_check.ok:
            progress.set_description(f"UserModel: loading it and answering {args.queries} sample queries (at most "
                                     f"{args.timeout_s:.0f} s)")
            progress.refresh()
            report = run_probe(repo, config_path, args.queries, args.data.resolve(), args.timeout_s)
            checks += model_checks(report, args.per_query_s)
            progress.update(1)
            progress.set_description("budget plan")
            if report.get("speed") and report.get("batch_size"):
                checks.append(budget_check(config, report))
        if config is not None and not args.cpu:
            progress.set_description("rehearsal on vLLM's CPU build (minutes)")
            progress.refresh()
            checks.append(check_rehearsal(repo, config_path, config, args.timeout_s))
        progress.n = progress.total
        progress.set_description("done")
    print(format_table(checks))
    return 0 if all(c.ok for c in checks) else 1


def check_rehearsal(repo: Path, config_path: str, config: Any, timeout_s: float) -> Check:
    """tools/rehearse.py over the sample with the config, the weights swapped for SmolLM2, in the rehearsal venv;
    skipped (said so) where that venv or the model folder is absent."""
    python, model = repo / REHEARSAL_PYTHON, repo / REHEARSAL_MODEL
    if not python.is_file() or not (model / "config.json").is_file():
        return Check("rehearsal", True, f"skipped: no {REHEARSAL_PYTHON} or {REHEARSAL_MODEL} (`make test-vllm` "
                     "builds both)", warn=True)
    out = repo / "runs" / "rehearsal"
    command = [str(python), str(repo / "tools" / "rehearse.py"), "--config", str(repo / config_path),
               "--cpu-model", str(model), "--out", str(out), *(["--serve-kg"] if config.task > 1 else [])]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    try:
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Check("rehearsal", False, f"no result within {timeout_s:.0f} s (--timeout-s)")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        return Check("rehearsal", False, (errors[0] if errors else done.stderr.strip()[-300:]) +
                     f" (exit {done.returncode}; {out})")
    summary = json.loads(lines[-1])
    return Check("rehearsal", True, f"{summary['answered']} of {summary['questions']} answered through "
                 f"{summary['backend']} on vLLM's CPU build in {summary['seconds']:.0f} s ({out}/summary.json)",
                 warn=summary["answered"] == 0)


def budget_check(config: Any, report: dict[str, Any]) -> Check:
    from tqdm import tqdm

    from models.budget_planner import Speed, format_plan, plan

    measured = [b["pages_s"] / b["size"] for b in report.get("batches") or [] if b.get("pages_s") is not None]
    pages_s = max(measured, default=1.0)
    speed = Speed(report["speed"]["prefill_tps"], max(report["speed"]["step_s"], 1e-4), pages_s)
    size = report["batch_size"]
    tqdm.write(format_plan(config, speed, size), file=sys.stderr)  # beside the progress bar
    result = plan(config, speed, size)
    # The plan counts every stage at its max_tokens: an upper bound. Over it, the deadline skips the optional
    # stages and cuts generation, so only the sample queries' own times can fail the check.
    detail = (f"{result.per_query_s:.1f} s/query at most at batch {size} (limit {result.limit_s / size:.1f})"
              + ("" if result.fits else ": optional stages will be skipped under load; see the table on stderr"))
    return Check("budget plan", True, detail, warn=not result.fits)


if __name__ == "__main__":
    sys.exit(main())
