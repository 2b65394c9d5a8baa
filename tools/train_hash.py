"""Train the HASH-RAG hash layer (ADSH) from (query, positive) pairs and save a searchable index.

Data: CRAG-format .jsonl(.bz2): each question's pages go through the references stage of --config (dense), every
candidate is split into propositions as `references.hash` says, and a proposition is positive for its question when
it contains the gold answer or an alternative ("invalid question" answers and questions without a positive are
left out). Or any .jsonl of {"query": str, "positives": [str, ...], "negatives"?: [str, ...]}. The database is
every proposition (or every positive and negative text), each once.

    python tools/train_hash.py --data crag_task_1_dev_v4_release.jsonl.bz2 --out runs/hash/crag.hidx
    python tools/train_hash.py --data pairs.jsonl --bits 256 --out runs/hash/pairs.hidx

Questions are split into train and held-out sets (seeded). ADSH trains on the train questions against the whole
database; then recall@k on the held-out questions (the share of their positives in the top k) is printed for
exact cosine, LSH by random hyperplanes at the same code length (Hamming ranking), the layer ADSH starts from
(codes only), and the trained index with and without the exact re-rank. The saved file holds the hash layer, the
database codes ADSH learned, the propositions' texts and (unless --no-vectors) their float vectors;
`references.hash.model` takes it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from loguru import logger

from evaluation.data import DataError, alternative_answers, check_data_file, is_crag_format, read_examples
from models.config import REPO_ROOT, ConfigError, SystemConfig
from models.loading import load_config
from models.retrieval.embedder import Embedder
from models.retrieval.hash_index import HashIndex, HashModel, SearchSettings
from models.stages.hash_retriever import hash_settings, proposition_units
from training.examples import reference_states
from training.hash_training import ADSHSettings, initial_layer, pair_similarity, positive_recall, recall_at, train_adsh
from utils.answers import contains_answer, is_invalid
from utils.cli import CommandParser, check_out_file, command, interrupted

MIN_QUERIES = 4


@dataclass
class Pairs:
    """Queries, the database texts, and each query's positive database rows."""

    queries: list[str]
    texts: list[str]
    positives: list[set[int]]


class _Database:
    def __init__(self) -> None:
        self.texts: list[str] = []
        self.rows: dict[str, int] = {}

    def row(self, text: str) -> int:
        if text not in self.rows:
            self.rows[text] = len(self.texts)
            self.texts.append(text)
        return self.rows[text]


def pairs_from_crag(examples: list[dict], config: SystemConfig, embedder: Embedder) -> Pairs:
    dense = replace(config, references=replace(config.references, retriever="dense"))
    database, queries, positives = _Database(), [], []
    for state, example in reference_states(examples, dense, embedder):
        answers = [str(example["answer"]), *alternative_answers(example)]
        texts, _ = proposition_units(state.candidates, hash_settings(config))
        rows = [database.row(text) for text in texts]
        wanted = {row for row, text in zip(rows, texts) if contains_answer(text, answers)}
        if wanted and not is_invalid(answers[0]):
            queries.append(state.query)
            positives.append(wanted)
    return Pairs(queries, database.texts, positives)


def read_pairs(path: Path, limit: int | None) -> Pairs:
    """The rows of a .jsonl of {"query", "positives", "negatives"?}; a bad row is a DataError naming its line."""
    database, queries, positives = _Database(), list[str](), list[set[int]]()
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip() or (limit is not None and len(queries) >= limit):
                continue
            try:
                row = json.loads(line)
                wanted, others = row["positives"], row.get("negatives", [])
                if not (isinstance(row["query"], str) and isinstance(wanted, list) and wanted
                        and isinstance(others, list) and all(isinstance(t, str) for t in wanted + others)):
                    raise ValueError("needs a query string and a non-empty list of positive strings "
                                     "(negatives: a list of strings)")
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise DataError(f"{path}:{number}: {err}") from err
            queries.append(row["query"])
            positives.append({database.row(text) for text in wanted})
            for text in others:
                database.row(text)
    return Pairs(queries, database.texts, positives)


def held_out_split(count: int, share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) query indices; at least one of each."""
    order = np.random.default_rng(seed).permutation(count)
    held = min(max(1, round(count * share)), count - 1)
    return np.sort(order[held:]), np.sort(order[:held])


def evaluate(model: HashModel, database: np.ndarray, codes: np.ndarray | None, queries: np.ndarray,
             positives: list[set[int]], ks: list[int], alpha: int, depth: int) -> dict[str, float]:
    """recall@k of the index with and without the exact re-rank; `codes`: ADSH's database codes, if any."""
    index = HashIndex(model)
    index.add(database, codes=codes)
    rows = {}
    for k in ks:
        rows[f"codes@{k}"] = recall_at(index, queries, positives, k, SearchSettings(alpha, depth, exact=False))
        rows[f"exact@{k}"] = recall_at(index, queries, positives, k, SearchSettings(alpha, depth, exact=True))
    return rows


def dense_recall(database: np.ndarray, queries: np.ndarray, positives: list[set[int]], k: int) -> float:
    top = np.argsort(-(queries @ database.T), axis=1, kind="stable")[:, :k]
    return positive_recall(top.tolist(), positives, k)


def lsh_recall(database: np.ndarray, queries: np.ndarray, positives: list[set[int]], k: int, bits: int,
               seed: int) -> float:
    """Random hyperplanes, Hamming ranking (no re-rank): the usual alternative at the same code length."""
    weight, bias = initial_layer(database, bits, "random", np.random.default_rng(seed))
    index = HashIndex(HashModel(weight, bias, ""))
    index.add(database, keep_vectors=False)
    return recall_at(index, queries, positives, k, SearchSettings(alpha=k, depth=k, exact=False))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="CRAG-format .jsonl(.bz2), or a .jsonl of pairs")
    parser.add_argument("--config", type=Path, default=None, help="system config (embedder, references)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "hash" / "hash.hidx")
    parser.add_argument("--limit", type=int, default=None, help="use the first N questions")
    parser.add_argument("--bits", type=int, default=256, help="code length, a multiple of 8 (the paper: 768)")
    parser.add_argument("--rounds", type=int, default=10, help="ADSH alternations")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the hash layer per round")
    parser.add_argument("--gamma", type=float, default=200.0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--negative", type=float, default=0.0,
                        help="S for unrelated pairs: 0 (default) or the paper's -1 (see hash_training.py)")
    parser.add_argument("--init", choices=["pca", "random"], default="pca")
    parser.add_argument("--held-out", type=float, default=0.2, help="share of questions held out for recall")
    parser.add_argument("--k", type=int, nargs="+", default=[5, 20])
    parser.add_argument("--no-vectors", action="store_true", help="save codes only (no exact re-rank)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


@command
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    try:
        return train_hash(args)
    except KeyboardInterrupt:
        return interrupted(f"nothing written ({args.out} is unchanged)")


def train_hash(args: argparse.Namespace) -> int:
    if (args.bits < 8 or args.bits % 8 or args.rounds < 0 or args.epochs < 1 or not 0 < args.held_out < 1
            or args.lr <= 0 or min(args.k) < 1 or (args.limit is not None and args.limit < 1)):
        raise ConfigError("--bits must be a positive multiple of 8, --rounds >= 0, --epochs >= 1, --held-out in "
                          "(0, 1), and --lr, --k and --limit positive")
    check_out_file(args.out)
    check_data_file(args.data)
    config = load_config(args.config)
    if is_crag_format(args.data, "pairs"):
        examples = list(read_examples(args.data, limit=args.limit))
        embedder = Embedder(config.embedder)
        pairs = pairs_from_crag(examples, config, embedder)
    else:
        pairs = read_pairs(args.data, args.limit)  # a bad file fails before the embedder loads
        embedder = Embedder(config.embedder)
    if len(pairs.queries) < MIN_QUERIES:
        raise DataError(f"{args.data}: {len(pairs.queries)} questions with a positive; at least {MIN_QUERIES} "
                        "are needed")
    database = embedder.encode(pairs.texts)
    queries = embedder.encode(pairs.queries)
    train, held = held_out_split(len(pairs.queries), args.held_out, args.seed)
    print(f"{len(pairs.queries)} questions ({len(train)} train, {len(held)} held out), {len(pairs.texts)} database "
          f"texts, {sum(len(p) for p in pairs.positives)} positive pairs; embedder {embedder.name}")
    settings = ADSHSettings(args.bits, args.rounds, args.epochs, args.gamma, args.lr, init=args.init, seed=args.seed)
    similarity = pair_similarity([sorted(pairs.positives[i]) for i in train], len(database), args.negative)
    result = train_adsh(database, queries[train], similarity, embedder.name, settings=settings)
    held_positives = [pairs.positives[i] for i in held]
    search = hash_settings(config)
    scores = evaluate(result.model, database, result.database_codes, queries[held], held_positives, args.k,
                      search.alpha, search.depth)
    print("held-out recall@k   " + "  ".join(f"k={k}" for k in args.k))
    print("  exact cosine      " + "  ".join(f"{dense_recall(database, queries[held], held_positives, k):.3f}"
                                             for k in args.k))
    print(f"  LSH {args.bits} bits      " + "  ".join(
        f"{lsh_recall(database, queries[held], held_positives, k, args.bits, args.seed):.3f}" for k in args.k))
    weight, bias = initial_layer(database, args.bits, args.init, np.random.default_rng(args.seed))
    start = evaluate(HashModel(weight, bias, embedder.name), database, None, queries[held], held_positives, args.k,
                     search.alpha, search.depth)
    print("  start, codes only " + "  ".join(f"{start[f'codes@{k}']:.3f}" for k in args.k))
    print("  ours, codes only  " + "  ".join(f"{scores[f'codes@{k}']:.3f}" for k in args.k))
    print("  ours, exact       " + "  ".join(f"{scores[f'exact@{k}']:.3f}" for k in args.k))
    index = HashIndex(result.model, metadata={"texts": pairs.texts, "data": str(args.data),
                                              "held_out_recall": scores})
    index.add(database, codes=result.database_codes, keep_vectors=not args.no_vectors)
    index.save(args.out)
    print(f"saved {args.out}  ({index.nbytes(with_vectors=not args.no_vectors) / 1e6:.2f} MB; references.hash.model)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
