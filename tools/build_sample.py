"""Build a CRAG-format .jsonl from a folder's questions.yaml and pages/: by default data/crag_sample.jsonl from
data/sample/; `--source data/gate_dev --target data/gate_dev.jsonl` builds the answer gate's development set."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from utils.cli import command

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "data" / "sample"
TARGET = ROOT / "data" / "crag_sample.jsonl"
_NAMESPACE = uuid.UUID("6f1c2a4e-5b0d-4c8e-9f3a-2d7b8e1c0a55")


def build_lines(source: Path = SOURCE) -> list[str]:
    """One CRAG-format JSON line per question; interaction ids are derived from the query."""
    questions: list[dict[str, Any]] = yaml.safe_load((source / "questions.yaml").read_text(encoding="utf-8"))
    lines = []
    for q in questions:
        pages = [{"page_name": p["name"], "page_url": p["url"], "page_snippet": p["snippet"],
                  "page_result": (source / "pages" / p["file"]).read_text(encoding="utf-8") if p["file"] else "",
                  "page_last_modified": p["last_modified"]} for p in q["pages"]]
        example = {"interaction_id": str(uuid.uuid5(_NAMESPACE, q["query"])), "query_time": q["query_time"],
                   "domain": q["domain"], "question_type": q["question_type"],
                   "static_or_dynamic": q["static_or_dynamic"], "query": q["query"], "answer": q["answer"],
                   "alternative_answers": q["alternative_answers"], "split": 0, "search_results": pages}
        lines.append(json.dumps(example, ensure_ascii=False))
    return lines


def _resolve(path: Path) -> Path:
    """`path`, relative to the repository root when relative."""
    return path if path.is_absolute() else ROOT / path


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", type=Path, default=SOURCE,
                        help="folder holding questions.yaml and pages/ (default data/sample)")
    parser.add_argument("--target", type=Path, default=TARGET, help="file to write (default data/crag_sample.jsonl)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file is out of date")
    args = parser.parse_args(argv)
    source, target = _resolve(args.source), _resolve(args.target)
    text = "\n".join(build_lines(source)) + "\n"
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != text:
            rebuild = "python tools/build_sample.py" + ("" if (source, target) == (SOURCE, TARGET) else
                                                         f" --source {args.source} --target {args.target}")
            print(f"error: {target} is out of date: run {rebuild}", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"wrote {len(text.splitlines())} examples to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
