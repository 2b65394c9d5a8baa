"""Command-line tools (console scripts crag-*, see pyproject.toml); runnable as `python tools/NAME.py` too."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (the input, what to do, where the flags are listed), exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)", file=sys.stderr)
        sys.exit(2)


def interrupted(saved: str) -> int:
    """The one line a command prints when Ctrl-C stops it (what was saved, how to go on), and its exit status."""
    print(f"interrupted: {saved}", file=sys.stderr)
    return 130


def check_out(folder: Path, flag: str = "--out") -> None:
    """A ConfigError (one line, naming `flag`) unless `folder` is a writable folder, or can be made in one."""
    from models.config import ConfigError

    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{flag} {folder}: a file, not a folder; give a folder (made when missing)")
    _check_writable(folder, f"{flag} {folder}")


def check_out_file(path: Path, flag: str = "--out") -> None:
    """A ConfigError (one line, naming `flag`) unless the file `path` can be written (its folder made if missing)."""
    from models.config import ConfigError

    if path.is_dir():
        raise ConfigError(f"{flag} {path}: a folder, not a file; give a file name (a file in it, for example)")
    _check_writable(path.parent, f"{flag} {path}")


def _check_writable(folder: Path, label: str) -> None:
    from models.config import ConfigError

    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{label}: {existing} is a file, so the folder cannot be made; give another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{label}: {existing} is not writable; give a folder you can write to")
