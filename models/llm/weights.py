"""Which weights a config's LLM runs, named by a fingerprint of their content, without loading a model framework:
the profile's folder or file (models/llm/profile.py; the embedded default's GGUF, converted once to an HF folder by
models/llm/hf.py) and a LoRA adapter. A gate (models/gate/answer_gate.py) and a run folder's manifest
(evaluation/manifest.py) record it, so that neither is taken for other weights at the same path or served under the
same name. Where the weights are on a server's machine, the record holds what the server reports instead, never a
hash of weights this machine did not read. What the fingerprint reads, and why:
docs/decisions/weights-fingerprint.md."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, BinaryIO

from models.config import resolve_path
from models.llm.backend import BackendUnavailable
from models.llm.profile import ModelProfile, load_profile
from utils.model_folders import safetensors_header

# The embedded converter's output format, in its folder's cache key and in the weights' record: a folder written by
# an older converter is converted again, and what was fit or run on it is not taken for the new one.
FOLDER_FORMAT = "v3"  # v3: RoPE keys transformers 4 reads (v2: its tokenizer class; utils/model_folders.py)

FINGERPRINT = "sampled-v1"  # the recipe below; a record of another recipe is another fingerprint
WHOLE_BYTES = 64 << 20  # a file at most this long is read whole: configs, tokenizers, a small model
WINDOW = 4096  # bytes read at each sampled place
PLACES = 5  # sampled places inside each tensor (its start, quarters and end), or across a file of another format
FILE_PLACES = 256  # sampled places across a large file that is not safetensors (a .gguf, a .bin)


def _windows(start: int, end: int, places: int) -> list[tuple[int, int]]:
    """`places` windows of WINDOW bytes spread over [start, end), first and last included; the whole range when
    that is no longer."""
    if end - start <= places * WINDOW:
        return [(start, end)]
    step = (end - start - WINDOW) / (places - 1)
    return [(start + round(k * step), start + round(k * step) + WINDOW) for k in range(places)]


def _safetensors_windows(handle: BinaryIO, size: int) -> list[tuple[int, int]] | None:
    """The header whole, and PLACES windows inside each tensor's bytes (by the header's data_offsets); None when the
    file does not read as safetensors."""
    read = safetensors_header(handle, size)
    if read is None:
        return None
    tensors, base = read
    windows = [(0, base)]
    for name in sorted(tensors):
        begin, end = tensors[name].get("data_offsets", (0, 0))
        windows.extend(_windows(base + begin, base + end, PLACES))
    return windows


def _file_digest(path: Path, whole_bytes: int, counter: list[int]) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as handle:
        if size <= whole_bytes:
            windows = [(0, size)]
        elif path.suffix == ".safetensors":
            windows = _safetensors_windows(handle, size) or _windows(0, size, FILE_PLACES)
        else:
            windows = _windows(0, size, FILE_PLACES)
        for start, end in windows:
            handle.seek(start)
            block = handle.read(end - start)
            counter[0] += len(block)
            digest.update(block)
    return digest.hexdigest()


def fingerprint_files(path: Path) -> list[Path]:
    """What a fingerprint reads of `path`: the file, or a folder's top-level files (not its notes: *.md, dotfiles),
    which are what vLLM and transformers load."""
    if not path.is_dir():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".") and p.suffix != ".md")


def fingerprint(path: str | Path, whole_bytes: int = WHOLE_BYTES) -> tuple[str, int]:
    """The fingerprint of a model folder or file, and the bytes it read: every small file whole, and of each large
    safetensors file its header and PLACES windows inside every tensor (located through the header), so that two
    folders differing in one tensor, or a merged fine-tune and its base, differ, at a read of tens of MB for a 40 GB
    folder."""
    path = Path(path)
    counter = [0]
    digest = hashlib.sha256(FINGERPRINT.encode())
    for file in fingerprint_files(path):
        digest.update(_file_digest(file, whole_bytes, counter).encode())
    return f"{FINGERPRINT}:{digest.hexdigest()}", counter[0]


# Fingerprints already taken in this process, by path and the files' sizes and modification times: a run names its
# weights for the manifest and again where the gate is checked.
_TAKEN: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def content_fingerprint(name: str | Path) -> str:
    """The fingerprint of the folder or file `name`, taken once per process for unchanged files; "missing: NAME"
    where there is none."""
    path = resolve_path(str(name))
    if not path.exists():
        return f"missing: {name}"
    key = (str(path), tuple((p.name, (s := p.stat()).st_size, s.st_mtime_ns) for p in fingerprint_files(path)))
    if key not in _TAKEN:
        _TAKEN[key] = fingerprint(path)[0]
    return _TAKEN[key]


def profile_weights(profile: ModelProfile) -> dict[str, Any]:
    """The profile's weights on this machine: their fingerprint (a .gguf with its converter's format)."""
    found: dict[str, Any] = {}
    try:
        path = profile.weights_path()
        found["fingerprint"] = content_fingerprint(path)
    except BackendUnavailable as err:
        path, found["fingerprint"] = None, f"missing: {err}"
    if path is not None and path.suffix == ".gguf":
        found["converter"] = FOLDER_FORMAT
    return found


def weights_of(llm: dict[str, Any]) -> dict[str, Any]:
    """What names the weights an `llm` config section (as plain JSON) runs: the profile's settings that change
    answers (not its file's name: a copy answers the same) and, on every backend, the fingerprint of the weights
    this machine loads or serves; for the openai backend with `weights: server`, what the server reports it serves
    (llm.openai.base_url's /models) in place of a fingerprint; `lora` for llm.vllm.lora."""
    profile = load_profile(llm.get("profile"))
    found: dict[str, Any] = {"profile": profile.settings()}
    backend = llm.get("backend")
    if backend == "openai" and (llm.get("openai") or {}).get("weights", "server") == "server":
        from models.config import OpenAIConfig
        from models.config.validation import validate
        from models.llm.served import server_report

        try:
            found["server"] = server_report(validate(OpenAIConfig, llm.get("openai") or {}, "llm.openai"),
                                            profile.name)
        except BackendUnavailable as err:  # the record says so; the backend's own probe stops the run
            found["server"] = f"unreachable: {err}"
    else:
        found.update(profile_weights(profile))
    adapter = (llm.get("vllm") or {}).get("lora")
    if backend == "vllm" and adapter:
        found["lora"] = content_fingerprint(adapter)
    return found
