"""Judge calibration: how often a judge agrees with a person on data/judge/calibration.jsonl, so a user can see
whether a cheaper judge model is good enough before trusting its scores."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from evaluation.data import DataError
from evaluation.judge import CORRECT, MISS, UNCERTAIN, UNJUDGED, VERDICTS, WRONG, LLMJudge, judge_records
from models.config import REPO_ROOT

CALIBRATION_SET = REPO_ROOT / "data" / "judge" / "calibration.jsonl"
HUMAN = {"correct": CORRECT, "incorrect": WRONG, "miss": MISS}


def load_set(path: Path = CALIBRATION_SET) -> list[dict[str, Any]]:
    """The triples with their human verdict; a DataError naming the line of one that is not usable."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows.append({**row, "human": HUMAN[row["human"]], "alt_answers": row.get("alt_answers") or []})
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(f"{path}:{number}: not a calibration row ({err}); each line needs query, answer, "
                             f"prediction and human ({', '.join(HUMAN)})") from None
    return rows


def calibrate(judge: LLMJudge | None, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Agreement with the human verdicts, overall and by kind, for our column and the organisers', and the
    confusion matrix of ours (human verdict -> judge verdict -> count)."""
    judge_records(rows, judge)
    result: dict[str, Any] = {"n": len(rows)}
    for column in ("verdict", "organisers_verdict"):
        agree = [r[column] == r["human"] for r in rows]
        by_kind: dict[str, list[bool]] = defaultdict(list)
        for row, same in zip(rows, agree):
            by_kind[str(row.get("kind") or "other")].append(same)
        result[column] = {"agreement": sum(agree) / len(rows) if rows else 0.0,
                          "by_kind": {k: sum(v) / len(v) for k, v in sorted(by_kind.items())},
                          "unjudged": sum(r[column] == UNJUDGED for r in rows)}
    matrix = Counter((r["human"], r["verdict"]) for r in rows)
    result["confusion"] = {h: {v: matrix[(h, v)] for v in VERDICTS} for h in HUMAN.values()}
    result["disagreements"] = [r.get("id") for r in rows if r["verdict"] != r["human"]]
    rated = [r for r in rows if isinstance(r.get("judge_confidence"), float)]
    if rated:  # does the judge's own probability tell its right verdicts from its wrong ones?
        result["by_confidence"] = {
            band: {"n": len(group), "agreement": sum(r["verdict"] == r["human"] for r in group) / len(group)}
            for band, group in (("confident", [r for r in rated if r["judge_confidence"] >= UNCERTAIN]),
                                ("uncertain", [r for r in rated if r["judge_confidence"] < UNCERTAIN])) if group}
    return result


def format_calibration(result: dict[str, Any], judge_name: str) -> str:
    ours, theirs = result["verdict"], result["organisers_verdict"]
    lines = [f"judge {judge_name} on {result['n']} calibration triples: agreement with the person "
             f"{ours['agreement']:.0%} (organisers' rules with this judge: {theirs['agreement']:.0%}; "
             f"unjudged: {ours['unjudged']})",
             "by kind:" + "".join(f"  {k} {v:.0%}" for k, v in ours["by_kind"].items()),
             "confusion (rows: the person, columns: the judge):",
             f"  {'':<10}" + "".join(f"{v:>10}" for v in VERDICTS)]
    lines += [f"  {human:<10}" + "".join(f"{row[v]:>10}" for v in VERDICTS)
              for human, row in result["confusion"].items()]
    if result.get("by_confidence"):
        lines.append(f"by the judge's own probability (P(verdict) >= {UNCERTAIN}: confident):" + "".join(
            f"  {band} {v['agreement']:.0%} of {v['n']}" for band, v in result["by_confidence"].items()))
    if result["disagreements"]:
        lines.append("disagreements: " + ", ".join(map(str, result["disagreements"])))
    return "\n".join(lines)
