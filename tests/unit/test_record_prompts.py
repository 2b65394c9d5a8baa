"""record_prompts: every LLM conversation of a query and its replies in its record, in call order; off by default,
changing no answer and no part of the run manifest's "what changes answers"."""

import json
import re
from dataclasses import replace

import pytest

from evaluation import manifest
from models.config import REPO_ROOT
from models.llm.backend import Sample
from models.loading import load_config
from models.prompting import PromptLibrary
from models.stages.knowledge import KnowledgeStage
from models.stages.stage import Batch
from tests.conftest import SAMPLE, to_batch
from tests.fakes import SEED_REPLY, RecordingKG, ScriptedLLM, by_prompt, prompt_name
from utils.time_budget import Deadline
from utils.trees import differences

# Each test query carries "qid-<i>", and every prompt made for it (its sub-questions included) shows the mark, so
# the test tells whose conversation the fake LLM was sent without asking the code under test.
_MARK = re.compile(r"qid-(\d+)")
# HANRAG's router sends query i down ROUTES[i]: the first two to the multi-hop method, the others on through the
# hybrid strategy's knowledge, calculator and reasoning stages.
ROUTES = ("compound", "complex", "single-step", "straightforward")


class ServedLLM(ScriptedLLM):
    """A scripted LLM that also keeps what it answered, call by call."""

    def __init__(self, reply) -> None:
        super().__init__(reply)
        self.served: list[list[list[Sample]]] = []

    def generate(self, conversations, params):
        outputs = super().generate(conversations, params)
        self.served.append(outputs)
        return outputs


def owner(conversation) -> int:
    """The test query a conversation was made for: the one mark in its text."""
    marks = set(_MARK.findall(" ".join(message["content"] for message in conversation)))
    assert len(marks) == 1, f"{prompt_name(conversation)} shows marks {marks}"
    return int(marks.pop())


def replies():
    """Replies that take each marked query through its route, with the summariser answering query 2 (its
    reasoning output has no answer)."""
    def route(conversation):
        return ROUTES[owner(conversation)]

    def reasoning(conversation):
        return "no answer here" if owner(conversation) == 2 else SEED_REPLY

    def dualrag_reason(conversation):
        done = "NOTE" in conversation[1]["content"]
        return f'{{"thought": "thinking", "need_retrieve": {"false" if done else "true"}}}'

    return by_prompt(
        attributes="domain: movie\ndynamism: static",
        kg_entities='{"domain": "movie", "entities": {"movie_name": "inception"}}',
        hanrag_router=route,
        hanrag_decompose=lambda c: f'["first part of qid-{owner(c)}?", "second part of qid-{owner(c)}?"]',
        hanrag_relevance="yes",
        hanrag_refine=lambda c: f'{{"question": "which step comes first for qid-{owner(c)}?"}}',
        hanrag_check='{"answerable": true}',
        reasoning=reasoning,
        summariser="paris",
        dualrag_reason=dualrag_reason,
        dualrag_entities='{"entities": [{"entity": "Christopher Nolan", "keywords": ["film"]}]}',
        dualrag_summarise="NOTE: Nolan directed it.",
    )


def hybrid(cpu_config, multihop: str, record: bool):
    """cpu_config with every LLM stage of the hybrid strategy on: ICL attributes, the KG (task 2), the multi-hop
    hand-off, knowledge, calculator and reasoning."""
    cpu_config.task = 2
    cpu_config.attributes.method = "icl"
    cpu_config.knowledge.enabled = True
    cpu_config.calculator.enabled = True
    cpu_config.multihop = multihop
    cpu_config.record_prompts = record


def marked_batch(sample_examples):
    batch = to_batch(sample_examples[:len(ROUTES)])
    batch["query"] = [f"{query} (qid-{i})" for i, query in enumerate(batch["query"])]
    return batch


def run(make_system, cpu_config, sample_examples, multihop, record):
    hybrid(cpu_config, multihop, record)
    llm = ServedLLM(replies())
    system = make_system(llm, kg=RecordingKG({}))
    result = system.answer_batch(marked_batch(sample_examples))
    answers = result.answers
    return llm, answers, result.trace


@pytest.mark.parametrize("multihop", ["hanrag", "dualrag"])
def test_each_query_records_the_prompts_it_was_sent_in_order(make_system, cpu_config, sample_examples, multihop):
    llm, _, traces = run(make_system, cpu_config, sample_examples, multihop, record=True)
    sent = [(conversation, samples) for conversations, outputs in zip((c for c, _ in llm.calls), llm.served)
            for conversation, samples in zip(conversations, outputs)]
    for i, trace in enumerate(traces):
        expected = [{"prompt": prompt_name(c), "messages": list(c), "replies": [s.text for s in samples]}
                    for c, samples in sent if owner(c) == i]
        recorded = [{key: entry[key] for key in ("prompt", "messages", "replies")} for entry in trace["prompts"]]
        assert recorded == expected
        assert json.loads(json.dumps(trace)) == trace  # as predictions.jsonl keeps it
        ran = {record["stage"] for record in trace["stages"] if record["status"] == "ok"}
        assert {entry["stage"] for entry in trace["prompts"]} <= ran
    names = {prompt_name(c) for c, _ in sent}
    assert {"attributes", "kg_entities", "hanrag_router", "knowledge", "calculator", "reasoning", "summariser"} <= names
    if multihop == "hanrag":
        assert {"hanrag_decompose", "hanrag_relevance", "hanrag_refine", "hanrag_check", "hanrag_aggregate"} <= names
    else:
        assert {"dualrag_reason", "dualrag_entities", "dualrag_summarise", "dualrag_answer"} <= names
    last = traces[2]["prompts"][-1]
    assert (last["stage"], last["prompt"], last["replies"]) == ("reasoning", "summariser", ["paris"])


def test_off_by_default_and_the_same_answers_either_way(make_system, cpu_config, sample_examples):
    assert load_config(REPO_ROOT / "configs" / "cpu.yaml").record_prompts is False
    off_llm, off_answers, off_traces = run(make_system, cpu_config, sample_examples, "hanrag", record=False)
    on_llm, on_answers, on_traces = run(make_system, cpu_config, sample_examples, "hanrag", record=True)
    assert all("prompts" not in trace for trace in off_traces)
    assert all(trace["prompts"] for trace in on_traces)
    assert on_answers == off_answers
    assert [[list(c) for c in calls] for calls, _ in on_llm.calls] == [[list(c) for c in calls]
                                                                      for calls, _ in off_llm.calls]

    def comparable(trace):  # the seconds a stage took differ between runs
        return ({key: value for key, value in trace.items() if key not in ("stages", "prompts")},
                [(r["stage"], r["status"], r["note"]) for r in trace["stages"]])

    assert [comparable(t) for t in on_traces] == [comparable(t) for t in off_traces]
    assert all(trace["steps"] > 0 for trace in on_traces[:2])  # the multi-hop queries counted their steps


def test_a_generate_call_names_one_owner_per_conversation(cpu_config):
    batch = Batch(cpu_config, Deadline(60), PromptLibrary(), {"llm": ScriptedLLM()})
    ctx = batch.context(KnowledgeStage())
    conversation = ctx.prompt("knowledge").render(query="q", query_time="t")
    with pytest.raises(ValueError, match="0 owners for 1 conversations"):
        ctx.generate([conversation], owners=[], max_tokens=4)


def test_recording_prompts_is_not_part_of_what_changes_answers():
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    off = manifest.answer_inputs(config, SAMPLE, 30.0, False)
    on = manifest.answer_inputs(replace(config, record_prompts=True), SAMPLE, 30.0, False)
    assert differences(off, on) == [] and "record_prompts" not in on["config"]
    other = manifest.answer_inputs(replace(config, batch_size=2), SAMPLE, 30.0, False)
    assert differences(off, other) == ["config.batch_size (4 -> 2)"]
    assert load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=["record_prompts=true"]).record_prompts is True
