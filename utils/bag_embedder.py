"""A bag-of-words embedder by feature hashing: no model, deterministic, texts sharing words are close. For tests
and benchmarks that measure what a stage does with vectors, not how good the vectors are."""

from __future__ import annotations

import hashlib
import re

import numpy as np

from utils.time_budget import Deadline


class BagOfWordsEmbedder:
    """Each word (lower case) hashed into one of `dimension` buckets; rows L2-normalised. Counts its calls."""

    name = "hash-512"

    def __init__(self, dimension: int = 512) -> None:
        self.dimension = dimension
        self.calls = 0

    def encode(self, texts: list[str], deadline: Deadline | None = None) -> np.ndarray:
        """Like Embedder.encode: with a deadline already passed, no rows (it is otherwise too fast to be cut)."""
        self.calls += 1
        if deadline is not None and deadline.expired():
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                vectors[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dimension] += 1.0
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms == 0, 1.0, norms)
