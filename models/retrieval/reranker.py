"""Optional cross-encoder re-ranker (sentence-transformers CrossEncoder), local weights only."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from loguru import logger

from models.config import RerankConfig
from models.llm.base import BackendUnavailable


class Reranker:
    """Scores (query, text) pairs; higher is more relevant. `config.model` is a local model folder."""

    def __init__(self, config: RerankConfig) -> None:
        from sentence_transformers import CrossEncoder

        if not config.model:
            raise BackendUnavailable("references.rerank.model is not set")
        path = Path(config.model).expanduser()
        if not (path / "config.json").is_file():
            raise BackendUnavailable(f"re-ranker model '{path}' is not a local model folder (config.json missing)")
        started = time.perf_counter()
        self.config = config
        self.name = path.name
        self.model = CrossEncoder(str(path), device=config.device, local_files_only=True)
        logger.info("re-ranker {} loaded in {:.2f} s", self.name, time.perf_counter() - started)

    def score(self, query: str, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0, dtype=np.float32)
        scores = self.model.predict([(query, text) for text in texts], batch_size=self.config.batch_size,
                                    convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(scores, dtype=np.float32).reshape(len(texts), -1)[:, -1]
