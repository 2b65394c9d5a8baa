"""The LLM interface every backend implements, and the registry that builds one from config."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Protocol

from models.budget import Deadline
from models.config import LLMConfig

Conversation = list[dict[str, str]]


@dataclass
class GenParams:
    max_tokens: int = 128
    temperature: float = 0.0
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    deadline: Deadline | None = None


class LLM(Protocol):
    """A backend may also carry `tokenizer` (a transformers tokenizer, or None) to trim answers by its tokens."""

    def generate(self, conversations: list[Conversation], params: GenParams) -> list[list[str]]:
        """n samples per conversation, in order; a conversation that could not be served gets []."""


class BackendUnavailable(RuntimeError):
    """A backend whose model or library is missing; the message says how to fix it."""


# name -> "module:Class"; modules are imported only when chosen, so a CPU install never imports vllm.
_BACKENDS = {
    "hf": "models.llm.hf:HFBackend",
    "openai": "models.llm.openai:OpenAIBackend",
    "vllm": "models.llm.vllm:VLLMBackend",
}


def create_llm(config: LLMConfig) -> LLM:
    module_name, class_name = _BACKENDS[config.backend].split(":")
    backend_cls = getattr(importlib.import_module(module_name), class_name)
    return backend_cls(getattr(config, config.backend))


def cut_at_stop(text: str, stop: list[str]) -> str:
    """Text up to the first stop string (excluded), as OpenAI-style APIs return it."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=len(text))
    return text[:cut]
