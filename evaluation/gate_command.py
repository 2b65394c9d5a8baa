"""`local_evaluation.py gate fit RUN [RUN ...] --out FILE` and `gate eval FILE RUN`: the answer gate learnt from
judged run folders, and applied to one without loading a model (models/gate/answer_gate.py, evaluation/gate_fit.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evaluation import manifest
from evaluation.gate_fit import TooFewLabels, fit_gate, label_records
from evaluation.metrics import Scores, intervals, paired_difference, risk_coverage
from evaluation.record import records_of
from evaluation.runner import load_predictions
from evaluation.verdicts import CORRECT, MISS, UNJUDGED, WRONG
from models.gate.answer_gate import Gate, GateError, answering, signal_setup
from utils.cli import check_out_file
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
    # a run recorded before the weights were: none, so that a gate fit on it is refused until refit
    return signal_setup(answers.get("config") or {}, answers.get("prompts") or {}, answers.get("weights") or {})


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
    threshold becomes "i don't know" (a miss); records without signals keep their verdict. A run that had a gate
    is read without it first (its withheld answers' verdicts), so this gives that run's own gated verdicts."""
    before, after, withheld = [], [], 0
    for record in (r.without_gate() for r in records_of(records)):
        verdict = record.scored_verdict
        before.append(verdict)
        signals = record.signals
        if verdict in (CORRECT, WRONG, UNJUDGED) and signals is not None and gate.p_correct(signals) < gate.threshold:
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
             for changed in [differences(answering(gate.fit_on.get("setup") or {}), setup_of(found))] if changed]
    before, after, withheld = gated_verdicts(gate, records)
    answered = sum(v in (CORRECT, WRONG) for v in before)
    result = paired_difference(before, after)
    return "\n".join(notes + [
        f"{run}: {len(records)} questions, {answered} answered; the gate (threshold {gate.threshold:.3f}) withholds "
        f"{withheld}",
        f"score without the gate {result['score_a']:+.3f}, with it {result['score_b']:+.3f}",
        f"gate - no gate: {_interval(result)}"])


def gate_summary(lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """report.json's `gate` (a run with an answer gate: the score without it, what it withheld, the paired
    difference) and `risk_coverage` (every run whose answers carry signals: the answers ordered by the run's gate,
    or without one by a gate fit on the run's own verdicts, in-sample); None where no record has signals."""
    records = records_of(lines)
    gated = [r.gate for r in records if r.gate is not None]
    result: dict[str, Any] = {}
    if gated:
        before, after = [r.without_gate().scored_verdict for r in records], [r.scored_verdict for r in records]
        result["gate"] = {"threshold": gated[0]["threshold"], "scored": len(gated),
                          "withheld": sum(r.withheld is not None for r in records),
                          "ungated": {**Scores.of(before).as_dict(), "ci95": intervals(before)},
                          "paired_ci": paired_difference(before, after)}
        p = {id(r): r.gate["p_correct"] for r in records if r.gate}
        ordered_by = "the run's answer gate"
    else:
        if not any(r.signals for r in records):
            return None
        try:  # the run's own verdicts, taken as they are, so the curve ends at the run's score
            own = fit_gate(label_records(lines, rules_wrong_is_wrong=True))
        except TooFewLabels as err:
            return {"risk_coverage": {"ordered_by": None, "note": f"no curve: {err}"}}
        p = {id(r): own.p_correct(r.signals) for r in records if r.signals}
        ordered_by = "a gate fit on this run's own verdicts (in-sample, so optimistic)"
    scored = [(p[id(r)], r.without_gate().scored_verdict) for r in records
              if id(r) in p and r.without_gate().scored_verdict in (CORRECT, WRONG)]
    result["risk_coverage"] = {"ordered_by": ordered_by, "questions": len(records), "answers": len(scored),
                               "points": risk_coverage(scored, len(records))}
    return result


def format_gate(summary: dict[str, Any], rows: int = 8) -> list[str]:
    """The printed lines of a report's `gate` and `risk_coverage`."""
    lines = []
    if gate := summary.get("gate"):
        without = gate["ungated"]
        lines.append(f"answer gate (threshold {gate['threshold']:.3f}): withheld {gate['withheld']} of "
                     f"{gate['scored']} answers, answering {1 - summary['overall']['missing']:.1%} of the questions "
                     f"({1 - without['missing']:.1%} without); score {summary['overall']['score']:+.3f} with it, "
                     f"{without['score']:+.3f} without; with - without: {_interval(gate['paired_ci'])}")
    curve = summary.get("risk_coverage")
    if curve and curve.get("points"):
        points = curve["points"]
        shown = [points[round(i * (len(points) - 1) / (rows - 1))] for i in range(rows)] if len(points) > rows \
            else points
        lines.append(f"risk-coverage, answers best first by {curve['ordered_by']} (answered share, accuracy of "
                     "those, score if only those were answered, lowest P(correct) among them):")
        seen = set()
        for point in shown:
            if id(point) not in seen:
                seen.add(id(point))
                lines.append(f"  {point['coverage']:6.1%}  {point['accuracy']:6.1%}  {point['score']:+.3f}  "
                             f"p >= {point['p']:.3f}")
    elif curve:
        lines.append(f"risk-coverage: {curve['note']}")
    return lines


def fit_command(runs: list[Path], out: Path, rules_wrong_is_wrong: bool = False) -> int:
    """`gate fit`: a gate fitted on judged run folders of one setup, written to `out`."""
    check_out_file(out)
    try:
        print(fit(runs, out, rules_wrong_is_wrong))
    except OSError as err:
        raise GateError(str(err)) from err
    return 0


def eval_command(gate_file: Path, run_folder: Path) -> int:
    """`gate eval`: what a gate does to a judged run folder."""
    try:
        print(evaluate(gate_file, run_folder))
    except OSError as err:
        raise GateError(str(err)) from err
    return 0
