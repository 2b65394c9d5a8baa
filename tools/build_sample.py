"""Build data/crag_sample.jsonl (CRAG format) from data/sample/questions.yaml and data/sample/pages/."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file is out of date")
    args = parser.parse_args()
    text = "\n".join(build_lines()) + "\n"
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(f"error: {TARGET} is out of date: run python tools/build_sample.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {len(text.splitlines())} examples to {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
