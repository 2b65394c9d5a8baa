"""Tiny random configs of the model families a competitor serves (Llama 3.1, Qwen2.5, Qwen3, Mistral, Gemma 2,
Gemma 3 text, Gemma 3 1B, Gemma 3 multimodal), each with its real RoPE layout, saved by transformers 5 as
`save_pretrained` writes them: RoPE only in `rope_parameters`.

tests/unit builds them in .venv; `make test-vllm` writes them first (`python -m tests.model_families OUT
[--tokenizer FOLDER]`, .venv's transformers 5) and tests/vllm reads them with the image's transformers 4.57 and
vLLM. With --tokenizer, the Llama 3.1 folder also gets random weights of that tokenizer's vocabulary and its
tokenizer files, so that tools/quantize.py can quantize it.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

SMALL = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
# name: (config class in transformers, its keywords). The RoPE of each is the family's published one.
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3.1": ("LlamaConfig", {**SMALL, "max_position_embeddings": 131072, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
    "qwen2.5": ("Qwen2Config", {**SMALL, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 1024}}),
    "qwen3": ("Qwen3Config", {**SMALL, "head_dim": 32, "rope_parameters": {"rope_type": "default",
                                                                           "rope_theta": 1000000.0}}),
    "mistral": ("MistralConfig", {**SMALL, "sliding_window": None,
                                  "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    # Gemma 2's published base is transformers 4's default, which would hide a lost one: twice it here.
    "gemma2": ("Gemma2Config", {**SMALL, "head_dim": 16, "rope_parameters": {"rope_type": "default",
                                                                             "rope_theta": 20000.0}}),
    "gemma3": ("Gemma3TextConfig", {**SMALL, "head_dim": 16, "rope_parameters": GEMMA3_ROPE}),
    "gemma3-1b": ("Gemma3TextConfig", {**SMALL, "head_dim": 16, "rope_parameters": {
        **GEMMA3_ROPE, "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}}),
    "gemma3-mm": ("Gemma3Config", {
        "text_config": {**SMALL, "head_dim": 16, "rope_parameters": GEMMA3_ROPE},
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "image_size": 28, "patch_size": 14}}),
}
QUANTIZABLE = "llama3.1"  # the family tools/quantize.py is run on in `make test-vllm`
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def config_of(name: str) -> Any:
    import transformers

    class_name, keywords = FAMILIES[name]
    return getattr(transformers, class_name)(**keywords)


def write(out: Path, name: str, tokenizer: Path | None = None) -> Path:
    """Folder `out/name` with the family's config.json as transformers 5 saves it; with `tokenizer`, random weights
    of that tokenizer's vocabulary and its files too."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    config = config_of(name)
    if tokenizer is None:
        config.save_pretrained(folder)
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config.vocab_size = len(AutoTokenizer.from_pretrained(tokenizer))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for file in TOKENIZER_FILES:
        if (tokenizer / file).is_file():
            shutil.copy2(tokenizer / file, folder / file)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", type=Path, default=None, help=f"gives {QUANTIZABLE} weights and a tokenizer")
    args = parser.parse_args()
    for name in FAMILIES:
        print(write(args.out, name, args.tokenizer if name == QUANTIZABLE else None))


if __name__ == "__main__":
    main()
