"""`vllm serve` for a config's model profile: the command `local_evaluation.py serve-command` prints for a GPU, and
the server `local_evaluation.py --serve-llm` starts with the pinned vLLM release's CPU build (.venv-vllm, `make
vllm-venv`) for a run. Both come from `serve_command`: the profile's folder, name, context length, dtype,
quantization and overrides, on the config's engine settings (llm.vllm: tensor parallelism, a forced dtype, the
memory share). With --serve-llm the config answers through `llm.backend: openai` (configs/overlays/vllm-cpu.yaml);
the server gets a free loopback port and the run's config points `llm.openai.base_url` at it."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from evaluation.kg_fixture.launch import stop
from models.config import REPO_ROOT, ConfigError, SystemConfig, VLLMConfig
from models.llm.hf import resolve_model_folder
from models.llm.profile import SERVED_SEQUENCES, ModelProfile, engine_dtype, load_profile, served_config
from utils.errors import HarnessError
from utils.model_folders import check_folder
from utils.servers import ENGINE_ON_LOOPBACK, LOOPBACK, free_port, wait_until_healthy

VLLM = REPO_ROOT / ".venv-vllm" / "bin" / "vllm"
KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: a CPU-build server reserves this much memory for its KV cache
STARTUP_LIMIT_S = 600.0  # a guard against a server that hangs, not a timing


class LLMServerError(HarnessError, RuntimeError):
    """The served LLM did not start; the message holds the end of its log."""


# One sequence at a time, and no prefix cache: the CPU build's bfloat16 kernels give results that depend on which
# requests share a forward pass and on what a cached prefix left to compute, both set by timing; alone, a request's
# answer depends on the request only, so make eval answers the same on a busy machine (docs/decisions/cpu-engine.md).
LOAD_INVARIANT = ["--max-num-seqs", str(SERVED_SEQUENCES), "--no-enable-prefix-caching"]


def serve_command(folder: Path | str, profile: ModelProfile, engine: VLLMConfig, host: str, port: int,
                  cpu: bool = False) -> list[str]:
    """`vllm serve` for the profile's weights in `folder`, under its name, length and dtype, on `engine`'s hardware
    choices, at `host`:`port`. `cpu`: the CPU build's server for a run (its binary, one sequence at a time and no
    prefix cache; no GPU memory share), else the command a GPU machine runs."""
    command = [str(VLLM) if cpu else "vllm", "serve", str(folder), "--served-model-name", profile.name, "--host", host,
               "--port", str(port), "--dtype", engine_dtype(profile, engine), "--max-model-len",
               str(profile.max_model_len), "--seed", str(engine.seed), "--generation-config", "vllm"]
    if profile.quantization:
        command += ["--quantization", profile.quantization]
    if profile.tokenizer:
        command += ["--tokenizer", profile.tokenizer]
    if profile.chat_template:
        command += ["--chat-template", profile.chat_template]
    if engine.tensor_parallel_size > 1:
        command += ["--tensor-parallel-size", str(engine.tensor_parallel_size)]
    if engine.kv_cache_dtype != "auto":
        command += ["--kv-cache-dtype", engine.kv_cache_dtype]
    if engine.enforce_eager:
        command += ["--enforce-eager"]
    return command + (LOAD_INVARIANT if cpu else ["--gpu-memory-utilization", str(engine.gpu_memory_utilization)])


def served_folder(profile: ModelProfile) -> Path | str:
    """The folder a GPU's server loads: the profile's weights path as written (the server starts in the repository),
    or the HF folder its packaged .gguf converts to."""
    if profile.weights is not None and profile.weights.path is not None:
        return profile.weights.path
    return resolve_model_folder(profile)


def printed_serve_command(config: SystemConfig) -> str:
    """The shell command that serves `config`'s profile where its llm.openai.base_url points, for a GPU machine."""
    url = urlsplit(config.llm.openai.base_url)
    if not url.hostname or not url.port:
        raise ConfigError(f"{config.source}: llm.openai.base_url {config.llm.openai.base_url} names no host and "
                          "port to serve at; write it as http://HOST:PORT/v1")
    profile = load_profile(config.llm.profile)
    return shlex.join(serve_command(served_folder(profile), profile, config.llm.vllm, url.hostname, url.port))


# Its sitecustomize holds torch's store, which vLLM's engine core starts, to loopback (the module says how).
ENGINE_SITE = REPO_ROOT / "evaluation" / "engine_site"


def server_env() -> dict[str, str]:
    """The served engine's environment: its KV cache, no hub, this repository importable (the guard), and every
    socket of vLLM's on loopback (VLLM_HOST_IP, and ENGINE_SITE for torch's store)."""
    paths = [str(ENGINE_SITE), str(REPO_ROOT), os.environ.get("PYTHONPATH")]
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "HF_HUB_OFFLINE": "1", **ENGINE_ON_LOOPBACK,
            "PYTHONPATH": os.pathsep.join(filter(None, paths))}


@contextlib.contextmanager
def served_llm(folder: Path, profile: ModelProfile, engine: VLLMConfig,
               command: list[str] | None = None) -> Iterator[str]:
    """Serve `folder` for the block; yields the API root (http://127.0.0.1:PORT/v1). The server runs under
    utils/processes.py's guard, so that it and what it starts (vLLM's engine core) end with this process, kill -9
    included. `command` replaces the vLLM command (tests pass a stand-in server; PORT is appended last)."""
    if command is None and not VLLM.exists():
        raise ConfigError(f"--serve-llm: {VLLM} does not exist; build vLLM's CPU build with `make vllm-venv`")
    port = free_port()
    served = (serve_command(folder, profile, engine, LOOPBACK, port, cpu=True) if command is None
              else [*command, str(port)])
    argv = [sys.executable, "-m", "utils.processes", "--parent-pid", str(os.getpid()), "--", *served]
    with tempfile.NamedTemporaryFile("w+", prefix="llm-server-", suffix=".log") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=server_env(), cwd=REPO_ROOT)
        try:
            wait_until_healthy(process, f"http://{LOOPBACK}:{port}/health", STARTUP_LIMIT_S, lambda why: LLMServerError(
                f"the served LLM ({served[0]}) {why}: {Path(log.name).read_text()[-1500:]}"))
            yield f"http://{LOOPBACK}:{port}/v1"
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
    profile = load_profile(config.llm.profile)
    folder = resolve_model_folder(profile, config.llm.hf.cache_dir)
    check_folder(folder)  # before minutes of loading: a folder vLLM's transformers 4 would read as another model
    with served_llm(folder, profile, config.llm.vllm) as url:
        print(f"served LLM at {url} ({folder.name} as {profile.name}, vLLM CPU build, "
              f"{engine_dtype(profile, config.llm.vllm)})", file=sys.stderr)
        yield served_config(config, url)

