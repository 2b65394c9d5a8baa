"""Model folders that both transformers 5 (the project's .venv) and transformers 4 (the submission's, as the pinned
vLLM requires `transformers<5`) load as the same model.

transformers 5 writes a model's RoPE only as `rope_parameters` in config.json; transformers 4.57 reads `rope_theta`,
`rope_scaling` (and Gemma 3's `rope_local_base_freq`) and takes its class defaults where they are missing, so a
folder written by 5 is served by vLLM with the wrong RoPE base and no scaling (docs/decisions/model-folders.md).
`portable_folder` writes the keys 4.57 reads beside 5's; `rope_mismatches` is the rule that refuses a folder where
they disagree, applied where a folder meets an engine.

Standard library only: tools/quantize.py calls it from .venv-quantize, which does not install the project.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from utils.errors import HarnessError

TOKENIZER_CONFIG = "tokenizer_config.json"
# Tokenizer classes transformers 5 writes that transformers 4 lacks, and the class both know for the same files:
# in transformers 5 PreTrainedTokenizerFast is an alias of TokenizersBackend (tokenization_utils_tokenizers.py); in
# 4.x it is the generic tokenizer.json class.
PORTABLE_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


CONFIG = "config.json"
# rope_parameters' layer types (transformers 5, Gemma 3): the global layers' RoPE is 4.57's rope_theta and
# rope_scaling, the local (sliding-window) layers' base is its rope_local_base_freq.
FULL, SLIDING = "full_attention", "sliding_attention"
# Keys transformers 5 keeps inside rope_parameters that 4.57 reads at the top level, beside rope_scaling.
TOP_LEVEL_ROPE_KEYS = ("rope_theta", "partial_rotary_factor")


class FolderError(HarnessError, ValueError):
    """A model folder an engine would read as another model; the message names the key, both values and the fix."""


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Written beside `path` and renamed over it, keeping its mode."""
    handle, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2, ensure_ascii=False)
        out.write("\n")
    os.chmod(staging, path.stat().st_mode & 0o777)
    os.replace(staging, path)


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
    _write_json(path, config)
    return old


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a config.json that holds the language model's keys: `text_config` for a multimodal model (Gemma 3
    4B and up), else the config itself."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _legacy_of(params: dict[str, Any]) -> dict[str, Any]:
    """One rope_parameters entry as transformers 4.57's keys: rope_theta (and partial_rotary_factor) at the top,
    the rest as rope_scaling, null for the default RoPE."""
    legacy = {key: params[key] for key in TOP_LEVEL_ROPE_KEYS if key in params}
    scaling = {key: value for key, value in params.items() if key not in TOP_LEVEL_ROPE_KEYS}
    legacy["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    return legacy


def _nested(params: dict[str, Any]) -> bool:
    return FULL in params or SLIDING in params


def legacy_rope(config: dict[str, Any]) -> dict[str, Any]:
    """The top-level keys transformers 4.57 reads for the RoPE a config.json's `rope_parameters` (transformers 5)
    holds; {} when it holds none (a folder written by transformers 4, whose keys are already those)."""
    params = _text_config(config).get("rope_parameters")
    if not isinstance(params, dict):
        return {}
    if _nested(params):
        legacy = _legacy_of(params.get(FULL) or {})
        # The nested rope_parameters stay in the folder for transformers 5, and vLLM takes them in place of a null
        # rope_scaling, which it cannot read under 4.57 (patch_rope_parameters: "should have a 'rope_type' key").
        legacy["rope_scaling"] = legacy["rope_scaling"] or {"rope_type": "default"}
        if "rope_theta" in (params.get(SLIDING) or {}):
            legacy["rope_local_base_freq"] = params[SLIDING]["rope_theta"]
        return legacy
    return _legacy_of(params)


class _Missing:
    def __repr__(self) -> str:
        return "missing (transformers 4 takes its default)"


MISSING: Any = _Missing()


def _same(key: str, written: Any, read: Any, nested: bool) -> bool:
    if key == "rope_scaling":  # 4.57 takes the older spelling `type` for `rope_type`, and no scaling as default
        def plain(value: Any) -> Any:
            if not isinstance(value, dict):
                return value
            value = {("rope_type" if k == "type" else k): v for k, v in value.items()}
            return None if value.get("rope_type", "default") == "default" and not nested else value
        return plain(written) == plain(read)
    if isinstance(written, (int, float)) and isinstance(read, (int, float)):
        return float(written) == float(read)
    return bool(written == read)


def rope_mismatches(config: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, what rope_parameters says, what transformers 4.57 reads at the top level: MISSING where absent, so that
    it takes its class default) for each RoPE key of a config.json on which the two stacks disagree."""
    text = _text_config(config)
    nested = _nested(text.get("rope_parameters") or {})
    found = []
    for key, value in legacy_rope(config).items():
        read = text.get(key, None if key == "rope_scaling" else MISSING)  # 4.57's rope_scaling defaults to none
        if not _same(key, value, read, nested):
            found.append((key, value, read))
    return found


# Keys beside the RoPE that change a forward pass, compared where they are in config.json.
FORWARD_KEYS = ("sliding_window", "head_dim", "max_position_embeddings", "tie_word_embeddings")


def _rope_entry(params: dict[str, Any]) -> dict[str, Any]:
    entry = {("rope_type" if key == "type" else key): (float(value) if isinstance(value, int) and
                                                     not isinstance(value, bool) else value)
             for key, value in params.items()}
    entry.setdefault("rope_type", "default")
    return entry


def rope_by_layer(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The RoPE of each attention type as a model reads it, from a config.json (either stack's keys;
    rope_parameters first, as transformers 5 reads) or an engine's config as a dict (vLLM's patched
    rope_parameters, with 4.57's rope_local_base_freq for Gemma 3's sliding layers)."""
    text = _text_config(config)
    params = text.get("rope_parameters")
    if not isinstance(params, dict) or not params:
        params = {**(text.get("rope_scaling") or {}),
                  **{key: text[key] for key in TOP_LEVEL_ROPE_KEYS if key in text}}
    if _nested(params):
        return {kind: _rope_entry(params[kind]) for kind in (FULL, SLIDING) if isinstance(params.get(kind), dict)}
    layers = {FULL: _rope_entry(params)}
    if "rope_local_base_freq" in text:
        layers[SLIDING] = {"rope_type": "default", "rope_theta": float(text["rope_local_base_freq"])}
    return layers


def forward_mismatches(folder_config: dict[str, Any], engine_config: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, the folder's value, the engine's) for each field that changes a forward pass on which an engine's
    config (vLLM's get_config, as a dict) departs from the folder's config.json: the RoPE of each attention type,
    and FORWARD_KEYS, where config.json states them."""
    found: list[tuple[str, Any, Any]] = []
    folder_rope, engine_rope = rope_by_layer(folder_config), rope_by_layer(engine_config)
    for kind, written in sorted(folder_rope.items()):
        read = engine_rope.get(kind, {})
        for key in sorted(written):  # what the folder leaves out, both stacks take from the same class defaults
            if written[key] != read.get(key, MISSING):
                found.append((f"{key} ({kind})", written[key], read.get(key, MISSING)))
    text, engine = _text_config(folder_config), _text_config(engine_config)
    for key in FORWARD_KEYS:
        if key in text and text[key] != engine.get(key, MISSING):
            found.append((key, text[key], engine.get(key, MISSING)))
    return found


def portable_config(folder: str | Path) -> list[str]:
    """Writes into `folder`'s config.json the top-level RoPE keys transformers 4.57 reads, from the rope_parameters
    transformers 5 wrote (which 5 goes on reading first); returns the keys it changed ([] when the folder has no
    config.json or already agrees). Written atomically."""
    path = Path(folder) / CONFIG
    if not path.is_file():
        return []
    config = json.loads(path.read_text(encoding="utf-8"))
    changed = [key for key, _, _ in rope_mismatches(config)]
    if changed:
        _text_config(config).update(legacy_rope(config))
        _write_json(path, config)
    return changed


def portable_folder(folder: str | Path) -> list[str]:
    """Makes a folder the project wrote (or converted) load as the same model in transformers 5 and in the
    submission's transformers 4.57: the tokenizer class and the RoPE keys. Returns what it changed, for a log line."""
    changed = [f"config.json {key}" for key in portable_config(folder)]
    old = portable_tokenizer(folder)
    if old is not None:
        changed.append(f"{TOKENIZER_CONFIG} tokenizer_class {old}")
    return changed


def check_folder(folder: str | Path) -> None:
    """Raises FolderError when `folder`'s config.json gives transformers 4.57 (and so the engine) another RoPE than
    transformers 5 reads; the first disagreement is named with both values and the fix. A folder without a readable
    config.json is left to the engine's own error."""
    path = Path(folder) / CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(config, dict):
        return
    found = rope_mismatches(config)
    if found:
        key, written, read = found[0]
        more = f" ({len(found) - 1} more RoPE key(s) disagree)" if len(found) > 1 else ""
        raise FolderError(
            f"{path}: {key} is {written!r} in rope_parameters (transformers 5) but {read!r} at the top level, where "
            f"the engine's transformers 4.57 reads it{more}; write the keys with "
            f"`python tools/model_folder.py portable --model {folder}`")


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


# The longest header the safetensors library reads (safetensors/src/tensor.rs MAX_HEADER_SIZE).
SAFETENSORS_HEADER_MAX = 100_000_000


def safetensors_header(handle: BinaryIO, size: int) -> tuple[dict[str, Any], int] | None:
    """A safetensors file's tensors (name -> dtype, shape, data_offsets; "__metadata__" left out) and the offset
    where their bytes start, read from the start of `handle` (a file of `size` bytes); None where it does not read
    as safetensors."""
    handle.seek(0)
    head = handle.read(8)
    if len(head) < 8:
        return None
    length = int.from_bytes(head, "little")
    if not 0 < length <= min(size - 8, SAFETENSORS_HEADER_MAX):
        return None
    try:
        header = json.loads(handle.read(length))
    except ValueError:
        return None
    if not isinstance(header, dict):
        return None
    return {name: entry for name, entry in header.items() if name != "__metadata__"}, 8 + length
