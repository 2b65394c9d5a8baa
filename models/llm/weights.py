"""Which weights a config's LLM runs, named by content, without loading a model framework: the model profile's
(models/llm/profile.py: the embedded default's GGUF, converted once to an HF folder by models/llm/hf.py) and the
folders and adapters a config names. A gate (models/gate/answer_gate.py) and a run folder's manifest
(evaluation/manifest.py) record these hashes, so that neither is taken for other weights served under the same
name."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from models.config import resolve_path
from models.llm.backend import BackendUnavailable
from models.llm.profile import load_profile
from utils.model_folders import weights_hash

# The embedded converter's output format, in its folder's cache key and in the weights' record: a folder written by
# an older converter is converted again, and what was fit or run on it is not taken for the new one.
FOLDER_FORMAT = "v3"  # v3: RoPE keys transformers 4 reads (v2: its tokenizer class; utils/model_folders.py)


# Digests already taken in this process, by path and the files' sizes and modification times: a run hashes its
# weights for the manifest and again where the gate is checked, and a folder can be tens of GB.
_DIGESTS: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def _signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    return tuple((p.name, (stat := p.stat()).st_size, stat.st_mtime_ns) for p in files)


def content_hash(name: str | Path) -> str:
    """sha256 of a model folder's weight files (utils/model_folders.py weights_hash) or of a file (a .gguf);
    "missing: NAME" when there is neither."""
    path = resolve_path(str(name))
    if not path.exists():
        return f"missing: {name}"
    key = (str(path), _signature(path))
    if key not in _DIGESTS:
        if path.is_dir():
            _DIGESTS[key] = weights_hash(path)
        else:
            with path.open("rb") as handle:
                _DIGESTS[key] = hashlib.file_digest(handle, "sha256").hexdigest()
    return _DIGESTS[key]


def weights_of(llm: dict[str, Any]) -> dict[str, Any]:
    """The content hashes of the weights an `llm` config section (as plain JSON) runs: `weights` for what the hf
    backend loads and --serve-llm serves to the openai backend (llm.hf.model; when null, the model profile's
    weights), `converter` the format of the folder a .gguf becomes, `profile` the profile's settings that change
    answers, and `lora` for llm.vllm.lora. The vllm backend's own folder is not hashed: a 4-bit 70B is tens of GB,
    read at every start."""
    found: dict[str, Any] = {}
    backend = llm.get("backend")
    if backend in ("hf", "openai"):
        profile = load_profile(llm.get("profile"))
        folder = (llm.get("hf") or {}).get("model")
        try:
            path = resolve_path(folder) if folder else profile.weights_path()
            found["weights"] = content_hash(path)
        except BackendUnavailable as err:
            path, found["weights"] = None, f"missing: {err}"
        if path is None or path.suffix == ".gguf":
            found["converter"] = FOLDER_FORMAT
        found["profile"] = profile.settings()
    adapter = (llm.get("vllm") or {}).get("lora")
    if backend == "vllm" and adapter:
        found["lora"] = content_hash(adapter)
    return found
