"""The facts judge (evaluation/facts_judge.py): its speed against containment's, and the corrected score's interval
(evaluation/correction.py) against the person's score.

- Speed: seconds per answer of each judge's verdict, load excluded, over the answers of data/judge/'s sets and,
  where it is beside the repository, the labelled set of real answers; p50 and p95, and the facts judge's p95 as a
  ratio of containment's measured in the same run.
- Coverage (needs the labelled set of real answers): every answer judged by a facts judge that was not fit on its
  question (out of fold on the development half, the shipped model on the lockbox); then SPLITS random splits by
  question into a run and a calibration half: how often the run's corrected 95% interval holds the person's score,
  and its median width against the uncorrected bootstrap interval's.
- Across kinds of answers: the calibration from the whole labelled set of real answers (Llama answers, 40% sentence
  golds) applied to data/judge/gate_verdicts.jsonl (SmolLM2's answers, short golds), over SPLITS random halves of
  its questions.
- Both beside prediction-powered inference (PPI, as ARES uses it), the alternative the shipped Rogan-Gladen
  correction was chosen over: the run's judged score plus the judge's mean error on the calibration set's answers
  it decided, scaled by the run's share of such answers, with a bootstrap of both sets.

    python -m benchmarks.judging
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from evaluation.calibration import GATE_SET, REAL_SET, SETS, confusion, load_set
from evaluation.correction import Calibration, corrected
from evaluation.facts_judge import FactsJudge, load_model
from evaluation.judge import judge_by_containment
from evaluation.judge_fit import development_sets, item, judge_decides, unseen_verdicts
from evaluation.keyfact import read
from evaluation.metrics import Scores, intervals
from evaluation.verdicts import CORRECT, WRONG
from utils.cli import command

SPLITS = 200
RESAMPLES = 1000


def timings(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Seconds per answer of each judge's verdict (the grader's cut included), after one warm-up answer."""
    judge = FactsJudge()
    judge.verdict(item(rows[0]))
    spent: dict[str, list[float]] = {"facts": [], "contains": []}
    for row in rows:
        for name, run in (("facts", lambda r: judge.verdict(item(r))), ("contains",
                                                                        lambda r: judge_by_containment(item(r)))):
            read.cache_clear()  # each answer read cold: no other answer to the same question read it first
            start = time.perf_counter()
            run(row)
            spent[name].append(time.perf_counter() - start)
    return {name: np.array(values) for name, values in spent.items()}


def person_score(rows: list[dict[str, Any]]) -> float:
    return float(_score([r["human"] for r in rows]).mean())


def _score(verdicts: list[str]) -> np.ndarray:
    return np.array([1.0 if v == CORRECT else -1.0 if v == WRONG else 0.0 for v in verdicts])


def prediction_powered(verdicts: list[str], judged: list[bool], errors: np.ndarray, seed: int) -> tuple[float, float]:
    """PPI's 95% interval of a run's score: its judged score plus the share of its answers the judge decided times
    the judge's mean error (person's score minus the judge's) on the calibration answers it decided (`errors`), the
    run's questions and the calibration answers each resampled."""
    rng = np.random.default_rng(seed)
    score, own = _score(verdicts), np.array(judged, dtype=float)
    take = rng.integers(0, len(score), size=(RESAMPLES, len(score)))
    rectifier = errors[rng.integers(0, len(errors), size=(RESAMPLES, len(errors)))].mean(axis=1)
    drawn = score[take].mean(axis=1) + own[take].mean(axis=1) * rectifier
    return float(np.percentile(drawn, 2.5)), float(np.percentile(drawn, 97.5))


def judge_errors(rows: list[dict[str, Any]], verdicts: list[str], judged: list[bool]) -> np.ndarray:
    """Person's score minus the judge's on the rows the judge decided and the person called correct or wrong."""
    mine = [i for i, (r, v, j) in enumerate(zip(rows, verdicts, judged))
            if j and r["human"] in (CORRECT, WRONG) and v in (CORRECT, WRONG)]
    return _score([rows[i]["human"] for i in mine]) - _score([verdicts[i] for i in mine])


Interval = Callable[[list[int], list[int], int], tuple[float, float]]  # (run, rest, split) -> (low, high)


def coverage(rows: list[dict[str, Any]], verdicts: list[str], interval: Interval, seed: int) -> tuple[float, float]:
    """(share of SPLITS splits of `rows` by question whose interval holds the person's score of the run part, median
    width against the uncorrected interval's); `interval(run_indices, rest, split)` gives each split's interval."""
    questions = sorted({r["query"] for r in rows})
    rng = np.random.default_rng(seed)
    held, ratios = 0, []
    for split in range(SPLITS):
        chosen = set(rng.choice(questions, len(questions) // 2, replace=False))
        run = [i for i, r in enumerate(rows) if r["query"] in chosen]
        rest = [i for i, r in enumerate(rows) if r["query"] not in chosen]
        low, high = interval(run, rest, split)
        held += low <= person_score([rows[i] for i in run]) <= high
        plain = intervals([verdicts[i] for i in run])["score"]
        ratios.append((high - low) / (plain[1] - plain[0]))
    return held / SPLITS, float(np.median(ratios))


def rogan_gladen(verdicts: list[str], judged: list[bool], calibrate: Callable[[list[int], list[int]], Calibration]
                 ) -> Interval:
    """The shipped correction's interval for a split (evaluation/correction.py), calibrated by `calibrate`."""
    def interval(run: list[int], rest: list[int], split: int) -> tuple[float, float]:
        result = corrected([verdicts[i] for i in run], [judged[i] for i in run], calibrate(run, rest), seed=split,
                           resamples=RESAMPLES)
        low, high = result["ci95"]["score"]
        return low, high

    return interval


def ppi(verdicts: list[str], judged: list[bool], errors: Callable[[list[int]], np.ndarray]) -> Interval:
    """PPI's interval for a split, its rectifier from `errors(rest)`."""
    def interval(run: list[int], rest: list[int], split: int) -> tuple[float, float]:
        return prediction_powered([verdicts[i] for i in run], [judged[i] for i in run], errors(rest), split)

    return interval


@command
def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    real = load_set(REAL_SET) if REAL_SET.is_file() else []
    rows = [r for path in SETS for r in load_set(path)] + real
    spent = timings(rows)
    for name, values in spent.items():
        print(f"{name:<9} {len(values)} answers: p50 {np.percentile(values, 50) * 1e3:.2f} ms, p95 "
              f"{np.percentile(values, 95) * 1e3:.2f} ms per answer")
    print(f"facts' p95 / contains' p95: {np.percentile(spent['facts'], 95) / np.percentile(spent['contains'], 95):.1f}")
    if not real:
        print(f"coverage: skipped, {REAL_SET} is not there")
        return 0
    model = load_model()
    development = development_sets(real, REAL_SET.name)
    verdicts = unseen_verdicts(real, development, model)
    judged = judge_decides(real)

    def other_half(run: list[int], rest: list[int]) -> Calibration:
        return Calibration("the other half", confusion([real[i] for i in rest], [verdicts[i] for i in rest],
                                                       [judged[i] for i in rest]))

    def their_errors(rest: list[int]) -> np.ndarray:
        return judge_errors([real[i] for i in rest], [verdicts[i] for i in rest], [judged[i] for i in rest])

    for name, interval in (("Rogan-Gladen", rogan_gladen(verdicts, judged, other_half)),
                           ("PPI", ppi(verdicts, judged, their_errors))):
        share, width = coverage(real, verdicts, interval, seed=1)
        print(f"labelled set of real answers, {SPLITS} splits by question (run half, calibration half), {name}: the "
              f"interval holds the person's score in {share:.1%}; median width {width:.2f} x the uncorrected "
              "interval's")
    whole = Calibration("all of the labelled set", confusion(real, verdicts, judged))
    errors = judge_errors(real, verdicts, judged)
    gate = load_set(GATE_SET)
    gate_verdicts = unseen_verdicts(gate, development, model)
    gate_judged = judge_decides(gate)
    fixed = corrected(gate_verdicts, gate_judged, whole)
    powered = prediction_powered(gate_verdicts, gate_judged, errors, seed=0)
    print(f"across kinds: calibrated on all {sum(whole.counts.values())} judged answers of the labelled set, applied "
          f"to {GATE_SET.name} ({len(gate)} answers, person's score {person_score(gate):+.3f}, judged "
          f"{Scores.of(gate_verdicts).score:+.3f}): Rogan-Gladen {fixed['score']:+.3f} "
          f"[{fixed['ci95']['score'][0]:+.3f}, {fixed['ci95']['score'][1]:+.3f}], PPI "
          f"{Scores.of(gate_verdicts).score + np.mean(gate_judged) * errors.mean():+.3f} "
          f"[{powered[0]:+.3f}, {powered[1]:+.3f}]")
    for name, interval in (("Rogan-Gladen", rogan_gladen(gate_verdicts, gate_judged, lambda run, rest: whole)),
                           ("PPI", ppi(gate_verdicts, gate_judged, lambda rest: errors))):
        share, width = coverage(gate, gate_verdicts, interval, seed=2)
        print(f"  {name}, over {SPLITS} halves of its questions: the interval holds the person's score in "
              f"{share:.1%} (median width {width:.2f} x the uncorrected)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
