"""`compare A B`: run B against run A on the questions both answered, with the paired interval and the flipped
questions (evaluation/compare.py)."""

from __future__ import annotations

from pathlib import Path

from evaluation import manifest
from evaluation.choices import Filters, JudgeChoice, check_range
from evaluation.judge import build_judge, judge_records
from evaluation.runner import EvaluationError, load_predictions
from utils.cli import check_out


def corrected_comparison(a: list[dict], b: list[dict], judge: JudgeChoice) -> dict:
    """The paired difference of the two runs' scores corrected for the judge's errors, over the questions both have
    ("corrected"), or why there is none ("calibration_note")."""
    from evaluation.calibration import calibration_for, judged_by_judge
    from evaluation.correction import corrected_difference

    calibration, note = calibration_for(judge.spec, judge.model, judge.calibration)
    if calibration is None:
        return {"calibration_note": note}
    by_id = {r.get("interaction_id"): r for r in b}
    pairs = [(r, by_id[r.get("interaction_id")]) for r in a if r.get("interaction_id") in by_id]
    first, second = (([str(r.get("verdict")) for r in side], judged_by_judge(side))
                     for side in ([pair[0] for pair in pairs], [pair[1] for pair in pairs]))
    return {"corrected": corrected_difference(first, second, calibration), "calibration_note": note}


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
    result.update(corrected_comparison(runs[0][0], runs[1][0], judge))
    print(format_comparison(result, str(a), str(b), show))
    written = write_comparison(result, out or b, str(a), str(b))
    print(f"comparison: {written[0]}; open {written[1]} in a browser to filter and read the flipped questions")
    return 0
