"""The manifest of a run folder (manifest.json): what produced its predictions, so that a resume never mixes the
answers of two setups into one score.

Its `answers` part holds what changes answers: the resolved config (less what only moves files or processes:
cache folders, worker counts, log level, the config file's own path, the port of a KG server the run started
itself, and whether the prompts are recorded), what names the LLM's weights (models/llm/weights.py: the model
profile and the fingerprint of the weights this machine runs, or what a server on another machine reports it
serves), the hash of every prompt file the
config uses, the data file's hash, and the time limit. A resume compares that part and names every key that
differs. The rest is a record: the selection, the judge and its prompt, the project commit, package versions,
times. A change of judge only re-judges. An openai run whose weights are fingerprinted here (`weights: profile`,
--serve-llm among them) also records, as `served`, what the server said it served once it was up: its port and a
converted folder's place change every run, so it is a record, not part of `answers`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from loguru import logger

from evaluation.data import Selection, data_pieces
from models.config import REPO_ROOT, SystemConfig
from models.llm.profile import load_profile, served_config
from models.llm.served import server_report
from models.llm.weights import weights_of
from models.prompting import PromptLibrary
from utils.durable_io import write_atomic
from utils.errors import BackendUnavailable

MANIFEST = "manifest.json"
# Config keys that change where files go, how work is spread or what is recorded, never an answer.
VOLATILE = ("source", "references.cache_dir", "references.workers", "llm.hf.cache_dir", "embedder.cache_dir",
            "record_prompts")
PACKAGES = ("torch", "transformers", "tokenizers", "sentence-transformers", "openvino", "vllm", "openai",
            "trafilatura", "resiliparse", "lxml")
SERVED_KG = "fixture server over data/kg"
SERVED_LLM = "served by --serve-llm (evaluation/llm_server.py)"


def file_hash(path: Path) -> str:
    """sha256 of a file, read in blocks; of each piece in order for a split archive."""
    digest = hashlib.sha256()
    for piece in data_pieces(path):
        with piece.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def _drop(tree: dict[str, Any], dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.get(key) or {}
    tree.pop(leaf, None)


def answer_inputs(config: SystemConfig, data: Path, time_limit_s: float | None, served_kg: bool,
                  served_llm: bool = False) -> dict[str, Any]:
    """What changes the answers of a run, as plain JSON."""
    resolved = config.resolved()
    for key in VOLATILE:
        _drop(resolved, key)
    if served_kg:  # the port changes every run; what it serves does not
        resolved["kg"]["base_url"] = f"{SERVED_KG} ({_folder_hash(REPO_ROOT / 'data' / 'kg')[:16]})"
    if config.embedder.precision == "auto":  # resolved for this machine: a run resumed elsewhere may differ
        resolved["embedder"]["precision"] = f"auto: {config.embedder.effective_precision()}"
    if served_llm:  # as llm_for_run serves the profile; the port and the converted folder's place change
        openai = served_config(config, SERVED_LLM).resolved()["llm"]
        resolved["llm"]["openai"] = openai["openai"]
    return {
        "config": resolved,
        "weights": weights_of(resolved["llm"]),
        "prompts": PromptLibrary(config.prompts).digests(),
        "data": {"name": data.name, "sha256": file_hash(data)},
        "time_limit_s": time_limit_s,
    }


def note_served(folder: Path, manifest: dict[str, Any], config: SystemConfig) -> None:
    """Record in the run folder's manifest what the server answering this run reports it serves, when `answers`
    does not already hold it (an openai run with `weights: profile`); a server that does not say is recorded as
    such, and the backend's own probe then stops the run."""
    if config.llm.backend != "openai" or config.llm.openai.weights != "profile":
        return
    try:
        manifest["served"] = server_report(config.llm.openai, load_profile(config.llm.profile).name)
    except BackendUnavailable as err:
        manifest["served"] = f"unreachable: {err}"
    write(folder, manifest)


def _folder_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def judge_record(spec: str, model: str | None) -> dict[str, Any]:
    """What judged a run: the judge, its model, and the hash of the judge prompt an LLM judge renders."""
    return {"spec": spec, "model": model, "prompt_sha256": file_hash(PromptLibrary().get("judge").path)}


def build(answers: dict[str, Any], selection: Selection, judge: dict[str, Any]) -> dict[str, Any]:
    """A new manifest: `answers` (answer_inputs), the selection, the judge, commit, versions, the start time."""
    return {"answers": answers, "selection": dataclasses.asdict(selection) | {
                "domains": sorted(selection.domains), "question_types": sorted(selection.question_types),
                "dynamism": sorted(selection.dynamism)},
            "judge": judge, **_commit(), "packages": _versions(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "finished": None}


def load(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, None where it has none or it cannot be read (said in a warning); prompts recorded by
    their file's sha256, as older manifests hold them, read as the digest of that file (`PromptLibrary.upgrade`)."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        logger.warning("{}: unreadable ({}); the run folder is treated as having no manifest", path, err)
        return None
    if not isinstance(data, dict):
        logger.warning("{}: not a JSON object; the run folder is treated as having no manifest", path)
        return None
    answers = data.get("answers")
    if isinstance(answers, dict) and isinstance(answers.get("prompts"), dict):
        config = answers.get("config")
        overrides = config.get("prompts") if isinstance(config, dict) else None
        library = PromptLibrary(overrides if isinstance(overrides, dict) else None)
        answers["prompts"] = library.upgrade(answers["prompts"])
    return data


def write(folder: Path, manifest: dict[str, Any]) -> None:
    """Written to a temporary file and renamed, so a crash never leaves half a manifest."""
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def finish(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest | {"finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
