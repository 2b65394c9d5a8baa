"""Fit the facts judge (evaluation/facts_judge.py) on person verdicts and write its file (default
data/judge/facts.json): the development half of a labelled set of real answers (--set, the judge_real format:
query, answer, prediction, human) and of each of data/judge's sets, by question (evaluation/calibration.py
held_back); with --lockbox, the held-back half of --set judged once by the fitted model, its figures and its
confusion counts recorded too. Prints the figures of the nested cross-validation beside contains'.

    python tools/fit_judge.py --set PATH/answers.jsonl --lockbox
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluation.calibration import REAL_SET, format_figures, held_back, load_set
from evaluation.facts_judge import MODEL_FILE
from evaluation.judge_fit import development_sets, fit_file
from models.config import ConfigError
from utils.cli import check_out_file, command
from utils.durable_io import write_atomic


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", type=Path, default=REAL_SET, help="the labelled set of real answers (.jsonl)")
    parser.add_argument("--lockbox", action="store_true",
                        help="judge the held-back half of --set once, after the fit, and record its figures")
    parser.add_argument("--out", type=Path, default=MODEL_FILE, help="the judge file to write")
    args = parser.parse_args(argv)
    if not args.set.is_file():
        raise ConfigError(f"--set {args.set}: no such file; give a labelled set of real answers (.jsonl with query, "
                          "answer, prediction and human)")
    check_out_file(args.out)
    real = load_set(args.set)
    development = development_sets(real, args.set.name)
    lockbox = [r for r in real if held_back(r["query"])] if args.lockbox else None
    result = fit_file(development, lockbox)
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    table = []
    for name, judges in result["folds"]["by_set"].items():
        for judge in ("facts", "contains"):
            table.append((f"{name} ({judge})", {f"folds {k}": v for k, v in judges[judge].items()}))
    if "lockbox" in result:
        for judge in ("facts", "contains"):
            table.append((f"{args.set.name} ({judge})",
                          {f"lockbox {k}": v for k, v in result["lockbox"][judge].items()}))
    print(format_figures(table, "facts, out of fold, and contains"))
    counts = result["calibration"]["counts"]
    print(f"wrote {args.out}: C {result['C']}, threshold {result['threshold']}, fit on {result['fit_on']['rows']} "
          f"rows ({result['fit_on']['open_rows']} left to the classifier by the exact and decisive rules); "
          f"correction counts ({result['calibration']['from']}): {counts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
