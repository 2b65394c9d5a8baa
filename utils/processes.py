"""Child processes that end with their parent (the model process of an evaluation, the page workers, a served LLM
and what it starts)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time


def die_with_parent(parent_pid: int, forked_by_main_thread: bool = True) -> None:
    """In a child process: end it when its parent ends, kill -9 included (a child that waits on a pipe or a task
    queue would otherwise wait for ever). On Linux the kernel kills it (PR_SET_PDEATHSIG), set only when the
    parent's main thread forked it: the signal follows the forking thread. Otherwise, or without prctl, a daemon
    thread checks twice a second. A parent already gone when this runs ends the child at once."""
    if sys.platform.startswith("linux") and forked_by_main_thread:
        try:
            if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # 1: PR_SET_PDEATHSIG
                if os.getppid() != parent_pid:  # the parent died before the prctl call
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def run_guarded(parent_pid: int, argv: list[str], grace_s: float = 10.0) -> int:
    """Run `argv` in a session of its own until it exits, or until `parent_pid` ends (kill -9 included) or this
    process is asked to stop; then the whole session is terminated, and killed after `grace_s`. A server that starts
    processes of its own (vLLM's engine core outlives a killed API server) leaves none behind. Returns `argv`'s exit
    status, or 0 once it was stopped."""
    child = subprocess.Popen(argv, start_new_session=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(0.5) and child.poll() is None and os.getppid() == parent_pid:
        pass
    stopped = child.poll() is None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)  # the session outlives its leader while a member runs
    deadline = time.monotonic() + grace_s
    while _session_alive(child.pid) and time.monotonic() < deadline:
        child.poll()
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    return 0 if stopped else child.returncode


def _session_alive(sid: int) -> bool:
    try:
        os.killpg(sid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """`python -m utils.processes --parent-pid PID -- COMMAND...`: COMMAND under run_guarded."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 4 or args[0] != "--parent-pid" or not args[1].isdigit() or args[2] != "--":
        print("usage: python -m utils.processes --parent-pid PID -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    return run_guarded(int(args[1]), args[3:])


if __name__ == "__main__":
    sys.exit(main())
