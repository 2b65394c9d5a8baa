"""attributes: predict each query's domain and how fast its answer changes (the seed's section 4.2).

Two methods. SVM: MiniLM embeddings and scikit-learn SVMs, trained by tools/train_attributes.py and loaded
from a file that names its labels and its embedder. ICL: a few-shot prompt with demonstrations from a
labelled file, `n` samples, majority vote; a dynamism tie resolves to the more dynamic label (a dynamic
query answers "i don't know", the safe side when unsure).
"""

from __future__ import annotations

import contextlib
import json
import pickle
import random
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from models.config import DOMAINS, DYNAMISM, EmbedderConfig, SystemConfig, resolve_path
from models.estimates import StagePlan, template_tokens
from models.llm.backend import BackendUnavailable
from models.prompting import PromptLibrary
from models.retrieval.embedder import Embedder
from models.stages.stage import STAGES, Stage, StageContext
from models.state import QueryState

SVM_FORMAT = "crag-attributes-svm-1"


def read_labelled(path: Path, lines: Iterable[str] | None = None) -> list[dict[str, str]]:
    """Questions with `query`, `domain` and `static_or_dynamic` from a CRAG-format .jsonl, or from `lines` read
    from `path` by the caller (a compressed data file); other rows skipped."""
    rows = []
    with contextlib.ExitStack() as stack:
        handle = lines if lines is not None else stack.enter_context(path.open(encoding="utf-8"))
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("{}:{}: not JSON, skipped", path, number)
                continue
            if (isinstance(row, dict) and isinstance(row.get("query"), str) and row.get("domain") in DOMAINS
                    and row.get("static_or_dynamic") in DYNAMISM):
                rows.append({key: row[key] for key in ("query", "domain", "static_or_dynamic")})
    return rows


def vote(labels: list[str], order: tuple[str, ...], prefer_last: bool) -> str | None:
    """The most frequent label; a tie goes to the label latest in `order` if prefer_last, else earliest."""
    counts = Counter(label for label in labels if label in order)
    if not counts:
        return None
    best = max(counts.values())
    tied = [label for label in order if counts.get(label) == best]
    return tied[-1] if prefer_last else tied[0]


def svm_classifier(c: float = 1.0) -> Any:
    """The classifier both attributes use (and cross-validation measures): a linear SVM, balanced classes."""
    from sklearn.svm import LinearSVC

    return LinearSVC(C=c, class_weight="balanced", random_state=0)


@dataclass
class SVMAttributes:
    """Two SVMs over sentence embeddings; `embedder` names the model the vectors must come from."""

    embedder: str
    domain: Any
    dynamism: Any

    @classmethod
    def train(cls, vectors: np.ndarray, domains: list[str], dynamism: list[str], embedder: str,
              c: float = 1.0) -> SVMAttributes:
        return cls(embedder, svm_classifier(c).fit(vectors, domains), svm_classifier(c).fit(vectors, dynamism))

    def predict(self, vectors: np.ndarray) -> list[tuple[str, str]]:
        if len(vectors) == 0:
            return []
        return list(zip(self.domain.predict(vectors).tolist(), self.dynamism.predict(vectors).tolist()))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"format": SVM_FORMAT, "embedder": self.embedder, "domain": self.domain,
                   "dynamism": self.dynamism, "labels": {"domain": list(DOMAINS), "dynamism": list(DYNAMISM)}}
        path.write_bytes(pickle.dumps(payload))

    @classmethod
    def load(cls, path: Path) -> SVMAttributes:
        """A model written by save(); a trusted file (pickle), as every scikit-learn model is."""
        if not path.is_file():
            raise BackendUnavailable(f"attributes SVM model {path} not found: train one with tools/train_attributes.py")
        try:
            payload = pickle.loads(path.read_bytes())
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as err:
            raise BackendUnavailable(f"attributes SVM model {path} is unreadable ({err}): retrain it") from err
        if not isinstance(payload, dict) or payload.get("format") != SVM_FORMAT:
            raise BackendUnavailable(f"{path} is not an attributes SVM model ({SVM_FORMAT})")
        return cls(payload["embedder"], payload["domain"], payload["dynamism"])


_DOMAIN_LINE = re.compile(r"domain\s*:\s*([a-z]+)", re.IGNORECASE)
_DYNAMISM_LINE = re.compile(r"(?:dynamism|static_or_dynamic)\s*:\s*([a-z][a-z -]*)", re.IGNORECASE)


def parse_icl(output: str) -> tuple[str | None, str | None]:
    """(domain, dynamism) named in one ICL reply; a label outside the known sets counts as none."""
    domain = _DOMAIN_LINE.search(output)
    dynamism = _DYNAMISM_LINE.search(output)
    domain_label = domain.group(1).lower() if domain and domain.group(1).lower() in DOMAINS else None
    dynamism_label = None
    if dynamism:
        text = dynamism.group(1).strip().lower().replace(" ", "-")
        dynamism_label = next((label for label in DYNAMISM if text.startswith(label)), None)
    return domain_label, dynamism_label


def demonstrations(rows: list[dict[str, str]], per_class: int, seed: int) -> list[dict[str, str]]:
    """`per_class` examples of each domain and of each dynamism class (fewer when the file has fewer)."""
    shuffled = rows[:]
    random.Random(seed).shuffle(shuffled)
    chosen: list[dict[str, str]] = []
    for key, labels in (("domain", DOMAINS), ("static_or_dynamic", DYNAMISM)):
        for label in labels:
            have = sum(row[key] == label for row in chosen)
            chosen += [row for row in shuffled if row[key] == label and row not in chosen][:max(per_class - have, 0)]
    random.Random(seed + 1).shuffle(chosen)
    return chosen


@STAGES.register("attributes")
class AttributesStage(Stage):
    prompts = ("attributes",)
    sections = ("attributes",)
    writes = frozenset({"domain", "dynamism"})
    needs = frozenset({"llm", "embedder"})
    signals = {"attributes.domain_share": "icl: the share of the samples that voted the predicted domain",
               "attributes.dynamism_share": "icl: the share of the samples that voted the predicted dynamism"}
    switch_on = ("attributes.method=svm",)

    @classmethod
    def estimate(cls, config: SystemConfig, prompts: PromptLibrary) -> list[StagePlan]:
        if config.attributes.method != "icl":
            return []
        icl = config.attributes.icl
        demonstrations = icl.shots_per_class * 9 * 20  # 9 classes, about 20 tokens a demonstration
        return [StagePlan("attributes", template_tokens(prompts, "attributes") + demonstrations, icl.max_tokens,
                          icl.n)]

    def __init__(self) -> None:
        self.svm: SVMAttributes | None = None
        self.svm_embedder: Any = None
        self.examples: list[dict[str, str]] = []

    @classmethod
    def active(cls, config: SystemConfig) -> bool:
        return config.attributes.method != "none"

    def setup(self, system: SystemConfig, resources: dict[str, Any]) -> None:
        """Load the SVM (and, when it was trained on other vectors, the embedder it needs) or the ICL
        demonstrations."""
        config = system.attributes
        embedder = resources["embedder"]
        self.svm_embedder = embedder
        if config.method == "svm":
            self.svm = SVMAttributes.load(resolve_path(config.svm_model))
            if getattr(embedder, "name", None) != self.svm.embedder:  # the SVM needs the vectors it was trained on
                self.svm_embedder = Embedder(EmbedderConfig())
                if self.svm_embedder.name != self.svm.embedder:
                    raise BackendUnavailable(f"attributes SVM was trained on {self.svm.embedder} embeddings; "
                                             "retrain it with tools/train_attributes.py")
        elif config.method == "icl":
            path = resolve_path(config.labelled_file)
            if not path.is_file():
                raise BackendUnavailable(f"attributes.labelled_file {path} not found")
            self.examples = demonstrations(read_labelled(path), config.icl.shots_per_class, config.icl.seed)

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        if self.svm is not None:
            vectors = self.svm_embedder.encode([s.query for s in states])
            for state, (domain, dynamism) in zip(states, self.svm.predict(vectors)):
                state.domain, state.dynamism = domain, dynamism
        else:
            self._icl(states, ctx)

    def _icl(self, states: list[QueryState], ctx: StageContext) -> None:
        settings = ctx.settings.icl
        prompt = ctx.prompt("attributes")
        conversations = [prompt.render(query=s.query, examples=self.examples, domains=list(DOMAINS),
                                       dynamism=list(DYNAMISM)) for s in states]
        outputs = ctx.generate(conversations, owners=states, max_tokens=settings.max_tokens,
                               temperature=settings.temperature, n=settings.n, seed=settings.seed)
        for state, samples in zip(states, outputs):
            votes = [parse_icl(sample.text) for sample in samples]
            state.domain = vote([d for d, _ in votes if d], DOMAINS, prefer_last=False)
            state.dynamism = vote([y for _, y in votes if y], DYNAMISM, prefer_last=True)
            # the share of the samples behind each label: the method's probability (the SVMs give none)
            for name, index, label in (("domain", 0, state.domain), ("dynamism", 1, state.dynamism)):
                state.signals[f"attributes.{name}_share"] = (
                    sum(v[index] == label for v in votes) / len(votes) if votes and label else None)
            if state.dynamism is None:
                logger.info("{}: no dynamism label in {} ICL samples", state.interaction_id, len(samples))
