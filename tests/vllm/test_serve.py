"""`vllm serve` from the rehearsal venv, started with the command `local_evaluation.py serve-command` prints for the
single-GPU config (the weights swapped for SmolLM2, the port a free one, the GPU's memory share left out), as the real
OpenAI-compatible server behind the openai backend, the LLM judge and UserModel with that config."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from evaluation.llm_server import printed_serve_command
from models.config import REPO_ROOT
from models.llm.backend import LENGTH, STOP, BackendUnavailable, GenParams
from models.llm.openai import OpenAIBackend
from models.llm.profile import ModelProfile, Weights, load_profile, write_profile
from models.loading import load_config
from tests.servers import free_port, running
from tests.vllm.conftest import SMOLLM2
from tests.vllm.test_submission import GPU1
from tests.vllm_scenarios import SHORT, STORY

GPU_ONLY = {"--gpu-memory-utilization"}  # the CPU build sizes its cache by VLLM_CPU_KVCACHE_SPACE instead


def gpu1_profile(name: str | None = None) -> ModelProfile:
    """The single-GPU config's profile with its weights swapped for SmolLM2, as the server serves them; `name`:
    another in place of its own."""
    model = load_profile(load_config(GPU1).llm.profile)
    return replace(model, weights=Weights(path=str(SMOLLM2)), name=name or model.name)


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    """(base_url, served model name, log path) of `vllm serve` run from the command serve-command prints."""
    argv = shlex.split(printed_serve_command(load_config(GPU1)))
    assert argv[:2] == ["vllm", "serve"]
    flags, kept = argv[3:], []
    while flags:
        flag = flags.pop(0)
        value = flags.pop(0) if flags and not flags[0].startswith("--") else None
        if flag in GPU_ONLY:
            continue
        if flag == "--port":
            value = str(free_port())
        kept += [flag] + ([value] if value is not None else [])
    port = kept[kept.index("--port") + 1]
    name = kept[kept.index("--served-model-name") + 1]
    executable = shutil.which("vllm", path=str(Path(sys.executable).parent))
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    with running([executable, "serve", str(smollm2), *kept], f"http://127.0.0.1:{port}/health", log_path,
                 "vllm serve"):
        yield f"http://127.0.0.1:{port}/v1", name, log_path


def backend(server, model: str | None = None, **changes) -> OpenAIBackend:
    """The openai backend with the single-GPU config's settings and profile (the weights SmolLM2's, so prompts are
    cut with its tokenizer), pointed at the server; `model`: another name to ask for."""
    url, _, _ = server
    config = load_config(GPU1).llm.openai
    config.base_url = url
    for key, value in changes.items():
        setattr(config, key, value)
    return OpenAIBackend(config, gpu1_profile(model))


def test_the_profile_s_model_name_is_the_server_s(server):
    llm = backend(server)
    assert llm.model == server[1] == load_profile(load_config(GPU1).llm.profile).name
    llm.probe()


def test_n_samples_in_one_request_each_with_its_finish_reason_and_log_probabilities(server):
    llm = backend(server)
    assert llm.config.native_n
    [samples] = llm.generate([STORY], GenParams(n=3, temperature=0.8, seed=2, max_tokens=5, logprobs=True))
    assert len(samples) == 3 and not llm.n_ignored
    assert all(s.finish_reason == LENGTH and len(s.token_logprobs) == 5 and s.text.strip() for s in samples)
    assert all(lp <= 0 for s in samples for lp in s.token_logprobs)


def test_stop_strings_and_a_natural_end(server):
    llm = backend(server)
    [[free]] = llm.generate([STORY], GenParams(max_tokens=16))
    word = free.text.split()[2]
    [[cut]] = llm.generate([STORY], GenParams(max_tokens=16, stop=[word]))
    assert cut.finish_reason == STOP and cut.text == free.text[:free.text.find(word)].strip()
    [[short]] = llm.generate([SHORT], GenParams(max_tokens=48))
    assert short.finish_reason == STOP and short.text.strip()


def test_concurrent_requests_are_all_answered(server):
    llm = backend(server)
    questions = [[{"role": "user", "content": f"What is {i} plus {i}?"}] for i in range(12)]
    answers = llm.generate(questions, GenParams(max_tokens=6))
    assert len(answers) == 12 and all(len(a) == 1 and a[0].text.strip() for a in answers)


def test_a_wrong_model_name_stops_the_run_at_start(server):
    """A 4xx is a configuration error: the probe raises with the status and what to fix, before any batch."""
    with pytest.raises(BackendUnavailable, match="HTTP 404.*model name"):
        backend(server, model="no-such-model").probe()


def test_the_llm_judge_reads_the_server_s_verdicts(server):
    """Through the judge prompt, sentences the rules leave open get a verdict read from the server's replies
    (not the rules' fallback, not unjudged)."""
    from evaluation.judge import LLMJudge
    from evaluation.verdicts import CORRECT, WRONG, Item
    from models.prompting import PromptLibrary

    url, name, _ = server
    judge = LLMJudge(backend(server), PromptLibrary().get("judge"), f"{url}#{name}", cache=None)
    items = [Item("who directed inception?", "christopher nolan", (), "It was directed by Christopher Nolan."),
             Item("who directed inception?", "christopher nolan", (), "It was directed by Steven Spielberg.")]
    verdicts = judge.judge(items)
    assert judge.calls >= 1 and len(verdicts) == 2
    assert any(v in (CORRECT, WRONG) for v in verdicts) and judge.fallbacks < 2


def test_user_model_with_the_single_gpu_config_answers_through_the_server(server, tmp_path, monkeypatch):
    """UserModel built from the config file as the grader builds it, the embedder swapped for MiniLM."""
    import yaml

    from models.user_config import UserModel

    url, _, _ = server
    config = yaml.safe_load(GPU1.read_text())
    config["llm"]["openai"]["base_url"] = url
    config["llm"]["profile"] = str(write_profile(tmp_path / "profile.yaml", gpu1_profile(), SMOLLM2))
    config["embedder"] = {**config["embedder"], "model": None, "device": "cpu"}
    config["references"]["rerank"]["device"] = "cpu"
    config["references"]["workers"] = 1
    config["task"] = 1  # no KG server here
    path = tmp_path / "gpu1.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("CRAG_CONFIG", str(path))
    model = UserModel()
    try:
        sample = [json.loads(line) for line in (GPU1.parents[1] / "data" / "crag_sample.jsonl").open()][:2]
        batch = {key: [example[key] for example in sample]
                 for key in ("interaction_id", "query", "search_results", "query_time")}
        result = model.answer_batch(batch)
        answers = result.answers
        assert len(answers) == 2 and all(isinstance(a, str) and a for a in answers)
        reasoning = [next(s for s in r["stages"] if s["stage"] == "reasoning") for r in result.trace]
        assert all(stage["status"] == "ok" for stage in reasoning)
    finally:
        model.close()


SERVED_BY_AN_EVALUATION = '''
import sys, time
from pathlib import Path
from evaluation.llm_server import served_llm
from models.config import VLLMConfig
from models.llm.profile import load_profile

with served_llm(Path(sys.argv[1]), load_profile(), VLLMConfig()) as url:
    print(url, flush=True)
    time.sleep(600)
'''


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc's parent links."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue  # a process that ended while being read
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def listeners(pids: list[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening TCP socket of `pids`."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            found += [(c.laddr.ip, c.laddr.port, pid) for c in psutil.Process(pid).net_connections(kind="tcp")
                      if c.status == psutil.CONN_LISTEN]
    return found


def test_the_served_engine_listens_on_loopback_only_and_dies_with_a_killed_evaluation(smollm2, tmp_path):
    """`--serve-llm`'s real server (evaluation/llm_server.py served_llm), one engine start for both checks:
    - the API server and every socket of the engine core are on loopback, vLLM's torch.distributed init method names
      loopback, and torch's store at that init method's port listens there too (evaluation/engine_site/
      sitecustomize.py), not on every interface;
    - after a kill -9 of the evaluation that started it, no process it started is left, the engine core
      (VLLM::EngineCore) included, which a killed `vllm serve` alone leaves running."""
    script = tmp_path / "parent.py"
    script.write_text(SERVED_BY_AN_EVALUATION)
    parent = subprocess.Popen([sys.executable, str(script), str(smollm2)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(tmp_path)})
    started: list[int] = []
    try:
        url = parent.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), "the served engine did not start"
        started = descendants(parent.pid)
        names = [Path(f"/proc/{pid}/comm").read_text().strip() for pid in started if alive(pid)]
        assert any(name.startswith("VLLM::Engine") for name in names), names  # comm: 15 characters at most

        found = listeners(started)
        (log,) = tmp_path.glob("llm-server-*.log")  # served_llm's log, in the parent's TMPDIR
        init = re.search(r"distributed_init_method=tcp://([\d.]+):(\d+)", log.read_text())
        assert init is not None and init.group(1) == "127.0.0.1", "the engine core's init method is not on loopback"
        port = int(url.removesuffix("/v1").rsplit(":", 1)[1])
        assert ("127.0.0.1", port) in {(address, p) for address, p, _ in found}  # the API
        assert ("127.0.0.1", int(init.group(2))) in {(address, p) for address, p, _ in found}  # torch's store
        assert [(a, p) for a, p, _ in found if not ipaddress.ip_address(a).is_loopback] == []

        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=60)
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.1)  # how often it looks, nothing else
        assert not [pid for pid in started if alive(pid)], "processes outlived the killed evaluation"
    finally:
        parent.kill()
        for pid in started:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        parent.stdout.close()
