"""`calibrate`: a judge's agreement with a person on the calibration sets (evaluation/calibration.py)."""

from __future__ import annotations

from pathlib import Path

from evaluation.choices import JudgeChoice
from evaluation.data import DataError
from evaluation.judge import build_judge
from models.config import ConfigError


def calibrate(judge: JudgeChoice, calibration_sets: list[Path] | None = None) -> int:
    """`calibrate`: the judge's agreement with a person on each calibration set (default: both of data/judge/ and,
    where it is there, the labelled set of real answers), then its figures by part, and on the held-back part by the
    gold's form and by model, on each set and, for several, on all together; then the inputs of the correction of a
    run's score for this judge's errors."""
    from evaluation.calibration import (
        REAL_SET,
        SETS,
        annotator_agreement,
        by_group,
        by_part,
        calibration_for,
        disagreed,
        format_calibration,
        format_figures,
        held_back,
        load_set,
    )
    from evaluation.calibration import calibrate as agreement

    for path in calibration_sets or ():
        if not path.is_file():
            raise ConfigError(f"--set {path}: no such file; give a calibration set (.jsonl, as data/judge/)")
    loaded = []
    for path in calibration_sets or [*SETS, *([REAL_SET] if REAL_SET.is_file() else [])]:
        try:
            loaded.append((path, load_set(path)))
        except OSError as err:
            raise DataError(f"{path}: unreadable ({err})") from err
    built = build_judge(judge.spec, judge.model)
    name = built.name if built else "rules"
    table = []
    for path, rows in loaded:
        result = agreement(built, rows)
        print(format_calibration(result, name, path.name))
        if skipped := disagreed(path):
            print(f"skipped {skipped} rows whose annotators disagree (human: null)")
        if (ceiling := annotator_agreement(path)) is not None:
            print(f"the annotators agree with each other on {ceiling:.1%} of its rows: no judge can be measured "
                  "above that")
        print()
        table.append((path.name, {**result["parts"], **{
            f"held back, {group}": figures
            for group, figures in by_group([r for r in rows if held_back(str(r["query"]))]).items()}}))
    if len(loaded) > 1:
        table.append(("all sets", by_part([row for _, rows in loaded for row in rows])))
    print(format_figures(table, name))
    calibration, note = calibration_for(judge.spec, judge.model, judge.calibration)
    if calibration is None:
        print(note)
    else:
        counts = calibration.counts
        print(f"the correction of a run's score for this judge's errors (evaluation/correction.py) reads {note}: of "
              f"the person's correct answers the judge called {counts['correct_correct']} correct and "
              f"{counts['correct_wrong']} wrong (sensitivity {calibration.sensitivity:.3f}); of the person's "
              f"incorrect ones {counts['wrong_wrong']} wrong and {counts['wrong_correct']} correct (specificity "
              f"{calibration.specificity:.3f})")
    return 0
