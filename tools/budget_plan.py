"""Budget planner: expected seconds per stage and per query for a config, and whether a batch fits the budget.
The model of time is models/budget_planner.py's (its docstring follows in --help).

    python tools/budget_plan.py --config configs/t4x4-llama3-70b-gptq.yaml --prefill-tps 2500 --step-ms 60
"""

from __future__ import annotations

import argparse
import sys

from models import budget_planner as budget_plan
from models.budget_planner import Speed, format_plan, plan
from models.config import ConfigError, add_config_arguments
from models.loading import config_from_args
from utils.batch import MAX_BATCH_SIZE
from utils.cli import CommandParser, command


@command
def main(argv: list[str] | None = None) -> int:
    model_of_time = budget_plan.__doc__.split("\n", 1)[1]
    parser = CommandParser(description=f"{__doc__}\n{model_of_time}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--batch", type=int, default=None, help="default: the config's batch_size")
    parser.add_argument("--prefill-tps", type=float, required=True, help="prompt tokens per second (measured)")
    parser.add_argument("--step-ms", type=float, required=True, help="milliseconds per decode step of a batch")
    parser.add_argument("--pages-s", type=float, default=1.0, help="page processing and embedding per query")
    args = parser.parse_args(argv)
    config = config_from_args(args)
    batch = args.batch or config.batch_size
    if not 1 <= batch <= MAX_BATCH_SIZE or args.prefill_tps <= 0 or args.step_ms <= 0 or args.pages_s < 0:
        raise ConfigError(f"--batch must be in 1..{MAX_BATCH_SIZE}, --prefill-tps and --step-ms positive")
    print(format_plan(config, Speed(args.prefill_tps, args.step_ms / 1000, args.pages_s), batch))
    return 0 if plan(config, Speed(args.prefill_tps, args.step_ms / 1000, args.pages_s), batch).fits else 1


if __name__ == "__main__":
    sys.exit(main())
