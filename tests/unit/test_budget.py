import pytest

from models.kg.kg_stage import KGStage
from models.loading import load_config
from models.prompting import PromptLibrary
from models.stages.calculator import CalculatorStage
from models.stages.reasoning import ReasoningStage
from models.stages.stage import Batch, Stage, run_stage
from models.state import QueryState
from tests.conftest import write
from tests.fakes import HashEmbedder, ScriptedLLM
from utils.time_budget import Deadline


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_deadline_counts_down_and_reserves():
    clock = Clock()
    deadline = Deadline.for_batch(4, per_query_s=30, safety_margin_s=2, clock=clock)
    assert deadline.remaining() == 118
    clock.now += 100
    assert deadline.remaining() == 18 and deadline.can_afford(18) and not deadline.can_afford(18.5)
    assert deadline.reserve(10).remaining() == 8
    clock.now += 50
    assert deadline.expired() and deadline.remaining() == 0.0


class Recorder(Stage):
    name = "reasoning"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[str] = []

    def run(self, states, ctx):
        self.seen.extend(s.interaction_id for s in states)
        if self.fail:
            raise RuntimeError("boom")
        for state in states:
            state.answer = "x"


def _states(n: int) -> list[QueryState]:
    return [QueryState(i, f"id{i}", "q?", "", []) for i in range(n)]


def _ctx(cpu_config, deadline):
    return Batch(cpu_config, deadline, PromptLibrary(), {"llm": ScriptedLLM(), "embedder": HashEmbedder()})


def test_stage_skipped_when_deadline_cannot_afford_it(cpu_config):
    clock = Clock()
    deadline = Deadline(0.4, clock)  # reasoning needs 1.0 s + 0.5 s answer reserve
    states, stage = _states(2), Recorder()
    run_stage(stage, states, _ctx(cpu_config, deadline))
    assert stage.seen == []
    assert [s.trace[-1].status for s in states] == ["skipped", "skipped"]
    assert [s.deadline_cuts for s in states] == [["reasoning: skipped"]] * 2
    assert all(s.answer is None for s in states)


def test_stage_runs_only_on_open_queries(cpu_config):
    states, stage = _states(3), Recorder()
    states[1].finish("i don't know", "earlier reason")
    run_stage(stage, states, _ctx(cpu_config, Deadline(60)))
    assert stage.seen == ["id0", "id2"]
    assert states[1].answer == "i don't know" and states[1].trace == []


def test_crashing_stage_answers_idk_and_is_traced(cpu_config):
    states, stage = _states(2), Recorder(fail=True)
    run_stage(stage, states, _ctx(cpu_config, Deadline(60)))
    assert all(s.done and s.answer == "i don't know" for s in states)
    assert all(s.trace[-1].status == "failed" and "boom" in s.trace[-1].note for s in states)


def test_always_stage_runs_even_when_expired(cpu_config):
    states, stage = _states(1), Recorder()
    run_stage(stage, states, _ctx(cpu_config, Deadline(0)), always=True)
    assert stage.seen == ["id0"]


def test_optional_stages_work_at_most_their_share_of_the_batch(cpu_config):
    clock = Clock()
    deadline = Deadline(100.0, clock)
    batch = _ctx(cpu_config, deadline)
    cpu_config.budget.stage_share = {"calculator": 0.25}
    calculator, reasoning = batch.context(CalculatorStage()), batch.context(ReasoningStage())
    assert calculator.work_deadline().remaining() == 25.0
    assert reasoning.work_deadline().remaining() == 100.0 - cpu_config.budget.answer_reserve_s
    clock.now += 90.0  # near the end, the batch deadline comes first
    assert calculator.work_deadline().remaining() == 10.0 - cpu_config.budget.answer_reserve_s


def test_a_config_without_a_budget_section_still_caps_the_kg_stage(tmp_path):
    config = load_config(write(tmp_path / "c.yaml", "task: 2\n"))  # no `budget:`: its defaults
    clock = Clock()
    deadline = Deadline.for_batch(4, config.budget.per_query_s, config.budget.safety_margin_s, clock)
    batch = Batch(config, deadline, PromptLibrary(), {})
    kg = batch.context(KGStage()).work_deadline()
    assert kg.remaining() == pytest.approx(0.2 * deadline.total)  # the shipped configs' share
    assert batch.context(ReasoningStage()).work_deadline().remaining() > 4 * kg.remaining()
