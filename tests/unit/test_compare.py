"""compare A B: the paired difference of two runs and the questions that flipped."""

import json

import local_evaluation
from evaluation import manifest
from evaluation.compare import compare_records
from evaluation.data import Selection
from evaluation.metrics import paired_difference
from models.config import REPO_ROOT
from models.loading import load_config
from tests.conftest import SAMPLE, write


def verdict_records(verdicts, prefix="q"):
    return [{"interaction_id": f"{prefix}{i}", "query": f"question {i}?", "answer": "gold", "prediction": v,
             "verdict": v} for i, v in enumerate(verdicts)]


def test_one_flip_in_100_is_no_difference_and_30_are_one():
    base = ["correct"] * 50 + ["wrong"] * 25 + ["miss"] * 25
    one = list(base)
    one[60] = "correct"  # one wrong answer now right
    result = compare_records(verdict_records(base), verdict_records(one))
    low, high = result["ci95"]
    assert result["difference"] == 0.02 and low <= 0 <= high
    assert [row["interaction_id"] for row in result["flipped"]["wrong -> correct"]] == ["q60"]
    thirty = list(base)
    thirty[50:80] = ["correct"] * 30  # 25 wrong and 5 "i don't know" now right
    result = compare_records(verdict_records(base), verdict_records(thirty))
    assert result["ci95"][0] > 0 and len(result["flipped"]["wrong -> correct"]) == 25
    assert len(result["flipped"]["i don't know -> answer"]) == 5


def test_unjudged_and_unmatched_questions_are_left_out_and_counted():
    a = verdict_records(["correct", "unjudged", "wrong"])
    b = verdict_records(["correct", "correct", "wrong", "miss"])
    result = compare_records(a, b)
    assert (result["questions"], result["unjudged_left_out"], result["only_in_b"]) == (2, 1, 1)
    assert result["ci95"] is None and paired_difference(["miss"] * 12, ["miss"] * 12)["ci95"] == [0.0, 0.0]


def run_folder(path, predictions):
    path.mkdir(parents=True)
    examples = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    lines = [{"interaction_id": e["interaction_id"], "query": e["query"], "answer": e["answer"], "alt_answers": [],
              "domain": e["domain"], "prediction": p} for e, p in zip(examples, predictions)]
    write(path / "predictions.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    answers = manifest.answer_inputs(load_config(REPO_ROOT / "configs" / "cpu.yaml"), SAMPLE, 30.0, False)
    manifest.write(path, manifest.build(answers, Selection(), {"spec": "rules"}))
    return examples


def test_the_compare_command_lists_the_flip_side_by_side(tmp_path, capsys):
    examples = run_folder(tmp_path / "a", ["i don't know"] * 13)
    run_folder(tmp_path / "b", [examples[0]["answer"]] + ["i don't know"] * 12)
    assert local_evaluation.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "i don't know -> answer: 1" in out and examples[0]["interaction_id"][:8] in out
    assert f"B: {examples[0]['answer']!r}" in out and "B - A +0.077" in out
    saved = json.loads((tmp_path / "b" / "compare.json").read_text())
    assert saved["flipped"]["i don't know -> answer"][0]["b"] == examples[0]["answer"]


def test_compare_refuses_runs_of_different_data_and_missing_folders(tmp_path, capsys):
    run_folder(tmp_path / "a", ["i don't know"] * 13)
    run_folder(tmp_path / "b", ["i don't know"] * 13)
    data = manifest.load(tmp_path / "b")
    data["answers"]["data"]["sha256"] = "0" * 64
    manifest.write(tmp_path / "b", data)
    assert local_evaluation.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "different data files" in capsys.readouterr().err
    assert local_evaluation.main(["compare", str(tmp_path / "a"), str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_compare_takes_the_selection_flags(tmp_path, capsys):
    examples = run_folder(tmp_path / "a", ["i don't know"] * 13)
    run_folder(tmp_path / "b", [examples[0]["answer"]] + ["i don't know"] * 12)
    domain = examples[0]["domain"]
    folders = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert local_evaluation.main(["compare", *folders, "--domain", domain]) == 0
    capsys.readouterr()
    saved = json.loads((tmp_path / "b" / "compare.json").read_text())
    assert saved["questions"] == sum(e["domain"] == domain for e in examples[:13]) < 13
    assert local_evaluation.main(["compare", *folders, "--split", "7"]) == 2
    assert "the selection keeps no question" in capsys.readouterr().err
    assert local_evaluation.main(["compare", *folders, "--domain", "fiance"]) == 2
    assert "did you mean 'finance'" in capsys.readouterr().err


def test_compare_gives_the_difference_corrected_for_the_judges_errors(tmp_path, capsys):
    """Sentence answers the facts judge reads: the corrected difference beside the judged one, paired."""
    examples = run_folder(tmp_path / "a", ["i don't know"] * 13)
    run_folder(tmp_path / "b", [f"I believe it is {e['answer']}, as far as I know." for e in examples])
    assert local_evaluation.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "corrected for the judge's errors: A 0.000, B" in out and "facts judge's own" in out
    saved = json.loads((tmp_path / "b" / "compare.json").read_text())
    fixed = saved["corrected"]
    assert fixed["score_a"] == 0.0 and fixed["ci95"][0] <= fixed["difference"] <= fixed["ci95"][1]
    assert local_evaluation.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--judge", "contains"]) == 0
    assert "no calibration set for it" in capsys.readouterr().out


def cut_records(verdicts, cuts):
    """verdict_records whose traces hold the model's `deadline_cuts` (None: a record from before they existed)."""
    records = verdict_records(verdicts)
    for record, cut in zip(records, cuts):
        if cut is not None:
            record["trace"] = {"reason": "", "deadline_cuts": cut}
    return records


def test_a_flip_the_deadline_cut_one_side_of_is_counted_and_an_unrecorded_one_is_not():
    from evaluation.compare import format_comparison

    a = cut_records(["correct", "wrong", "wrong", "miss", "correct"], [[], [], None, [], []])
    b = cut_records(["miss", "correct", "correct", "miss", "correct"],
                    [["reasoning: call cut"], [], [], ["kg: KG calls left unsent"], []])
    result = compare_records(a, b)
    assert result["flips_cut"] == {"flips": 2, "cut": 1}  # q2's A predates the cuts: left out, not read as uncut
    (row,) = result["flipped"]["answer -> i don't know"]
    assert row["deadline_cuts"] == [[], ["reasoning: call cut"]]
    assert "of 2 flipped questions, 1 had the batch deadline cut one side's work" in format_comparison(result, "A", "B")
    assert "flips_cut" not in compare_records(verdict_records(["correct"]), verdict_records(["miss"]))
    unchanged = compare_records(verdict_records(["correct"]), verdict_records(["correct"]))
    assert unchanged["flips_cut"] == {"flips": 0, "cut": 0} and "flipped questions" not in format_comparison(
        unchanged, "A", "B")


def test_a_run_s_reading_counts_the_answers_the_deadline_cut_and_where():
    from evaluation.record import OVER_LIMIT, Record
    from evaluation.report import format_markdown, format_table, score_records

    records = cut_records(["miss", "miss", "correct", "wrong"], [["reasoning: call cut", "kg: KG calls left unsent"],
                                                                 ["reasoning: call cut"], [], None])
    records[3]["timed_out"] = True  # over the grader's limit: a cut with or without a trace
    assert Record(records[3]).deadline_cuts == [OVER_LIMIT]
    assert Record(verdict_records(["miss"])[0]).deadline_cuts is None
    summary = score_records(records)
    assert summary["deadline_cuts"] == {"answers": 3, "recorded": 4, "by_cut": {
        "reasoning: call cut": 2, "kg: KG calls left unsent": 1, OVER_LIMIT: 1}}
    text = format_table(summary)
    assert "answers the batch deadline cut short somewhere: 3 of 4" in text and "2  reasoning: call cut" in text
    assert "## Cut by the batch deadline" in format_markdown(summary, "run")
    old = score_records(cut_records(["miss", "correct"], [["reasoning: call cut"], None]))
    assert "(1 answered before cuts were recorded)" in format_table(old)
    assert "deadline_cuts" not in score_records(verdict_records(["miss"]))
