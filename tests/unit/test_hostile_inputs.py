"""Bad data and faults through `local_evaluation.py run`, with a scripted UserModel in the forked worker: each gets a
defined outcome (a named warning, a one-line error, a non-zero exit), never a traceback, and no finished answer is
lost."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import local_evaluation
from evaluation import run_command
from evaluation.data import read_examples
from evaluation.html_report import report_html
from evaluation.judge import judge_records
from evaluation.report import score_records
from evaluation.runner import load_predictions
from models.config import REPO_ROOT
from utils import durable_io as files
from utils.batch import BatchResult

IDK = "i don't know"


class ScriptedModel:
    """The grader's UserModel contract (get_batch_size, batch_generate_answer) with fixed answers: `reply(query)`."""

    def __init__(self, reply=lambda query: IDK, batch_size: int = 2) -> None:
        self.reply, self.batch_size = reply, batch_size

    def get_batch_size(self) -> int:
        return self.batch_size

    def batch_generate_answer(self, batch: dict) -> list[str]:
        return [self.reply(query) for query in batch["query"]]


def example(i: int, **fields) -> dict:
    return {"interaction_id": f"id{i}", "query": f"question {i}?", "search_results": [], "query_time": "03/01/2024",
            "answer": f"answer {i}", "domain": "movie", "question_type": "simple", **fields}


def data_file(path: Path, *lines: str | bytes) -> Path:
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return path


def run(monkeypatch, data: Path, out: Path, *flags: str, model: ScriptedModel | None = None) -> int:
    """`local_evaluation.py run` in this process; its forked model worker answers with `model`."""
    monkeypatch.setattr(run_command, "user_model", lambda config: model or ScriptedModel())
    return local_evaluation.main(["run", "--data", str(data), "--out", str(out), "--time-limit", "0", *flags])


def ids_in(out: Path) -> list[str]:
    return [json.loads(line)["interaction_id"] for line in (out / "predictions.jsonl").read_text().splitlines()]


# --- the data -----------------------------------------------------------------------------------------------------

def test_search_results_that_is_not_a_list_is_read_as_no_pages(monkeypatch, tmp_path, capfd):
    data = data_file(tmp_path / "d.jsonl", json.dumps(example(0)), json.dumps(example(1, search_results=5)),
                     json.dumps(example(2, search_results=["a page that is a string", {"page_result": "<p>x</p>"}])))
    out = tmp_path / "run"
    assert run(monkeypatch, data, out) == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert f"{data}:2: search_results is int 5, not a list; read as no pages" in err
    assert f"{data}:3: 1 of 2 search_results are not objects; dropped" in err
    assert err.count(f"{data}:2:") == 1  # named once, however many passes read the file
    assert json.loads((out / "report.json").read_text())["overall"]["total"] == 3
    assert local_evaluation.main(["rejudge", "--data", str(data), "--out", str(out)]) == 0
    assert [e["search_results"] for e in read_examples(data, quiet=True)][1:] == [[], [{"page_result": "<p>x</p>"}]]


def test_a_lone_surrogate_is_cleaned_from_the_data_and_kept_in_a_reply(monkeypatch, tmp_path):
    line = json.dumps(example(0, query="who is \ud800 here?"))  # json.dumps writes the escape "\ud800"
    data = data_file(tmp_path / "d.jsonl", line, json.dumps(example(1)))
    out = tmp_path / "run"
    model = ScriptedModel(lambda query: "a reply with a lone \udc80" if "1" in query else IDK)
    assert run(monkeypatch, data, out, model=model) == 0
    records = load_predictions(out / "predictions.jsonl")
    assert records["id0"]["query"] == "who is \ufffd here?"  # the cleaning pages get
    assert records["id1"]["prediction"] == "a reply with a lone \ufffd"  # the model's reply cleaned the same way


def test_a_json_line_holding_a_lone_surrogate_is_written_and_read_back_unchanged(tmp_path):
    record = {"trace": {"llm_output": "half a pair \ud83d"}}
    path = tmp_path / "p.jsonl"
    with files.open_text(path, "a") as handle:
        files.append_lines(handle, [files.json_line(record)])
    files.write_atomic(tmp_path / "r.json", files.json_line(record))
    for written in (path, tmp_path / "r.json"):
        assert json.loads(written.read_text(encoding="utf-8")) == record


def test_a_repeated_or_unusable_interaction_id_is_named_and_answered_once(monkeypatch, tmp_path, capfd):
    data = data_file(tmp_path / "d.jsonl", json.dumps(example(0)), json.dumps(example(1)),
                     json.dumps(example(0, query="the same id again")),
                     json.dumps(example(3, interaction_id={"an": "object"})),
                     json.dumps(example(4, interaction_id=7)), json.dumps(example(5, query="  ")),
                     json.dumps(example(6, query_time=None)))
    out = tmp_path / "run"
    assert run(monkeypatch, data, out) == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert ids_in(out) == ["id0", "id1", "7"]  # an integer id is read as its digits
    assert "d.jsonl:3: skipped malformed example (interaction_id 'id0' repeats line 1, which is kept)" in err
    assert "d.jsonl:4: skipped malformed example (interaction_id is dict {'an': 'object'}" in err
    assert "d.jsonl:6: skipped malformed example (query is str '  ', not a non-empty string)" in err
    assert "d.jsonl:7: skipped malformed example (query_time is null, not a string)" in err
    assert json.loads((out / "report.json").read_text())["skipped_lines"] == [3, 4, 6, 7]


def test_a_bad_byte_costs_its_line_only(monkeypatch, tmp_path, capfd):
    data = data_file(tmp_path / "d.jsonl", json.dumps(example(0)),
                     json.dumps(example(1, query="caf\u00e9")).encode().replace("\\u00e9".encode(), b"\xe9"),
                     json.dumps(example(2)))
    out = tmp_path / "run"
    assert run(monkeypatch, data, out) == 0
    assert ids_in(out) == ["id0", "id2"]
    assert "d.jsonl:2: skipped malformed example (not UTF-8: byte 0xe9 at column" in capfd.readouterr().err


# --- the run folder -----------------------------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from utils.durable_io import held
    with held(Path(sys.argv[1]), "run"):
        print("holding", flush=True)
        time.sleep(600)
""")


def test_a_second_command_on_a_held_run_folder_is_refused_before_it_changes_anything(monkeypatch, tmp_path, capfd):
    data = data_file(tmp_path / "d.jsonl", *(json.dumps(example(i)) for i in range(3)))
    out = tmp_path / "run"
    assert run(monkeypatch, data, out) == 0
    before = (out / "predictions.jsonl").read_bytes()
    capfd.readouterr()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, text=True)
    try:
        assert holder.stdout.readline() == "holding\n"
        for command in (["--restart"], ["--limit", "1"]):
            assert run(monkeypatch, data, out, *command) == 2
            err = capfd.readouterr().err
            assert err == (f"error: {out} is in use by process {holder.pid} (run); wait for it to end, or give "
                           "another --out\n")
        assert local_evaluation.main(["rejudge", "--data", str(data), "--out", str(out)]) == 2
        assert f"is in use by process {holder.pid}" in capfd.readouterr().err
        assert (out / "predictions.jsonl").read_bytes() == before  # --restart deleted nothing
    finally:
        holder.kill()
        holder.wait()
    assert run(monkeypatch, data, out, "--restart") == 0  # the lock ends with its holder


def test_a_full_disk_ends_the_run_in_one_line_and_the_resume_finishes_it(monkeypatch, tmp_path, capfd):
    data = data_file(tmp_path / "d.jsonl", *(json.dumps(example(i)) for i in range(5)))
    whole = tmp_path / "whole"
    assert run(monkeypatch, data, whole) == 0
    out = tmp_path / "run"
    appended = files.append_lines
    batches = []

    def fill_up(handle, lines):  # the disk fills during the second batch: part of it lands, then ENOSPC
        batches.append(lines)
        if len(batches) == 2:
            handle.write(lines[0][:10])
            handle.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        appended(handle, lines)

    monkeypatch.setattr("evaluation.runner.append_lines", fill_up)
    capfd.readouterr()
    assert run(monkeypatch, data, out) == local_evaluation.WRITE_FAILED
    err = capfd.readouterr().err
    assert "Traceback" not in err and err.count("error") == 1, err
    err = err.splitlines()[-1]
    assert err.startswith("error: No space left on device; 2 answers are saved in ")
    assert err.endswith(f"resume with: python local_evaluation.py run --data {data} --out {out} "
                                 "--time-limit 0")
    monkeypatch.setattr("evaluation.runner.append_lines", appended)
    assert run(monkeypatch, data, out) == 0  # the torn line is dropped; the resume answers the rest
    assert ids_in(out) == ids_in(whole)


def test_a_full_disk_while_reporting_leaves_every_report_file_whole(monkeypatch, tmp_path, capfd):
    data = data_file(tmp_path / "d.jsonl", *(json.dumps(example(i)) for i in range(3)))
    out = tmp_path / "run"
    assert run(monkeypatch, data, out) == 0
    written = {path.name: path.read_bytes() for path in out.iterdir() if path.name.startswith("report")}
    real = files.write_atomic

    def fail_at_the_html(path, data):
        if path.name == "report.html":
            with open(path.with_name(".report.html.x.partial"), "wb") as partial:
                partial.write(data[:100] if isinstance(data, bytes) else data[:100].encode())
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data)

    monkeypatch.setattr("evaluation.html_report.write_atomic", fail_at_the_html)
    capfd.readouterr()
    assert local_evaluation.main(["rejudge", "--data", str(data), "--out", str(out)]) == local_evaluation.WRITE_FAILED
    err = capfd.readouterr().err
    assert err.startswith(f"error: {out / 'report.html'}: No space left on device; 3 answers are in ")
    assert (out / "report.html").read_bytes() == written["report.html"]  # the old page, whole
    monkeypatch.undo()
    assert local_evaluation.main(["rejudge", "--data", str(data), "--out", str(out)]) == 0
    assert not list(out.glob(".*.partial"))  # what the failed write left, removed by the folder's next holder


# --- the report ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["<!--<script", "</script><script>alert(1)</script>", "<!-- -->"])
def test_report_html_keeps_any_string_inside_its_records_block(text):
    records = [dict(example(0, query=text), prediction=text, alt_answers=[], trace=None)]
    judge_records(records, None)
    page = report_html(score_records(records), records, "hostile")
    opening = '<script type="application/json" id="records">'
    start = page.index(opening) + len(opening)
    block = page[start:page.index("</script>", start)]
    assert "<" not in block  # HTML's script-data states change only at a "<": the next "</script>" closes it
    assert json.loads(block)[0]["title"] == text  # the record panel's heading is the query


# --- failed LLM calls ---------------------------------------------------------------------------------------------

class TracedModel(ScriptedModel):
    """A model that keeps a trace (utils/batch.py answer_batch), whose LLM fails while `broken` says so: its
    answers are then "i don't know" with the failure in the trace, as models/stages/stage.py records it."""

    def __init__(self, broken) -> None:
        super().__init__(lambda query: "an answer")
        self.broken = broken

    def answer_batch(self, batch: dict) -> BatchResult:
        failed = self.broken()
        answers = [IDK if failed else "an answer" for _ in batch["query"]]
        trace = [{"interaction_id": i, "reason": "reasoning: the LLM call failed (InternalServerError: 500)" if failed
                  else "", "stages": [], **({"llm_failures": ["reasoning: InternalServerError: 500 after 3 attempts"]}
                                            if failed else {})} for i in batch["interaction_id"]]
        return BatchResult(answers, trace)

    def batch_generate_answer(self, batch: dict) -> list[str]:
        return self.answer_batch(batch).answers


def test_failed_llm_calls_fail_the_run_and_a_resume_answers_them_again(monkeypatch, tmp_path, capfd):
    data = data_file(tmp_path / "d.jsonl", *(json.dumps(example(i)) for i in range(4)))
    out = tmp_path / "run"
    assert run(monkeypatch, data, out, model=TracedModel(lambda: True)) == 1
    err = capfd.readouterr()
    assert "answers with a failed LLM call or stage, not final (a resumed run answers them again): 4 of 4" in err.out
    assert ("error: 4 of 4 answers had an LLM call or a stage fail, over --max-failed 0.5 (reasoning: "
            "InternalServerError (x4))") in err.err
    assert json.loads((out / "report.json").read_text())["failed"] == {
        "answers": 4, "by_cause": {"reasoning: InternalServerError": 4}}
    assert local_evaluation.main(["rejudge", "--data", str(data), "--out", str(out), "--max-failed", "1"]) == 0
    assert run(monkeypatch, data, out, model=TracedModel(lambda: False)) == 0  # the server is back
    records = load_predictions(out / "predictions.jsonl")
    assert [r["prediction"] for r in records.values()] == ["an answer"] * 4
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 4  # one line a question once judged
    assert "failed" not in json.loads((out / "report.json").read_text())


# --- the model's own intake (the grader's batches do not pass through evaluation/data.py) -------------------------

def test_the_model_cuts_an_overlong_query_cleans_it_and_keeps_an_integer_id():
    from models.system import MAX_QUERY_CHARS, unpack_batch
    from utils.batch import make_batch

    (state,) = unpack_batch(make_batch([example(0, query="why \ud800" + "x" * 200_000, interaction_id=7)]))
    assert state.interaction_id == "7" and not state.done
    assert len(state.query) == MAX_QUERY_CHARS and state.query.startswith("why \ufffdx")


def test_lines_a_full_disk_took_in_part_are_cut_off_again(tmp_path, monkeypatch):
    path = tmp_path / "predictions.jsonl"
    path.write_text('{"a": 1}\n')

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with files.open_text(path, "a") as handle:
        monkeypatch.setattr(files.os, "fsync", full)
        with pytest.raises(OSError, match="No space left"):
            files.append_lines(handle, ['{"b": 2}\n', '{"c": 3}\n'])
    assert path.read_text() == '{"a": 1}\n'


# --- network ------------------------------------------------------------------------------------------------------

def test_the_fixture_kg_server_listens_on_loopback_only():
    """`--serve-kg`'s server (evaluation/kg_fixture/launch.py): every listening socket of the processes it starts
    is on a loopback address."""
    import ipaddress

    import psutil

    from evaluation.kg_fixture.launch import fixture_kg

    with fixture_kg() as url:
        started = psutil.Process().children(recursive=True)
        listening = [c.laddr for p in started for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening and url.startswith("http://127.0.0.1:")
    assert all(ipaddress.ip_address(address.ip).is_loopback for address in listening), listening
