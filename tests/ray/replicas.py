"""UserModel factories for the Ray tests (imported by the Ray workers, so a module of their own, without ray)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from models.config import SystemConfig
from models.system import CragSystem
from tests.fakes import HashEmbedder, ScriptedLLM
from utils.batch import BatchResult

_stalled = threading.Event()  # set in the process of the replica that hangs


def stall_clock() -> float:
    """time.monotonic, a day on in the process of a replica once it hangs (Stalling): its batch is then past any
    limit at once, and every other batch keeps the time it has by the wall."""
    return time.monotonic() + (86_400.0 if _stalled.is_set() else 0.0)


def scripted_model(config: SystemConfig) -> CragSystem:
    """The system over the scripted fake LLM and the hashing embedder: the same answers in any process."""
    return CragSystem(config, llm=ScriptedLLM(), embedder=HashEmbedder())


class Stalling:
    """scripted_model, except that the first batch holding `stall_on` (in any replica: `marker` is the flag) writes
    the name and pid of the Ray actor answering it to `marker` (two lines) and hangs until its process is killed
    (10 minutes at most, so that a broken tree fails rather than hangs)."""

    def __init__(self, config: SystemConfig, marker: Path, stall_on: str) -> None:
        self.model, self.marker, self.stall_on = scripted_model(config), marker, stall_on
        with marker.with_name(marker.name + ".built").open("a") as built:  # a line per model built, with its pid
            built.write(f"{os.getpid()}\n")

    def get_batch_size(self) -> int:
        return self.model.get_batch_size()

    def batch_generate_answer(self, batch: dict[str, list[Any]]) -> list[str]:
        return self.answer_batch(batch).answers

    def answer_batch(self, batch: dict[str, list[Any]]) -> BatchResult:
        if self.stall_on in batch["interaction_id"]:
            try:
                with self.marker.open("x") as flag:  # only the first replica to get it
                    import ray

                    flag.write(f"{ray.get_runtime_context().get_actor_name()}\n{os.getpid()}\n")
            except FileExistsError:
                pass
            else:
                _stalled.set()
                time.sleep(600)
        return self.model.answer_batch(batch)


def stalling_model(marker: Path, stall_on: str, config: SystemConfig) -> Stalling:
    return Stalling(config, marker, stall_on)
