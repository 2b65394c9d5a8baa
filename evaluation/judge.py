"""Judging predictions: rules first, then a judge for what the rules cannot decide (the facts judge, `FactsJudge` in
evaluation/facts_judge.py, the default; an LLM judge; a person's verdicts, `PersonJudge` in
evaluation/person_judge.py; or the containment rules, `ContainsJudge`); and, beside
ours, the organisers' rules, so a run shows the leaderboard's reading of the same predictions.

The verdicts and the judges' names live in evaluation/verdicts.py. Where the judge's backend gives
log-probabilities (vLLM, OpenAI, the local hf judge; not transformers serve), each LLM verdict carries the
probability the judge gave it. Every prediction is cut as the grader cuts it (75 Llama-2 tokens,
utils/grader_tokens.py) before either judge reads it. LLM judgements are cached by (question, gold answers,
prediction, judge model, prompt), so re-judging a run costs nothing.

Our rules differ from the organisers' on purpose: they accept the alternative answers (`alt_ans`), read the
usual ways of saying "i don't know", and want "invalid question" as a prefix. The organisers' column
(`judge_by_organisers_rules`) follows their published evaluation instead, and where they would ask their LLM
judge it asks ours, gold answer only; without an LLM judge (or a person) those are "unjudged", never guessed: the
containment judge, being rules, never stands in for their LLM judge.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from loguru import logger
from tqdm import tqdm

from evaluation.containment import contains_gold
from evaluation.metrics import MIN_FOR_INTERVAL
from evaluation.record import Record
from evaluation.verdicts import CONTAINS, CORRECT, FACTS, MISS, PERSON, UNJUDGED, WRONG, Item, Judge
from models.config import ConfigError, HFConfig, OpenAIConfig
from models.llm.backend import LLM, GenParams, Probed, Sample, TopLogprobs
from models.prompting import Prompt, PromptLibrary
from models.registry import Registry
from utils.answers import INVALID, contains_answer, is_idk, is_invalid, normalize_text, rejects_premise
from utils.cache import JsonCache, cache_root, content_key
from utils.grader_tokens import grader_cut
from utils.llm_json import parse_llm_json

TOP_LOGPROBS = 5  # alternatives asked for at each token of the judge's reply
UNCERTAIN = 0.75  # an LLM verdict the judge gave a lower probability is counted as uncertain in the report


def judge_by_rules(item: Item) -> str | None:
    """miss, correct or wrong where our rules decide; None where a judge must read the prediction.

    An "i don't know" variant is a miss (curly apostrophes included); an exact match of the answer or of an
    alternative answer is correct; "invalid question" is correct only when the gold answer is "invalid
    question", and wrong otherwise; where the gold is "invalid question", an answer that opens by rejecting the
    premise ("No.", "None of them ...", `rejects_premise`) is left to the judge, and any other is wrong.
    """
    prediction = grader_cut(item.prediction)
    if is_idk(prediction):
        return MISS
    golds = {normalize_text(g) for g in (item.answer, *item.alt_answers)}
    if INVALID in golds and not is_invalid(prediction) and rejects_premise(prediction):
        return None
    if INVALID in golds or is_invalid(prediction):
        return CORRECT if INVALID in golds and is_invalid(prediction) else WRONG
    return CORRECT if normalize_text(prediction) in golds else None


def judge_by_containment(item: Item) -> tuple[str, str]:
    """(verdict, reason): our rules where they decide ("rules"), else correct where the grader-cut prediction gives
    the gold answer or an alternative by evaluation/containment.py (whole words; not negated, set against another,
    hedged or one of a list of candidates), and wrong where it does not."""
    decided = judge_by_rules(item)
    if decided is not None:
        return decided, "rules"
    holds, reason = contains_gold(grader_cut(item.prediction), [item.answer, *item.alt_answers])
    return (CORRECT if holds else WRONG), f"contains: {reason}"


def judge_by_organisers_rules(item: Item) -> str | None:
    """miss, correct or wrong where the organisers' published evaluation decides without its LLM judge; None
    where it would ask that judge. In their order, on the lower-cased, grader-cut prediction: containing
    "i don't know" is a miss; equal to the gold answer is correct; "invalid" in both is correct; "invalid" in
    only one of them is wrong. Alternative answers play no part."""
    prediction = grader_cut(item.prediction).lower()
    gold = item.answer.strip().lower()
    if "i don't know" in prediction:
        return MISS
    if prediction == gold:
        return CORRECT
    if "invalid" in prediction or "invalid" in gold:
        return CORRECT if "invalid" in prediction and "invalid" in gold else WRONG
    return None


_KEYED = re.compile(r'"?(correct|accuracy|score)"?\s*[:=]\s*"?(true|false|yes|no|1|0)\b', re.IGNORECASE)
# The verdict word opening a reply; not a quoted or JSON key ("correct": false) nor a key with a value (correct: no).
_FIRST_WORD = re.compile(r"^[^\w{\"']*(correct|incorrect|wrong)\b(?!\s*[:=]\s*\"?(?:true|false|yes|no|[01])\b)\W*(.*)",
                         re.IGNORECASE | re.DOTALL)
_WORDS = {"correct": True, "incorrect": False, "wrong": False}


def _truth(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    return None


def parse_judgement(output: str) -> tuple[bool | None, str]:
    """(verdict, reason) from the judge's reply: the first word ("Correct.", "INCORRECT, because ...") with the
    rest as the reason; else a JSON object with "correct" (or "accuracy", "score"), else such a key written
    loosely; (None, the reply) when it says neither."""
    text = output.strip()
    if match := _FIRST_WORD.match(text):
        return _WORDS[match.group(1).lower()], match.group(2).strip()
    data = parse_llm_json(text, dict)
    if data:
        lowered = {str(k).lower(): v for k, v in data.items()}
        for key in ("correct", "accuracy", "score"):
            if key in lowered and _truth(lowered[key]) is not None:
                return _truth(lowered[key]), str(lowered.get("reason") or lowered.get("explanation") or "")
    loose = _KEYED.search(text)
    return (_truth(loose.group(2)), text) if loose else (None, text)


def _letters(token: str) -> str:
    return re.sub(r"[^a-z]", "", token.lower())


def p_correct(top: TopLogprobs, positions: int = 5) -> tuple[float, float] | None:
    """(P(correct | a verdict word), the probability mass on verdict words) at the reply's first word: the first
    of the opening `positions` tokens whose most likely alternative has letters ("**Correct" starts at its second
    token). Verdict words are the tokens that begin "correct" or "incorrect"/"wrong" (two letters or more, any
    case and leading space); None where no alternative there is one."""
    for step in top[:positions]:
        if not step or not _letters(max(step, key=lambda token: step[token])):
            continue
        mass = {True: 0.0, False: 0.0}
        for token, logprob in step.items():
            letters = _letters(token)
            if len(letters) < 2:
                continue
            if "correct".startswith(letters):
                mass[True] += math.exp(logprob)
            elif "incorrect".startswith(letters) or "wrong".startswith(letters):
                mass[False] += math.exp(logprob)
        total = mass[True] + mass[False]
        return (mass[True] / total, total) if total > 0 else None
    return None


def read_reply(sample: Sample) -> tuple[bool | None, str, float | None]:
    """(verdict, reason, P(correct)) from one reply: the verdict from its text (parse_judgement), with the
    judge's probability of it where the reply carries log-probabilities; where the text says nothing usable but
    most of the probability at the first word is on verdict words, the verdict those probabilities give."""
    judged, reason = parse_judgement(sample.text)
    probability = p_correct(sample.top_logprobs)
    if probability is None:
        return judged, reason, None
    p, mass = probability
    if judged is None and mass >= 0.5:
        return p >= 0.5, f"log-probabilities: P(correct) = {p:.2f}; reply: {sample.text.strip()[:200]}", p
    return judged, reason, p


class LLMJudge(Judge):
    """Judges items with `llm` (any backend) through `prompt`; `name` identifies the judge model in the cache.

    Each batch of `batch_size` items is one backend call (remote backends send its requests concurrently);
    an item whose reply cannot be read is asked again (sampling) up to `retries` times; then the rules have the
    last word where they can (the gold answer inside the prediction: correct, judged "rules-fallback"), and
    it is unjudged where they cannot. `reasons` keeps the judge's reason of every verdict, by item key, and
    `p_correct` the probability the judge gave "correct", where its backend offers log-probabilities.
    """

    kind = "llm"
    for_organisers = True

    def __init__(self, llm: LLM, prompt: Prompt, name: str, cache: JsonCache | None = None, batch_size: int = 16,
                 retries: int = 2, max_tokens: int = 64) -> None:
        self.llm, self.prompt, self.name, self.cache = llm, prompt, name, cache
        self.batch_size, self.retries, self.max_tokens = batch_size, retries, max_tokens
        self._prompt_key = content_key(prompt.path.read_text(encoding="utf-8"))  # a loaded prompt has its file
        self.calls = 0
        self.reasons: dict[str, str] = {}
        self.p_correct: dict[str, float] = {}
        self.fallbacks = 0

    @classmethod
    def from_spec(cls, spec: str, model_name: str | None) -> LLMJudge:
        """The embedded SmolLM2 (`local`) or the model `model_name` at the server `spec`, probed."""
        llm: LLM
        if spec == "local":
            from models.llm.hf import HFBackend, resolve_model_folder

            llm, name = HFBackend(HFConfig()), f"hf:{resolve_model_folder().name}"
        else:
            from models.llm.openai import OpenAIBackend
            from models.llm.profile import ModelProfile

            assert model_name, "check_judge refuses a URL judge without --judge-model"
            served = ModelProfile(name=model_name, weights=None)  # only the server holds it: prompts go uncut
            llm, name = OpenAIBackend(OpenAIConfig(base_url=spec), served), f"{spec}#{model_name}"
        judge = cls(llm, PromptLibrary().get("judge"), name, JsonCache(cache_root(None) / "judge"))
        judge.probe()
        return judge

    def probe(self) -> None:
        """Raise BackendUnavailable (one line) when the judge's server refuses work: a wrong key, model or URL."""
        if isinstance(self.llm, Probed):
            self.llm.probe()

    def key(self, item: Item) -> str:
        return item.key(self.name, self._prompt_key)

    def judge(self, items: Sequence[Item]) -> list[str]:
        verdicts: list[str | None] = [None] * len(items)
        todo = []
        for index, item in enumerate(items):
            cached = self.cache.get(self.key(item)) if self.cache is not None else None
            if isinstance(cached, dict) and cached.get("verdict") in (CORRECT, WRONG):
                verdicts[index] = cached["verdict"]
                self.reasons[self.key(item)] = str(cached.get("reason") or "")
                if isinstance(cached.get("p_correct"), float):
                    self.p_correct[self.key(item)] = cached["p_correct"]
            else:
                todo.append(index)
        with tqdm(total=len(todo), desc=f"judging ({self.name})", unit="q", disable=None if todo else True,
                  dynamic_ncols=True) as progress:  # on a terminal only; the judged predictions against all asked
            for attempt in range(1 + self.retries):
                if not todo:
                    break
                todo = self._ask(items, todo, verdicts, temperature=0.0 if attempt == 0 else 0.7, progress=progress)
        for index in todo:  # nothing usable from the model: the rules where they can decide
            item = items[index]
            if contains_answer(grader_cut(item.prediction), [item.answer, *item.alt_answers]):
                verdicts[index] = CORRECT
                self.reasons[self.key(item)] = "rules-fallback: the gold answer is in the prediction"
                self.fallbacks += 1
        unjudged = sum(v is None for v in verdicts)
        if todo:
            logger.warning("LLM judge {}: no usable reply for {} of {} predictions ({} decided by the rules, {} "
                           "unjudged)", self.name, len(todo), len(items), len(todo) - unjudged, unjudged)
        return [verdict or UNJUDGED for verdict in verdicts]

    def _ask(self, items: Sequence[Item], todo: list[int], verdicts: list[str | None], temperature: float,
             progress: tqdm | None = None) -> list[int]:
        """Ask about `todo`; fill `verdicts`; return the indices still without one. Retries sample (temperature
        above 0), since a greedy judge would repeat the same unusable reply."""
        failed = []
        params = GenParams(max_tokens=self.max_tokens, temperature=temperature, n=1, top_logprobs=TOP_LOGPROBS)
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start:start + self.batch_size]
            conversations = [self.prompt.render(query=items[i].query, answers=[items[i].answer, *items[i].alt_answers],
                                                prediction=grader_cut(items[i].prediction)) for i in chunk]
            self.calls += 1
            try:
                outputs = self.llm.generate(conversations, params)
            except Exception as err:  # a judge backend down must cost verdicts, not the report
                logger.warning("LLM judge {} failed on {} predictions: {}", self.name, len(chunk), err)
                failed.extend(chunk)
                continue
            for index, samples in zip(chunk, outputs):
                judged, reason, probability = read_reply(samples[0]) if samples else (None, "", None)
                if judged is None:
                    failed.append(index)
                    continue
                verdicts[index] = CORRECT if judged else WRONG
                key = self.key(items[index])
                self.reasons[key] = reason
                if probability is not None:
                    self.p_correct[key] = probability
                if self.cache is not None:
                    self.cache.put(key, {"verdict": verdicts[index], "reason": reason, "p_correct": probability})
            if progress is not None:
                progress.update(sum(verdicts[index] is not None for index in chunk))
        return failed


class ContainsJudge(Judge):
    """The containment rules (`judge_by_containment`) as a judge: no model, no cache, the same verdict every time.
    Its verdicts are "contains" under "judged by", apart from an LLM judge's; it never stands in for the
    organisers' LLM judge (`for_organisers`), so their column is what it is without a judge."""

    kind = name = CONTAINS
    for_organisers = False

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}
        self.p_correct: dict[str, float] = {}

    @classmethod
    def from_spec(cls, spec: str, model_name: str | None) -> ContainsJudge:
        return cls()

    def key(self, item: Item) -> str:
        return item.key()

    def judge(self, items: Sequence[Item]) -> list[str]:
        verdicts = []
        for item in items:
            verdict, self.reasons[self.key(item)] = judge_by_containment(item)
            verdicts.append(verdict)
        return verdicts


class ChainJudge(Judge):
    """Judges asked in turn, each about what the ones before left unjudged (`--judge person:FILE+contains`: a
    person's verdict where they saw this very answer, the containment rules elsewhere). Each verdict keeps the
    judged_by, reason and confidence of the judge that gave it; it stands in for the organisers' LLM judge only
    where every judge in it does."""

    kind = "chain"

    def __init__(self, judges: list[Judge]) -> None:
        self.judges = judges
        self.name = "+".join(judge.name for judge in judges)
        self.for_organisers = all(judge.for_organisers for judge in judges)
        self.reasons: dict[str, str] = {}
        self.p_correct: dict[str, float] = {}
        self.kinds: dict[str, str] = {}

    @classmethod
    def from_spec(cls, spec: str, model_name: str | None) -> ChainJudge:
        return cls([judge for part in spec.split(CHAIN) if (judge := build_judge(part, model_name)) is not None])

    def key(self, item: Item) -> str:
        return item.key()

    def judge(self, items: Sequence[Item]) -> list[str]:
        verdicts = [UNJUDGED] * len(items)
        open_ = list(range(len(items)))
        for judge in self.judges:
            found = judge.judge([items[i] for i in open_]) if open_ else []
            for index, verdict in zip(open_, found):
                if verdict == UNJUDGED:
                    continue
                key, theirs = self.key(items[index]), judge.key(items[index])
                verdicts[index], self.kinds[key] = verdict, judge.kind_of(theirs)
                self.reasons[key] = judge.reasons.get(theirs, "")
                if theirs in judge.p_correct:
                    self.p_correct[key] = judge.p_correct[theirs]
            open_ = [i for i in open_ if verdicts[i] == UNJUDGED]
        return verdicts

    def kind_of(self, key: str) -> str:
        return self.kinds.get(key, "none")


# --judge's kinds: contains, person:FILE, and an LLM (local, or a server's base URL); `rules` is no judge (None);
# several joined by CHAIN are asked in turn.
JUDGES: Registry[Judge] = Registry("judge", Judge)
JUDGES.register(CONTAINS)(ContainsJudge)
JUDGES.register_lazy("person", "evaluation.person_judge:PersonJudge")
JUDGES.register_lazy(FACTS, "evaluation.facts_judge:FactsJudge")
JUDGES.register("llm")(LLMJudge)
JUDGES.register("chain")(ChainJudge)
CHAIN = "+"


def judge_records(records: list[dict[str, Any]], llm_judge: Judge | None) -> None:
    """Set on every record: "verdict" and "judged_by" ("rules", "llm", "person", "contains", "rules-fallback" or
    "none"), with "judge_reason" where the judge gave one and "judge_confidence" (the probability the judge gave its
    verdict) where its backend offers log-probabilities; the same prefixed "organisers_" by the organisers' rules;
    "cut_by_grader" (the grader's 75-token cut changes the prediction) and "null_prediction" (not a string:
    read as "i don't know"). Where the answer gate withheld an answer, the same fields for that answer go under
    "ungated" (with it as "prediction"). Every LLM question goes to the judge in one call, each distinct once."""
    shadows = []
    for record in records:
        record.pop("ungated", None)
        if (withheld := Record(record).withheld) is not None:
            shadows.append((record, {key: record.get(key) for key in ("query", "answer", "alt_answers")}
                            | {"prediction": withheld}))
    _judge([*records, *(shadow for _, shadow in shadows)], llm_judge)
    for record, shadow in shadows:
        record["ungated"] = {key: value for key, value in shadow.items() if key not in ("query", "answer",
                                                                                        "alt_answers")}


def _judge(records: list[dict[str, Any]], llm_judge: Judge | None) -> None:
    for record in records:  # a null or non-string prediction is read as "i don't know", and counted
        record["null_prediction"] = not isinstance(record.get("prediction"), str)
        for prefix in ("", "organisers_"):  # an earlier judge's reasons, from the record file, do not carry over
            record.pop(f"{prefix}judge_reason", None)
            record.pop(f"{prefix}judge_confidence", None)
    ours = [Item(str(r.get("query") or ""), str(r.get("answer") or ""),
                 tuple(str(a) for a in r.get("alt_answers") or []), "" if r["null_prediction"] else r["prediction"])
            for r in records]
    theirs = [Item(item.query, item.answer, (), item.prediction) for item in ours]
    undecided: list[tuple[str, dict[str, Any], Item]] = []
    for record, item in zip(records, ours):
        record["cut_by_grader"] = grader_cut(item.prediction) != item.prediction.strip()
    for prefix, items, rules in (("", ours, judge_by_rules), ("organisers_", theirs, judge_by_organisers_rules)):
        for record, item in zip(records, items):
            verdict = rules(item)
            if verdict is not None:
                record.update({f"{prefix}verdict": verdict, f"{prefix}judged_by": "rules"})
            elif llm_judge is not None and (not prefix or llm_judge.for_organisers):
                undecided.append((prefix, record, item))
            elif prefix:  # the organisers would ask their LLM judge: without one, unjudged, never guessed
                record.update(organisers_verdict=UNJUDGED, organisers_judged_by="none")
            else:  # rules only: what our rules cannot decide is wrong, as in the exact-match baseline
                record.update(verdict=WRONG, judged_by="rules")
    if llm_judge is None or not undecided:
        return
    questions = {llm_judge.key(item): item for _, _, item in undecided}
    verdicts = dict(zip(questions, llm_judge.judge(list(questions.values()))))
    for prefix, record, item in undecided:
        key = llm_judge.key(item)
        reason = llm_judge.reasons.get(key, "")
        judged_by = "none" if verdicts[key] == UNJUDGED else "rules-fallback" if reason.startswith(
            "rules-fallback") else llm_judge.kind_of(key)
        record.update({f"{prefix}verdict": verdicts[key], f"{prefix}judged_by": judged_by,
                       f"{prefix}judge_reason": reason})
        if judged_by in ("llm", FACTS) and key in llm_judge.p_correct:
            p = llm_judge.p_correct[key]
            record[f"{prefix}judge_confidence"] = round(p if verdicts[key] == CORRECT else 1 - p, 4)


def contains_note(judged_by: dict[str, int]) -> str | None:
    """What a report says of the offline judges' verdicts, so no one reads them as an LLM judge's."""
    notes = [f"judged by {name}: {judged_by[name]} answers the rules leave open, read by {what} (no model server, "
             "no LLM judge; their agreement with a person: local_evaluation.py calibrate)"
             for name, what in ((FACTS, "the key-fact rules and their fitted classifier"),
                                (CONTAINS, "the containment rules")) if judged_by.get(name)]
    return "; ".join(notes) or None


def interval(scores: dict[str, Any]) -> str:
    """The score's 95% interval as "[lo, hi]", or "n<10" where there is none."""
    ci = scores.get("ci95")
    return f"[{ci['score'][0]:+.2f}, {ci['score'][1]:+.2f}]" if ci else f"n<{MIN_FOR_INTERVAL}"


def corrected_lines(summary: dict[str, Any]) -> list[str]:
    """The judged score beside the score corrected for the judge's errors, the calibration that corrected it (or
    why none did) and any warning that the run's answers differ from the calibration set's."""
    lines = []
    if fixed := summary.get("corrected"):
        judged = summary["overall"]
        lines.append(f"score judged {judged['score']:+.3f} {interval(judged)}; corrected for the judge's errors "
                     f"{fixed['score']:+.3f} {interval(fixed)} (accuracy {fixed['accuracy']:.3f}, hallucination "
                     f"{fixed['hallucination']:.3f}; {fixed['judged']} of {fixed['total']} verdicts the judge's own, "
                     "the rest exact; the interval counts the run's questions and the calibration set's size)")
        cal = fixed["calibration"]
        lines.append(f"calibration: {cal['name']}: sensitivity {cal['sensitivity']:.2f}, specificity "
                     f"{cal['specificity']:.2f}")
    elif note := summary.get("calibration_note"):
        lines.append(note)
    return [*lines, *summary.get("calibration_warnings", ())]


def _chained(spec: str) -> bool:
    """Whether --judge names several judges joined by CHAIN (a URL may hold a "+" of its own)."""
    return CHAIN in spec and not spec.startswith(("http://", "https://"))


def check_judge(spec: str, model_name: str | None) -> None:
    """A ConfigError naming --judge when it cannot name a judge (checked before any model loads)."""
    if _chained(spec):
        parts = spec.split(CHAIN)
        if "rules" in parts or "" in parts:
            raise ConfigError(f"--judge {spec!r}: join judges with {CHAIN}, e.g. person:FILE{CHAIN}contains (the "
                              "rules come first anyway)")
        for part in parts:
            check_judge(part, model_name)
        return
    if spec in ("rules", CONTAINS, "local"):
        return
    if spec == FACTS:
        from evaluation.facts_judge import Classifier, load_model

        Classifier(load_model())
        return
    if spec.startswith(PERSON):
        from evaluation.person_judge import person_judge

        person_judge(spec)
        return
    if not spec.startswith(("http://", "https://")):
        raise ConfigError(f"--judge {spec!r}: use facts, contains, rules, local, person:FILE, or an http(s) base URL")
    if not model_name:
        raise ConfigError(f"--judge {spec}: name the served model with --judge-model")


def build_judge(spec: str, model_name: str | None) -> Judge | None:
    """The judge named by --judge (facts, contains, rules, local, person:FILE, a server's base URL, or several
    joined by +); None for the exact rules only."""
    check_judge(spec, model_name)
    if spec == "rules":
        return None
    kind = ("chain" if _chained(spec) else spec if spec in (CONTAINS, FACTS)
            else "person" if spec.startswith(PERSON) else "llm")
    return JUDGES.get(kind).from_spec(spec, model_name)
