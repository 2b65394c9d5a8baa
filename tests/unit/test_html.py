"""report.html and compare.html as documents (the browser test, tests/integration/test_report_html.py, runs them)."""

import json

from bs4 import BeautifulSoup

from evaluation.html_report import compare_html, record_panel, report_html, score_chart
from evaluation.judge import judge_records
from evaluation.report import score_records

INJECTED = "</script><script>alert(1)</script>"


def records():
    rows = [{"interaction_id": f"q{i}", "query": f"question {i}?", "answer": "$1,234.50", "alt_answers": [],
             "domain": "finance" if i < 3 else "music", "question_type": "simple", "prediction": p,
             "trace": {"references": [{"page": "p", "kind": "text", "score": 0.5,
                                       "text": "it closed at 1234.50 usd" if i == 0 else "nothing here"}],
                       "kg_results": ["price: 1,234.50"] if i == 1 else []}}
            for i, p in enumerate(["$1,234.50", INJECTED, "i don't know", "no"])]
    judge_records(rows, None)
    return rows


def test_the_report_page_holds_a_row_and_a_record_per_question_and_no_markup_from_the_data():
    rows = records()
    page = report_html(score_records(rows), rows, "a <run>")
    document = BeautifulSoup(page, "html.parser")
    table_rows = document.select("#question-table tbody tr")
    assert [r.get("data-id") for r in table_rows] == ["q0", "q1", "q2", "q3"]
    assert [r.get("data-verdict") for r in table_rows] == ["correct", "wrong", "miss", "wrong"]
    assert len(document.select("script")) == 2 and document.title.string == "a <run>"
    payload = json.loads(document.select_one("#records").string)
    assert [p["id"] for p in payload] == ["q0", "q1", "q2", "q3"]
    assert INJECTED in table_rows[1].get_text() and INJECTED in json.dumps(payload)
    assert {o.get("value") for o in document.select("#filter-domain option")} == {"", "finance", "music"}


def test_a_record_marks_the_evidence_that_holds_the_gold_answer_as_attribution_reads_it():
    panels = {p["id"]: p for p in map(record_panel, records())}
    references = next(s for s in panels["q0"]["sections"] if s["title"].startswith("references"))
    assert references["items"][0]["gold"] is True  # "1234.50 usd" holds "$1,234.50" once folded
    assert next(s for s in panels["q1"]["sections"] if s["title"] == "Knowledge graph")["items"][0]["gold"] is True
    assert next(s for s in panels["q2"]["sections"] if s["title"].startswith("references"))["items"][0]["gold"] is False
    assert panels["q0"]["golds"] == ["$1,234.50"]


def test_groups_under_ten_questions_get_no_whisker():
    summary = score_records(records())
    chart = BeautifulSoup(score_chart("by domain", summary["by_domain"]), "html.parser")
    assert len(chart.select("rect.few")) == 2 and not chart.select("line.whisker")


def test_the_compare_page_lists_each_flipped_question():
    result = {"questions": 12, "unjudged_left_out": 0, "score_a": 0.1, "score_b": 0.2, "difference": 0.1,
              "ci95": [-0.1, 0.3], "only_in_a": 0, "only_in_b": 0,
              "flipped": {"wrong -> correct": [{"interaction_id": "q1", "query": "q?", "answer": "a", "a": INJECTED,
                                                "b": "a", "verdicts": ["wrong", "correct"], "domain": "music"}]}}
    document = BeautifulSoup(compare_html(result, "runs/a", "runs/b"), "html.parser")
    assert [r.get("data-kind") for r in document.select("#question-table tbody tr")] == ["wrong -> correct"]
    assert "the interval holds 0" in document.select_one("#summary").get_text()
    assert len(document.select("script")) == 2


def test_a_deadline_cut_shows_on_the_question_s_panel_and_a_comparison_s_count():
    rows = records()
    rows[2]["trace"]["deadline_cuts"] = ["reasoning: call cut", "kg: KG calls left unsent"]
    facts = {name: value for name, value, _ in record_panel(rows[2])["facts"]}
    assert facts["cut by the deadline"] == "reasoning: call cut, kg: KG calls left unsent"
    assert "cut by the deadline" not in {name for name, _, _ in record_panel(rows[0])["facts"]}
    flip = {"interaction_id": "q1", "query": "q?", "answer": "a", "a": "a", "b": "i don't know",
            "verdicts": ["correct", "miss"], "deadline_cuts": [[], ["reasoning: call cut"]]}
    result = {"questions": 12, "unjudged_left_out": 0, "score_a": 0.1, "score_b": 0.0, "difference": -0.1,
              "ci95": [-0.3, 0.1], "only_in_a": 0, "only_in_b": 0, "flipped": {"answer -> i don't know": [flip]},
              "flips_cut": {"flips": 1, "cut": 1}}
    document = BeautifulSoup(compare_html(result, "runs/a", "runs/b"), "html.parser")
    assert "of 1 flipped questions, 1 had the batch deadline cut" in document.select_one("#summary").get_text()
    (panel,) = json.loads(document.select_one("#records").string)
    assert ["B's deadline cuts", "reasoning: call cut", False] in panel["facts"]
    assert ["A's deadline cuts", "none", False] in panel["facts"]
