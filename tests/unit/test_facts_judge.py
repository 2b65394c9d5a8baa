"""The facts judge: its key-fact rules (evaluation/keyfact.py), its fitted file, the fit's protocol
(evaluation/judge_fit.py) and the corrected score (evaluation/correction.py)."""

from __future__ import annotations

import json
from decimal import Decimal

import numpy as np
import pytest

import benchmarks.judge_learners as learners_bench
import benchmarks.judging as judge_bench
import tools.fit_judge as fit_tool
from evaluation.calibration import REAL_SET, calibration_for, confusion, load_set
from evaluation.correction import Calibration, corrected
from evaluation.facts_judge import MODEL_FILE, FactsJudge, load_model
from evaluation.judge import build_judge
from evaluation.judge_fit import Learner, choose, data_hash, development_sets, judge_decides, unseen_verdicts
from evaluation.keyfact import FEATURES, best_features, decisive, read, value_match
from evaluation.verdicts import CORRECT, WRONG, Item
from models.config import ConfigError

needs_real = pytest.mark.skipif(not REAL_SET.is_file(), reason="the labelled set of real answers is not beside the "
                                                                  "repository")


def number(text):
    return read(text).numbers[0]


@pytest.mark.parametrize("predicted, gold, same", [
    ("$64.9 million", "64900000", True), ("almost 10 trillion", "9552000000000", True),
    ("$68,789", "68789.63", True), ("2.55 billion", "2543205863.73", False), ("7.4", "7.5", False),
    ("239,813,888", "240031094", False), ("six", "6", True), ("5 trillion", "4600000000000", False),
    ("about $200 million", "160000000", False), ("300 meters", "330", False), ("30 teams", "31", False),
    ("$65,000", "64900", True),
])
def test_numbers_match_by_value_rounded_or_cut_at_the_predictions_precision(predicted, gold, same):
    assert value_match(number(predicted), Decimal(gold)) is same


@pytest.mark.parametrize("query, gold, prediction, feature, value", [
    ("how many titles has x won?", "x has won 24 titles", "24", "num_match", 1.0),
    ("how many titles has x won?", "x has won 24 titles", "at least 24", "num_bound", 1.0),
    ("how many titles has x won?", "x has won 24 titles", "He won 23.", "num_conflict", 1.0),
    ("when was x born?", "1941-08-14", "14/8/1941", "key_all", 1.0),
    ("where is x?", "tucson, az", "Tucson, Arizona", "key_all", 1.0),
    ("what language is x in?", "en", "English", "key_all", 1.0),
    ("which country made x?", "usa", "The United States.", "key_all", 1.0),
    ("which is heavier, rhinos or grizzly bears?", "rhinos weigh more", "Rhinos generally outweigh grizzly bears",
     "cmp_gold_first", 1.0),
    ("which won more, china or usa?", "china", "USA won 8 golds and China won 9.", "cmp_numbers", 1.0),
    ("which won more, china or usa?", "china", "China won 8 golds and USA won 9.", "cmp_numbers", -1.0),
    ("who were the members of x?", "the members were ann lee, bo diaz and cy young.", "Ann Lee", "list_missing",
     2 / 3),
    ("is x in y?", "yes, x is in y", "No, it is not.", "yesno_disagree", 1.0),
])
def test_the_rules_read_the_key_fact(query, gold, prediction, feature, value):
    assert best_features(query, [gold], prediction)[feature] == pytest.approx(value)


@pytest.mark.parametrize("gold, prediction, key", [
    ("tucson, az", "Tucson, Arizona", "state_az"), ("en", "English", "language_en"),
    ("az", "Azerbaijani", "language_az"),
    ("usa", "The United States.", "country_us"), ("the uk", "Britain", "country_gb"),
])
def test_names_and_their_codes_read_as_one_key(gold, prediction, key):
    assert key in read(gold).tokens and key in read(prediction).tokens
    assert "language_it" not in read("it is in rome").tokens  # a code inside a sentence is a word


@pytest.mark.parametrize("query, golds, prediction, verdict", [
    ("is x in y?", ["yes"], "Yes, it is, since 1990.", CORRECT),
    ("is x in y?", ["no"], "Yes.", WRONG),
    ("how did x do in its last match?", ["l"], "Lost 2-1.", CORRECT),
    ("how did x do in its last match?", ["w"], "Lost 2-1.", WRONG),
    ("which five states passed x?", ["invalid question"], "None of them did.", CORRECT),
    ("what was the budget of inception?", ["$160 million"], "about $200 million", WRONG),
    ("how many titles has x won?", ["24"], "At least 24.", WRONG),
    ("how many titles has x won in 2020?", ["24"], "In 2020 he won 24 of them.", None),
    ("what is the capital of france?", ["paris"], "Paris.", None),
    ("when was it completed?", ["march 31, 1889"], "1889", WRONG),
    ("when was it released?", ["1998-05-08"], "On October 24, 2005.", WRONG),
    ("when was he born?", ["1965-02-17"], "He was born on 17/2/1965.", None),
])
def test_decisive_rules_settle_what_the_golds_form_leaves_certain(query, golds, prediction, verdict):
    found = decisive(query, golds, prediction)
    assert (found and found[0]) == verdict


def test_features_are_the_declared_ones_against_the_closest_gold():
    values = best_features("who directed jaws?", ["steven spielberg", "spielberg"], "Spielberg.")
    assert set(values) == set(FEATURES) and values["contains"] == 1.0


def test_the_shipped_judge_file_holds_no_text_and_says_what_it_was_fit_on():
    model = load_model()
    assert model["features"] == list(FEATURES) and len(model["fit_on"]["sha256"]) == 64
    assert {"folds", "protocol", "calibration", "threshold", "C"} <= set(model)
    text = MODEL_FILE.read_text()
    for row in load_set(REAL_SET) if REAL_SET.is_file() else []:
        assert row["query"] not in text and (len(row["prediction"]) < 12 or row["prediction"] not in text)


def test_the_judge_says_why_and_with_what_probability():
    judge = build_judge("facts", None)
    assert isinstance(judge, FactsJudge)
    items = [Item("how many titles has x won?", "x has won 24 titles", (), "24."),
             Item("how many titles has x won?", "x has won 24 titles", (), "He has won 31 titles.")]
    assert judge.judge(items) == [CORRECT, WRONG]
    key = judge.key(items[0])
    assert judge.reasons[key].startswith("facts: P(correct)") and judge.p_correct[key] > 0.5


def test_a_judge_file_of_other_features_is_refused(tmp_path):
    stale = tmp_path / "facts.json"
    stale.write_text(json.dumps({**load_model(), "features": ["contains"]}))
    with pytest.raises(ConfigError, match="make judge"):
        FactsJudge(load_model(stale))
    with pytest.raises(ConfigError, match="not a fitted facts judge"):
        load_model(tmp_path / "missing.json")


# --- the corrected score ------------------------------------------------------------------------------------------

def test_rogan_gladen_undoes_a_judges_known_errors():
    calibration = Calibration("set", {"correct_correct": 80, "correct_wrong": 20, "wrong_correct": 10,
                                      "wrong_wrong": 90})
    # 100 judged answers of which 50 truly right: the judge calls 0.8 * 50 + 0.1 * 50 = 45 of them correct
    verdicts = [CORRECT] * 45 + [WRONG] * 55 + ["miss"] * 20
    result = corrected(verdicts, [True] * 100 + [False] * 20, calibration)
    assert result["score"] == pytest.approx(0.0) and result["accuracy"] == pytest.approx(50 / 120)
    low, high = result["ci95"]["score"]
    assert low < 0 < high and result["judged"] == 100


def test_exact_verdicts_are_not_corrected():
    calibration = Calibration("set", {"correct_correct": 5, "correct_wrong": 5, "wrong_correct": 5,
                                      "wrong_wrong": 95})
    verdicts = [CORRECT] * 10 + [WRONG] * 10
    assert corrected(verdicts, [False] * 20, calibration)["score"] == 0.0
    with pytest.raises(ValueError, match="no better than chance"):
        corrected(verdicts, [True] * 20, Calibration("chance", {"correct_correct": 5, "correct_wrong": 5,
                                                                "wrong_correct": 5, "wrong_wrong": 5}))


def test_a_smaller_calibration_set_gives_a_wider_interval():
    verdicts, judged = [CORRECT] * 40 + [WRONG] * 60, [True] * 100

    def width(scale):
        counts = {"correct_correct": 8 * scale, "correct_wrong": 2 * scale, "wrong_correct": scale,
                  "wrong_wrong": 9 * scale}
        low, high = corrected(verdicts, judged, Calibration("s", counts))["ci95"]["score"]
        return high - low

    assert width(2) > width(50)


def test_a_run_names_its_calibration_or_says_there_is_none(tmp_path):
    calibration, note = calibration_for("facts", None, None)
    assert calibration is not None and "facts judge's own" in note
    assert calibration_for("contains", None, None)[0] is None
    assert calibration_for("facts", None, "none")[0] is None
    rows = tmp_path / "verdicts.jsonl"
    rows.write_text("".join(json.dumps({"query": "how many?", "answer": "24", "prediction": p, "human": h}) + "\n"
                            for p, h in (("He won 24.", "correct"), ("31 titles", "incorrect"),
                                         ("24 titles", "correct"), ("It was 30.", "incorrect"))))
    given, note = calibration_for("contains", None, str(rows))
    assert given is not None and given.counts == {"correct_correct": 2, "correct_wrong": 0, "wrong_correct": 0,
                                                  "wrong_wrong": 2} and "verdicts.jsonl" in note
    rows.write_text(rows.read_text().replace('"incorrect"', '"correct"'))  # the judge now looks no better than chance
    assert calibration_for("contains", None, str(rows))[1].startswith("score not corrected:")


def test_of_settings_equally_good_in_the_inner_folds_the_earlier_is_chosen():
    """The protocol's tie-break, for any learner (benchmarks/judge_learners.py's alternatives share it)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 1))
    y = x[:, 0] > 0
    groups = np.array([f"q{i // 2}" for i in range(60)])
    def sign(x, y, setting):
        return lambda new: (new[:, 0] > 0) * 1.0

    def nothing(x, y, setting):
        return lambda new: 0 * new[:, 0]

    assert choose(x, y, groups, learner=Learner("equal", "setting", ("simple", "complex"), sign))[0] == "simple"
    better = Learner("the second reads the sign", "setting", ("noise", "sign"),
                     lambda x, y, setting: sign(x, y, setting) if setting == "sign" else nothing(x, y, setting))
    assert choose(x, y, groups, learner=better)[0] == "sign"


def test_rules_alone_match_the_key_fact_unless_a_guard_vetoes():
    rows = np.zeros((4, len(FEATURES)))
    rows[0, FEATURES.index("num_match")] = 1
    rows[1, FEATURES.index("num_match")] = 1
    rows[1, FEATURES.index("num_conflict")] = 1
    rows[2, FEATURES.index("key_recall")] = 0.4
    rows[3, FEATURES.index("contains")] = 1
    rows[3, FEATURES.index("no_answer_cue")] = 1
    assert learners_bench._rules(rows, np.zeros(4), None)(rows).tolist() == [1.0, 0.0, 0.4, 0.0]


def test_the_learners_benchmark_names_a_missing_set(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(learners_bench, "REAL_SET", tmp_path / "answers.jsonl")
    assert learners_bench.main([]) == 1
    assert "answers.jsonl is not there" in capsys.readouterr().err


# --- on the labelled set of real answers --------------------------------------------------------------------------

def test_prediction_powered_adds_the_judges_mean_error_on_the_answers_it_decided():
    """benchmarks/judging.py's PPI baseline: a judge that calls a fifth of the right answers wrong."""
    calibration = ([{"human": CORRECT}] * 50 + [{"human": WRONG}] * 50)
    said = [CORRECT] * 40 + [WRONG] * 10 + [WRONG] * 50
    errors = judge_bench.judge_errors(calibration, said, [True] * 100)
    assert errors.mean() == pytest.approx(0.2)
    run = [CORRECT] * 80 + [WRONG] * 120  # 100 right by the person: score 0, judged -0.2
    low, high = judge_bench.prediction_powered(run, [True] * 200, errors, seed=0)
    assert low < 0 < high and high < 0.2
    low, high = judge_bench.prediction_powered(run, [False] * 200, errors, seed=0)  # exact verdicts: no rectifier
    assert high < 0


@needs_real
def test_the_corrected_interval_holds_the_persons_score_over_splits_by_question():
    """200 splits of the labelled set by question, each answer judged by a judge not fit on its question: the
    corrected interval of one half, calibrated on the other, against the person's score of that half."""
    real = load_set(REAL_SET)
    verdicts = unseen_verdicts(real, development_sets(real, REAL_SET.name), load_model())
    judged = judge_decides(real)

    def other_half(run, rest):
        return Calibration("rest", confusion([real[i] for i in rest], [verdicts[i] for i in rest],
                                             [judged[i] for i in rest]))

    share, width = judge_bench.coverage(real, verdicts, judge_bench.rogan_gladen(verdicts, judged, other_half), seed=1)
    assert share >= 0.9
    assert width < 1.6  # measured 1.55 (benchmarks/README.md): over the 1.5


@needs_real
def test_fit_tool_writes_the_file_it_ships_from_the_same_data(tmp_path, capsys):
    out = tmp_path / "facts.json"
    assert fit_tool.main(["--set", str(REAL_SET), "--out", str(out)]) == 0
    fitted, shipped = json.loads(out.read_text()), load_model()
    assert fitted["fit_on"]["sha256"] == shipped["fit_on"]["sha256"]
    assert fitted["weights"] == pytest.approx(shipped["weights"]) and fitted["threshold"] == shipped["threshold"]
    printed = capsys.readouterr().out
    assert "answers.jsonl (facts)" in printed and "answers.jsonl (contains)" in printed


def test_fit_tool_names_a_missing_set(tmp_path, capsys):
    assert fit_tool.main(["--set", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "f.json")]) == 2
    assert "--set" in capsys.readouterr().err


def test_data_hash_changes_with_a_verdict():
    rows = [{"query": "q", "answer": "a", "prediction": "p", "human": CORRECT}]
    assert data_hash(rows) != data_hash([{**rows[0], "human": WRONG}])


# --- the corrected score in a run's report ------------------------------------------------------------------------

def rejudged_folder(tmp_path):
    from tests.unit.test_contains_judge import records

    out = tmp_path / "run"
    out.mkdir()
    (out / "predictions.jsonl").write_text("".join(
        json.dumps({**r, "interaction_id": str(i), "batch_seconds": 1.0, "batch_size": 1}) + "\n"
        for i, r in enumerate(records() * 3)))
    return out


def test_rejudge_reports_the_corrected_score_beside_the_judged_one(tmp_path, capsys):
    import local_evaluation
    from tests.conftest import SAMPLE

    out = rejudged_folder(tmp_path)
    assert local_evaluation.main(["rejudge", "--data", str(SAMPLE), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "score judged" in printed and "calibration: the facts judge's own" in printed
    report = json.loads((out / "report.json").read_text())
    fixed = report["corrected"]
    assert fixed["judged"] == report["judged_by"]["facts"] and fixed["ci95"]["score"][0] <= fixed["score"]
    assert "Corrected for the judge's errors" in (out / "report.md").read_text()
    assert "corrected score" in (out / "report.html").read_text()
    assert local_evaluation.main(["rejudge", "--data", str(SAMPLE), "--out", str(out), "--calibration", "none"]) == 0
    assert "(--calibration none)" in capsys.readouterr().out
    assert "corrected" not in json.loads((out / "report.json").read_text())


def test_a_calibration_file_that_is_not_one_is_a_one_line_error_before_any_work(tmp_path, capsys):
    import local_evaluation
    from tests.conftest import SAMPLE

    out = rejudged_folder(tmp_path)
    for bad, message in ((tmp_path / "none.jsonl", "no such file"), (tmp_path / "bad.jsonl", "not a calibration row")):
        if bad.name == "bad.jsonl":
            bad.write_text('{"query": "q"}\n')
        assert local_evaluation.main(["rejudge", "--data", str(SAMPLE), "--out", str(out), "--calibration",
                                      str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--calibration" in err and message in err
    assert not (out / "report.json").exists()


def test_a_run_unlike_the_calibration_set_gets_a_warning():
    from evaluation.calibration import drift_warnings

    calibration = Calibration("set", {"correct_correct": 9, "correct_wrong": 1, "wrong_correct": 1,
                                      "wrong_wrong": 9}, sentence_share=0.9, models=("Llama-3.1-8B-Instruct",))
    records = [{"answer": "paris"}] * 10
    warnings = drift_warnings(records, calibration, "smollm2")
    assert len(warnings) == 2 and "sentences" in warnings[0] and "smollm2" in warnings[1]
    assert drift_warnings([{"answer": "a whole sentence of gold that goes on"}] * 10, calibration, "llama3-8b") == []
