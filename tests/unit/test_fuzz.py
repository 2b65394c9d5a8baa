"""Generated CRAG lines of any JSON shape, bytes and sizes through the reader; generated runs through the runner's
write, judge and resume functions with a fault injected at any write; and a few whole `local_evaluation.py run`
processes. Examples are bounded and derandomized: the same cases every run, in seconds."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluation import runner
from evaluation.data import count_examples, read_examples
from evaluation.judge import judge_records
from evaluation.report import score_records
from evaluation.runner import load_predictions, run_model, save_judgements
from models.config import REPO_ROOT
from utils import durable_io as files

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Text with what breaks writers and parsers: lone surrogates, control characters, markup, quotes, long runs.
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["\ud800", "a\x00b", "</script><!--<script", "\"\\", "é",
                                                        "x" * 5000, ""]))
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=12)
IDS = st.sampled_from(["id0", "id1", "id2", "id3"]) | st.integers(-3, 3) | JSON


@st.composite
def crag_lines(draw) -> list[bytes]:
    """Lines of a data file: CRAG examples whose fields take any JSON value, other JSON, and raw bytes."""
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["example", "example", "example", "json", "bytes"]))
        if kind == "example":
            example = {"interaction_id": draw(IDS), "query": draw(TEXT | JSON), "query_time": draw(TEXT | JSON),
                       "search_results": draw(st.lists(st.dictionaries(TEXT, TEXT, max_size=3), max_size=3) | JSON),
                       "answer": draw(TEXT | JSON)}
            for key in draw(st.lists(st.sampled_from(sorted(example)), max_size=1)):
                del example[key]
            lines.append(json.dumps(example).encode())
        elif kind == "json":
            lines.append(json.dumps(draw(JSON)).encode())
        else:
            lines.append(draw(st.binary(max_size=60)).replace(b"\n", b" "))
    return lines


def _writable(value) -> bool:
    """Whether `value` writes as UTF-8 JSON with no escape for surrogates."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@FUZZ
@given(lines=crag_lines())
def test_the_reader_gives_only_well_formed_examples_and_never_raises(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("data") / "d.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    examples = list(read_examples(path, quiet=True))
    ids = [e["interaction_id"] for e in examples]
    assert len(ids) == len(set(ids)) and all(isinstance(i, str) and i.strip() for i in ids)
    for example in examples:
        assert isinstance(example["query"], str) and example["query"].strip()
        assert isinstance(example["query_time"], str)
        assert isinstance(example["search_results"], list)
        assert all(isinstance(page, dict) for page in example["search_results"])
        assert _writable(example)
    from evaluation.data import Selection

    assert count_examples(path, Selection()) == len(examples)


class Scripted:
    """Answers a query with its text reversed (deterministic), in batches of `size`."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_batch_size(self) -> int:
        return self.size

    def batch_generate_answer(self, batch: dict) -> list[str]:
        return [query[::-1][:20] or "i don't know" for query in batch["query"]]


EXAMPLES = st.lists(st.builds(lambda i, q: {"interaction_id": f"q{i}", "query": q or "?", "query_time": "t",
                                            "search_results": [], "answer": q[:3], "alt_answers": []},
                              st.integers(0, 30), TEXT), min_size=1, max_size=10,
                    unique_by=lambda e: e["interaction_id"])
TIMING = ("batch_seconds", "batch_size")


def _comparable(path: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in load_predictions(path).values()]


def _report(path: Path) -> dict:
    summary = score_records(list(load_predictions(path).values()))
    summary.pop("latency_s")
    return summary


def _answer_and_judge(model: Scripted, examples: list[dict], path: Path) -> None:
    records = run_model(model, iter(examples), path, per_query_s=None)
    judge_records(records, None)
    save_judgements(path, records)


@FUZZ
@given(examples=EXAMPLES, size=st.integers(1, 4), fault_at=st.integers(1, 6), where=st.sampled_from(["append",
                                                                                                    "rewrite"]))
def test_a_resume_after_a_failed_write_anywhere_gives_the_uninterrupted_run(tmp_path_factory, monkeypatch, examples,
                                                                            size, fault_at, where):
    folder = tmp_path_factory.mktemp("runs")
    whole, broken = folder / "whole.jsonl", folder / "broken.jsonl"
    _answer_and_judge(Scripted(size), examples, whole)
    writes = {"count": 0}
    real = files.append_lines if where == "append" else files.write_atomic

    def failing(*args):
        writes["count"] += 1
        if writes["count"] == fault_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args)

    with monkeypatch.context() as patched:
        patched.setattr(runner, "append_lines" if where == "append" else "write_atomic", failing)
        try:
            _answer_and_judge(Scripted(size), examples, broken)
        except OSError:
            pass
    _answer_and_judge(Scripted(size), examples, broken)  # the resume
    assert [r["interaction_id"] for r in _comparable(broken)] == [e["interaction_id"] for e in examples]
    assert _comparable(broken) == _comparable(whole)
    assert _report(broken) == _report(whole)


RUN = """
import sys, types


class Model:
    def get_batch_size(self):
        return 2

    def batch_generate_answer(self, batch):
        return [q[::-1][:20] for q in batch["query"]]


module = types.ModuleType("models.user_config")
module.UserModel = lambda config=None: Model()
sys.modules["models.user_config"] = module
import local_evaluation

sys.exit(local_evaluation.main(sys.argv[1:]))
"""


@settings(max_examples=2, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=crag_lines())
def test_whole_runs_of_generated_data_end_well(tmp_path_factory, lines):
    """`local_evaluation.py run` as a process (it forks its model worker): no traceback, each readable question
    answered once, and report.json agrees with predictions.jsonl."""
    folder = tmp_path_factory.mktemp("run")
    data, out, script = folder / "d.jsonl", folder / "out", folder / "run.py"
    good = {"interaction_id": "kept", "query": "a question?", "query_time": "t", "search_results": [], "answer": "a"}
    data.write_bytes(b"\n".join([*lines, json.dumps(good).encode()]) + b"\n")
    script.write_text(RUN)
    done = subprocess.run([sys.executable, str(script), "run", "--data", str(data), "--out", str(out),
                           "--time-limit", "0"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "CRAG_CACHE_DIR": str(folder / "cache")})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    expected = [e["interaction_id"] for e in read_examples(data, quiet=True)]
    answered = [json.loads(line)["interaction_id"] for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert answered == expected and "kept" in answered
    assert json.loads((out / "report.json").read_text())["overall"]["total"] == len(expected)
