"""What the batch deadline cut, read from the records' `deadline_cuts` (models/state.py QueryState): how many of a
run's answers it shaped and where, and how many of a comparison's flips it had a hand in.

A setup that is slower than another loses answers to the clock, not to its modules: a flip whose one side the
deadline cut says more of the time each question got than of the change being compared. A record from a run
made before the cuts were recorded has no such key; it counts as unrecorded, never as uncut.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from evaluation.record import Record


def run_cuts(records: list[Record]) -> dict[str, Any] | None:
    """The answers the deadline cut, of those that recorded cuts, and each cut's count; None where none did."""
    cuts = [c for r in records if (c := r.deadline_cuts) is not None]
    if not cuts:
        return None
    return {"answers": sum(map(bool, cuts)), "recorded": len(cuts),
            "by_cut": dict(Counter(c for found in cuts for c in found).most_common())}


def flips_cut(flips: list[dict[str, Any]]) -> dict[str, int] | None:
    """Of the flipped questions (compare's rows, each with both sides' `deadline_cuts`) whose two runs recorded
    cuts, how many had the deadline cut one side; None where there are flips and none has both sides' cuts (no
    flip at all counts 0 of 0)."""
    recorded = [row for row in flips if None not in row["deadline_cuts"]]
    if flips and not recorded:
        return None
    return {"flips": len(recorded), "cut": sum(any(row["deadline_cuts"]) for row in recorded)}


def deadline_lines(summary: dict[str, Any], show: int = 5) -> list[str]:
    """A run's answers the deadline cut, and where; no line where no answer recorded its cuts."""
    cuts = summary.get("deadline_cuts")
    if not cuts:
        return []
    unrecorded = summary["overall"]["total"] - cuts["recorded"]
    lines = [f"answers the batch deadline cut short somewhere: {cuts['answers']} of {cuts['recorded']}"
             + (f" ({unrecorded} answered before cuts were recorded)" if unrecorded else "")]
    return lines + [f"  {count:>5}  {where}" for where, count in list(cuts["by_cut"].items())[:show]]


def flips_cut_line(result: dict[str, Any]) -> str | None:
    """How many of a comparison's flips had the deadline cut one side's work; None where none recorded cuts."""
    counted = result.get("flips_cut")
    if not counted or not counted["flips"]:
        return None
    return (f"of {counted['flips']} flipped questions, {counted['cut']} had the batch deadline cut one side's work "
            "(those are the clock's as much as the change's: each flip's deadline_cuts in compare.json says where)")


def deadline_cell(entry: dict[str, Any]) -> str:
    """An ablation row's answers the deadline cut, of those that recorded cuts ("-" where none did)."""
    cuts = entry.get("deadline_cuts")
    return f"{cuts['answers']} of {cuts['recorded']}" if cuts else "-"


def flips_cut_cell(difference: dict[str, Any] | None) -> str:
    """An ablation row's flips the deadline cut one side of, of its flips that recorded cuts ("-" where none)."""
    counted = (difference or {}).get("flips_cut")
    return f"{counted['cut']} of {counted['flips']}" if counted else "-"
