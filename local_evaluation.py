"""Run UserModel over CRAG data, score with rules, print the table. Re-running resumes an interrupted run."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from loguru import logger
from tqdm import tqdm

from evaluation.data import DataError, ReadStats, check_data_file, read_examples
from evaluation.report import format_table, score_records, write_summary
from evaluation.runner import EvaluationError, run_model
from models.config import CONFIG_ENV, DEFAULT_CONFIG, ConfigError, load_config
from models.llm.base import BackendUnavailable
from models.prompting import PromptError

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "crag_sample.jsonl"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="CRAG .jsonl or .jsonl.bz2 file")
    parser.add_argument("--config", type=Path, default=None,
                        help=f"system config YAML (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG.name})")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: runs/<data>__<config>)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N examples")
    parser.add_argument("--restart", action="store_true", help="discard earlier predictions of this run folder")
    parser.add_argument("--log-level", default="WARNING", help="loguru level for the model's logs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logger.remove()
    logger.add(lambda message: tqdm.write(message, end="", file=sys.stderr), level=args.log_level.upper())
    try:
        if args.config is not None:
            os.environ[CONFIG_ENV] = str(args.config)
        config = load_config()
        check_data_file(args.data)
        data_name = args.data.name.split(".")[0]
        out_dir = args.out or Path("runs") / f"{data_name}__{Path(config.source).stem}"
        predictions = out_dir / "predictions.jsonl"
        if args.restart and predictions.exists():
            predictions.unlink()
        from models.user_config import UserModel  # after the config checks: loading models takes seconds

        started = time.perf_counter()
        model = UserModel(config)
        print(f"UserModel ready in {time.perf_counter() - started:.1f} s ({config.source})", file=sys.stderr)
        stats = ReadStats()
        records = run_model(model, read_examples(args.data, stats, args.limit), predictions)
    except (ConfigError, DataError, EvaluationError, BackendUnavailable, PromptError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = score_records(records)
    summary["skipped_lines"] = stats.skipped_lines
    summary_path = write_summary(summary, out_dir)
    print(format_table(summary))
    if stats.skipped_lines:
        print(f"skipped {len(stats.skipped_lines)} malformed lines of {args.data}: {stats.skipped_lines[:10]}")
    print(f"predictions: {predictions}\nsummary: {summary_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
