"""`local_evaluation.py gate fit RUN [RUN ...] --out FILE` and `gate eval FILE RUN`: the answer gate learnt from
judged run folders, and applied to one without loading a model (models/gate.py, training/gate.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evaluation import manifest
from evaluation.compare import paired_difference
from evaluation.judge import CORRECT, MISS, WRONG
from evaluation.runner import load_predictions
from models.gate import Gate, GateError, signal_setup
from training.gate import answered_signals, fit_gate, label_records
from utils.trees import differences


def run_records(folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The judged records of a run folder and its manifest; GateError where it has none."""
    records = list(load_predictions(folder / "predictions.jsonl").values())
    found = manifest.load(folder)
    if not records or found is None:
        raise GateError(f"{folder}: no judged run folder here (predictions.jsonl and manifest.json); give the --out "
                        "folder of a `local_evaluation.py run`")
    if not any(r.get("verdict") for r in records):
        raise GateError(f"{folder}: its predictions are not judged; run `local_evaluation.py rejudge --out {folder}`")
    return records, found


def setup_of(found: dict[str, Any]) -> dict[str, Any]:
    answers = found.get("answers") or {}
    return signal_setup(answers.get("config") or {}, answers.get("prompts") or {})


def fit(runs: list[Path], out: Path, rules_wrong_is_wrong: bool = False) -> str:
    """Fit a gate on the runs' judged records, write it to `out`, and say what it does (the printed figures)."""
    records, setups, sources = [], [], []
    for folder in runs:
        found_records, found = run_records(folder)
        records += found_records
        setups.append(setup_of(found))
        answers = found.get("answers") or {}
        sources.append({"folder": str(folder), "commit": found.get("commit"), "dirty": found.get("dirty"),
                        "data": answers.get("data"), "judge": found.get("judge")})
    for folder, setup in zip(runs[1:], setups[1:]):
        changed = differences(setups[0], setup)
        if changed:
            raise GateError(f"{folder} was run with other signal settings than {runs[0]} ({'; '.join(changed)}): "
                            "fit a gate on runs of one setup")
    gate = fit_gate(label_records(records, rules_wrong_is_wrong))
    gate.fit_on = {"setup": setups[0], "runs": sources, "rules_wrong_is_wrong": rules_wrong_is_wrong}
    gate.save(out)
    return format_fit(gate) + f"\ngate written to {out}; see what it does to a run with: gate eval {out} RUN"


def _interval(found: dict[str, Any]) -> str:
    ci = found.get("ci95")
    return f"{found['difference']:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else " (too few for an interval)")


def format_fit(gate: Gate) -> str:
    f = gate.figures
    accuracy = "-" if f["accuracy_answered"] is None else f"{f['accuracy_answered']:.3f}"
    lines = ["answer gate: P(correct | signals), logistic regression "
             f"(C {f['C']:g} by {f['folds']}-fold cross-validation grouped by question)"]
    lines += [f"  {count:5d}  {why}" for why, count in sorted(f["counts"].items())]
    lines += [f"records used: {f['records']} ({f['correct']} correct, {f['wrong']} wrong) of {f['questions']} "
              "questions",
              f"threshold {gate.threshold:.3f}: answers {f['coverage']:.1%} of them, {accuracy} of those right",
              "cross-validated score on these records: " + ", ".join(f"{name} {value:+.3f}"
                                                                      for name, value in f["cv_score"].items()),
              f"gate - no gate: {_interval(f['gate_minus_no_gate'])}",
              f"gate - always i don't know: {_interval(f['gate_minus_always_idk'])}",
              "weights (standardised signals):"]
    lines += [f"  {weight:+8.3f}  {name}" for name, weight in sorted(gate.figures["weights"].items(),
                                                                     key=lambda item: -abs(item[1]))]
    return "\n".join(lines)


def gated_verdicts(gate: Gate, records: list[dict[str, Any]]) -> tuple[list[str], list[str], int]:
    """(verdicts without the gate, verdicts with it, answers withheld): an answer whose P(correct) is under the
    threshold becomes "i don't know" (a miss); records without signals keep their verdict."""
    before, after, withheld = [], [], 0
    for record in records:
        verdict = record.get("verdict")
        before.append(verdict)
        signals = answered_signals(record)
        if verdict in (CORRECT, WRONG) and signals is not None and gate.p_correct(signals) < gate.threshold:
            after.append(MISS)
            withheld += 1
        else:
            after.append(verdict)
    return before, after, withheld


def evaluate(gate_file: Path, run: Path) -> str:
    """What the gate would have done to a judged run: the score with and without it, paired, and what it withheld."""
    gate = Gate.load(gate_file)
    records, found = run_records(run)
    notes = [f"note: the run's signal settings differ from the gate's ({'; '.join(changed)})"
             for changed in [differences(gate.fit_on.get("setup") or {}, setup_of(found))] if changed]
    before, after, withheld = gated_verdicts(gate, records)
    answered = sum(v in (CORRECT, WRONG) for v in before)
    result = paired_difference(before, after)
    return "\n".join(notes + [
        f"{run}: {len(records)} questions, {answered} answered; the gate (threshold {gate.threshold:.3f}) withholds "
        f"{withheld}",
        f"score without the gate {result['score_a']:+.3f}, with it {result['score_b']:+.3f}",
        f"gate - no gate: {_interval(result)}"])
