"""Answer gate benchmark, and the refit of the gate configs/overlays/vllm-cpu.yaml ships (`make gate`).

The embedded default as `make eval` runs it (configs/cpu.yaml with configs/overlays/vllm-cpu.yaml: SmolLM2 served by
vLLM's CPU build, `--serve-llm`; task 2, the KG fixture server over data/kg) answers two sets disjoint from
data/crag_sample.jsonl (which `make eval` runs) with its gate off:
data/gate_dev.jsonl (handwritten pages: the answer present, absent, conflicting, or a false premise) and
benchmarks/kg_reach/questions.jsonl (KG questions without pages). The rules judge each answer first; what they
leave open (an answer in a sentence) takes a person's verdict where the person judged this very answer
(data/gate_dev/verdicts.jsonl, on SmolLM2's answers to both sets), and the containment judge's elsewhere
(`--judge person:FILE+facts`, the default judge); the facts and containment judges' agreement with the person on the
answers both judged is printed, and how many verdicts changed from the labels before the facts judge
(`person:FILE+contains`). `gate fit` on both runs gives the gate and its cross-validated figures over the answered
questions: the CRAG score with no gate, with the gate, always "i don't know" and an oracle that answers only the
right ones, the coverage, and the paired intervals of gate minus no gate and of gate minus always abstaining. The
shipped gate is fit on those labels. Two more `gate:` lines fit the same runs on the old labels and on the
containment judge's alone (`--judge contains`).

Target: the gate above both no gate and always abstaining, answering at least one question. It reports and never
gates (exit 0); a run that fails is an error (exit 1).

`--ceiling` adds what no cross-validated gate on these signals can beat: each signal's AUROC against the person's
labels, and the most questions a gate could answer with its paired interval against always abstaining above 0 when it
ranks by one signal, or by a logistic regression fit and scored on the same answers (in-sample, so optimistic).

    .venv/bin/python -m benchmarks.gate                                # a `gate:` line and the fit's figures
    .venv/bin/python -m benchmarks.gate --out data/gates/cpu.json      # also write the gate (`make gate`)
    .venv/bin/python -m benchmarks.gate --runs runs/gate --reuse       # judge again, fit on the runs kept there
    .venv/bin/python -m benchmarks.gate --runs runs/gate --reuse --ceiling   # and the in-sample ceiling
    .venv/bin/python -m benchmarks.gate --runs runs/gate --record-prompts    # runs kept as training data
    .venv/bin/python -m benchmarks.gate --damaged     # and the line of the model served before the RoPE fix
    .venv/bin/python -m benchmarks.gate --set reasoning.summariser_max_tokens=50   # a candidate path's gate line
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from evaluation.gate_sets import PERSON, SETS, answer_set, check_weights, ungated
from evaluation.verdicts import CONTAINS, FACTS
from models.config import REPO_ROOT
from models.llm.profile import load_profile, write_profile
from utils.cli import command

LABELS = f"{PERSON}+{FACTS}"  # the rules, a person where they saw the answer, the default judge elsewhere
OLD_LABELS = f"{PERSON}+{CONTAINS}"  # the labels the gate was fit on before the facts judge, printed beside


def _ci(found: dict) -> str:
    ci = found["ci95"]
    return f"{found['difference']:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else " (no interval)")


def summary_line(figures: dict, questions: int) -> str:
    """The `gate:` line: the cross-validated scores over the answered questions and whether the target is met."""
    cv = figures["cv_score"]
    abstain = cv["always i don't know"]
    met = cv["gate"] > cv["no gate"] and cv["gate"] > abstain and figures["coverage"] > 0
    return (f"gate: {questions} questions, {figures['records']} answered ({figures['correct']} right); "
            f"cross-validated score over the answered: no gate {cv['no gate']:+.3f}, gate {cv['gate']:+.3f}, "
            f"always i don't know {abstain:+.3f}, oracle {cv['oracle']:+.3f}; the gate answers "
            f"{figures['coverage']:.1%} of those ({figures['coverage'] * figures['records'] / questions:.1%} of all "
            f"questions); gate - no gate {_ci(figures['gate_minus_no_gate'])}; gate - always i don't "
            f"know {_ci(figures['gate_minus_always_idk'])}; target (above both, answering one or more): "
            f"{'met' if met else 'not met'}")


def most_answered(ranking, correct, questions: int) -> str:
    """The largest top-k of `ranking` (best first) whose CRAG points against always abstaining have a paired 95%
    interval above 0, as "k answers (r right), d [lo, hi], s of all", or "none"."""
    from evaluation.metrics import paired_difference
    from evaluation.verdicts import CORRECT, MISS, WRONG

    found = "none"
    for k in range(1, len(ranking) + 1):
        answered = set(ranking[:k].tolist())
        gated = [(CORRECT if c else WRONG) if i in answered else MISS for i, c in enumerate(correct)]
        difference = paired_difference([MISS] * len(correct), gated)
        if difference["ci95"] and difference["ci95"][0] > 0:
            right = int(sum(correct[i] for i in answered))
            found = f"{k} answers ({right} right), {_ci(difference)}, {k / questions:.1%} of all questions"
    return found


def ceiling(labelled, questions: int) -> list[str]:
    """The `ceiling:` lines: per numeric signal, its AUROC (taken in the direction that separates) and
    `most_answered` ranking by it; then the same for an in-sample logistic regression on every signal at each C."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from evaluation.gate_fit import C_GRID, design
    from models.gate.answer_gate import columns_for

    y = np.array(labelled.correct, dtype=int)
    names = sorted({k for s in labelled.signals for k, v in s.items()
                    if isinstance(v, int | float) and not isinstance(v, bool)})
    lines = []
    for name in names:
        raw = np.array([s.get(name) if isinstance(s.get(name), int | float) else np.nan for s in labelled.signals],
                       dtype=float)
        x = np.where(np.isnan(raw), np.nanmin(raw) - 1, raw)  # missing ranks last
        auc = roc_auc_score(y, x)
        x, auc = (x, auc) if auc >= 0.5 else (-x, 1 - auc)
        lines.append(f"ceiling: {name}: AUROC {auc:.2f}; ranked by it, at most "
                     f"{most_answered(np.argsort(-x, kind='stable'), y, questions)}")
    x, _, _ = design(columns_for(labelled.signals), labelled.signals)
    for c in C_GRID:
        p = LogisticRegression(C=c, max_iter=5000).fit(x, y).predict_proba(x)[:, 1]
        lines.append(f"ceiling: every signal, logistic regression C {c:g} fit and scored in-sample: AUROC "
                     f"{roc_auc_score(y, p):.2f}; at most {most_answered(np.argsort(-p, kind='stable'), y, questions)}")
    return lines


def changed(before: list[Path], after: list[Path]) -> str:
    """How many verdicts differ between the runs judged one way (`before`) and the same runs judged another."""
    from evaluation.gate_command import run_records

    moved, total = 0, 0
    for old, new in zip(before, after):
        by_id = {r["interaction_id"]: r["verdict"] for r in run_records(old)[0]}
        for record in run_records(new)[0]:
            total += 1
            moved += by_id.get(record["interaction_id"]) != record["verdict"]
    return f"labels: {moved} of {total} verdicts changed from the old labels (person+contains) to person+facts"


def agreement(labelled: list[Path], contained: list[Path], judge: str = CONTAINS) -> str:
    """Judge `judge`'s agreement with the person on the answers the person judged (their verdicts in the
    `labelled` runs, the judge's in the `contained` copies)."""
    from evaluation.gate_command import run_records

    pairs = []
    for mine, theirs in zip(labelled, contained):
        by_id = {r["interaction_id"]: r for r in run_records(theirs)[0]}
        pairs += [(r["verdict"], by_id[r["interaction_id"]]["verdict"]) for r in run_records(mine)[0]
                  if r.get("judged_by") == "person"]
    same = sum(person == judge for person, judge in pairs)
    wrongly_right = sum(person != "correct" and judge == "correct" for person, judge in pairs)
    name = "containment" if judge == CONTAINS else judge
    return (f"labels: the {name} judge agrees with the person on {same} of {len(pairs)} answers both judged "
            f"({wrongly_right} it calls right that the person did not)" if pairs else
            f"labels: the person judged none of these answers; the {name} judge labelled every sentence")


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="also write the gate file here")
    parser.add_argument("--runs", type=Path, default=None, help="keep the run folders here (default: a temp folder)")
    parser.add_argument("--reuse", action="store_true", help="judge again (the verdicts file may have grown) and fit "
                        "on the run folders already in --runs")
    parser.add_argument("--record-prompts", action="store_true", help="the runs keep every conversation the stages "
                        "sent (training data for tools/train_llm.py data; keep them with --runs)")
    parser.add_argument("--damaged", action="store_true", help="also answer and fit on the model as it was served "
                        "before the RoPE fix (the profile's folder read at RoPE base 10000), for the line the fixed "
                        "model's is measured against")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="answer with this setting "
                        "over the served default (repeatable): the gate of a candidate answer path, before it ships")
    parser.add_argument("--ceiling", action="store_true", help="also print each signal's AUROC and the most a gate "
                        "ranking by it, or by an in-sample fit, could answer with its interval above 0")
    args = parser.parse_args(argv)
    if args.reuse and args.runs is None:
        print("error: --reuse needs --runs, the folder that holds the runs to fit on", file=sys.stderr)
        return 2
    from evaluation.gate_command import fit
    from evaluation.gate_fit import TooFewLabels
    from evaluation.runner import load_predictions
    from models.gate.answer_gate import Gate, GateError

    with tempfile.TemporaryDirectory(prefix="gate-bench-") as scratch:
        root = args.runs or Path(scratch)
        folders = [root / name for name in SETS]
        for (name, data), folder in zip(SETS.items(), folders):
            if args.reuse:  # judged again: verdicts may have been added since the run
                check_weights(ungated(*args.set), folder)
                answer_set(data, folder, judge=LABELS, answer=False)
            else:
                seconds = answer_set(data, folder, judge=LABELS, record_prompts=args.record_prompts,
                                     sets=tuple(args.set))
                print(f"{name}: {data.relative_to(REPO_ROOT)} answered in {seconds:.0f} s into {folder}")
        out = args.out or Path(scratch) / "gate.json"
        try:
            printed = fit(folders, out)
        except TooFewLabels as err:  # SmolLM2 answered too few to fit on: that is the benchmark's finding
            print(f"gate: no gate fit ({err})")
            return 0
        except GateError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        questions = sum(len(load_predictions(folder / "predictions.jsonl")) for folder in folders)
        print(summary_line(Gate.load(out).figures, questions) + " (labels: the rules, a person where they saw the "
              "answer, the facts judge elsewhere)")
        print(printed)
        if args.ceiling:
            from evaluation.gate_command import run_records
            from evaluation.gate_fit import label_records

            labelled = label_records([r for folder in folders for r in run_records(folder)[0]])
            print("\n".join(ceiling(labelled, questions)))
        copies = {}
        for judge in (FACTS, CONTAINS, OLD_LABELS):
            copies[judge] = [Path(scratch) / f"{judge.rsplit('+', 1)[-1]}-{'old-' * (judge == OLD_LABELS)}{f.name}"
                             for f in folders]
            for data, folder, copy in zip(SETS.values(), folders, copies[judge]):
                shutil.copytree(folder, copy)
                answer_set(data, copy, judge=judge, answer=False)
        for judge in (FACTS, CONTAINS):
            print(agreement(folders, copies[judge], judge))
        print(changed(copies[OLD_LABELS], folders))
        print(fit_line(copies[OLD_LABELS], Path(scratch) / "gate-old.json", questions,
                       "labels: the rules, a person where they saw the answer, the containment judge elsewhere, as "
                       "before the facts judge"))
        print(fit_line(copies[CONTAINS], Path(scratch) / "gate-contains.json", questions,
                       "labels: the containment judge"))
        if args.damaged:
            model = write_profile(root / "damaged-model.yaml", load_profile(), damaged_folder(root / "damaged-model"))
            damaged = [root / f"damaged-{name}" for name in SETS]
            for data, folder in zip(SETS.values(), damaged):
                if not (args.reuse and (folder / "predictions.jsonl").is_file()):
                    answer_set(data, folder, judge=LABELS, sets=(*args.set, f"llm.profile={model}"))
            print(fit_line(damaged, Path(scratch) / "gate-damaged.json", questions,
                           "the damaged model, RoPE base 10000; the same labels"))
    return 0


def fit_line(runs: list[Path], out: Path, questions: int, labels: str) -> str:
    """The `gate:` line of a gate fit on `runs` (written to `out`), or why none could be fit."""
    from evaluation.gate_command import fit
    from evaluation.gate_fit import TooFewLabels
    from models.gate.answer_gate import Gate

    try:
        fit(runs, out)
    except TooFewLabels as err:
        return f"gate: no gate fit ({labels}: {err})"
    return summary_line(Gate.load(out).figures, questions) + f" ({labels})"


def damaged_folder(out: Path) -> Path:
    """The model profile's folder as vLLM read it before the RoPE fix: its weights (linked), its config.json with
    RoPE base 10000 under both keys, so that every stack reads the same wrong base."""
    import json

    from models.llm.hf import resolve_model_folder

    source = resolve_model_folder()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in source.iterdir():
        if path.name != "config.json":
            (out / path.name).symlink_to(path)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config["rope_theta"] = 10000.0
    if isinstance(config.get("rope_parameters"), dict):
        config["rope_parameters"]["rope_theta"] = 10000.0
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    sys.exit(main())
