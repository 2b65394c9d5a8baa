"""R2AG (Retrieval information to RAG): list features, the R2-Former, its checkpoint, and the head the pipeline runs.

For a query q and its references d_1..d_k in the retriever's order (embeddings, unit-normalised here):
  relevance     r_i = cos(q, d_i)
  precedent     gamma_i = cos(d_i, sum_{j<i} softmax(r_1..r_{i-1})_j d_j), gamma_1 = 1
  neighbour     zeta_i = mean cosine of d_i with d_{i-1} and d_{i+1} (the one neighbour at either end; 1 for k = 1)
The R2-Former maps each (r, gamma, zeta) with Linear(3 -> h1) plus a learned position embedding through a
Transformer encoder (padding-masked, so k varies); the query-document-matching (QDM) head gives each reference a
relevance logit, and, for retrieval-aware prompting, a projection maps each position to the LLM's hidden size.
Both the retriever and the LLM stay frozen: only this module is trained (tools/train_r2former.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from models.llm.backend import BackendUnavailable

CHECKPOINT_FORMAT = "r2former/1"


class R2FormerError(BackendUnavailable):
    """A checkpoint that cannot serve this pipeline; the message names the file and the fix."""


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.where(norms == 0, 1.0, norms)


def retrieval_features(query: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """(k, 3) float32 rows of (relevance, precedent similarity, neighbour similarity), in the given order."""
    k = len(documents)
    if k == 0:
        return np.zeros((0, 3), dtype=np.float32)
    docs = _unit(np.asarray(documents, dtype=np.float64).reshape(k, -1))
    relevance = docs @ _unit(np.asarray(query, dtype=np.float64).ravel())
    precedent = np.ones(k)
    for i in range(1, k):
        weights = np.exp(relevance[:i] - relevance[:i].max())
        mixed = (weights / weights.sum()) @ docs[:i]
        norm = np.linalg.norm(mixed)
        precedent[i] = float(docs[i] @ mixed / norm) if norm > 0 else 0.0
    neighbour = np.ones(k)
    if k > 1:
        adjacent = np.einsum("ij,ij->i", docs[:-1], docs[1:])  # cos(d_i, d_{i+1})
        neighbour[0], neighbour[-1] = adjacent[0], adjacent[-1]
        neighbour[1:-1] = (adjacent[:-1] + adjacent[1:]) / 2
    return np.stack([relevance, precedent, neighbour], axis=1).astype(np.float32)


def pad_lists(features: list[np.ndarray], max_refs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A (B, K, 3) batch and its (B, K) padding mask (True = padding) for lists of up to `max_refs` references;
    longer lists keep their first `max_refs`."""
    width = max(1, min(max_refs, max((len(f) for f in features), default=1)))
    batch = torch.zeros(len(features), width, 3)
    padding = torch.ones(len(features), width, dtype=torch.bool)
    for row, feats in enumerate(features):
        n = min(len(feats), width)
        if n:
            batch[row, :n] = torch.as_tensor(np.asarray(feats[:n], dtype=np.float32))
            padding[row, :n] = False
    return batch, padding


@dataclass(frozen=True)
class R2FormerConfig:
    """`llm_hidden_size` None: no projection (a QDM-only model, for reference filtering)."""

    hidden: int = 256
    heads: int = 4
    layers: int = 1
    dropout: float = 0.1
    max_refs: int = 64
    llm_hidden_size: int | None = None


class R2Former(nn.Module):
    def __init__(self, config: R2FormerConfig) -> None:
        super().__init__()
        self.config = config
        self.input = nn.Linear(3, config.hidden)
        self.position = nn.Embedding(config.max_refs, config.hidden)
        layer = nn.TransformerEncoderLayer(config.hidden, config.heads, dim_feedforward=4 * config.hidden,
                                           dropout=config.dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.qdm = nn.Linear(config.hidden, 1)
        self.projection = nn.Linear(config.hidden, config.llm_hidden_size) if config.llm_hidden_size else None

    def encode(self, features: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        """(B, K, h1) states of (B, K, 3) features; `padding` (B, K) is True where there is no reference."""
        positions = torch.arange(features.shape[1], device=features.device)
        hidden = self.input(features) + self.position(positions)[None]
        hidden = self.encoder(hidden, src_key_padding_mask=padding)
        return hidden.masked_fill(padding[..., None], 0.0)  # padded rows carry nothing downstream

    def forward(self, features: torch.Tensor, padding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """QDM logits (B, K) and, with a projection, retrieval embeddings (B, K, llm_hidden_size)."""
        hidden = self.encode(features, padding)
        logits = self.qdm(hidden).squeeze(-1)
        return logits, (self.projection(hidden) if self.projection is not None else None)


def qdm_loss(logits: torch.Tensor, labels: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with logits over the real (unpadded) references."""
    keep = ~padding
    return nn.functional.binary_cross_entropy_with_logits(logits[keep], labels[keep].float())


def save_checkpoint(model: R2Former, path: Path, embedder: str, metrics: dict[str, Any] | None = None,
                    trained_with_lm: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": CHECKPOINT_FORMAT, "config": asdict(model.config), "embedder": embedder,
                "trained_with_lm": trained_with_lm, "metrics": metrics or {},
                "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}}, path)


@dataclass
class Checkpoint:
    model: R2Former
    embedder: str
    trained_with_lm: bool
    metrics: dict[str, Any]


def load_checkpoint(path: Path, device: str = "cpu", llm_hidden_size: int | None = None) -> Checkpoint:
    """Load a checkpoint; with `llm_hidden_size` (retrieval-aware prompting), its projection must match it."""
    if not path.is_file():
        raise R2FormerError(f"{path}: R2-Former checkpoint not found (train one with tools/train_r2former.py)")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a corrupt or foreign file
        raise R2FormerError(f"{path}: not an R2-Former checkpoint ({type(err).__name__}: {err})") from err
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise R2FormerError(f"{path}: not an R2-Former checkpoint (format {CHECKPOINT_FORMAT} expected)")
    config = R2FormerConfig(**data["config"])
    if llm_hidden_size is not None:
        if config.llm_hidden_size is None:
            raise R2FormerError(f"{path}: trained for reference filtering only (no projection); retrain with "
                                "tools/train_r2former.py --lm for retrieval-aware prompting")
        if config.llm_hidden_size != llm_hidden_size:
            raise R2FormerError(f"{path}: trained for an LLM of hidden size {config.llm_hidden_size}, but this LLM's "
                                f"is {llm_hidden_size}; retrain it with this LLM (tools/train_r2former.py --lm)")
    model = R2Former(config)
    model.load_state_dict(data["state_dict"])
    return Checkpoint(model.to(device).eval(), str(data.get("embedder", "")), bool(data.get("trained_with_lm")),
                      dict(data.get("metrics", {})))


class R2FormerHead:
    """The trained R2-Former at inference: relevance probabilities and retrieval embeddings per reference list.
    `prompting`: the pipeline injects its embeddings into the reasoning prompt (else it filters references)."""

    def __init__(self, checkpoint: Checkpoint, device: str = "cpu", prompting: bool = False) -> None:
        self.model = checkpoint.model.to(device).eval()
        self.device = device
        self.prompting = prompting

    @torch.inference_mode()
    def run(self, features: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        """Per list: QDM probabilities (k,) and projected embeddings (k, llm_hidden) or None. References past
        `max_refs` get probability 0 and no embedding."""
        if not features:
            return [], []
        batch, padding = pad_lists(features, self.model.config.max_refs)
        logits, projected = self.model(batch.to(self.device), padding.to(self.device))
        probs = torch.sigmoid(logits).float().cpu().numpy()
        vectors = projected.float().cpu().numpy() if projected is not None else None
        out_probs, out_vectors = [], []
        for row, feats in enumerate(features):
            n = min(len(feats), batch.shape[1])
            out_probs.append(np.concatenate([probs[row, :n], np.zeros(len(feats) - n, dtype=np.float32)]))
            out_vectors.append(vectors[row, :n] if vectors is not None else None)
        return out_probs, out_vectors

