"""Train the R2AG R2-Former on ranked reference lists; the retriever and the LLM stay frozen.

Data: CRAG-format .jsonl(.bz2) (each question's pages go through the references stage of --config, so the lists
are the ones the pipeline ranks; a reference is positive when it contains the gold answer or an alternative), or
any .jsonl of {"query", "references": [text, ...], "labels": [0|1, ...], "answer"?} (ranked here by the
config's embedder, as the pipeline ranks). Queries are split into train and validation sets (seeded).

    python tools/train_r2former.py --data crag_task_1_dev_v4_release.jsonl.bz2 --out runs/r2former/qdm.pt
    python tools/train_r2former.py --data lists.jsonl --lm --config configs/cpu.yaml   # QDM + LM loss (hf LLM)

Without --lm only the query-document-matching head is trained (no LLM needed; `r2ag.mode: relevance`). With
--lm the config's hf LLM is loaded and frozen, and the loss adds the answer's language-modelling loss with the
projected retrieval embeddings injected into the reasoning prompt (`r2ag.mode: prompt`); the checkpoint then
records the LLM's hidden size. Each epoch prints train and validation loss and reference-level validation AUC;
the weights of the epoch with the lowest validation loss are saved.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from loguru import logger  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402
from tqdm import tqdm  # noqa: E402

from evaluation.data import DataError, alternative_answers, check_data_file, first_record, read_examples  # noqa: E402
from models.budget import Deadline  # noqa: E402
from models.config import ConfigError, SystemConfig, load_config  # noqa: E402
from models.llm.base import BackendUnavailable  # noqa: E402
from models.prompting import PromptError, PromptLibrary  # noqa: E402
from models.retrieval.embedder import Embedder  # noqa: E402
from models.retrieval.r2former import (R2Former, R2FormerConfig, pad_lists, qdm_loss,  # noqa: E402
                                       retrieval_features, save_checkpoint)
from models.stages.base import StageContext  # noqa: E402
from models.stages.reasoning import END, START, place_embeddings, reasoning_conversation  # noqa: E402
from models.stages.references import ReferencesStage, page_settings  # noqa: E402
from models.state import QueryState, Reference  # noqa: E402
from utils.answers import contains_answer, is_invalid  # noqa: E402
from utils.pages import PageProcessor  # noqa: E402

MIN_LISTS = 4


@dataclass
class RankedList:
    """One query's references as the pipeline ranks them, their labels and retrieval features."""

    state: QueryState
    labels: np.ndarray
    features: np.ndarray
    answer: str | None = None


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


def answer_block(answer: str) -> str:
    """The reasoning prompt's output format around a gold answer: the LM loss's target."""
    premise = "yes" if is_invalid(answer) else "no"
    return f"{START}\n## Answer: {answer}\n## False Premise: {premise}\n{END}"


def lists_from_crag(examples: list[dict], config: SystemConfig, embedder: Embedder) -> list[RankedList]:
    """The references stage of `config` over each question's pages; labels from the gold answers."""
    pages = PageProcessor(page_settings(config.references), config.references.workers, None)
    ctx = StageContext(config, None, embedder, None, Deadline(10 ** 9), pages)
    lists: list[RankedList] = []
    try:
        for start in tqdm(range(0, len(examples), config.batch_size), desc="references", unit="batch"):
            chunk = examples[start:start + config.batch_size]
            states = [QueryState(i, e["interaction_id"], e["query"], e["query_time"],
                                 [p for p in e["search_results"] if isinstance(p, dict)]) for i, e in enumerate(chunk)]
            ReferencesStage().run(states, ctx)
            for state, example in zip(states, chunk):
                answers = [str(example["answer"]), *alternative_answers(example)]
                lists.extend(_ranked(state, answers, str(example["answer"])))
    finally:
        pages.close()
    return lists


def read_pairs(path: Path, limit: int | None) -> list[tuple[int, dict]]:
    """(line number, row) of a .jsonl of {"query", "references", "labels", "answer"?}; a bad row is a DataError."""
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip() or (limit is not None and len(rows) >= limit):
                continue
            try:
                row = json.loads(line)
                texts, labels = row["references"], row["labels"]
                if not (isinstance(row["query"], str) and isinstance(texts, list) and isinstance(labels, list)
                        and len(texts) == len(labels) and all(isinstance(t, str) for t in texts)):
                    raise ValueError("needs a query string and equally long lists of reference strings and labels")
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise DataError(f"{path}:{number}: {err}") from err
            rows.append((number, row))
    return rows


def lists_from_pairs(rows: list[tuple[int, dict]], embedder: Embedder) -> list[RankedList]:
    """The rows of read_pairs, each list ranked best first by the embedder, as the pipeline ranks."""
    lists: list[RankedList] = []
    for number, row in tqdm(rows, desc="lists", unit="query"):
        vectors = embedder.encode([row["query"], *row["references"]])
        order = np.argsort(-(vectors[1:] @ vectors[0]), kind="stable")
        state = QueryState(number, str(row.get("interaction_id", number)), row["query"],
                           str(row.get("query_time", "")), [], [Reference(row["references"][i], "chunk") for i in order])
        state.query_vector, state.reference_vectors = vectors[0], vectors[1:][order]
        answer = row.get("answer")
        lists.extend(_ranked(state, None, answer if isinstance(answer, str) else None,
                             np.asarray(row["labels"], dtype=bool)[order]))
    return lists


def _ranked(state: QueryState, answers: list[str] | None, answer: str | None,
            labels: np.ndarray | None = None) -> list[RankedList]:
    if not state.references or state.reference_vectors is None:
        return []
    if labels is None:
        labels = np.array([not is_invalid(answers[0]) and contains_answer(r.text, answers) for r in state.references])
    return [RankedList(state, labels, retrieval_features(state.query_vector, state.reference_vectors), answer)]


class LMLoss:
    """The answer's language-modelling loss with the R2-Former's embeddings injected (the hf LLM frozen)."""

    def __init__(self, config: SystemConfig) -> None:
        from models.llm.hf import HFBackend

        if config.llm.backend != "hf":
            raise ConfigError(f"{config.source}: --lm trains through the hf backend (llm.backend: hf)")
        self.llm = HFBackend(config.llm.hf)
        self.llm.model.requires_grad_(False)
        self.placeholder = self.llm.retrieval_placeholder()
        self.prompt = PromptLibrary(config.prompts).get("reasoning")
        self.max_chars = config.reasoning.max_reference_chars

    @property
    def hidden_size(self) -> int:
        return self.llm.hidden_size

    def __call__(self, item: RankedList, projected: torch.Tensor) -> torch.Tensor:
        """-log p(answer block | reasoning prompt with `projected` (k, hidden) before the references)."""
        conversation = reasoning_conversation(self.prompt, item.state, self.max_chars, len(projected))
        conversation, rows = place_embeddings(conversation, projected, self.placeholder)
        ids, rows = self.llm.prompt_ids(conversation, rows)
        tokenizer = self.llm.tokenizer
        target = tokenizer(answer_block(item.answer), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        device = self.llm.config.device
        input_ids = torch.tensor([ids + target], device=device)
        labels = torch.tensor([[-100] * len(ids) + target], device=device)
        embeds = self.llm.inject(input_ids, [rows])
        return self.llm.model(inputs_embeds=embeds, labels=labels).loss


def _batch(items: list[RankedList], max_refs: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    features, padding = pad_lists([i.features for i in items], max_refs)
    labels = torch.zeros(padding.shape)
    for row, item in enumerate(items):
        n = min(len(item.labels), padding.shape[1])
        labels[row, :n] = torch.as_tensor(item.labels[:n], dtype=torch.float32)
    return features.to(device), padding.to(device), labels.to(device)


def _losses(model: R2Former, items: list[RankedList], settings: TrainSettings, lm: LMLoss | None
            ) -> tuple[torch.Tensor, ...]:
    """Total loss, QDM loss and LM loss of one batch, then the QDM logits and labels of its references."""
    features, padding, labels = _batch(items, model.config.max_refs, settings.device)
    logits, projected = model(features, padding)
    qdm = qdm_loss(logits, labels, padding)
    lm_terms = [lm(item, projected[row, :min(len(item.labels), padding.shape[1])])
                for row, item in enumerate(items) if lm is not None and item.answer]
    lm_loss = torch.stack(lm_terms).mean() if lm_terms else torch.zeros((), device=qdm.device)
    return qdm + settings.lm_weight * lm_loss, qdm, lm_loss, logits[~padding], labels[~padding]


def evaluate(model: R2Former, items: list[RankedList], settings: TrainSettings, lm: LMLoss | None
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
    gold = np.concatenate(labels) if labels else np.zeros(0)
    result["auc"] = float(roc_auc_score(gold, np.concatenate(scores))) if len(set(gold.tolist())) == 2 else float("nan")
    return result


def train(model: R2Former, train_lists: list[RankedList], val_lists: list[RankedList], settings: TrainSettings,
          lm: LMLoss | None = None, progress: bool = False) -> History:
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="CRAG-format .jsonl(.bz2), or a .jsonl of lists")
    parser.add_argument("--config", type=Path, default=None, help="system config (embedder, references, LLM)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "r2former" / "r2former.pt")
    parser.add_argument("--lm", action="store_true", help="add the LM loss through the config's hf LLM (frozen)")
    parser.add_argument("--limit", type=int, default=None, help="use the first N questions")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lm-weight", type=float, default=1.0)
    parser.add_argument("--val-share", type=float, default=0.2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--max-refs", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="where the R2-Former trains (the LLM's device is the config's)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def _is_crag(path: Path) -> bool:
    """CRAG-format (questions with pages) rather than a .jsonl of reference lists."""
    first = first_record(path)
    if first is None:
        raise DataError(f"{path}: the first line is not a JSON object")
    if "search_results" not in first and not path.name.endswith(".jsonl"):
        raise DataError(f"{path}: reference lists must be a plain .jsonl file")
    return "search_results" in first


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    try:
        check_data_file(args.data)
        if args.epochs < 1 or args.batch_size < 1 or not 0 < args.val_share < 1 or args.hidden % args.heads:
            raise ConfigError("--epochs and --batch-size must be positive, --val-share in (0, 1), and --hidden a "
                              "multiple of --heads")
        config = load_config(args.config)
        crag = _is_crag(args.data)
        rows = list(read_examples(args.data, limit=args.limit)) if crag else read_pairs(args.data, args.limit)
        embedder = Embedder(config.embedder)
        lists = lists_from_crag(rows, config, embedder) if crag else lists_from_pairs(rows, embedder)
        if len(lists) < MIN_LISTS:
            raise DataError(f"{args.data}: {len(lists)} usable reference lists; at least {MIN_LISTS} are needed")
        lm = LMLoss(config) if args.lm else None
    except (ConfigError, DataError, BackendUnavailable, PromptError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    train_lists, val_lists = split(lists, args.val_share, args.seed)
    positives = sum(int(item.labels.sum()) for item in lists)
    references = sum(len(item.labels) for item in lists)
    print(f"{len(lists)} lists ({len(train_lists)} train, {len(val_lists)} validation), {references} references, "
          f"{positives} positive; embedder {embedder.name}" + (f"; LM loss through {lm.llm.folder.name}" if lm else ""))
    model = R2Former(R2FormerConfig(args.hidden, args.heads, args.layers, args.dropout, args.max_refs,
                                    lm.hidden_size if lm else None))
    settings = TrainSettings(args.epochs, args.lr, args.batch_size, args.lm_weight, args.seed, args.device)
    history = train(model, train_lists, val_lists, settings, lm, progress=True)
    best = history.rows[history.best_epoch - 1]
    print(f"best epoch {history.best_epoch}: val loss {best['val_loss']:.4f}, val AUC {best['val_auc']:.3f}")
    save_checkpoint(model, args.out, embedder.name, {k: float(v) for k, v in best.items()}, trained_with_lm=lm is not None)
    print(f"saved {args.out}  (r2ag.checkpoint; r2ag.mode: {'prompt or relevance' if lm else 'relevance'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
