"""The fixture KG server's command: `python -m evaluation.kg_fixture` and tools/kg_server.py run `main`."""


from __future__ import annotations

import argparse
import os
import socket
import sqlite3
from pathlib import Path

import uvicorn

from evaluation import kg_fixture
from evaluation.kg_fixture.app import create_app
from models.config import REPO_ROOT
from utils.cli import CommandParser, command
from utils.errors import ConfigError
from utils.processes import die_with_parent


@command
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=kg_fixture.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "data" / "kg", help="folder of the fixture files")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: a free port (printed)")
    parser.add_argument("--faults", action="store_true", help="odd argument values trigger failures (tests)")
    parser.add_argument("--slow-s", type=float, default=3.0, help="the delay of a __slow__ reply")
    parser.add_argument("--parent-pid", type=int, help="end when this process ends (evaluation/kg_fixture/launch.py "
                        "passes its own pid, so a killed evaluation leaves no server behind)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535 or not 0 <= args.slow_s < float("inf"):
        raise ConfigError(f"--port {args.port}, --slow-s {args.slow_s}: the port must be in 0..65535 (0: a free one) "
                          "and --slow-s 0 or more seconds")
    if args.parent_pid is not None and args.parent_pid != os.getppid():
        raise ConfigError(f"--parent-pid {args.parent_pid}: not this server's parent process (give the pid of the "
                          "process that starts it, or leave it out)")
    if not args.data.is_dir():
        raise ConfigError(f"{args.data}: no such fixture folder (give --data a folder of open/movie/finance/music/"
                          "sports .json files)")
    try:
        app = create_app(args.data, args.faults, args.slow_s)
    except (OSError, ValueError, KeyError, TypeError, sqlite3.Error) as err:
        raise ConfigError(f"{args.data}: unreadable fixture ({err})") from None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as err:
        raise ConfigError(f"cannot listen on {args.host}:{args.port} ({err}); choose another --port") from None
    if args.parent_pid is not None:
        # a watcher thread, not the kernel's parent-death signal: that one follows the thread that started this
        # process, and the caller may start it from any thread
        die_with_parent(args.parent_pid, forked_by_main_thread=False)
    print(f"KG server on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])
    return 0
