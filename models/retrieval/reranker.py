"""Optional cross-encoder re-ranker (sentence-transformers CrossEncoder), local weights only."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.config import RerankConfig
from models.llm.backend import BackendUnavailable
from models.retrieval.embedder import load_local


class Reranker:
    """Scores (query, text) pairs; higher is more relevant. `config.model` is a local model folder."""

    def __init__(self, config: RerankConfig) -> None:
        from sentence_transformers import CrossEncoder

        if not config.model:
            raise BackendUnavailable("references.rerank.model is not set")
        path = Path(config.model).expanduser()
        self.config = config
        self.name = path.name
        self.model = load_local("re-ranker", path, CrossEncoder, config.device)

    def score(self, query: str, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0, dtype=np.float32)
        scores = self.model.predict([(query, text) for text in texts], batch_size=self.config.batch_size,
                                    convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(scores, dtype=np.float32).reshape(len(texts), -1)[:, -1]
