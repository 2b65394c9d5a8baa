"""`make lint` runs `python -m tests.typing.check_refused FILE`: mypy must refuse exactly the lines of FILE marked
`# expect:`, a check that the types it is meant to see are seen. Exit 1, naming the lines, where mypy passes one
of them or refuses another."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def main(path: str) -> int:
    expected = {number for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1)
                if "# expect:" in line}
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports", "silent", path],
                          capture_output=True, text=True)
    refused = {int(m.group(1)) for m in re.finditer(rf"^{re.escape(path)}:(\d+): error:", done.stdout, re.MULTILINE)}
    if refused != expected:
        print(f"{path}: mypy refused lines {sorted(refused)}, expected {sorted(expected)}\n{done.stdout}", end="")
        return 1
    print(f"{path}: mypy refuses the {len(expected)} lines marked `# expect:`")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
