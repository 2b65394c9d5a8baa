"""Bootstrap intervals and the unjudged score range in the report."""

import json

import pytest

from evaluation.judge import judge_records
from evaluation.metrics import intervals
from evaluation.report import format_markdown, format_table, score_records, write_report
from evaluation.verdicts import CORRECT, MISS, UNJUDGED, WRONG

VERDICTS = [CORRECT] * 9 + [WRONG] * 5 + [MISS] * 6  # score 0.2 on 20 questions


def width(ci):
    return ci["score"][1] - ci["score"][0]


def test_four_times_the_questions_halve_the_interval():
    ratio = width(intervals(VERDICTS * 4)) / width(intervals(VERDICTS))
    assert 0.4 <= ratio <= 0.6  # the width shrinks as 1/sqrt(n)


def test_an_interval_holds_its_point_and_is_reproducible():
    ci = intervals(VERDICTS)
    assert ci["score"][0] < 0.2 < ci["score"][1] and ci["accuracy"][0] < 0.45 < ci["accuracy"][1]
    assert ci == intervals(VERDICTS) and ci != intervals(VERDICTS, seed=1)


def test_degenerate_and_small_groups():
    assert intervals([CORRECT] * 12) == {"score": [1.0, 1.0], "accuracy": [1.0, 1.0], "hallucination": [0.0, 0.0]}
    assert intervals([CORRECT] * 9) is None


def _records(verdicts, domain="movie"):
    return [{"query": f"q{i}", "answer": "paris", "prediction": {CORRECT: "paris", WRONG: "lyon", MISS: "i don't know",
                                                                 UNJUDGED: "lyon"}[v], "domain": domain}
            for i, v in enumerate(verdicts)]


def test_the_report_carries_intervals_everywhere_and_says_n_under_10(tmp_path):
    records = _records(VERDICTS) + _records([CORRECT] * 9, domain="music")
    judge_records(records, None)
    summary = score_records(records)
    assert summary["overall"]["ci95"]["score"][0] < summary["overall"]["score"] < summary["overall"]["ci95"]["score"][1]
    assert summary["by_domain"]["movie"]["ci95"] is not None and summary["by_domain"]["music"]["ci95"] is None
    assert "ci95" in summary["organisers"]["overall"]
    table = format_table(summary)
    music = next(line for line in table.splitlines() if line.strip().startswith("music"))
    assert "n<10" in music and "score 95% CI" in table
    write_report(summary, records, tmp_path, "t")
    saved = json.loads((tmp_path / "report.json").read_text())
    for scores in (saved["overall"], saved["by_domain"]["movie"], saved["organisers"]["overall"],
                   saved["organisers"]["by_domain"]["movie"]):
        assert set(scores["ci95"]) == {"score", "accuracy", "hallucination"}
    assert saved["by_domain"]["music"]["ci95"] is None and saved["organisers"]["by_domain"]["music"]["ci95"] is None
    assert "score 95% CI" in (tmp_path / "report.md").read_text()


def test_unjudged_predictions_bound_the_score():
    records = _records([CORRECT] * 6 + [WRONG] * 2 + [MISS] * 2)
    judge_records(records, None)
    records[-1].update(verdict=UNJUDGED, judged_by="none")  # as a judge that failed on it leaves it
    records[-2].update(verdict=UNJUDGED, judged_by="none")
    summary = score_records(records)
    assert summary["overall"]["score_range"] == pytest.approx([0.2, 0.6])
    assert "ours: 20.0% unjudged; the score lies between 0.200 (all of them wrong) and 0.600" in format_table(summary)
    assert "the score lies between 0.200" in format_markdown(summary, "t")
