"""The GPU plan of a config: the GPUs aicrowd.json asks for, the model folder's quantization against the config's, the
memory per T4, R2AG's prompt embeddings, and fine-tuned folders."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluation.submission import Check
from evaluation.submission.files import submission_model, submission_path, submission_profile
from models.llm.profile import engine_dtype
from models.stages.r2ag import R2AGSettings
from utils.model_folders import FolderError, check_folder, safetensors_header

# The grader's GPU: a T4 (16 GB board; nvidia-smi reports 15109 MiB with ECC on, as on AWS g4dn). An assumption:
# the ECC-off figure is 15360 MiB.
T4_BYTES = 15109 * 2**20
# vLLM 0.14.1's max_num_batched_tokens for vllm.LLM on a GPU under 70 GiB (vllm/engine/arg_utils.py, 8192): the
# most tokens one forward pass reads, which sets the activation peak.
VLLM_BATCHED_TOKENS = 8192
FIXED_MARGIN_BYTES = 2**30  # CUDA context, cuBLAS workspaces, NCCL buffers per GPU: assumed, not measured
CUDA_GRAPHS_BYTES = 2**29  # vLLM's captured CUDA graphs (none with enforce_eager): assumed, not measured
# What each kind of model folder accepts as the profile's quantization (None: vLLM reads quantization_config). A
# mismatch is refused at load (vllm/config/model.py _verify_quantization); GPTQ folders may also take the Marlin
# kernel by name.
QUANTIZATION_ACCEPTS = {
    "compressed-tensors": (None, "compressed-tensors"),  # tools/quantize.py (llm-compressor W4A16)
    "gptq": (None, "gptq", "gptq_marlin"),
    "awq": (None, "awq", "awq_marlin"),
    None: (None,),  # an unquantized folder
}
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


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
        groups: dict[str, Any] = quant.get("config_groups") or {}
        first: dict[str, Any] = next(iter(groups.values()), {})
        weights = first.get("weights") or {}
        return {"method": method, "bits": weights.get("num_bits"), "group_size": weights.get("group_size"),
                "symmetric": weights.get("symmetric", True), "ignore": quant.get("ignore", []),
                "format": quant.get("format")}
    if method:
        return {"method": method, "bits": quant.get("bits"), "group_size": quant.get("group_size"),
                "symmetric": quant.get("sym", True), "ignore": ["lm_head"], "format": quant.get("checkpoint_format")}
    return {"method": None, "bits": None, "group_size": None, "symmetric": True, "ignore": [], "format": None}



def check_model_folder(repo: Path, config: Any) -> Check | None:
    """The served folder's config.json read as the image's transformers 4.57 reads it: a RoPE written only in
    transformers 5's rope_parameters would be served with 4.57's default base (vllm backend only)."""
    if config.llm.backend != "vllm":
        return None
    model = submission_model(repo, config)
    folder = submission_path(repo, model)
    if not model or not (folder / "config.json").is_file():
        return None  # the quantization row says so
    try:
        check_folder(folder)
    except FolderError as err:
        return Check("model folder", False, str(err))
    return Check("model folder", True, f"{model}: the RoPE transformers 5 and 4.57 read agree")


def check_quantization(repo: Path, config: Any) -> Check | None:
    """The profile's quantization against the model folder's quantization_config (vllm backend only)."""
    if config.llm.backend != "vllm":
        return None
    model = submission_model(repo, config)
    key = f"{config.llm.profile} quantization"
    data = model_config(submission_path(repo, model)) if model else None
    if data is None:
        return Check("quantization", True, f"{model or config.llm.profile}: no config.json, not checked (see "
                                           "weights)", warn=True)
    quant = folder_quantization(data)
    method, chosen = quant["method"], submission_profile(repo, config).quantization
    accepted = QUANTIZATION_ACCEPTS.get(method, (None, method))
    what = ("unquantized" if method is None else
            f"{method} {quant['format'] or ''} {quant['bits']}-bit, group {quant['group_size']}".replace("  ", " "))
    if chosen not in accepted:
        fix = " or ".join("null" if a is None else a for a in accepted)
        return Check("quantization", False, f"{key} is {chosen!r} but {model} is {what}: "
                                            f"set it to {fix} (vLLM refuses the mismatch at load)")
    return Check("quantization", True, f"{model}: {what}; {key} "
                                       f"{'null (read from the folder)' if chosen is None else chosen}")



def safetensors_bytes(folder: Path) -> int | None:
    """The tensor bytes the folder's *.safetensors declare (their headers' data offsets), or None without any or
    where one does not read as safetensors (the plan then estimates from config.json)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with file.open("rb") as handle:
            read = safetensors_header(handle, file.stat().st_size)
        if read is None:
            return None
        total += sum(end - start for entry in read[0].values() for start, end in [entry["data_offsets"]])
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
    settings, profile = config.llm.vllm, submission_profile(repo, config)
    model = submission_model(repo, config)
    folder = submission_path(repo, model)
    data = model_config(folder) if model else None
    if data is None:
        return f"{model or config.llm.profile}: no config.json to plan from"
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")
    if any(not isinstance(data.get(k), int) for k in keys):
        return f"{model}/config.json lacks {', '.join(k for k in keys if not isinstance(data.get(k), int))}"
    tp = settings.tensor_parallel_size
    declared = safetensors_bytes(folder)
    total: float
    if declared is not None:
        total, source = declared, "the folder's safetensors"
    else:
        total, source = estimated_weight_bytes(data, folder_quantization(data)), "config.json x bits"
    heads = data["num_attention_heads"]
    head_dim = data.get("head_dim") or data["hidden_size"] // heads
    kv_heads = data.get("num_key_value_heads") or heads
    wide = DTYPE_BYTES.get(engine_dtype(profile, settings), DTYPE_BYTES.get(str(data.get("torch_dtype")), 2))
    kv_bytes = 1 if settings.kv_cache_dtype.startswith("fp8") else wide
    kv_per_token = 2 * data["num_hidden_layers"] * max(1, kv_heads // tp) * head_dim * kv_bytes
    activations = VLLM_BATCHED_TOKENS * (4 * data["hidden_size"] + 2 * data["intermediate_size"] / tp) * wide
    margin = FIXED_MARGIN_BYTES + (0 if settings.enforce_eager else CUDA_GRAPHS_BYTES) + activations
    return MemoryPlan(total / tp, source, kv_per_token, margin, T4_BYTES * settings.gpu_memory_utilization,
                      config.batch_size, profile.max_model_len)



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
    r2ag = config.section("r2ag", R2AGSettings)
    return r2ag.enabled and r2ag.mode == "prompt" and "r2ag" in stages and "reasoning" in stages



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
    data = model_config(submission_path(repo, submission_model(repo, config))) or {}
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
    settings, model = config.llm.vllm, submission_model(repo, config)
    merged = submission_path(repo, model) / "merged_from.json"
    if settings.lora:
        adapter = submission_path(repo, settings.lora)
        try:
            rank = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))["r"]
        except (OSError, ValueError, KeyError, TypeError):
            return Check("fine-tuned", False, f"llm.vllm.lora {settings.lora}: no adapter_config.json with a rank; "
                                              "give the adapter/ folder of `tools/train_llm.py train`")
        if not any(adapter.glob("adapter_model.*")):
            return Check("fine-tuned", False, f"llm.vllm.lora {settings.lora}: no adapter_model.safetensors")
        method = folder_quantization(model_config(submission_path(repo, model)) or {})["method"]
        if method is not None:
            return Check("fine-tuned", True, f"LoRA rank {rank} on a {method} base: merge it into the fp16 base and "
                                             "quantize the merged folder instead (docs/how-to/fine-tune.md)", warn=True)
        return Check("fine-tuned", True, f"LoRA adapter {settings.lora}, rank {rank}, applied by the engine")
    if merged.is_file():
        origin = json.loads(merged.read_text(encoding="utf-8"))
        return Check("fine-tuned", True, f"{model}: merged from base {origin['base_weights_sha256'][:12]} "
                                         f"and adapter {origin['adapter_weights_sha256'][:12]}")
    return None



def gpu_checks(repo: Path, config: Any) -> list[Check]:
    """The checks of a GPU submission that need the config (those that do not apply are left out)."""
    checks = [check_gpus(repo, config), check_model_folder(repo, config), check_quantization(repo, config),
              check_memory(repo, config), check_prompt_embeds(repo, config), check_finetuned(repo, config)]
    return [c for c in checks if c is not None]

