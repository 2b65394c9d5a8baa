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

With --folds K the questions are split into K folds (seeded): each fold's checkpoint is trained on the other
folds (with its own validation split) and ranks the fold's lists, so every figure is out of fold. It prints the
recall of a gold-bearing reference at each --k for the retriever's order and the R2-Former's, pooled over the
folds, with the paired difference's 95% interval; the checkpoints go beside --out as NAME.foldI.pt, and
NAME.folds.json names each fold's questions and checkpoint and holds the figures:

    python tools/train_r2former.py --data data/gate_dev.jsonl --folds 4 --out runs/r2former/gate.pt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import cast

import numpy as np
import torch
from loguru import logger
from tqdm import tqdm

from evaluation.data import DataError, alternative_answers, check_data_file, is_crag_format, read_examples
from evaluation.metrics import mean_interval
from models.config import REPO_ROOT, ConfigError, SystemConfig
from models.llm.profile import load_profile
from models.loading import load_config
from models.prompting import PromptLibrary
from models.retrieval.embedder import Embedder
from models.retrieval.r2former_head import R2Former, R2FormerConfig, retrieval_features, save_checkpoint
from models.stages.reasoning import place_embeddings, reasoning_conversation
from models.state import QueryState, Reference
from training.examples import answer_block, reference_states
from training.r2former_training import FoldRecall, RankedList, TrainSettings, list_scores, query_folds, split, train
from utils.answers import contains_answer, is_invalid
from utils.cli import CommandParser, check_out_file, command, interrupted
from utils.durable_io import write_atomic

MIN_LISTS = 4


def lists_from_crag(examples: list[dict], config: SystemConfig, embedder: Embedder) -> list[RankedList]:
    """The references stage of `config` over each question's pages; labels from the gold answers."""
    lists: list[RankedList] = []
    for state, example in reference_states(examples, config, embedder):
        answers = [str(example["answer"]), *alternative_answers(example)]
        lists.extend(_ranked(state, answers, str(example["answer"])))
    return lists


def read_pairs(path: Path, limit: int | None) -> list[tuple[int, dict]]:
    """(line number, row) of a .jsonl of {"query", "references", "labels", "answer"?}; a bad row is a DataError."""
    rows: list[tuple[int, dict]] = []
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
        references = [Reference(row["references"][i], "chunk") for i in order]
        state = QueryState(number, str(row.get("interaction_id", number)), row["query"],
                           str(row.get("query_time", "")), [], references)
        state.query_vector, state.reference_vectors = vectors[0], vectors[1:][order]
        answer = row.get("answer")
        lists.extend(_ranked(state, None, answer if isinstance(answer, str) else None,
                             np.asarray(row["labels"], dtype=bool)[order]))
    return lists


def _ranked(state: QueryState, answers: list[str] | None, answer: str | None,
            labels: np.ndarray | None = None) -> list[RankedList]:
    if not state.references or state.reference_vectors is None or state.query_vector is None:
        return []
    if labels is None:
        assert answers is not None, "a list without labels is labelled by its answers"
        labels = np.array([not is_invalid(answers[0]) and contains_answer(r.text, answers) for r in state.references])
    return [RankedList(state, labels, retrieval_features(state.query_vector, state.reference_vectors), answer)]


class LMLoss:
    """The answer's language-modelling loss with the R2-Former's embeddings injected (the hf LLM frozen)."""

    def __init__(self, config: SystemConfig) -> None:
        from models.llm.hf import HFBackend

        if config.llm.backend != "hf":
            raise ConfigError(f"{config.source}: --lm trains through the hf backend (llm.backend: hf)")
        self.llm = HFBackend(config.llm.hf, load_profile(config.llm.profile))
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
        # a Tensor indexes and reshapes as an array does, and stays a Tensor: the gradients reach the R2-Former
        conversation, placed = place_embeddings(conversation, cast(np.ndarray, projected), self.placeholder)
        ids, rows = self.llm.prompt_ids(conversation, placed)
        tokenizer = self.llm.tokenizer
        assert item.answer is not None, "the LM loss needs the list's answer"
        target = tokenizer(answer_block(item.answer), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        device = self.llm.config.device
        input_ids = torch.tensor([ids + target], device=device)
        labels = torch.tensor([[-100] * len(ids) + target], device=device)
        embeds = self.llm.inject(input_ids, [cast(torch.Tensor, rows)])
        return self.llm.model(inputs_embeds=embeds, labels=labels).loss


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="CRAG-format .jsonl(.bz2), or a .jsonl of lists")
    parser.add_argument("--config", type=Path, default=None, help="system config (embedder, references, LLM)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "r2former" / "r2former.pt")
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
    parser.add_argument("--folds", type=int, default=None,
                        help="K-fold by question: out-of-fold recall at --k, one checkpoint a fold")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 3, 5], help="the recall's cut-offs (--folds)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def check_labels(labels: list[np.ndarray], data: Path) -> None:
    """A DataError unless the references hold both classes: with no positive (or no negative) there is nothing to
    rank, and the validation AUC would be nan."""
    positives = sum(int(np.sum(item)) for item in labels)
    references = sum(len(item) for item in labels)
    if positives == 0:
        raise DataError(f"{data}: none of the {references} references is positive (contains the gold answer), so "
                        "there is nothing to learn; give questions whose pages or lists hold their answers")
    if positives == references:
        raise DataError(f"{data}: all {references} references are positive, so there is nothing to learn; give "
                        "lists with negatives too")


@command
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    try:
        return train_r2former(args)
    except KeyboardInterrupt:
        return interrupted(f"nothing written ({args.out} is unchanged)")


def train_r2former(args: argparse.Namespace) -> int:
    if (args.epochs < 1 or args.batch_size < 1 or not 0 < args.val_share < 1 or args.hidden < 1 or args.heads < 1
            or args.hidden % args.heads or args.layers < 1 or not 0 <= args.dropout < 1 or args.max_refs < 1
            or args.lr <= 0 or (args.limit is not None and args.limit < 1)
            or (args.folds is not None and args.folds < 2) or min(args.k) < 1):
        raise ConfigError("--epochs, --batch-size, --hidden, --heads, --layers, --max-refs, --lr, --k and --limit "
                          "must be positive, --folds at least 2, --val-share in (0, 1), --dropout in [0, 1), and "
                          "--hidden a multiple of --heads")
    check_out_file(args.out)
    check_data_file(args.data)
    config = load_config(args.config)
    crag = is_crag_format(args.data, "reference lists")
    if crag:
        examples = list(read_examples(args.data, limit=args.limit))
        embedder = Embedder(config.embedder)
        lists = lists_from_crag(examples, config, embedder)
    else:
        pairs = read_pairs(args.data, args.limit)
        # the labels are in the file: a file that cannot train fails before the embedder loads
        check_labels([np.asarray(row["labels"], dtype=bool) for _, row in pairs], args.data)
        embedder = Embedder(config.embedder)
        lists = lists_from_pairs(pairs, embedder)
    if len(lists) < MIN_LISTS:
        raise DataError(f"{args.data}: {len(lists)} usable reference lists; at least {MIN_LISTS} are needed")
    check_labels([item.labels for item in lists], args.data)
    lm = LMLoss(config) if args.lm else None
    if args.folds:
        return cross_validate(args, lists, lm, embedder.name)
    train_lists, val_lists = split(lists, args.val_share, args.seed)
    if len({bool(label) for item in val_lists for label in item.labels}) < 2:
        print(f"note: the {len(val_lists)} validation lists hold one class only, so the validation AUC is not "
              "measured (nan); more data or a larger --val-share measures it", file=sys.stderr)
    positives = sum(int(item.labels.sum()) for item in lists)
    references = sum(len(item.labels) for item in lists)
    print(f"{len(lists)} lists ({len(train_lists)} train, {len(val_lists)} validation), {references} references, "
          f"{positives} positive; embedder {embedder.name}" + (f"; LM loss through {lm.llm.folder.name}" if lm else ""))
    model, settings = new_model(args, lm)
    history = train(model, train_lists, val_lists, settings, lm, progress=True)
    best = history.rows[history.best_epoch - 1]
    print(f"best epoch {history.best_epoch}: val loss {best['val_loss']:.4f}, val AUC {best['val_auc']:.3f}")
    save_checkpoint(model, args.out, embedder.name, {k: float(v) for k, v in best.items()},
                    trained_with_lm=lm is not None)
    print(f"saved {args.out}  (r2ag.checkpoint; r2ag.mode: {'prompt or relevance' if lm else 'relevance'})")
    return 0


def new_model(args: argparse.Namespace, lm: LMLoss | None) -> tuple[R2Former, TrainSettings]:
    model = R2Former(R2FormerConfig(args.hidden, args.heads, args.layers, args.dropout, args.max_refs,
                                    lm.hidden_size if lm else None))
    return model, TrainSettings(args.epochs, args.lr, args.batch_size, args.lm_weight, args.seed, args.device)


def fold_path(out: Path, fold: int) -> Path:
    return out.with_name(f"{out.stem}.fold{fold}{out.suffix}")


def cross_validate(args: argparse.Namespace, lists: list[RankedList], lm: LMLoss | None, embedder: str) -> int:
    """--folds: one checkpoint a fold, each trained without the fold's questions and ranking them; the pooled
    out-of-fold recall at each k, printed and written to NAME.folds.json."""
    parts = query_folds(lists, args.folds, args.seed)
    if min(len(part) for part in parts) == 0 or any(len(lists) - len(part) < MIN_LISTS for part in parts):
        raise DataError(f"{args.data}: {len(lists)} usable reference lists cannot make {args.folds} folds that each "
                        f"train on {MIN_LISTS} or more; lower --folds or give more questions")
    recall, folds = FoldRecall(tuple(sorted(set(args.k)))), []
    for fold, held in enumerate(parts):
        kept = set(held)
        fit, val = split([item for i, item in enumerate(lists) if i not in kept], args.val_share, args.seed)
        model, settings = new_model(args, lm)
        history = train(model, fit, val, settings, lm)
        for index, scores in zip(held, list_scores(model, [lists[i] for i in held], settings)):
            recall.add(index, lists[index].labels, scores)
        best = {k: float(v) for k, v in history.rows[history.best_epoch - 1].items()}
        path = fold_path(args.out, fold)
        save_checkpoint(model, path, embedder, best, trained_with_lm=lm is not None)
        folds.append({"checkpoint": path.name, "best_epoch": history.best_epoch, "val_auc": best["val_auc"],
                      "interaction_ids": sorted(lists[i].state.interaction_id for i in held)})
        print(f"fold {fold + 1}/{args.folds}: {len(held)} lists held out, {len(fit)} trained on; best epoch "
              f"{history.best_epoch}, val AUC {best['val_auc']:.3f}; saved {path}", flush=True)
    figures = fold_figures(recall)
    print(f"recall of a gold-bearing reference, out of fold ({args.folds} folds by question, seed {args.seed}; "
          f"{len(recall.lists)} of {len(lists)} lists hold one):")
    print(f"{'k':>3}  {'dense':>6}  {'r2former':>8}  difference (95% CI)")
    for row in figures:
        low, high = row["ci95"]
        print(f"{row['k']:>3}  {row['dense']:>6.3f}  {row['r2former']:>8.3f}  {row['difference']:+.3f} "
              f"[{low:+.3f}, {high:+.3f}]")
    summary = args.out.with_name(f"{args.out.stem}.folds.json")
    write_atomic(summary, json.dumps({"data": str(args.data), "folds": folds, "seed": args.seed,
                                      "lists": len(lists), "lists_with_positive": len(recall.lists),
                                      "recall": figures}, indent=1) + "\n")
    print(f"saved {summary} (each fold's questions and checkpoint)")
    return 0


def fold_figures(recall: FoldRecall) -> list[dict]:
    """Per k: the two orders' recall and their paired difference with its bootstrap interval."""
    rows = []
    for k in recall.ks:
        dense, ours = (np.asarray(recall.hits[name][k], dtype=float) for name in ("dense", "r2former"))
        rows.append({"k": k, "dense": float(dense.mean()), "r2former": float(ours.mean()),
                     "difference": float((ours - dense).mean()), "ci95": mean_interval(ours - dense)})
    return rows


if __name__ == "__main__":
    sys.exit(main())
