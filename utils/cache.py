"""Content-addressed caches: where the harness keeps files, and a JSON store keyed by content hashes."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

from loguru import logger

CACHE_ENV = "CRAG_CACHE_DIR"


def cache_root(configured: str | None) -> Path:
    """`configured`, else $CRAG_CACHE_DIR, else ~/.cache/crag-harness."""
    return Path(configured or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "crag-harness")


def content_key(*parts: str | bytes) -> str:
    """A 32-hex-digit key over `parts`; the parts are length-prefixed so ("ab", "c") differs from ("a", "bc")."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode("utf-8", errors="surrogatepass") if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


class JsonCache:
    """Values (anything JSON can hold) kept in memory (LRU, `memory_items`) and, when `folder` is set, on disk.

    Disk files are written atomically (temporary file, then rename), so a crash never leaves half a value. A disk
    that cannot be written (read-only home in a container) is logged once and then no longer used; an unreadable
    file counts as a miss and is logged.
    """

    def __init__(self, folder: Path | None, memory_items: int = 1024) -> None:
        self.folder = folder
        self.memory_items = memory_items
        self._memory: OrderedDict[str, Any] = OrderedDict()
        self.hits = self.misses = 0

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any | None:
        if key in self._memory:
            self._memory.move_to_end(key)
            self.hits += 1
            return self._memory[key]
        if self.folder is not None:
            path = self._path(key)
            try:
                value = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                pass
            except (OSError, ValueError) as err:
                logger.warning("cache file {} unreadable ({}); recomputing", path, err)
            else:
                self._remember(key, value)
                self.hits += 1
                return value
        self.misses += 1
        return None

    def put(self, key: str, value: Any) -> None:
        self._remember(key, value)
        if self.folder is None:
            return
        path = self._path(key)
        staged: Path | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, suffix=".tmp",
                                             delete=False) as handle:
                staged = Path(handle.name)
                json.dump(value, handle, ensure_ascii=True)
            os.replace(staged, path)
        except OSError as err:
            logger.warning("cannot write the cache under {} ({}); keeping results in memory only", self.folder, err)
            self.folder = None
            if staged is not None:
                staged.unlink(missing_ok=True)

    def _remember(self, key: str, value: Any) -> None:
        self._memory[key] = value
        self._memory.move_to_end(key)
        while len(self._memory) > self.memory_items:
            self._memory.popitem(last=False)
