"""Ray benchmark: questions per second of `local_evaluation.py` run locally and with `--ray` (2 replicas).

Both runs answer the same sample questions with the embedded CPU default (configs/cpu.yaml: SmolLM2 through the hf
backend; task 1, so no KG server) into fresh run folders, pages processed afresh (no page cache), judged by the
default judge (contains: rules, no model); each is timed end to end, from the command's start to its report,
model loading and Ray's start included, since that is what a user waits for. The local run goes first: its model
process forks before Ray starts.

On one machine of 2 cores the two replicas share the cores that the local run's model and page workers use, so
the ratio is not scaling: it is two model processes against one on the same CPUs (one CPU-bound hf process does
not keep two cores busy: measured 1.27x here), less what Ray costs (its start, the actors' model loads, page
processing without a pool). On a
cluster every replica brings its own GPUs (and CPUs), so the rate grows with the replicas until the driver, which
reads the data and writes each batch's answers, or the judge binds.

    .venv/bin/python -m benchmarks.ray_eval                 # 8 questions, 2 replicas
    .venv/bin/python -m benchmarks.ray_eval --limit 13      # the whole sample

It reports and never gates (exit 0); without Ray installed it says so in one line (exit 2).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

from models.config import REPO_ROOT
from utils.cli import command

SAMPLE = REPO_ROOT / "data" / "crag_sample.jsonl"
SETTINGS = ("task=1", "references.cache=false")


def timed_run(out: Path, limit: int, ray: str | None = None, actors: int | None = None) -> float:
    """Seconds of one `local_evaluation.py` run of the first `limit` sample questions into `out` (its report, on
    stdout, is not shown); a failed run is an error."""
    from evaluation.choices import Answering, ConfigChoice, RunFolder
    from evaluation.run_command import run

    folder = RunFolder(SAMPLE, ConfigChoice(sets=SETTINGS), out)
    started = time.perf_counter()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = run(folder, Answering(limit=limit, log_level="ERROR", ray=ray, ray_actors=actors))
    if code != 0:
        raise SystemExit(f"error: the run into {out} exited {code}:\n{printed.getvalue()[-2000:]}")
    return time.perf_counter() - started


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=8, help="sample questions per run (the sample has 13)")
    parser.add_argument("--actors", type=int, default=2, help="Ray replicas")
    args = parser.parse_args(argv)
    try:
        import ray  # noqa: F401 - only whether it is there
    except ImportError:
        print("ray_eval: Ray is not installed: `make ray` installs requirements-ray.txt", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ray-eval-") as folder:
        local = timed_run(Path(folder) / "local", args.limit)
        on_ray = timed_run(Path(folder) / "ray", args.limit, "local", args.actors)
    local_rate, ray_rate = args.limit / local, args.limit / on_ray
    print(f"ray_eval ({args.limit} sample questions, embedded CPU default, end to end):")
    print(f"  local run (baseline)       {local:7.1f} s   {local_rate:.3f} q/s")
    print(f"  --ray, {args.actors} replicas          {on_ray:7.1f} s   {ray_rate:.3f} q/s   ratio "
          f"{ray_rate / local_rate:.2f} x the local run")
    print(f"  both runs share this machine's {os.cpu_count()} cores: the ratio is {args.actors} model processes "
          "against one on the same CPUs, Ray's start and overhead included, not scaling; on a cluster each replica "
          "adds its own GPUs, so q/s grows with the replicas until the driver or the judge binds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
