"""What run, rejudge and merge share (each is a module of its own: run_command.py, rejudge_command.py,
merge_command.py): `prepare` checks every input before any work and builds a server judge; `conclude` judges the
records, attributes the misses, saves the verdicts, writes the report and gives the exit status."""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evaluation import manifest
from evaluation.attribution import attribute_records, page_texts
from evaluation.calibration import calibration_for, check_calibration, drift_warnings, judged_by_judge
from evaluation.choices import Answering, JudgeChoice, RunFolder, check_answering, check_prompts, log_to_stderr
from evaluation.correction import corrected
from evaluation.data import ReadStats, Selection, check_data_file, parse_shard
from evaluation.judge import build_judge, check_judge, judge_records
from evaluation.report import format_table, score_records, write_report
from evaluation.runner import EvaluationError, save_judgements
from evaluation.verdicts import CONTAINS, FACTS, UNJUDGED
from models.config import SystemConfig
from models.llm.profile import load_profile
from utils.cli import check_out
from utils.durable_io import held
from utils.errors import HarnessError


@dataclass
class Session:
    """One evaluation command's checked inputs and what `prepare` built for it."""

    folder: RunFolder
    answering: Answering
    config: SystemConfig
    out_dir: Path
    predictions: Path
    selection: Selection
    judge: Any               # a server judge built and probed before any answer, else None until `conclude`
    judge_record: dict[str, Any]
    cluster: Any | None      # with --ray: the connected cluster
    stats: ReadStats


def prepare(command: str, folder: RunFolder, answering: Answering, resources: contextlib.ExitStack) -> Session:
    """Every input checked before any work: the flags' ranges and the log level, the config and its prompts, the
    data file's first example, the run folder, the selection and the judge; with --ray, the cluster joined
    (`resources` disconnects it)."""
    check_answering(folder, answering)
    log_to_stderr(answering.log_level)
    config = folder.config.load()
    if answering.record_prompts:
        config = replace(config, record_prompts=True)
    check_prompts(config.prompts, config.source)
    check_data_file(folder.data, examples=True)
    shard = parse_shard(answering.shard) if command == "run" else (1, 1)
    out_dir = folder.folder(shard)
    check_out(out_dir)
    resources.enter_context(held(out_dir, command))  # one writer per run folder, before anything there changes
    selection = folder.filters.selection(shard, answering.limit)
    judge_spec, judge_model = folder.judge.spec, folder.judge.model
    check_judge(judge_spec, judge_model)
    check_calibration(folder.judge.calibration)
    # A judge on a server is built and probed now, before any question is answered. The local judge (torch in this
    # process) waits until the run is over: loaded before the model's child process forks, it could leave the
    # child's OpenMP threads deadlocked.
    judge = build_judge(judge_spec, judge_model) if judge_spec.startswith("http") else None
    cluster = None
    if answering.ray is not None:
        from evaluation import ray_runner

        cluster = resources.enter_context(ray_runner.connected(answering.ray))
        print(f"Ray: {cluster.describe()}", file=sys.stderr)
    judge_record = manifest.judge_record(judge_spec, judge_model)
    return Session(folder, answering, config, out_dir, out_dir / "predictions.jsonl", selection, judge, judge_record,
                   cluster, ReadStats())


def selected(session: Session, records: list[dict]) -> list[dict]:
    """The records the filters keep (rejudge and merge: the shard and the limit were the run's)."""
    return [r for r in records if session.selection.keeps(r)]


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


def correct_score(records: list[dict], judge: JudgeChoice, config: SystemConfig) -> dict[str, Any]:
    """The report's "corrected" section (the score corrected for the judge's measured errors, evaluation/correction.py)
    and "calibration_note" (which calibration corrected it, or why none did), with any warning that the run's answers
    differ in kind from the calibration set's."""
    calibration, note = calibration_for(judge.spec, judge.model, judge.calibration)
    if calibration is None:
        return {"calibration_note": note}
    model = load_profile(config.llm.profile).name
    return {"corrected": corrected([str(r.get("verdict")) for r in records], judged_by_judge(records), calibration),
            "calibration_note": note, "calibration_warnings": drift_warnings(records, calibration, model)}


def conclude(session: Session, records: list[dict], run_manifest: dict | None, source: Path) -> int:
    """Judge `records` (read from `source`), attribute the misses, save the verdicts with the answers, write the
    report and print its table; 1 when more answers stay unjudged than --max-unjudged allows, else 0."""
    folder, answering, config, predictions = session.folder, session.answering, session.config, session.predictions
    out_dir, judge, stats = session.out_dir, session.judge, session.stats
    judge_spec, judge_model = session.judge_record["spec"], session.judge_record["model"]
    if not records:
        raise EvaluationError(f"the selection keeps no question of {source}; check --domain, --question-type, "
                              "--static-or-dynamic, --split and --limit")
    if session.cluster is None:
        judge = judge or build_judge(judge_spec, judge_model)
        judge_records(records, judge)
        judge_name = judge.name if judge else "rules"
    else:  # a pool of Ray tasks, each with its judge
        try:
            from evaluation import ray_runner

            judge_name = ray_runner.judge_on_ray(records, functools.partial(build_judge, judge_spec, judge_model),
                                                 max(1, int(session.cluster.cpus)), answering.log_level.upper())
        except (HarnessError, OSError) as err:
            raise EvaluationError(f"{err}; the answers are in {predictions}: judge them with `rejudge`") from err
    attribute_misses(records, run_manifest, folder.data, config)
    save_judgements(predictions, records)  # each question's record now holds its verdicts too
    summary = score_records(records)
    summary["judge"] = judge_name
    summary.update(correct_score(records, folder.judge, config))
    if run_manifest is not None:  # the judge of this report, and when it was written
        manifest.write(out_dir, manifest.finish(run_manifest | {"judge": session.judge_record
                                                                 | {"name": summary["judge"]}}))
    summary["skipped_lines"] = stats.skipped_lines
    summary["null_predictions"] = sum(r["null_prediction"] for r in records)
    data_name = folder.data.name.split(".")[0]
    written = write_report(summary, records, out_dir, f"{data_name} with {config.source}, judge {summary['judge']}")
    print(format_table(summary))
    if judge_spec == "rules":
        print("judge: rules only (exact match); sentence answers need an LLM judge, and the organisers' column "
              "leaves them unjudged: --judge local or --judge URL")
    elif judge_spec in (CONTAINS, FACTS):
        how = ("the gold answer's key fact read by rules and a classifier fit on person verdicts" if judge_spec == FACTS
               else "correct where they give the gold answer")
        print(f"judge: {judge_spec} (no model server: sentence answers are {how}, judged by \"{judge_spec}\"; its "
              "agreement with a person: local_evaluation.py calibrate); the organisers' column leaves them unjudged: "
              "--judge URL for an LLM judge")
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
    failed = summary.get("failed", {}).get("answers", 0)
    if failed > folder.max_failed * len(records):
        causes = "; ".join(f"{cause} (x{count})" for cause, count in list(summary["failed"]["by_cause"].items())[:3])
        print(f"error: {failed} of {len(records)} answers had an LLM call or a stage fail, over --max-failed "
              f"{folder.max_failed:g} ({causes}): fix the cause, then run the same command again without --restart "
              "to answer them again", file=sys.stderr)
        return 1
    return 0
