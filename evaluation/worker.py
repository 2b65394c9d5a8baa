"""The model in a child process, so that a batch over its time limit can really be stopped.

The grader gives a batch batch size x 30 s. In a thread the runner could only mark a late batch; here the
child is killed at the limit and the next batch starts a fresh one (the model is loaded again).
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from loguru import logger

from models.llm.backend import BackendUnavailable
from utils.batch import BatchResult, answer_batch
from utils.errors import HarnessError
from utils.processes import die_with_parent

T = TypeVar("T")


class WorkerError(HarnessError, RuntimeError):
    """The model could not be built or failed in the child; the message is the child's error."""


def _serve(factory: Callable[[], Any], connection: multiprocessing.connection.Connection, parent_pid: int,
           forked_by_main_thread: bool) -> None:
    # The evaluation owns Ctrl-C (it stops this process and says what was saved), and this process and the page
    # workers it starts end with the evaluation, even when it is killed with kill -9.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid, forked_by_main_thread)
    status, built = reply(factory)
    if status == "error":  # the parent raises it as a one-line error
        connection.send((status, built))
        return
    model: Any = built  # the user's model
    connection.send(("ready", None))
    while True:
        try:
            request, payload = connection.recv()
        except EOFError:
            return
        if request == "batch_size":
            connection.send(reply(model.get_batch_size))
        else:
            connection.send(reply(functools.partial(answer_batch, model, payload)))


def reply(call: Callable[[], T]) -> tuple[str, T | str]:
    """("ok", call()), or ("error", "Type: message") where it raised: what a model's process (this module's child, a
    Ray replica) sends back, so that the caller raises the error as one line and the process stays up."""
    try:
        return "ok", call()
    except Exception as err:  # noqa: BLE001 - sent to the caller, which raises it
        return "error", f"{type(err).__name__}: {err}"


class ModelWorker:
    """A model built by `factory()` in a forked child; the parent must not have loaded models before."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory
        self.load_seconds = 0.0
        self._process: multiprocessing.process.BaseProcess | None = None
        self._connection: multiprocessing.connection.Connection | None = None
        self._start()

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")
        self._connection, child = context.Pipe()
        started = time.perf_counter()
        # not a daemon: the model starts page workers of its own, and daemons may not have children
        self._process = process = context.Process(target=_serve, name="crag-model", daemon=False, args=(
            self.factory, child, os.getpid(), threading.current_thread() is threading.main_thread()))
        process.start()
        child.close()
        try:
            status, message = self._receive(None)
        except BaseException:  # Ctrl-C while the model loads: the child goes too
            self.close()
            raise
        if status != "ready":
            self.close()
            raise BackendUnavailable(f"the model could not be built: {message}")
        self.load_seconds = time.perf_counter() - started

    def _receive(self, timeout: float | None) -> tuple[str, Any]:
        assert self._connection is not None
        if not self._connection.poll(timeout):
            raise TimeoutError
        try:
            return self._connection.recv()
        except EOFError:
            raise WorkerError(
                f"the model process died (exit code {self._process.exitcode if self._process else '?'})"
            ) from None

    def _ask(self, request: str, payload: Any, timeout: float | None) -> Any:
        if self._process is None or not self._process.is_alive():
            self._start()
        assert self._connection is not None
        self._connection.send((request, payload))
        status, value = self._receive(timeout)
        if status == "error":
            raise WorkerError(value)
        return value

    def get_batch_size(self) -> int:
        return self._ask("batch_size", None, None)

    def call_with_limit(self, batch: dict[str, list[Any]],
                        limit_s: float | None) -> tuple[BatchResult | None, float, bool]:
        """(result, seconds, timed_out); past the limit the child is killed and the result is None."""
        started = time.perf_counter()
        try:
            return self._ask("batch", batch, limit_s), time.perf_counter() - started, False
        except TimeoutError:
            logger.warning("batch of {} exceeded its {:.0f} s limit: the model process is stopped and reloaded",
                           len(batch.get("query", [])), limit_s)
            self.close()
            return None, time.perf_counter() - started, True

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._process = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None
