"""What running the submission shows: the child's report of UserModel (import, batch size, sample queries within
their limit), the budget plan at the measured speed, and the rehearsal on vLLM's CPU build (tools/rehearse.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from evaluation.submission import Check
from utils.batch import MAX_BATCH_SIZE, batch_size_problem

REHEARSAL_PYTHON = ".venv-vllm/bin/python"  # make vllm-venv
REHEARSAL_MODEL = "runs/vllm/smollm2"  # make test-vllm


def run_probe(checker: Path, repo: Path, config_path: str, queries: int, data: Path,
              timeout_s: float) -> dict[str, Any]:
    """The report of `checker --probe` (tools/check_submission.py's child) run in the submission's folder, as the
    grader imports it; a run_error where it gives none."""
    env = {**os.environ, "CRAG_CONFIG": str(repo / config_path), "PYTHONPATH": str(repo)}
    command = [sys.executable, str(checker), "--probe", "--queries", str(queries), "--data", str(data)]
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
    valid = batch_size_problem(size) is None
    detail = f"get_batch_size() = {size!r}" + ("" if valid else f", not in 1..{MAX_BATCH_SIZE}")
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



def check_rehearsal(repo: Path, config_path: str, config: Any, timeout_s: float) -> Check:
    """tools/rehearse.py over the sample with the config, the weights swapped for SmolLM2, in the rehearsal venv;
    skipped (said so) where that venv or the model folder is absent."""
    python, model = repo / REHEARSAL_PYTHON, repo / REHEARSAL_MODEL
    if not python.is_file() or not (model / "config.json").is_file():
        return Check("rehearsal", True, f"skipped: no {REHEARSAL_PYTHON} or {REHEARSAL_MODEL} (`make test-vllm` "
                     "builds both)", warn=True)
    out = repo / "runs" / "rehearsal"
    command = [str(python), str(repo / "tools" / "rehearse.py"), "--config", str(repo / config_path),
               "--cpu-model", str(model), "--out", str(out), *(["--serve-kg"] if config.task > 1 else [])]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    try:
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Check("rehearsal", False, f"no result within {timeout_s:.0f} s (--timeout-s)")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        return Check("rehearsal", False, (errors[0] if errors else done.stderr.strip()[-300:]) +
                     f" (exit {done.returncode}; {out})")
    summary = json.loads(lines[-1])
    return Check("rehearsal", True, f"{summary['answered']} of {summary['questions']} answered through "
                 f"{summary['backend']} on vLLM's CPU build in {summary['seconds']:.0f} s ({out}/summary.json)",
                 warn=summary["answered"] == 0)



def budget_check(config: Any, report: dict[str, Any]) -> Check:
    from tqdm import tqdm

    from models.budget_planner import Speed, format_plan, plan

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

