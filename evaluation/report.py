"""Score table: overall and per domain / question type; written as summary.json beside the predictions."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from evaluation.metrics import Scores, judge_by_rules


def score_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, dict[str, list[str]]] = {"domain": defaultdict(list), "question_type": defaultdict(list)}
    verdicts = []
    for record in records:
        verdict = judge_by_rules(record["prediction"], record["answer"], record.get("alt_answers") or [])
        record["verdict"] = verdict
        verdicts.append(verdict)
        for key, buckets in groups.items():
            buckets[str(record.get(key) or "unknown")].append(verdict)
    return {"overall": Scores.of(verdicts).as_dict(),
            **{f"by_{key}": {name: Scores.of(v).as_dict() for name, v in sorted(buckets.items())}
               for key, buckets in groups.items()}}


def format_table(summary: dict[str, Any]) -> str:
    header = f"{'':<24}{'n':>5}{'score':>9}{'accuracy':>10}{'halluc.':>9}{'missing':>9}"
    lines = [header, "-" * len(header)]

    def row(name: str, s: dict[str, Any]) -> str:
        return (f"{name:<24}{s['total']:>5}{s['score']:>9.3f}{s['accuracy']:>10.3f}"
                f"{s['hallucination']:>9.3f}{s['missing']:>9.3f}")

    lines.append(row("overall", summary["overall"]))
    for section in ("by_domain", "by_question_type"):
        lines.append(f"{section.replace('_', ' ')}:")
        lines.extend(row(f"  {name}", s) for name, s in summary[section].items())
    return "\n".join(lines)


def write_summary(summary: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return path
