"""What every command-line entry point shares: one-line errors, exit statuses, output checks.

Standard library only: tools/quantize.py imports it from .venv-quantize, which does not install the project.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, ParamSpec

from utils.errors import ConfigError, HarnessError

P = ParamSpec("P")
USAGE_ERROR = 2  # argparse's status for a bad command line; a HarnessError is the same kind of mistake
INTERRUPTED = 130  # a shell's status for a process stopped by Ctrl-C (128 + SIGINT)


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (the input, what to do, where the flags are listed), exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)", file=sys.stderr)
        sys.exit(USAGE_ERROR)


def command(main: Callable[P, int]) -> Callable[P, int]:
    """A command's main() that prints a HarnessError as one line `error: ...` and returns 2 instead of raising."""

    @functools.wraps(main)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except HarnessError as err:
            print(f"error: {err}", file=sys.stderr)
            return USAGE_ERROR

    return wrapped


def interrupted(saved: str) -> int:
    """The one line a command prints when Ctrl-C stops it (what was saved, how to go on), and its exit status."""
    print(f"interrupted: {saved}", file=sys.stderr)
    return INTERRUPTED


def check_out(folder: Path, flag: str = "--out") -> None:
    """A ConfigError (one line, naming `flag`) unless `folder` is a writable folder, or can be made in one."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{flag} {folder}: a file, not a folder; give a folder (made when missing)")
    _check_writable(folder, f"{flag} {folder}")


def check_out_file(path: Path, flag: str = "--out") -> None:
    """A ConfigError (one line, naming `flag`) unless the file `path` can be written (its folder made if missing)."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: a folder, not a file; give a file name (a file in it, for example)")
    _check_writable(path.parent, f"{flag} {path}")


def _check_writable(folder: Path, label: str) -> None:
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{label}: {existing} is a file, so the folder cannot be made; give another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{label}: {existing} is not writable; give a folder you can write to")
