"""R2AG's effect on answers, cross-fitted: no question is answered by an R2-Former that was trained on it.

`tools/train_r2former.py --folds K` trains one checkpoint a fold and writes NAME.folds.json (each fold's questions
and checkpoint). Here each fold's questions are answered by `local_evaluation.py ablate`: the config, and the config
with R2AG on and that fold's checkpoint (plus any --edits, e.g. r2ag.mode=prompt). The folds' rows are then pooled
question by question and set side by side, as `ablate` sets its rows: rates, score, the paired difference with its
95% interval, the corrected one, LLM calls and seconds per question. `--control` adds a row with each fold's
checkpoint, its projection zeroed: in prompt mode the same prompt and the same markers, every injected vector 0, so
that the trained vectors' effect stands apart from the prompt's.

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
CONTROL = "R2AG, vectors zeroed"
POOLED_CHECKPOINT = {ROW: "<each fold's own>", CONTROL: "<each fold's own, projection zeroed>"}


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


def zeroed(checkpoint: Path, out: Path) -> Path:
    """`checkpoint` with its projection's weights and bias 0 (the QDM head as trained), written to `out`; a
    one-line error for a checkpoint trained without --lm, which has no projection."""
    import torch

    from models.retrieval.r2former_head import load_checkpoint, save_checkpoint

    loaded = load_checkpoint(checkpoint)
    if loaded.model.projection is None:
        raise DataError(f"{checkpoint}: trained without --lm, it has no projection for --control to zero")
    with torch.no_grad():
        loaded.model.projection.weight.zero_()
        loaded.model.projection.bias.zero_()
    save_checkpoint(loaded.model, out, loaded.embedder, loaded.metrics, loaded.trained_with_lm)
    return out


def pooled(out: Path, folds: int) -> list[list[dict[str, Any]]]:
    """Each row's judged records over every fold (the base row's first), aligned question by question."""
    tables = [json.loads((out / f"fold{i}" / "ablation.json").read_text(encoding="utf-8")) for i in range(folds)]
    rows: list[list[dict[str, Any]]] = [[] for _ in tables[0]["rows"]]
    for table in tables:
        first, *others = (load_predictions(Path(row["folder"]) / PREDICTIONS) for row in table["rows"])
        rows[0].extend(first.values())
        for row, records in zip(rows[1:], others):
            row.extend(records[record["interaction_id"]] for record in first.values())
    return rows


@command
def main(argv: list[str] | None = None) -> int:
    from evaluation.ablation import ablate

    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=Path, required=True, help="NAME.folds.json of train_r2former.py --folds")
    parser.add_argument("--data", type=Path, required=True, help="the CRAG .jsonl the folds were trained on")
    add_config_arguments(parser)
    parser.add_argument("--edits", default="", help="more edits of the R2AG row, e.g. 'r2ag.mode=prompt'")
    parser.add_argument("--control", action="store_true",
                        help="also a row with each fold's checkpoint, its projection zeroed (prompt mode)")
    parser.add_argument("--serve-llm", action="store_true")
    parser.add_argument("--serve-kg", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "r2ag-effect")
    args = parser.parse_args(argv)
    check_out(args.out)
    folds = read_folds(args.folds)
    config = ConfigChoice(args.config, tuple(args.overlay), tuple(args.sets))
    names = [ROW, CONTROL] if args.control else [ROW]
    checkpoints = [[fold["checkpoint"]] for fold in folds]
    if args.control:
        for index, fold in enumerate(checkpoints):
            fold.append(zeroed(fold[0], args.out / f"fold{index}" / "zeroed.pt"))

    def variants(index: int) -> list[str]:
        return [f"{name}: +r2ag r2ag.checkpoint={path} {args.edits}".strip()
                for name, path in zip(names, checkpoints[index])]

    for index, path in enumerate(fold_data(args.data, folds, args.out)):
        print(f"fold {index + 1}/{len(folds)}: {path}", file=sys.stderr)
        code = ablate(config, path, variants(index), out=args.out / f"fold{index}", serve_kg=args.serve_kg,
                      serve_llm=args.serve_llm)
        if code:
            return code
    judged = pooled(args.out, len(folds))
    # the pooled rows are built from the first fold's variants; each fold's own are in its ablation-manifest.json
    rows = build_variants(variants(0), lambda sets: load_config(config.path, config.overlays,
                                                                [*config.sets, *sets]), False, args.serve_llm)
    ablation = Ablation(rows, args.data, judged[0], JudgeChoice(), args.out, False)
    for row, records in zip(rows, judged):
        ablation.folder(row).mkdir(parents=True, exist_ok=True)
        write_atomic(ablation.folder(row) / PREDICTIONS, "".join(json_line(record) for record in records))
    table = tabulate(ablation, judged) | {"folds": [str(args.out / f"fold{i}") for i in range(len(folds))]}
    for row, name in zip(table["rows"][1:], names):
        row["edits"] = [f"+r2ag r2ag.checkpoint={POOLED_CHECKPOINT[name]} {args.edits}".strip()]
    text = format_table(table)
    write_atomic(args.out / "ablation.json", json.dumps(table, indent=2, ensure_ascii=False, default=str) + "\n")
    write_atomic(args.out / "ablation.md", f"# R2AG cross-fitted over {len(folds)} folds of {args.data.name}\n\n"
                                           f"{text}")
    print(text)
    print(f"written: {args.out / 'ablation.md'}, ablation.json; each fold's ablation under {args.out}/foldI")
    return 0


if __name__ == "__main__":
    sys.exit(main())
