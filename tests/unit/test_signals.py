"""Confidence signals on every record (trace.signals): the answer line's log-probabilities, self-consistency, the
summariser, the references, the KG, the attributes and the answer's form."""

import math
import re

import pytest

from models.kg.kg_stage import KG_RESULTS
from models.llm.backend import Sample, span_logprobs
from tests.conftest import to_batch
from tests.fakes import ScriptedLLM, by_prompt
from utils.grader_tokens import grader_token_count

REASONING = "I read [1].\n===START===\n## Answer: christopher nolan\n## False Premise: no\n===END==="


def scored(text: str, logprob_of=lambda word: -0.1) -> Sample:
    """`text` as a backend gives it with log-probabilities: one token per word, its leading whitespace included."""
    tokens = re.findall(r"\s*\S+\s*$|\s*\S+", text)
    return Sample(text, tokens=tuple(tokens), token_logprobs=tuple(logprob_of(t.strip()) for t in tokens))


def test_span_logprobs_takes_the_tokens_that_spell_the_span_s_last_occurrence():
    sample = Sample("a b. a b", tokens=("a", " b", ".", " a", " b"), token_logprobs=(-1.0, -2.0, -3.0, -4.0, -5.0))
    assert span_logprobs(sample, "a b") == [-4.0, -5.0]
    assert span_logprobs(sample, "b. a") == [-2.0, -3.0, -4.0]  # partly covered tokens count
    assert span_logprobs(sample, "zzz") == [] and span_logprobs(Sample("a b"), "a") == []  # absent; no tokens


def test_the_answer_line_s_log_probabilities_and_the_retrieval_signals(make_system, sample_examples):
    unsure = {"christopher": -0.2, "nolan": -1.4}
    llm = ScriptedLLM(by_prompt(reasoning=lambda conv: scored(REASONING, lambda w: unsure.get(w, -0.01))))
    system = make_system(llm)
    result = system.answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == ["christopher nolan"]
    (record,) = result.trace
    signals = record["signals"]
    assert signals["reasoning.answer_logprob_mean"] == pytest.approx((-0.2 - 1.4) / 2)
    assert signals["reasoning.answer_logprob_min"] == pytest.approx(-1.4)
    assert signals["reasoning.summariser"] is False and "reasoning.agreement" not in signals  # samples: 0
    assert llm.calls[0][1].logprobs is True
    scores = sorted((r["score"] for r in record["references"]), reverse=True)
    assert signals["references.count"] == len(scores) > 3 and 1 <= signals["references.in_prompt"] <= len(scores)
    assert signals["references.best"] == pytest.approx(scores[0], abs=1e-4)
    assert signals["references.top3_mean"] == pytest.approx(sum(scores[:3]) / 3, abs=1e-4)
    assert (signals["kg.calls"], signals["kg.answered"], signals["kg.lines"]) == (0, 0, 0)
    assert (
        signals["answer.grader_tokens"] == grader_token_count("christopher nolan") > 0
        and signals["answer.route"] == "single"
    )
    assert not signals["answer.number"] and not signals["answer.yes_no"] and not signals["answer.invalid"]
    assert signals["knowledge.agrees"] is None  # the knowledge stage is off in this config


def test_without_log_probabilities_the_signals_are_missing_not_zero(make_system, sample_examples):
    system = make_system(ScriptedLLM(by_prompt(reasoning=REASONING)))
    result = system.answer_batch(to_batch(sample_examples[:1]))
    signals = result.trace[0]["signals"]
    assert signals["reasoning.answer_logprob_mean"] is None and signals["reasoning.answer_logprob_min"] is None


def test_self_consistency_counts_the_samples_that_agree(make_system, sample_examples, cpu_config):
    cpu_config.reasoning.samples = 4
    votes = iter(["christopher nolan", "Christopher Nolan.", "steven spielberg", "<nothing parsable>"])

    def reply(conversation):
        return REASONING if not llm.calls[-1][1].n > 1 else (
            f"===START===\n## Answer: {next(votes)}\n## False Premise: no\n===END===")

    llm = ScriptedLLM(by_prompt(reasoning=reply))
    system = make_system(llm)
    result = system.answer_batch(to_batch(sample_examples[:1]))
    sampled = llm.calls[-1][1]
    assert (sampled.n, sampled.temperature) == (4, cpu_config.reasoning.sample_temperature)
    assert result.trace[0]["signals"]["reasoning.agreement"] == 0.5  # normalised: 2 of 4 agree


def test_the_summariser_s_answer_is_flagged_and_scored(make_system, sample_examples):
    llm = ScriptedLLM(by_prompt(reasoning="no block at all", summariser=lambda conv: scored("Paris\n",
                                                                                            lambda w: math.log(0.5))))
    system = make_system(llm)
    result = system.answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == ["Paris"]
    signals = result.trace[0]["signals"]
    assert signals["reasoning.summariser"] is True
    assert signals["reasoning.answer_logprob_mean"] == pytest.approx(math.log(0.5))


def test_the_summariser_s_answer_gets_its_agreement_from_samples_of_the_summariser(make_system, sample_examples,
                                                                                   cpu_config):
    """A small model rarely writes the reasoning block, so the summariser gives most answers: its self-consistency
    comes from samples of its own prompt."""
    cpu_config.reasoning.samples = 3
    votes = iter(["Paris\n", "paris.\n", "Lyon\n"])
    llm = ScriptedLLM(by_prompt(reasoning="no block at all",
                                summariser=lambda conv: "Paris\n" if llm.calls[-1][1].n == 1 else next(votes)))
    system = make_system(llm)
    result = system.answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == ["Paris"]
    sampled = llm.calls[-1][1]
    assert (sampled.n, sampled.temperature) == (3, cpu_config.reasoning.sample_temperature)
    assert result.trace[0]["signals"]["reasoning.agreement"] == pytest.approx(2 / 3)


def test_support_is_the_share_of_the_answer_s_content_words_in_the_evidence():
    from models.stages.answer import support_signals
    from models.state import QueryState, Reference

    state = QueryState(0, "q", "who directed inception?", "", [], references=[
        Reference("Inception was directed by Christopher Nolan.", "chunk", score=0.4),
        Reference("The film stars Leonardo DiCaprio.", "chunk", score=0.9)])
    state[KG_RESULTS] = ["movie: Inception, director: Christopher Nolan, year: 2010"]

    def support(answer: str) -> tuple:
        state.answer = answer
        found = support_signals(state)
        return found["answer.support_best"], found["answer.support_any"]

    assert support("The film stars Leonardo DiCaprio") == (1.0, 1.0)  # "the" is a stop word, "film" is not
    assert support("Christopher Nolan") == (0.0, 1.0)  # in a reference and the KG, but not in the best one
    assert support("Nolan in 2010") == (0.0, 1.0)  # 2010 only in the KG
    assert support("Steven Spielberg directed it") == (0.0, pytest.approx(1 / 3))  # only "directed" is found
    assert support("i don't know") == (None, None) and support("it was the") == (None, None)
