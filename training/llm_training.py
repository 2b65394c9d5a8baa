"""Fine-tuning the answering model on judged runs (docs/decisions/fine-tuning.md): TRL's SFT and DPO trainers with a
PEFT LoRA adapter (or full fine-tuning), then the adapter merged into a plain model folder that transformers 4.x (the
image's) and the pinned vLLM load.

The SFT rows are TRL's conversational prompt-completion form (training/judged_data.py), so the loss falls on the
completion's tokens only. Rows longer than `max_length` are dropped, never truncated: a cut row would train on a
prompt without its answer. Training is seeded; a run resumes from its latest checkpoint
(`resume`); bfloat16 autocast is used where the device has it (`bf16: null`). Every run writes
`training_manifest.json`: the base model's weights hash, the data manifest, the settings, library versions, the
loss curve and the token rate.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from loguru import logger

from utils.errors import ConfigError
from utils.hardware import bf16_supported
from utils.model_folders import portable_folder, weights_hash

METHODS = ("sft", "dpo")
ADAPTER, CHECKPOINTS, MANIFEST = "adapter", "checkpoints", "training_manifest.json"
VERSIONS = ("torch", "transformers", "trl", "peft", "datasets", "accelerate")
ROW_KEYS = {"sft": ("prompt", "completion"), "dpo": ("prompt", "chosen", "rejected")}


@dataclass(frozen=True)
class TrainSettings:
    """What a training run is given; every field is recorded in its manifest."""

    method: str = "sft"
    lora_rank: int = 16           # 0: full fine-tuning, no adapter
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    learning_rate: float = 2e-4
    epochs: float = 1.0
    max_steps: int = -1           # > 0 overrides epochs
    batch_size: int = 4
    grad_accum: int = 1
    max_length: int = 2048        # rows longer than this many tokens are dropped
    warmup_ratio: float = 0.05    # of the steps (transformers takes a float below 1 as a ratio)
    seed: int = 0
    bf16: bool | None = None      # None: bfloat16 autocast where the device supports it
    save_steps: int = 50
    beta: float = 0.1             # DPO's KL strength
    group_by_length: bool = True  # SFT: batches of rows of like lengths

    def check(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r}: choose one of {', '.join(METHODS)}")
        if self.lora_rank < 0 or self.batch_size < 1 or self.grad_accum < 1 or self.max_length < 16:
            raise ValueError("lora_rank >= 0, batch_size >= 1, grad_accum >= 1 and max_length >= 16")


def fitting_rows(rows: list[dict[str, Any]], tokenizer: Any, method: str, max_length: int
                 ) -> tuple[list[dict[str, Any]], int, int]:
    """(the rows whose prompt and longest answer fit `max_length` tokens, rows dropped, tokens in the kept rows) with
    only the columns the trainer reads."""
    kept, dropped, total = [], 0, 0
    for row in rows:
        prompt_ids = tokenizer.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True,
                                                   return_dict=False)
        answers = [row[k][0]["content"] for k in ROW_KEYS[method][1:]]
        length = len(prompt_ids) + max(len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers) + 2
        if length > max_length:
            dropped += 1
            continue
        total += length
        kept.append({k: row[k] for k in ROW_KEYS[method]})
    return kept, dropped, total


def versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in VERSIONS}


def train(model_dir: Path, rows: list[dict[str, Any]], out: Path, settings: TrainSettings, resume: bool = False,
          data_manifest: dict[str, Any] | None = None, device: str | None = None,
          callbacks: list[Any] | None = None) -> dict[str, Any]:
    """Train on `rows` from the model folder `model_dir` into `out` (checkpoints/, adapter/ or, with lora_rank 0,
    model/, and training_manifest.json); returns the manifest. `resume` continues from the latest checkpoint;
    `callbacks` are transformers TrainerCallbacks."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    settings.check()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = bf16_supported(device) if settings.bf16 is None else settings.bf16
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    kept, dropped, tokens = fitting_rows(rows, tokenizer, settings.method, settings.max_length)
    if not kept:
        raise ConfigError(f"no training row fits max_length {settings.max_length} ({dropped} dropped): "
                          + ("give training rows" if not dropped else "raise --max-length"))
    if dropped:
        logger.warning("{} of {} rows are longer than {} tokens and are left out", dropped, len(rows),
                       settings.max_length)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_config = None if settings.lora_rank == 0 else LoraConfig(
        r=settings.lora_rank, lora_alpha=settings.lora_alpha, lora_dropout=settings.lora_dropout,
        target_modules="all-linear", task_type="CAUSAL_LM")
    common: dict[str, Any] = dict(output_dir=str(out / CHECKPOINTS), per_device_train_batch_size=settings.batch_size,
                                  gradient_accumulation_steps=settings.grad_accum,
                                  learning_rate=settings.learning_rate, num_train_epochs=settings.epochs,
                                  max_steps=settings.max_steps, warmup_steps=settings.warmup_ratio,
                                  seed=settings.seed, data_seed=settings.seed, bf16=bf16, use_cpu=device == "cpu",
                                  save_strategy="steps", save_steps=settings.save_steps, save_total_limit=2,
                                  logging_steps=1, report_to=[], max_length=settings.max_length,
                                  dataloader_num_workers=0)
    dataset = Dataset.from_list(kept)
    trainer: SFTTrainer | DPOTrainer
    if settings.method == "sft":
        # Batches of like lengths: prompts run from 200 to 2,000 tokens, and padding to the longest wastes the rest.
        sampling = "group_by_length" if settings.group_by_length else "random"
        trainer = SFTTrainer(model=model, args=SFTConfig(**common, completion_only_loss=True,
                                                         train_sampling_strategy=sampling), train_dataset=dataset,
                             processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)
    else:
        trainer = DPOTrainer(model=model, args=DPOConfig(**common, beta=settings.beta), train_dataset=dataset,
                             processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)
    started = time.perf_counter()
    checkpoint = resume and any((out / CHECKPOINTS).glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=True if checkpoint else None)
    seconds = time.perf_counter() - started
    saved = out / (ADAPTER if peft_config else "model")
    trained: Any = trainer.model  # a PeftModel, or the whole model with lora_rank 0; Trainer types it nn.Module
    trained.save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    portable_folder(saved)  # a full fine-tune's config.json too; an adapter has none
    losses = [{"step": e["step"], "loss": e["loss"]} for e in trainer.state.log_history if "loss" in e]
    epochs_run = trainer.state.epoch or 0.0
    manifest = {"base_model": str(model_dir), "base_weights_sha256": weights_hash(model_dir),
                "output": str(saved), "output_weights_sha256": weights_hash(saved),
                "settings": dataclasses.asdict(settings), "device": device, "bf16": bf16,
                "rows": len(kept), "rows_dropped_too_long": dropped, "tokens_per_epoch": tokens,
                "steps": trainer.state.global_step, "epochs": epochs_run, "resumed": bool(checkpoint),
                "seconds": round(seconds, 1),
                "tokens_per_second": round(tokens * epochs_run / seconds, 1) if seconds > 0 else None,
                "loss": losses, "data": data_manifest, "versions": versions()}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def merge(base: Path, adapter: Path, out: Path, dtype: str = "float32") -> Path:
    """The base folder with the adapter merged in, saved as a plain model folder at `out` that transformers 4 reads
    as the same model (utils/model_folders.py), built beside it and renamed into place."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    merged.to(getattr(torch, dtype)).save_pretrained(staging)
    AutoTokenizer.from_pretrained(adapter).save_pretrained(staging)
    portable_folder(staging)
    for name in ("generation_config.json",):  # what the base carries beyond the weights and the tokenizer
        if (base / name).is_file() and not (staging / name).is_file():
            shutil.copy2(base / name, staging / name)
    (staging / "merged_from.json").write_text(json.dumps(
        {"base": str(base), "base_weights_sha256": weights_hash(base), "adapter": str(adapter),
         "adapter_weights_sha256": weights_hash(adapter)}, indent=2) + "\n", encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out


def probe(model_dir: Path, rows: list[dict[str, Any]], max_new_tokens: int = 48) -> dict[str, Counter]:
    """A quick look before a cross-fit: each SFT row's prompt answered greedily by the model folder (transformers,
    float32), its answer read as the serving stage reads it, and counted by the row's kind as `target` (the
    target's answer, or "i don't know" where that was the target), `idk` (declined where an answer was due),
    `other`. Rows of held-out folds only: a trained row says nothing."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.stages.reasoning import first_line, parse_structured
    from utils.answers import is_idk, normalize_text

    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)  # its annotations cover no chat template's tensors
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    found: dict[str, Counter] = {}
    for row in rows:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt",
                                            return_dict=False)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        wanted = row["completion"][0]["content"]
        if row["prompt_name"] == "reasoning":
            parsed, target = parse_structured(text), parse_structured(wanted)
            got, wanted = (parsed.answer if parsed else ""), (target.answer if target else "")
        else:
            got = first_line(text)
        same = (is_idk(got) and is_idk(wanted)) or (
            bool(got) and not is_idk(wanted) and normalize_text(wanted) in normalize_text(got))
        outcome = "target" if same else "idk" if is_idk(got) else "other"
        found.setdefault(row["kind"], Counter())[outcome] += 1
    return found


def merged_profile(merged: Path) -> Path:
    """The profile a merged folder is run under (FOLDER.yaml beside it): the default profile's settings, its
    weights."""
    from models.llm.profile import load_profile, write_profile

    return write_profile(merged.with_name(merged.name + ".yaml"), load_profile(), merged)
