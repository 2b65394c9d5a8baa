"""R2-Former training: ranked reference lists, the QDM (+ optional LM) loss, evaluation and the training loop.

The retriever and the LLM stay frozen; `lm`, when given, is a callable (list, projected embeddings) -> loss that
runs the frozen LLM (tools/train_r2former.py builds it over the hf backend).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from tqdm import tqdm

from models.retrieval.r2former_head import R2Former, pad_lists, qdm_loss, retrieval_features
from models.state import QueryState


@dataclass
class RankedList:
    """One query's references as the pipeline ranks them, their labels and retrieval features."""

    state: QueryState
    labels: np.ndarray
    features: np.ndarray
    answer: str | None = None


LMLossFn = Callable[[RankedList, torch.Tensor], torch.Tensor]  # (list, its projected embeddings) -> LM loss


@dataclass
class TrainSettings:
    epochs: int = 20
    lr: float = 2e-4
    batch_size: int = 16
    lm_weight: float = 1.0
    seed: int = 0
    device: str = "cpu"


@dataclass
class History:
    rows: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    best_state: dict[str, torch.Tensor] = field(default_factory=dict)


def _batch(items: list[RankedList], max_refs: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    features, padding = pad_lists([i.features for i in items], max_refs)
    labels = torch.zeros(padding.shape)
    for row, item in enumerate(items):
        n = min(len(item.labels), padding.shape[1])
        labels[row, :n] = torch.as_tensor(item.labels[:n], dtype=torch.float32)
    return features.to(device), padding.to(device), labels.to(device)


def _losses(model: R2Former, items: list[RankedList], settings: TrainSettings, lm: LMLossFn | None
            ) -> tuple[torch.Tensor, ...]:
    """Total loss, QDM loss and LM loss of one batch, then the QDM logits and labels of its references."""
    features, padding, labels = _batch(items, model.config.max_refs, settings.device)
    logits, projected = model(features, padding)
    qdm = qdm_loss(logits, labels, padding)
    lm_terms = [lm(item, projected[row, :min(len(item.labels), padding.shape[1])])
                for row, item in enumerate(items) if lm is not None and item.answer]
    lm_loss = torch.stack(lm_terms).mean() if lm_terms else torch.zeros((), device=qdm.device)
    return qdm + settings.lm_weight * lm_loss, qdm, lm_loss, logits[~padding], labels[~padding]


def evaluate(model: R2Former, items: list[RankedList], settings: TrainSettings, lm: LMLossFn | None
             ) -> dict[str, float]:
    """Mean losses and reference-level AUC over `items` (NaN AUC when they hold one class only)."""
    model.eval()
    totals = {"loss": 0.0, "qdm": 0.0, "lm": 0.0}
    scores, labels = [], []
    with torch.no_grad():
        for start in range(0, len(items), settings.batch_size):
            part = items[start:start + settings.batch_size]
            loss, qdm, lm_loss, logits, gold = _losses(model, part, settings, lm)
            for key, value in zip(totals, (loss, qdm, lm_loss)):
                totals[key] += float(value) * len(part)
            scores.append(logits.float().cpu().numpy())
            labels.append(gold.cpu().numpy())
    result = {key: value / max(len(items), 1) for key, value in totals.items()}
    golds = np.concatenate(labels) if labels else np.zeros(0)
    both = len(set(golds.tolist())) == 2
    result["auc"] = float(roc_auc_score(golds, np.concatenate(scores))) if both else float("nan")
    return result


def train(model: R2Former, train_lists: list[RankedList], val_lists: list[RankedList], settings: TrainSettings,
          lm: LMLossFn | None = None, progress: bool = False) -> History:
    """Adam on the R2-Former alone; keeps the weights of the epoch with the lowest validation loss."""
    torch.manual_seed(settings.seed)
    order = random.Random(settings.seed)
    model.to(settings.device)
    optimiser = torch.optim.Adam(model.parameters(), lr=settings.lr)
    history = History()
    best = float("inf")
    for epoch in range(1, settings.epochs + 1):
        model.train()
        items = list(train_lists)
        order.shuffle(items)
        seen, total = 0, 0.0
        for start in tqdm(range(0, len(items), settings.batch_size), desc=f"epoch {epoch}", unit="batch",
                          disable=not progress, leave=False):
            part = items[start:start + settings.batch_size]
            loss = _losses(model, part, settings, lm)[0]
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            seen, total = seen + len(part), total + loss.detach().item() * len(part)
        metrics = evaluate(model, val_lists, settings, lm)
        row = {"epoch": epoch, "train_loss": total / max(seen, 1), **{f"val_{k}": v for k, v in metrics.items()}}
        history.rows.append(row)
        if progress:
            print(f"epoch {epoch:3d}  train loss {row['train_loss']:.4f}  val loss {row['val_loss']:.4f}  "
                  f"(qdm {row['val_qdm']:.4f}, lm {row['val_lm']:.4f})  val AUC {row['val_auc']:.3f}", flush=True)
        if metrics["loss"] < best:
            best, history.best_epoch = metrics["loss"], epoch
            history.best_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if history.best_state:
        model.load_state_dict(history.best_state)
    return history


def split(lists: list[RankedList], val_share: float, seed: int) -> tuple[list[RankedList], list[RankedList]]:
    """Queries shuffled (seeded) and split; both sides keep at least one list."""
    shuffled = list(lists)
    random.Random(seed).shuffle(shuffled)
    n_val = min(max(1, round(len(shuffled) * val_share)), len(shuffled) - 1)
    return shuffled[n_val:], shuffled[:n_val]


def synthetic_lists(count: int, seed: int, k_range: tuple[int, int] = (3, 9), dim: int = 32) -> list[RankedList]:
    """Clustered synthetic lists (tests, benchmarks): positives lie near the query, negatives are random; each list
    is ranked by cosine plus noise, as a retriever would rank it, so some negatives rank above positives."""
    rng = np.random.default_rng(seed)
    lists = []
    for index in range(count):
        query = rng.normal(size=dim)
        k = int(rng.integers(k_range[0], k_range[1]))
        labels = rng.random(k) < 0.35
        docs = np.where(labels[:, None], query + rng.normal(scale=1.2, size=(k, dim)), rng.normal(size=(k, dim)))
        unit = docs / np.linalg.norm(docs, axis=1, keepdims=True)
        order = np.argsort(-(unit @ query + rng.normal(scale=0.1, size=k)))
        state = QueryState(index, str(index), "q", "", [])
        lists.append(RankedList(state, labels[order], retrieval_features(query, docs[order])))
    return lists


def list_scores(model: R2Former, items: list[RankedList], settings: TrainSettings) -> list[np.ndarray]:
    """Each list's QDM logits; a reference past the model's `max_refs` gets -inf (ranked after, in its order)."""
    model.eval()
    scored: list[np.ndarray] = []
    with torch.no_grad():
        for start in range(0, len(items), settings.batch_size):
            part = items[start:start + settings.batch_size]
            features, padding, _ = _batch(part, model.config.max_refs, settings.device)
            logits = model(features, padding)[0].float().cpu().numpy()
            for row, item in enumerate(part):
                values = np.full(len(item.labels), -np.inf)
                n = min(len(item.labels), logits.shape[1])
                values[:n] = logits[row, :n]
                scored.append(values)
    return scored


def hit_at(order: np.ndarray, labels: np.ndarray, k: int) -> bool:
    """Whether a positive reference is among the first k of `order`."""
    return bool(labels[order[:k]].any())


def query_folds(lists: list[RankedList], folds: int, seed: int) -> list[list[int]]:
    """Indices of `lists` in `folds` folds by question (interaction id), shuffled (seeded): a question's lists
    stay in one fold, so no fold's model has seen the questions it is measured on."""
    questions = sorted({item.state.interaction_id for item in lists})
    random.Random(seed).shuffle(questions)
    fold_of = {question: index % folds for index, question in enumerate(questions)}
    parts: list[list[int]] = [[] for _ in range(folds)]
    for index, item in enumerate(lists):
        parts[fold_of[item.state.interaction_id]].append(index)
    return parts


@dataclass
class FoldRecall:
    """Out-of-fold hits of a gold-bearing reference at each k, for the retriever's order and the R2-Former's,
    over the lists that hold a positive (`hits[name][k]`, one bool a list, in `lists` order)."""

    ks: tuple[int, ...]
    lists: list[int] = field(default_factory=list)
    hits: dict[str, dict[int, list[bool]]] = field(default_factory=dict)

    def add(self, index: int, labels: np.ndarray, scores: np.ndarray) -> None:
        if not labels.any():
            return
        self.lists.append(index)
        orders = {"dense": np.arange(len(labels)), "r2former": np.argsort(-scores, kind="stable")}
        for name, order in orders.items():
            for k in self.ks:
                self.hits.setdefault(name, {}).setdefault(k, []).append(hit_at(order, labels, k))
