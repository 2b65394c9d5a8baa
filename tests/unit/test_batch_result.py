"""utils/batch.py's answer_batch: the typed result the harness reads is the grader's answers, with the trace where
the model's batch_generate_answer answers through answer_batch."""

from utils.batch import BatchResult, answer_batch

BATCH = {"interaction_id": ["q1", "q2"], "query": ["a", "b"], "search_results": [[], []], "query_time": ["", ""]}


class Traced:
    """As models.system.CragSystem: batch_generate_answer returns answer_batch's answers."""

    def batch_generate_answer(self, batch):
        return self.answer_batch(batch).answers

    def answer_batch(self, batch):
        return BatchResult([f"answer {q}" for q in batch["query"]], [{"interaction_id": i} for i in
                                                                      batch["interaction_id"]])


class OverridesAnswers(Traced):
    """A competitor's subclass that post-processes the answers the grader gets."""

    def batch_generate_answer(self, batch):
        return [answer.upper() for answer in super().batch_generate_answer(batch)]


class OverridesResult(Traced):
    def answer_batch(self, batch):
        result = super().answer_batch(batch)
        return BatchResult([answer.upper() for answer in result.answers], result.trace)


class Plain:
    def batch_generate_answer(self, batch):
        return ["x"] * len(batch["query"])


def test_a_traced_model_gives_its_answers_and_trace():
    result = answer_batch(Traced(), BATCH)
    assert result.answers == ["answer a", "answer b"] and [t["interaction_id"] for t in result.trace] == ["q1", "q2"]


def test_the_harness_reads_the_answers_the_grader_would_get():
    # batch_generate_answer overridden below answer_batch: asked as the grader asks, without a trace
    assert answer_batch(OverridesAnswers(), BATCH) == BatchResult(["ANSWER A", "ANSWER B"], [])
    # answer_batch overridden: batch_generate_answer still answers through it, so the trace stays
    result = answer_batch(OverridesResult(), BATCH)
    assert result.answers == OverridesResult().batch_generate_answer(BATCH) == ["ANSWER A", "ANSWER B"]
    assert len(result.trace) == 2


def test_a_model_without_answer_batch_has_no_trace():
    assert answer_batch(Plain(), BATCH) == BatchResult(["x", "x"], [])
