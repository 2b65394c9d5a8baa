"""The grader's loop, rehearsed: UserModel driven over a CRAG file as the organisers' evaluator drives it.

It does what `load_data_in_batches` and `generate_predictions` do in facebookresearch/CRAG's local_evaluation.py
(commit 1c2569a9a5f03337c025a78ccff4b81cc7558540): batches of `interaction_id`, `query`, `search_results`,
`query_time` and `answer` read line by line from .jsonl or .jsonl.bz2, the last batch short; `answer` popped
before `batch_generate_answer(batch)` is called with the rest. The model is built as the grader builds it,
`UserModel()` with no arguments, from $CRAG_CONFIG. Stricter than that script, as the AIcrowd evaluator may be:
`get_batch_size()` is asked before every batch (models/dummy_model.py there says it may change between calls)
and held to 1-16; every answer must be a string within the grader's 75 Llama-2 tokens; a batch must finish within
its 30 s per query.

The config is the one given with `--set` assignments merged in (the weights swapped for ones this machine has),
written to OUT/config.yaml, which $CRAG_CONFIG names. Writes (replaces) OUT/predictions.jsonl (each question's answer,
gold answer and trace) and OUT/summary.json; exits 1 when a check failed. `make test-vllm` runs it over
data/crag_sample.jsonl in the rehearsal venv (docs/decisions/vllm-rehearsal.md).

    export VLLM_CPU_KVCACHE_SPACE=1   # GiB of KV cache for vLLM's CPU build
    .venv-vllm/bin/python tools/rehearse.py --cpu-model runs/vllm/smollm2 --serve-kg
"""

from __future__ import annotations

import bz2
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # the grader runs from the repository root without installing the project
    sys.path.insert(0, str(REPO))

from evaluation.data import DataError  # noqa: E402 - after the sys.path line
from models.llm.profile import load_profile, write_profile  # noqa: E402 - after the sys.path line
from utils.answers import IDK  # noqa: E402 - after the sys.path line
from utils.batch import answer_batch  # noqa: E402 - after the sys.path line
from utils.cli import CommandParser, check_out, command  # noqa: E402 - after the sys.path line
from utils.errors import ConfigError  # noqa: E402 - after the sys.path line
from utils.hardware import bf16_supported  # noqa: E402 - after the sys.path line

BATCH_KEYS = ("interaction_id", "query", "search_results", "query_time", "answer")
PER_QUERY_S = 30.0  # the grader's limit per query (the starter kit's models/dummy_model.py)
MAX_BATCH = 16


def batches(path: Path, batch_size: Callable[[], int]) -> Iterator[dict[str, list[Any]]]:
    """Dicts of lists, `batch_size()` examples each (asked before each batch), the last one short. A line that
    is not JSON is logged and skipped, as the organisers' loop does; a missing key is a DataError."""
    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        size, batch = batch_size(), {key: list[Any]() for key in BATCH_KEYS}
        for number, line in enumerate(lines, 1):
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                print(f"warning: {path}:{number} is not JSON; skipped", file=sys.stderr)
                continue
            missing = [key for key in BATCH_KEYS if key not in item]
            if missing:
                raise DataError(f"{path}:{number} has no {', '.join(missing)}; give a CRAG file")
            for key in BATCH_KEYS:
                batch[key].append(item[key])
            if len(batch["query"]) == size:
                yield batch
                size, batch = batch_size(), {key: [] for key in BATCH_KEYS}
        if batch["query"]:
            yield batch


def merged(base: dict, assignments: list[str]) -> dict:
    """`base` with each "a.b.c=value" (value read as YAML) set in place."""
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {assignment!r}: write key.path=value")
        node = base
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {assignment!r}: {part} is not a section")
        node[leaf] = yaml.safe_load(value)
    return base


def cpu_swaps(profile: Path) -> list[str]:
    """The config changes that put a GPU config on this machine's CPU (docs/decisions/vllm-rehearsal.md): the
    LLM folder given (in `profile`, written with the config's profile's settings), one worker, no tensor
    parallelism, bfloat16 where the CPU computes it natively (AMX or AVX512-BF16; the CPU's float16 runs at half its
    speed) and float32 elsewhere (emulated bfloat16 is slower than float32 there, and the T4 config's batches overrun
    the grader's limit), the packaged MiniLM for the embedder, every device the CPU."""
    dtype = "bfloat16" if bf16_supported("cpu") else "float32"
    return [f"llm.profile={profile}", "llm.vllm.tensor_parallel_size=1", f"llm.vllm.dtype={dtype}",
            "embedder.model=null", "embedder.device=cpu", "references.rerank.device=cpu", "references.workers=1"]


def checked_batch_size(model: Any) -> int:
    size = model.get_batch_size()
    if not isinstance(size, int) or not 1 <= size <= MAX_BATCH:
        raise ConfigError(f"get_batch_size() returned {size!r}; the grader takes an integer from 1 to {MAX_BATCH}")
    return size


def rehearse(data: Path, out: Path) -> dict[str, Any]:
    """Runs the loop; returns the summary (also written to OUT/summary.json)."""
    from models.user_config import UserModel
    from utils.grader_tokens import grader_token_count

    started = time.perf_counter()
    model = UserModel()
    ready_s = time.perf_counter() - started
    problems: list[str] = []
    sizes: list[int] = []
    records: list[dict[str, Any]] = []
    try:
        for batch in batches(data, lambda: checked_batch_size(model)):
            truths = batch.pop("answer")
            sizes.append(len(truths))
            began = time.perf_counter()
            result = answer_batch(model, batch)
            answers, seconds = result.answers, time.perf_counter() - began
            if seconds > PER_QUERY_S * len(truths):
                problems.append(f"batch {len(sizes)} took {seconds:.1f} s, over {PER_QUERY_S * len(truths):.0f} s")
            if not isinstance(answers, list) or len(answers) != len(truths):
                problems.append(f"batch {len(sizes)}: {len(truths)} questions, answers {answers!r:.200}")
                continue
            trace = result.trace or [{}] * len(answers)
            for query, answer, truth, record in zip(batch["query"], answers, truths, trace):
                if not isinstance(answer, str):
                    problems.append(f"{query!r}: answer {answer!r} is not a string")
                    continue
                tokens = grader_token_count(answer)
                if tokens > 75:
                    problems.append(f"{query!r}: answer of {tokens} grader tokens, over 75")
                records.append({"query": query, "prediction": answer, "answer": truth, "grader_tokens": tokens,
                                "batch_seconds": round(seconds, 2), "trace": record})
    finally:
        close = getattr(model, "close", None)
        if close is not None:
            close()
    stages: dict[str, dict[str, int]] = {}
    for record in records:
        for stage in record["trace"].get("stages", []):
            counts = stages.setdefault(stage["stage"], {})
            counts[stage["status"]] = counts.get(stage["status"], 0) + 1
    summary = {"data": str(data), "config": os.environ.get("CRAG_CONFIG"), "ready_s": round(ready_s, 1),
               "seconds": round(time.perf_counter() - started, 1), "batch_sizes": sizes, "questions": len(records),
               "answered": sum(r["prediction"].strip().lower() != IDK for r in records),
               "backend": model.config.llm.backend, "stages": stages, "problems": problems}
    with (out / "predictions.jsonl").open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


@contextlib.contextmanager
def kg_server(serve: bool) -> Iterator[None]:
    """The fixture KG server as $CRAG_MOCK_API_URL for the block, when asked for (tasks 2 and 3)."""
    if not serve:
        yield
        return
    from evaluation.kg_fixture.launch import fixture_kg

    # the server imports the project, which this venv does not install (the grader runs from the checkout)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    with fixture_kg() as url:
        os.environ["CRAG_MOCK_API_URL"] = url
        yield


def parse_args(argv: list[str] | None):
    parser = CommandParser(prog="rehearse.py", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO / "data" / "crag_sample.jsonl")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "t4x4-llama3-70b-gptq.yaml")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a config key changed for the rehearsal (repeatable)")
    parser.add_argument("--cpu-model", type=Path, default=None, metavar="FOLDER",
                        help="run the config on this CPU with this LLM folder (the swaps: tools/rehearse.py "
                        "cpu_swaps); --set assignments apply after them")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "rehearsal")
    parser.add_argument("--serve-kg", action="store_true", help="start the fixture KG server (data/kg)")
    return parser.parse_args(argv)


@command
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.data.is_file():
        raise ConfigError(f"--data {args.data}: no such file; give a CRAG .jsonl or .jsonl.bz2")
    if not args.config.is_file():
        raise ConfigError(f"--config {args.config}: no such file")
    check_out(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cpu_model is not None and not (args.cpu_model / "config.json").is_file():
        raise ConfigError(f"--cpu-model {args.cpu_model}: no model folder (config.json); `make test-vllm` writes "
                          "runs/vllm/smollm2")
    swaps = []
    if args.cpu_model is not None:
        base = load_profile((yaml.safe_load(args.config.read_text(encoding="utf-8")) or {}).get("llm", {}).get(
            "profile"))
        profile = write_profile(args.out / "profile.yaml", base, args.cpu_model.resolve())
        swaps = cpu_swaps(profile)
    config = merged(yaml.safe_load(args.config.read_text(encoding="utf-8")) or {}, swaps + args.sets)
    config_path = args.out / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    os.environ["CRAG_CONFIG"] = str(config_path)
    with kg_server(args.serve_kg):
        summary = rehearse(args.data, args.out)
    print(json.dumps({k: v for k, v in summary.items() if k != "problems"}))
    for problem in summary["problems"]:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
