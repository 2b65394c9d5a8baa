"""A submission's files: aicrowd.json, the config and its weights, the requirements' pins, and the image (the
Dockerfile's CUDA base against the vLLM pin)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from evaluation.submission import Check
from models.config import ConfigError
from models.llm.profile import ModelProfile, load_profile
from models.stages.hash_retriever import hash_settings
from models.stages.r2ag import R2AGSettings

CHALLENGES = {  # the id of each task's challenge; aicrowd.json names one
    "meta-kdd-cup-24-crag-retrieval-summarization": "Task 1: retrieval summarization",
    "meta-kdd-cup-24-crag-knowledge-graph-and-web-retrieval": "Task 2: knowledge graph and web retrieval",
    "meta-kdd-cup-24-crag-end-to-end-retrieval-augmented-generation": "Task 3: end-to-end RAG",
}
PLACEHOLDER_AUTHOR = "your-aicrowd-username"
# The CUDA each pinned vLLM wheel is built with (the Dockerfile's nvidia/cuda base image should match it). Source
# for 0.14.1: its vllm/_C.abi3.so says "Cuda compilation tools, release 12.9, V12.9.86" (strings) and needs
# libcudart.so.12 (readelf -d). A new pin: read the same from its wheel and add a row.
VLLM_WHEEL_CUDA = {"0.14.1": "12.9"}


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
    assert isinstance(challenge, str) and isinstance(authors, list)  # no problems: both checked above
    placeholder = PLACEHOLDER_AUTHOR in authors
    note = " (authors is still the placeholder: put your username)" if placeholder else ""
    return Check("aicrowd.json", True, f"{CHALLENGES[challenge]}{note}", warn=placeholder)



def dockerfile(repo: Path) -> str:
    """The submission's Dockerfile (OSError where it cannot be read)."""
    return (repo / "Dockerfile").read_text(encoding="utf-8")


def dockerfile_config(repo: Path) -> str | None:
    """The CRAG_CONFIG the Dockerfile sets, relative to the repository, or None."""
    try:
        text = dockerfile(repo)
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
    from models.loading import load_config

    try:
        config = load_config(repo / config_path)
    except ConfigError as err:
        return Check("config", False, str(err)), Check("weights", False, "config not loaded"), None
    needed: list[tuple[str, Path, str]] = []  # (key, path, kind)
    try:
        profile = submission_profile(repo, config)
    except ConfigError as err:
        return Check("config", False, str(err)), Check("weights", False, "model profile not loaded"), None
    if config.llm.backend in ("vllm", "hf") and profile.weights is not None and profile.weights.path is not None:
        needed.append((f"{config.llm.profile} weights.path", Path(profile.weights.path), "model"))
    if config.embedder.model:
        needed.append(("embedder.model", Path(config.embedder.model), "folder"))
    if config.references.rerank.model:
        needed.append(("references.rerank.model", Path(config.references.rerank.model), "folder"))
    if config.attributes.method == "svm":
        needed.append(("attributes.svm_model", Path(config.attributes.svm_model), "file"))
    r2ag = config.section("r2ag", R2AGSettings)
    if r2ag.enabled and r2ag.checkpoint:
        needed.append(("r2ag.checkpoint", Path(r2ag.checkpoint), "file"))
    if config.references.retriever == "hash":
        needed.append(("references.hash.model", Path(hash_settings(config).model or ""), "file"))
    missing = []
    for key, path, kind in needed:
        full = path if path.is_absolute() else repo / path
        if kind == "file" and not full.is_file() or kind == "folder" and not full.is_dir():
            missing.append(f"{key}: {path} not found")
        elif kind == "model" and not (full.suffix == ".gguf" and full.is_file() or full.is_dir() and _weights(full)):
            missing.append(f"{key}: {path} holds no model weights (config.json and *.safetensors)")
    config_check = Check("config", True, f"{config_path}: backend {config.llm.backend}, model {profile.name} "
                                         f"({config.llm.profile}), task {config.task}, batch_size {config.batch_size}")
    # every later reader (the GPU checks, the budget plan) reads the submission's profile, not this checkout's
    config.llm.profile = str(submission_path(repo, config.llm.profile))
    detail = "; ".join(missing) if missing else f"{len(needed)} paths present"
    return config_check, Check("weights", not missing, detail), config



def submission_profile(repo: Path, config: Any) -> ModelProfile:
    """The config's model profile as the submission holds it (llm.profile, relative to its folder); a ConfigError
    naming the file where it is wrong. Its weights need not be present."""
    return load_profile(str(submission_path(repo, config.llm.profile)))


def submission_model(repo: Path, config: Any) -> str:
    """The model folder the config's profile names, as written (relative to the submission's folder), or "" for a
    profile whose weights are a package or on a server only."""
    weights = submission_profile(repo, config).weights
    return weights.path if weights is not None and weights.path is not None else ""


def submission_path(repo: Path, path: str) -> Path:
    """A path a config names: absolute, or relative to the submission's folder."""
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
        text = dockerfile(repo)
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
        return Check("image", False, f"vllm=={version} is not in VLLM_WHEEL_CUDA (evaluation/submission/files.py): "
                                     "read its wheel's CUDA (strings vllm/_C.abi3.so | grep 'Cuda compilation') and "
                                     "add it")
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

