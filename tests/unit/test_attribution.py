"""Error attribution: each miss lands in the class of the first place its gold answer went missing."""

import json

import pytest

import local_evaluation
from evaluation import manifest
from evaluation.attribution import attribute, attribute_records, attribution_table, evidence_form, page_texts
from evaluation.data import Selection
from models.config import REPO_ROOT
from models.loading import load_config
from tests.conftest import SAMPLE, write, write_config


def record(answer, prediction="i don't know", verdict="miss", references=(), kg_results=(), kg_ran=False,
           reason="", **extra):
    stages = [{"stage": "kg", "status": "ok"}] if kg_ran else []
    return {"interaction_id": f"q-{answer}-{len(references)}-{kg_ran}", "answer": answer, "alt_answers": [],
            "prediction": prediction, "verdict": verdict, "domain": "finance",
            "trace": {"references": [{"text": t} for t in references], "kg_results": list(kg_results),
                      "calculations": [], "stages": stages, "reason": reason}, **extra}


PAGES = ["Apple's revenue was $383,285 million in fiscal 2023.", "The Eras Tour opened in Glendale."]


@pytest.mark.parametrize("case, expected", [
    (record("383285 million", references=["revenue: $383,285 million (2023)"]), "generation"),
    (record("383,285 million", references=["Apple makes phones."]), "retrieval"),
    (record("glendale", kg_ran=True, kg_results=["AAPL close: 189.9"]), "retrieval"),  # the pages had it first
    (record("taylor swift", kg_ran=True, kg_results=["AAPL close: 189.9"]), "kg"),
    (record("taylor swift"), "pages"),
    (record("yes"), "unattributable"),
    (record("invalid question"), "unattributable"),
    (record("42.7"), "unattributable"),  # a number no page holds: it may be computed
    (record("glendale", timed_out=True), "declined"),
    (record("glendale", reason="predicted real-time: answers that change this fast are not attempted"), "declined"),
])
def test_each_cause_lands_in_its_class(case, expected):
    assert attribute(case, PAGES) == expected


def test_evidence_form_folds_case_accents_numbers_and_punctuation():
    assert evidence_form("$1,234.50 (USD)") == "1234.50 usd"
    assert evidence_form("Beyoncé Knowles.") == "beyonce knowles"
    assert evidence_form("U.S. GDP grew 2.5% in 2024.") == "u s gdp grew 2.5% in 2024"


def test_only_misses_are_attributed_and_the_table_counts_them_by_domain():
    records = [record("taylor swift"), record("glendale", verdict="wrong", prediction="phoenix"),
               record("yes", verdict="correct", prediction="yes"), record("no", verdict="unjudged")]
    records[1]["domain"] = "music"
    asked = []
    attribute_records(records, lambda ids: asked.append(ids) or {i: PAGES for i in ids})
    assert [r["attribution"] for r in records] == ["pages", "retrieval", None, None]
    assert asked == [[records[0]["interaction_id"], records[1]["interaction_id"]]]  # one call, misses only
    table = attribution_table(records)
    assert table["overall"]["pages"] == 1 and table["overall"]["retrieval"] == 1
    assert table["finance"]["pages"] == 1 and table["music"]["retrieval"] == 1


def test_page_texts_are_the_pages_the_references_stage_reads(tmp_path):
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    config.references.cache_dir = str(tmp_path / "cache")
    example = json.loads(SAMPLE.read_text().splitlines()[0])
    texts = page_texts(SAMPLE, [example["interaction_id"]], config.references)[example["interaction_id"]]
    snippets = [p["page_snippet"] for p in example["search_results"]]
    assert texts[:len(snippets)] == snippets and len(texts) > len(snippets)
    assert any(example["answer"].lower() in t.lower() for t in texts)
    assert list((tmp_path / "cache" / "pages").rglob("*"))  # through the page cache the run uses


def test_a_rejudged_run_reports_where_its_misses_were_lost(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    examples = [json.loads(line) for line in SAMPLE.read_text().splitlines()][:4]
    lines = [{**{k: e.get(k) for k in ("interaction_id", "query", "answer", "domain", "question_type",
                                       "static_or_dynamic")}, "alt_answers": [], "prediction": "i don't know",
              "batch_seconds": 1.0, "batch_size": 1, "trace": {"references": [], "kg_results": [], "stages": []}}
             for e in examples]
    write(out / "predictions.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    manifest.write(out, manifest.build(manifest.answer_inputs(config, SAMPLE, 30.0, False), Selection(limit=4),
                                       {"spec": "rules"}))
    config_file = write_config(tmp_path / "c.yaml", {"references": {"cache_dir": str(tmp_path / "cache")}})
    assert local_evaluation.main(["rejudge", "--data", str(SAMPLE), "--out", str(out), "--config",
                                  str(config_file)]) == 0
    table = json.loads((out / "report.json").read_text())["attribution"]
    assert sum(table["overall"].values()) == 4 and table["overall"]["declined"] == 0
    assert "where the misses were lost" in capsys.readouterr().out
    assert "## Where the misses were lost" in (out / "report.md").read_text()
    saved = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["verdict"] for r in saved] == ["miss"] * 4 and all(r["attribution"] in table["overall"] for r in saved)
    assert all(r["trace"] == {"references": [], "kg_results": [], "stages": []} for r in saved)  # the record kept
    one_domain = saved[0]["domain"]
    assert local_evaluation.main(["rejudge", "--data", str(SAMPLE), "--out", str(out), "--config", str(config_file),
                                  "--domain", one_domain]) == 0
    again = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert again == saved  # the other domains' lines are left as they were, this domain's judged the same
    other = write(tmp_path / "other.jsonl", SAMPLE.read_text().splitlines()[0] + "\n")
    assert local_evaluation.main(["rejudge", "--data", str(other), "--out", str(out)]) == 0
    assert "no error attribution" in capsys.readouterr().out
