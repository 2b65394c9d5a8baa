"""Check a submission before sending it, not after: aicrowd.json, the config and its weights, the requirements
files, the image (the Dockerfile's CUDA base against the vLLM pin), the GPUs aicrowd.json asks for against the
config, the model folder's quantization against the config's, the per-T4 memory plan, R2AG's prompt embeddings,
the import of UserModel, the batch-size contract, sample queries within their time limit, the budget plan at
the measured speed of the configured LLM, and (GPU configs, where `make test-vllm` has built .venv-vllm) the
rehearsal: the grader's loop over the sample on vLLM's CPU build in the image's environment (tools/rehearse.py).

    python tools/check_submission.py              # the Dockerfile's config (CRAG_CONFIG) and its backend
    python tools/check_submission.py --cpu        # the embedded CPU default instead (no GPU, no weights needed)
    make check                                    # = --cpu

The model is imported and run in a child process (as the grader does, with the repository as its working
folder), so a UserModel that fails to import or hangs is reported, not fatal. Prints a pass/fail table; exits 1
when any check fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from evaluation.submission import format_table
from evaluation.submission.files import (
    check_aicrowd,
    check_config,
    check_image,
    check_requirements,
    dockerfile_config,
)
from evaluation.submission.gpu import gpu_checks
from evaluation.submission.run import budget_check, check_rehearsal, model_checks, run_probe
from models.config import REPO_ROOT, ConfigError
from utils.batch import answer_batch, batch_size_problem
from utils.cli import CommandParser, command, interrupted

CPU_CONFIG = "configs/cpu.yaml"


def probe(args: argparse.Namespace) -> int:
    """The child: import UserModel, check its batch size, run sample queries; one JSON line on stdout."""
    report: dict[str, Any] = {}
    sys.path.insert(0, os.getcwd())  # the submission's own models/, ahead of the checker's repository
    try:
        from models.user_config import UserModel
    except BaseException as err:  # the report names what the grader would see
        print(json.dumps({"import_error": f"{type(err).__name__}: {err}"}))
        return 0
    try:
        started = time.perf_counter()
        model = UserModel()
        report["load_s"] = time.perf_counter() - started
        size = model.get_batch_size()
        report["batch_size"] = size
        if batch_size_problem(size):
            print(json.dumps(report))
            return 0
        lines = Path(args.data).read_text(encoding="utf-8").splitlines()
        examples = [json.loads(line) for line in lines[:args.queries]]
        batches = []
        for start in range(0, len(examples), size):
            part = examples[start:start + size]
            # the grader's fields (utils/batch.py), written out: nothing of this repository is imported before the
            # submission's own packages, so that it imports as the grader imports it
            batch = {key: [e[key] for e in part] for key in ("interaction_id", "query", "search_results", "query_time")}
            started = time.perf_counter()
            result = answer_batch(model, batch)
            answers, seconds = result.answers, time.perf_counter() - started
            trace = result.trace  # a CragSystem's: seconds of each stage
            pages = max((s["seconds"] for t in trace for s in t["stages"] if s["stage"] == "references"), default=None)
            batches.append({"size": len(part), "seconds": seconds, "pages_s": pages,
                            "answers": answers if isinstance(answers, list) else repr(answers)})
        report["batches"] = batches
        report["speed"] = measure_speed(model)
    except BaseException as err:
        report["run_error"] = f"{type(err).__name__}: {err}"
    print(json.dumps(report, default=str))
    return 0



def measure_speed(model: Any) -> dict[str, float] | None:
    """Prefill tokens per second and seconds per decode step of the model's LLM (a CragSystem's), or None."""
    from models.llm.backend import GenParams
    from models.system import CragSystem

    llm = model.resource("llm") if isinstance(model, CragSystem) else None
    size = model.get_batch_size()
    if llm is None:
        return None

    text = "The quick brown fox jumps over the lazy dog. " * 50  # about 500 tokens
    conversations = [[{"role": "user", "content": f"{text}\nRepeat the first sentence, word by word, many times."}]
                     for _ in range(size)]
    timings = []
    for tokens in (1, 9):
        started = time.perf_counter()
        llm.generate(conversations, GenParams(max_tokens=tokens, temperature=0.0))
        timings.append(time.perf_counter() - started)
    prompt_tokens = size * len(text) / 4
    return {"prefill_tps": prompt_tokens / max(timings[0], 1e-6), "step_s": max(timings[1] - timings[0], 0.0) / 8}



@command
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the submission's folder")
    parser.add_argument("--config", default=None, help="config, relative to --repo (default: the Dockerfile's)")
    parser.add_argument("--cpu", action="store_true", help=f"check with {CPU_CONFIG} (the embedded default)")
    parser.add_argument("--queries", type=int, default=2, help="sample queries to run")
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "data" / "crag_sample.jsonl")
    parser.add_argument("--per-query-s", type=float, default=30.0, help="the grader's seconds per query")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="the longest the child may take")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        return probe(args)
    problem = argument_problem(args)
    if problem:
        raise ConfigError(problem)
    try:
        return check(args)
    except KeyboardInterrupt:
        return interrupted("no check finished; nothing was written")



def argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, in one line, or None (checked before any check runs)."""
    from evaluation.data import DataError, check_data_file

    if not args.repo.is_dir():
        return f"--repo {args.repo}: no such folder; give the submission's folder"
    if not args.cpu and not (args.config or dockerfile_config(args.repo.resolve())):
        return "name a config with --config (the Dockerfile sets no CRAG_CONFIG), or use --cpu"
    if args.queries < 1 or args.per_query_s <= 0 or args.timeout_s <= 0:
        return (f"--queries {args.queries}, --per-query-s {args.per_query_s}, --timeout-s {args.timeout_s}: "
                "each must be positive")
    if args.data.suffix != ".jsonl":
        return f"--data {args.data}: give a plain CRAG .jsonl file (the probe reads it as the grader's batches)"
    try:
        check_data_file(args.data, examples=True)
    except DataError as err:
        return str(err)
    return None



def check(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    repo = args.repo.resolve()
    # a Dockerfile that sets no CRAG_CONFIG leaves the model on the loader's default, configs/cpu.yaml
    config_path = CPU_CONFIG if args.cpu else (args.config or dockerfile_config(repo) or CPU_CONFIG)
    steps = 4  # config, files, the model's answers, the rehearsal
    with tqdm(total=steps, desc="config: ", unit="check", disable=None, dynamic_ncols=True,
              bar_format="{desc}{n}/{total} checks [{elapsed}]", leave=False) as progress:
        config_check, weights_check, config = check_config(repo, config_path)
        progress.update(1)
        progress.set_description("aicrowd.json and requirements")
        checks = [check_aicrowd(repo, config.task if config else None), config_check, weights_check,
                  check_requirements(repo), check_image(repo), *(gpu_checks(repo, config) if config else [])]
        progress.update(1)
        if config is not None and weights_check.ok:
            progress.set_description(f"UserModel: loading it and answering {args.queries} sample queries (at most "
                                     f"{args.timeout_s:.0f} s)")
            progress.refresh()
            report = run_probe(Path(__file__).resolve(), repo, config_path, args.queries, args.data.resolve(),
                               args.timeout_s)
            checks += model_checks(report, args.per_query_s)
            progress.update(1)
            progress.set_description("budget plan")
            if report.get("speed") and report.get("batch_size"):
                checks.append(budget_check(config, report))
        if config is not None and not args.cpu:
            progress.set_description("rehearsal on vLLM's CPU build (minutes)")
            progress.refresh()
            checks.append(check_rehearsal(repo, config_path, config, args.timeout_s))
        progress.n = steps  # every step, also those a failed check skipped
        progress.set_description("done")
    print(format_table(checks))
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
