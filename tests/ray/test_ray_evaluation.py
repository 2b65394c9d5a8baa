"""`local_evaluation.py --ray` on a local Ray instance of 2 CPUs: the run folder of a local run, and no question
lost or answered twice when a replica is killed mid-run. Skipped (one line) where Ray is not installed."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: `make ray` installs requirements-ray.txt")

import local_evaluation  # noqa: E402 - after importorskip
from evaluation import ray_runner, run_command  # noqa: E402 - after importorskip
from models.config import REPO_ROOT  # noqa: E402 - after importorskip
from tests.conftest import AS_FROM_A_TERMINAL, SAMPLE, running  # noqa: E402 - after importorskip
from tests.ray.replicas import scripted_model, stall_clock, stalling_model  # noqa: E402 - after importorskip

SETTINGS = ["--set", "task=1", "--set", "attributes.method=none"]  # no KG server, no trained classifier
SAMPLE_IDS = [json.loads(line)["interaction_id"] for line in SAMPLE.read_text(encoding="utf-8").splitlines()]


def evaluate(out: Path, cache: Path, *args: str) -> int:
    return local_evaluation.main(["--data", str(SAMPLE), "--out", str(out), *SETTINGS,
                                  "--set", f"references.cache_dir={cache}", *args])


def predictions(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]


def answers(out: Path) -> dict[str, tuple]:
    """What a question's record says that does not depend on timing: the answer and the references it used."""
    def steady(trace):
        return {k: v for k, v in (trace or {}).items() if k not in ("stages", "seconds")}

    return {r["interaction_id"]: (r["prediction"], r["timed_out"], r["verdict"], r["batch_size"], steady(r["trace"]))
            for r in predictions(out)}


def stalled(marker: Path) -> list[str]:
    """The name and pid of the replica that stalled (tests.ray.replicas.Stalling), once it has written both."""
    lines = marker.read_text().splitlines() if marker.exists() else []
    return lines if len(lines) == 2 else []


def report(out: Path) -> dict:
    return {k: v for k, v in json.loads((out / "report.json").read_text()).items() if k not in ("latency_s", "judge")}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """A local run of the sample with the scripted LLM (before Ray starts: its model process is forked)."""
    out = tmp_path_factory.mktemp("local") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_command, "user_model", scripted_model)
        assert evaluate(out, out.parent / "cache") == 0
    return out


@pytest.fixture(scope="module")
def cluster(local_run):
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.mark.parametrize("address, says", [("127.0.0.1:1", "--ray 127.0.0.1:1: nothing answers there"),
                                            ("headnode", "--ray headnode: give the head's HOST:PORT")])
def test_a_ray_address_that_names_no_head_is_one_line_and_exit_2(address, says, tmp_path, capsys):
    """Checked before ray.init, which would wait on a wrong host (first in this file: no Ray instance is joined)."""
    assert not ray.is_initialized()
    assert evaluate(tmp_path / "run", tmp_path / "cache", "--limit", "1", "--ray", address) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {says}") and "Traceback" not in "\n".join(err), err
    assert not (tmp_path / "run" / "predictions.jsonl").exists()


def test_a_ray_run_writes_the_run_folder_of_a_local_run(local_run, cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_command, "user_model", scripted_model)
    out = tmp_path / "run"
    assert evaluate(out, tmp_path / "cache", "--ray", "--ray-actors", "2") == 0
    err = capsys.readouterr().err
    assert "starting 2 UserModel replicas on Ray" in err and "UserModel ready in" in err
    assert sorted(r["interaction_id"] for r in predictions(out)) == sorted(SAMPLE_IDS)  # each once
    assert answers(out) == answers(local_run)
    assert report(out) == report(local_run)
    written = json.loads((out / "manifest.json").read_text())
    assert written["answers"] == json.loads((local_run / "manifest.json").read_text())["answers"]
    assert written["ray"]["cpus"] == 2 and written["finished"]
    # the folder resumes like a local one: every answer is there, so no replica starts
    assert evaluate(out, tmp_path / "cache", "--ray") == 0
    assert "UserModel replicas" not in capsys.readouterr().err


def test_killing_a_replica_mid_batch_loses_no_question_and_answers_none_twice(local_run, cluster, tmp_path,
                                                                            monkeypatch, capsys):
    marker, stall_on = tmp_path / "stalled", SAMPLE_IDS[4]
    monkeypatch.setattr(run_command, "user_model", functools.partial(stalling_model, marker, stall_on))
    killed: list[str] = []
    finished = threading.Event()

    def kill_the_stalled_replica():  # the replica hanging in the batch of `stall_on`, while it answers it
        while not stalled(marker) and not finished.is_set():
            time.sleep(0.05)  # how often it looks, nothing else
        if stalled(marker):
            killed.append(stalled(marker)[0])
            ray.kill(ray.get_actor(killed[0]))

    killer = threading.Thread(target=kill_the_stalled_replica, daemon=True)
    killer.start()
    out = tmp_path / "run"
    try:  # no time limit: the hanging batch ends by the kill only
        assert evaluate(out, local_run.parent / "cache", "--ray", "--ray-actors", "2", "--time-limit", "0") == 0
    finally:
        finished.set()
        killer.join()
    err = capsys.readouterr().err
    assert killed and f"replica {killed[0]} died under a batch" in err, err
    ids = [r["interaction_id"] for r in predictions(out)]
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(SAMPLE_IDS)  # none lost, none twice
    assert answers(out) == answers(local_run)  # the retried batch was answered by the other replica
    assert report(out) == report(local_run)


def test_a_batch_over_its_deadline_is_i_dont_know_and_its_replica_starts_afresh(local_run, cluster, tmp_path,
                                                                               monkeypatch, capsys):
    """The grader's 30 s a query (120 s a batch of 4), which no batch here comes near by the wall; the hanging
    first batch is past it at once by the replicas' clock (tests.ray.replicas.stall_clock)."""
    marker, stall_on = tmp_path / "stalled", SAMPLE_IDS[0]
    monkeypatch.setattr(run_command, "user_model", functools.partial(stalling_model, marker, stall_on))
    monkeypatch.setattr(ray_runner, "run_on_ray", functools.partial(ray_runner.run_on_ray, clock=stall_clock))
    out = tmp_path / "run"
    assert evaluate(out, local_run.parent / "cache", "--ray", "--ray-actors", "2", "--time-limit", "30") == 0
    err = capsys.readouterr().err
    name, pid = stalled(marker)
    assert f"exceeded its 120 s limit on replica {name}: the replica is restarted" in err, err
    late = [r for r in predictions(out) if r["timed_out"]]
    assert sorted(r["interaction_id"] for r in late) == sorted(SAMPLE_IDS[:4])  # the first batch of 4
    assert all(r["prediction"] == "i don't know" for r in late)
    assert json.loads((out / "report.json").read_text())["timed_out"] == 4
    on_time = {k: v for k, v in answers(out).items() if k not in SAMPLE_IDS[:4]}
    assert on_time == {k: v for k, v in answers(local_run).items() if k not in SAMPLE_IDS[:4]}
    built = (tmp_path / "stalled.built").read_text().split()
    assert len(built) == 3 and pid in built and len(set(built)) == 3  # two replicas, and the hanging one afresh


STALLING_EVALUATION = AS_FROM_A_TERMINAL + """
import functools, sys
from pathlib import Path

import local_evaluation
from evaluation import run_command
from tests.ray.replicas import stalling_model

run_command.user_model = functools.partial(stalling_model, Path(sys.argv[1]), sys.argv[2])
sys.exit(local_evaluation.main(sys.argv[3:]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_the_replicas_and_the_run_resumes(local_run, tmp_path):
    """As from a terminal: SIGINT to the evaluation's process group while a replica hangs in a batch. The
    evaluation starts its own local Ray instance (--ray without an address), as a user's would."""
    script = tmp_path / "stalling_evaluation.py"
    script.write_text(STALLING_EVALUATION)
    marker, out = tmp_path / "stalled", tmp_path / "run"
    args = ["--data", str(SAMPLE), "--out", str(out), *SETTINGS, "--set",
            f"references.cache_dir={local_run.parent / 'cache'}", "--ray", "--ray-actors", "2"]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with (tmp_path / "stderr.txt").open("w") as stderr:
        process = subprocess.Popen([sys.executable, str(script), str(marker), SAMPLE_IDS[4], *args], cwd=REPO_ROOT,
                                   env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    try:  # the waits below end as soon as what they wait for happens; their bounds only stop a broken tree
        end = time.monotonic() + 600
        while not stalled(marker) and process.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        assert stalled(marker), (tmp_path / "stderr.txt").read_text()
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=300) == 130
    finally:
        if process.poll() is None:
            process.kill()
    text = (tmp_path / "stderr.txt").read_text()
    saved = len(predictions(out)) if (out / "predictions.jsonl").exists() else 0
    assert "Traceback" not in text and text.strip().splitlines()[-1] == (
        f"interrupted: {saved} answers are saved in {out / 'predictions.jsonl'}; resume with: python "
        f"local_evaluation.py {' '.join(args)}"), text
    pid = int(stalled(marker)[1])
    end = time.monotonic() + 300
    while running(pid) and time.monotonic() < end:
        time.sleep(0.1)
    assert not running(pid), "a replica outlived the interrupted evaluation"
    # the same command goes on from there (the marker stays: no replica hangs now) and answers the rest, once each
    resumed = subprocess.run([sys.executable, str(script), str(marker), SAMPLE_IDS[4], *args], cwd=REPO_ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    ids = [r["interaction_id"] for r in predictions(out)]
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(SAMPLE_IDS)
    assert answers(out) == answers(local_run)
