"""A small ablation (`local_evaluation.py ablate`) on the KG reach questions: the shipped CPU config served as
`make eval` serves it, against it without the KG stage, without the dynamic pre-check, and with a summariser budget
of 32 tokens, each row answered with the gate off, judged by the default judge and set against the full system.
The stage cache serves the third and fourth rows the stages before the one they change; the table, then its last
line: the smallest difference these questions show.

    python -m benchmarks.small_ablation [--out runs/bench-ablation]
"""

from __future__ import annotations

import sys
from pathlib import Path

from models.config import REPO_ROOT
from utils.cli import CommandParser, command

QUESTIONS = REPO_ROOT / "benchmarks" / "kg_reach" / "questions.jsonl"
VARIANTS = ("no KG: -kg", "no pre-check: -precheck", "summariser 32 tokens: reasoning.summariser_max_tokens=32")


@command
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "bench-ablation")
    args = parser.parse_args(argv)
    from evaluation.ablation import ablate
    from evaluation.choices import ConfigChoice

    return ablate(ConfigChoice(None, (REPO_ROOT / "configs" / "overlays" / "vllm-cpu.yaml",)), QUESTIONS, VARIANTS,
                  out=args.out, serve_kg=True, serve_llm=True)


if __name__ == "__main__":
    sys.exit(main())
