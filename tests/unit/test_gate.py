"""The answer gate: its file, fitting on judged records, and `gate fit` / `gate eval` on run folders."""

import dataclasses
import json
import random

import pytest

from evaluation.gate_fit import Labelled, TooFewLabels, fit_gate, label_records
from evaluation.judge import judge_records
from evaluation.metrics import Scores
from evaluation.verdicts import CORRECT, MISS, WRONG
from models.config import REPO_ROOT, ConfigError
from models.gate.answer_gate import Column, Gate, GateError, gate_for, gate_settings, signal_setup
from models.llm.profile import load_profile, write_profile
from models.llm.weights import FOLDER_FORMAT, content_fingerprint, fingerprint
from models.prompting import PromptLibrary
from models.system import CragSystem
from tests.conftest import SAMPLE, to_batch
from tests.fakes import HashEmbedder, ScriptedLLM
from utils.answers import IDK

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
    by_a_person = label_records([record(8, WRONG, by="person", prediction="a longer sentence")])
    assert by_a_person.correct == [0] and by_a_person.counts["labelled by a person"] == 1


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
    assert gate.fit_on["setup"]["llm"] == {"backend": "hf", "dtype": "float32"}
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


# --- the gate in the pipeline, in the run's judging and in its report --------------------------------------------

GOLD = {json.loads(line)["query"]: json.loads(line)["answer"] for line in SAMPLE.read_text().splitlines()}


def gold_or_paris(conversation) -> str:
    """The gold answer to every other sample question, "paris" to the rest: some right, some wrong."""
    content = conversation[-1]["content"]
    query = next((q for q in GOLD if q in content), None)
    right = query is not None and sorted(GOLD).index(query) % 2 == 0
    return f"===START===\n## Answer: {GOLD[query] if right else 'paris'}\n## False Premise: no\n===END==="


def number_gate(config, path, **setup_changes):
    """A gate that trusts numbers (P 0.88) and nothing else (P 0.12), fit on `config`'s setup (with
    `setup_changes` to its reasoning settings)."""
    resolved = json.loads(json.dumps(config.resolved()))
    resolved["reasoning"].update(setup_changes)
    setup = signal_setup(resolved, PromptLibrary(config.prompts).digests())
    Gate([Column("answer.number", "number"), Column("answer.number", "missing")], [0.0, 0.0], [1.0, 1.0],
         [4.0, 0.0], -2.0, 0.5, fit_on={"setup": setup}).save(path)
    return Gate.load(path)


def gated_run(cpu_config, tmp_path) -> tuple[Gate, list[dict]]:
    """The sample questions through a system with number_gate, as the runner records them, judged by the rules."""
    gate_settings(cpu_config).gate = str(tmp_path / "gate.json")
    gate = number_gate(cpu_config, tmp_path / "gate.json")
    examples = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    system = CragSystem(cpu_config, llm=ScriptedLLM(gold_or_paris), embedder=HashEmbedder())
    try:
        result = system.answer_batch(to_batch(examples))
        predictions = result.answers
    finally:
        system.close()
    records = [{"interaction_id": e["interaction_id"], "query": e["query"], "answer": e["answer"],
                "alt_answers": e["alternative_answers"], "prediction": p, "trace": trace}
               for e, p, trace in zip(examples, predictions, result.trace)]
    judge_records(records, None)
    return gate, records


def test_the_gate_stage_withholds_low_p_answers_and_keeps_them_on_the_record(cpu_config, tmp_path):
    gate, records = gated_run(cpu_config, tmp_path)
    withheld = [r for r in records if "withheld" in r["trace"].get("gate", {})]
    kept = [r for r in records if r["trace"].get("gate") and "withheld" not in r["trace"]["gate"]]
    assert withheld and kept
    for record in records:
        trace = record["trace"]
        if "gate" not in trace:  # no answer to gate: the pipeline said "i don't know" itself
            assert record["prediction"] == IDK
            continue
        p = gate.p_correct(trace["signals"])
        assert trace["gate"]["p_correct"] == round(p, 4) and trace["gate"]["threshold"] == 0.5
        assert ("withheld" in trace["gate"]) == (p < 0.5) == (not trace["signals"]["answer.number"])
    for record in withheld:
        assert record["prediction"] == IDK and record["verdict"] == MISS
        assert f"gate: p(correct) {record['trace']['gate']['p_correct']:.2f} < 0.50" in record["trace"]["reason"]
        # the run's judge judged the withheld answer too
        assert record["ungated"]["prediction"] == record["trace"]["gate"]["withheld"]
        assert record["ungated"]["verdict"] == (CORRECT if record["ungated"]["prediction"] == record["answer"]
                                                else WRONG)
    stages = [s["stage"] for s in withheld[0]["trace"]["stages"]]
    assert stages[-2:] == ["answer", "gate"]


def test_gate_eval_reproduces_the_gated_score_of_a_run_with_that_gate(cpu_config, tmp_path, capsys):
    from evaluation.report import format_table, score_records
    from local_evaluation import main

    gate, records = gated_run(cpu_config, tmp_path)
    summary = score_records(records)
    before = [r.get("ungated", r)["verdict"] for r in records]
    assert summary["gate"]["ungated"]["score"] == pytest.approx(Scores.of(before).score)
    assert summary["gate"]["withheld"] == sum("ungated" in r for r in records) > 0
    assert summary["overall"]["score"] > summary["gate"]["ungated"]["score"]  # it withheld wrong answers here
    curve = summary["risk_coverage"]
    assert curve["ordered_by"] == "the run's answer gate" and curve["points"][-1]["coverage"] == pytest.approx(
        sum(v in (CORRECT, WRONG) for v in before) / len(records))
    assert curve["points"][-1]["score"] == pytest.approx(summary["gate"]["ungated"]["score"])
    printed = format_table(summary)
    assert "answer gate (threshold 0.500): withheld" in printed and "risk-coverage" in printed
    answering = sum(r["verdict"] in (CORRECT, WRONG) for r in records) / len(records)
    assert f"answering {answering:.1%} of the questions" in printed

    write_run(tmp_path / "run", records)
    assert main(["gate", "eval", str(tmp_path / "gate.json"), str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert f"with it {summary['overall']['score']:+.3f}" in out
    assert f"without the gate {summary['gate']['ungated']['score']:+.3f}" in out


def test_an_ungated_run_gets_a_curve_from_a_fit_on_its_own_verdicts():
    from evaluation.report import score_records

    records = runs_from(separable())
    curve = score_records(records)["risk_coverage"]
    assert curve["ordered_by"].startswith("a gate fit on this run's own verdicts")
    accuracies = [point["accuracy"] for point in curve["points"]]
    assert accuracies[0] > accuracies[-1] and curve["points"][-1]["coverage"] == 1.0
    assert "a gate needs at least 20" in score_records(records[:5])["risk_coverage"]["note"]


def test_a_gate_of_another_setup_is_refused_before_anything_loads(cpu_config, tmp_path, monkeypatch, caplog_loguru):
    built = []
    monkeypatch.setattr("models.resources.create_llm", lambda config: built.append("llm"))
    monkeypatch.setattr("models.resources.PageProcessor", lambda *args: built.append("pages"))
    gate_settings(cpu_config).gate = str(tmp_path / "gate.json")
    number_gate(cpu_config, tmp_path / "gate.json", max_tokens=17)
    with pytest.raises(ConfigError, match=r"fit on another setup than this config's \(reasoning.max_tokens "
                                          r"\(17 -> \d+\)\).*gate_strict: false"):
        CragSystem(cpu_config)
    assert built == []
    gate_settings(cpu_config).gate_strict = False
    system = CragSystem(cpu_config, llm=ScriptedLLM(), embedder=HashEmbedder())
    system.close()
    assert [stage.name for stage in system.closing] == ["gate"] and "running it anyway" in caplog_loguru.text
    built.clear()
    gate_settings(cpu_config).gate = str(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="answer.gate: .*missing.json: not a readable gate file"):
        CragSystem(cpu_config)
    assert built == []


def test_a_gate_follows_the_prompts_its_setup_renders(cpu_config, tmp_path):
    # the reasoning prompt off: an edit to it moves no signal, so the gate stands; an edit to the summariser, which
    # then answers every query, is refused
    cpu_config.reasoning.max_tokens, cpu_config.prompts = 0, {}
    gate_settings(cpu_config).gate = str(tmp_path / "gate.json")
    number_gate(cpu_config, tmp_path / "gate.json")
    for name in ("reasoning", "summariser"):
        text = (REPO_ROOT / "prompts" / f"{name}.yaml").read_text(encoding="utf-8")
        (tmp_path / f"{name}.yaml").write_text(text.replace("question", "query"), encoding="utf-8")
    cpu_config.prompts = {"reasoning": str(tmp_path / "reasoning.yaml")}
    gate_for(cpu_config, PromptLibrary(cpu_config.prompts))
    cpu_config.prompts = {"summariser": str(tmp_path / "summariser.yaml")}
    with pytest.raises(ConfigError, match=r"fit on another setup than this config's \(prompts.summariser"):
        gate_for(cpu_config, PromptLibrary(cpu_config.prompts))
    # a comment edit to the summariser changes nothing it renders: the gate stands
    text = (REPO_ROOT / "prompts" / "summariser.yaml").read_text(encoding="utf-8")
    (tmp_path / "summariser.yaml").write_text("# a comment added\n" + text, encoding="utf-8")
    gate_for(cpu_config, PromptLibrary(cpu_config.prompts))


def test_a_gate_fit_on_one_kg_method_is_refused_by_another(cpu_config, tmp_path):
    # kg.calls and kg.lines mean other things when the LLM names the entities than when the question's spans do
    cpu_config.section("kg").method = "rules"
    gate_settings(cpu_config).gate = str(tmp_path / "gate.json")
    number_gate(cpu_config, tmp_path / "gate.json")
    gate_for(cpu_config, PromptLibrary(cpu_config.prompts))
    cpu_config.section("kg").method = "spans"
    with pytest.raises(ConfigError, match=r"another setup than this config's \(kg.method \('rules' -> 'spans'\)\)"):
        gate_for(cpu_config, PromptLibrary(cpu_config.prompts))


def test_make_eval_s_config_takes_the_shipped_gate():
    """The served configuration `make eval` runs accepts data/gates/cpu.json: an edit to a prompt its setup renders,
    to the reasoning settings, to kg.method, to the profile or to the weights fails here, before make eval refuses the
    gate."""
    from models.llm.profile import served_config
    from models.loading import load_config

    config = load_config(REPO_ROOT / "configs" / "cpu.yaml", [REPO_ROOT / "configs" / "overlays" / "vllm-cpu.yaml"])
    config = served_config(config, "http://127.0.0.1:1/v1")
    gate = gate_for(config, PromptLibrary(config.prompts))
    assert all(digest.startswith("template-sha256:") for digest in gate.fit_on["setup"]["prompts"].values())


def test_a_gate_fit_on_the_base_is_refused_for_its_fine_tuned_folder(cpu_config, tmp_path):
    """Served under the same name, a tuned model differs only in its weights: the gate names them by content."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"base")
    gate_settings(cpu_config).gate = str(tmp_path / "gate.json")
    embedded = cpu_config.llm.profile
    cpu_config.llm.profile = str(write_profile(tmp_path / "tuned.yaml", load_profile(), folder))
    number_gate(cpu_config, tmp_path / "gate.json")
    assert Gate.load(tmp_path / "gate.json").fit_on["setup"]["llm"]["fingerprint"] == fingerprint(folder)[0]
    (folder / "model.safetensors").write_bytes(b"tuned")  # the same folder name, other weights
    with pytest.raises(ConfigError, match=r"fit on another setup than this config's \(llm.fingerprint\).*`make gate`"):
        CragSystem(cpu_config, llm=ScriptedLLM(), embedder=HashEmbedder())
    cpu_config.llm.profile = embedded  # the embedded model: its GGUF and the format of the folder it becomes
    resolved = json.loads(json.dumps(dataclasses.asdict(cpu_config)))
    assert signal_setup(resolved, {})["llm"]["converter"] == FOLDER_FORMAT
    assert signal_setup(resolved, {})["llm"]["fingerprint"] == content_fingerprint(load_profile().weights_path())


def test_the_ceiling_counts_the_most_a_ranking_could_answer_with_its_interval_above_zero():
    import numpy as np

    from benchmarks.gate import ceiling, most_answered

    correct = np.array([1] * 20 + [0] * 20)
    assert "(20 right)" in most_answered(np.arange(40), correct, questions=80)
    assert most_answered(np.arange(40)[::-1], correct, questions=80) == "none"  # the wrong ones first
    signals = [{"s.good": float(c), "s.noise": float(i % 2)} for i, c in enumerate(correct)]
    lines = ceiling(Labelled(signals, [int(c) for c in correct], [str(i) for i in range(40)]), questions=80)
    assert lines[0].startswith("ceiling: s.good: AUROC 1.00;") and "(20 right)" in lines[0]
    assert lines[1].startswith("ceiling: s.noise: AUROC 0.50;")


def test_answers_a_batch_time_limit_stopped_are_counted_aloud(tmp_path, monkeypatch, capsys):
    """A benchmark's run logs only errors: questions whose batch was stopped at its limit are declines the model did
    not choose (a hung model process gives nothing else), and answer_set says how many."""
    from evaluation import gate_sets

    def fake_run(folder, answering):
        lines = [{"interaction_id": f"q{i}", "prediction": "i don't know", "timed_out": i < 2} for i in range(3)]
        (tmp_path / "predictions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        return 1.0

    monkeypatch.setattr(gate_sets, "quiet_run", fake_run)
    assert gate_sets.answer_set(tmp_path / "set.jsonl", tmp_path) == 1.0
    assert gate_sets.past_their_limit(tmp_path) == 2
    assert (f"warning: 2 of {tmp_path / 'set.jsonl'}'s questions were in batches stopped at their time limit"
            in capsys.readouterr().err)


def test_a_kept_gate_run_of_other_weights_is_not_reused(tmp_path):
    """benchmarks/gate.py --reuse judges kept runs again: of other weights (here the converter's older folder format),
    it stops and says to answer them again."""
    from evaluation import manifest
    from evaluation.gate_sets import check_weights, ungated
    from models.llm.weights import weights_of

    current = weights_of(json.loads(json.dumps(ungated().load().resolved()))["llm"])
    manifest.write(tmp_path, {"answers": {"weights": {**current, "converter": "v2"}}})
    with pytest.raises(SystemExit, match=rf"other weights than the config runs now \(converter \('v2' -> "
                                         rf"'{FOLDER_FORMAT}'\)\)"):
        check_weights(ungated(), tmp_path)
    manifest.write(tmp_path, {"answers": {"weights": current}})
    check_weights(ungated(), tmp_path)


def test_the_containment_judge_s_agreement_with_the_person_is_counted_on_the_answers_the_person_judged(tmp_path):
    from benchmarks.gate import agreement

    def run(name, rows):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "manifest.json").write_text("{}")
        (folder / "predictions.jsonl").write_text("".join(
            json.dumps({"interaction_id": iid, "prediction": "x", "verdict": verdict, "judged_by": by}) + "\n"
            for iid, verdict, by in rows))
        return folder

    labelled = run("labelled", [("a", "correct", "person"), ("b", "wrong", "person"), ("c", "correct", "rules"),
                                ("d", "wrong", "contains")])
    contained = run("contained", [("a", "correct", "contains"), ("b", "correct", "contains"),
                                  ("c", "correct", "rules"), ("d", "wrong", "contains")])
    assert agreement([labelled], [contained]) == ("labels: the containment judge agrees with the person on 1 of 2 "
                                                  "answers both judged (1 it calls right that the person did not)")
    assert agreement([labelled], [contained], "facts").startswith("labels: the facts judge agrees")
    from benchmarks.gate import changed

    assert changed([labelled], [contained]) == ("labels: 1 of 4 verdicts changed from the old labels "
                                                "(person+contains) to person+facts")


def test_the_damaged_model_is_the_profile_s_weights_read_at_rope_base_10000(tmp_path):
    """benchmarks/gate.py --damaged: the model as vLLM served it before the RoPE fix, every stack reading one base."""
    from benchmarks.gate import damaged_folder
    from models.llm.hf import resolve_model_folder
    from utils.model_folders import check_folder

    folder = damaged_folder(tmp_path / "damaged")
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 10000.0
    source = resolve_model_folder()
    assert json.loads((source / "config.json").read_text())["rope_theta"] == 100000.0  # the source is untouched
    assert fingerprint(folder)[0] != fingerprint(source)[0]  # config.json is part of what a setup records
    check_folder(folder)  # both keys agree: no stack reads another base


def test_the_gate_benchmark_answers_with_a_candidate_path_s_settings(tmp_path, monkeypatch, capsys):
    """benchmarks/gate.py --set: every set is answered with the settings on top of the served default."""
    import benchmarks.gate as bench
    from evaluation import gate_command
    from evaluation.gate_fit import TooFewLabels

    answered = []
    monkeypatch.setattr(bench, "answer_set", lambda data, folder, **kw: answered.append(kw["sets"]) or 0.0)

    def no_fit(folders, out):
        raise TooFewLabels("none answered")

    monkeypatch.setattr(gate_command, "fit", no_fit)
    assert bench.main(["--runs", str(tmp_path), "--set", "reasoning.summariser_answer=reply"]) == 0
    assert answered == [("reasoning.summariser_answer=reply",)] * len(bench.SETS)
    assert "no gate fit (none answered)" in capsys.readouterr().out
