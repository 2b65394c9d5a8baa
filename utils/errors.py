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
