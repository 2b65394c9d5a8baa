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

    python -m benchmarks.judging
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from evaluation.calibration import GATE_SET, REAL_SET, SETS, confusion, load_set
from evaluation.correction import Calibration, corrected
from evaluation.facts_judge import FactsJudge, load_model
from evaluation.judge import judge_by_containment
from evaluation.judge_fit import development_sets, item, judge_decides, unseen_verdicts
from evaluation.keyfact import read
from evaluation.metrics import Scores, intervals
from evaluation.verdicts import CORRECT
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
    return float(np.mean([1 if r["human"] == CORRECT else -1 if r["human"] == "wrong" else 0 for r in rows]))


def coverage(rows: list[dict[str, Any]], verdicts: list[str], calibrate: Any, seed: int) -> tuple[float, float]:
    """(share of SPLITS splits of `rows` by question whose corrected interval holds the person's score, median width
    against the uncorrected interval's); `calibrate(run_indices, rest)` gives each split's Calibration."""
    judged = judge_decides(rows)
    questions = sorted({r["query"] for r in rows})
    rng = np.random.default_rng(seed)
    held, ratios = 0, []
    for split in range(SPLITS):
        chosen = set(rng.choice(questions, len(questions) // 2, replace=False))
        run = [i for i, r in enumerate(rows) if r["query"] in chosen]
        rest = [i for i, r in enumerate(rows) if r["query"] not in chosen]
        result = corrected([verdicts[i] for i in run], [judged[i] for i in run], calibrate(run, rest), seed=split,
                           resamples=RESAMPLES)
        low, high = result["ci95"]["score"]
        held += low <= person_score([rows[i] for i in run]) <= high
        plain = intervals([verdicts[i] for i in run])["score"]
        ratios.append((high - low) / (plain[1] - plain[0]))
    return held / SPLITS, float(np.median(ratios))


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

    share, width = coverage(real, verdicts, other_half, seed=1)
    print(f"labelled set of real answers, {SPLITS} splits by question (run half, calibration half): the corrected "
          f"interval holds the person's score in {share:.1%}; median width {width:.2f} x the uncorrected interval's")
    whole = Calibration("all of the labelled set", confusion(real, verdicts, judged))
    gate = load_set(GATE_SET)
    gate_verdicts = unseen_verdicts(gate, development, model)
    share, width = coverage(gate, gate_verdicts, lambda run, rest: whole, seed=2)
    fixed = corrected(gate_verdicts, judge_decides(gate), whole)
    print(f"across kinds: calibrated on all {sum(whole.counts.values())} judged answers of the labelled set, applied "
          f"to {GATE_SET.name} ({len(gate)} answers, person's score {person_score(gate):+.3f}, judged "
          f"{Scores.of(gate_verdicts).score:+.3f}): corrected "
          f"{fixed['score']:+.3f} [{fixed['ci95']['score'][0]:+.3f}, {fixed['ci95']['score'][1]:+.3f}]; over "
          f"{SPLITS} halves of its questions the interval holds the person's score in {share:.1%} (median width "
          f"{width:.2f} x the uncorrected)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
