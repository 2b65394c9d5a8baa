"""--judge person:FILE: a person's verdicts on the predictions the rules leave open, read from a JSON Lines file (as
data/judge/calibration.jsonl and data/gate_dev/verdicts.jsonl)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from loguru import logger

from evaluation.verdicts import CORRECT, MISS, PERSON, UNJUDGED, WRONG, Item, Judge
from models.config import ConfigError
from utils.cache import content_key
from utils.durable_io import jsonl_lines
from utils.grader_tokens import grader_cut

PERSON_VERDICTS = {"correct": CORRECT, "incorrect": WRONG, "miss": MISS}


class PersonJudge(Judge):
    """A person's verdicts, read from a JSON Lines file of {query, prediction, human} records (`human`: correct,
    incorrect or miss, as in data/judge/calibration.jsonl), for the predictions the rules leave open. A verdict
    belongs to its question and its prediction as the grader reads it (cut to 75 Llama-2 tokens, whitespace
    folded): a prediction the person never saw stays unjudged, never guessed.
    """

    kind = "person"
    for_organisers = True  # a person's verdicts stand in for the organisers' LLM judge

    def __init__(self, verdicts: dict[str, str], name: str) -> None:
        self.verdicts, self.name = verdicts, name
        self.reasons: dict[str, str] = {}
        self.p_correct: dict[str, float] = {}

    @classmethod
    def from_spec(cls, spec: str, model_name: str | None) -> PersonJudge:
        return person_judge(spec)

    @classmethod
    def load(cls, path: Path) -> PersonJudge:
        """The verdicts of `path`; ValueError naming the file and its first bad line."""
        verdicts: dict[str, str] = {}
        try:
            lines = jsonl_lines(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise ValueError(f"{path}: cannot be read ({err.strerror or err})") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                query, prediction, human = record["query"], record["prediction"], record["human"]
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{number}: not a {{query, prediction, human}} record ({err})") from None
            if human not in PERSON_VERDICTS or not isinstance(query, str) or not isinstance(prediction, str):
                raise ValueError(f"{path}:{number}: human must be one of {sorted(PERSON_VERDICTS)}, query and "
                                 "prediction strings")
            verdicts[cls.key_of(query, prediction)] = PERSON_VERDICTS[human]
        if not verdicts:
            raise ValueError(f"{path}: no verdicts")
        return cls(verdicts, f"person:{path.name}")

    @staticmethod
    def key_of(query: str, prediction: str) -> str:
        return content_key(" ".join(query.lower().split()), " ".join(grader_cut(prediction).split()))

    def key(self, item: Item) -> str:
        return self.key_of(item.query, item.prediction)

    def judge(self, items: Sequence[Item]) -> list[str]:
        keys = [self.key(item) for item in items]
        found = [self.verdicts.get(key, UNJUDGED) for key in keys]
        self.reasons.update((key, f"{self.name}: {verdict}" if verdict != UNJUDGED else "")
                            for key, verdict in zip(keys, found))
        if unseen := found.count(UNJUDGED):
            logger.warning("{}: no verdict for {} of {} predictions the rules leave open (unjudged)", self.name,
                           unseen, len(items))
        return found


def person_judge(spec: str) -> PersonJudge:
    """The verdicts of --judge person:FILE; a ConfigError naming the file and its first bad line."""
    path = Path(spec.removeprefix(PERSON))
    if not path.is_file():
        raise ConfigError(f"--judge {spec}: no such file; give person:FILE, a JSON Lines file of {{query, "
                          "prediction, human} verdicts (as data/judge/calibration.jsonl)")
    try:
        return PersonJudge.load(path)
    except ValueError as err:
        raise ConfigError(f"--judge {PERSON}{err}") from None
