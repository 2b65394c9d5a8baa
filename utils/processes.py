"""Child processes that end with their parent (the model process of an evaluation, the page workers)."""

from __future__ import annotations

import ctypes
import os
import signal
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
