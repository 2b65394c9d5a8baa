"""Check a submission before sending it, not after: aicrowd.json, the config and its weights, the requirements
files, the import of UserModel, the batch-size contract, sample queries within their time limit, and the budget
plan at the measured speed of the configured LLM.

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
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

CHALLENGES = {  # the id of each task's challenge; aicrowd.json names one
    "meta-kdd-cup-24-crag-retrieval-summarization": "Task 1: retrieval summarization",
    "meta-kdd-cup-24-crag-knowledge-graph-and-web-retrieval": "Task 2: knowledge graph and web retrieval",
    "meta-kdd-cup-24-crag-end-to-end-retrieval-augmented-generation": "Task 3: end-to-end RAG",
}
PLACEHOLDER_AUTHOR = "your-aicrowd-username"
CPU_CONFIG = "configs/cpu.yaml"
MAX_BATCH = 16


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    warn: bool = False  # passed, with something to look at

def check_aicrowd(repo: Path, task: int | None) -> Check:
    path = repo / "aicrowd.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        return Check("aicrowd.json", False, f"unreadable: {err}")
    problems = []
    if not isinstance(data, dict):
        return Check("aicrowd.json", False, "must be a JSON object")
    challenge = data.get("challenge_id")
    if challenge not in CHALLENGES:
        problems.append(f"challenge_id {challenge!r} is not one of {sorted(CHALLENGES)}")
    elif task is not None and not CHALLENGES[challenge].startswith(f"Task {task}"):
        problems.append(f"challenge_id is {CHALLENGES[challenge].split(':')[0]} but the config says task {task}")
    authors = data.get("authors")
    if not (isinstance(authors, list) and authors and all(isinstance(a, str) and a.strip() for a in authors)):
        problems.append("authors must be a non-empty list of AIcrowd usernames")
    if data.get("gpu") is not True:
        problems.append("gpu must be true")
    if not (isinstance(data.get("gpu_count"), int) and 1 <= data["gpu_count"] <= 4):
        problems.append("gpu_count must be an integer in 1..4 (4 T4s)")
    if not isinstance(data.get("description"), str) or not data["description"].strip():
        problems.append("description must be a non-empty string")
    if problems:
        return Check("aicrowd.json", False, "; ".join(problems))
    placeholder = PLACEHOLDER_AUTHOR in authors
    note = " (authors is still the placeholder: put your username)" if placeholder else ""
    return Check("aicrowd.json", True, f"{CHALLENGES[challenge]}{note}", warn=placeholder)


def dockerfile_config(repo: Path) -> str | None:
    """The CRAG_CONFIG the Dockerfile sets, relative to the repository, or None."""
    try:
        text = (repo / "Dockerfile").read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"CRAG_CONFIG=(\S+)", text)
    if not match:
        return None
    path = match.group(1)
    return "configs/" + path.rsplit("/configs/", 1)[1] if "/configs/" in path else path


def _weights(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (any(folder.glob("*.safetensors")) or any(folder.glob("*.bin")))


def check_config(repo: Path, config_path: str) -> tuple[Check, Check, Any]:
    """(config check, weights check, the loaded config or None)."""
    from models.config import ConfigError, load_config

    try:
        config = load_config(repo / config_path)
    except ConfigError as err:
        return Check("config", False, str(err)), Check("weights", False, "config not loaded"), None
    needed: list[tuple[str, Path, str]] = []  # (key, path, kind)
    backend = config.llm.backend
    if backend == "vllm":
        needed.append(("llm.vllm.model", Path(config.llm.vllm.model), "model"))
    elif backend == "hf" and config.llm.hf.model:
        needed.append(("llm.hf.model", Path(config.llm.hf.model), "model"))
    if config.embedder.model:
        needed.append(("embedder.model", Path(config.embedder.model), "folder"))
    if config.references.rerank.model:
        needed.append(("references.rerank.model", Path(config.references.rerank.model), "folder"))
    if config.attributes.method == "svm":
        needed.append(("attributes.svm_model", Path(config.attributes.svm_model), "file"))
    if config.r2ag.enabled and config.r2ag.checkpoint:
        needed.append(("r2ag.checkpoint", Path(config.r2ag.checkpoint), "file"))
    if config.references.retriever == "hash":
        needed.append(("references.hash.model", Path(config.references.hash.model), "file"))
    missing = []
    for key, path, kind in needed:
        full = path if path.is_absolute() else repo / path
        if kind == "file" and not full.is_file() or kind == "folder" and not full.is_dir():
            missing.append(f"{key}: {path} not found")
        elif kind == "model" and not (full.suffix == ".gguf" and full.is_file() or full.is_dir() and _weights(full)):
            missing.append(f"{key}: {path} holds no model weights (config.json and *.safetensors)")
    config_check = Check("config", True, f"{config_path}: backend {backend}, task {config.task}, "
                                         f"batch_size {config.batch_size}")
    detail = "; ".join(missing) if missing else f"{len(needed)} paths present"
    return config_check, Check("weights", not missing, detail), config


def check_requirements(repo: Path) -> Check:
    from packaging.requirements import InvalidRequirement, Requirement

    problems, count = [], 0
    for name in ("requirements.txt", "requirements-local.txt"):
        try:
            lines = (repo / name).read_text(encoding="utf-8").splitlines()
        except OSError as err:
            problems.append(f"{name}: {err}")
            continue
        for number, line in enumerate(lines, start=1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                requirement = Requirement(line)
            except InvalidRequirement as err:
                problems.append(f"{name}:{number}: {err}")
                continue
            count += 1
            if not any(spec.operator == "==" for spec in requirement.specifier):
                problems.append(f"{name}:{number}: {requirement.name} is not pinned with ==")
    return Check("requirements", not problems, "; ".join(problems) or f"{count} pinned requirements parse")


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
        if not (isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= MAX_BATCH):
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
            answers = model.batch_generate_answer(batch)
            seconds = time.perf_counter() - started
            trace = getattr(model, "last_batch_trace", None) or []  # a CragSystem's: seconds of each stage
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
    llm = getattr(model, "llm", None)
    size = model.get_batch_size()
    if llm is None:
        return None
    from models.llm.base import GenParams

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


def run_probe(repo: Path, config_path: str, queries: int, data: Path, timeout_s: float) -> dict[str, Any]:
    env = {**os.environ, "CRAG_CONFIG": str(repo / config_path), "PYTHONPATH": str(repo)}
    command = [sys.executable, str(Path(__file__).resolve()), "--probe", "--queries", str(queries), "--data", str(data)]
    try:
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"run_error": f"no answer within {timeout_s:.0f} s (loading and the sample queries)"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"run_error": f"the child exited with {done.returncode}: {done.stderr.strip()[-500:]}"}
    return json.loads(lines[-1])


def model_checks(report: dict[str, Any], per_query_s: float) -> list[Check]:
    if "import_error" in report:
        return [Check("import UserModel", False, report["import_error"])]
    checks = [Check("import UserModel", True, f"built in {report.get('load_s', 0):.1f} s")]
    size = report.get("batch_size")
    valid = isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= MAX_BATCH
    detail = f"get_batch_size() = {size!r}" + ("" if valid else f", not in 1..{MAX_BATCH}")
    checks.append(Check("batch size", valid, detail))
    if "run_error" in report:
        return checks + [Check("sample queries", False, report["run_error"])]
    if not valid:
        return checks
    from utils.grader_tokens import GRADER_MAX_TOKENS, over_grader_limit

    problems, slowest = [], 0.0
    for batch in report.get("batches", []):
        answers, limit = batch["answers"], batch["size"] * per_query_s
        slowest = max(slowest, batch["seconds"] / batch["size"])
        if not isinstance(answers, list) or len(answers) != batch["size"]:
            problems.append(f"returned {answers!r} for {batch['size']} queries")
        elif not all(isinstance(a, str) for a in answers):
            problems.append("answers must be strings")
        elif any(over_grader_limit(a) for a in answers):
            problems.append(f"an answer is longer than the {GRADER_MAX_TOKENS} Llama-2 tokens the grader keeps")
        if batch["seconds"] > limit:
            problems.append(f"a batch of {batch['size']} took {batch['seconds']:.1f} s, over its {limit:.0f} s")
    detail = "; ".join(problems) or f"{len(report.get('batches', []))} batch(es), slowest {slowest:.1f} s/query"
    return checks + [Check("sample queries", not problems, detail)]


def format_table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    return "\n".join(f"{'FAIL' if not c.ok else 'WARN' if c.warn else 'PASS'}  {c.name:<{width}}  {c.detail}"
                     for c in checks)


def main(argv: list[str] | None = None) -> int:
    from tools import CommandParser, interrupted

    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=REPO, help="the submission's folder")
    parser.add_argument("--config", default=None, help="config, relative to --repo (default: the Dockerfile's)")
    parser.add_argument("--cpu", action="store_true", help=f"check with {CPU_CONFIG} (the embedded default)")
    parser.add_argument("--queries", type=int, default=2, help="sample queries to run")
    parser.add_argument("--data", type=Path, default=REPO / "data" / "crag_sample.jsonl")
    parser.add_argument("--per-query-s", type=float, default=30.0, help="the grader's seconds per query")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="the longest the child may take")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        return probe(args)
    problem = argument_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
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
    config_path = CPU_CONFIG if args.cpu else (args.config or dockerfile_config(repo))
    with tqdm(total=4, desc="config: ", unit="check", disable=None, dynamic_ncols=True,
              bar_format="{desc}{n}/{total} checks [{elapsed}]", leave=False) as progress:
        config_check, weights_check, config = check_config(repo, config_path)
        progress.update(1)
        progress.set_description("aicrowd.json and requirements")
        checks = [check_aicrowd(repo, config.task if config else None), config_check, weights_check,
                  check_requirements(repo)]
        progress.update(1)
        if config is not None and weights_check.ok:
            progress.set_description(f"UserModel: loading it and answering {args.queries} sample queries (at most "
                                     f"{args.timeout_s:.0f} s)")
            progress.refresh()
            report = run_probe(repo, config_path, args.queries, args.data.resolve(), args.timeout_s)
            checks += model_checks(report, args.per_query_s)
            progress.update(1)
            progress.set_description("budget plan")
            if report.get("speed") and report.get("batch_size"):
                checks.append(budget_check(config, report))
        progress.n = progress.total
        progress.set_description("done")
    print(format_table(checks))
    return 0 if all(c.ok for c in checks) else 1


def budget_check(config: Any, report: dict[str, Any]) -> Check:
    from tqdm import tqdm

    from tools.budget_plan import Speed, format_plan, plan

    measured = [b["pages_s"] / b["size"] for b in report.get("batches") or [] if b.get("pages_s") is not None]
    pages_s = max(measured, default=1.0)
    speed = Speed(report["speed"]["prefill_tps"], max(report["speed"]["step_s"], 1e-4), pages_s)
    size = report["batch_size"]
    tqdm.write(format_plan(config, speed, size), file=sys.stderr)  # beside the progress bar
    result = plan(config, speed, size)
    # The plan counts every stage at its max_tokens: an upper bound. Over it, the deadline skips the optional
    # stages and cuts generation, so only the sample queries' own times can fail the check.
    detail = (f"{result.per_query_s:.1f} s/query at most at batch {size} (limit {result.limit_s / size:.1f})"
              + ("" if result.fits else ": optional stages will be skipped under load; see the table on stderr"))
    return Check("budget plan", True, detail, warn=not result.fits)


if __name__ == "__main__":
    sys.exit(main())
