"""The answer gate: its file, fitting on judged records, and `gate fit` / `gate eval` on run folders."""

import json
import random

import pytest

from evaluation.judge import CORRECT, MISS, WRONG
from models.gate import Gate, GateError
from training.gate import Labelled, TooFewLabels, fit_gate, label_records

TRUE_THRESHOLD = -0.9  # answers whose line's mean log-probability is above this are right, the rest wrong


def separable(count: int = 160, seed: int = 0) -> Labelled:
    """Records where one signal separates right from wrong at TRUE_THRESHOLD, beside noise and a category."""
    rng = random.Random(seed)
    out = Labelled()
    for i in range(count):
        logprob = rng.uniform(-2.0, 0.0)
        out.signals.append({"reasoning.answer_logprob_mean": logprob if rng.random() > 0.05 else None,
                            "references.best": rng.random(), "attributes.domain": rng.choice(["movie", "music"])})
        out.correct.append(int(logprob > TRUE_THRESHOLD))
        out.questions.append(f"q{i % (count // 2)}")  # each question twice (two runs): folds keep them together
    return out


def test_the_fit_recovers_the_oracle_s_gain_and_a_threshold_near_the_true_one():
    labelled = separable()
    gate = fit_gate(labelled)
    cv = gate.figures["cv_score"]
    assert cv["gate"] - cv["no gate"] >= 0.8 * (cv["oracle"] - cv["no gate"])
    assert cv["gate"] > cv["always i don't know"] and gate.figures["gate_minus_no_gate"]["ci95"][0] > 0
    at_true = gate.p_correct({"reasoning.answer_logprob_mean": TRUE_THRESHOLD, "references.best": 0.5,
                              "attributes.domain": "movie"})
    assert abs(at_true - gate.threshold) < 0.25  # the learnt boundary sits where the labels change
    weights = gate.figures["weights"]
    assert max(weights, key=lambda name: abs(weights[name])) == "reasoning.answer_logprob_mean"


def test_the_gate_file_round_trips_and_reads_missing_signals_as_at_fit_time(tmp_path):
    gate = fit_gate(separable())
    gate.save(tmp_path / "gate.json")
    loaded = Gate.load(tmp_path / "gate.json")
    signals = {"reasoning.answer_logprob_mean": -0.2, "references.best": 0.3, "attributes.domain": "sports"}
    assert loaded.p_correct(signals) == pytest.approx(gate.p_correct(signals))
    assert 0.0 < loaded.p_correct({}) < 1.0  # every signal missing: the means and the missing columns
    assert json.loads((tmp_path / "gate.json").read_text())["format"] == "crag-answer-gate/1"
    (tmp_path / "bad.json").write_text('{"format": "crag-answer-gate/1", "columns": []}')
    with pytest.raises(GateError, match="bad.json: malformed gate"):
        Gate.load(tmp_path / "bad.json")


@pytest.mark.parametrize("labels, message", [
    ([1] * 40, "40 correct, 0 wrong"), ([1, 0] * 5, "10 labelled answers"), ([1] * 39 + [0], "1 wrong"),
])
def test_too_few_labels_or_one_class_is_refused(labels, message):
    labelled = Labelled([{"x": float(i)} for i in range(len(labels))], labels, [f"q{i}" for i in range(len(labels))])
    with pytest.raises(TooFewLabels, match=message):
        fit_gate(labelled)


def record(i: int, verdict: str, by: str = "llm", prediction: str = "p", answer: str = "a",
           signals: dict | None = None) -> dict:
    return {"interaction_id": f"q{i}", "query": "q", "answer": answer, "alt_answers": [], "prediction": prediction,
            "verdict": verdict, "judged_by": by, "trace": {"signals": {"x": 1.0} if signals is None else signals}}


def test_labels_leave_out_what_the_rules_only_failed_to_match():
    records = [record(0, CORRECT), record(1, WRONG), record(2, MISS), record(3, "unjudged"),
               record(4, CORRECT, by="rules", prediction="a"),
               record(5, WRONG, by="rules", prediction="a longer sentence"),  # no exact match only
               record(6, WRONG, by="rules", prediction="invalid question"),  # the rules decide: gold is not invalid
               record(7, CORRECT, signals={})]
    labelled = label_records(records)
    assert labelled.questions == ["q0", "q1", "q4", "q6"] and labelled.correct == [1, 0, 1, 0]
    assert labelled.counts["no exact match, left out (--rules-wrong-is-wrong takes it as wrong)"] == 1
    assert label_records(records, rules_wrong_is_wrong=True).questions == ["q0", "q1", "q4", "q5", "q6"]


def write_run(folder, records, reasoning=None):
    folder.mkdir(parents=True)
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = {"llm": {"backend": "hf", "hf": {"model": None, "dtype": "float32"}},
              "reasoning": reasoning or {"max_tokens": 96, "samples": 0}}
    (folder / "manifest.json").write_text(json.dumps({"answers": {"config": config, "prompts": {"reasoning": "h"}},
                                                      "commit": "c", "dirty": False}))


def runs_from(labelled: Labelled) -> list[dict]:
    return [record(i, CORRECT if c else WRONG, signals=s)
            for i, (s, c) in enumerate(zip(labelled.signals, labelled.correct))]


def test_gate_fit_then_eval_on_run_folders(tmp_path, capsys):
    from local_evaluation import main

    records = runs_from(separable())
    write_run(tmp_path / "a", records[:80])
    write_run(tmp_path / "b", records[80:])
    assert main(["gate", "fit", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "g.json")]) == 0
    printed = capsys.readouterr().out
    assert "records used: 160" in printed and "gate - no gate: +" in printed and "weights" in printed
    gate = Gate.load(tmp_path / "g.json")
    assert [r["folder"] for r in gate.fit_on["runs"]] == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert gate.fit_on["setup"]["llm"] == {"backend": "hf", "model": None, "dtype": "float32"}
    assert main(["gate", "eval", str(tmp_path / "g.json"), str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    withheld = sum(gate.p_correct(r["trace"]["signals"]) < gate.threshold for r in records[:80])
    assert f"withholds {withheld}" in printed and withheld > 0


def test_gate_commands_refuse_in_one_line(tmp_path, capsys):
    from local_evaluation import main

    records = runs_from(separable())
    write_run(tmp_path / "a", records[:80])
    write_run(tmp_path / "b", records[80:], reasoning={"max_tokens": 96, "samples": 3})
    write_run(tmp_path / "few", records[:6])
    cases = [(["fit", str(tmp_path / "a"), str(tmp_path / "b")], "other signal settings"),
             (["fit", str(tmp_path / "few")], "a gate needs at least 20"),
             (["fit", str(tmp_path / "nowhere")], "no judged run folder here"),
             (["eval", str(tmp_path / "missing.json"), str(tmp_path / "a")], "not a readable gate file")]
    for args, message in cases:
        code = main(["gate", *args, "--out", str(tmp_path / "g.json")] if args[0] == "fit" else ["gate", *args])
        err = capsys.readouterr().err.strip()
        assert code == 2 and message in err and len(err.splitlines()) == 1, (args, err)
