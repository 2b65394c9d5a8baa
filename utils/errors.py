"""The root of the errors a user can fix (a bad flag, config, data file or run folder).

Standard library only: tools/quantize.py imports it from .venv-quantize, which does not install the project.
"""

from __future__ import annotations


class HarnessError(Exception):
    """An input the user can fix; every command prints it as one line and exits 2 (utils.cli.command)."""


class ConfigError(HarnessError, ValueError):
    """A flag or config value that cannot mean anything, named with its fix."""


class BackendUnavailable(HarnessError, RuntimeError):
    """A model backend whose model or library is missing; the message says how to fix it."""


def one_line(err: BaseException, limit: int = 160) -> str:
    """An error's message on one line, at most `limit` characters: for a log line or a one-line CLI error."""
    return " ".join(str(err).split())[:limit]
