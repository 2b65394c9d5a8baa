"""Deterministic stand-ins for the LLM and the embedder, for unit tests."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

import numpy as np

from models.llm.base import Conversation, GenParams


class ScriptedLLM:
    """Answers each conversation with `reply(conversation)`; records every call."""

    def __init__(self, reply: Callable[[Conversation], str | None] = lambda c: "===START=== paris ===END===") -> None:
        self.reply = reply
        self.calls: list[tuple[list[Conversation], GenParams]] = []

    def generate(self, conversations: list[Conversation], params: GenParams) -> list[list[str]]:
        self.calls.append((conversations, params))
        outputs = []
        for conversation in conversations:
            text = self.reply(conversation)
            outputs.append([] if text is None else [text] * params.n)
        return outputs


class HashEmbedder:
    """Bag of words hashed into 512 dimensions: texts sharing words are close."""

    dimension = 512

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                vectors[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dimension] += 1.0
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms == 0, 1.0, norms)
