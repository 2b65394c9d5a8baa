"""`run`: answer the selected questions into the run folder (resuming it), then judge, attribute and report
(evaluation/session.py). The model answers in a child process, so a batch over its time limit can be stopped, or in
Ray replicas (--ray); the fixture KG server and the served engine run for the command's length when asked."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from evaluation import manifest
from evaluation.choices import Answering, RunFolder
from evaluation.data import TASK3_PAGES, ReadStats, Selection, count_examples, read_examples
from evaluation.kg_fixture.launch import fixture_kg
from evaluation.llm_server import llm_for_run
from evaluation.runner import EvaluationError, run_model
from evaluation.session import conclude, prepare
from evaluation.worker import ModelWorker
from models.config import SystemConfig
from utils.trees import differences

if TYPE_CHECKING:  # ray is imported with --ray only
    from evaluation.ray_runner import Cluster



def run(folder: RunFolder, answering: Answering = Answering()) -> int:
    """`run`: answer the selected questions into the run folder (resuming it), judge, attribute and report."""
    with contextlib.ExitStack() as resources:  # with --ray: the Ray connection, for the answers and the judge
        session = prepare("run", folder, answering, resources)
        config, predictions = session.config, session.predictions
        if answering.restart and predictions.exists():
            predictions.unlink()
        config = task_for_data(config, folder.data)
        answers = manifest.answer_inputs(config, folder.data, answering.time_limit or None,
                                         answering.serve_kg and config.task > 1, answering.serve_llm)
        run_manifest = manifest.build(answers, session.selection, session.judge_record)
        cluster = session.cluster
        if cluster is not None:  # how it was answered; a resume without --ray goes on with the same answers
            run_manifest["ray"] = {"address": cluster.address, "nodes": cluster.nodes, "cpus": cluster.cpus,
                                   "gpus": cluster.gpus}
        check_resume(session.out_dir, predictions, run_manifest, answering.force_resume)
        manifest.write(session.out_dir, run_manifest)
        with kg_for_run(config, answering.serve_kg) as config, llm_for_run(config, answering.serve_llm) as config:
            manifest.note_served(session.out_dir, run_manifest, config)
            records = answer(config, folder.data, answering, session.stats, session.selection, predictions, cluster)
        session.config = config
        return conclude(session, records, run_manifest, folder.data)


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


def task_for_data(config: SystemConfig, data: Path) -> SystemConfig:
    """The config, with task 3 when the data is Task 3's (50 pages a question) but the config says task 1: the
    data then proves a KG is part of the task. Tasks 1 and 2 look alike in the data; there the config decides."""
    first = next(read_examples(data, limit=1, quiet=True), None)  # the run's own reading names bad lines
    if config.task == 1 and first is not None and len(first["search_results"]) >= TASK3_PAGES:
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
            yield config.with_keys("kg", base_url=url)


def user_model(config: SystemConfig) -> object:
    """The grader's UserModel for `config` (imported here, after the checks: loading models takes seconds)."""
    from models.user_config import UserModel

    return UserModel(config)


class LazyWorker:
    """A ModelWorker started on first use, so a resume with every answer there loads no model."""

    def __init__(self, build: Callable[[], object]) -> None:
        self._build = build
        self._worker: ModelWorker | None = None

    def __getattr__(self, name: str) -> object:
        if self._worker is None:
            self._worker = ModelWorker(self._build)
            print(f"UserModel ready in {self._worker.load_seconds:.1f} s", file=sys.stderr)
        return getattr(self._worker, name)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()


def answer(config: SystemConfig, data: Path, answering: Answering, stats: ReadStats, selection: Selection,
           predictions: Path, cluster: Cluster | None = None) -> list[dict]:
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


def answers_saved(predictions: Path) -> int:
    """How many answers a predictions file holds (0 when there is none yet)."""
    try:
        return sum(1 for line in predictions.read_bytes().split(b"\n")[:-1] if line.strip())
    except OSError:
        return 0
