"""tools/train_attributes.py on a slice of the shipped labelled file, with the real MiniLM (and SmolLM2 for ICL)."""

from __future__ import annotations

import json

from models.config import REPO_ROOT
from models.stages.attributes import SVMAttributes
from tests.conftest import write_config
from tools.train_attributes import main

LABELLED = REPO_ROOT / "data" / "attributes" / "questions.jsonl"


def test_trains_reports_and_writes_a_loadable_model(tmp_path, capsys, embedder, builders_share_the_embedder,
                                                    builders_share_the_llm):
    rows = LABELLED.read_text(encoding="utf-8").splitlines()[::4]  # 85 questions, every class present
    data = tmp_path / "slice.jsonl"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    # ICL runs, not how well: one demonstration a class, one sample
    config = write_config(tmp_path / "cpu.yaml", {"attributes": {"icl": {"shots_per_class": 1, "n": 1}}})
    out = tmp_path / "model.pkl"
    assert main(["--data", str(data), "--out", str(out), "--folds", "3", "--test-size", "0.1", "--icl",
                 "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "cross-validated SVM accuracy, domain" in printed and "cross-validated SVM accuracy, dynamism" in printed
    assert "  SVM  domain" in printed and "  ICL  domain" in printed
    model = SVMAttributes.load(out)
    assert model.embedder == "all-MiniLM-L6-v2"
    # trained on every row: it gives back the labels it was trained on, each for its own question
    labelled = [json.loads(row) for row in rows]
    predicted = model.predict(embedder.encode([row["query"] for row in labelled]))
    gold = [(row["domain"], row["static_or_dynamic"]) for row in labelled]
    assert sum(p == g for p, g in zip(predicted, gold)) >= 0.9 * len(gold)


def test_bad_data_is_a_one_line_error(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "missing.jsonl")]) == 2
    few = tmp_path / "few.jsonl"
    few.write_text(json.dumps({"query": "q", "domain": "music", "static_or_dynamic": "static"}) + "\nnot json\n")
    assert main(["--data", str(few)]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors[0].startswith("error: --data") and "not found" in errors[0]
    assert errors[-1].startswith("error: --data") and "1 usable rows" in errors[-1]
