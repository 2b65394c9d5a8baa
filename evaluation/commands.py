"""The commands of local_evaluation.py, one function each, with typed arguments: run, rejudge, merge, calibrate,
compare, gate fit and gate eval. Each returns the exit status and raises a HarnessError (one line, exit 2 through
utils.cli.command) for an input the user can fix; every input is checked before any work starts."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from loguru import logger
from tqdm import tqdm

from evaluation import manifest
from evaluation.attribution import attribute_records, page_texts
from evaluation.data import (
    QUESTION_TYPES,
    DataError,
    ReadStats,
    Selection,
    check_data_file,
    count_examples,
    parse_choices,
    parse_shard,
    read_examples,
)
from evaluation.judge import CONTAINS, UNJUDGED, build_judge, check_judge, judge_records
from evaluation.kg_fixture.launch import fixture_kg
from evaluation.llm_server import llm_for_run
from evaluation.report import format_table, score_records, write_report
from evaluation.runner import EvaluationError, load_predictions, run_model, save_judgements
from evaluation.worker import ModelWorker
from models.config import (
    DOMAINS,
    DYNAMISM,
    REPO_ROOT,
    ConfigError,
    SystemConfig,
    add_config_arguments,
    config_path,
    load_config,
)
from models.gate.answer_gate import GateError
from models.prompting import PROMPT_DIR, PromptLibrary, load_prompt
from utils.cli import check_out, check_out_file
from utils.errors import HarnessError
from utils.names import closest
from utils.trees import differences

DEFAULT_DATA = REPO_ROOT / "data" / "crag_sample.jsonl"
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")  # loguru's
TASK3_PAGES = 50  # Task 3 gives 50 pages a question, Tasks 1 and 2 give 5


@dataclass(frozen=True)
class Filters:
    """The question filters (CRAG's names, comma-separated), the same in run, rejudge, merge and compare."""

    domain: str = ""
    question_type: str = ""
    static_or_dynamic: str = ""
    split: int | None = None

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("selection (CRAG's names; a misspelling or an empty selection exits 2)")
        group.add_argument("--domain", default="", help="only these domains, comma-separated (e.g. finance,music)")
        group.add_argument("--question-type", default="", help="only these question types, comma-separated")
        group.add_argument("--static-or-dynamic", default="",
                           help="only these dynamism classes, comma-separated (static, slow-changing, ...)")
        group.add_argument("--split", type=int, default=None,
                           help="only examples with this CRAG split value (0 or 1)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Filters:
        return cls(args.domain, args.question_type, args.static_or_dynamic, args.split)

    def selection(self, shard: tuple[int, int] = (1, 1), limit: int | None = None) -> Selection:
        """The Selection they name (a ConfigError with a did-you-mean for a name CRAG does not have)."""
        return Selection(parse_choices("--domain", self.domain, DOMAINS),
                         parse_choices("--question-type", self.question_type, QUESTION_TYPES), self.split,
                         shard[0], shard[1], limit, parse_choices("--static-or-dynamic", self.static_or_dynamic,
                                                                  DYNAMISM))


@dataclass(frozen=True)
class JudgeChoice:
    """--judge (contains, rules, local, person:FILE or a server's base URL) and --judge-model (a URL judge's
    model). The default, contains, reads sentence answers by rules, with no model."""

    spec: str = CONTAINS
    model: str | None = None

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("judge")
        group.add_argument("--judge", default=CONTAINS, help="contains (the default: an exact match, else the gold "
                           "answer in the prediction as whole words, not negated, hedged or listed among other "
                           "candidates; no model), rules (exact match only), local (the embedded SmolLM2), "
                           "person:FILE (a person's verdicts, as data/judge/calibration.jsonl), or an "
                           "OpenAI-compatible base URL such as http://127.0.0.1:8001/v1")
        group.add_argument("--judge-model", default=None, help="model name for a URL judge")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> JudgeChoice:
        return cls(args.judge, args.judge_model)


@dataclass(frozen=True)
class ConfigChoice:
    """--config (else $CRAG_CONFIG, else configs/cpu.yaml), then each --overlay, then each --set KEY=VALUE."""

    path: Path | None = None
    overlays: tuple[Path, ...] = ()
    sets: tuple[str, ...] = ()

    def load(self) -> SystemConfig:
        return load_config(self.path, self.overlays, self.sets)

    def label(self) -> str:
        """A short name: the file's stem, the overlays' stems, "set" for --set."""
        return "+".join([config_path(self.path).stem, *(o.stem for o in self.overlays), *(["set"] * bool(self.sets))])


@dataclass(frozen=True)
class RunFolder:
    """What run, rejudge and merge share: the data, the config, the run folder (default runs/<data>__<config>),
    the filters, the judge and how many unjudged answers are tolerated before the exit status is 1."""

    data: Path = DEFAULT_DATA
    config: ConfigChoice = field(default_factory=ConfigChoice)
    out: Path | None = None
    filters: Filters = field(default_factory=Filters)
    judge: JudgeChoice = field(default_factory=JudgeChoice)
    max_unjudged: int = 0

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """Its flags: the filters' and the judge's too."""
        Filters.add_arguments(parser)
        JudgeChoice.add_arguments(parser)
        parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="CRAG .jsonl or .jsonl.bz2 file")
        add_config_arguments(parser)
        parser.add_argument("--out", type=Path, default=None, help="run folder (default: runs/<data>__<config>)")
        parser.add_argument("--max-unjudged", type=int, default=0,
                            help="exit 1 (after writing the report) when more predictions than this stay unjudged")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunFolder:
        return cls(args.data, ConfigChoice(args.config, tuple(args.overlay), tuple(args.sets)), args.out,
                   Filters.from_args(args), JudgeChoice.from_args(args), args.max_unjudged)

    def folder(self, shard: tuple[int, int] = (1, 1)) -> Path:
        out = self.out or Path("runs") / f"{self.data.name.split('.')[0]}__{self.config.label()}"
        return out / f"shard-{shard[0]}-of-{shard[1]}" if shard[1] > 1 else out


@dataclass(frozen=True)
class Answering:
    """How `run` answers: which examples, resume or restart, the time limit, the KG, logs, Ray, prompt records."""

    limit: int | None = None
    shard: str = "1/1"
    restart: bool = False
    force_resume: bool = False
    time_limit: float = 30.0
    serve_kg: bool = False
    log_level: str = "WARNING"
    ray: str | None = None
    ray_actors: int | None = None
    record_prompts: bool = False
    serve_llm: bool = False

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--limit", type=int, default=None, help="only the first N examples (of the shard)")
        parser.add_argument("--shard", default="1/1",
                            help="i/n: run the i-th of n equal parts (into <out>/shard-i-of-n); then `merge`")
        parser.add_argument("--restart", action="store_true", help="discard earlier predictions of this run folder")
        parser.add_argument("--force-resume", action="store_true", help="resume although the setup differs from the "
                            "run folder's manifest.json (mixes answers)")
        parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per query; a batch over batch "
                            "size x this is timed out (0: no limit)")
        parser.add_argument("--serve-kg", action="store_true", help="tasks 2/3: start the fixture KG server "
                            "(evaluation/kg_fixture over data/kg) for this run and point the model at it; without it "
                            "the model uses kg.base_url or $CRAG_MOCK_API_URL")
        parser.add_argument("--serve-llm", action="store_true", help="serve the embedded model (llm.hf.model) with "
                            "the pinned vLLM release's CPU build (.venv-vllm: make vllm-venv) for this run and point "
                            "the openai backend at it (with configs/overlays/vllm-cpu.yaml, as make eval runs it)")
        parser.add_argument("--log-level", default="WARNING",
                            help=f"loguru level for the model's logs: {', '.join(LOG_LEVELS)}")
        parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS", help="answer on Ray: "
                            "one UserModel replica per actor, with the GPUs its config needs, into the same run "
                            "folder; ADDRESS: a cluster's head (HOST:PORT, ray://HOST:10001 or auto), none for a "
                            "local Ray instance (`make ray` installs Ray)")
        parser.add_argument("--ray-actors", type=int, default=None, metavar="N", help="with --ray: N replicas "
                            "(default: as many as the cluster's GPUs, or CPUs, hold)")
        parser.add_argument("--record-prompts", action="store_true", help="keep every LLM prompt and reply in the "
                            "question's record (large; shown in report.html); the same as --set "
                            "record_prompts=true, and no change to the answers")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Answering:
        return cls(args.limit, args.shard, args.restart, args.force_resume, args.time_limit, args.serve_kg,
                   args.log_level, args.ray, args.ray_actors, args.record_prompts, args.serve_llm)


def check_range(flag: str, value: float | None, valid: Callable[[float], bool], fix: str) -> None:
    """A ConfigError naming `flag` when its value cannot mean anything (None: the flag was left out)."""
    if value is not None and not valid(value):
        raise ConfigError(f"{flag} {value}: {fix}")


def check_answering(folder: RunFolder, answering: Answering) -> None:
    """The flags' ranges, --ray's needs and the log level, checked before any work starts."""
    check_range("--limit", answering.limit, lambda v: v >= 1,
                "give a positive number of questions, or leave it out for all")
    check_range("--time-limit", answering.time_limit, lambda v: math.isfinite(v) and v >= 0,
                "give seconds per query, or 0 for no limit")
    check_range("--max-unjudged", folder.max_unjudged, lambda v: v >= 0, "give 0 or more")
    check_range("--ray-actors", answering.ray_actors, lambda v: v >= 1,
                "give 1 or more replicas, or leave it out for as many as the cluster holds")
    if answering.ray_actors is not None and answering.ray is None:
        raise ConfigError(f"--ray-actors {answering.ray_actors}: it counts Ray replicas; add --ray [ADDRESS], or "
                          "leave it out")
    if answering.ray is not None:
        try:
            import ray  # noqa: F401 - only whether it can be imported
        except ImportError:
            raise ConfigError(f"--ray: Ray is not installed in {sys.prefix}; run `make ray` (it installs "
                              "requirements-ray.txt), or leave --ray out for a local run") from None
    level = answering.log_level.upper()
    if level not in LOG_LEVELS:
        close = closest(level, LOG_LEVELS)
        hint = f"did you mean {close}? " if close else ""
        raise ConfigError(f"--log-level {answering.log_level!r} is not a log level: {hint}use one of "
                          f"{', '.join(LOG_LEVELS)}")


def check_prompts(overrides: dict[str, str], source: str) -> None:
    """A ConfigError for a prompt override (config `prompts`) that names no prompt, or whose file cannot stand in
    for that prompt (its variables differ: a prompt of another stage); its file is loaded, so a broken one fails
    here too. Checked before any model loads: a stage's failure in a batch would only cost answers."""
    library = PromptLibrary(overrides)
    for name in overrides:
        check_prompt_name(name, f"{source}: prompts.{name}")
        check_variant(name, library.get(name).path, f"{source}: prompts.{name}")


def check_prompt_name(name: str, label: str) -> None:
    """A ConfigError naming `label`, with the closest name, when no prompts/*.yaml is called `name`."""
    known = sorted(path.stem for path in PROMPT_DIR.glob("*.yaml"))
    if name not in known:
        close = closest(name, known)
        hint = f"did you mean {close!r}?" if close else f"the names are {', '.join(known)}"
        raise ConfigError(f"{label}: no prompt has that name; {hint}")


def check_variant(name: str, path: Path, label: str) -> None:
    """A ConfigError when the prompt file `path` cannot stand in for prompt `name` (other variables)."""
    wanted = load_prompt(PROMPT_DIR / f"{name}.yaml", name).variables
    given = load_prompt(path, name).variables
    if given != wanted:
        raise ConfigError(f"{label}: {path} declares the variables {sorted(given)} but the {name} prompt is given "
                          f"{sorted(wanted)} (a prompt of another stage?); give a variant of prompts/{name}.yaml")


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
        raise EvaluationError(
            f"merge: {out_dir} needs shard-i-of-n folders of one n (found {[f.name for f in folders]})"
        )
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


def answer(config: SystemConfig, data: Path, answering: Answering, stats: ReadStats, selection: Selection,
           predictions: Path, cluster: object | None = None) -> list[dict]:
    """The model over the selected examples: in a child process, so that a batch over its limit can be stopped, or
    (`cluster`, --ray) in Ray replicas."""
    examples = read_examples(data, stats, selection=selection)
    count = functools.partial(count_examples, data, selection)
    per_query_s = answering.time_limit or None
    if cluster is not None:
        from evaluation import ray_runner

        gpus = ray_runner.replica_gpus(config)
        actors = ray_runner.replica_count(cluster, gpus, answering.ray_actors)
        return ray_runner.run_on_ray(functools.partial(user_model, ray_runner.replica_config(config)), examples,
                                     predictions, actors, gpus, per_query_s=per_query_s, count=count,
                                     log_level=answering.log_level.upper(), forward_env=cluster.address != "local")
    model = LazyWorker(functools.partial(user_model, config))
    try:
        return run_model(model, examples, predictions, per_query_s=per_query_s, count=count)
    finally:
        model.close()


def run(folder: RunFolder, answering: Answering = Answering()) -> int:
    """`run`: answer the selected questions into the run folder (resuming it), judge, attribute and report."""
    return _evaluate("run", folder, answering)


def rejudge(folder: RunFolder) -> int:
    """`rejudge`: judge a run folder's predictions again, attribute and report; no model loads."""
    return _evaluate("rejudge", folder, Answering())


def merge(folder: RunFolder) -> int:
    """`merge`: gather <out>/shard-i-of-n/predictions.jsonl into <out>, judge, attribute and report."""
    return _evaluate("merge", folder, Answering())


def _evaluate(command: str, folder: RunFolder, answering: Answering) -> int:
    with contextlib.ExitStack() as resources:  # with --ray: the Ray connection, for the answers and the judge
        return _evaluate_in(command, folder, answering, resources)


def _evaluate_in(command: str, folder: RunFolder, answering: Answering, resources: contextlib.ExitStack) -> int:
    merging, rejudging = command == "merge", command == "rejudge"
    # Every input is checked before any work: the flags' ranges and the log level, the config and its prompts, the
    # data file's first example, the run folder, the selection and the judge.
    check_answering(folder, answering)
    logger.remove()
    logger.add(lambda message: tqdm.write(message, end="", file=sys.stderr), level=answering.log_level.upper())
    config = folder.config.load()
    if answering.record_prompts:
        config = replace(config, record_prompts=True)
    check_prompts(config.prompts, config.source)
    check_data_file(folder.data, examples=True)
    shard = parse_shard(answering.shard) if command == "run" else (1, 1)
    out_dir = folder.folder(shard)
    check_out(out_dir)
    predictions = out_dir / "predictions.jsonl"
    selection = folder.filters.selection(shard, answering.limit)
    judge_spec, judge_model = folder.judge.spec, folder.judge.model
    check_judge(judge_spec, judge_model)
    # A judge on a server is built and probed now, before any question is answered. The local judge (torch in this
    # process) waits until the run is over: loaded before the model's child process forks, it could leave the
    # child's OpenMP threads deadlocked.
    judge = build_judge(judge_spec, judge_model) if judge_spec.startswith("http") else None
    cluster = None
    if answering.ray is not None:
        from evaluation import ray_runner

        cluster = resources.enter_context(ray_runner.connected(answering.ray))
        print(f"Ray: {cluster.describe()}", file=sys.stderr)
    stats = ReadStats()
    judge_record = {"spec": judge_spec, "model": judge_model,
                    "prompt_sha256": manifest.file_hash(PromptLibrary().get("judge").path)}
    if merging:
        records = merge_shards(out_dir, predictions)
        shard_manifest = manifest.load(next(iter(sorted(out_dir.glob("shard-*-of-*"))), out_dir))
        run_manifest = shard_manifest and shard_manifest | {
            "selection": shard_manifest["selection"] | {"shard_index": 1, "shard_count": 1}}
    elif rejudging:
        if not predictions.exists():
            raise EvaluationError(f"rejudge: {predictions} does not exist; answer the questions first (run)")
        records = list(load_predictions(predictions).values())
        run_manifest = manifest.load(out_dir)
    else:
        if answering.restart and predictions.exists():
            predictions.unlink()
        config = task_for_data(config, folder.data)
        answers = manifest.answer_inputs(config, folder.data, answering.time_limit or None,
                                         answering.serve_kg and config.task > 1, answering.serve_llm)
        run_manifest = manifest.build(answers, selection, judge_record)
        if cluster is not None:  # how it was answered; a resume without --ray goes on with the same answers
            run_manifest["ray"] = {"address": cluster.address, "nodes": cluster.nodes, "cpus": cluster.cpus,
                                   "gpus": cluster.gpus}
        check_resume(out_dir, predictions, run_manifest, answering.force_resume)
        manifest.write(out_dir, run_manifest)
        with kg_for_run(config, answering.serve_kg) as config, llm_for_run(config, answering.serve_llm) as config:
            records = answer(config, folder.data, answering, stats, selection, predictions, cluster)
    if merging or rejudging:  # the filters hold here too; the shard and the limit were the run's
        records = [r for r in records if selection.keeps(r)]
    if not records:
        source = predictions if merging or rejudging else folder.data
        raise EvaluationError(f"the selection keeps no question of {source}; check --domain, --question-type, "
                              "--static-or-dynamic, --split and --limit")
    if cluster is None:
        judge = judge or build_judge(judge_spec, judge_model)
        judge_records(records, judge)
        judge_name = judge.name if judge else "rules"
    else:  # a pool of Ray tasks, each with its judge
        try:
            judge_name = ray_runner.judge_on_ray(records, functools.partial(build_judge, judge_spec, judge_model),
                                                 max(1, int(cluster.cpus)), answering.log_level.upper())
        except (HarnessError, OSError) as err:
            raise EvaluationError(f"{err}; the answers are in {predictions}: judge them with `rejudge`") from err
    attribute_misses(records, run_manifest, folder.data, config)
    save_judgements(predictions, records)  # each question's record now holds its verdicts too
    summary = score_records(records)
    summary["judge"] = judge_name
    if run_manifest is not None:  # the judge of this report, and when it was written
        manifest.write(out_dir, manifest.finish(run_manifest | {"judge": judge_record | {"name": summary["judge"]}}))
    summary["skipped_lines"] = stats.skipped_lines
    summary["null_predictions"] = sum(r["null_prediction"] for r in records)
    data_name = folder.data.name.split(".")[0]
    written = write_report(summary, records, out_dir, f"{data_name} with {config.source}, judge {summary['judge']}")
    print(format_table(summary))
    if judge_spec == "rules":
        print("judge: rules only (exact match); sentence answers need an LLM judge, and the organisers' column "
              "leaves them unjudged: --judge local or --judge URL")
    elif judge_spec == CONTAINS:
        print("judge: contains (rules, no model: sentence answers are correct where they give the gold answer, "
              "judged by \"contains\"; its agreement with a person: local_evaluation.py calibrate); the organisers' "
              "column leaves them unjudged: --judge URL for an LLM judge")
    if judge_spec != "rules" and summary["judged_by"].get("llm") and "judge_confidence" not in summary:
        print(f"judge {judge_name}: its server gave no log-probabilities (transformers serve does not offer them), "
              "so the verdicts carry no confidence")
    if summary["null_predictions"]:
        print(f"predictions that were not a string, read as \"i don't know\": {summary['null_predictions']}")
    if stats.skipped_lines:
        print(f"skipped {len(stats.skipped_lines)} malformed lines of {folder.data}: {stats.skipped_lines[:10]}")
    print(f"predictions: {predictions}\nreport: {written[1]}; {written[2]} to open in a browser ({len(written)} files "
          f"in {out_dir})")
    unjudged = sum(r["verdict"] == UNJUDGED for r in records)
    if unjudged > folder.max_unjudged:
        print(f"error: {unjudged} predictions unjudged (the judge failed on them), over --max-unjudged "
              f"{folder.max_unjudged}: fix the judge and judge the folder again with `rejudge`", file=sys.stderr)
        return 1
    return 0


def calibrate(judge: JudgeChoice, calibration_sets: list[Path] | None = None) -> int:
    """`calibrate`: the judge's agreement with a person on each calibration set (default: both of data/judge/),
    then its figures by part (`evaluation.calibration.figures`) on each set and, for several, on all together."""
    from evaluation.calibration import SETS, by_part, format_calibration, format_figures, load_set
    from evaluation.calibration import calibrate as agreement

    for path in calibration_sets or ():
        if not path.is_file():
            raise ConfigError(f"--set {path}: no such file; give a calibration set (.jsonl, as data/judge/)")
    loaded = []
    for path in calibration_sets or SETS:
        try:
            loaded.append((path, load_set(path)))
        except OSError as err:
            raise DataError(f"{path}: unreadable ({err})") from err
    built = build_judge(judge.spec, judge.model)
    name = built.name if built else "rules"
    table = []
    for path, rows in loaded:
        result = agreement(built, rows)
        print(format_calibration(result, name, path.name) + "\n")
        table.append((path.name, result["parts"]))
    if len(loaded) > 1:
        table.append(("all sets", by_part([row for _, rows in loaded for row in rows])))
    print(format_figures(table, name))
    return 0


def compare(a: Path, b: Path, filters: Filters = Filters(), judge: JudgeChoice = JudgeChoice(),
            out: Path | None = None, show: int = 10) -> int:
    """`compare A B`: run B against run A on the selected questions both answered (same data file)."""
    from evaluation.compare import compare_records, format_comparison, write_comparison

    check_range("--show", show, lambda v: v >= 0, "give 0 or more questions to print per kind")
    if out is not None:
        check_out(out)
    selection = filters.selection()
    runs = []
    for folder in (a, b):
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
        raise EvaluationError(f"{a} ran on {data[0].get('name')} and {b} on {data[1].get('name')} "
                              "(different data files): compare runs of the same questions")
    built = build_judge(judge.spec, judge.model)
    for records, _ in runs:
        judge_records(records, built)
    result = compare_records(runs[0][0], runs[1][0])
    print(format_comparison(result, str(a), str(b), show))
    written = write_comparison(result, out or b, str(a), str(b))
    print(f"comparison: {written[0]}; open {written[1]} in a browser to filter and read the flipped questions")
    return 0


def gate_fit(runs: list[Path], out: Path, rules_wrong_is_wrong: bool = False) -> int:
    """`gate fit`: a gate fitted on judged run folders of one setup, written to `out`."""
    from evaluation import gate_command as gate

    check_out_file(out)
    try:
        print(gate.fit(runs, out, rules_wrong_is_wrong))
    except OSError as err:
        raise GateError(str(err)) from err
    return 0


def gate_eval(gate_file: Path, run_folder: Path) -> int:
    """`gate eval`: what a gate does to a judged run folder."""
    from evaluation import gate_command as gate

    try:
        print(gate.evaluate(gate_file, run_folder))
    except OSError as err:
        raise GateError(str(err)) from err
    return 0


def answers_saved(predictions: Path) -> int:
    """How many answers a predictions file holds (0 when there is none yet)."""
    try:
        return sum(1 for line in predictions.read_bytes().split(b"\n")[:-1] if line.strip())
    except OSError:
        return 0
