"""Writing files that a crash, a full disk or a second process never leaves half written: atomic replacement,
whole-line appends, and one writer per folder.

Standard library only: every venv imports it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from utils.errors import HarnessError

LOCK_NAME = ".lock"


class FolderBusy(HarnessError, RuntimeError):
    """Another process holds the folder's lock; the message names the folder and the holder."""


def json_line(record: Any) -> str:
    """One JSON line of `record`, UTF-8 text kept as it is."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSON-lines text, split at "\n" only: str.splitlines() also splits at U+0085 and U+2028, which a
    line written with ensure_ascii=False may hold inside a string."""
    lines = text.split("\n")
    return lines[:-1] if lines and not lines[-1] else lines


def open_text(path: Path, mode: str) -> IO[str]:
    """`path` opened as UTF-8 text. A lone surrogate (a JSON "\\ud800" escape read back) is written as that same
    escape, so a JSON line holding one stays valid JSON and reads back to the same string, where a strict
    encoder would raise and lose the write."""
    return path.open(mode, encoding="utf-8", errors="backslashreplace")


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write `data` to `path` through a file of its own beside it, synced and renamed over `path`: a reader (or a
    crash, or a full disk) sees the old file or the new one, never part of one. Text is written as open_text
    writes it. Returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=f".{path.name}.", suffix=".partial",
                                         delete=False)
    staged = Path(handle.name)
    try:
        with handle:
            handle.write(data if isinstance(data, bytes) else data.encode("utf-8", errors="backslashreplace"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return path


def append_lines(handle: IO[str], lines: list[str]) -> None:
    """Append whole lines to a file opened for appending, synced. Where the disk takes only part of them, the part
    is cut off again, so the file ends at a line's end (a reader drops a torn last line all the same)."""
    handle.flush()
    start = os.fstat(handle.fileno()).st_size
    try:
        handle.write("".join(lines))
        handle.flush()
        os.fsync(handle.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(handle.fileno(), start)
        raise


@contextlib.contextmanager
def held(folder: Path, command: str) -> Iterator[Path]:
    """Hold `folder` for this process for the block: an exclusive lock on FOLDER/.lock, which names the holder's
    PID and command. The system drops the lock when the process ends, kill -9 included, so a stale file holds
    nothing. A second holder gets FolderBusy at once, naming the folder and the PID. A holder's first act is to
    remove what a killed holder's write_atomic left half written."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    handle = path.open("a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise FolderBusy(f"{folder} is in use by {holder}; wait for it to end, or give another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} ({command})\n")
        handle.flush()
        for partial in folder.glob(".*.partial"):  # write_atomic's, of a holder killed while writing
            partial.unlink(missing_ok=True)
        yield folder
    finally:
        handle.close()  # releases the lock; the file stays, holding nothing
