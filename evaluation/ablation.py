"""`local_evaluation.py ablate`: what each module is worth on a competitor's model and data.

A variant is the config with a few edits, each one of
- `-STAGE`: the stage left out of the strategy;
- `+STAGE`: the stage switched on (its `Stage.switch_on` settings) or, where the strategy does not list it, added at
  its place in the seed system's order;
- `KEY=VALUE`: a setting, as --set takes it (a strategy swapped is `strategy=hanrag`, a retriever swapped
  `references.retriever=hash`).

Leave-one-out (the default) applies each variant's edits to the config and sets each row against the full system;
`incremental` applies them in turn, each on top of the last, and sets each row against the row before it, as the
seed paper's Table 2 adds one module at a time. Every row answers with the answer gate off, since a gate is fit on
one setup; the config's gate is applied beside each row whose setup it was fit on.

Every row is answered in this process over the same questions and judged by one judge. The stages before the first
one a row changes are not run again: their query states come from the stage cache (evaluation/stage_cache.py),
which keeps the states at every point where two rows' pipelines part. Each row is a run folder under
`<out>/rows/` (predictions.jsonl and manifest.json, as `run` writes them): its answers are appended batch by batch
and judged once the row is answered, so `compare` reads any two rows, and a killed ablation started again reads back
the rows it finished and the batches it answered of the row it was in.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evaluation import manifest
from evaluation.ablation_rows import Variant, build_variants
from evaluation.choices import ConfigChoice, JudgeChoice, log_to_stderr
from evaluation.compare import compare_records
from evaluation.compare_command import corrected_comparison
from evaluation.data import Selection, check_data_file, read_examples
from evaluation.deadline_cuts import deadline_cell, flips_cut_cell
from evaluation.html_report import ablation_html, write_html
from evaluation.judge import judge_records
from evaluation.metrics import MIN_FOR_INTERVAL, paired_difference
from evaluation.report import score_records
from evaluation.run_command import answers_saved
from evaluation.runner import load_predictions, prediction_record
from evaluation.stage_cache import example_key, pages_of, prefix_signature, state_from_json, state_to_json
from models.config import REPO_ROOT, ConfigError, SystemConfig, resolve_path
from models.gate.answer_gate import gate_settings
from models.llm.profile import served_config
from models.loading import load_config, pipeline_stages
from models.prompting import PromptLibrary
from models.resources import RESOURCES
from models.stages.stage import Stage, run_stage
from models.state import QueryState
from models.system import CragSystem, close_resources, unpack_batch
from utils.answers import IDK
from utils.batch import make_batch
from utils.cache import JsonCache, cache_root, content_key
from utils.cli import check_out
from utils.durable_io import append_lines, json_line, open_text, write_atomic

DEFAULT_OUT = REPO_ROOT / "runs" / "ablation"


def cache_points(signatures: Sequence[Sequence[str]]) -> set[str]:
    """The prefix signatures worth keeping: for each row, the longest prefix (of one stage or more) another row
    shares. `signatures[r][i]`: row r's signature after its first i stages."""
    points = set()
    for r, own in enumerate(signatures):
        others = {s for o, sigs in enumerate(signatures) if o != r for s in sigs[1:]}
        shared = [s for s in own[1:] if s in others]
        if shared:
            points.add(shared[-1])
    return points


class ResourcePool:
    """The resources rows share: one per resource and setting of the sections its builder reads
    (`Resource.sections`), so that a row changing a stage's setting loads no model again."""

    def __init__(self, given: Mapping[str, Any] | None = None) -> None:
        self.given = dict(given or {})  # by name, for every row (tests pass fakes)
        self.built: dict[tuple[str, str], Any] = {}

    @staticmethod
    def key(name: str, resolved: dict[str, Any]) -> tuple[str, str]:
        """The resource `name` under a resolved config: the settings of the sections its builder reads."""
        sections = RESOURCES[name][1].sections
        parts = {s: resolved.get(s) for s in sections} if sections is not None else resolved
        return name, json.dumps(parts, sort_keys=True, default=str)

    def system(self, config: SystemConfig) -> CragSystem:
        """`config`'s system, built with the resources an earlier row built from the same settings."""
        resolved = config.resolved()
        pooled = {name: resource for name in RESOURCES if (resource := self.built.get(self.key(name, resolved)))}
        system = CragSystem(config, given={**pooled, **self.given})
        for name, resource in system.resources.items():
            if resource is not None:
                self.built.setdefault(self.key(name, resolved), resource)
        return system

    def close(self) -> None:
        for (name, _), resource in self.built.items():
            close_resources({name: resource})


def answer_row(system: CragSystem, key_config: SystemConfig, examples: list[dict[str, Any]], cache: JsonCache,
               points: set[str], label: str, kept: Path) -> list[dict[str, Any]]:
    """The records of `system`'s answers to `examples`, as `run` writes them: those in `kept` (the row's
    predictions.jsonl, of this setup) read back, the others answered and appended to it batch by batch. Each batch
    resumes from the deepest cached prefix all its questions have, and its states are kept at every point in
    `points`. A batch's seconds count its cached stages' seconds too, and so does its deadline. `key_config`: the
    config the keys read (before a served KG or LLM put a port in it)."""
    pipeline = system.pipeline
    signatures = [prefix_signature(key_config, system.prompts, pipeline[:i]) for i in range(len(pipeline) + 1)]
    size = system.config.batch_size
    done = load_predictions(kept)
    pending = [example for example in examples if example["interaction_id"] not in done]
    if done:  # whole batches were appended, so the rest splits into the batches an unbroken row would have had
        print(f"{label}: {len(examples) - len(pending)} of {len(examples)} questions answered before ({kept})",
              file=sys.stderr)
    with open_text(kept, "a") as out:
        for start in tqdm(range(0, len(pending), size), desc=label, unit="batch", disable=None, dynamic_ncols=True):
            records = _answer_batch(system, pipeline, signatures, cache, points, pending[start:start + size])
            append_lines(out, [json_line(record) for record in records])
            done.update((record["interaction_id"], record) for record in records)
    return [done[example["interaction_id"]] for example in examples]


def _answer_batch(system: CragSystem, pipeline: list[Stage], signatures: list[str], cache: JsonCache,
                  points: set[str], chunk: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One batch's records, its stages run from the deepest prefix `cache` keeps for all of it."""
    began, spent, states = _cached(cache, signatures, points, chunk)
    started = time.perf_counter()
    shared = system.batch(len(states))
    shared = dataclasses.replace(shared, deadline=shared.deadline.reserve(spent))  # the cached stages' time
    for index in range(began, len(pipeline)):
        run_stage(pipeline[index], states, shared)
        if signatures[index + 1] in points:
            seconds = spent + time.perf_counter() - started
            for example, state in zip(chunk, states):
                cache.put(example_key(signatures[index + 1], example),
                          {"state": state_to_json(state), "seconds": seconds})
    for stage in [system.answer_stage, *system.closing]:
        run_stage(stage, states, shared, always=True)
    seconds = spent + time.perf_counter() - started
    return [prediction_record(example, state.answer or IDK, seconds, len(chunk), False, state.record())
            for example, state in zip(chunk, states)]


def _cached(cache: JsonCache, signatures: list[str], points: set[str],
            chunk: list[dict[str, Any]]) -> tuple[int, float, list[QueryState]]:
    """(stages done, their seconds, the states) of the deepest kept prefix every question of `chunk` has; none done
    and fresh states where none has."""
    for done in range(len(signatures) - 1, 0, -1):
        if signatures[done] not in points:
            continue
        found = [cache.get(example_key(signatures[done], example)) for example in chunk]
        entries = [entry for entry in found if entry is not None]
        if len(entries) == len(chunk):
            return (done, max(entry["seconds"] for entry in entries),
                    [state_from_json(entry["state"], pages_of(e)) for entry, e in zip(entries, chunk)])
    return 0, 0.0, unpack_batch(make_batch(chunk))


@dataclass
class Ablation:
    """One ablation's inputs, checked: its rows, the questions, the judge, where it is written."""

    rows: list[Variant]
    data: Path
    examples: list[dict[str, Any]]
    judge: JudgeChoice
    out: Path
    incremental: bool
    gate_file: str | None = None  # the config's own gate (answer.gate), applied beside the rows it was fit for
    serve_kg: bool = False
    serve_llm: bool = False
    by: tuple[str, ...] = ()
    _inputs: dict[Variant, dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)

    def folder(self, row: Variant) -> Path:
        """The row's run folder: named by the row, and another for any other setup (base config, data, prompts), so
        an ablation of another config into the same --out overwrites no row."""
        return self.out / "rows" / f"{row.slug}-{content_key(json.dumps(self.inputs(row), sort_keys=True))[:8]}"

    def against(self, index: int) -> int:
        """The row `index` is set against: the one before it (incremental), else the full system."""
        return index - 1 if self.incremental else 0

    def inputs(self, row: Variant) -> dict[str, Any]:
        """What changes the row's answers, as a run's manifest records it (computed once a row: it hashes the data)."""
        if row not in self._inputs:
            self._inputs[row] = manifest.answer_inputs(row.config, self.data, None,
                                                       self.serve_kg and row.config.task > 1, self.serve_llm)
        return self._inputs[row]

    def own_manifest(self, row: Variant) -> dict[str, Any] | None:
        """The row folder's manifest, where it names this row's setup."""
        old = manifest.load(self.folder(row))
        return old if old is not None and old.get("answers") == self.inputs(row) else None

    def answering(self, row: Variant) -> Path:
        """The row's predictions.jsonl to append its answers to: kept where the folder's manifest names this setup,
        else emptied and the manifest written anew (unfinished)."""
        folder = self.folder(row)
        folder.mkdir(parents=True, exist_ok=True)
        if self.own_manifest(row) is None:
            (folder / PREDICTIONS).unlink(missing_ok=True)
            judged_by = manifest.judge_record(self.judge.spec, self.judge.model)
            manifest.write(folder, manifest.build(self.inputs(row), Selection(), judged_by))
        return folder / PREDICTIONS

    def finished(self, row: Variant) -> list[dict[str, Any]] | None:
        """The row's judged records, where its folder holds an answer to every question from the same setup."""
        folder = self.folder(row)
        if self.own_manifest(row) is None or not (folder / PREDICTIONS).exists():
            return None
        done = load_predictions(folder / PREDICTIONS)
        ids = [example["interaction_id"] for example in self.examples]
        return [done[i] for i in ids] if all(i in done for i in ids) else None


PREDICTIONS = "predictions.jsonl"


def served(config: SystemConfig, like: SystemConfig, kg: bool, llm: bool) -> SystemConfig:
    """`config` pointed at the KG and LLM servers `like` (the base config, served) was pointed at."""
    if kg and config.task > 1:
        config = config.with_keys("kg", base_url=like.section("kg").base_url)
    return served_config(config, like.llm.openai.base_url) if llm else config


def write_manifest(ablation: Ablation) -> Path:
    """ablation-manifest.json: every row's edits, --set assignments, folder and resolved config."""
    return write_atomic(ablation.out / "ablation-manifest.json", json.dumps({
        "mode": "incremental" if ablation.incremental else "leave-one-out",
        "data": {"name": ablation.data.name, "sha256": manifest.file_hash(ablation.data),
                 "questions": len(ablation.examples)},
        "judge": {"spec": ablation.judge.spec, "model": ablation.judge.model},
        "gate": ablation.gate_file,
        "rows": [{"name": row.name, "edits": list(row.edits), "sets": list(row.sets),
                  "folder": str(ablation.folder(row).relative_to(ablation.out)), "config": row.config.resolved()}
                 for row in ablation.rows]}, indent=2, default=str) + "\n")


def run_rows(ablation: Ablation, cache: JsonCache, served_base: SystemConfig,
             answered: Sequence[list[dict[str, Any]] | None],
             given: Mapping[str, Any] | None = None) -> list[list[dict[str, Any]]]:
    """Every row's judged records: those of a finished row read back (`answered`: Ablation.finished of each row),
    the others answered, each judged by the ablation's judge and its folder written. `given`: resources by name
    every row uses as they are."""
    from evaluation.judge import build_judge

    judge = build_judge(ablation.judge.spec, ablation.judge.model)
    rows = ablation.rows
    signatures = [[prefix_signature(row.config, PromptLibrary(row.config.prompts), stages[:i])
                   for i in range(len(stages) + 1)]
                  for row in rows for stages in [pipeline_stages(row.config)]]
    points = cache_points(signatures)
    pool = ResourcePool(given)
    judged: list[list[dict[str, Any]]] = []
    try:
        for number, (row, records) in enumerate(zip(rows, answered, strict=True), start=1):
            if records is not None:
                print(f"row {number}/{len(rows)} {row.name}: answered before ({ablation.folder(row)})",
                      file=sys.stderr)
            else:
                system = pool.system(served(row.config, served_base, ablation.serve_kg, ablation.serve_llm))
                records = answer_row(system, row.config, ablation.examples, cache, points,
                                     f"row {number}/{len(rows)} {row.name}", ablation.answering(row))
            judge_records(records, judge)  # every row by this judge, those answered before too
            _write_row(ablation, row, records)
            judged.append(records)
    finally:
        pool.close()
    return judged


def _write_row(ablation: Ablation, row: Variant, records: list[dict[str, Any]]) -> None:
    folder = ablation.folder(row)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / PREDICTIONS, "".join(json_line(record) for record in records))
    judged_by = manifest.judge_record(ablation.judge.spec, ablation.judge.model)
    # the manifest written when the row began: its commit, start and (a row read back) finish are the answers'
    began = ablation.own_manifest(row) or manifest.build(ablation.inputs(row), Selection(), judged_by)
    judged = began | {"judge": judged_by}
    manifest.write(folder, judged if began.get("finished") else manifest.finish(judged))


def ablation_kept(rows: Path) -> str:
    """What a killed ablation left in `rows`: the rows it finished and the answers of the one it was in."""
    folders = sorted(rows.iterdir()) if rows.is_dir() else []
    states = [manifest.load(folder) for folder in folders]
    finished = sum(1 for state in states if state is not None and state.get("finished"))
    partial = sum(answers_saved(folder / PREDICTIONS) for folder, state in zip(folders, states)
                  if state is not None and not state.get("finished"))
    kept = [f"{finished} answered row{'s' * (finished != 1)}"] if finished else []
    kept += [f"{partial} answers of an unfinished row"] if partial else []
    return (f"{' and '.join(kept)} are kept in {rows}; the same command answers only the rest" if kept
            else "no question was answered")


def seconds_per_question(records: list[dict[str, Any]]) -> float:
    shares = [r["batch_seconds"] / max(int(r.get("batch_size") or 1), 1) for r in records
              if isinstance(r.get("batch_seconds"), (int, float))]
    return sum(shares) / len(shares) if shares else 0.0


def tabulate(ablation: Ablation, judged: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The table's data: each row's rates, score, paired difference (and corrected one) against the row it is set
    against, LLM calls and seconds per question, by breakdown on request; the gated rows; the smallest difference
    the questions show."""
    rows = []
    for index, (row, records) in enumerate(zip(ablation.rows, judged)):
        summary = score_records(records)
        entry: dict[str, Any] = {
            "name": row.name, "edits": list(row.edits), "folder": str(ablation.folder(row)),
            "overall": summary["overall"], "llm_calls_per_question": summary.get("llm_calls_per_query"),
            "seconds_per_question": seconds_per_question(records), "deadline_cuts": summary.get("deadline_cuts"),
            **{key: summary[key] for key in summary if key.startswith("by_")}}
        if index:
            base = ablation.against(index)
            difference = compare_records(judged[base], records)
            difference.update(corrected_comparison(judged[base], records, ablation.judge))
            entry["against"] = ablation.rows[base].name
            entry["difference"] = difference
            entry["by"] = {key: _group_differences(judged[base], records, key) for key in ablation.by}
        rows.append(entry)
    first = next((r["difference"].get("corrected") for r in rows[1:]), None)
    if first is not None:
        rows[0]["corrected_score"] = first["score_a"]
    for entry in rows[1:]:
        if corrected := entry["difference"].get("corrected"):
            entry["corrected_score"] = corrected["score_b"]
    # a row that changed no verdict has the interval [0, 0], which says nothing of what the questions can show
    widths = sorted((ci[1] - ci[0]) / 2 for r in rows[1:] if (ci := r["difference"]["ci95"]) and ci[1] > ci[0])
    return {"mode": "incremental" if ablation.incremental else "leave-one-out", "data": ablation.data.name,
            "questions": len(ablation.examples), "judge": ablation.judge.spec, "rows": rows,
            "gated": gated_rows(ablation, judged),
            "smallest_shown": widths[len(widths) // 2] if widths else None}


def _group_differences(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str) -> dict[str, Any]:
    groups = sorted({str(r.get(key)) for r in a if r.get(key) not in (None, "")})
    return {group: {k: v for k, v in compare_records([r for r in a if str(r.get(key)) == group],
                                                     [r for r in b if str(r.get(key)) == group]).items()
                    if k != "flipped"}
            for group in groups}


def gated_rows(ablation: Ablation, judged: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The config's gate applied to each row whose setup it was fit on (`gate eval`'s reading of a judged run)."""
    if not ablation.gate_file:
        return []
    from evaluation.gate_command import gated_verdicts, setup_of
    from evaluation.metrics import Scores
    from models.gate.answer_gate import Gate, answering
    from utils.trees import differences

    gate = Gate.load(Path(ablation.gate_file))
    fit_on = answering(gate.fit_on.get("setup") or {})
    found = []
    for row, records in zip(ablation.rows, judged):
        record = manifest.load(ablation.folder(row)) or {}
        if differences(fit_on, setup_of(record)):
            continue
        before, after, withheld = gated_verdicts(gate, records)
        found.append({"name": f"{row.name}, gated", "of": row.name, "withheld": withheld,
                      "overall": Scores.of(after).as_dict(), "difference": paired_difference(before, after)})
    return found


def _interval(result: dict[str, Any]) -> str:
    ci = result.get("ci95")
    return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else f"n<{MIN_FOR_INTERVAL}"


def _difference(result: dict[str, Any] | None) -> str:
    return "-" if not result else f"{result['difference']:+.3f} {_interval(result)}"


def _number(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def format_table(table: dict[str, Any]) -> str:
    """Markdown: one line per row (and per gated row), then the breakdowns asked for, then the smallest
    difference the questions can show."""
    against = "the row before" if table["mode"] == "incremental" else "the full system"
    lines = [f"| row | edits | correct | missing | hallucination | score | Δ score (95% CI) against {against} | "
             "corrected score | corrected Δ (95% CI) | LLM calls / q | s / q | cut by the deadline | "
             "flips the deadline cut |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for entry in table["rows"]:
        s, diff = entry["overall"], entry.get("difference")
        lines.append(f"| {entry['name']} | {' '.join(entry['edits']) or '-'} | {s['accuracy']:.3f} | "
                     f"{s['missing']:.3f} | {s['hallucination']:.3f} | {s['score']:+.3f} | {_difference(diff)} | "
                     f"{_number(entry.get('corrected_score'), '+.3f')} | "
                     f"{_difference((diff or {}).get('corrected'))} | "
                     f"{_number(entry['llm_calls_per_question'], '.2f')} | {entry['seconds_per_question']:.2f} | "
                     f"{deadline_cell(entry)} | {flips_cut_cell(diff)} |")
    for entry in table["gated"]:
        s = entry["overall"]
        lines.append(f"| {entry['name']} | the config's gate withholds {entry['withheld']} | {s['accuracy']:.3f} | "
                     f"{s['missing']:.3f} | {s['hallucination']:.3f} | {s['score']:+.3f} | "
                     f"{_difference(entry['difference'])} against {entry['of']} | - | - | - | - | - | - |")
    for entry in table["rows"][1:]:
        for key, groups in (entry.get("by") or {}).items():
            for group, diff in groups.items():
                lines.append(f"| {entry['name']} | {key}={group} ({diff['questions']} questions) | | | | "
                             f"{diff['score_b']:+.3f} | {_difference(diff)} | | | | | | |")
    shown = table["smallest_shown"]
    if shown is not None:
        note = (f"On these {table['questions']} questions a difference within ±{shown:.3f} is not shown (the median "
                "half-width of the intervals of the rows that changed a verdict): a row whose interval holds 0 moved "
                "no more than chance.")
    elif table["questions"] < MIN_FOR_INTERVAL:
        note = f"Under {MIN_FOR_INTERVAL} questions: no interval."
    else:
        note = "No row changed a verdict of the row it is set against."
    return "\n".join(lines) + "\n\n" + note + "\n"


BREAKDOWNS = ("domain", "question_type", "static_or_dynamic")


def ablate(config: ConfigChoice, data: Path, texts: Sequence[str], incremental: bool = False,
           judge: JudgeChoice = JudgeChoice(), out: Path = DEFAULT_OUT, limit: int | None = None,
           serve_kg: bool = False, serve_llm: bool = False, by: Sequence[str] = (),
           log_level: str = "WARNING", given: Mapping[str, Any] | None = None) -> int:
    """`ablate`: every input checked (the flags, the data, the judge, each row's config and pipeline) before any
    model loads; then the rows answered, judged and tabulated. `given`: resources by name for every row, used as
    they are (tests pass fakes)."""
    from evaluation.judge import check_judge
    from evaluation.llm_server import llm_for_run
    from evaluation.run_command import kg_for_run

    log_to_stderr(log_level)
    check_out(out)
    check_data_file(data, examples=True)
    check_judge(judge.spec, judge.model)
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit {limit}: give a positive number of questions, or leave it out for all")
    for key in by:
        if key not in BREAKDOWNS:
            raise ConfigError(f"--by {key}: break down by {', '.join(BREAKDOWNS)}")
    if not texts:
        raise ConfigError("give the rows: --variant 'NAME: EDITS' (repeatable) or --variants FILE")
    as_given = config.load()
    rows = build_variants(texts, lambda sets: load_config(config.path, config.overlays, [*config.sets, *sets]),
                          incremental, serve_llm)
    examples = list(read_examples(data, limit=limit))
    gate = gate_settings(as_given).gate
    ablation = Ablation(rows, data, examples, judge, out, incremental, str(resolve_path(gate)) if gate else None,
                        serve_kg, serve_llm, tuple(by))
    write_manifest(ablation)
    answered = [ablation.finished(row) for row in rows]
    serve = any(records is None for records in answered)  # rows all read back ask no server anything
    with kg_for_run(rows[0].config, serve_kg and serve) as base, llm_for_run(base, serve_llm and serve) as base:
        judged = run_rows(ablation, JsonCache(cache_root(None) / "stages"), base, answered, given)
    table = tabulate(ablation, judged)
    text = format_table(table)
    write_atomic(out / "ablation.json", json.dumps(table, indent=2, ensure_ascii=False, default=str) + "\n")
    title = f"{'Incremental' if incremental else 'Leave-one-out'} ablation of {as_given.source} on {data.name}"
    write_atomic(out / "ablation.md", f"# {title}\n\n{text}")
    page = write_html(ablation_html(table, title), out / "ablation.html")
    print(text)
    print(f"written: {out / 'ablation.md'}, ablation.json, {page.name} (open it in a browser); each row's run folder "
          f"under {out / 'rows'} (`local_evaluation.py compare A B` reads any two)")
    return 0
