import bz2
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

import local_evaluation
from evaluation import manifest, run_command
from evaluation.data import DataError, ReadStats, Selection, alternative_answers, read_examples
from evaluation.judge import judge_by_rules
from evaluation.metrics import Scores, latency
from evaluation.runner import EvaluationError, call_with_limit, load_predictions, run_model, save_judgements
from evaluation.verdicts import CORRECT, MISS, UNJUDGED, WRONG, Item
from models.config import REPO_ROOT, ConfigError
from models.llm.profile import load_profile, write_profile
from models.llm.weights import fingerprint
from models.loading import load_config
from tests.conftest import SAMPLE, running, write, write_config
from utils.batch import BatchResult, make_batch
from utils.trees import differences


def _example(i: int, **extra) -> dict:
    return {"interaction_id": f"id{i}", "query": f"q{i}", "search_results": [], "query_time": "t",
            "answer": f"a{i}", **extra}


def test_reads_jsonl_and_bz2_with_both_alt_spellings(tmp_path):
    lines = [json.dumps(_example(0, alternative_answers='["x", "y"]')), json.dumps(_example(1, alt_ans=["z"]))]
    plain = write(tmp_path / "d.jsonl", "\n".join(lines) + "\n")
    packed = tmp_path / "d.jsonl.bz2"
    packed.write_bytes(bz2.compress(plain.read_bytes()))
    for path in (plain, packed):
        assert [e["alt_answers"] for e in read_examples(path)] == [["x", "y"], ["z"]]


@pytest.mark.parametrize("raw, expected", [("[]", []), ("['a', 'b']", ["a", "b"]), ("plain", ["plain"]),
                                           ([1, "b"], ["1", "b"]), (None, [])])
def test_alternative_answer_forms(raw, expected):
    assert alternative_answers({"alternative_answers": raw}) == expected


def test_malformed_lines_are_skipped_with_line_numbers(tmp_path):
    path = write(tmp_path / "d.jsonl", "\n".join([json.dumps(_example(0)), "{broken", json.dumps({"query": "q"}),
                                                  "", json.dumps(_example(1))]) + "\n")
    stats = ReadStats()
    assert [e["interaction_id"] for e in read_examples(path, stats)] == ["id0", "id1"]
    assert stats.skipped_lines == [2, 3]
    assert len(list(read_examples(path, limit=1))) == 1


def test_unreadable_data_files_are_named(tmp_path):
    with pytest.raises(DataError, match="no such data file"):
        list(read_examples(tmp_path / "none.jsonl"))
    with pytest.raises(DataError, match="unsupported data file type"):
        list(read_examples(write(tmp_path / "d.csv", "a,b")))


@pytest.mark.parametrize("prediction, answer, verdict", [
    ("Christopher Nolan.", "christopher nolan", CORRECT), ("nolan", "christopher nolan", CORRECT),  # alternative
    ("I don\u2019t know", "christopher nolan", MISS), ("i dont know.", "x", MISS), ("", "christopher nolan", MISS),
    ("Invalid question.", "invalid question", CORRECT), ("Invalid question", "christopher nolan", WRONG),
    ("Nolan directed it", "invalid question", WRONG),
    ("Steven Spielberg", "christopher nolan", None),  # the rules cannot tell: an LLM judge reads it
    ("christopher nolan " + "x " * 80, "christopher nolan", None),
])
def test_rule_judge(prediction, answer, verdict):
    assert judge_by_rules(Item("q", answer, ("Nolan",), prediction)) == verdict


def test_scores_and_latency():
    scores = Scores.of([CORRECT, CORRECT, MISS, WRONG, UNJUDGED])
    assert (scores.accuracy, scores.hallucination, scores.missing, scores.unjudged_rate) == (0.4, 0.2, 0.2, 0.2)
    assert scores.score == pytest.approx(0.2)  # an unjudged prediction is not a hallucination
    assert Scores.of([]).score == 0.0
    assert latency([float(i) for i in range(1, 21)]) == {"p50": 10.5, "p95": 19.0, "max": 20.0, "n": 20}
    assert latency([])["n"] == 0


class CountingModel:
    def __init__(self, batch_size=2, fail_after=None, reply=None):
        self.batch_size, self.fail_after, self.reply = batch_size, fail_after, reply
        self.seen: list[str] = []

    def get_batch_size(self):
        return self.batch_size

    def batch_generate_answer(self, batch):
        if self.fail_after is not None and len(self.seen) >= self.fail_after:
            raise KeyboardInterrupt
        self.seen.extend(batch["interaction_id"])
        return self.reply(batch) if self.reply else [f"a{q[1:]}" for q in batch["query"]]


def test_run_appends_and_resumes(tmp_path):
    path = tmp_path / "run" / "predictions.jsonl"
    examples = [_example(i) for i in range(5)]
    with pytest.raises(KeyboardInterrupt):
        run_model(CountingModel(fail_after=2), iter(examples), path)
    assert len(load_predictions(path)) == 2
    model = CountingModel()
    records = run_model(model, iter(examples), path)
    assert model.seen == ["id2", "id3", "id4"]  # finished work is not redone
    assert [r["interaction_id"] for r in records] == [f"id{i}" for i in range(5)]
    assert all(r["prediction"] == r["answer"] for r in records)


class SteppedClock:
    """A clock for batch deadlines that stands still until a test moves it: a batch is late by it, never by how
    fast the machine runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class LateModel(CountingModel):
    """Answers the batch holding id0 an hour after it was asked, by `clock`; `release`, when given, is awaited
    before that batch returns (a call still running when its caller looks), a minute at most: a caller that
    waits for the call fails a test rather than hangs it."""

    def __init__(self, clock: SteppedClock, release: threading.Event | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.clock, self.release = clock, release

    def batch_generate_answer(self, batch):
        if "id0" in batch["interaction_id"]:
            self.clock.now += 3600
            if self.release is not None:
                self.release.wait(60)
        return super().batch_generate_answer(batch)


def test_batches_over_the_time_limit_are_marked_timed_out(tmp_path, caplog_loguru):
    clock = SteppedClock()
    model = LateModel(clock, batch_size=2)
    records = run_model(model, iter([_example(i) for i in range(4)]), tmp_path / "p.jsonl", per_query_s=30,
                        clock=clock)  # 60 s a batch of 2; the first answers an hour late
    assert [r["timed_out"] for r in records] == [True, True, False, False]
    assert [r["prediction"] for r in records] == ["i don't know", "i don't know", "a2", "a3"]
    assert [r["batch_seconds"] for r in records] == [3600.0, 3600.0, 0.0, 0.0]  # measured by the deadline's clock
    assert model.seen == ["id0", "id1", "id2", "id3"]  # the late call was awaited before the next batch
    assert "batch of 2 exceeded its 60 s limit" in caplog_loguru.text


def test_a_late_batch_is_left_running_when_its_caller_can_stop_the_process():
    """A Ray replica's call (wait_late=False): past its limit by the clock, the reply comes while the call still
    runs, however long the limit is by the wall."""
    clock, release = SteppedClock(), threading.Event()
    model = LateModel(clock, release)
    try:
        reply = call_with_limit(model, make_batch([_example(0)]), 600.0, wait_late=False, clock=clock)
        still_running = not model.seen
    finally:
        release.set()
    assert reply == (None, 3600.0, True) and still_running


def test_torn_last_line_is_dropped(tmp_path):
    path = write(tmp_path / "p.jsonl", json.dumps({"interaction_id": "a"}) + "\n{\"interaction_id\": \"b")
    assert list(load_predictions(path)) == ["a"]
    assert path.read_text().endswith("}\n")


def _answered(folder: Path, count: int = 5) -> Path:
    """predictions.jsonl of `count` answered, unjudged questions; each record over 8 KB, so that every record
    written reaches the file before the next is serialised (Python buffers 8 KB)."""
    folder.mkdir()
    lines = [json.dumps({"interaction_id": f"id{i}", "prediction": f"a{i}", "trace": {"notes": "n" * 9000}})
             for i in range(count)]
    return write(folder / "predictions.jsonl", "\n".join(lines) + "\n")


KILLED_WHILE_REWRITING = """
import os, signal, sys
from pathlib import Path

from evaluation import runner

path = Path(sys.argv[1])
judged = [dict(record, verdict="correct") for record in runner.load_predictions(path).values()]
serialised = []
json_line = runner.json_line


def killed_at_the_third(record):  # kill -9 as the third record is serialised: two are written, three not
    serialised.append(record)
    if len(serialised) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return json_line(record)


runner.json_line = killed_at_the_third
runner.save_judgements(path, judged)
"""


def test_a_crash_while_the_judged_records_are_written_leaves_the_old_file(tmp_path):
    path = _answered(tmp_path / "run")
    before = path.read_bytes()
    script = write(tmp_path / "rewrite.py", KILLED_WHILE_REWRITING)
    crashed = subprocess.run([sys.executable, str(script), str(path)], cwd=REPO_ROOT,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert crashed.returncode == -signal.SIGKILL
    assert path.read_bytes() == before
    # a resume reads the old records (the two judged ones the crash left beside them are not read) and asks the
    # model for nothing; the next rewrite leaves no file but predictions.jsonl
    model = CountingModel()
    records = run_model(model, iter([_example(i) for i in range(5)]), path)
    assert model.seen == [] and [r.get("verdict") for r in records] == [None] * 5
    save_judgements(path, [dict(r, verdict="correct") for r in records])
    assert [r["verdict"] for r in load_predictions(path).values()] == ["correct"] * 5
    assert [p.name for p in path.parent.iterdir()] == ["predictions.jsonl"]


def test_a_rewrite_that_fails_half_way_leaves_the_old_file_and_nothing_beside(tmp_path):
    path = _answered(tmp_path / "run")
    before = path.read_bytes()
    judged = [dict(record, verdict="correct") for record in load_predictions(path).values()]
    judged[2]["attribution"] = {"score": object()}  # a value JSON cannot write, as the third record is written
    with pytest.raises(TypeError, match="not JSON serializable"):
        save_judgements(path, judged)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["predictions.jsonl"]


@pytest.mark.parametrize("model, message", [
    (CountingModel(batch_size=0), "get_batch_size\\(\\) returned 0"),
    (CountingModel(batch_size=17), "returned 17"),
    (CountingModel(reply=lambda b: ["x"]), "must return a list of 2 strings"),
    (CountingModel(reply=lambda b: [1, 2]), "must return a list of 2 strings")])
def test_contract_violations_are_errors(tmp_path, model, message):
    with pytest.raises(EvaluationError, match=message):
        run_model(model, iter([_example(0), _example(1)]), tmp_path / "p.jsonl")


def test_sample_data_is_in_sync_with_its_sources_and_covers_the_space():
    assert subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "build_sample.py"), "--check"]).returncode == 0
    examples = list(read_examples(SAMPLE))
    assert len(examples) >= 10
    assert {e["domain"] for e in examples} == {"finance", "sports", "music", "movie", "open"}
    assert len({e["question_type"] for e in examples}) == 8
    assert all(2 <= len(e["search_results"]) <= 5 for e in examples)
    pages = [p["page_result"] for e in examples for p in e["search_results"]]
    assert sum("<table" in p for p in set(pages)) >= 3
    # the answer gate's development set: built by the same tool, and no question of the sample (make eval)
    assert subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "build_sample.py"), "--check", "--source",
                           "data/gate_dev", "--target", "data/gate_dev.jsonl"]).returncode == 0
    development = list(read_examples(REPO_ROOT / "data" / "gate_dev.jsonl"))
    assert len(development) >= 30 and not {e["query"] for e in development} & {e["query"] for e in examples}


def test_cli_errors_are_one_line_with_exit_2(tmp_path, capsys):
    assert local_evaluation.main(["--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    bad = write(tmp_path / "bad.yaml", "batch_sise: 3\n")
    assert local_evaluation.main(["--config", str(bad), "--out", str(tmp_path)]) == 2
    assert "unknown key 'batch_sise'" in capsys.readouterr().err


def test_filters_and_shards_cover_the_selection_once():
    from evaluation.data import Selection

    everything = [e["interaction_id"] for e in read_examples(SAMPLE)]
    shards = [[e["interaction_id"] for e in read_examples(SAMPLE, selection=Selection(shard_index=i, shard_count=3))]
              for i in (1, 2, 3)]
    assert sorted(sum(shards, [])) == sorted(everything) and [len(s) for s in shards] == [5, 4, 4]
    music = list(read_examples(SAMPLE, selection=Selection(domains=frozenset({"music"}))))
    assert len(music) == 3 and {e["domain"] for e in music} == {"music"}
    typed = list(read_examples(SAMPLE, selection=Selection(question_types=frozenset({"set", "simple"}), limit=3)))
    assert len(typed) == 3 and {e["question_type"] for e in typed} <= {"set", "simple"}
    assert list(read_examples(SAMPLE, selection=Selection(split=1))) == []  # the sample has no split field


def _shard_file(folder, records):
    folder.mkdir(parents=True)
    with (folder / "predictions.jsonl").open("w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def test_merge_combines_shards_into_one_report(tmp_path, capsys):
    records = [dict(_example(i), alt_answers=[], prediction=f"a{i}" if i else "no", domain="music",
                    batch_seconds=1.0, batch_size=1) for i in range(3)]
    for record in records:
        record.pop("search_results")
    _shard_file(tmp_path / "shard-1-of-2", records[::2])
    _shard_file(tmp_path / "shard-2-of-2", records[1::2])
    assert local_evaluation.main(["merge", "--data", str(SAMPLE), "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["overall"]["total"] == 3 and report["by_domain"]["music"]["accuracy"] == pytest.approx(2 / 3)
    assert len((tmp_path / "predictions.jsonl").read_text().splitlines()) == 3
    capsys.readouterr()
    (tmp_path / "shard-2-of-2" / "predictions.jsonl").unlink()
    assert local_evaluation.main(["merge", "--data", str(SAMPLE), "--out", str(tmp_path)]) == 2
    assert "shards [2] of 2 have no predictions.jsonl" in capsys.readouterr().err


def test_merge_names_a_folder_of_no_shard(tmp_path, capsys):
    (tmp_path / "shard-one-of-two").mkdir()  # the glob's shape, not a shard's name
    assert local_evaluation.main(["merge", "--data", str(SAMPLE), "--out", str(tmp_path)]) == 2
    assert "needs shard-i-of-n folders of one n (found [])" in capsys.readouterr().err


@pytest.mark.parametrize("shard", ["3", "0/2", "3/2", "a/b"])
def test_bad_shard_is_a_one_line_error(tmp_path, capsys, shard):
    assert local_evaluation.main(["--data", str(SAMPLE), "--out", str(tmp_path), "--shard", shard]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --shard") and err.count("\n") == 0


def _task3_archive(tmp_path, examples):
    import io
    import tarfile

    payload = "".join(json.dumps(e) + "\n" for e in examples).encode()
    archive = tmp_path / "crag_task_3_dev_v4.tar.bz2"
    with tarfile.open(archive, "w:bz2") as tar:
        info = tarfile.TarInfo("crag_task_3_dev_v4/data.jsonl")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return archive


def test_task3_tar_bz2_whole_and_in_parts(tmp_path):
    examples = [_example(i) for i in range(5)]
    archive = _task3_archive(tmp_path, examples)
    assert [e["interaction_id"] for e in read_examples(archive)] == [f"id{i}" for i in range(5)]
    data = archive.read_bytes()
    split = tmp_path / "split"
    split.mkdir()
    size = len(data) // 3 + 1
    for number in range(3):  # part10 sorts before part2 as text: the reader orders pieces by number
        (split / f"crag_task_3_dev_v4.tar.bz2.part{[1, 2, 10][number]}").write_bytes(
            data[number * size : (number + 1) * size]
        )
    first = split / "crag_task_3_dev_v4.tar.bz2.part1"
    assert [e["interaction_id"] for e in read_examples(first, limit=3)] == ["id0", "id1", "id2"]
    assert len(list(read_examples(split / "crag_task_3_dev_v4.tar.bz2"))) == 5  # the stem names the pieces too


def test_interrupted_and_resumed_run_reports_like_an_uninterrupted_one(tmp_path):
    from evaluation.judge import judge_records
    from evaluation.report import score_records

    examples = [dict(_example(i), domain="music") for i in range(6)]
    with pytest.raises(KeyboardInterrupt):
        run_model(CountingModel(fail_after=2), iter(examples), tmp_path / "a" / "p.jsonl")
    resumed = run_model(CountingModel(), iter(examples), tmp_path / "a" / "p.jsonl")
    straight = run_model(CountingModel(), iter(examples), tmp_path / "b" / "p.jsonl")
    for records in (resumed, straight):
        judge_records(records, None)
    def strip(summary: dict) -> dict:
        return {k: v for k, v in summary.items() if k != "latency_s"}

    assert strip(score_records(resumed)) == strip(score_records(straight))


class HangingModel(CountingModel):
    """Hangs in the batch holding id0 until its process is killed."""

    def batch_generate_answer(self, batch):
        if "id0" in batch["interaction_id"]:
            threading.Event().wait()
        return super().batch_generate_answer(batch)


def test_model_worker_stops_a_late_batch_and_starts_afresh():
    from evaluation.worker import ModelWorker

    worker = ModelWorker(lambda: HangingModel(batch_size=2))
    try:
        first_pid = worker._process.pid
        late = worker.call_with_limit(make_batch([_example(0), _example(1)]), 0.5)  # it hangs: past any limit
        assert (late[0], late[2]) == (None, True)
        assert not running(first_pid)  # the late child was killed...
        # ...and a fresh one answers the next batch (a limit it cannot miss; None would hang a broken tree)
        result, _, timed_out = worker.call_with_limit(make_batch([_example(2), _example(3)]), 300.0)
        assert (result, timed_out) == (BatchResult(["a2", "a3"]), False) and worker._process.pid != first_pid
    finally:
        worker.close()


def test_model_worker_reports_a_model_that_cannot_be_built():
    from evaluation.worker import ModelWorker
    from models.llm.backend import BackendUnavailable

    def broken():
        raise FileNotFoundError("no weights at /models/x")

    with pytest.raises(BackendUnavailable, match="no weights at /models/x"):
        ModelWorker(broken)


@pytest.mark.parametrize("pages, task, runs", [(50, 1, 3), (5, 1, 1), (50, 2, 2), (5, 2, 2)])
def test_task_3_data_turns_a_task_1_config_to_task_3(tmp_path, capsys, pages, task, runs):
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    config.task = task
    page = {"page_name": "p", "page_url": "u", "page_snippet": "s", "page_result": "<p>x</p>", "page_last_modified": ""}
    data = write(tmp_path / "d.jsonl", json.dumps(_example(0, search_results=[page] * pages)) + "\n")
    assert run_command.task_for_data(config, data).task == runs
    assert ("Task 3 data" in capsys.readouterr().err) == (runs != task)


# --- the run folder's manifest: a resume never mixes two setups ---------------------------------------------

def _run_folder(out, config, count=2, judge="local"):
    """`out` as a finished run folder of the first `count` sample questions, made by `config`, judged by `judge`."""
    out.mkdir(parents=True)
    fields = ("interaction_id", "query", "answer", "domain", "question_type", "static_or_dynamic")
    records = [json.loads(line) for line in SAMPLE.read_text().splitlines()][:count]
    lines = [json.dumps({**{k: r.get(k) for k in fields}, "alt_answers": [], "prediction": r["answer"],
                         "batch_seconds": 1.0, "batch_size": 1}) for r in records]
    write(out / "predictions.jsonl", "\n".join(lines) + "\n")
    answers = manifest.answer_inputs(config, SAMPLE, 30.0, False)
    manifest.write(out, manifest.build(answers, Selection(limit=count), {"spec": judge}))
    return out


def test_a_resume_with_a_changed_prompt_file_is_refused(tmp_path, capsys):
    out = _run_folder(tmp_path / "run", load_config(REPO_ROOT / "configs" / "cpu.yaml"))
    variant = write(tmp_path / "reasoning_v2.yaml", (REPO_ROOT / "prompts" / "reasoning.yaml").read_text()
                    .replace("Think step by step", "Think"))
    config = write_config(tmp_path / "v2.yaml", {"prompts": {"reasoning": str(variant)}})
    before = (out / "predictions.jsonl").read_bytes()
    assert local_evaluation.main(["--data", str(SAMPLE), "--config", str(config), "--out", str(out),
                                  "--limit", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "prompts.reasoning" in err and "--out" in err and "--force-resume" in err
    assert (out / "predictions.jsonl").read_bytes() == before  # nothing mixed in


def test_a_run_folder_that_recorded_prompt_files_sha256_resumes_while_they_are_unchanged(tmp_path, capsys):
    """Manifests written before prompts were recorded by digest hold each file's sha256: an unchanged file reads
    as its digest, so the folder resumes."""
    import hashlib

    from models.prompting import PromptLibrary

    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    out = _run_folder(tmp_path / "run", config)
    written = json.loads((out / "manifest.json").read_text())
    library = PromptLibrary(config.prompts)
    written["answers"]["prompts"] = {name: hashlib.sha256(library.get(name).path.read_bytes()).hexdigest()
                                     for name in library.digests()}
    write(out / "manifest.json", json.dumps(written))
    assert local_evaluation.main(["--data", str(SAMPLE), "--config", str(REPO_ROOT / "configs" / "cpu.yaml"),
                                  "--out", str(out), "--limit", "2"]) == 0
    assert "another setup" not in capsys.readouterr().err


def test_a_resume_with_other_weights_under_the_same_name_is_refused(tmp_path, capsys):
    """The manifest names the LLM's weights by content: a folder retrained in place is another model."""
    folder = tmp_path / "model"
    folder.mkdir()
    write(folder / "config.json", "{}")
    (folder / "model.safetensors").write_bytes(b"base")
    profile = write(tmp_path / "p.yaml", f"name: smollm2\nweights: {{path: {folder}}}\n")
    config = write_config(tmp_path / "c.yaml", {"llm": {"profile": str(profile)}})
    out = _run_folder(tmp_path / "run", load_config(config))
    assert json.loads((out / "manifest.json").read_text())["answers"]["weights"]["fingerprint"] == \
        fingerprint(folder)[0]
    (folder / "model.safetensors").write_bytes(b"tuned")
    before = (out / "predictions.jsonl").read_bytes()
    assert local_evaluation.main(["--data", str(SAMPLE), "--config", str(config), "--out", str(out),
                                  "--limit", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "weights.fingerprint" in err and "--force-resume" in err
    assert (out / "predictions.jsonl").read_bytes() == before


def test_the_embedded_model_s_weights_are_its_gguf_and_its_converter_s_format():
    from models.llm.weights import FOLDER_FORMAT

    answers = manifest.answer_inputs(load_config(REPO_ROOT / "configs" / "cpu.yaml"), SAMPLE, 30.0, False)
    assert answers["weights"] == {"fingerprint": fingerprint(load_profile().weights_path())[0],
                                  "converter": FOLDER_FORMAT,
                                  "profile": {"name": "smollm2", "max_model_len": 4096,
                                              "prompt_tokens": 2048, "dtype": "bfloat16", "quantization": None,
                                              "tokenizer": None, "chat_template": None}}


def test_a_resume_with_only_a_new_judge_rejudges_and_keeps_the_predictions(tmp_path, capsys):
    out = _run_folder(tmp_path / "run", load_config(REPO_ROOT / "configs" / "cpu.yaml"), judge="local")
    before = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert local_evaluation.main(["--data", str(SAMPLE), "--config", str(REPO_ROOT / "configs" / "cpu.yaml"),
                                  "--out", str(out), "--limit", "2", "--judge", "rules"]) == 0
    assert "UserModel ready" not in capsys.readouterr().err  # every answer was there: no model loaded
    after = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [{k: r[k] for k in b} for r, b in zip(after, before)] == before  # the predictions are kept...
    assert [r["verdict"] for r in after] == ["correct", "correct"] and all(r["judged_by"] == "rules" for r in after)
    written = manifest.load(out)
    assert written["judge"]["spec"] == "rules" and written["finished"] and written["judge"]["prompt_sha256"]
    assert json.loads((out / "report.json").read_text())["overall"]["total"] == 2


def test_the_port_of_a_served_kg_is_not_part_of_what_changes_answers():
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    first = manifest.answer_inputs(config.with_keys("kg", base_url="http://127.0.0.1:4101"), SAMPLE,
                                   30.0, True)
    second = manifest.answer_inputs(config.with_keys("kg", base_url="http://127.0.0.1:5202"), SAMPLE,
                                    30.0, True)
    assert differences(first, second) == []
    other = manifest.answer_inputs(config.with_keys("kg", method="functions"), SAMPLE, 30.0, True)
    assert differences(first, other) == ["config.kg.method ('spans' -> 'functions')"]


def test_an_auto_embedder_precision_is_recorded_as_this_machine_resolved_it(monkeypatch):
    import utils.hardware

    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    config = replace(config, embedder=replace(config.embedder, precision="auto"))
    answers = {}
    for native in (True, False):
        monkeypatch.setattr(utils.hardware, "bf16_supported", lambda device, native=native: native)
        answers[native] = manifest.answer_inputs(config, SAMPLE, 30.0, False)
    assert differences(answers[True], answers[False]) == [
        "config.embedder.precision ('auto: bfloat16' -> 'auto: float32')"]

def test_merge_refuses_shards_of_different_setups(tmp_path, capsys):
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    for i, setup in ((1, config), (2, config.with_keys("kg", method="functions"))):
        _run_folder(tmp_path / "run" / f"shard-{i}-of-2", setup)
    assert local_evaluation.main(["merge", "--data", str(SAMPLE), "--out", str(tmp_path / "run")]) == 2
    assert "shard 2 of 2 was run with another setup" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--domain", "fiance"], "--domain 'fiance' is not a CRAG value; did you mean 'finance'?"),
    (["--question-type", "multihop"], "did you mean 'multi-hop'?"),
    (["--static-or-dynamic", "realtime"], "did you mean 'real-time'?"),
    (["--domain", "finance", "--static-or-dynamic", "real-time"], "the selection keeps no question"),
])
def test_selections_cannot_silently_be_empty(tmp_path, capsys, args, message):
    assert local_evaluation.main(["--data", str(SAMPLE), "--out", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_a_run_with_serve_kg_resumes(tmp_path, capsys):
    """The fixture server's port changes every run; the resume must not read that as another setup."""
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    out = tmp_path / "run"
    _run_folder(out, config)
    manifest.write(out, manifest.build(manifest.answer_inputs(
        config.with_keys("kg", base_url="http://127.0.0.1:1"), SAMPLE, 30.0, True), Selection(limit=2),
        {"spec": "rules"}))
    assert local_evaluation.main(["--data", str(SAMPLE), "--out", str(out), "--limit", "2", "--serve-kg"]) == 0
    err = capsys.readouterr().err
    assert "another setup" not in err and "fixture KG server at" in err and "UserModel ready" not in err


@pytest.mark.parametrize("command", ["run", "rejudge", "merge", "compare"])
def test_every_command_that_reads_questions_takes_the_same_selection_flags(command):
    folders = ["a", "b"] if command == "compare" else []
    args = local_evaluation.parse_args([command, *folders, "--domain", "finance", "--question-type", "set",
                                        "--static-or-dynamic", "static", "--split", "1"])
    assert (args.command, args.domain, args.question_type, args.static_or_dynamic, args.split) == (
        command, "finance", "set", "static", 1)


def test_run_is_the_default_command_and_the_old_flags_say_what_replaced_them(capsys):
    assert local_evaluation.parse_args(["--limit", "3"]).command == "run"
    assert local_evaluation.parse_args([]).command == "run"
    with pytest.raises(SystemExit) as stopped:
        local_evaluation.main(["--rejudge", "--out", "x"])
    assert stopped.value.code == 2 and "--rejudge is a command now: local_evaluation.py rejudge" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        local_evaluation.main(["rejudge", "--shard", "1/2"])  # a flag of run only
    assert stopped.value.code == 2 and "unrecognized arguments: --shard" in capsys.readouterr().err


def test_record_prompts_changes_no_answer_so_a_resume_with_it_is_not_refused(tmp_path, capsys):
    out = _run_folder(tmp_path / "run", load_config(REPO_ROOT / "configs" / "cpu.yaml"))
    assert local_evaluation.main(["--data", str(SAMPLE), "--config", str(REPO_ROOT / "configs" / "cpu.yaml"),
                                  "--out", str(out), "--limit", "2", "--record-prompts"]) == 0
    assert "UserModel ready" not in capsys.readouterr().err


EVALUATION_LIKE_PARENT = '''
import json, os, time
from evaluation.worker import ModelWorker


class Model:
    def __init__(self):
        from utils.web_pages import PageProcessor, PageSettings

        self.pages = PageProcessor(PageSettings(), workers=2, use_cache=False)

    def get_batch_size(self):  # the pids the model runs in, through the worker's pipe
        return json.dumps({"model": os.getpid(), "pages": [p.pid for p in self.pages._pool._pool]})


worker = ModelWorker(Model)
print(worker.get_batch_size(), flush=True)
time.sleep(600)
'''


def outlive_kill_9(tmp_path, source: str, started: Callable[[subprocess.Popen], list[int]]) -> list[int]:
    """Run the Python `source` as an evaluation would be run, take the pids of the processes it started
    (`started(parent)` reads them from its output), kill -9 it and wait for them to end: the pids still running
    after a minute (a watcher thread looks twice a second). Those are killed afterwards."""
    script = tmp_path / "parent.py"
    script.write_text(source)
    parent = subprocess.Popen([sys.executable, str(script)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    pids: list[int] = []
    try:
        pids = started(parent)
        assert pids and all(running(pid) for pid in pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=60)
        deadline = time.monotonic() + 60
        while any(running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)  # how often it looks, nothing else
        return [pid for pid in pids if running(pid)]
    finally:
        parent.kill()
        for pid in pids:
            with contextlib.suppress(OSError):
                if running(pid):
                    os.kill(pid, signal.SIGKILL)
        parent.stdout.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_model_process_and_its_page_workers_die_with_the_evaluation_even_by_kill_9(tmp_path):
    def started(parent: subprocess.Popen) -> list[int]:
        children = json.loads(parent.stdout.readline())
        assert len(children["pages"]) == 2
        return [children["model"], *children["pages"]]

    assert not outlive_kill_9(tmp_path, EVALUATION_LIKE_PARENT, started), "outlived the killed evaluation"

EVALUATION_WITH_KG = '''
import time
from evaluation.kg_fixture.launch import fixture_kg

with fixture_kg() as url:
    print(url, flush=True)
    time.sleep(600)
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_served_kg_dies_with_the_evaluation_even_by_kill_9(tmp_path):
    """`--serve-kg`'s server, started by evaluation/kg_fixture/launch.py, outlived a kill -9 of the evaluation
    before."""

    def started(parent: subprocess.Popen) -> list[int]:  # the children, from /proc/PID/stat: "pid (comm) state ppid"
        url = parent.stdout.readline().strip()
        with urllib.request.urlopen(url + "/", timeout=60):
            pass
        children = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):  # a process that ended while being read
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) if entry.name.isdigit() else 0
                if ppid == parent.pid:
                    children.append(int(entry.name))
        assert len(children) == 1
        return children

    assert not outlive_kill_9(tmp_path, EVALUATION_WITH_KG, started), "the KG server outlived the killed evaluation"


# A stand-in for `vllm serve`: like vLLM's API server it starts a process of its own (the engine core) that a kill
# -9 of the server leaves running, and it answers /health on the port given last.
STAND_IN_SERVER = '''
import http.server, json, os, subprocess, sys, time
core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["STAND_IN_PIDS"], "w") as out:
    json.dump([os.getpid(), core.pid], out)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[-1])), Health).serve_forever()
'''

EVALUATION_WITH_LLM = '''
import json, os, subprocess, sys, time
from pathlib import Path
from evaluation.llm_server import served_llm
from models.llm.profile import load_profile

from models.config import VLLMConfig

with served_llm(Path("unused"), load_profile(), VLLMConfig(), command=[sys.executable, os.environ["STAND_IN"]]) as url:
    stats = {int(p): open(f"/proc/{p}/stat").read() for p in os.listdir("/proc") if p.isdigit()}
    guard = [pid for pid, stat in stats.items() if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid()]
    print(json.dumps({"url": url, "guard": guard}), flush=True)
    time.sleep(600)
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_served_llm_and_the_processes_it_started_die_with_the_evaluation_even_by_kill_9(tmp_path, monkeypatch):
    """`--serve-llm`'s server runs under utils/processes.py's guard in a session of its own: a kill -9 of the
    evaluation ends the guard, the server and the server's own child (vLLM's engine core outlives a killed API
    server)."""
    stand_in, pids_file = tmp_path / "server.py", tmp_path / "pids.json"
    stand_in.write_text(STAND_IN_SERVER)
    monkeypatch.setenv("STAND_IN", str(stand_in))
    monkeypatch.setenv("STAND_IN_PIDS", str(pids_file))

    def started(parent: subprocess.Popen) -> list[int]:
        said = json.loads(parent.stdout.readline())
        with urllib.request.urlopen(said["url"].removesuffix("/v1") + "/health", timeout=60):
            pass
        assert len(said["guard"]) == 1
        return said["guard"] + json.loads(pids_file.read_text())

    assert not outlive_kill_9(tmp_path, EVALUATION_WITH_LLM, started), "the served LLM outlived the killed evaluation"


def test_serve_llm_needs_the_openai_backend(tmp_path):
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")  # the hf backend
    with pytest.raises(ConfigError, match="--serve-llm answers through llm.backend openai"):
        with run_command.llm_for_run(config, True):
            pass


def test_serve_llm_refuses_a_folder_the_engine_would_read_with_another_rope(tmp_path):
    """A folder transformers 5 saved (RoPE only in rope_parameters) is refused before any server starts, in one
    line naming the key, both values and the fix; made portable, it passes that check."""
    from tests.model_families import write as write_family
    from utils.model_folders import check_folder, portable_folder

    folder = write_family(tmp_path, "llama3.1")
    done = subprocess.run([sys.executable, str(REPO_ROOT / "local_evaluation.py"), "run", "--data", str(SAMPLE),
                           "--overlay", str(REPO_ROOT / "configs" / "overlays" / "vllm-cpu.yaml"), "--set",
                           f"llm.profile={write_profile(tmp_path / 'p.yaml', load_profile(), folder)}", "--serve-llm",
                           "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "rope_theta is 500000.0 in rope_parameters" in done.stderr
    assert f"tools/model_folder.py portable --model {folder}" in done.stderr
    portable_folder(folder)
    check_folder(folder)
