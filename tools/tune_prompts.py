"""Offline prompt tuning: compare variants of one prompt over the same cached upstream results.

The stages before the first stage that uses the tuned prompt run once per question, and their output (the
query states) is cached by content hash under the cache folder (`stages/`), so a second tuning run calls no
upstream stage at all. For each variant only the stages from that one on run again, then the answers are
judged and a side-by-side table of scores and deltas against the first variant is printed and written
(`tuning.json`, `tuning.md`, and `tuning.png` with the score deltas).

    python tools/tune_prompts.py --prompt reasoning --variant prompts/reasoning.yaml \\
        --variant my/reasoning_short.yaml --data data/crag_sample.jsonl --limit 40 --judge rules
    python tools/tune_prompts.py --grid my/grid.yaml --data data/crag_sample.jsonl
    python tools/tune_prompts.py --variant prompts/reasoning.yaml --setting reasoning.summariser_max_tokens=64 \\
        --data data/gate_dev.jsonl --overlay configs/overlays/vllm-cpu.yaml --serve-llm --serve-kg --folds 4

A `--setting KEY=VALUE` is one more variant: the first prompt file with that setting over the config; it may
change only the tuned prompt's stage or those after it. With `--folds K` the choice itself is measured: for each
fold of the questions (a hash of interaction_id), the variant that scores best on the other folds answers it, and
the pooled held-out score of those choices is printed beside the first variant's on the same questions.

A grid file names the prompt, a base file and, for each piece of its text, the alternatives to try; every
combination becomes a variant (the base itself first):

    prompt: reasoning
    base: prompts/reasoning.yaml
    replace:
      "Think step by step, then give a short answer.": ["Answer at once.", "List the facts, then answer."]
      "5. The answer is as short as possible": ["5. The answer is one short phrase"]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evaluation.compare import compare_records, format_comparison
from evaluation.data import check_data_file, read_examples
from evaluation.judge import judge_records
from evaluation.llm_server import llm_for_run
from evaluation.metrics import POINTS, paired_difference
from evaluation.report import score_records
from evaluation.run_command import kg_for_run
from evaluation.stage_cache import (
    example_key,
    pages_of,
    prefix_signature,
    read_sections,
    state_from_json,
    state_to_json,
)
from evaluation.verdicts import CORRECT, FACTS, MISS, UNJUDGED, WRONG
from models.config import REPO_ROOT, ConfigError, SystemConfig, add_config_arguments
from models.loading import config_from_args, load_config
from models.prompting import PromptLibrary
from models.stages.stage import Batch, run_stage
from models.state import QueryState
from models.system import CragSystem, unpack_batch
from training.judged_data import fold_of
from utils.batch import make_batch
from utils.cache import JsonCache, cache_root
from utils.cli import CommandParser, check_out, command, interrupted


class Tuner:
    """Runs upstream stages once (cached) and downstream stages once per variant of `prompt`."""

    def __init__(self, system: CragSystem, prompt: str, cache: JsonCache,
                 key_config: SystemConfig | None = None) -> None:
        """`key_config`: the config the cache keys read (default: the system's), e.g. before a served KG or LLM
        put a fresh port in it."""
        stages = system.pipeline
        split = next((i for i, s in enumerate(stages) if prompt in s.prompts), None)
        if split is None:
            raise ConfigError(f"--prompt {prompt!r}: no stage of strategy {system.config.strategy} uses it "
                              f"(stages: {[s.name for s in stages]})")
        self.system, self.prompt, self.cache = system, prompt, cache
        self.key_config = key_config or system.config
        self.upstream, self.downstream = stages[:split], stages[split:]
        # a setting of a section only the tuned stages read (a summariser budget) answers from the same cache
        self.downstream_only = frozenset(read_sections(self.downstream) - read_sections(self.upstream))
        self._signature = prefix_signature(self.key_config, system.prompts, self.upstream)

    def upstream_states(self, examples: list[dict[str, Any]]) -> list[QueryState]:
        keys = [example_key(self._signature, e) for e in examples]
        cached = [self.cache.get(key) for key in keys]
        missing = [i for i, value in enumerate(cached) if value is None]
        batch_size = self.system.config.batch_size
        steps = range(0, len(missing), batch_size)
        for start in tqdm(steps, desc=f"upstream stages ({len(examples) - len(missing)} cached)", unit="batch",
                          disable=None if missing else True, dynamic_ncols=True):
            chunk = missing[start:start + batch_size]
            states = unpack_batch(make_batch([examples[i] for i in chunk]))
            batch = self.system.batch(len(states))
            for stage in self.upstream:
                run_stage(stage, states, batch)
            for i, state in zip(chunk, states):
                cached[i] = state_to_json(state)
                self.cache.put(keys[i], cached[i])
        states = []
        for value, example in zip(cached, examples):
            assert value is not None  # each one missing was computed above
            states.append(state_from_json(value, pages_of(example)))
        return states

    def check_setting(self, key: str) -> None:
        """A ConfigError where setting `key` would change what an upstream stage did (its cached result)."""
        section = key.partition(".")[0]
        if section not in self.downstream_only:
            raise ConfigError(f"--setting {key}: only a section of the stages from {self.downstream[0].name} on can "
                              f"vary ({sorted(read_sections(self.downstream))}); run "
                              "local_evaluation.py with --set for any other")

    def variant_answers(self, states: list[QueryState], variant: str, label: str = "",
                        config: SystemConfig | None = None) -> list[str]:
        """Each state's answer with prompt file `variant`, the downstream stages reading `config` (default: the
        system's)."""
        config = config or self.system.config
        prompts = PromptLibrary({**self.system.config.prompts, self.prompt: variant})
        prompts.get(self.prompt)  # a broken variant fails before any call
        answers: list[str] = []
        batch_size = self.system.config.batch_size
        for start in tqdm(range(0, len(states), batch_size), desc=label or Path(variant).name, unit="batch",
                          disable=None, dynamic_ncols=True):
            batch = [copy.deepcopy(s) for s in states[start:start + batch_size]]
            shared = Batch.start(config, len(batch), prompts, self.system.resources, self.system.clock)
            for stage in self.downstream:
                run_stage(stage, batch, shared)
            run_stage(self.system.answer_stage, batch, shared, always=True)
            answers.extend(s.answer or "" for s in batch)  # the answer step answers every query
        return answers


CRITERIA = {"score": POINTS, "right": {CORRECT: 1, MISS: 0, WRONG: 0}}


def cross_validated(verdicts: dict[str, list[str]], folds: list[int], criterion: str = "score") -> dict[str, Any]:
    """The choice of a variant, measured on questions it was not chosen on: for each fold, the variant with the best
    mean `criterion` over the other folds' judged questions (ties: the earlier variant) answers that fold; the
    criterion is the CRAG score, or the share right (where a gate after the answer is to withhold the wrong ones).
    `verdicts`: each variant's verdict per question, variants in order, the first the baseline; `folds`: each
    question's fold. The held-out verdicts are compared, paired, with the baseline's on the same questions."""
    names = list(verdicts)
    worth = CRITERIA[criterion]

    def best(keep: list[bool]) -> str:
        def mean(name: str) -> float:
            points = [worth[v] for v, k in zip(verdicts[name], keep) if k and v != UNJUDGED]
            return sum(points) / len(points) if points else float("-inf")

        return max(names, key=lambda name: (mean(name), -names.index(name)))

    chosen = {fold: best([f != fold for f in folds]) for fold in sorted(set(folds))}
    held_out = [verdicts[chosen[f]][i] for i, f in enumerate(folds)]
    right = sum(v == CORRECT for v in held_out)
    return {"criterion": criterion, "folds": len(chosen), "chosen_per_fold": [chosen[f] for f in sorted(chosen)],
            "held_out_right": right, "held_out_wrong": sum(v == WRONG for v in held_out),
            "held_out": paired_difference(verdicts[names[0]], held_out),
            "chosen_on_all": best([True] * len(folds))}


def format_cross_validated(result: dict[str, Any], first: str) -> str:
    held = result["held_out"]
    interval = "n<10" if held["ci95"] is None else f"[{held['ci95'][0]:+.3f}, {held['ci95'][1]:+.3f}]"
    return (f"cross-validated over {result['folds']} folds, chosen by {result['criterion']}: chosen per fold "
            f"{result['chosen_per_fold']}; held out, {result['held_out_right']} right and {result['held_out_wrong']} "
            f"wrong, score {held['score_b']:+.3f} against {first}'s {held['score_a']:+.3f} on the same "
            f"{held['questions']} judged questions: {held['difference']:+.3f} {interval}; chosen on every question: "
            f"{result['chosen_on_all']}")


def compare(rows: dict[str, dict[str, Any]]) -> str:
    """Markdown: one row per variant and breakdown group, with the score delta against the first variant."""
    names = list(rows)
    base = rows[names[0]]
    lines = ["| variant | group | n | score | Δ score | accuracy | hallucination | missing | unjudged |",
             "|---|---|---|---|---|---|---|---|---|"]
    groups = [("overall", "overall", None)] + [
        (section, group, section) for section in base if section.startswith("by_") for group in base[section]
    ]
    for _section, group, parent in groups:
        for name in names:
            s = rows[name]["overall"] if parent is None else rows[name].get(parent, {}).get(group)
            b = base["overall"] if parent is None else base.get(parent, {}).get(group)
            if s is None or b is None:
                continue
            label = group if parent is None else f"{parent[3:]}={group}"
            lines.append(f"| {name} | {label} | {s['total']} | {s['score']:.3f} | {s['score'] - b['score']:+.3f} | "
                         f"{s['accuracy']:.3f} | {s['hallucination']:.3f} | {s['missing']:.3f} | {s['unjudged']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    """Score deltas against the first variant, overall and per domain, one bar group per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    base = rows[names[0]]
    groups = ["overall"] + list(base.get("by_domain", {}))

    def score(summary: dict[str, Any], group: str) -> float:
        entry = summary["overall"] if group == "overall" else summary.get("by_domain", {}).get(group)
        return entry["score"] if entry else 0.0

    figure, axis = plt.subplots(figsize=(max(5.0, 0.9 * len(groups) * max(len(names) - 1, 1) + 2), 3.2))
    others = names[1:] or names
    width = 0.8 / len(others)
    for offset, name in enumerate(others):
        deltas = [score(rows[name], g) - score(base, g) for g in groups]
        axis.bar([i + offset * width for i in range(len(groups))], deltas, width, label=name)
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups, rotation=30, ha="right")
    axis.axhline(0, color="black", linewidth=0.6)
    axis.set_ylabel(f"score - {names[0]}")
    axis.set_title("score delta against the baseline variant")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def grid_variants(path: Path, out_dir: Path) -> tuple[str, list[str]]:
    """(prompt name, variant files) of a grid file; the combinations are written under out_dir/variants/."""
    import itertools

    import yaml

    try:
        grid = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--grid {path}: unreadable ({err})") from err
    if (not isinstance(grid, dict) or not {"prompt", "base", "replace"} <= grid.keys()
            or not isinstance(grid["replace"], dict)):
        raise ConfigError(f"--grid {path}: needs 'prompt', 'base' and a 'replace' mapping of text to alternatives")
    base_path = Path(grid["base"]) if Path(grid["base"]).is_absolute() else REPO_ROOT / grid["base"]
    if not base_path.is_file():
        raise ConfigError(f"--grid {path}: base {grid['base']} not found")
    base = base_path.read_text(encoding="utf-8")
    absent = [text for text in grid["replace"] if text not in base]
    if absent:
        raise ConfigError(f"--grid {path}: {absent[0]!r} does not occur in {grid['base']}")
    choices = [[(text, None)] + [(text, alt) for alt in (alts if isinstance(alts, list) else [alts])]
               for text, alts in grid["replace"].items()]
    folder = out_dir / "variants"
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for number, combination in enumerate(itertools.product(*choices)):
        text = base
        for original, alternative in combination:
            if alternative is not None:
                text = text.replace(original, str(alternative))
        target = folder / f"{grid['prompt']}_v{number}.yaml"
        target.write_text(text, encoding="utf-8")
        files.append(str(target))
    return str(grid["prompt"]), files


def variant_path(variant: str) -> Path:
    """A variant file as given (from the working folder), else from the repository; a ConfigError if neither
    exists."""
    for candidate in (Path(variant), REPO_ROOT / variant):
        if candidate.is_file():
            return candidate.resolve()
    raise ConfigError(f"--variant {variant}: no such prompt file")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", default="reasoning", help="the prompt name to vary (a file stem of prompts/)")
    parser.add_argument("--variant", action="append", default=[],
                        help="a prompt file; give it once per variant; the first is the baseline")
    parser.add_argument("--grid", type=Path, default=None, help="a grid file of text alternatives (see above)")
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "data" / "crag_sample.jsonl")
    add_config_arguments(parser)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--judge", default=FACTS, help="facts (the default judge of every command: the gold answer's "
                        "key fact read by rules and a fitted classifier, no model), contains (containment rules), "
                        "rules (exact match only), local, or an OpenAI-compatible base URL")
    parser.add_argument("--judge-model", default=None)
    parser.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                        help="one more variant: the first prompt file with this setting over the config (repeatable)")
    parser.add_argument("--folds", type=int, default=None, metavar="K",
                        help="measure the choice: each fold answered by the variant best on the other folds")
    parser.add_argument("--criterion", choices=sorted(CRITERIA), default="score", help="with --folds: choose by "
                        "the CRAG score, or by the share right (an answer gate after it withholds the wrong ones)")
    parser.add_argument("--serve-kg", action="store_true", help="start the fixture KG server (as local_evaluation.py)")
    parser.add_argument("--serve-llm", action="store_true", help="serve the embedded model with vLLM's CPU build "
                        "(as local_evaluation.py; with configs/overlays/vllm-cpu.yaml)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "tuning")
    return parser.parse_args(argv)


def setting_config(args: argparse.Namespace, config: SystemConfig, setting: str) -> SystemConfig:
    """`config` with one `--setting KEY=VALUE` (KEY as section.key), checked as --set checks it."""
    key = setting.partition("=")[0].strip()
    section, _, name = key.partition(".")
    if not name or "." in name:
        raise ConfigError(f"--setting {setting!r}: write SECTION.KEY=VALUE, e.g. reasoning.summariser_max_tokens=64")
    checked = load_config(args.config, args.overlay, [*args.sets, setting])
    return config.with_keys(section, **{name: getattr(checked.section(section), name)})


@command
def main(argv: list[str] | None = None, system: CragSystem | None = None) -> int:
    args = parse_args(argv)
    try:
        return tune(args, system)
    except KeyboardInterrupt:
        return interrupted(f"nothing written to {args.out}; the upstream stages' results cached so far are kept, "
                           "so the same command goes on from there")


def tune(args: argparse.Namespace, system: CragSystem | None) -> int:
    from evaluation.choices import check_prompt_name, check_prompts, check_variant
    from evaluation.judge import build_judge, check_judge

    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit {args.limit}: give a positive number of questions, or leave it out for all")
    if args.folds is not None and args.folds < 2:
        raise ConfigError(f"--folds {args.folds}: give 2 or more, or leave it out")
    check_out(args.out)
    check_data_file(args.data, examples=True)
    check_judge(args.judge, args.judge_model)
    if args.grid is not None:
        args.prompt, grid_files = grid_variants(args.grid, args.out)
        args.variant = args.variant + grid_files
    if len(args.variant) < 1:  # a --setting varies the first prompt file
        raise ConfigError("give prompt files with --variant, or a --grid file")
    for variant in args.variant:  # every file is there before a model loads
        variant_path(variant)
    config = system.config if system is not None else config_from_args(args)
    check_prompts(config.prompts, config.source)
    check_prompt_name(args.prompt, f"--prompt {args.prompt!r}")
    for variant in args.variant:
        check_variant(args.prompt, variant_path(variant), f"--variant {variant}")
    if args.prompt == "reasoning" and len(args.variant) > 1 and not config.reasoning.max_tokens:
        raise ConfigError(f"{config.source}: reasoning.max_tokens is 0, so the reasoning prompt is never sent and its "
                          "variants would answer alike; add --set reasoning.max_tokens=96 to tune it")
    for setting in args.setting:  # every setting is checked before a model loads
        setting_config(args, config, setting)
    given = config
    with kg_for_run(config, args.serve_kg) as config, llm_for_run(config, args.serve_llm) as config:
        system = system or CragSystem(config)
        tuner = Tuner(system, args.prompt, JsonCache(cache_root(None) / "stages"), key_config=given)
        for setting in args.setting:
            tuner.check_setting(setting.partition("=")[0].strip())
        judge = build_judge(args.judge, args.judge_model)
        examples = list(read_examples(args.data, limit=args.limit))
        states = tuner.upstream_states(examples)
        runs: list[tuple[str, str, SystemConfig | None]] = [(Path(v).name, str(variant_path(v)), None)
                                                             for v in args.variant]
        runs += [(setting, runs[0][1], setting_config(args, config, setting)) for setting in args.setting]
        rows: dict[str, dict[str, Any]] = {}
        judged: dict[str, list[dict[str, Any]]] = {}
        for number, (name, prompt_file, variant_config) in enumerate(runs, start=1):
            answers = tuner.variant_answers(states, prompt_file, f"variant {number}/{len(runs)} {name}", variant_config)
            records = [dict({k: e.get(k) for k in ("interaction_id", "query", "answer", "alt_answers", "domain",
                                                   "question_type", "static_or_dynamic", "popularity")},
                            prediction=a) for e, a in zip(examples, answers)]
            judge_records(records, judge)
            summary = score_records(records)
            summary.pop("latency_s")
            name = name if name not in rows else f"{name} ({number})"
            rows[name], judged[name] = summary, records
    table = compare(rows)
    first = next(iter(judged))  # each variant against the first, as local_evaluation.py compare reads two runs
    comparisons = {name: compare_records(judged[first], records) for name, records in judged.items() if name != first}
    saved: dict[str, Any] = {"variants": rows, "against_first": comparisons,
                             "verdicts": {name: [r["verdict"] for r in records] for name, records in judged.items()},
                             "interaction_ids": [e["interaction_id"] for e in examples]}
    if args.folds:
        saved["cross_validated"] = cross_validated(saved["verdicts"],
                                                   [fold_of(e["interaction_id"], args.folds) for e in examples],
                                                   args.criterion)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tuning.json").write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
    (args.out / "tuning.md").write_text(f"# Variants of prompt '{args.prompt}' on {args.data.name}\n\n{table}",
                                        encoding="utf-8")
    plot(rows, args.out / "tuning.png")
    print(table)
    for name, result in comparisons.items():
        print(format_comparison(result, first, name, show=3))
    if args.folds:
        print(format_cross_validated(saved["cross_validated"], first))
    print(f"written: {args.out / 'tuning.md'}, tuning.json, tuning.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
