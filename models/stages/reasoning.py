"""reasoning: the seed's structured prompt over everything gathered; the answer block is parsed, and when it
cannot be, the backup summariser answers."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from loguru import logger

from models.config import SystemConfig
from models.estimates import StagePlan, template_tokens, tokens
from models.llm.backend import (
    DEADLINE,
    LENGTH,
    Conversation,
    Sample,
    cut_short,
    deadline_cut,
    failure_of,
    span_logprobs,
)
from models.prompting import Messages, Prompt, PromptLibrary, render_with_evidence
from models.stages.r2ag import RETRIEVAL_FEATURES
from models.stages.stage import STAGES, Stage, StageContext
from models.state import EVIDENCE, QueryState, Reference
from utils.answers import IDK, INVALID, normalize_text

START, END = "===START===", "===END==="
_BLOCK = re.compile(re.escape(START) + r"(.*?)(?:" + re.escape(END) + r"|\Z)", re.DOTALL)
_ANSWER = re.compile(r"^[#* \t]*(?:final[ \t]+)?answer[ \t]*[:：][ \t]*(.*)$", re.IGNORECASE | re.MULTILINE)
_PREMISE = re.compile(r"^[#* \t]*false[ \t]+premise[ \t]*[:：][ \t*]*(yes|no|true|false)", re.IGNORECASE | re.MULTILINE)
_PLACEHOLDER = re.compile(r"^<.*>$")
# Where a reference's R2AG retrieval embedding goes: private-use characters around its position in the list.
_MARKER = "\ue000{}\ue001"
_MARKER_RE = re.compile("\ue000(\\d+)\ue001")


@dataclass
class Parsed:
    answer: str
    false_premise: bool


def _read_block(text: str) -> Parsed | None:
    match = _ANSWER.search(text)
    if not match:
        return None
    answer = match.group(1).strip().strip("*").strip()
    if not answer or _PLACEHOLDER.match(answer):
        return None
    premise = _PREMISE.search(text)
    return Parsed(answer, premise is not None and premise.group(1).lower() in ("yes", "true"))


def parse_structured(output: str) -> Parsed | None:
    """The answer and false-premise flag of the seed's output format, or None when there is no answer.

    The last ===START=== block with a real answer wins (models often echo the template's block first, or
    repeat it); a missing ===END=== is tolerated; without markers an "## Answer:" / "Answer:" line is used.
    """
    for block in reversed(_BLOCK.findall(output)):
        parsed = _read_block(block)
        if parsed:
            return parsed
    return _read_block(output)


def parse_whole(sample: Sample) -> Parsed | None:
    """parse_structured of the sample's text, and None for an answer the generation cut short (its line never
    ended)."""
    parsed = parse_structured(sample.text)
    return None if parsed is not None and cut_short(sample, parsed.answer) else parsed


def fit_references(references: list[Reference], max_chars: int) -> list[Reference]:
    """The best-ranked references whose texts fit in max_chars together (the best one always)."""
    kept: list[Reference] = []
    used = 0
    for ref in references:
        if kept and used + len(ref.text) > max_chars:
            break
        kept.append(ref)
        used += len(ref.text)
    return kept


def prompt_evidence(state: QueryState, max_chars: int, markers: int = 0) -> tuple[list[dict], list[dict]]:
    """(texts, tables) for a prompt: the best references within max_chars, split by kind, best first.

    Each carries `id`, its 1-based rank among the references, and `retrieval_marker`: for the first `markers`
    references of the state a marker naming its position (where R2AG puts its retrieval embedding), else "".
    """
    fitted = fit_references(state.references, max_chars)
    items = [dict(asdict(r), id=i + 1, retrieval_marker=_MARKER.format(i) if i < markers else "")
             for i, r in enumerate(fitted)]
    texts = [item for item in items if item["kind"] != "table"]
    tables = [item for item in items if item["kind"] == "table"]
    return texts, tables


def reasoning_conversation(prompt: Prompt, state: QueryState, max_chars: int, markers: int = 0) -> Messages:
    """The reasoning prompt for `state`, with every block of evidence the stages wrote; with `markers`, its first
    references carry retrieval markers."""
    texts, tables = prompt_evidence(state, max_chars, markers)
    return render_with_evidence(prompt, state, query=state.query, query_time=state.query_time, references=texts,
                                tables=tables)


def shown_evidence_chars(config: SystemConfig, prompt: Prompt) -> int:
    """The most characters the evidence blocks `prompt` shows can bring from the stages of the config's strategy
    that it switches on (`Stage.evidence_chars`; the planner has imported any stage module the config names): a
    block it names, or every listed block where it has the `evidence` variable, as render_with_evidence renders
    them."""
    def shows(spec: Any) -> bool:
        return spec.evidence is not None and (spec.name in prompt.variables or (
            EVIDENCE in prompt.variables and spec.evidence.listed))

    stages = [STAGES.get(name) for name in config.strategy_names() if name in STAGES]
    return sum(stage.evidence_chars(config) for stage in stages
               if stage.active(config) and any(shows(spec) for spec in stage.fields))


def summariser_conversation(prompt: Prompt, state: QueryState, max_chars: int) -> Messages:
    """The backup summariser's prompt for `state`: the text references within max_chars and every block of
    evidence the stages wrote (the KG's rows, where its prompt shows them)."""
    return render_with_evidence(prompt, state, query=state.query, query_time=state.query_time,
                                references=prompt_evidence(state, max_chars)[0])


def place_embeddings(conversation: Messages, vectors: np.ndarray, placeholder: str
                     ) -> tuple[Messages, np.ndarray]:
    """The conversation with each reference marker replaced by the placeholder token, and the rows of `vectors`
    (one per reference) in the order the markers appear. A placeholder already in the text is removed first."""
    order: list[int] = []

    def swap(match: re.Match) -> str:
        order.append(int(match.group(1)))
        return placeholder

    placed = Messages([dict(message, content=_MARKER_RE.sub(swap, message["content"].replace(placeholder, "")))
                       for message in conversation], conversation.prompt)
    return placed, vectors[order].reshape(len(order), vectors.shape[-1])


def answer_signals(state: QueryState, sample: Sample, answer: str, summariser: bool) -> None:
    """The confidence signals of an answer read from `sample`: its line's tokens' mean and lowest
    log-probability (None where the backend gives none) and whether the backup summariser gave it."""
    logprobs = span_logprobs(sample, answer)
    state.signals.update({"reasoning.answer_logprob_mean": sum(logprobs) / len(logprobs) if logprobs else None,
                          "reasoning.answer_logprob_min": min(logprobs) if logprobs else None,
                          "reasoning.summariser": summariser})


def agreement(state: QueryState, votes: list[str], samples: int) -> None:
    """`reasoning.agreement`: the share of `samples` sampled answers whose vote (an unreadable sample has none)
    equals the query's answer after normalisation; None when no sample came."""
    state.signals["reasoning.agreement"] = (
        sum(normalize_text(v) == normalize_text(state.answer or "") for v in votes) / samples if samples else None)


def first_line(output: str) -> str:
    """The summariser's answer: its first non-empty line, without an "Answer:" label or leading "[n]" citations."""
    line = next((line.strip() for line in output.splitlines() if line.strip()), "")
    line = re.sub(r"^(?:final\s+)?answer\s*:\s*", "", line, flags=re.IGNORECASE)
    return re.sub(r"^(?:\[\d+\]\s*)+", "", line).strip()


def echoed_heading(answer: str, state: QueryState) -> str | None:
    """The heading of an evidence block the summariser's prompt lists ("Calculation results:") where `answer` is
    that heading alone: a small model copying the prompt's layout, which no judge would call an answer."""
    said = answer.strip().rstrip(":：").strip().casefold()
    return next((f"{block.title}:" for block in state.evidence_blocks() if block.title.casefold() == said), None)


@STAGES.register("reasoning")
class ReasoningStage(Stage):
    prompts = ("reasoning", "summariser")
    sections = ("reasoning",)
    reads = frozenset({"references"})
    may_read = frozenset({EVIDENCE, "retrieval_features"})
    writes = frozenset({"answer", "llm_output"})
    needs = frozenset({"llm", "r2former"})
    signals = {"reasoning.answer_logprob_mean": "the mean log-probability of the answer's tokens (None where the "
                                                "backend gives none)",
               "reasoning.answer_logprob_min": "the lowest log-probability of the answer's tokens",
               "reasoning.summariser": "whether the backup summariser gave the answer",
               "reasoning.agreement": "the share of `reasoning.samples` sampled answers equal to the answer (None "
                                      "without samples)",
               "references.in_prompt": "how many references fit the reasoning prompt"}

    @classmethod
    def estimate(cls, config: SystemConfig, prompts: PromptLibrary) -> list[StagePlan]:
        """The reasoning prompt, and the backup summariser (where it is on) as the worst case: each with its
        references, and the evidence blocks it shows (the reasoning prompt its tables too)."""
        settings = config.reasoning
        reasoning = (settings.max_reference_chars + config.references.table_budget_chars
                     + shown_evidence_chars(config, prompts.get("reasoning")))
        summariser = settings.max_reference_chars + shown_evidence_chars(config, prompts.get("summariser"))
        return ([StagePlan("reasoning", template_tokens(prompts, "reasoning") + tokens(reasoning),
                           settings.max_tokens, 1)] if settings.max_tokens else []) + (
            [StagePlan("summariser", template_tokens(prompts, "summariser") + tokens(summariser),
                       settings.summariser_max_tokens, 1)] if settings.summariser_max_tokens else [])

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        settings = ctx.settings
        for state in states:
            state.signals["references.in_prompt"] = len(fit_references(state.references,
                                                                       settings.max_reference_chars))
        if not settings.max_tokens:  # no reasoning prompt: the summariser answers
            self._summarise(states, ctx)
            return
        prompt = ctx.prompt("reasoning")
        prompting = ctx.resource("r2former") is not None and ctx.resource("r2former").prompting
        vectors = self._retrieval_embeddings(states, ctx) if prompting else [None] * len(states)
        conversations = [reasoning_conversation(prompt, s, settings.max_reference_chars,
                                                0 if rows is None else len(rows)) for s, rows in zip(states, vectors)]
        embeddings: list[np.ndarray] | None = None
        if prompting:
            placeholder = ctx.resource("llm").retrieval_placeholder()
            placed = [place_embeddings(c, rows if rows is not None else np.zeros((0, ctx.resource("llm").hidden_size)),
                                       placeholder) for c, rows in zip(conversations, vectors)]
            conversations, embeddings = [c for c, _ in placed], [e for _, e in placed]
        outputs = ctx.generate(conversations, owners=states, max_tokens=settings.max_tokens,
                               temperature=settings.temperature, stop=[END], embeddings=embeddings, logprobs=True)
        unparsed: list[QueryState] = []
        for state, samples in zip(states, outputs):
            if not samples or not samples[0].text.strip():
                cause = failure_of(samples)
                state.finish(IDK, f"reasoning: the LLM call failed ({cause})" if cause
                             else "reasoning: the deadline came before any text" if deadline_cut(samples)
                             else "reasoning: the LLM returned nothing")
                continue
            state.llm_output = samples[0].text
            parsed = parse_whole(samples[0])
            if parsed is None:  # no answer, or half of one: the summariser answers
                unparsed.append(state)
                continue
            state.answer = INVALID if parsed.false_premise else parsed.answer
            answer_signals(state, samples[0], parsed.answer, summariser=False)
        if settings.samples:
            rows: list[np.ndarray | None] = list(embeddings) if embeddings is not None else [None] * len(states)
            self._agreement([(s, c, e) for s, c, e in zip(states, conversations, rows)
                             if s.answer is not None and not s.done], ctx)
        if unparsed:
            self._summarise(unparsed, ctx)

    @staticmethod
    def _agreement(answered: list[tuple[QueryState, Messages, np.ndarray | None]], ctx: StageContext) -> None:
        """Self-consistency: `reasoning.samples` more answers at `sample_temperature` for each answered query, and
        the share that agree with its answer after normalisation (`reasoning.agreement`; None when none came)."""
        if not answered:
            return
        settings = ctx.settings
        states, conversations, rows = zip(*answered)
        outputs = ctx.generate(list(conversations), owners=list(states), max_tokens=settings.max_tokens,
                               temperature=settings.sample_temperature, n=settings.samples, stop=[END],
                               embeddings=None if rows[0] is None else list(rows))
        for state, samples in zip(states, outputs):
            read = [parse_whole(sample) for sample in samples]
            agreement(state, [INVALID if p.false_premise else p.answer for p in read if p is not None], len(samples))

    @staticmethod
    def _retrieval_embeddings(states: list[QueryState], ctx: StageContext) -> list[np.ndarray | None]:
        """Per query, the R2-Former's projected embedding of each reference (None without retrieval features)."""
        having = [s for s in states if s[RETRIEVAL_FEATURES]]
        head = ctx.resource("r2former")
        _, projected = head.run([np.asarray(s[RETRIEVAL_FEATURES], dtype=np.float32) for s in having])
        by_state = {id(s): rows for s, rows in zip(having, projected)}
        return [by_state.get(id(s)) for s in states]

    @staticmethod
    def _summarise(states: list[QueryState], ctx: StageContext) -> None:
        """The summariser, for the queries whose reasoning output had no answer to parse (all of them where the
        reasoning prompt is off)."""
        deadline = ctx.work_deadline()
        why = "reasoning output unparsable" if ctx.settings.max_tokens else "the reasoning prompt is off"
        if not ctx.settings.summariser_max_tokens:
            for state in states:
                state.finish(IDK, f"{why} and the summariser is off")
            return
        if deadline.expired():
            ctx.cut(states, "no time for the summariser")
            for state in states:
                state.finish(IDK, f"{why} and no time left for the summariser")
            return
        if ctx.settings.max_tokens:
            logger.info("reasoning output unparsable for {}; backup summariser answers",
                        [s.interaction_id for s in states])
        prompt = ctx.prompt("summariser")
        settings = ctx.settings
        conversations = [summariser_conversation(prompt, s, settings.max_reference_chars) for s in states]
        outputs = ctx.generate(conversations, owners=states, max_tokens=settings.summariser_max_tokens,
                               deadline=deadline, logprobs=True)
        answered: list[tuple[QueryState, Conversation]] = []
        # "reply" keeps a reply its token budget cut, as the organisers' baseline does; never one the deadline cut
        read, kept = (str.strip, {LENGTH}) if settings.summariser_answer == "reply" else (first_line, set())
        for state, conversation, samples in zip(states, conversations, outputs):
            answer = read(samples[0].text) if samples else ""
            if answer and (reason := cut_short(samples[0], answer)) and reason not in kept:
                state.finish(IDK, f"the summariser's generation was cut short ({reason})")
            elif answer and (heading := echoed_heading(answer, state)):
                state.finish(IDK, f"the summariser repeated the prompt's heading {heading!r}, not an answer")
            elif answer:
                state.answer = answer
                answer_signals(state, samples[0], answer, summariser=True)
                answered.append((state, conversation))
            elif deadline_cut(samples):
                state.finish(IDK, f"the summariser's generation was cut short ({DEADLINE})")
            elif cause := failure_of(samples):
                state.finish(IDK, f"{why} and the summariser's call failed ({cause})")
            else:
                state.finish(IDK, f"{why} and the summariser returned nothing")
        if settings.samples and answered and not deadline.expired():  # self-consistency of the summariser's answer
            states_, conversations_ = zip(*answered)
            sampled = ctx.generate(list(conversations_), owners=list(states_),
                                   max_tokens=settings.summariser_max_tokens, temperature=settings.sample_temperature,
                                   n=settings.samples, deadline=deadline)
            for state, samples in zip(states_, sampled):
                agreement(state, [line for sample in samples if (line := read(sample.text))], len(samples))
