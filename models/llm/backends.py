"""The LLM backends by name (`llm.backend`), and the one built from a config. Each backend's module is imported only
when it is chosen, so a CPU install never imports vllm; no backend imports this module, so the import by name
closes no cycle."""

from __future__ import annotations

from collections.abc import Callable

from models.config import LLMConfig
from models.llm.backend import LLM
from models.registry import Registry

BACKENDS: Registry[LLM] = Registry("LLM backend", LLM)
BACKENDS.register_lazy("hf", "models.llm.hf:HFBackend")
BACKENDS.register_lazy("openai", "models.llm.openai:OpenAIBackend")
BACKENDS.register_lazy("vllm", "models.llm.vllm:VLLMBackend")


def create_llm(config: LLMConfig) -> LLM:
    """The backend `config.backend` names, running the model of the profile `config.profile` names."""
    from models.llm.profile import load_profile

    backend: Callable[[object, object], LLM] = BACKENDS.get(config.backend)  # each class: its section, the profile
    return backend(getattr(config, config.backend), load_profile(config.profile))
