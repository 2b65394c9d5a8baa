"""`compare A B`: run B against run A on the questions both answered, with the paired interval and the flipped
questions (evaluation/compare.py)."""

from __future__ import annotations

from pathlib import Path

from evaluation import manifest
from evaluation.choices import Filters, JudgeChoice, check_range
from evaluation.judge import build_judge, judge_records
from evaluation.runner import EvaluationError, load_predictions
from utils.cli import check_out


def compare(a: Path, b: Path, filters: Filters = Filters(), judge: JudgeChoice = JudgeChoice(),
            out: Path | None = None, show: int = 10) -> int:
    """`compare A B`: run B against run A on the selected questions both answered (same data file)."""
    from evaluation.compare import compare_records, format_comparison, write_comparison

    check_range("--show", show, lambda v: v >= 0, "give 0 or more questions to print per kind")
    if out is not None:
        check_out(out)
    selection = filters.selection()
    runs = []
    for folder in (a, b):
        predictions = folder / "predictions.jsonl"
        if not predictions.exists():
            raise EvaluationError(f"{predictions} does not exist; give run folders of local_evaluation.py")
        records = [r for r in load_predictions(predictions).values() if selection.keeps(r)]
        if not records:
            raise EvaluationError(f"the selection keeps no question of {predictions}; check --domain, "
                                  "--question-type, --static-or-dynamic and --split")
        runs.append((records, manifest.load(folder)))
    data = [(m or {}).get("answers", {}).get("data", {}) for _, m in runs]
    if all(data) and data[0].get("sha256") != data[1].get("sha256"):
        raise EvaluationError(f"{a} ran on {data[0].get('name')} and {b} on {data[1].get('name')} "
                              "(different data files): compare runs of the same questions")
    built = build_judge(judge.spec, judge.model)
    for records, _ in runs:
        judge_records(records, built)
    result = compare_records(runs[0][0], runs[1][0])
    print(format_comparison(result, str(a), str(b), show))
    written = write_comparison(result, out or b, str(a), str(b))
    print(f"comparison: {written[0]}; open {written[1]} in a browser to filter and read the flipped questions")
    return 0
