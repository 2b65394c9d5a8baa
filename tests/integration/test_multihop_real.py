"""HANRAG and DualRAG with the real embedded SmolLM2 and MiniLM: whatever the model writes, every query is answered."""

import pytest

from models.system import CragSystem
from tests.conftest import to_batch
from tests.integration.conftest import unhurried


@pytest.mark.parametrize("strategy", ["hanrag", "dualrag"])
def test_multi_hop_strategies_answer_every_query(strategy, cpu_config, sample_examples, hf_llm, embedder):
    unhurried(cpu_config).strategy = strategy  # every step the strategy takes, however busy the machine
    dualrag, hanrag = cpu_config.section("dualrag"), cpu_config.section("hanrag")
    dualrag.max_iter, dualrag.max_tokens, hanrag.max_steps = 2, 48, 2
    system = CragSystem(cpu_config, llm=hf_llm, embedder=embedder)
    try:
        result = system.answer_batch(to_batch(sample_examples[4:6]))
        answers = result.answers  # multi-hop and post-processing
    finally:
        system.close()
    assert len(answers) == 2 and all(isinstance(a, str) and a for a in answers)
    for trace in result.trace:
        assert trace["route"] and trace["steps"] >= 1
        assert [r["status"] for r in trace["stages"] if r["stage"] == strategy] == ["ok"]
