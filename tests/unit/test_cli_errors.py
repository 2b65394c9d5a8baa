"""Every command ends bad input with one line on stderr and exit 2, never a traceback, and checks it before any
work starts; Ctrl-C stops an evaluation with one line (what was saved, the command that resumes) and exit 130."""

from __future__ import annotations

import bz2
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.config import REPO_ROOT
from tests.conftest import AS_FROM_A_TERMINAL, SAMPLE, write

CPU = REPO_ROOT / "configs" / "cpu.yaml"


def _config(tmp_path: Path, prompts: str) -> Path:
    """configs/cpu.yaml with `prompts: {...}` set."""
    return write(tmp_path / "config.yaml", CPU.read_text() + f"prompts: {{{prompts}}}\n")


def _labelled_bz2(tmp_path: Path) -> Path:
    """Labelled questions that are all of one domain, compressed as CRAG ships its files."""
    rows = (REPO_ROOT / "data" / "attributes" / "questions.jsonl").read_text().splitlines()[:40]
    text = "".join(json.dumps(dict(json.loads(row), domain="finance")) + "\n" for row in rows)
    path = tmp_path / "one_domain.jsonl.bz2"
    path.write_bytes(bz2.compress(text.encode()))
    return path


def _negative_lists(tmp_path: Path) -> Path:
    rows = [{"query": f"q{i}", "references": [f"text {i}", f"other {i}"], "labels": [0, 0]} for i in range(8)]
    return write(tmp_path / "lists.jsonl", "".join(json.dumps(row) + "\n" for row in rows))


def _pairs(tmp_path: Path) -> Path:
    rows = [{"query": f"q{i}", "positives": [f"text {i}"]} for i in range(6)]
    return write(tmp_path / "pairs.jsonl", "".join(json.dumps(row) + "\n" for row in rows))


EVAL = "local_evaluation"
LIMIT = ["--limit", "1"]  # where a bad input is not caught, the run stays short

# (command module, arguments given tmp_path, what the one line must say)
CASES = {
    "corrupt bz2 data": (EVAL, lambda t: ["--data", str(write(t / "d.jsonl.bz2", "not bz2")), "--out", str(t / "r"),
                                          *LIMIT], "d.jsonl.bz2: unreadable"),
    "--out is a file": (EVAL, lambda t: ["--out", str(write(t / "afile", "x")), *LIMIT], "a file, not a folder"),
    "unknown log level": (EVAL, lambda t: ["--log-level", "verbose", "--out", str(t / "r"), *LIMIT],
                          "--log-level 'verbose' is not a log level"),
    "negative limit": (EVAL, lambda t: ["--limit", "-1", "--out", str(t / "r")], "--limit -1: give a positive"),
    "negative time limit": (EVAL, lambda t: ["--time-limit", "-5", "--out", str(t / "r"), *LIMIT],
                            "--time-limit -5.0"),
    "empty data": (EVAL, lambda t: ["--data", str(write(t / "e.jsonl", "")), "--out", str(t / "r"), *LIMIT],
                   "e.jsonl: no examples"),
    "non-CRAG data": (EVAL, lambda t: ["--data", str(write(t / "n.jsonl", "\n" + json.dumps({"a": 1}) + "\n")),
                                       "--out", str(t / "r"), *LIMIT], "n.jsonl:2: not a CRAG example"),
    "misspelled prompt in the config": (
        EVAL, lambda t: ["--config", str(_config(t, "reasonng: prompts/reasoning.yaml")), *LIMIT,
                         "--out", str(t / "r")],
        "prompts.reasonng: no prompt has that name; did you mean 'reasoning'?"),
    "prompt of another stage in the config": (
        EVAL, lambda t: ["--config", str(_config(t, "reasoning: prompts/judge.yaml")), "--out", str(t / "r"), *LIMIT],
        "a prompt of another stage"),
    "--ray-actors without --ray": (EVAL, lambda t: ["--ray-actors", "2", "--out", str(t / "r"), *LIMIT],
                                   "--ray-actors 2: it counts Ray replicas; add --ray"),
    "--ray-actors 0": (EVAL, lambda t: ["--ray", "--ray-actors", "0", "--out", str(t / "r"), *LIMIT],
                       "--ray-actors 0: give 1 or more replicas"),
    "flag that is not a number": (EVAL, lambda t: ["--limit", "x"], "argument --limit: invalid int value"),
    "tune: misspelled prompt in the config": (
        "tools.tune_prompts", lambda t: ["--config", str(_config(t, "reasonng: prompts/reasoning.yaml")), "--variant",
                                         "prompts/reasoning.yaml", "--out", str(t / "o"), *LIMIT],
        "did you mean 'reasoning'?"),
    "tune: variant of another stage": (
        "tools.tune_prompts", lambda t: ["--variant", "prompts/judge.yaml", "--out", str(t / "o"), *LIMIT],
        "--variant prompts/judge.yaml"),
    "tune: negative limit": ("tools.tune_prompts", lambda t: ["--variant", "prompts/reasoning.yaml", "--limit", "-1",
                                                              "--out", str(t / "o")], "--limit -1"),
    "attributes: one class, from .jsonl.bz2": ("tools.train_attributes", lambda t: [
        "--data", str(_labelled_bz2(t)), "--out", str(t / "m.pkl")], "a classifier needs at least two classes"),
    "r2former: no positive reference": ("tools.train_r2former", lambda t: [
        "--data", str(_negative_lists(t)), "--out", str(t / "r.pt")], "none of the 16 references is positive"),
    "r2former: one fold": ("tools.train_r2former", lambda t: [
        "--data", str(_negative_lists(t)), "--folds", "1", "--out", str(t / "r.pt")], "--folds at least 2"),
    "hash: --out under a file": ("tools.train_hash", lambda t: [
        "--data", str(_pairs(t)), "--out", str(write(t / "afile", "x") / "h.hidx")],
        "afile is a file, so the folder cannot be made"),
    "check: no such repository": ("tools.check_submission", lambda t: ["--repo", str(t / "none"), "--cpu"],
                                  "no such folder"),
    "budget: required flags missing": ("tools.budget_plan", lambda t: [], "required: --prefill-tps"),
    "finetune: a folder that is no run": ("tools.train_llm", lambda t: [
        "data", "--run", str(t), "--out", str(t / "d")], "no predictions.jsonl; give a run folder"),
    "finetune: no data built": ("tools.train_llm", lambda t: ["train", "--data", str(t), "--out", str(t / "o")],
                                "no sft.jsonl; build it with `python tools/train_llm.py data`"),
    "finetune: an adapter folder without an adapter": ("tools.train_llm", lambda t: [
        "merge", "--adapter", str(t), "--out", str(t / "m")], "no adapter_config.json"),
    "finetune bench: --train-only with nowhere to keep the models": (
        "benchmarks.finetune", lambda t: ["--train-only"], "--train-only needs --runs"),
    "kg server: port out of range": ("tools.kg_server", lambda t: ["--port", "70000"], "--port 70000"),
    "kg server: not its parent": ("tools.kg_server", lambda t: ["--parent-pid", "1"], "not this server's parent"),
    "screenshot: zero width": ("tools.screenshot", lambda t: [str(SAMPLE), str(t / "p.png"), "--width", "0"],
                               "--width 0"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, capsys, monkeypatch):
    import importlib

    module, arguments, message = CASES[case]
    monkeypatch.setenv("CRAG_CACHE_DIR", str(tmp_path / "cache"))
    main = importlib.import_module(module).main
    try:
        code = main(arguments(tmp_path))
    except SystemExit as stopped:  # argparse's errors
        code = stopped.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and message in lines[0], err


# --- Ctrl-C: an evaluation of a scripted model in a child process gets SIGINT, as from a terminal -------------

FAKE_EVALUATION = AS_FROM_A_TERMINAL + '''
import json, os, sys, threading, types


class FakeModel:
    """Answers one question a batch, with two page worker processes, and writes the pids it runs in. The third
    batch hangs until the process is killed (the test runs with no time limit), so the run cannot end before the
    Ctrl-C reaches it, however busy the machine."""

    def __init__(self, config):
        from utils.web_pages import PageProcessor, PageSettings

        self.pages = PageProcessor(PageSettings(), workers=2, use_cache=False)
        self.batches = 0
        with open(os.environ["FAKE_MODEL_PIDS"], "w") as out:
            json.dump({"model": os.getpid(), "pages": [p.pid for p in self.pages._pool._pool]}, out)

    def get_batch_size(self):
        return 1

    def batch_generate_answer(self, batch):
        self.pages.process([("<p>some text</p>", "p")], 5.0)
        self.batches += 1
        if self.batches == 3:
            threading.Event().wait()
        return ["i don't know"] * len(batch["query"])


module = types.ModuleType("models.user_config")
module.UserModel = FakeModel
sys.modules["models.user_config"] = module
import local_evaluation

sys.exit(local_evaluation.main(sys.argv[1:]))
'''


def _start_evaluation(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    """The evaluation with the fake model, in its own process group (a terminal's Ctrl-C reaches the group); its
    output goes to files, since children that outlive it would hold pipes open."""
    script = write(tmp_path / "fake_evaluation.py", FAKE_EVALUATION)
    pids, err = tmp_path / "pids.json", tmp_path / "stderr.txt"
    env = dict(os.environ, FAKE_MODEL_PIDS=str(pids), PYTHONPATH=str(REPO_ROOT), CRAG_CACHE_DIR=str(tmp_path / "c"))
    with err.open("w") as stderr, (tmp_path / "stdout.txt").open("w") as stdout:
        process = subprocess.Popen([sys.executable, str(script), "--data", str(SAMPLE), *args], cwd=REPO_ROOT,
                                   env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    return process, pids, err


def _wait_for(condition, process: subprocess.Popen) -> bool:
    """Whether `condition()` came true before `process` ended; given up after 5 minutes (a broken tree), a wait
    no run of the fake model comes near."""
    end = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)  # how often it looks, nothing else
    return condition()


def _kill_if_ours(pid: int | None) -> None:
    """SIGKILL `pid` if it still runs the fake evaluation (a forked child shares its command line)."""
    try:
        if pid and b"fake_evaluation.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError):
        pass


def _answers(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def test_ctrl_c_stops_an_evaluation_with_one_line_saying_what_was_saved(tmp_path):
    out = tmp_path / "run"
    process, pids, err = _start_evaluation(tmp_path, "--out", str(out), "--restart", "--time-limit", "0")
    try:
        assert _wait_for(lambda: _answers(out / "predictions.jsonl") >= 2, process), err.read_text()
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=120) == 130, err.read_text()
    finally:  # what this test started, should it outlive the test (the model process and page workers included)
        children = json.loads(pids.read_text()) if pids.exists() else {"model": None, "pages": []}
        for pid in (process.pid, children["model"], *children["pages"]):
            _kill_if_ours(pid)
    text = err.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    saved = _answers(out / "predictions.jsonl")
    assert saved == 2  # the third batch hung until the Ctrl-C
    assert lines[-1] == (f"interrupted: {saved} answers are saved in {out / 'predictions.jsonl'}; resume with: python "
                         f"local_evaluation.py --data {SAMPLE} --out {out} --time-limit 0"), text  # --restart left out
    assert sum(line.startswith("interrupted") for line in lines) == 1


# --- progress: totals (so a rate and an ETA) in the question loop and the judge pass ----------------------------

def _recording_tqdm(monkeypatch, module):
    """Every progress bar `module` makes, drawn into a string as on a terminal (tests run without one)."""
    import io

    from tqdm import tqdm

    bars = []

    class Recorded(tqdm):
        def __init__(self, *args, **kwargs):
            self.drawn = io.StringIO()
            super().__init__(*args, **{**kwargs, "disable": False, "file": self.drawn, "mininterval": 0})
            bars.append(self)

    monkeypatch.setattr(module, "tqdm", Recorded)
    return bars


def test_the_question_loop_shows_how_many_are_left_of_how_many(tmp_path, monkeypatch):
    from evaluation import runner
    from evaluation.data import Selection, count_examples, read_examples

    bars = _recording_tqdm(monkeypatch, runner)
    path = tmp_path / "p.jsonl"
    selection = Selection(limit=6)

    class Model:
        def get_batch_size(self):
            return 2

        def batch_generate_answer(self, batch):
            return ["x"] * len(batch["query"])

    runner.run_model(Model(), read_examples(SAMPLE, limit=2), path)  # two answered before: a resume
    runner.run_model(Model(), read_examples(SAMPLE, selection=selection), path,
                     count=lambda answered: count_examples(SAMPLE, selection, answered))
    bar = bars[-1]
    assert (bar.n, bar.total) == (4, 4)  # the questions left of this run, not those answered before
    assert "4/4" in bar.drawn.getvalue() and "2 already in p.jsonl" in bar.drawn.getvalue()


def test_the_judge_pass_shows_its_progress(monkeypatch):
    from evaluation import judge as judge_module
    from evaluation.judge import LLMJudge
    from models.prompting import PromptLibrary
    from tests.fakes import ScriptedLLM

    bars = _recording_tqdm(monkeypatch, judge_module)
    judge = LLMJudge(ScriptedLLM(lambda conversation: '{"correct": true}'), PromptLibrary().get("judge"), "scripted",
                     None, batch_size=2)
    items = [judge_module.Item(f"q{i}", "paris", (), f"Lyon {i}") for i in range(5)]
    assert judge.judge(items) == ["correct"] * 5
    (bar,) = bars
    assert (bar.n, bar.total) == (5, 5) and "5/5" in bar.drawn.getvalue()
