"""A picture of a run's report.html (or compare.html) in headless Chromium, as the docs' screenshots are made:

    .venv/bin/python tools/screenshot.py runs/crag_sample__cpu+vllm-cpu/report.html docs/report.png
    .venv/bin/python tools/screenshot.py runs/crag_sample__cpu+vllm-cpu/report.html docs/record.png --open 3

`headless_chromium()` is also how the report.html test starts its browser: Debian's chromium and chromedriver
(`make browser`), with no background connections, as this closed network needs.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from utils.cli import CommandParser, check_out_file, command
from utils.errors import ConfigError, HarnessError

FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage")


class NoBrowser(HarnessError, RuntimeError):
    """No chromium or chromedriver on PATH, or no selenium."""


@contextlib.contextmanager
def headless_chromium(width: int = 1280, height: int = 1000) -> Iterator:
    """A selenium driver of Debian's chromium, headless, with its console log kept; NoBrowser where there is
    none to start."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise NoBrowser("selenium is not installed (requirements-local.txt)") from None
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        raise NoBrowser("no chromium/chromedriver on PATH: `make browser` installs Debian's (needs root)")
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            yield driver
        finally:
            driver.quit()


@command
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("page", type=Path, help="report.html or compare.html")
    parser.add_argument("png", type=Path, help="where the picture goes")
    parser.add_argument("--open", type=int, default=None, metavar="ROW",
                        help="open the record of this row of the question table (1 = the first) before the picture")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1000)
    args = parser.parse_args(argv)
    if not args.page.is_file():
        raise ConfigError(f"{args.page} is not a file; give a run folder's report.html")
    if args.width < 1 or args.height < 1 or (args.open is not None and args.open < 1):
        raise ConfigError(f"--width {args.width}, --height {args.height}, --open {args.open}: each must be positive "
                          "(--open 1 is the table's first row)")
    check_out_file(args.png, "png")
    with headless_chromium(args.width, args.height) as driver:
        from selenium.webdriver.common.by import By  # importable once the driver started

        driver.get(args.page.resolve().as_uri())
        if args.open is not None:
            rows = driver.find_elements(By.CSS_SELECTOR, "#question-table tbody tr")
            if not 1 <= args.open <= len(rows):
                raise ConfigError(f"--open {args.open}: the table has rows 1..{len(rows)}")
            rows[args.open - 1].click()
        args.png.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.png))
    print(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
