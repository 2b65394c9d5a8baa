"""Run UserModel over CRAG data, judge the predictions (rules, then an optional LLM judge), write the report.

Commands (the first word; `local_evaluation.py COMMAND --help` lists its flags): run (the default) answers the
selected questions, resuming an interrupted run; rejudge judges a run folder again without the model; merge
combines shard folders; calibrate shows how often a judge agrees with a person (data/judge/); compare A B gives
run B's score difference from run A with a paired interval and the questions that flipped. run, rejudge, merge
and compare take the same selection flags (--domain, --question-type, --static-or-dynamic, --split).
Judges: "rules" (exact match to a gold answer, else wrong), "local" (the embedded SmolLM2 through the hf
backend), the base URL of an OpenAI-compatible server with --judge-model, or "person:FILE" (a person's verdicts,
as data/judge/calibration.jsonl holds them; a prediction the file does not hold stays unjudged).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from loguru import logger
from tqdm import tqdm

from evaluation import manifest
from evaluation.attribution import attribute_records, page_texts
from evaluation.data import (QUESTION_TYPES, DataError, ReadStats, Selection, check_data_file, count_examples,
                             parse_choices, parse_shard, read_examples)
from evaluation.judge import UNJUDGED, LLMJudge, PersonJudge, judge_records
from evaluation.kg_server import KGServerError, fixture_kg
from evaluation.report import format_table, score_records, write_report
from evaluation.runner import EvaluationError, load_predictions, run_model, save_judgements
from evaluation.worker import ModelWorker, WorkerError
from models.config import (DOMAINS, DYNAMISM, ConfigError, HFConfig, OpenAIConfig, SystemConfig,
                           add_config_arguments, config_from_args, config_label)
from models.llm.base import BackendUnavailable
from models.prompting import PROMPT_DIR, PromptError, PromptLibrary, load_prompt
from tools import CommandParser, check_out, check_out_file, interrupted
from utils.trees import differences
from utils.cache import JsonCache, cache_root
from utils.names import closest

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "crag_sample.jsonl"


COMMANDS = ("run", "rejudge", "merge", "calibrate", "compare", "gate")
PERSON = "person:"  # --judge person:FILE
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")  # loguru's
RUN_HELP = "answer the selected questions (resuming the run folder), judge them, write the report (the default)"


def selection_flags() -> argparse.ArgumentParser:
    """The question filters, the same in run, rejudge, merge and compare."""
    flags = CommandParser(add_help=False)
    group = flags.add_argument_group("selection (CRAG's names; a misspelling or an empty selection exits 2)")
    group.add_argument("--domain", default="", help="only these domains, comma-separated (e.g. finance,music)")
    group.add_argument("--question-type", default="", help="only these question types, comma-separated")
    group.add_argument("--static-or-dynamic", default="",
                       help="only these dynamism classes, comma-separated (static, slow-changing, ...)")
    group.add_argument("--split", type=int, default=None, help="only examples with this CRAG split value (0 or 1)")
    return flags


def judge_flags() -> argparse.ArgumentParser:
    flags = CommandParser(add_help=False)
    group = flags.add_argument_group("judge")
    group.add_argument("--judge", default="rules",
                       help="rules, local, person:FILE (a person's verdicts), or an OpenAI-compatible base URL "
                            "such as http://127.0.0.1:8001/v1")
    group.add_argument("--judge-model", default=None, help="model name for a URL judge")
    return flags


def run_folder_flags() -> argparse.ArgumentParser:
    """What run, rejudge and merge share: the data, the config (it names the default run folder), the folder,
    the judge and the bound on unjudged answers."""
    flags = CommandParser(add_help=False, parents=[selection_flags(), judge_flags()])
    flags.add_argument("--data", type=Path, default=DEFAULT_DATA, help="CRAG .jsonl or .jsonl.bz2 file")
    add_config_arguments(flags)
    flags.add_argument("--out", type=Path, default=None, help="run folder (default: runs/<data>__<config>)")
    flags.add_argument("--max-unjudged", type=int, default=0,
                       help="exit 1 (after writing the report) when more predictions than this stay unjudged")
    return flags


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="local_evaluation.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run_parser = commands.add_parser("run", parents=[run_folder_flags()], help=RUN_HELP, description=RUN_HELP)
    run_parser.add_argument("--limit", type=int, default=None, help="only the first N examples (of the shard)")
    run_parser.add_argument("--shard", default="1/1",
                            help="i/n: run the i-th of n equal parts (into <out>/shard-i-of-n); then `merge`")
    run_parser.add_argument("--restart", action="store_true", help="discard earlier predictions of this run folder")
    run_parser.add_argument("--force-resume", action="store_true",
                            help="resume although the setup differs from the run folder's manifest.json (mixes "
                                 "answers)")
    run_parser.add_argument("--time-limit", type=float, default=30.0,
                            help="seconds per query; a batch over batch size x this is timed out (0: no limit)")
    run_parser.add_argument("--serve-kg", action="store_true",
                            help="tasks 2/3: start the fixture KG server (tools/kg_server.py over data/kg) for this "
                                 "run and point the model at it; without it the model uses kg.base_url or "
                                 "$CRAG_MOCK_API_URL")
    run_parser.add_argument("--log-level", default="WARNING",
                            help=f"loguru level for the model's logs: {', '.join(LOG_LEVELS)}")
    run_parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                            help="answer on Ray: one UserModel replica per actor, with the GPUs its config needs, "
                                 "into the same run folder; ADDRESS: a cluster's head (HOST:PORT, ray://HOST:10001 "
                                 "or auto), none for a local Ray instance (`make ray` installs Ray)")
    run_parser.add_argument("--ray-actors", type=int, default=None, metavar="N",
                            help="with --ray: N replicas (default: as many as the cluster's GPUs, or CPUs, hold)")
    run_parser.add_argument("--record-prompts", action="store_true",
                            help="keep every LLM prompt and reply in the question's record (large; shown in "
                                 "report.html); the same as --set record_prompts=true, and no change to the answers")
    commands.add_parser("rejudge", parents=[run_folder_flags()],
                        help="judge a run folder's predictions again (another judge, a new prompt); no model loads")
    commands.add_parser("merge", parents=[run_folder_flags()],
                        help="combine <out>/shard-i-of-n/predictions.jsonl into <out>, judge and report")
    calibrate_parser = commands.add_parser(
        "calibrate", parents=[judge_flags()], help="how often a judge agrees with a person (data/judge/)",
        description="The judge's agreement with a person on the calibration set, by kind, and its confusion matrix.")
    calibrate_parser.add_argument("--set", type=Path, default=None, help="calibration triples (.jsonl)")
    compare_parser = commands.add_parser(
        "compare", parents=[selection_flags(), judge_flags()], help="run B against run A on the same questions",
        description="Run B against run A on the questions both answered (same data file): the score difference "
                    "with a paired bootstrap interval, and the questions that flipped.")
    compare_parser.add_argument("a", type=Path, help="run folder A (the baseline)")
    compare_parser.add_argument("b", type=Path, help="run folder B")
    compare_parser.add_argument("--out", type=Path, default=None, help="where compare.json goes (default: folder B)")
    compare_parser.add_argument("--show", type=int, default=10, help="flipped questions printed per kind")
    gate_parser = commands.add_parser(
        "gate", help="the answer gate: fit one on judged runs, or see what one does to a run",
        description="P(correct | the signals on each record), learnt from judged run folders; an answer under the "
                    "threshold would become \"i don't know\". gate eval shows that on a judged run.")
    gate_commands = gate_parser.add_subparsers(dest="gate_command", metavar="fit|eval", required=True)
    fit_parser = gate_commands.add_parser("fit", help="fit a gate on judged run folders of one setup",
                                          description="Logistic regression on the records' signals, its "
                                                      "regularisation and threshold chosen by cross-validation "
                                                      "grouped by question; prints what it would save and cost.")
    fit_parser.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="judged run folders (--out of run)")
    fit_parser.add_argument("--out", type=Path, required=True, help="the gate file to write (JSON)")
    fit_parser.add_argument("--rules-wrong-is-wrong", action="store_true",
                            help="take an answer that matches no gold answer exactly as wrong (data with short "
                                 "gold answers); without it such answers are left out unless an LLM judged them")
    eval_parser = gate_commands.add_parser("eval", help="apply a gate to a judged run folder (no model loads)",
                                           description="The run's score with and without the gate, paired, and "
                                                       "the answers it withholds.")
    eval_parser.add_argument("gate", type=Path, metavar="FILE", help="a gate file (gate fit --out)")
    eval_parser.add_argument("run", type=Path, metavar="RUN", help="a judged run folder")
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command and its flags; `run` where the first word names no command (`local_evaluation.py --limit 5`)."""
    for old, command in (("--rejudge", "rejudge"), ("--merge", "merge")):
        if old in argv:
            build_parser().error(f"{old} is a command now: local_evaluation.py {command} [options]")
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv = ["run", *argv]
    return build_parser().parse_args(argv)


def selection_of(args: argparse.Namespace, shard: tuple[int, int] = (1, 1), limit: int | None = None) -> Selection:
    """The Selection the filter flags name (ValueError with a did-you-mean for a name CRAG does not have)."""
    return Selection(parse_choices("--domain", args.domain, DOMAINS),
                     parse_choices("--question-type", args.question_type, QUESTION_TYPES), args.split,
                     shard[0], shard[1], limit, parse_choices("--static-or-dynamic", args.static_or_dynamic, DYNAMISM))


def check_judge(spec: str, model_name: str | None) -> None:
    """A ConfigError naming --judge when it cannot name a judge (checked before any model loads)."""
    if spec in ("rules", "local"):
        return
    if spec.startswith(PERSON):
        person_judge(spec)
        return
    if not spec.startswith(("http://", "https://")):
        raise ConfigError(f"--judge {spec!r}: use rules, local, person:FILE, or an http(s) base URL")
    if not model_name:
        raise ConfigError(f"--judge {spec}: name the served model with --judge-model")


def check_ranges(args: argparse.Namespace) -> None:
    """A ConfigError naming the first flag whose value cannot mean anything (checked before any work starts)."""
    rules = (("limit", "--limit", lambda v: v >= 1, "give a positive number of questions, or leave it out for all"),
             ("time_limit", "--time-limit", lambda v: math.isfinite(v) and v >= 0,
              "give seconds per query, or 0 for no limit"),
             ("max_unjudged", "--max-unjudged", lambda v: v >= 0, "give 0 or more"),
             ("ray_actors", "--ray-actors", lambda v: v >= 1, "give 1 or more replicas, or leave it out for as many "
                                                              "as the cluster holds"),
             ("show", "--show", lambda v: v >= 0, "give 0 or more questions to print per kind"))
    for name, flag, valid, fix in rules:
        value = getattr(args, name, None)
        if value is not None and not valid(value):
            raise ConfigError(f"{flag} {value}: {fix}")
    if getattr(args, "ray_actors", None) is not None and getattr(args, "ray", None) is None:
        raise ConfigError(f"--ray-actors {args.ray_actors}: it counts Ray replicas; add --ray [ADDRESS], or leave "
                          "it out")
    if getattr(args, "ray", None) is not None:
        try:
            import ray  # noqa: F401 - only whether it can be imported
        except ImportError:
            raise ConfigError(f"--ray: Ray is not installed in {sys.prefix}; run `make ray` (it installs "
                              "requirements-ray.txt), or leave --ray out for a local run") from None
    level = getattr(args, "log_level", None)
    if level is not None and level.upper() not in LOG_LEVELS:
        close = closest(level.upper(), LOG_LEVELS)
        hint = f"did you mean {close}? " if close else ""
        raise ConfigError(f"--log-level {level!r} is not a log level: {hint}use one of {', '.join(LOG_LEVELS)}")


def check_prompts(overrides: dict[str, str], source: str) -> None:
    """A ConfigError for a prompt override (config `prompts`) that names no prompt, or whose file cannot stand in
    for that prompt (its variables differ: a prompt of another stage); its file is loaded, so a broken one fails
    here too. Checked before any model loads: a stage's failure in a batch would only cost answers."""
    known = sorted(path.stem for path in PROMPT_DIR.glob("*.yaml"))
    library = PromptLibrary(overrides)
    for name in overrides:
        if name not in known:
            close = closest(name, known)
            hint = f"did you mean {close!r}?" if close else f"the names are {', '.join(known)}"
            raise ConfigError(f"{source}: prompts.{name}: no prompt has that name; {hint}")
        check_variant(name, library.get(name).path, f"{source}: prompts.{name}")


def check_variant(name: str, path: Path, label: str) -> None:
    """A ConfigError when the prompt file `path` cannot stand in for prompt `name` (other variables)."""
    wanted = load_prompt(PROMPT_DIR / f"{name}.yaml", name).variables
    given = load_prompt(path, name).variables
    if given != wanted:
        raise ConfigError(f"{label}: {path} declares the variables {sorted(given)} but the {name} prompt is given "
                          f"{sorted(wanted)} (a prompt of another stage?); give a variant of prompts/{name}.yaml")


def person_judge(spec: str) -> PersonJudge:
    """The verdicts of --judge person:FILE; a ConfigError naming the file and its first bad line."""
    path = Path(spec.removeprefix(PERSON))
    if not path.is_file():
        raise ConfigError(f"--judge {spec}: no such file; give person:FILE, a JSON Lines file of {{query, "
                          "prediction, human} verdicts (as data/judge/calibration.jsonl)")
    try:
        return PersonJudge.load(path)
    except ValueError as err:
        raise ConfigError(f"--judge {PERSON}{err}") from None


def build_judge(spec: str, model_name: str | None) -> LLMJudge | PersonJudge | None:
    """The judge named by --judge; None for rules only."""
    check_judge(spec, model_name)
    if spec == "rules":
        return None
    if spec.startswith(PERSON):
        return person_judge(spec)
    if spec == "local":
        from models.llm.hf import HFBackend, resolve_model_folder

        llm, name = HFBackend(HFConfig()), f"hf:{resolve_model_folder(HFConfig()).name}"
    else:
        from models.llm.openai import OpenAIBackend

        llm, name = OpenAIBackend(OpenAIConfig(base_url=spec, model=model_name)), f"{spec}#{model_name}"
    judge = LLMJudge(llm, PromptLibrary().get("judge"), name, JsonCache(cache_root(None) / "judge"))
    judge.probe()
    return judge


def check_resume(out_dir: Path, predictions: Path, new: dict, force: bool) -> None:
    """Refuse to add predictions of this setup to those of another (manifest.json's `answers` differ), unless
    --force-resume; a different commit is only said, since most commits change no answer."""
    if not predictions.exists() or predictions.stat().st_size == 0:
        return
    old = manifest.load(out_dir)
    if old is None:
        print(f"{out_dir}: predictions without a manifest.json (an older run folder); resuming unchecked",
              file=sys.stderr)
        return
    changed = differences(old.get("answers"), new["answers"])
    if changed and not force:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise EvaluationError(f"{out_dir} holds predictions of another setup ({'; '.join(changed[:3])}{more}): "
                              "use --out with a new folder, or --force-resume to mix them")
    if changed:
        print(f"--force-resume: mixing predictions of two setups in {out_dir}: {'; '.join(changed)}", file=sys.stderr)
    if old.get("commit") != new.get("commit") or old.get("dirty"):
        print(f"{out_dir}: earlier predictions come from commit {old.get('commit')}"
              f"{' (with uncommitted changes)' if old.get('dirty') else ''}; this run is {new.get('commit')}",
              file=sys.stderr)


def merge_shards(out_dir: Path, predictions: Path) -> list[dict]:
    """The records of every shard folder under out_dir, written together to `predictions` (shard order); the
    shards' manifests must agree on what changes answers."""
    folders = sorted(out_dir.glob("shard-*-of-*"), key=lambda p: [int(n) for n in re.findall(r"\d+", p.name)])
    counts = {re.fullmatch(r"shard-(\d+)-of-(\d+)", f.name).group(2) for f in folders}
    if not folders or len(counts) != 1:
        raise EvaluationError(f"merge: {out_dir} needs shard-i-of-n folders of one n (found {[f.name for f in folders]})")
    count = int(counts.pop())
    missing = [i for i in range(1, count + 1) if not (out_dir / f"shard-{i}-of-{count}" / "predictions.jsonl").exists()]
    if missing:
        raise EvaluationError(f"merge: shards {missing} of {count} have no predictions.jsonl under {out_dir}")
    manifests = {i: manifest.load(out_dir / f"shard-{i}-of-{count}") for i in range(1, count + 1)}
    unchecked = [i for i, m in manifests.items() if m is None]
    if unchecked:
        print(f"merge: shards {unchecked} of {count} have no manifest.json; their setup is not checked",
              file=sys.stderr)
    first = next((m for m in manifests.values() if m is not None), None)
    for i, shard in manifests.items():
        changed = differences(first.get("answers"), shard.get("answers")) if first and shard else []
        if changed:
            raise EvaluationError(f"merge: shard {i} of {count} was run with another setup than the others "
                                  f"({'; '.join(changed[:3])}); re-run it with the same config, prompts and data")
    records: dict[str, dict] = {}
    for i in range(1, count + 1):
        records.update(load_predictions(out_dir / f"shard-{i}-of-{count}" / "predictions.jsonl"))
    with predictions.open("w", encoding="utf-8") as handle:
        for record in records.values():
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return list(records.values())


TASK3_PAGES = 50  # Task 3 gives 50 pages a question, Tasks 1 and 2 give 5


def task_for_data(config: SystemConfig, data: Path) -> SystemConfig:
    """The config, with task 3 when the data is Task 3's (50 pages a question) but the config says task 1: the
    data then proves a KG is part of the task. Tasks 1 and 2 look alike in the data; there the config decides."""
    first = next(read_examples(data, limit=1), None)
    if config.task == 1 and first is not None and len(first.get("search_results") or []) >= TASK3_PAGES:
        print(f"{data}: {len(first['search_results'])} pages a question is Task 3 data; running task 3 (with the KG) "
              f"although {config.source} says task 1", file=sys.stderr)
        return replace(config, task=3)
    return config


@contextlib.contextmanager
def kg_for_run(config: SystemConfig, serve: bool) -> Iterator[SystemConfig]:
    """The config, pointed at the fixture KG server for the block when `serve` and the task uses a KG."""
    if not serve:
        yield config
    elif config.task == 1:
        print("--serve-kg: task 1 never calls the KG; no server started", file=sys.stderr)
        yield config
    else:
        with fixture_kg() as url:
            print(f"fixture KG server at {url} (data/kg)", file=sys.stderr)
            yield replace(config, kg=replace(config.kg, base_url=url))


def attribute_misses(records: list[dict], run_manifest: dict | None, data: Path, config: SystemConfig) -> None:
    """Error attribution of the wrong and "i don't know" answers, over the run's own data file (a rejudge or merge
    whose --data is not the file the run read gets none, said once)."""
    expected = (run_manifest or {}).get("answers", {}).get("data", {}).get("sha256")
    if expected and expected != manifest.file_hash(data):
        print(f"no error attribution: {data} is not the data file of this run (pass the run's file with --data)")
        for record in records:
            record.pop("attribution", None)
        return
    attribute_records(records, lambda ids: page_texts(data, ids, config.references))


def user_model(config: SystemConfig) -> object:
    """The grader's UserModel for `config` (imported here, after the checks: loading models takes seconds)."""
    from models.user_config import UserModel

    return UserModel(config)


def run(config: SystemConfig, args: argparse.Namespace, stats: ReadStats, selection: Selection,
        predictions: Path, cluster: object | None = None) -> list[dict]:
    """The model over the selected examples: in a child process, so that a batch over its limit can be stopped, or
    (`cluster`, --ray) in Ray replicas."""
    examples = read_examples(args.data, stats, selection=selection)
    count = functools.partial(count_examples, args.data, selection)
    if cluster is not None:
        from evaluation import ray_runner

        gpus = ray_runner.replica_gpus(config)
        actors = ray_runner.replica_count(cluster, gpus, args.ray_actors)
        return ray_runner.run_on_ray(functools.partial(user_model, ray_runner.replica_config(config)), examples,
                                     predictions, actors, gpus, per_query_s=args.time_limit or None, count=count,
                                     log_level=args.log_level.upper(), forward_env=cluster.address != "local")
    model = LazyWorker(functools.partial(user_model, config))
    try:
        return run_model(model, examples, predictions, per_query_s=args.time_limit or None, count=count)
    finally:
        model.close()


class LazyWorker:
    """A ModelWorker started on first use, so a resume with every answer there loads no model."""

    def __init__(self, build: Callable[[], object]) -> None:
        self._build, self._worker = build, None

    def __getattr__(self, name: str) -> object:
        if self._worker is None:
            self._worker = ModelWorker(self._build)
            print(f"UserModel ready in {self._worker.load_seconds:.1f} s", file=sys.stderr)
        return getattr(self._worker, name)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()


def calibrate_command(args: argparse.Namespace) -> int:
    """`calibrate`: the judge's agreement with a person on the calibration set."""
    from evaluation.calibration import CALIBRATION_SET, calibrate, format_calibration, load_set

    try:
        if args.set is not None and not args.set.is_file():
            raise ConfigError(f"--set {args.set}: no such file; give a calibration set (.jsonl, as data/judge/)")
        rows = load_set(args.set or CALIBRATION_SET)
        judge = build_judge(args.judge, args.judge_model)
    except (ConfigError, BackendUnavailable, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_calibration(calibrate(judge, rows), judge.name if judge else "rules"))
    return 0


def gate_command(args: argparse.Namespace) -> int:
    """`gate fit` and `gate eval` (evaluation/gate.py)."""
    from evaluation import gate
    from models.gate import GateError
    from training.gate import TooFewLabels

    try:
        if args.gate_command == "fit":
            check_out_file(args.out)
            print(gate.fit(args.runs, args.out, args.rules_wrong_is_wrong))
        else:
            print(gate.evaluate(args.gate, args.run))
    except (ConfigError, GateError, TooFewLabels, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def compare_command(args: argparse.Namespace) -> int:
    """`compare A B`: run B against run A on the selected questions both answered (same data file)."""
    from evaluation.compare import compare_records, format_comparison, write_comparison

    try:
        check_ranges(args)
        if args.out is not None:
            check_out(args.out)
        selection = selection_of(args)
        runs = []
        for folder in (args.a, args.b):
            predictions = folder / "predictions.jsonl"
            if not predictions.exists():
                raise EvaluationError(f"{predictions} does not exist; give run folders of local_evaluation.py")
            records = [r for r in load_predictions(predictions).values() if selection.keeps(r)]
            if not records:
                raise EvaluationError(f"the selection keeps no question of {predictions}; check --domain, "
                                      "--question-type, --static-or-dynamic and --split")
            runs.append((records, manifest.load(folder)))
        data = [(m or {}).get("answers", {}).get("data", {}) for _, m in runs]
        if all(data) and data[0].get("sha256") != data[1].get("sha256"):
            raise EvaluationError(f"{args.a} ran on {data[0].get('name')} and {args.b} on {data[1].get('name')} "
                                  "(different data files): compare runs of the same questions")
        judge = build_judge(args.judge, args.judge_model)
    except (ConfigError, EvaluationError, BackendUnavailable, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for records, _ in runs:
        judge_records(records, judge)
    result = compare_records(runs[0][0], runs[1][0])
    print(format_comparison(result, str(args.a), str(args.b), args.show))
    written = write_comparison(result, args.out or args.b, str(args.a), str(args.b))
    print(f"comparison: {written[0]}; open {written[1]} in a browser to filter and read the flipped questions")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    try:
        if args.command == "calibrate":
            return calibrate_command(args)
        if args.command == "compare":
            return compare_command(args)
        if args.command == "gate":
            return gate_command(args)
        return evaluate(args)
    except KeyboardInterrupt:
        return interrupted(saved_after_interrupt(args, argv))


def saved_after_interrupt(args: argparse.Namespace, argv: list[str]) -> str:
    """What Ctrl-C left behind and the command that goes on from there (a run resumes: --restart is left out)."""
    predictions = getattr(args, "predictions", None)
    if args.command in ("calibrate", "compare", "gate") or predictions is None:
        return "nothing was written"
    script = os.path.relpath(__file__)
    script = __file__ if script.startswith("..") else script
    again = shlex.join([a for a in argv if a != "--restart"])
    try:
        answers = sum(1 for line in predictions.read_bytes().split(b"\n")[:-1] if line.strip())
    except OSError:
        answers = 0
    command = f"python {script}" + (f" {again}" if again else "")
    if args.command == "run":
        return f"{answers} answers are saved in {predictions}; resume with: {command}"
    return f"{answers} answers are in {predictions}, without this pass's verdicts; run again with: {command}"


def evaluate(args: argparse.Namespace) -> int:
    """`run`, `rejudge` and `merge`: predictions in the run folder (answered now, already there, or gathered from
    the shards), judged, attributed and reported."""
    with contextlib.ExitStack() as resources:  # with --ray: the Ray connection, for the answers and the judge
        return evaluate_in(args, resources)


def evaluate_in(args: argparse.Namespace, resources: contextlib.ExitStack) -> int:
    """evaluate(), with `resources` to hold what lasts until the report is written."""
    merging, rejudging = args.command == "merge", args.command == "rejudge"
    try:
        # Every input is checked before any work: the flags' ranges and the log level, the config and its prompts,
        # the data file's first example, the run folder, the selection and the judge.
        check_ranges(args)
        logger.remove()
        logger.add(lambda message: tqdm.write(message, end="", file=sys.stderr),
                   level=getattr(args, "log_level", "WARNING").upper())
        config = config_from_args(args)  # --config (else $CRAG_CONFIG, else configs/cpu.yaml), --overlay, --set
        if getattr(args, "record_prompts", False):
            config = replace(config, record_prompts=True)
        check_prompts(config.prompts, config.source)
        check_data_file(args.data, examples=True)
        data_name = args.data.name.split(".")[0]
        out_dir = args.out or Path("runs") / f"{data_name}__{config_label(args)}"
        shard = parse_shard(args.shard) if args.command == "run" else (1, 1)
        if shard[1] > 1:
            out_dir = out_dir / f"shard-{shard[0]}-of-{shard[1]}"
        check_out(out_dir)
        predictions = out_dir / "predictions.jsonl"
        args.predictions = predictions  # what a Ctrl-C names
        selection = selection_of(args, shard, getattr(args, "limit", None))
        check_judge(args.judge, args.judge_model)
        # A judge on a server is built and probed now, before any question is answered. The local judge (torch in
        # this process) waits until the run is over: loaded before the model's child process forks, it could leave
        # the child's OpenMP threads deadlocked.
        judge = build_judge(args.judge, args.judge_model) if args.judge.startswith("http") else None
        cluster = None
        if getattr(args, "ray", None) is not None:
            from evaluation import ray_runner

            cluster = resources.enter_context(ray_runner.connected(args.ray))
            print(f"Ray: {cluster.describe()}", file=sys.stderr)
        stats = ReadStats()
        judge_record = {"spec": args.judge, "model": args.judge_model,
                        "prompt_sha256": manifest.file_hash(PromptLibrary().get("judge").path)}
        if merging:
            records = merge_shards(out_dir, predictions)
            shard = manifest.load(next(iter(sorted(out_dir.glob("shard-*-of-*"))), out_dir))
            run_manifest = shard and shard | {"selection": shard["selection"] | {"shard_index": 1, "shard_count": 1}}
        elif rejudging:
            if not predictions.exists():
                raise EvaluationError(f"rejudge: {predictions} does not exist; answer the questions first (run)")
            records = list(load_predictions(predictions).values())
            run_manifest = manifest.load(out_dir)
        else:
            if args.restart and predictions.exists():
                predictions.unlink()
            config = task_for_data(config, args.data)
            answers = manifest.answer_inputs(config, args.data, args.time_limit or None,
                                             args.serve_kg and config.task > 1)
            run_manifest = manifest.build(answers, selection, judge_record)
            if cluster is not None:  # how it was answered; a resume without --ray goes on with the same answers
                run_manifest["ray"] = {"address": cluster.address, "nodes": cluster.nodes, "cpus": cluster.cpus,
                                       "gpus": cluster.gpus}
            check_resume(out_dir, predictions, run_manifest, args.force_resume)
            manifest.write(out_dir, run_manifest)
            with kg_for_run(config, args.serve_kg) as config:
                records = run(config, args, stats, selection, predictions, cluster)
        if merging or rejudging:  # the filters hold here too; the shard and the limit were the run's
            records = [r for r in records if selection.keeps(r)]
        if not records:
            source = predictions if merging or rejudging else args.data
            raise EvaluationError(f"the selection keeps no question of {source}; check --domain, --question-type, "
                                  "--static-or-dynamic, --split and --limit")
        if cluster is None:
            judge = judge or build_judge(args.judge, args.judge_model)
    except (ConfigError, DataError, EvaluationError, BackendUnavailable, PromptError, WorkerError, KGServerError,
            ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if cluster is None:
        judge_records(records, judge)
        judge_name = judge.name if judge else "rules"
    else:  # a pool of Ray tasks, each with its judge
        try:
            judge_name = ray_runner.judge_on_ray(records, functools.partial(build_judge, args.judge,
                                                                            args.judge_model),
                                                 max(1, int(cluster.cpus)), args.log_level.upper())
        except (ConfigError, BackendUnavailable, OSError) as err:
            print(f"error: {err}; the answers are in {predictions}: judge them with `rejudge`", file=sys.stderr)
            return 2
    attribute_misses(records, run_manifest, args.data, config)
    save_judgements(predictions, records)  # each question's record now holds its verdicts too
    summary = score_records(records)
    summary["judge"] = judge_name
    if run_manifest is not None:  # the judge of this report, and when it was written
        manifest.write(out_dir, manifest.finish(run_manifest | {"judge": judge_record | {"name": summary["judge"]}}))
    summary["skipped_lines"] = stats.skipped_lines
    summary["null_predictions"] = sum(r["null_prediction"] for r in records)
    written = write_report(summary, records, out_dir, f"{data_name} with {config.source}, judge {summary['judge']}")
    print(format_table(summary))
    if args.judge == "rules":
        print("judge: rules only (exact match); sentence answers need an LLM judge, and the organisers' column "
              "leaves them unjudged: --judge local or --judge URL")
    if args.judge != "rules" and summary["judged_by"].get("llm") and "judge_confidence" not in summary:
        print(f"judge {judge_name}: its server gave no log-probabilities (transformers serve does not offer them), "
              "so the verdicts carry no confidence")
    if summary["null_predictions"]:
        print(f"predictions that were not a string, read as \"i don't know\": {summary['null_predictions']}")
    if stats.skipped_lines:
        print(f"skipped {len(stats.skipped_lines)} malformed lines of {args.data}: {stats.skipped_lines[:10]}")
    print(f"predictions: {predictions}\nreport: {written[1]}; {written[2]} to open in a browser ({len(written)} files "
          f"in {out_dir})")
    unjudged = sum(r["verdict"] == UNJUDGED for r in records)
    if unjudged > args.max_unjudged:
        print(f"error: {unjudged} predictions unjudged (the judge failed on them), over --max-unjudged "
              f"{args.max_unjudged}: fix the judge and judge the folder again with `rejudge`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
