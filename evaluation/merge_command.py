"""`merge`: gather <out>/shard-i-of-n/predictions.jsonl into <out> (the shards of one setup), judge, attribute
and report."""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path

from evaluation import manifest
from evaluation.choices import Answering, RunFolder
from evaluation.runner import EvaluationError, load_predictions
from evaluation.session import conclude, prepare, selected
from utils.durable_io import json_line, write_atomic
from utils.trees import differences


def merge(folder: RunFolder) -> int:
    """`merge`: the shards' predictions together in the run folder, judged, attributed and reported."""
    with contextlib.ExitStack() as resources:
        session = prepare("merge", folder, Answering(), resources)
        records = selected(session, merge_shards(session.out_dir, session.predictions))
        shard_manifest = manifest.load(next(iter(sorted(session.out_dir.glob("shard-*-of-*"))), session.out_dir))
        run_manifest = shard_manifest and shard_manifest | {
            "selection": shard_manifest["selection"] | {"shard_index": 1, "shard_count": 1}}
        return conclude(session, records, run_manifest, session.predictions)


def merge_shards(out_dir: Path, predictions: Path) -> list[dict]:
    """The records of every shard folder under out_dir, written together to `predictions` (shard order); the
    shards' manifests must agree on what changes answers."""
    shards = {f: m for f in out_dir.glob("shard-*-of-*") if (m := re.fullmatch(r"shard-(\d+)-of-(\d+)", f.name))}
    folders = sorted(shards, key=lambda p: [int(n) for n in re.findall(r"\d+", p.name)])
    counts = {match.group(2) for match in shards.values()}
    if not folders or len(counts) != 1:
        raise EvaluationError(
            f"merge: {out_dir} needs shard-i-of-n folders of one n (found {[f.name for f in folders]})"
        )
    count = int(counts.pop())
    missing = [i for i in range(1, count + 1) if not (out_dir / f"shard-{i}-of-{count}" / "predictions.jsonl").exists()]
    if missing:
        raise EvaluationError(f"merge: shards {missing} of {count} have no predictions.jsonl under {out_dir}")
    manifests = {i: manifest.load(out_dir / f"shard-{i}-of-{count}") for i in range(1, count + 1)}
    unchecked = [i for i, m in manifests.items() if m is None]
    if unchecked:
        print(f"merge: shards {unchecked} of {count} have no manifest.json; their setup is not checked",
              file=sys.stderr)
    first = next((m for m in manifests.values() if m is not None), None)
    for i, shard in manifests.items():
        changed = differences(first.get("answers"), shard.get("answers")) if first and shard else []
        if changed:
            raise EvaluationError(f"merge: shard {i} of {count} was run with another setup than the others "
                                  f"({'; '.join(changed[:3])}); re-run it with the same config, prompts and data")
    records: dict[str, dict] = {}
    for i in range(1, count + 1):
        records.update(load_predictions(out_dir / f"shard-{i}-of-{count}" / "predictions.jsonl"))
    write_atomic(predictions, "".join(json_line(record) for record in records.values()))
    return list(records.values())
