"""benchmarks/finetune.py's arithmetic: a table row against the base on the same questions, the over-refusal count,
and the fold files every question lands in once."""

from __future__ import annotations

import json

from benchmarks.finetune import fold_file, row
from evaluation.judge import CORRECT, MISS, UNJUDGED, WRONG
from training.judged_data import fold_of


def test_a_row_counts_against_the_base_on_the_same_questions():
    base = {"a": CORRECT, "b": CORRECT, "c": WRONG, "d": WRONG, "e": MISS}
    tuned = {"a": CORRECT, "b": MISS, "c": MISS, "d": CORRECT, "e": WRONG}
    line = row("tuned", base, tuned, right_dev=2)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:6] == ["tuned", "5", "3", "2", "1", "+0.200"]  # answered a, d, e: 2 right, 1 wrong
    assert cells[6].startswith("+0.200")  # base scores 0.0 (2 right, 2 wrong), tuned +0.2
    assert cells[7] == "1/2"  # of the base's two right answers, one declined
    assert cells[8] == "2"
    # a question the tuned runs lack is unjudged, left out of the paired difference
    partial = [c.strip() for c in row("t", base, {"a": CORRECT}).strip("|").split("|")]
    assert partial[2:5] == ["1", "1", "0"]
    assert UNJUDGED not in partial


def test_each_question_lands_in_one_fold_file(tmp_path):
    data = tmp_path / "set.jsonl"
    ids = [f"q{i}" for i in range(20)]
    data.write_text("".join(json.dumps({"interaction_id": i, "query": i}) + "\n" for i in ids))
    found = []
    for fold in range(2):
        path = fold_file(data, fold, 2, tmp_path / "folds" / f"{fold}.jsonl")
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert all(fold_of(r["interaction_id"], 2) == fold for r in rows)
        found += [r["interaction_id"] for r in rows]
    assert sorted(found) == sorted(ids)
