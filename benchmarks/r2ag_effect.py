"""R2AG's effect on answers, cross-fitted: no question is answered by an R2-Former that was trained on it.

`tools/train_r2former.py --folds K` trains one checkpoint a fold and writes NAME.folds.json (each fold's questions
and checkpoint). Here each fold's questions are answered by `local_evaluation.py ablate`: the config, and the config
with R2AG on and that fold's checkpoint (plus any --edits, e.g. r2ag.mode=prompt). The folds' rows are then pooled
question by question and set side by side, as `ablate` sets its rows: rates, score, the paired difference with its
95% interval, the corrected one, LLM calls and seconds per question.

    python tools/train_r2former.py --data data/gate_dev.jsonl --folds 4 --out runs/r2former/gate.pt
    python -m benchmarks.r2ag_effect --folds runs/r2former/gate.folds.json --data data/gate_dev.jsonl \\
        --overlay configs/overlays/vllm-cpu.yaml --serve-llm --out runs/r2ag-effect

Each fold's ablation (its rows' run folders, its gated lines) is under OUT/foldI; the pooled table is OUT/ablation.md
and ablation.json. A rerun reads back every fold's finished rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from evaluation.ablation import PREDICTIONS, Ablation, format_table, tabulate
from evaluation.ablation_rows import build_variants
from evaluation.choices import ConfigChoice, JudgeChoice
from evaluation.data import DataError, read_examples
from evaluation.runner import load_predictions
from models.config import REPO_ROOT
from models.config.loader import add_config_arguments
from models.loading import load_config
from utils.cli import CommandParser, check_out, command
from utils.durable_io import json_line, write_atomic

ROW = "R2AG"


def read_folds(path: Path) -> list[dict[str, Any]]:
    """The folds of a NAME.folds.json, each checkpoint resolved beside it; a one-line error where one is missing."""
    try:
        folds = json.loads(path.read_text(encoding="utf-8"))["folds"]
        resolved = [{"ids": set(fold["interaction_ids"]), "checkpoint": path.parent / fold["checkpoint"]}
                    for fold in folds]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise DataError(f"{path}: not a folds file of tools/train_r2former.py --folds ({err})") from err
    for fold in resolved:
        if not fold["checkpoint"].exists():
            raise DataError(f"{path}: its checkpoint {fold['checkpoint']} is missing; train the folds again")
    return resolved


def fold_data(data: Path, folds: list[dict[str, Any]], out: Path) -> list[Path]:
    """OUT/foldI/questions.jsonl: each fold's questions of `data`, in the data's order."""
    lines = {i: [] for i in range(len(folds))}
    for example in read_examples(data, quiet=True):
        for index, fold in enumerate(folds):
            if example["interaction_id"] in fold["ids"]:
                lines[index].append(json_line(example))
    if not any(lines.values()):
        raise DataError(f"{data}: none of its questions is in the folds; give the data the folds were trained on")
    paths = []
    for index, chunk in lines.items():
        (out / f"fold{index}").mkdir(parents=True, exist_ok=True)
        paths.append(write_atomic(out / f"fold{index}" / "questions.jsonl", "".join(chunk)))
    return paths


def pooled(out: Path, folds: int) -> list[list[dict[str, Any]]]:
    """The base row's and the R2AG row's judged records over every fold, aligned question by question."""
    base: list[dict[str, Any]] = []
    with_r2ag: list[dict[str, Any]] = []
    for index in range(folds):
        table = json.loads((out / f"fold{index}" / "ablation.json").read_text(encoding="utf-8"))
        first, second = (load_predictions(Path(row["folder"]) / PREDICTIONS) for row in table["rows"])
        base.extend(first.values())
        with_r2ag.extend(second[record["interaction_id"]] for record in first.values())
    return [base, with_r2ag]


@command
def main(argv: list[str] | None = None) -> int:
    from evaluation.ablation import ablate

    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=Path, required=True, help="NAME.folds.json of train_r2former.py --folds")
    parser.add_argument("--data", type=Path, required=True, help="the CRAG .jsonl the folds were trained on")
    add_config_arguments(parser)
    parser.add_argument("--edits", default="", help="more edits of the R2AG row, e.g. 'r2ag.mode=prompt'")
    parser.add_argument("--serve-llm", action="store_true")
    parser.add_argument("--serve-kg", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "r2ag-effect")
    args = parser.parse_args(argv)
    check_out(args.out)
    folds = read_folds(args.folds)
    config = ConfigChoice(args.config, tuple(args.overlay), tuple(args.sets))
    for index, path in enumerate(fold_data(args.data, folds, args.out)):
        variant = f"{ROW}: +r2ag r2ag.checkpoint={folds[index]['checkpoint']} {args.edits}".strip()
        print(f"fold {index + 1}/{len(folds)}: {path}", file=sys.stderr)
        code = ablate(config, path, [variant], out=args.out / f"fold{index}", serve_kg=args.serve_kg,
                      serve_llm=args.serve_llm)
        if code:
            return code
    judged = pooled(args.out, len(folds))
    # the pooled R2AG row is built from the first fold's variant; each fold's own is in its ablation-manifest.json
    first = f"{ROW}: +r2ag r2ag.checkpoint={folds[0]['checkpoint']} {args.edits}".strip()
    rows = build_variants([first], lambda sets: load_config(config.path, config.overlays, [*config.sets, *sets]),
                          False, args.serve_llm)
    ablation = Ablation(rows, args.data, judged[0], JudgeChoice(), args.out, False)
    for row, records in zip(rows, judged):
        ablation.folder(row).mkdir(parents=True, exist_ok=True)
        write_atomic(ablation.folder(row) / PREDICTIONS, "".join(json_line(record) for record in records))
    table = tabulate(ablation, judged) | {"folds": [str(args.out / f"fold{i}") for i in range(len(folds))]}
    table["rows"][1]["edits"] = [f"+r2ag r2ag.checkpoint=<each fold's own> {args.edits}".strip()]
    text = format_table(table)
    write_atomic(args.out / "ablation.json", json.dumps(table, indent=2, ensure_ascii=False, default=str) + "\n")
    write_atomic(args.out / "ablation.md", f"# R2AG cross-fitted over {len(folds)} folds of {args.data.name}\n\n"
                                           f"{text}")
    print(text)
    print(f"written: {args.out / 'ablation.md'}, ablation.json; each fold's ablation under {args.out}/foldI")
    return 0


if __name__ == "__main__":
    sys.exit(main())
