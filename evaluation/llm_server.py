"""The embedded model served by the pinned vLLM release's CPU build (.venv-vllm, `make vllm-venv`) for a run:
`local_evaluation.py --serve-llm`. The config answers through `llm.backend: openai` (configs/overlays/vllm-cpu.yaml);
the server gets a free loopback port and the run's config points `llm.openai.base_url` at it. The model is the one
`llm.hf.model` names (null: the embedded SmolLM2, converted once to an HF folder), served under `llm.openai.model`,
in bfloat16: vLLM's CPU kernels read prompts and write tokens faster in it than in float32 on these cores
(`make bench`, engine_cpu)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from evaluation.kg_fixture.launch import stop
from models.config import REPO_ROOT, ConfigError, SystemConfig
from models.llm.hf import resolve_model_folder
from utils.errors import HarnessError
from utils.model_folders import check_folder
from utils.servers import free_port, wait_until_healthy

VLLM = REPO_ROOT / ".venv-vllm" / "bin" / "vllm"
DTYPE = "bfloat16"
KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: a CPU-build server reserves this much memory for its KV cache
MAX_MODEL_LEN = 4096  # SmolLM2's 8192 would reserve a cache twice as long for prompts the hf backend cuts at 2048
STARTUP_LIMIT_S = 600.0  # a guard against a server that hangs, not a timing


class LLMServerError(HarnessError, RuntimeError):
    """The served LLM did not start; the message holds the end of its log."""


# One sequence at a time, and no prefix cache: the CPU build's bfloat16 kernels give results that depend on which
# requests share a forward pass and on what a cached prefix left to compute, both set by timing; alone, a request's
# answer depends on the request only, so make eval answers the same on a busy machine (docs/decisions/cpu-engine.md).
LOAD_INVARIANT = ["--max-num-seqs", "1", "--no-enable-prefix-caching"]


def serve_command(folder: Path, name: str, port: int) -> list[str]:
    """`vllm serve` for `folder` under `name` on the loopback `port`."""
    return [str(VLLM), "serve", str(folder), "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", DTYPE, "--max-model-len", str(MAX_MODEL_LEN), "--seed", "0", "--generation-config", "vllm",
            *LOAD_INVARIANT]


@contextlib.contextmanager
def served_llm(folder: Path, name: str, command: list[str] | None = None) -> Iterator[str]:
    """Serve `folder` for the block; yields the API root (http://127.0.0.1:PORT/v1). The server runs under
    utils/processes.py's guard, so that it and what it starts (vLLM's engine core) end with this process, kill -9
    included. `command` replaces the vLLM command (tests pass a stand-in server; PORT is appended last)."""
    if command is None and not VLLM.exists():
        raise ConfigError(f"--serve-llm: {VLLM} does not exist; build vLLM's CPU build with `make vllm-venv`")
    port = free_port()
    served = serve_command(folder, name, port) if command is None else [*command, str(port)]
    argv = [sys.executable, "-m", "utils.processes", "--parent-pid", str(os.getpid()), "--", *served]
    with tempfile.NamedTemporaryFile("w+", prefix="llm-server-", suffix=".log") as log:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        try:
            wait_until_healthy(process, f"http://127.0.0.1:{port}/health", STARTUP_LIMIT_S, lambda why: LLMServerError(
                f"the served LLM ({served[0]}) {why}: {Path(log.name).read_text()[-1500:]}"))
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            stop(process)


@contextlib.contextmanager
def llm_for_run(config: SystemConfig, serve: bool) -> Iterator[SystemConfig]:
    """The config, pointed at the embedded model served by vLLM's CPU build for the block when `serve`."""
    if not serve:
        yield config
        return
    if config.llm.backend != "openai":
        raise ConfigError(f"{config.source}: --serve-llm answers through llm.backend openai, not "
                          f"{config.llm.backend!r}; add --overlay configs/overlays/vllm-cpu.yaml, or leave "
                          "--serve-llm out")
    folder = resolve_model_folder(config.llm.hf)
    check_folder(folder)  # before minutes of loading: a folder vLLM's transformers 4 would read as another model
    with served_llm(folder, config.llm.openai.model) as url:
        print(f"served LLM at {url} ({folder.name}, vLLM CPU build, {DTYPE})", file=sys.stderr)
        yield replace(config, llm=replace(config.llm, openai=replace(config.llm.openai, base_url=url)))
