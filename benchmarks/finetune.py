"""Fine-tuning benchmark: does a model trained on its own judged runs answer more right and fewer wrong, measured
cross-fit (docs/decisions/fine-tuning.md)?

The base is the embedded default as `make eval` serves it (benchmarks/gate.py's setup: configs/cpu.yaml with
configs/overlays/vllm-cpu.yaml, gate off) over the gate sets (data/gate_dev.jsonl, 128 questions with pages, and
benchmarks/kg_reach/questions.jsonl, 68 KG questions), answered in this run with every conversation recorded and
judged by the rules and a person's verdicts (data/gate_dev/verdicts.jsonl). `tools/train_llm.py data` turns those
records into training data, split into folds by a hash of interaction_id. For each fold, a model trained on the
other folds only answers that fold's questions: every question is answered by a model that never trained on it.

Both the base's and the tuned model's answers are then labelled the same way, by the rules first and the
default judge (`--judge facts`, JUDGE) for sentence answers. Printed, per fold and pooled: answered, right, wrong,
the CRAG score, the paired interval of tuned minus base, the over-refusal (the share of the base's right answers
the tuned model declines), right answers on gate_dev against the organisers' RAG baseline's 36 (measured outside
this repository with the same weights, served with their RoPE base), and training time and tokens/s. Untrained
rows (`--untrained KEY=VALUE`, repeatable) answer the same questions with a setting changed: what a token budget or
a prompt does alone.

Targets (issue "Answers the model learned"): pooled wrong answers at most half the base's, right answers no
fewer than the base's, and at least 36 right on gate_dev. It reports and never gates (exit 0).

    .venv/bin/python -m benchmarks.finetune                              # base, data, the default recipe, 2 folds
    # make bench: train nothing; answer with the fold models runs/finetune holds, else print how to train them
    .venv/bin/python -m benchmarks.finetune --base runs/bench-gate --runs runs/finetune --no-train
    .venv/bin/python -m benchmarks.finetune --runs runs/finetune --reuse  # keep and reuse what is done
    .venv/bin/python -m benchmarks.finetune --base runs/gate --variant sft --variant sft-noraft \\
        --untrained reasoning.summariser_max_tokens=64
    # train on a GPU machine, then answer here: copy --runs back and run the same command with --reuse
    .venv/bin/python -m benchmarks.finetune --runs runs/finetune --base runs/gate --variant sft-2ep-sentence-both \
        --train-only
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from evaluation.gate_sets import PERSON, SETS, answer_set
from evaluation.metrics import paired_difference
from evaluation.runner import load_predictions
from evaluation.verdicts import CORRECT, FACTS, MISS, UNJUDGED, WRONG
from models.llm.hf import resolve_model_folder
from training.judged_data import PAIRS_FILE, SFT_FILE, build, fold_of, read_rows, write
from training.llm_training import ADAPTER, TrainSettings, merge, merged_profile, train
from training.llm_training import MANIFEST as TRAINING_MANIFEST
from utils.cli import command

JUDGE = FACTS  # labels the base's and the tuned models' answers alike: the default judge

T = TypeVar("T")

DEFAULT_VARIANT = "sft-2ep-sentence-both"
BASELINE_RIGHT = 36  # the organisers' rag_llama_baseline.py on gate_dev with the same, correctly served, weights


@dataclass(frozen=True)
class Variant:
    """A training recipe: its settings, whether the RAFT variants are trained on, and the prompts whose
    conversations it trains on (the reasoning prompt answers first; the summariser only where its output does not
    parse)."""

    settings: TrainSettings
    raft: bool = True
    prompts: tuple[str, ...] = ("reasoning",)
    after: str | None = None  # a variant whose fold models this one starts from (DPO after SFT)
    drop: tuple[str, ...] = ()  # target kinds left out
    targets: str = "short"  # training/judged_data.py's target form

    def keeps(self, row: dict) -> bool:
        return (row["prompt_name"] in self.prompts and (self.raft or not row["kind"].startswith("raft"))
                and row["kind"] not in self.drop)


VARIANTS = {
    "sft": Variant(TrainSettings(lora_rank=16, learning_rate=3e-4, epochs=1.0)),
    "sft-noraft": Variant(TrainSettings(lora_rank=16, learning_rate=3e-4, epochs=1.0), raft=False),
    "sft-both-prompts": Variant(TrainSettings(lora_rank=16, learning_rate=3e-4, epochs=1.0),
                                prompts=("reasoning", "summariser")),
    # fewer "i don't know" targets (the RAFT removals), twice over: the first recipe answered "i don't know" to all
    "sft-2ep-noremoved": Variant(TrainSettings(lora_rank=16, learning_rate=3e-4, epochs=2.0), drop=("raft-removed",)),
    # the references' answer-bearing sentence as the target: the short recipes' answers were made up
    "sft-2ep-sentence": Variant(TrainSettings(lora_rank=16, learning_rate=3e-4, epochs=2.0), drop=("raft-removed",),
                                targets="sentence"),
    # the summariser's conversations too: it gives most of the base's answers (benchmarks/README.md "Answer gate")
    "sft-2ep-sentence-both": Variant(TrainSettings(lora_rank=16, learning_rate=3e-4, epochs=2.0),
                                     drop=("raft-removed",), targets="sentence", prompts=("reasoning", "summariser")),
    "sft-2ep-sentence-noraft": Variant(TrainSettings(lora_rank=16, learning_rate=3e-4, epochs=2.0), raft=False,
                                       targets="sentence"),
    "sft-full": Variant(TrainSettings(lora_rank=0, learning_rate=2e-5, epochs=1.0)),
    "sft-dpo": Variant(TrainSettings(method="dpo", lora_rank=16, learning_rate=5e-5, epochs=1.0, beta=0.1),
                       after="sft"),
    "sft-2ep-sentence-dpo": Variant(TrainSettings(method="dpo", lora_rank=16, learning_rate=5e-5, epochs=1.0,
                                                  beta=0.1), after="sft-2ep-sentence", targets="sentence"),
}


def data_folder(root: Path, form: str) -> Path:
    return root / ("data" if form == "short" else f"data-{form}")


def verdicts_of(folder: Path) -> dict[str, str]:
    """The verdict by interaction_id of a judged run folder."""
    return {iid: r.get("verdict") or UNJUDGED for iid, r in load_predictions(folder / "predictions.jsonl").items()}


def fold_file(data: Path, fold: int, folds: int, out: Path) -> Path:
    """The examples of `data` in `fold`, as a .jsonl in `out`."""
    lines = [line for line in data.read_text(encoding="utf-8").splitlines()
             if line.strip() and fold_of(json.loads(line)["interaction_id"], folds) == fold]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return out


def row(label: str, base: dict[str, str], tuned: dict[str, str], right_dev: int | None = None) -> str:
    """A table line: the tuned verdicts against the base's on the same questions."""
    ids = sorted(base)
    a, b = [base[i] for i in ids], [tuned.get(i, UNJUDGED) for i in ids]
    found = paired_difference(a, b)
    ci = found["ci95"]
    base_right = [i for i in ids if base[i] == CORRECT]
    declined = sum(tuned.get(i) == MISS for i in base_right)
    answered = sum(v in (CORRECT, WRONG) for v in b)
    line = (f"| {label} | {len(ids)} | {answered} | {b.count(CORRECT)} | {b.count(WRONG)} | "
            f"{found['score_b']:+.3f} | {found['difference']:+.3f}"
            + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "") + " | "
            + (f"{declined}/{len(base_right)}" if base_right else "-") + " | "
            + ("-" if right_dev is None else str(right_dev)) + " |")
    return line


HEADER = ("| rows | questions | answered | right | wrong | score | minus base [95%] | base's right declined | "
          "right on gate_dev |\n|---|---|---|---|---|---|---|---|---|")


def gated(folders: list[Path]) -> dict[str, str] | str:
    """Each question's verdict through a gate fit and cross-validated on these runs' labelled answers (as
    `local_evaluation.py gate fit` fits one; an answer the gate withholds under cross-validation is a miss), or why
    no gate could be fit."""
    from evaluation.gate_command import run_records
    from evaluation.gate_fit import TooFewLabels, cross_validate, label_records

    records = [r for folder in folders for r in run_records(folder)[0]]
    labelled = label_records(records)
    try:
        cv = cross_validate(labelled)
    except TooFewLabels as err:
        return str(err)
    decided = {q: (CORRECT if y else WRONG) if a else MISS
               for q, y, a in zip(labelled.questions, cv.y, cv.answered)}
    found = {}
    for record in records:
        iid, verdict = record["interaction_id"], record.get("verdict") or UNJUDGED
        found[iid] = decided.get(iid, MISS if verdict == MISS else UNJUDGED)
    return found


def gated_rows(label: str, base_gated: dict[str, str] | str, tuned_gated: dict[str, str] | str) -> list[str]:
    """The gated rows of a model's runs: against the base gated and against always "i don't know"."""
    if isinstance(tuned_gated, str) or isinstance(base_gated, str):
        return [f"| {label}, gated | no gate: {tuned_gated if isinstance(tuned_gated, str) else base_gated} |"]
    return [row(f"{label}, gated, against the base gated", base_gated, tuned_gated),
            row(f"{label}, gated, against always i don't know", {i: MISS for i in base_gated}, tuned_gated)]


def judged_copy(folder: Path, data: Path, out: Path) -> Path:
    """A copy of a run folder judged again by the rules and the default judge (JUDGE)."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(folder, out)
    answer_set(data, out, judge=JUDGE, answer=False)
    return out


def labelled(folders: dict[str, Path]) -> tuple[dict[str, str], int]:
    """Verdicts by interaction_id over the sets' folders, and how many are right on gate_dev."""
    found, dev = {}, 0
    for name, folder in folders.items():
        verdicts = verdicts_of(folder)
        found.update(verdicts)
        dev += sum(v == CORRECT for v in verdicts.values()) if name == "gate-dev" else 0
    return found, dev


def model_folder(root: Path, name: str, fold: int) -> Path:
    """Where recipe `name`'s model trained on every fold but `fold` is kept."""
    return root / name / f"fold{fold}" / ("merged" if VARIANTS[name].settings.lora_rank else "model")


def training_rows(root: Path, name: str, folds: int, fold: int) -> tuple[Path, list[dict]]:
    """(the data file, its rows) recipe `name`'s model for `fold` trains on: the other folds' rows the recipe
    keeps."""
    variant = VARIANTS[name]
    data = data_folder(root, variant.targets) / (SFT_FILE if variant.settings.method == "sft" else PAIRS_FILE)
    return data, [r for r in read_rows(data, set(range(folds)) - {fold}) if variant.keeps(r)]


def untrainable(root: Path, recipes: list[str], args: argparse.Namespace) -> str | None:
    """Why a recipe to be trained here has no training row for one of its fold models, else None. Checked before
    anything trains, so that no recipe stops the run after the ones before it trained: a recipe of the reasoning
    prompt's conversations has none where the answer path turns that prompt off (configs/cpu.yaml)."""
    for name in recipes:
        for fold in range(args.folds):
            if args.reuse and (model_folder(root, name, fold) / "config.json").is_file():
                continue
            data, rows = training_rows(root, name, args.folds, fold)
            if not rows:
                held = sorted({r["prompt_name"] for r in read_rows(data)})
                return (f"--variant {name} trains on the {' and '.join(VARIANTS[name].prompts)} prompt's "
                        f"conversations, and {data} has none it keeps outside fold {fold} (the base's runs recorded "
                        f"the {' and '.join(held) or 'no'} prompt's); choose a recipe that trains on those, such as "
                        f"--variant {DEFAULT_VARIANT}")
    return None


def fold_model(root: Path, name: str, fold: int, args: argparse.Namespace, model: Path,
               manifests: dict[str, dict]) -> tuple[Path, Path]:
    """(the run folder, the model folder) of recipe `name` trained on every fold but `fold`; trained and merged
    here unless --reuse or --no-train finds the model folder already there."""
    variant = VARIANTS[name]
    settings = variant.settings if args.max_steps is None else replace(variant.settings, max_steps=args.max_steps)
    merged = model_folder(root, name, fold)
    out = merged.parent
    start = model
    if variant.after is not None:
        start = root / variant.after / f"fold{fold}" / "merged"
        if not (start / "config.json").is_file():
            raise SystemExit(f"error: {name} starts from {start}: run --variant {variant.after} first")
    if not ((args.reuse or args.no_train) and (merged / "config.json").is_file()):
        data, rows = training_rows(root, name, args.folds, fold)
        in_fresh_process(train, start, rows, out, settings, resume=args.reuse, data_manifest={
            "path": str(data), "manifest": manifests[variant.targets], "excluded_fold": fold, "raft": variant.raft})
        if settings.lora_rank:
            in_fresh_process(merge, start, out / ADAPTER, merged)
    return out, merged


def in_fresh_process(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`function(*args, **kwargs)` in a spawned interpreter. Training here would start torch's OpenMP threads in
    this process, and the model process each answered set forks from it (evaluation/worker.py) then hangs in its
    first parallel region, until every batch's time limit."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args, **kwargs).result()


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=None, help="keep everything here (default: a temp folder)")
    parser.add_argument("--base", type=Path, default=None, help="a folder holding the base's gate-dev and gate-kg "
                        "run folders made with --record-prompts (`benchmarks.gate --record-prompts --runs`); "
                        "default: answer them here")
    parser.add_argument("--reuse", action="store_true", help="keep what --runs already holds (runs, models)")
    parser.add_argument("--folds", type=int, default=2)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), default=None,
                        help=f"a training recipe; repeat (default: {DEFAULT_VARIANT}, the best measured)")
    parser.add_argument("--untrained", action="append", default=[], metavar="KEY=VALUE",
                        help="an untrained row: the base with this config setting; repeat")
    parser.add_argument("--max-steps", type=int, default=None, help="cap each training run (a quick look)")
    parser.add_argument("--train-only", action="store_true", help="train the recipes' fold models and stop (on a "
                        "GPU machine; copy --runs back and answer them here with --reuse)")
    parser.add_argument("--no-train", action="store_true", help="train nothing: answer with the recipes' fold "
                        "models --runs already holds and print the command that trains the others (make bench)")
    args = parser.parse_args(argv)
    if args.no_train and args.train_only:
        print("error: --no-train trains nothing; leave out --train-only", file=sys.stderr)
        return 2
    recipes = args.variant or [DEFAULT_VARIANT]
    for flag, given in (("--reuse", args.reuse), ("--train-only", args.train_only)):
        if given and args.runs is None:
            print(f"error: {flag} needs --runs, the folder that holds the runs", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="finetune-bench-") as scratch:
        root = args.runs or Path(scratch)
        not_on_disk = [] if not args.no_train else [
            name for name in recipes
            if not all((model_folder(root, name, fold) / "config.json").is_file() for fold in range(args.folds))]
        recipes = [name for name in recipes if name not in not_on_disk]
        base_root = args.base or root / "base"
        base = {name: base_root / name for name in SETS}
        for name, data in SETS.items():
            if not (args.reuse or args.base) or not (base[name] / "predictions.jsonl").is_file():
                seconds = answer_set(data, base[name], judge=PERSON, record_prompts=True)
                print(f"base: {name} answered in {seconds:.0f} s into {base[name]}")
        manifests = {}  # --no-train leaves the data its fold models were trained on as it is
        for form in sorted({VARIANTS[name].targets for name in recipes} if not args.no_train else ()):
            built, sources = build(list(base.values()), args.folds, form=form)
            manifests[form] = write(built, sources, data_folder(root, form), args.folds, True, 0, form)
            print(f"data ({form} targets): {manifests[form]['files'][SFT_FILE]['rows']} examples of "
                  f"{manifests[form]['questions']} questions {manifests[form]['kinds']}; skipped "
                  f"{manifests[form]['skipped'] or 'none'}")
        if not args.no_train and (why := untrainable(root, recipes, args)) is not None:
            print(f"error: {why}", file=sys.stderr)
            return 2
        model = resolve_model_folder()  # what --serve-llm serves for the default profile
        if args.train_only:
            for name in recipes:
                for fold in range(args.folds):
                    out, merged = fold_model(root, name, fold, args, model, manifests)
                    print(f"{name}, fold {fold}: {merged}")
            return 0
        labels = {name: judged_copy(base[name], SETS[name], root / f"base-{JUDGE}" / name) for name in SETS}
        base_verdicts, base_dev = labelled(labels)
        lines = [HEADER, row("base (untrained)", base_verdicts, base_verdicts, base_dev)]
        base_gated = gated(list(labels.values()))
        if isinstance(base_gated, str):
            lines.append(f"| base, gated | no gate: {base_gated} |")
        else:
            lines.append(row("base, gated (cross-validated)", base_verdicts, base_gated))
        for setting in args.untrained:
            folders = {name: root / "untrained" / setting.replace("=", "_").replace("/", "_") / name for name in SETS}
            for name, data in SETS.items():
                if not (args.reuse and (folders[name] / "predictions.jsonl").is_file()):
                    answer_set(data, folders[name], judge=JUDGE, sets=(setting,))
            verdicts, dev = labelled(folders)
            lines.append(row(f"untrained, {setting}", base_verdicts, verdicts, dev))
            lines += gated_rows(f"untrained, {setting}", base_gated, gated(list(folders.values())))
        for name in recipes:
            pooled: dict[str, str] = {}
            pooled_dev, seconds, tokens, devices = 0, 0.0, 0.0, set()
            for fold in range(args.folds):
                out, merged = fold_model(root, name, fold, args, model, manifests)
                found = json.loads((out / TRAINING_MANIFEST).read_text(encoding="utf-8"))
                seconds += found["seconds"]
                tokens += found["tokens_per_epoch"] * found["epochs"]
                devices.add(found["device"])
                folders = {}
                for set_name, data in SETS.items():
                    folders[set_name] = out / set_name
                    if not (args.reuse and (folders[set_name] / "predictions.jsonl").is_file()):
                        subset = fold_file(data, fold, args.folds, root / "sets" / f"{set_name}-fold{fold}.jsonl")
                        answer_set(subset, folders[set_name], judge=JUDGE,
                                   sets=(f"llm.profile={merged_profile(merged)}",))
                verdicts, dev = labelled(folders)
                pooled.update(verdicts)
                pooled_dev += dev
                fold_base = {i: v for i, v in base_verdicts.items() if i in verdicts}
                lines.append(row(f"{name}, fold {fold} (trained on the others)", fold_base, verdicts, dev))
            lines.append(row(f"{name}, pooled", base_verdicts, pooled, pooled_dev))
            lines += gated_rows(name, base_gated, gated([root / name / f"fold{fold}" / set_name
                                                         for fold in range(args.folds) for set_name in SETS]))
            lines.append(f"\n{name}: trained {seconds:.0f} s over {args.folds} folds on {', '.join(sorted(devices))}, "
                         f"{tokens / seconds if seconds else 0:.0f} tokens/s\n")
        print("\n".join(lines))
        print(f"targets: right on gate_dev at least {BASELINE_RIGHT} (the organisers' RAG baseline, same weights); "
              "pooled wrong at most half the base's; right no fewer than the base's")
        for name in not_on_disk:
            where = args.runs or Path("runs/finetune")
            print(f"{name}: no fold models in {where}, and --no-train trains none. To train its {args.folds} "
                  f"(LoRA, on these cores or with --train-only on a GPU machine) and answer them:\n"
                  f"    python -m benchmarks.finetune --runs {where}"
                  + (f" --base {args.base}" if args.base else "") + f" --variant {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
