"""Model folders that both transformers 5 (the project's .venv) and transformers 4 (the submission's, as the pinned
vLLM requires `transformers<5`) can load.

Standard library only: tools/quantize.py calls it from .venv-quantize, which does not install the project.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

TOKENIZER_CONFIG = "tokenizer_config.json"
# Tokenizer classes transformers 5 writes that transformers 4 lacks, and the class both know for the same files:
# in transformers 5 PreTrainedTokenizerFast is an alias of TokenizersBackend (tokenization_utils_tokenizers.py); in
# 4.x it is the generic tokenizer.json class.
PORTABLE_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def portable_tokenizer(folder: str | Path) -> str | None:
    """Rewrites `folder`'s tokenizer_config.json in place when its tokenizer_class is one only transformers 5 knows;
    returns the class it replaced (None when the file is absent or already portable). Written atomically."""
    path = Path(folder) / TOKENIZER_CONFIG
    if not path.is_file():
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    old = config.get("tokenizer_class")
    if old not in PORTABLE_CLASSES:
        return None
    config["tokenizer_class"] = PORTABLE_CLASSES[old]
    handle, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(config, out, indent=2, ensure_ascii=False)
        out.write("\n")
    os.chmod(staging, path.stat().st_mode & 0o777)
    os.replace(staging, path)
    return old


# The files that hold a model's or an adapter's weights and shape; tokenizer and generation files do not change what
# the weights compute.
WEIGHT_FILES = ("config.json", "adapter_config.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")


def weights_hash(folder: str | Path) -> str:
    """sha256 over the names and contents of `folder`'s weight files (config.json, adapter_config.json and every
    .safetensors, .bin or .gguf), sorted by name: what a gate or a training manifest names the weights by."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.is_file() and (p.name in WEIGHT_FILES
                                                                    or p.suffix in WEIGHT_SUFFIXES))
    if not files:
        raise FileNotFoundError(f"{folder}: no weight files (config.json, *.safetensors)")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode("utf-8") + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
