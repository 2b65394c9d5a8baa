"""Train the attribute SVMs (domain, and how fast the answer changes) on MiniLM embeddings of the questions.

Reads any CRAG-format .jsonl or .jsonl.bz2 (query, domain, static_or_dynamic), prints cross-validated accuracy of both
SVMs, the accuracy of SVM and (with --icl) of in-context learning on the same held-out split, then trains on
every row and writes the model that `attributes.svm_model` loads.

    python tools/train_attributes.py                                   # the shipped labelled file
    python tools/train_attributes.py --data crag_task_1_dev_v4.jsonl --out data/attributes/svm_crag.pkl
    python tools/train_attributes.py --icl --config configs/cpu.yaml   # also ICL with the config's LLM
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from evaluation.data import DataError, check_data_file, data_lines
from models.config import DOMAINS, DYNAMISM, REPO_ROOT, ConfigError, EmbedderConfig
from models.llm.backend import BackendUnavailable
from models.loading import load_config
from models.retrieval.embedder import Embedder
from models.stages.attributes import SVMAttributes, read_labelled, svm_classifier
from utils.cli import CommandParser, check_out_file, command, interrupted

MIN_ROWS = 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "data" / "attributes" / "questions.jsonl",
                        help="CRAG-format .jsonl or .jsonl.bz2 with query, domain and static_or_dynamic")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "attributes" / "svm_minilm.pkl",
                        help="where to write the model")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds")
    parser.add_argument("--test-size", type=float, default=0.2, help="held-out share for the SVM/ICL comparison")
    parser.add_argument("--c", type=float, default=1.0, help="SVM regularisation C")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--icl", action="store_true", help="also measure in-context learning on the held-out split")
    parser.add_argument("--config", type=Path, default=None, help="config whose LLM runs ICL (default: cpu.yaml)")
    return parser.parse_args(argv)


def accuracy(predicted: list[str | None], gold: list[str]) -> float:
    return sum(p == g for p, g in zip(predicted, gold)) / max(len(gold), 1)


def icl_predictions(rows_train: list[dict], rows_test: list[dict], config_path: Path | None) -> list[tuple]:
    from models.llm.backends import create_llm
    from models.stages.attributes import AttributesStage, demonstrations
    from models.stages.stage import run_alone
    from models.state import QueryState

    config = load_config(config_path)
    config.attributes = replace(config.attributes, method="icl")
    stage = AttributesStage()
    stage.examples = demonstrations(rows_train, config.attributes.icl.shots_per_class, config.attributes.icl.seed)
    llm = create_llm(config.llm)
    states = [QueryState(i, str(i), row["query"], "", []) for i, row in enumerate(rows_test)]
    batch = config.batch_size
    for start in tqdm(range(0, len(states), batch), desc="ICL", unit="batch", disable=None, dynamic_ncols=True):
        run_alone(stage, states[start:start + batch], config, {"llm": llm, "embedder": None})
    return [(s.domain, s.dynamism) for s in states]


def _strata(domains: list[str], dynamism: list[str], test_size: float) -> list[str] | None:
    """Stratify the held-out split by domain and dynamism together when the split is big enough for every
    pair, else by dynamism, else not at all."""
    from collections import Counter

    n_test = int(round(test_size * len(domains)))
    for labels in ([f"{d}/{y}" for d, y in zip(domains, dynamism)], dynamism):
        counts = Counter(labels)
        if min(counts.values()) >= 2 and len(counts) <= n_test <= len(labels) - len(counts):
            return labels
    return None


def check_rows(rows: list[dict[str, str]], path: Path, folds: int) -> None:
    """A DataError for rows that cannot train both SVMs: too few, one class only, or no class with --folds rows."""
    if len(rows) < MIN_ROWS:
        raise DataError(f"--data {path} has {len(rows)} usable rows (query, domain in {list(DOMAINS)}, "
                        f"static_or_dynamic in {list(DYNAMISM)}); at least {MIN_ROWS} are needed")
    for key in ("domain", "static_or_dynamic"):
        counts = Counter(row[key] for row in rows)
        if len(counts) < 2:
            raise DataError(f"--data {path}: every question has {key} {next(iter(counts))!r}; a classifier needs "
                            f"at least two classes (give questions of other {key} values)")
        if max(counts.values()) < folds:
            raise DataError(f"--data {path}: no {key} class has {folds} questions for {folds}-fold cross-validation;"
                            " give more questions or a smaller --folds")


@command
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return train_attributes(args)
    except KeyboardInterrupt:
        return interrupted(f"nothing written ({args.out} is unchanged)")


def train_attributes(args: argparse.Namespace) -> int:
    from sklearn.model_selection import StratifiedKFold, cross_val_score, train_test_split

    if args.folds < 2 or not 0 < args.test_size < 1 or args.c <= 0:
        raise ConfigError(f"--folds {args.folds}, --test-size {args.test_size}, --c {args.c}: --folds must be 2 or "
                          "more, --test-size in (0, 1) and --c positive")
    check_out_file(args.out)
    if not args.data.is_file():
        raise ConfigError(f"--data {args.data} not found (give a CRAG-format .jsonl or .jsonl.bz2)")
    check_data_file(args.data)
    if args.icl:
        load_config(args.config)  # a config that cannot load fails now, not after the SVMs
    rows = read_labelled(args.data, data_lines(args.data))  # .jsonl, .jsonl.bz2 or an archive
    check_rows(rows, args.data, args.folds)
    embedder = Embedder(EmbedderConfig())
    vectors = embedder.encode([row["query"] for row in rows])
    domains = [row["domain"] for row in rows]
    dynamism = [row["static_or_dynamic"] for row in rows]
    print(f"{len(rows)} questions from {args.data}; embeddings: {embedder.name}")

    for name, labels in (("domain", domains), ("dynamism", dynamism)):
        folds = StratifiedKFold(n_splits=args.folds, shuffle=True, random_state=args.seed)
        scores = cross_val_score(svm_classifier(args.c), vectors, labels, cv=folds)
        print(
            f"cross-validated SVM accuracy, {name:8s}: {scores.mean():.3f} (+/- {scores.std():.3f}, {args.folds} folds)"
        )

    index = list(range(len(rows)))
    train, test = train_test_split(index, test_size=args.test_size, random_state=args.seed,
                                   stratify=_strata(domains, dynamism, args.test_size))
    held_out = SVMAttributes.train(vectors[train], [domains[i] for i in train], [dynamism[i] for i in train],
                                   embedder.name, args.c)
    predicted = held_out.predict(vectors[test])
    gold_domain, gold_dynamism = [domains[i] for i in test], [dynamism[i] for i in test]
    print(f"held-out split ({len(test)} questions):")
    print(f"  SVM  domain {accuracy([p[0] for p in predicted], gold_domain):.3f}  "
          f"dynamism {accuracy([p[1] for p in predicted], gold_dynamism):.3f}")
    if args.icl:
        try:
            icl = icl_predictions([rows[i] for i in train], [rows[i] for i in test], args.config)
        except (ConfigError, BackendUnavailable) as err:
            print(f"error: ICL: {err}", file=sys.stderr)
            return 2
        print(f"  ICL  domain {accuracy([p[0] for p in icl], gold_domain):.3f}  "
              f"dynamism {accuracy([p[1] for p in icl], gold_dynamism):.3f}")

    model = SVMAttributes.train(vectors, domains, dynamism, embedder.name, args.c)
    model.save(args.out)
    print(f"model trained on all {len(rows)} questions: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
