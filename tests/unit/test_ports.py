"""A stage touches only the QueryState fields it declares: a misspelt field is an error, an undeclared read or write
fails the stage's query (and, through tests/conftest.py `declared_ports`, the test that ran it), and the answer's
evidence reaches it through `Evidence` blocks, not a feature's field name."""

import pytest

from models.kg.kg_stage import KG_RESULTS
from models.stages.evidence import EvidenceCheck
from models.stages.reasoning import ReasoningStage
from models.stages.stage import Batch, Stage, run_alone, run_stage
from models.state import EVIDENCE, PortError, QueryState, StateField, StateFieldError
from tests.fakes import SEED_REPLY, ScriptedLLM
from utils.answers import IDK
from utils.time_budget import Deadline


def state_with_kg() -> QueryState:
    state = QueryState(0, "q1", "who directed inception?", "03/01/2024", [])
    state[KG_RESULTS] = ["movie: Inception, director: Christopher Nolan"]
    return state


def test_a_misspelt_or_unregistered_field_is_an_error():
    state = QueryState(0, "q1", "q", "t", [])
    with pytest.raises(AttributeError, match="kg_reslts"):
        state.kg_reslts = []  # type: ignore[attr-defined]
    with pytest.raises(StateFieldError, match="'stray' is not registered"):
        state[StateField[list[str]]("stray", list)]


class ReadsDomain(Stage):
    name = "reads_domain"
    writes = frozenset({"llm_output"})

    def run(self, states, ctx):
        for state in states:
            state.llm_output = state.domain


@pytest.mark.undeclared
def test_an_undeclared_read_is_refused_and_costs_the_query_its_answer(cpu_config):
    with pytest.raises(PortError, match="stage 'reads_domain' reads QueryState field 'domain' without declaring it"):
        run_alone(ReadsDomain(), [QueryState(0, "q1", "q", "t", [])], cpu_config, {})
    state = QueryState(0, "q1", "q", "t", [])
    run_stage(ReadsDomain(), [state], Batch(cpu_config, Deadline(60), None, {}))
    assert state.answer == IDK
    assert "PortError: stage 'reads_domain' reads QueryState field 'domain'" in state.done_reason
    assert type(state) is QueryState  # the guard is gone with the stage


@pytest.mark.undeclared
def test_an_undeclared_write_is_refused(cpu_config):
    class WritesDomain(Stage):
        name = "writes_domain"

        def run(self, states, ctx):
            states[0].domain = "movie"

    with pytest.raises(PortError, match="stage 'writes_domain' writes QueryState field 'domain'"):
        run_alone(WritesDomain(), [QueryState(0, "q1", "q", "t", [])], cpu_config, {})


@pytest.mark.undeclared
def test_the_reasoning_stage_as_it_declared_its_reads_before_is_refused(cpu_config):
    # It declared only the references while its prompt read the KG's rows, the calculations and the knowledge
    # extractor's answer by name; reading them as evidence now needs `evidence` declared.
    class DeclaredBefore(ReasoningStage):
        may_read = frozenset()

    with pytest.raises(PortError, match="stage 'reasoning' reads QueryState field 'evidence' without declaring it"):
        run_alone(DeclaredBefore(), [state_with_kg()], cpu_config, {"llm": ScriptedLLM(), "r2former": None})
    assert EVIDENCE in ReasoningStage.may_read


def test_evidence_reaches_the_reasoning_prompt_and_the_checks_by_its_declaration(cpu_config):
    llm = ScriptedLLM(lambda c: SEED_REPLY)
    kept = state_with_kg()  # no reference, but the KG's rows: the evidence check lets it through
    run_alone(EvidenceCheck(), [kept], cpu_config, {})
    assert not kept.done
    run_alone(ReasoningStage(), [kept], cpu_config, {"llm": llm, "r2former": None})
    (sent,), _ = llm.calls[0]
    assert "### Knowledge graph\n- movie: Inception, director: Christopher Nolan" in sent[1]["content"]
    bare = QueryState(0, "q2", "q", "t", [])
    run_alone(EvidenceCheck(), [bare], cpu_config, {})
    assert bare.answer == IDK
