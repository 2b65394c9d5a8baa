"""Two runs on the same questions: the score difference with a paired bootstrap interval, and what flipped.

Each question scores +1 (correct), 0 ("i don't know") or -1 (wrong) in each run; the difference of the two
scores is the mean of the per-question differences, and its interval resamples questions with both their
verdicts (a paired bootstrap), so it is much narrower than two separate intervals would suggest. Unjudged
predictions in either run leave the question out of the difference (counted).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from evaluation.deadline_cuts import flips_cut, flips_cut_line
from evaluation.html_report import compare_html, write_html
from evaluation.metrics import MIN_FOR_INTERVAL, paired_difference
from evaluation.record import records_of
from evaluation.verdicts import CORRECT, MISS, WRONG

# How a question moved from run A to run B, by its two verdicts.
FLIPS = {(CORRECT, WRONG): "correct -> wrong", (WRONG, CORRECT): "wrong -> correct",
         (CORRECT, MISS): "answer -> i don't know", (WRONG, MISS): "answer -> i don't know",
         (MISS, CORRECT): "i don't know -> answer", (MISS, WRONG): "i don't know -> answer"}


def compare_records(lines_a: list[dict[str, Any]], lines_b: list[dict[str, Any]]) -> dict[str, Any]:
    """Judged records of two runs (each has "verdict"), matched by interaction_id: the paired difference over
    the questions both answered, the flipped questions by kind, and the questions only one run has."""
    a, b = records_of(lines_a), records_of(lines_b)
    by_id = {r.interaction_id: r for r in b}
    common = [(r, by_id[r.interaction_id]) for r in a if r.interaction_id in by_id]
    flipped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ra, rb in common:
        kind = FLIPS.get((ra.scored_verdict, rb.scored_verdict))
        if kind:
            flipped[kind].append({"interaction_id": ra.interaction_id, "query": ra.query, "answer": ra.answer,
                                  "alt_answers": ra.alt_answers or [], "domain": ra.domain,
                                  "question_type": ra.question_type, "a": ra.prediction, "b": rb.prediction,
                                  "verdicts": [ra.verdict, rb.verdict], "reasons": [ra.reason, rb.reason],
                                  "deadline_cuts": [ra.deadline_cuts, rb.deadline_cuts]})
    only_a = len(a) - len(common)
    cut = flips_cut([row for rows in flipped.values() for row in rows])
    return {**paired_difference([ra.scored_verdict for ra, _ in common], [rb.scored_verdict for _, rb in common]),
            "flipped": {kind: flipped[kind] for kind in dict.fromkeys(FLIPS.values()) if flipped[kind]},
            **({"flips_cut": cut} if cut else {}),
            "only_in_a": only_a, "only_in_b": len(b) - len(common)}


def format_comparison(result: dict[str, Any], name_a: str, name_b: str, show: int = 10) -> str:
    ci = result["ci95"]
    interval = f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else f"n<{MIN_FOR_INTERVAL}"
    verdict = ("" if not ci else " (the interval holds 0: no difference shown)" if ci[0] <= 0 <= ci[1]
               else " (the interval excludes 0)")
    lines = [f"A: {name_a}\nB: {name_b}",
             f"{result['questions']} questions judged in both: score A {result['score_a']:.3f}, "
             f"B {result['score_b']:.3f}, B - A {result['difference']:+.3f}, paired 95% CI {interval}{verdict}"]
    if fixed := result.get("corrected"):
        ci = fixed["ci95"]
        bounds = f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else f"n<{MIN_FOR_INTERVAL}"
        lines.append(f"corrected for the judge's errors: A {fixed['score_a']:.3f}, B {fixed['score_b']:.3f}, B - A "
                     f"{fixed['difference']:+.3f}, paired 95% CI {bounds} (calibration: {fixed['calibration']})")
    elif result.get("calibration_note"):
        lines.append(result["calibration_note"])
    if cut := flips_cut_line(result):
        lines.append(cut)
    if result["unjudged_left_out"]:
        lines.append(f"left out: {result['unjudged_left_out']} questions unjudged in A or B")
    if result["only_in_a"] or result["only_in_b"]:
        lines.append(f"not compared: {result['only_in_a']} questions only in A, {result['only_in_b']} only in B")
    for kind, rows in result["flipped"].items():
        lines.append(f"{kind}: {len(rows)}")
        for row in rows[:show]:
            lines.append(f"  {row['interaction_id'][:8]}  {str(row['query'])[:60]!r}  gold {str(row['answer'])[:30]!r}"
                         f"\n      A: {str(row['a'])[:70]!r}\n      B: {str(row['b'])[:70]!r}")
        if len(rows) > show:
            lines.append(f"  ... {len(rows) - show} more in compare.json")
    return "\n".join(lines)


def write_comparison(result: dict[str, Any], out_dir: Path, name_a: str, name_b: str) -> list[Path]:
    """compare.json and compare.html in out_dir; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "compare.json"
    path.write_text(json.dumps({"a": name_a, "b": name_b, **result}, indent=2, ensure_ascii=False),
                    encoding="utf-8")
    return [path, write_html(compare_html(result, name_a, name_b), out_dir / "compare.html")]
