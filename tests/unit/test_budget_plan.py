"""The budget planner's arithmetic."""

import pytest

from models.budget_planner import Speed, StagePlan, format_plan, largest_fitting_batch, llm_stages, plan
from models.config import REPO_ROOT
from models.loading import load_config
from tools.budget_plan import main


@pytest.fixture
def config():
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    config.budget.per_query_s, config.budget.safety_margin_s = 10.0, 2.0
    return config


def test_stage_seconds_are_prefill_plus_decode_steps():
    stage = StagePlan("reasoning", prompt_tokens=1000, generated_tokens=100, sequences=1)
    speed = Speed(prefill_tps=2000.0, step_s=0.05, pages_s=0.5)
    assert stage.seconds(1, speed) == pytest.approx(0.5 + 5.0)
    assert stage.seconds(4, speed) == pytest.approx(2.0 + 5.0)  # prefill grows with the batch, decode steps do not


def test_plan_adds_pages_and_stages_against_the_batch_limit(config):
    stages = [StagePlan("a", 1000, 100, 1), StagePlan("b", 0, 40, 2)]
    speed = Speed(prefill_tps=1000.0, step_s=0.1, pages_s=1.0)
    result = plan(config, speed, 2, stages)
    assert result.rows == [("pages+embedding", 2.0), ("a", pytest.approx(12.0)), ("b", pytest.approx(4.0))]
    assert result.total_s == pytest.approx(18.0) and result.limit_s == 18.0 and result.fits
    assert not plan(config, Speed(1000.0, 0.1001, 1.0), 2, stages).fits
    assert result.per_query_s == pytest.approx(9.0)


def test_larger_batches_share_the_decode_steps(config):
    # per query: fixed decode time / B shrinks as B grows; prefill and pages stay per query
    slow = Speed(prefill_tps=1e9, step_s=0.03, pages_s=0.1)
    best = largest_fitting_batch(config, slow)
    assert best is not None and plan(config, slow, best).fits
    assert best == 16 or not plan(config, slow, best + 1).fits
    assert largest_fitting_batch(config, Speed(1.0, 10.0, 100.0)) is None


def test_stages_follow_the_config(config):
    names = [s.stage for s in llm_stages(config)]
    # cpu.yaml: task 2 with the KG by question spans (no LLM call), svm, no knowledge, no calculator, no reasoning
    assert names == ["summariser"]
    config.reasoning.max_tokens = 96
    assert [s.stage for s in llm_stages(config)] == ["reasoning", "summariser"]
    config.section("kg").method = "rules"
    assert [s.stage for s in llm_stages(config)] == ["kg", "reasoning", "summariser"]
    config.task, config.calculator.enabled, config.attributes.method = 1, True, "icl"
    stages = {s.stage: s for s in llm_stages(config)}
    assert list(stages) == ["attributes", "calculator", "reasoning", "summariser"]
    assert stages["attributes"].sequences == config.attributes.icl.n
    assert stages["calculator"].sequences == config.calculator.n
    assert llm_stages(config)[-2].prompt_tokens == 2048  # SmolLM2's profile cuts every prompt there
    config.llm.profile = "configs/models/llama3.1-8b-instruct-w4a16.yaml"  # a longer limit: the references count
    wide = llm_stages(config)[-2].prompt_tokens
    config.reasoning.max_reference_chars += 4000
    assert llm_stages(config)[-2].prompt_tokens == wide + 1000 < 7680  # 4 characters a token


def test_table_and_cli(config, capsys, tmp_path):
    text = format_plan(config, Speed(2000.0, 0.02, 0.5), 4)
    assert "summariser" in text and "largest batch that fits" in text and "total" in text
    assert main(["--prefill-tps", "2000", "--step-ms", "20"]) == 0
    assert main(["--prefill-tps", "2000", "--step-ms", "20000"]) == 1  # does not fit
    assert main(["--prefill-tps", "0", "--step-ms", "20"]) == 2
    assert "error:" in capsys.readouterr().err
