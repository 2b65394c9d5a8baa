"""Run at the start of every Python process of the served engine (`--serve-llm` puts this folder first on its
PYTHONPATH, evaluation/llm_server.py): torch's store held to loopback.

vLLM's engine core joins a torch.distributed group of one through `tcp://VLLM_HOST_IP:PORT`
(vllm/v1/executor/uniproc_executor.py `_distributed_args`), and torch starts a store server at that port
(torch/distributed/rendezvous.py `_create_c10d_store`) that binds every interface: it passes the store no address
to bind. TCPStore takes a listening socket instead (`master_listen_fd`); here it gets one bound to the loopback
address the init method names. The patch waits for torch.distributed.rendezvous to be imported, so a process that
never imports it (the guard, the API server before it forks) pays nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import ipaddress
import socket
import sys
from typing import Any

RENDEZVOUS = "torch.distributed.rendezvous"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def hold_to_loopback(rendezvous: Any) -> None:
    """Replace `rendezvous._create_c10d_store` with one whose server, for a loopback init method, listens there
    alone; any other store is made as torch makes it."""
    original = rendezvous._create_c10d_store

    def create(hostname: str, port: int, rank: int, world_size: int, timeout: Any, use_libuv: bool = True) -> Any:
        if rank != 0 or rendezvous._torchelastic_use_agent_store() or not _loopback(hostname):
            return original(hostname, port, rank, world_size, timeout, use_libuv)
        listener = socket.create_server((hostname, port))
        return rendezvous.TCPStore(host_name=hostname, port=port, world_size=world_size, is_master=True,
                                   timeout=timeout, multi_tenant=True, use_libuv=use_libuv,
                                   master_listen_fd=listener.detach())

    rendezvous._create_c10d_store = create


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds torch.distributed.rendezvous as the path finder does and patches it once it has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != RENDEZVOUS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            hold_to_loopback(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if RENDEZVOUS in sys.modules:
    hold_to_loopback(sys.modules[RENDEZVOUS])
else:
    sys.meta_path.insert(0, _PatchOnImport())
