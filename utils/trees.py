"""Nested plain-JSON values compared key by key."""

from __future__ import annotations

from typing import Any


def differences(old: Any, new: Any, where: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested values (manifests, gate setups), with both values
    when short."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(set(old) | set(new), key=str)
                for d in differences(old.get(key), new.get(key), f"{where}.{key}" if where else str(key))]
    if old == new:
        return []
    shown = f" ({old!r} -> {new!r})" if len(repr(old)) + len(repr(new)) < 80 else ""
    return [f"{where}{shown}"]
