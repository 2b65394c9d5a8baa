"""`calibrate`: a judge's agreement with a person on the calibration sets (evaluation/calibration.py)."""

from __future__ import annotations

from pathlib import Path

from evaluation.choices import JudgeChoice
from evaluation.data import DataError
from evaluation.judge import build_judge
from models.config import ConfigError


def calibrate(judge: JudgeChoice, calibration_sets: list[Path] | None = None) -> int:
    """`calibrate`: the judge's agreement with a person on each calibration set (default: both of data/judge/),
    then its figures by part (`evaluation.calibration.figures`) on each set and, for several, on all together."""
    from evaluation.calibration import SETS, by_part, format_calibration, format_figures, load_set
    from evaluation.calibration import calibrate as agreement

    for path in calibration_sets or ():
        if not path.is_file():
            raise ConfigError(f"--set {path}: no such file; give a calibration set (.jsonl, as data/judge/)")
    loaded = []
    for path in calibration_sets or SETS:
        try:
            loaded.append((path, load_set(path)))
        except OSError as err:
            raise DataError(f"{path}: unreadable ({err})") from err
    built = build_judge(judge.spec, judge.model)
    name = built.name if built else "rules"
    table = []
    for path, rows in loaded:
        result = agreement(built, rows)
        print(format_calibration(result, name, path.name) + "\n")
        table.append((path.name, result["parts"]))
    if len(loaded) > 1:
        table.append(("all sets", by_part([row for _, rows in loaded for row in rows])))
    print(format_figures(table, name))
    return 0
