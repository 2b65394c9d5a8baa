"""Training data from judged run folders: SFT examples and preference pairs over the exact conversations the
answering stage sent (docs/decisions/fine-tuning.md).

A run made with `record_prompts` keeps each conversation a stage sent (the trace's `prompts`); its judge wrote a
verdict on every record (rules, the containment judge, an LLM or a person: judge with `--judge person:FILE` so a
person's verdict settles what the rules leave open). Each answering conversation (the `reasoning` stage's prompts
`reasoning` and `summariser`) becomes one SFT example whose target follows the verdict:

- `invalid`: a gold "invalid question" (a false premise): "invalid question", never "i don't know";
- `own`: a right answer: the model's own, or the gold where the model's runs long;
- `extraction`: wrong or declined, with a gold answer in the conversation's user message: the gold;
- `refusal`: wrong or declined, with no gold answer there: "i don't know".

The target takes the conversation's form: `answer_block` for `reasoning`, the bare line for `summariser`. RAFT
variants re-render the same prompt without the references that hold a gold answer (`raft-removed`: "i don't
know") and with another question's references mixed in (`raft-distractors`: the original target); a record whose
recorded conversation the re-rendering does not reproduce exactly gets none. Preference pairs follow TruthRL's
order, right > "i don't know" > wrong, and a right answer is also preferred to "i don't know" (against
over-refusal). Every example carries its question's fold (a hash of interaction_id), so no question crosses one.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluation.manifest import file_hash
from evaluation.manifest import load as load_manifest
from evaluation.record import Record
from evaluation.runner import load_predictions
from evaluation.verdicts import CORRECT, MISS, WRONG
from models.config import REPO_ROOT, ConfigError
from models.prompting import PromptLibrary
from models.stages.reasoning import reasoning_conversation, summariser_conversation
from models.state import ADDED_FIELDS, QueryState, Reference
from training.examples import answer_block
from utils.answers import IDK, INVALID, contains_answer, is_idk, is_invalid

ANSWERING_STAGE = "reasoning"
FORMS = {"reasoning": answer_block, "summariser": lambda answer: answer}
FORMS_OF_TARGET = ("short", "sentence")
KINDS = ("own", "extraction", "refusal", "invalid", "raft-removed", "raft-distractors")
# A right answer longer than this many words, and longer than twice the gold's, is replaced by the gold: the target
# teaches short answers.
SHORT_WORDS = 8
DISTRACTORS = 2
HELD_OUT = REPO_ROOT / "data" / "crag_sample.jsonl"
SFT_FILE, PAIRS_FILE, MANIFEST_FILE = "sft.jsonl", "preferences.jsonl", "data_manifest.json"


def fold_of(interaction_id: str, folds: int) -> int:
    """The question's fold of `folds`: its interaction_id's sha256 modulo `folds`, the same on every machine."""
    return int(hashlib.sha256(interaction_id.encode("utf-8")).hexdigest(), 16) % folds


def held_out_questions(path: Path = HELD_OUT) -> tuple[set[str], set[str]]:
    """(interaction_ids, lower-cased queries) of the file no training set may hold."""
    ids, queries = set(), set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            example = json.loads(line)
            ids.add(example["interaction_id"])
            queries.add(" ".join(example["query"].lower().split()))
    return ids, queries


def golds_of(record: Record) -> list[str]:
    return [str(g) for g in record.golds if g is not None and str(g).strip()]


def user_text(messages: list[dict[str, str]]) -> str:
    """What the conversation showed of the question and its evidence: its user messages (the system message holds
    the instructions, whose "yes", "no" and "i don't know" would match any gold)."""
    return "\n".join(m["content"] for m in messages if m.get("role") == "user")


def short_answer(prediction: str, gold: str) -> str:
    """A right answer as a target: the model's own unless it runs long, then the gold."""
    words = len(prediction.split())
    return prediction if words <= max(SHORT_WORDS, 2 * len(gold.split())) else gold


def answer_sentence(text: str, golds: list[str], query: str) -> str | None:
    """The shortest prose sentence of `text` (blingfire's, of four words or more, the question left out) that holds a
    gold answer as whole words, or None."""
    from blingfire import text_to_sentences

    lines = [line for line in text.splitlines() if line.strip() and (not query.strip()
                                                                      or query.strip().lower() not in line.lower())]
    # prose only: reference headers ("[n] page (updated ...)"), page names and table rows are not answers
    prose = [line for line in lines if not line.lstrip().startswith(("[", "|", "Page name:", "#", "- "))]
    found = [s.strip() for line in prose for s in text_to_sentences(line).splitlines()
             if len(s.split()) >= 4 and contains_answer(s, golds)]
    return min(found, key=len) if found else None


def target(record: Record, messages: list[dict[str, str]], form: str = "short") -> tuple[str, str] | None:
    """(kind, answer) the conversation should have ended with, or None where its verdict does not say. `form`
    "sentence": an extraction's answer is the sentence of the references that holds the gold (the form of the base
    model's right answers), and a right answer is the model's own in full."""
    golds = golds_of(record)
    if not golds:
        return None
    if is_invalid(golds[0]):
        return "invalid", INVALID
    prediction = record.prediction if isinstance(record.prediction, str) else ""
    declined = is_idk(prediction) or record.verdict == MISS
    if record.verdict == CORRECT and not declined:
        own = " ".join(prediction.split())
        return "own", own if form == "sentence" else short_answer(own, golds[0])
    if record.verdict not in (WRONG, MISS) and not declined:
        return None  # unjudged: nobody knows whether the answer was right
    if contains_answer(user_text(messages), golds):
        sentence = answer_sentence(user_text(messages), golds, record.query or "") if form == "sentence" else None
        return "extraction", sentence or golds[0]
    return "refusal", IDK


def pairs_for(kind: str, answer: str, prediction: str) -> list[tuple[str, str]]:
    """(chosen, rejected) answers: right > "i don't know" > wrong, and a right answer over "i don't know"."""
    declined = not prediction or is_idk(prediction)
    said_invalid = bool(prediction) and is_invalid(prediction)
    if kind in ("own", "extraction"):
        pairs = [(answer, IDK)]
        if kind == "extraction" and not declined:
            pairs.append((answer, prediction))
        return pairs
    if kind == "invalid":
        return [(INVALID, IDK if said_invalid or declined else prediction)]
    if kind == "refusal" and not declined:
        return [(IDK, prediction)]
    return []


@dataclass
class Source:
    """One run folder's records and the settings its prompts were rendered with."""

    folder: Path
    records: list[Record]
    max_reference_chars: int | None
    prompts: PromptLibrary

    @classmethod
    def read(cls, folder: Path) -> Source:
        path = folder / "predictions.jsonl"
        if not path.is_file():
            raise ConfigError(f"{folder}: no predictions.jsonl; give a run folder of local_evaluation.py")
        manifest = load_manifest(folder) or {}
        config = (manifest.get("answers") or {}).get("config") or {}
        chars = (config.get("reasoning") or {}).get("max_reference_chars")
        overrides = config.get("prompts") if isinstance(config.get("prompts"), dict) else None
        return cls(folder, [Record(r) for r in load_predictions(path).values()], chars, PromptLibrary(overrides))


def answering_conversations(record: Record) -> list[dict[str, Any]]:
    """The record's conversations of the answering stage's prompts, each distinct one once (self-consistency
    samples resend the same messages)."""
    seen, found = set(), []
    for conversation in (record.trace or {}).get("prompts") or []:
        if conversation.get("stage") != ANSWERING_STAGE or conversation.get("prompt") not in FORMS:
            continue
        key = json.dumps(conversation["messages"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            found.append(conversation)
    return found


def state_of(record: Record, references: list[dict[str, Any]]) -> QueryState:
    """A QueryState carrying what the record says the prompt was rendered from, with these references."""
    state = QueryState(0, record.interaction_id or "", record.query or "", record.query_time or "", [])
    state.references = [Reference(text=r["text"], kind=r["kind"], page_name=r.get("page") or "",
                                  page_url=r.get("url") or "", page_last_modified=r.get("updated") or "",
                                  score=r.get("score") or 0.0) for r in references]
    trace = record.trace or {}
    for name, (_, spec) in ADDED_FIELDS.items():  # the evidence the prompt showed, as the record keeps it
        if spec.evidence is not None and trace.get(name) is not None:
            state[spec] = spec.load(trace[name]) if spec.load else trace[name]
    return state


def without_answer(state: QueryState, golds: list[str]) -> None:
    """Drop the lines of the state's source evidence (the KG's rows) that hold a gold answer."""
    for name, (_, spec) in ADDED_FIELDS.items():
        if spec.evidence is not None and spec.evidence.grounds and name in state.added:
            state[spec] = [line for line in state[spec] if not contains_answer(str(line), golds)]


def render(source: Source, prompt_name: str, state: QueryState) -> list[dict[str, str]]:
    prompt = source.prompts.get(prompt_name)
    chars = source.max_reference_chars or 0
    if prompt_name == "reasoning":
        return list(reasoning_conversation(prompt, state, chars))
    return list(summariser_conversation(prompt, state, chars))


@dataclass
class Built:
    sft: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[dict[str, Any]] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)


def example(record: Record, fold: int, prompt: str, messages: list[dict[str, str]], kind: str, answer: str,
            source: Path) -> dict[str, Any]:
    """An SFT example in TRL's conversational prompt-completion form (the loss falls on the completion only)."""
    return {"prompt": messages, "completion": [{"role": "assistant", "content": FORMS[prompt](answer)}],
            "interaction_id": record.interaction_id, "fold": fold, "kind": kind, "prompt_name": prompt,
            "source": str(source)}


def raft_variants(source: Source, record: Record, conversation: dict[str, Any], kind: str, answer: str,
                  others: list[Record], rng: random.Random
                  ) -> tuple[list[tuple[str, list[dict], str]], str | None]:
    """([(kind, messages, answer)], why none) for the RAFT variants of an answer-bearing conversation."""
    if source.max_reference_chars is None:
        return [], "raft: the run folder's manifest names no reasoning.max_reference_chars"
    prompt = conversation["prompt"]
    references = record.references
    if render(source, prompt, state_of(record, references)) != conversation["messages"]:
        return [], "raft: re-rendering does not reproduce the recorded conversation"
    golds = golds_of(record)
    variants = []
    kept = [r for r in references if not contains_answer(" ".join((r.get("page") or "", r["text"])), golds)]
    state = state_of(record, kept)
    without_answer(state, golds)
    removed = render(source, prompt, state)
    if not contains_answer(user_text(removed), golds):
        variants.append(("raft-removed", removed, IDK))
    pool = [r for other in others for r in other.references
            if not contains_answer(" ".join((r.get("page") or "", r["text"])), golds)]
    if pool:
        mixed = list(references)
        for distractor in rng.sample(pool, min(DISTRACTORS, len(pool))):
            mixed.insert(rng.randrange(len(mixed) + 1), distractor)
        distracted = render(source, prompt, state_of(record, mixed))
        if contains_answer(user_text(distracted), golds):
            variants.append(("raft-distractors", distracted, answer))
    return variants, None


def build(folders: Iterable[Path], folds: int, raft: bool = True, seed: int = 0,
          held_out: Path = HELD_OUT, form: str = "short") -> tuple[Built, list[dict[str, Any]]]:
    """The examples and pairs of the judged run folders, and a source entry per folder for the manifest. A record
    of a question in `held_out` is an error: that file never enters training. `form`: `target`'s."""
    if form not in FORMS_OF_TARGET:
        raise ConfigError(f"target form {form!r}: choose one of {', '.join(FORMS_OF_TARGET)}")
    held_ids, held_queries = held_out_questions(held_out) if held_out.is_file() else (set(), set())
    built, sources = Built(), []
    for folder in folders:
        source = Source.read(folder)
        counted: Counter[str] = Counter()
        by_fold: dict[int, list[Record]] = {}
        for record in source.records:
            by_fold.setdefault(fold_of(record.interaction_id or "", folds), []).append(record)
        for record in source.records:
            iid = record.interaction_id or ""
            if iid in held_ids or " ".join((record.query or "").lower().split()) in held_queries:
                raise ConfigError(f"{folder}: question {iid!r} ({record.query!r}) is in {held_out}, which never "
                                  "enters training; leave that run folder out")
            fold = fold_of(iid, folds)
            conversations = answering_conversations(record)
            if not conversations:
                built.skipped["no recorded answering conversation (run with --record-prompts)"
                              if not (record.trace or {}).get("prompts") else "no answering conversation"] += 1
                continue
            rng = random.Random(f"{seed}:{iid}")
            prediction = record.prediction if isinstance(record.prediction, str) else ""
            for conversation in conversations:
                prompt, messages = conversation["prompt"], conversation["messages"]
                found = target(record, messages, form)
                if found is None:
                    built.skipped["unjudged answer"] += 1
                    continue
                kind, answer = found
                built.sft.append(example(record, fold, prompt, messages, kind, answer, folder))
                counted[kind] += 1
                for chosen, rejected in pairs_for(kind, answer, prediction):
                    built.pairs.append({"prompt": messages,
                                        "chosen": [{"role": "assistant", "content": FORMS[prompt](chosen)}],
                                        "rejected": [{"role": "assistant", "content": FORMS[prompt](rejected)}],
                                        "interaction_id": iid, "fold": fold, "kind": kind, "prompt_name": prompt})
                if raft and kind in ("own", "extraction"):
                    others = [r for r in by_fold[fold] if r.interaction_id != iid]
                    variants, why = raft_variants(source, record, conversation, kind, answer, others, rng)
                    if why:
                        built.skipped[why] += 1
                    for variant, variant_messages, variant_answer in variants:
                        built.sft.append(example(record, fold, prompt, variant_messages, variant, variant_answer,
                                                 folder))
                        counted[variant] += 1
        sources.append({"folder": str(folder), "predictions_sha256": file_hash(folder / "predictions.jsonl"),
                        "records": len(source.records), "examples": dict(sorted(counted.items()))})
    return built, sources


def write(built: Built, sources: list[dict[str, Any]], out: Path, folds: int, raft: bool, seed: int,
          form: str = "short") -> dict:
    """sft.jsonl, preferences.jsonl and data_manifest.json in `out`; returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, rows in ((SFT_FILE, built.sft), (PAIRS_FILE, built.pairs)):
        path = out / name
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
        files[name] = {"rows": len(rows), "sha256": file_hash(path)}
    by_fold: dict[str, Counter] = {}
    for row in built.sft:
        by_fold.setdefault(str(row["fold"]), Counter())[row["kind"]] += 1
    manifest = {"sources": sources, "folds": folds, "fold_of": "sha256(interaction_id) mod folds", "raft": raft,
                "seed": seed, "target_form": form, "files": files,
                "kinds": dict(sorted(Counter(row["kind"] for row in built.sft).items())),
                "kinds_by_fold": {f: dict(sorted(c.items())) for f, c in sorted(by_fold.items())},
                "pairs_by_kind": dict(sorted(Counter(row["kind"] for row in built.pairs).items())),
                "questions": len({row["interaction_id"] for row in built.sft}),
                "skipped": dict(sorted(built.skipped.items()))}
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return manifest


def read_rows(path: Path, folds: set[int] | None = None) -> list[dict[str, Any]]:
    """The rows of an sft.jsonl or preferences.jsonl, those of `folds` only where given."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row for row in rows if folds is None or row["fold"] in folds]
