"""Offline prompt tuning: upstream stages run once and are cached; each variant re-runs only downstream."""

import json

from evaluation.verdicts import CORRECT, MISS, UNJUDGED, WRONG
from models.config import REPO_ROOT
from tests.conftest import SAMPLE
from tests.fakes import ScriptedLLM, by_prompt, prompt_name
from tools.tune_prompts import cross_validated, main
from utils.cache import CACHE_ENV


def calls_of(llm, name):
    return sum(1 for conversations, _ in llm.calls if prompt_name(conversations[0]) == name)


def test_variants_share_cached_upstream_results(make_system, cpu_config, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    cpu_config.knowledge.enabled = True
    cpu_config.calculator.enabled = True
    baseline = REPO_ROOT / "prompts" / "reasoning.yaml"
    variant = tmp_path / "reasoning_nolan.yaml"
    variant.write_text(baseline.read_text().replace("Think step by step, then give a short answer.",
                                                    "Think step by step, then give a short answer. VARIANT-B"))

    def reasoning(conversation):
        answer = "christopher nolan" if "VARIANT-B" in conversation[0]["content"] else "paris"
        return f"===START===\n## Answer: {answer}\n## False Premise: no\n===END==="

    llm = ScriptedLLM(by_prompt(reasoning=reasoning, calculator="```python\n1 + 1\n```"))
    system = make_system(llm)
    args = ["--prompt", "reasoning", "--variant", str(baseline), "--variant", str(variant), "--data", str(SAMPLE),
            "--limit", "12", "--out", str(tmp_path / "out")]
    assert main(args, system=system) == 0
    batches = 3  # the first 12 questions, batch size 4
    assert calls_of(llm, "knowledge") == batches and calls_of(llm, "calculator") == batches
    assert calls_of(llm, "reasoning") == 2 * batches  # once per variant
    saved = json.loads((tmp_path / "out" / "tuning.json").read_text())
    rows = saved["variants"]
    assert rows["reasoning.yaml"]["overall"]["accuracy"] == 0.0
    assert rows["reasoning_nolan.yaml"]["overall"]["accuracy"] == 1 / 12  # the inception question
    table = capsys.readouterr().out
    assert "| reasoning_nolan.yaml | overall | 12 | -0.833 | +0.167 |" in table  # one wrong answer made right
    (flip,) = saved["against_first"]["reasoning_nolan.yaml"]["flipped"]["wrong -> correct"]  # compare's reading
    assert (flip["a"], flip["b"]) == ("paris", "christopher nolan") and "wrong -> correct: 1" in table
    assert (tmp_path / "out" / "tuning.png").stat().st_size > 1000

    assert main(args, system=system) == 0  # a second run: upstream comes from the cache
    assert calls_of(llm, "knowledge") == batches and calls_of(llm, "calculator") == batches
    assert calls_of(llm, "reasoning") == 4 * batches


def test_a_setting_only_the_tuned_stages_read_answers_from_the_same_cache(make_system, cpu_config, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    cpu_config.knowledge.enabled = True
    args = ["--prompt", "reasoning", "--variant", "prompts/reasoning.yaml", "--data", str(SAMPLE), "--limit", "4",
            "--out", str(tmp_path / "out")]

    def knowledge_calls_of_a_run() -> int:
        llm = ScriptedLLM(by_prompt(reasoning="## Answer: paris"))
        assert main(args, system=make_system(llm)) == 0
        return calls_of(llm, "knowledge")

    assert knowledge_calls_of_a_run() == 1
    cpu_config.reasoning.summariser_max_tokens = 7  # the reasoning stage's section: downstream only
    assert knowledge_calls_of_a_run() == 0
    cpu_config.references.top_k = 3  # read by an upstream stage: its results are computed again
    assert knowledge_calls_of_a_run() == 1


def test_prompt_no_stage_uses_is_a_one_line_error(make_system, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    args = ["--prompt", "judge", "--variant", "prompts/judge.yaml", "--data", str(SAMPLE), "--out", str(tmp_path)]
    assert main(args, system=make_system()) == 2
    assert "no stage of strategy hybrid uses it" in capsys.readouterr().err
    assert main(["--variant", "nope.yaml", "--data", str(SAMPLE)], system=make_system()) == 2
    assert "--variant nope.yaml: no such prompt file" in capsys.readouterr().err


def test_grid_makes_every_combination(make_system, cpu_config, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    grid = tmp_path / "grid.yaml"
    grid.write_text('prompt: reasoning\nbase: prompts/reasoning.yaml\nreplace:\n'
                    '  "Think step by step, then give a short answer.": ["VARIANT-B", "Answer at once."]\n'
                    '  "5. The answer is as short as possible": "5. One phrase"\n')
    llm = ScriptedLLM(by_prompt(reasoning=lambda c: "## Answer: christopher nolan" if "VARIANT-B" in c[0]["content"]
                                else "## Answer: paris"))
    assert (
        main(["--grid", str(grid), "--data", str(SAMPLE), "--out", str(tmp_path / "out")], system=make_system(llm)) == 0
    )
    variants = sorted((tmp_path / "out" / "variants").glob("*.yaml"))
    assert len(variants) == 3 * 2  # (base, 2 alternatives) x (base, 1 alternative)
    rows = json.loads((tmp_path / "out" / "tuning.json").read_text())["variants"]
    assert len(rows) == 6 and rows["reasoning_v0.yaml"]["overall"]["accuracy"] == 0.0
    assert sum(r["overall"]["accuracy"] > 0 for r in rows.values()) == 2  # the two combinations with VARIANT-B


def test_bad_grid_is_a_one_line_error(make_system, tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text('prompt: reasoning\nbase: prompts/reasoning.yaml\nreplace:\n  "not in the file": ["x"]\n')
    assert main(["--grid", str(grid), "--data", str(SAMPLE), "--out", str(tmp_path)], system=make_system()) == 2
    assert "does not occur in prompts/reasoning.yaml" in capsys.readouterr().err


def test_a_setting_is_a_variant_and_the_choice_is_measured_on_held_out_folds(make_system, cpu_config, tmp_path,
                                                                               monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    llm = ScriptedLLM(by_prompt(reasoning="no block here", summariser="christopher nolan"))
    system = make_system(llm)
    shipped = system.config.reasoning.summariser_max_tokens
    args = ["--variant", "prompts/reasoning.yaml", "--setting", "reasoning.summariser_max_tokens=0", "--folds", "2",
            "--data", str(SAMPLE), "--limit", "8", "--out", str(tmp_path / "out"),
            "--set", "reasoning.max_tokens=96"]  # as cpu_config: the reasoning prompt on, so the summariser may go
    assert main(args, system=system) == 0
    saved = json.loads((tmp_path / "out" / "tuning.json").read_text())
    assert saved["verdicts"]["reasoning.summariser_max_tokens=0"] == [MISS] * 8  # the summariser off: all declined
    assert calls_of(llm, "summariser") == 2  # the baseline's two batches only
    assert saved["cross_validated"]["folds"] == 2 and "cross-validated over 2 folds" in capsys.readouterr().out
    assert system.config.reasoning.summariser_max_tokens == shipped > 0  # the system's own config is left as it was

    upstream = ["--variant", "prompts/reasoning.yaml", "--setting", "references.max_pages=2", "--data", str(SAMPLE),
                "--limit", "4", "--out", str(tmp_path / "o2")]
    assert main(upstream, system=system) == 2
    assert "--setting references.max_pages: only a section of the stages from reasoning on" in capsys.readouterr().err


def test_cross_validation_chooses_on_the_other_folds():
    folds = [0, 0, 1, 1]
    # B wins fold 0's questions, A wins fold 1's: chosen on the other fold, each fold gets the loser
    verdicts = {"A": [WRONG, WRONG, CORRECT, CORRECT], "B": [CORRECT, CORRECT, WRONG, WRONG]}
    result = cross_validated(verdicts, folds)
    assert result["chosen_per_fold"] == ["A", "B"]
    assert result["held_out"]["score_b"] == -1.0 and result["held_out"]["difference"] == -1.0
    assert result["chosen_on_all"] == "A"  # a tie over every question: the first variant

    silence = {"A": [MISS] * 4, "B": [CORRECT, WRONG, WRONG, CORRECT]}
    assert cross_validated(silence, folds)["chosen_on_all"] == "A"  # by the score, silence wins
    by_right = cross_validated(silence, folds, "right")
    assert by_right["chosen_per_fold"] == ["B", "B"]
    assert (by_right["held_out_right"], by_right["held_out_wrong"]) == (2, 2)

    unjudged = {"A": [UNJUDGED, MISS, MISS, MISS], "B": [CORRECT, UNJUDGED, CORRECT, MISS]}
    result = cross_validated(unjudged, folds)
    assert result["chosen_per_fold"] == ["B", "B"] and result["held_out"]["questions"] == 2


def test_reasoning_variants_with_the_reasoning_prompt_off_are_refused(make_system, cpu_config, tmp_path, capsys):
    cpu_config.reasoning.max_tokens = 0  # as configs/cpu.yaml ships it
    args = ["--variant", "prompts/reasoning.yaml", "--variant", "prompts/variants/reasoning_one_line.yaml",
            "--data", str(SAMPLE), "--out", str(tmp_path)]
    assert main(args, system=make_system()) == 2
    assert "reasoning.max_tokens is 0, so the reasoning prompt is never sent" in capsys.readouterr().err
