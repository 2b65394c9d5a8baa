"""benchmarks/finetune.py's arithmetic: a table row against the base on the same questions, the over-refusal count,
and the fold files every question lands in once; which fold models it trains, and what --no-train answers."""

from __future__ import annotations

import json
import os

from benchmarks.finetune import fold_file, row
from evaluation.verdicts import CORRECT, MISS, UNJUDGED, WRONG
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


def test_a_variant_trained_after_another_starts_from_a_recipe_of_the_same_data():
    from benchmarks.finetune import VARIANTS

    for name, variant in VARIANTS.items():
        if variant.after is not None:
            first = VARIANTS[variant.after]  # a KeyError names a recipe that does not exist
            assert first.after is None and first.settings.method == "sft" and variant.settings.method == "dpo", name
            assert first.targets == variant.targets, name  # the pairs come from the data its start trained on


def test_gated_rows_say_why_no_gate_was_fit_or_give_both_comparisons():
    from benchmarks.finetune import gated_rows

    assert gated_rows("t", {"a": CORRECT}, "too few labels") == ["| t, gated | no gate: too few labels |"]
    assert gated_rows("t", "base had none", {"a": CORRECT}) == ["| t, gated | no gate: base had none |"]
    base, tuned = {"a": CORRECT, "b": CORRECT}, {"a": CORRECT, "b": MISS}
    against_base, against_idk = gated_rows("t", base, tuned)
    assert against_base.startswith("| t, gated, against the base gated | 2 | 1 | 1 | 0 | +0.500 | -0.500")
    assert "| 1/2 |" in against_base  # the base's right answer to b withheld
    assert against_idk.startswith("| t, gated, against always i don't know | 2 | 1 | 1 | 0 | +0.500 | +0.500")


def test_a_fold_model_trains_on_the_other_folds_rows_its_recipe_keeps(tmp_path, monkeypatch):
    import argparse

    import pytest

    import benchmarks.finetune as bench

    data = tmp_path / "data-sentence"
    data.mkdir()
    rows = [{"interaction_id": f"q{i}", "fold": i % 2, "kind": kind, "prompt_name": prompt, "prompt": [],
             "completion": []}
            for i, (kind, prompt) in enumerate([("extraction", "reasoning"), ("own", "reasoning"),
                                                ("raft-removed", "reasoning"), ("raft-distractors", "reasoning"),
                                                ("refusal", "summariser"), ("refusal", "reasoning")])]
    (data / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trained = []
    monkeypatch.setattr(bench, "train", lambda start, rows, out, settings, **_: trained.append((start, rows, out)))
    monkeypatch.setattr(bench, "merge", lambda start, adapter, merged: None)
    monkeypatch.setattr(bench, "in_fresh_process", lambda function, *args, **kwargs: function(*args, **kwargs))
    args = argparse.Namespace(folds=2, reuse=False, no_train=False, max_steps=None)
    out, merged = bench.fold_model(tmp_path, "sft-2ep-sentence-noraft", 0, args, tmp_path / "base", {"sentence": {}})
    assert out == tmp_path / "sft-2ep-sentence-noraft" / "fold0" and merged == out / "merged"
    start, kept, _ = trained[0]
    assert start == tmp_path / "base"
    # fold 1's rows only (odd ids), no RAFT variant, the reasoning prompt's conversations only
    assert [r["interaction_id"] for r in kept] == ["q1", "q5"]
    with pytest.raises(SystemExit, match="run --variant sft-2ep-sentence first"):
        bench.fold_model(tmp_path, "sft-2ep-sentence-dpo", 0, args, tmp_path / "base", {"sentence": {}})
    (tmp_path / "sft-2ep-sentence" / "fold1" / "merged").mkdir(parents=True)
    (tmp_path / "sft-2ep-sentence" / "fold1" / "merged" / "config.json").write_text("{}")
    reused = argparse.Namespace(folds=2, reuse=True, no_train=False, max_steps=None)
    assert bench.fold_model(tmp_path, "sft-2ep-sentence", 1, reused, tmp_path / "base", {}) == (
        tmp_path / "sft-2ep-sentence" / "fold1", tmp_path / "sft-2ep-sentence" / "fold1" / "merged")
    assert len(trained) == 1  # --reuse found the model folder: nothing trained again


def test_a_recipe_with_no_row_to_train_on_is_refused_before_anything_trains(tmp_path):
    # on the shipped path the reasoning prompt is off: the base's runs record the summariser's conversations only
    import argparse

    import benchmarks.finetune as bench

    data = tmp_path / "data"
    data.mkdir()
    rows = [{"interaction_id": f"q{i}", "fold": i % 2, "kind": "own", "prompt_name": "summariser", "prompt": [],
             "completion": []} for i in range(4)]
    (data / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = argparse.Namespace(folds=2, reuse=False)
    why = bench.untrainable(tmp_path, ["sft-both-prompts", "sft-noraft"], args)
    assert why is not None and why.startswith("--variant sft-noraft trains on the reasoning prompt's conversations")
    assert "recorded the summariser prompt's" in why and f"--variant {bench.DEFAULT_VARIANT}" in why
    assert bench.untrainable(tmp_path, ["sft-both-prompts"], args) is None
    for fold in range(2):  # fold models already trained are not trained again, so they need no rows
        bench.model_folder(tmp_path, "sft-noraft", fold).mkdir(parents=True)
        (bench.model_folder(tmp_path, "sft-noraft", fold) / "config.json").write_text("{}")
    assert bench.untrainable(tmp_path, ["sft-noraft"], argparse.Namespace(folds=2, reuse=True)) is None


def test_no_train_answers_the_fold_models_on_disk_and_prints_how_to_train_the_others(tmp_path, monkeypatch, capsys):
    import benchmarks.finetune as bench
    from training.llm_training import MANIFEST

    answered = []

    def fake_answer_set(data, folder, **kwargs):
        answered.append((folder, kwargs.get("sets")))
        return 0.0

    def refuse(*args, **kwargs):
        raise AssertionError("--no-train built data or trained")

    monkeypatch.setattr(bench, "answer_set", fake_answer_set)
    monkeypatch.setattr(bench, "judged_copy", lambda folder, data, out: folder)
    monkeypatch.setattr(bench, "labelled", lambda folders: ({"q": CORRECT}, 1))
    monkeypatch.setattr(bench, "gated", lambda folders: "too few labels")
    monkeypatch.setattr(bench, "resolve_model_folder", lambda: tmp_path / "base-model")
    for name in ("build", "write", "train", "merge"):
        monkeypatch.setattr(bench, name, refuse)
    base = tmp_path / "base"
    for name in bench.SETS:
        (base / name).mkdir(parents=True)
        (base / name / "predictions.jsonl").write_text("")
    runs = tmp_path / "runs"
    for fold in range(2):
        merged = bench.model_folder(runs, "sft", fold)
        merged.mkdir(parents=True)
        (merged / "config.json").write_text("{}")
        (merged.parent / MANIFEST).write_text(json.dumps(
            {"seconds": 10.0, "tokens_per_epoch": 100, "epochs": 1.0, "device": "cpu"}))

    argv = ["--runs", str(runs), "--base", str(base), "--no-train", "--variant", "sft", "--variant", "sft-noraft"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    # sft's fold models answer their folds, each with its own merged folder; sft-noraft has none and gets the command
    assert sorted(str(sets) for _, sets in answered) == [
        str((f"llm.profile={bench.model_folder(runs, 'sft', fold)}.yaml",)) for fold in range(2) for _ in bench.SETS]
    assert "| sft, pooled |" in out and "sft-noraft, pooled" not in out
    assert (f"sft-noraft: no fold models in {runs}, and --no-train trains none" in out
            and f"python -m benchmarks.finetune --runs {runs} --base {base} --variant sft-noraft" in out)


CHANGED_IN_THIS_PROCESS = {"value": "as imported"}


def read_changed() -> tuple[int, str]:
    return os.getpid(), CHANGED_IN_THIS_PROCESS["value"]


def fail() -> None:
    raise ValueError("raised in the child")


def test_training_runs_in_a_fresh_interpreter_not_a_fork_of_this_one(monkeypatch):
    # a fork would inherit this process's torch threads (and this change); a spawned interpreter imports afresh
    import pytest

    from benchmarks.finetune import in_fresh_process

    monkeypatch.setitem(CHANGED_IN_THIS_PROCESS, "value", "changed here")
    pid, value = in_fresh_process(read_changed)
    assert pid != os.getpid() and value == "as imported"
    with pytest.raises(ValueError, match="raised in the child"):
        in_fresh_process(fail)
