"""report.html and compare.html in a real headless Chromium (Debian's chromium and chromedriver, driven by
selenium): the page loads without console errors, the filters change the rows shown, a record opens with the
gold answer marked, and text from the data stays text."""

import json
import os

import pytest

from evaluation.compare import compare_records, write_comparison
from evaluation.judge import judge_records
from evaluation.report import score_records, write_report
from tests.conftest import SAMPLE
from tools.screenshot import NoBrowser, headless_chromium

INJECTED = "</script><script>window.injected = 1</script><b>bold</b>"


@pytest.fixture(scope="module")
def browser():
    try:
        with headless_chromium() as driver:
            yield driver
    except NoBrowser as err:
        if os.environ.get("CI"):  # CI installs the browser (`make browser`): its absence there is a failure
            pytest.fail(f"CI is set and there is no browser: {err}")
        pytest.skip(str(err))


def by_css(driver, selector):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def choose(driver, select_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(by_css(driver, f"#{select_id}")[0]).select_by_value(value)


def console_errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def shown_rows(driver) -> list:
    return [row for row in by_css(driver, "#question-table tbody tr") if row.is_displayed()]


def sample_records() -> list[dict]:
    """The 13 sample questions, every other one answered right; each has a reference, and the first three
    wrong ones hold the gold answer in it (so they are lost by generation)."""
    records = []
    for index, line in enumerate(SAMPLE.read_text().splitlines()):
        example = json.loads(line)
        gold = example["answer"]
        right = index % 2 == 1
        reference = f"A page says: {gold} is the answer." if index < 6 else "A page about something else."
        records.append({key: example.get(key) for key in ("interaction_id", "query", "answer", "domain",
                                                           "question_type", "static_or_dynamic")}
                       | {"alt_answers": [], "prediction": gold if right else ("i don't know" if index == 4
                                                                               else INJECTED),
                          "batch_seconds": 2.0, "batch_size": 1,
                          "trace": {"reason": "answered", "references": [
                              {"page": "page 1", "url": "https://example.org/1", "kind": "text", "score": 0.9,
                               "text": reference}], "kg_results": [f"get_price: {gold}"] if index == 2 else [],
                              "stages": [{"stage": "reasoning", "status": "ok", "seconds": 1.5, "note": ""}]}})
    judge_records(records, None)
    for record in records:
        if record["verdict"] != "correct":
            record["attribution"] = "generation" if "the answer" in record["trace"]["references"][0]["text"] \
                else "retrieval"
    return records


def test_report_html_filters_and_opens_a_record(browser, tmp_path):
    records = sample_records()
    write_report(score_records(records), records, tmp_path, "sample run")
    browser.get((tmp_path / "report.html").as_uri())
    assert console_errors(browser) == []
    assert browser.execute_script("return window.injected") is None  # the data's markup stayed text
    assert len(shown_rows(browser)) == len(records)
    assert by_css(browser, "#shown")[0].text == f"{len(records)} of {len(records)} questions shown"
    assert len(by_css(browser, "#charts svg")) == 2

    domain = records[0]["domain"]
    choose(browser, "filter-domain", domain)
    in_domain = [r for r in records if r["domain"] == domain]
    assert 0 < len(shown_rows(browser)) == len(in_domain) < len(records)
    assert {row.get_attribute("data-domain") for row in shown_rows(browser)} == {domain}
    choose(browser, "filter-domain", "")
    choose(browser, "filter-verdict", "wrong")
    assert len(shown_rows(browser)) == sum(r["verdict"] == "wrong" for r in records)
    choose(browser, "filter-attribution", "generation")
    both = [r for r in records if r["verdict"] == "wrong" and r.get("attribution") == "generation"]
    assert len(shown_rows(browser)) == len(both) > 0
    assert by_css(browser, "#shown")[0].text == f"{len(both)} of {len(records)} questions shown"

    target = both[0]
    shown_rows(browser)[0].click()
    dialog = by_css(browser, "#record")[0]
    assert browser.execute_script("return document.getElementById('record').open") is True
    assert dialog.get_attribute("data-id") == target["interaction_id"]
    marked = by_css(dialog, "li.has-gold mark")
    assert marked and marked[0].text.lower() == target["answer"].lower()
    assert INJECTED in dialog.text  # the prediction, shown as the text it is
    by_css(dialog, "button.close")[0].click()
    assert browser.execute_script("return document.getElementById('record').open") is False
    assert console_errors(browser) == []


def test_a_link_to_a_question_opens_its_record(browser, tmp_path):
    records = sample_records()
    write_report(score_records(records), records, tmp_path, "sample run")
    wanted = records[2]  # the one with a KG line holding the gold answer
    browser.get(f"{(tmp_path / 'report.html').as_uri()}#q={wanted['interaction_id']}")
    dialog = by_css(browser, "#record")[0]
    assert dialog.get_attribute("data-id") == wanted["interaction_id"]
    assert any("get_price" in li.text for li in by_css(dialog, "li.has-gold"))
    assert console_errors(browser) == []


def test_compare_html_filters_the_flipped_questions(browser, tmp_path):
    before = sample_records()
    after = [dict(r, prediction=r["answer"]) if i < 4 else dict(r) for i, r in enumerate(before)]
    judge_records(after, None)
    result = compare_records(before, after)
    _, page = write_comparison(result, tmp_path, "runs/base", "runs/new")
    browser.get(page.as_uri())
    assert console_errors(browser) == []
    flipped = sum(len(rows) for rows in result["flipped"].values())
    assert len(shown_rows(browser)) == flipped > 1
    kinds = list(result["flipped"])
    choose(browser, "filter-kind", kinds[0])
    assert len(shown_rows(browser)) == len(result["flipped"][kinds[0]])
    shown_rows(browser)[0].click()
    dialog = by_css(browser, "#record")[0]
    row = result["flipped"][kinds[0]][0]
    assert dialog.get_attribute("data-id") == row["interaction_id"] and "B's verdict" in dialog.text
    assert console_errors(browser) == []


def test_report_html_shows_the_gate_and_its_risk_coverage_curve(browser, tmp_path):
    """The sample run behind a gate that gives right answers P 0.9 and wrong ones 0.2 (threshold 0.5): it withholds
    the wrong ones; the page shows the score without it and the curve of every answer, best first."""
    records = sample_records()
    for record in records:
        if record["verdict"] in ("correct", "wrong"):
            right = record["verdict"] == "correct"
            record["trace"]["gate"] = {"p_correct": 0.9 if right else 0.2, "threshold": 0.5}
            if not right:
                record["trace"]["gate"]["withheld"] = record["prediction"]
                record["prediction"] = "i don't know"
    judge_records(records, None)
    summary = score_records(records)
    write_report(summary, records, tmp_path, "gated run")
    browser.get((tmp_path / "report.html").as_uri())
    assert console_errors(browser) == []
    section = by_css(browser, "#gate")[0]
    wrong = sum(r.get("ungated", {}).get("verdict") == "wrong" for r in records)
    gate = summary["gate"]
    assert gate["withheld"] == wrong > 0 and f"{wrong} of {gate['scored']}" in section.text
    assert f"{summary['gate']['ungated']['score']:+.3f}" in section.text
    assert f"{summary['gate']['paired_ci']['difference']:+.3f}" in section.text
    points = summary["risk_coverage"]["points"]
    assert len(by_css(browser, "#risk-coverage circle.point")) == len(points)
    drawn = by_css(browser, "#risk-coverage polyline.accuracy")[0].get_attribute("points").split()
    assert len(drawn) == len(points)
    assert browser.execute_script("return window.injected") is None  # the withheld answers stay text
