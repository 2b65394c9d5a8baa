"""Join a person's verdicts on sentence answers ({query, prediction, human} lines, default
data/gate_dev/verdicts.jsonl) with their questions' gold answers (default data/gate_dev.jsonl and the KG bench's
benchmarks/kg_reach/questions.jsonl) into a calibration set for `local_evaluation.py calibrate` (default
data/judge/gate_verdicts.jsonl, the format of data/judge/calibration.jsonl)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluation.calibration import GATE_SET, GATE_VERDICTS, GOLD_SOURCES, join_verdicts
from utils.cli import check_out_file, command


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--verdicts", type=Path, default=GATE_VERDICTS, help="the person's verdicts (.jsonl)")
    parser.add_argument("--gold", type=Path, action="append", default=None,
                        help="a CRAG-format .jsonl holding their questions; repeat for several")
    parser.add_argument("--out", type=Path, default=GATE_SET, help="the calibration set to write")
    parser.add_argument("--check", action="store_true", help="exit 1 if --out is not what it would write")
    args = parser.parse_args(argv)
    rows = join_verdicts(args.verdicts, args.gold or GOLD_SOURCES)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if args.check:
        if not args.out.is_file() or args.out.read_text(encoding="utf-8") != text:
            print(f"error: {args.out} is out of date: run python tools/join_verdicts.py", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date ({len(rows)} verdicts)")
        return 0
    check_out_file(args.out)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: {len(rows)} verdicts with their gold answers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
