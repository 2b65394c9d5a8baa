"""`local_evaluation.py ablate` (evaluation/ablation.py): rows answered over the stage cache, judged alike, set side
by side. The scripted LLM answers the summariser from what the knowledge extractor said, so switching the extractor
on or off moves the score; counting proxies stand for the page workers and the embedder."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

import local_evaluation
from evaluation import ablation as ablation_module
from evaluation.ablation import ablate, cache_points
from evaluation.ablation_rows import build_variants, parse_variant
from evaluation.choices import ConfigChoice
from evaluation.compare_command import compare
from models.config import REPO_ROOT, ConfigError
from models.loading import load_config
from tests.conftest import write_config
from tests.fakes import SEED_REPLY, HashEmbedder, ScriptedLLM, by_prompt, prompt_name
from utils.cache import CACHE_ENV
from utils.web_pages import PageProcessor, PageSettings

QUESTIONS = 12
ICL = REPO_ROOT / "configs" / "overlays" / "attributes-icl.yaml"
KNOWN = "known to me"


def example(i: int) -> dict[str, Any]:
    page = f"<html><body><h1>Item {i}</h1><p>The code of item {i} is c{i}. It was made in {1990 + i}.</p></body></html>"
    return {"interaction_id": f"q{i:02d}", "query": f"what is the code of item {i}?", "query_time": "03/01/2024",
            "answer": f"c{i}", "alt_answers": [], "domain": ["movie", "music"][i % 2],
            "question_type": ["simple", "comparison"][i % 2], "static_or_dynamic": "static",
            "search_results": [{"page_name": f"Item {i}", "page_url": f"https://example.org/{i}",
                                "page_snippet": f"item {i}", "page_result": page, "page_last_modified": ""}]}


class Counting:
    """`inner` with a count of the calls of each method that does work (`process` of the page workers, `encode` of
    the embedder)."""

    def __init__(self, inner: Any, *methods: str) -> None:
        self._inner, self.calls = inner, dict.fromkeys(methods, 0)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name not in self.calls:
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return value(*args, **kwargs)
        return counted


def reason(conversation) -> str:
    """The reasoning prompt's reply: the code where the knowledge extractor's answer reached the prompt (a wrong one
    for every third item), else "i don't know"."""
    text = " ".join(str(m["content"]) for m in conversation)
    item = int(text.split("code of item ")[-1].split("?")[0])
    answer = ("c999" if item % 3 == 0 else f"c{item}") if KNOWN in text.lower() else "i don't know"
    return SEED_REPLY.replace("paris", answer)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """The data, a config (the icl attributes and the knowledge extractor call the LLM before the reasoning prompt,
    which shows the extractor's answer) and the fakes every row uses."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(example(i)) + "\n" for i in range(QUESTIONS)), encoding="utf-8")
    config = write_config(tmp_path / "config.yaml", {"task": 1, "knowledge": {"enabled": True},
                                                     "reasoning": {"max_tokens": 96},
                                                     "references": {"workers": 1, "cache_dir": str(tmp_path / "c")}})
    llm = ScriptedLLM(by_prompt(reasoning=reason, knowledge=SEED_REPLY.replace("paris", KNOWN)))
    settings = PageSettings.from_config(load_config(config).references)
    fakes = {"llm": llm, "embedder": Counting(HashEmbedder(), "encode"),
             "pages": Counting(PageProcessor(settings, 0, None), "process")}
    return data, ConfigChoice(config, (ICL,)), fakes


def run(setup, tmp_path, *variants: str, incremental: bool = False, out: str = "ablation",
        by: tuple[str, ...] = ()) -> dict[str, Any]:
    data, config, fakes = setup
    assert ablate(config, data, list(variants), incremental, out=tmp_path / out, by=by, given=fakes) == 0
    return json.loads((tmp_path / out / "ablation.json").read_text())


def test_a_row_that_changes_the_last_stage_runs_no_stage_before_it(setup, tmp_path, monkeypatch):
    """The full row calls the LLM for the attributes, the knowledge extractor and the reasoning prompt; the row that
    changes only the reasoning prompt's budget makes no call but its own, parses no page and embeds nothing."""
    _, _, fakes = setup
    llm, embedder, pages = fakes["llm"], fakes["embedder"], fakes["pages"]
    seen: list[dict[str, Any]] = []
    answer_row = ablation_module.answer_row

    def counted(system, *args, **kwargs):
        before = {"llm": len(llm.calls), "encode": embedder.calls["encode"], "process": pages.calls["process"]}
        records = answer_row(system, *args, **kwargs)
        prompts = {prompt_name(c) for conversations, _ in llm.calls[before["llm"]:] for c in conversations}
        seen.append({"prompts": prompts, "encode": embedder.calls["encode"] - before["encode"],
                     "process": pages.calls["process"] - before["process"]})
        return records

    monkeypatch.setattr(ablation_module, "answer_row", counted)
    table = run(setup, tmp_path, "budget: reasoning.max_tokens=128")
    full, budget = seen
    assert {"attributes", "knowledge", "reasoning"} <= full["prompts"] and full["encode"] and full["process"]
    assert budget == {"prompts": {"reasoning"}, "encode": 0, "process": 0}
    calls = [row["llm_calls_per_question"] for row in table["rows"]]
    assert calls[0] == calls[1] > 2  # the row's cost counts its cached stages' calls too


def test_a_killed_ablation_resumes_and_answers_no_finished_row_again(setup, tmp_path, monkeypatch):
    answered: list[str] = []
    answer_row = ablation_module.answer_row

    def killed_at_the_third(system, *args, **kwargs):
        answered.append(args[4])  # its label
        if len(answered) == 3:
            raise KeyboardInterrupt
        return answer_row(system, *args, **kwargs)

    monkeypatch.setattr(ablation_module, "answer_row", killed_at_the_third)
    variants = ("no knowledge: -knowledge", "budget: reasoning.max_tokens=128")
    with pytest.raises(KeyboardInterrupt):
        run(setup, tmp_path, *variants)
    manifest = json.loads((tmp_path / "ablation" / "ablation-manifest.json").read_text())
    assert [row["name"] for row in manifest["rows"]] == ["full system", "no knowledge", "budget"]
    assert manifest["rows"][2]["sets"] == ["reasoning.max_tokens=128"] and manifest["rows"][2]["config"]
    said = local_evaluation.saved_after_interrupt(local_evaluation.parse_args(
        ["ablate", "--out", str(tmp_path / "ablation")]), [])
    assert said.startswith("2 answered rows are kept in")
    answered.clear()
    finished = []  # each stamped at a time no rerun can give, so a stamp written again shows
    for path in (tmp_path / "ablation" / "rows").glob("*/manifest.json"):
        if (written := json.loads(path.read_text()))["finished"]:
            path.write_text(json.dumps(written | {"finished": "2000-01-01T00:00:00+00:00"}))
            finished.append(path)
    table = run(setup, tmp_path, *variants)
    assert len(answered) == 1 and "budget" in answered[0]  # the two finished rows are read back
    assert len(finished) == 2 and all(json.loads(path.read_text())["finished"] == "2000-01-01T00:00:00+00:00"
                                      for path in finished)  # a row read back keeps its answers' finish
    assert [row["name"] for row in table["rows"]] == ["full system", "no knowledge", "budget"]


def test_a_table_of_rows_all_answered_before_starts_no_server(setup, tmp_path, monkeypatch):
    """--serve-kg and --serve-llm start their servers while a row has questions left, and not for a table read back
    (about a minute of vLLM's start for nothing)."""
    import evaluation.llm_server
    import evaluation.run_command

    started: list[str] = []

    def recording(name):
        @contextlib.contextmanager
        def serving(config, serve):
            started.extend([name] * serve)
            yield config
        return serving

    monkeypatch.setattr(evaluation.run_command, "kg_for_run", recording("kg"))
    monkeypatch.setattr(evaluation.llm_server, "llm_for_run", recording("llm"))
    data, config, fakes = setup
    for _ in range(2):
        assert ablate(config, data, ["no knowledge: -knowledge"], out=tmp_path / "served", serve_kg=True,
                      serve_llm=True, given=fakes) == 0
    assert started == ["kg", "llm"]  # the first command only: the second reads both rows back


def test_a_row_killed_between_batches_resumes_from_its_next_batch(setup, tmp_path, monkeypatch):
    """12 questions in batches of 4: killed in the full row's second batch, the row keeps its first batch's answers,
    and the same command answers the other two batches only, as the batches an unbroken row answers."""
    batches: list[list[str]] = []
    kills = iter([True])
    answer_batch = ablation_module._answer_batch

    def killed_at_the_second(*args, **kwargs):
        batches.append([example["interaction_id"] for example in args[-1]])
        if len(batches) == 2 and next(kills, False):
            raise KeyboardInterrupt
        return answer_batch(*args, **kwargs)

    monkeypatch.setattr(ablation_module, "_answer_batch", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        run(setup, tmp_path, "no knowledge: -knowledge")
    said = local_evaluation.saved_after_interrupt(local_evaluation.parse_args(
        ["ablate", "--out", str(tmp_path / "ablation")]), [])
    assert said.startswith("4 answers of an unfinished row are kept in"), said
    batches.clear()
    resumed = run(setup, tmp_path, "no knowledge: -knowledge")
    ids = [f"q{i:02d}" for i in range(QUESTIONS)]
    assert batches == [ids[4:8], ids[8:], ids[:4], ids[4:8], ids[8:]]  # the full row's last two, then the next row
    monkeypatch.setattr(ablation_module, "_answer_batch", answer_batch)
    unbroken = run(setup, tmp_path, "no knowledge: -knowledge", out="unbroken")
    for a, b in zip(resumed["rows"], unbroken["rows"], strict=True):
        assert a["overall"] == b["overall"] and a.get("difference") == b.get("difference")
    folder = Path(resumed["rows"][0]["folder"])
    kept = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    assert [r["interaction_id"] for r in kept] == ids and all("verdict" in r for r in kept)
    assert json.loads((folder / "manifest.json").read_text())["finished"]


def test_an_ablation_of_another_config_into_the_same_out_keeps_the_first_s_rows(setup, tmp_path):
    data, config, fakes = setup
    first = run(setup, tmp_path, "no knowledge: -knowledge")
    other = ConfigChoice(config.path, config.overlays, ("reasoning.max_tokens=64",))
    second = run((data, other, fakes), tmp_path, "no knowledge: -knowledge")
    folders = [Path(row["folder"]) for table in (first, second) for row in table["rows"]]
    assert len(set(folders)) == 4 and all((folder / "predictions.jsonl").is_file() for folder in folders)
    assert [f.name.rsplit("-", 1)[0] for f in folders] == ["full-system", "no-knowledge"] * 2


@pytest.mark.parametrize("incremental", [False, True])
def test_each_row_s_difference_is_the_one_compare_gives_for_its_two_run_folders(setup, tmp_path, incremental):
    variants = (["knowledge: +knowledge", "budget: reasoning.max_tokens=128"] if incremental else
                ["no knowledge: -knowledge", "budget: reasoning.max_tokens=128"])
    data, config, fakes = setup
    if incremental:  # from the config without the extractor, each module switched on in turn
        config = ConfigChoice(config.path, config.overlays, ("knowledge.enabled=false",))
    table = run((data, config, fakes), tmp_path, *variants, incremental=incremental, by=("question_type",))
    rows = table["rows"]
    assert rows[1]["difference"]["difference"] != 0  # the extractor moves the score either way
    for index, row in enumerate(rows[1:], start=1):
        against = rows[index - 1 if incremental else 0]
        assert row["against"] == against["name"]
        out = tmp_path / f"compare-{index}"
        assert compare(Path(against["folder"]), Path(row["folder"]), out=out) == 0
        found = json.loads((out / "compare.json").read_text())
        for key in ("questions", "score_a", "score_b", "difference", "ci95"):
            assert row["difference"][key] == found[key], key
        assert row["difference"]["corrected"] == found["corrected"]
        groups = row["by"]["question_type"]  # --by: the same pairing within each group
        assert sum(group["questions"] for group in groups.values()) == row["difference"]["questions"]
        assert sum(group["difference"] * group["questions"] for group in groups.values()) == pytest.approx(
            row["difference"]["difference"] * row["difference"]["questions"])
    for row in rows:  # the fakes never run out of time: every answer recorded its cuts, and none was cut
        assert row["deadline_cuts"] == {"answers": 0, "recorded": QUESTIONS, "by_cut": {}}
    flips = sum(len(found) for found in rows[1]["difference"]["flipped"].values())
    assert rows[1]["difference"]["flips_cut"] == {"flips": flips, "cut": 0}
    markdown = (tmp_path / "ablation" / "ablation.md").read_text()
    assert f"| 0 of {QUESTIONS} | 0 of {flips} |" in markdown
    assert "| cut by the deadline | flips the deadline cut |" in markdown
    assert "against the row before" in markdown if incremental else "against the full system" in markdown
    assert f"On these {QUESTIONS} questions a difference within" in markdown
    assert (tmp_path / "ablation" / "ablation.html").read_text().count("<tr>") == len(rows) + 1


@pytest.mark.parametrize(("variant", "message"), [
    ("x: -nosuch", "--variant 'x': -nosuch: no stage 'nosuch' can be listed in a strategy"),
    ("x: -calculator", "--variant 'x': -calculator: stage calculator is switched off in strategy hybrid"),
    ("x: reasoning.nosuch=1", "--variant 'x': "),
    ("x: -references", "--variant 'x': "),
    ("x: knowledge", "--variant 'x': 'knowledge' is no edit; write -STAGE, +STAGE or KEY=VALUE"),
    ("x: reasoning.max_tokens=96", "changes no setting of the row it is set against"),
])
def test_a_bad_variant_is_a_one_line_error_before_anything_runs(setup, tmp_path, capsys, variant, message):
    data, config, _ = setup
    out = tmp_path / "out"
    argv = ["ablate", "--data", str(data), "--config", str(config.path), "--overlay", str(ICL), "--variant", variant,
            "--out", str(out)]
    assert local_evaluation.main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not (out / "rows").exists()


def test_the_unknown_setting_and_the_starved_stage_are_named():
    load = lambda sets: load_config(REPO_ROOT / "configs" / "cpu.yaml", (), sets)  # noqa: E731
    with pytest.raises(ConfigError, match=r"unknown key.*nosuch"):
        build_variants(["x: reasoning.nosuch=1"], load, False)
    with pytest.raises(ConfigError, match=r"reads \['references'\], which no earlier stage writes"):
        build_variants(["x: -references"], load, False)
    with pytest.raises(ConfigError, match=r"--serve-llm serves the config's model and engine settings"):
        build_variants(["x: llm.vllm.dtype=float32"], load, False, serve_llm=True)
    bare = lambda sets: load(["attributes.method=none", *sets])  # noqa: E731
    with pytest.raises(ConfigError, match=r"\+precheck: stage precheck is still off after it"):
        build_variants(["x: +precheck"], bare, False)  # the pre-check needs an attributes method too


def test_plus_places_a_stage_where_the_seed_system_runs_it_and_switches_it_on():
    load = lambda sets: load_config(REPO_ROOT / "configs" / "cpu.yaml", (), sets)  # noqa: E731
    rows = build_variants(["calc: +calculator", "no kg: -kg", "kg back: +kg"], load, incremental=True)
    assert rows[1].sets == ("calculator.enabled=true",) and rows[1].config.calculator.enabled
    listed = rows[2].config.strategy_names()
    assert "kg" not in listed and rows[2].config.calculator.enabled  # on top of the row before
    assert rows[3].config.strategy_names() == rows[1].config.strategy_names()  # back in its place
    assert parse_variant("-kg") == ("-kg", ["-kg"]) and parse_variant("a b: x=1 -kg") == ("a b", ["x=1", "-kg"])


def test_a_variant_s_settings_load_together_and_before_its_stage_edits(tmp_path):
    """A setting that needs another (the hash retriever its model) and a stage that needs a setting to switch on
    (R2AG its checkpoint) build whatever order the edits are written in."""
    load = lambda sets: load_config(REPO_ROOT / "configs" / "cpu.yaml", (), sets)  # noqa: E731
    with pytest.raises(ConfigError, match=r"references.retriever hash needs references.hash.model"):
        build_variants(["hash: references.retriever=hash"], load, False)
    checkpoint = tmp_path / "r2.pt"
    rows = build_variants(["hash: references.retriever=hash references.hash.model=h.hidx",
                           f"r2ag: +r2ag r2ag.checkpoint={checkpoint}"], load, False)
    assert rows[1].config.references.retriever == "hash"
    assert rows[2].sets == (f"r2ag.checkpoint={checkpoint}", "r2ag.enabled=true")
    assert "r2ag" in rows[2].config.strategy_names() and rows[2].edits == ("+r2ag", f"r2ag.checkpoint={checkpoint}")


def test_the_cache_keeps_each_row_s_deepest_prefix_another_row_shares():
    rows = [["", "a", "ab", "abc"], ["", "a", "ab", "abd"], ["", "a", "ax"]]
    assert cache_points(rows) == {"ab", "a"}


def test_the_config_s_gate_is_applied_beside_the_rows_whose_setup_it_was_fit_on(setup, tmp_path):
    """The rows answer ungated; a gate fit on the full system's setup reads its records (as `gate eval` does), and
    not those of a row that changes what makes the signals (the reasoning prompt's budget)."""
    import json as json_module

    from models.gate.answer_gate import Column, Gate, signal_setup
    from models.prompting import PromptLibrary

    data, config, fakes = setup
    full = load_config(config.path, config.overlays, ["answer.gate=null"])
    fit_on = signal_setup(json_module.loads(json_module.dumps(full.resolved())), PromptLibrary(full.prompts).digests())
    gate = tmp_path / "gate.json"  # a P(correct) under its threshold for every answer: each one withheld
    Gate([Column("answer.number", "missing")], [0.0], [1.0], [1.0], -1.0, 0.5, fit_on={"setup": fit_on}).save(gate)
    gated = ConfigChoice(config.path, config.overlays, (f"answer.gate={gate}",))
    table = run((data, gated, fakes), tmp_path, "budget: reasoning.max_tokens=128")
    (row,) = table["gated"]
    assert row["of"] == "full system" and row["name"] == "full system, gated"
    full_row = table["rows"][0]["overall"]
    assert row["withheld"] == round((full_row["accuracy"] + full_row["hallucination"]) * QUESTIONS) > 0
    assert row["overall"]["missing"] == 1.0 and row["difference"]["score_a"] == full_row["score"]


def test_rows_that_change_no_verdict_claim_no_smallest_difference():
    from evaluation.ablation import format_table

    table = {"mode": "leave-one-out", "questions": 68, "rows": [], "gated": [], "smallest_shown": None}
    assert format_table(table).strip().endswith("No row changed a verdict of the row it is set against.")
    assert "Under 10 questions" in format_table({**table, "questions": 5})


def test_a_prefix_s_key_holds_what_its_stages_and_their_resources_read_and_no_later_stage_s_section():
    from evaluation.stage_cache import prefix_signature
    from models.loading import pipeline_stages
    from models.prompting import PromptLibrary

    def signature(*sets: str, through: str = "evidence") -> str:
        config = load_config(REPO_ROOT / "configs" / "cpu.yaml", (), sets)
        stages = pipeline_stages(config)
        names = [stage.name for stage in stages]
        return prefix_signature(config, PromptLibrary(config.prompts), stages[:names.index(through) + 1])

    assert signature() == signature("knowledge.enabled=true")  # read only after the prefix
    assert signature() == signature("reasoning.summariser_max_tokens=32")
    assert signature() != signature("references.top_k=20")  # the references stage's own
    assert signature() != signature("embedder.batch_size=8")  # no stage declares it: every prefix reads it
    # the reasoning stage needs the R2AG head, built from the r2ag section
    assert signature(through="reasoning") != signature("r2ag.mode=prompt", through="reasoning")


def test_r2ag_cross_fitted_pools_each_fold_s_rows_as_compare_pairs_them(setup, tmp_path, monkeypatch):
    """benchmarks/r2ag_effect.py: each fold answered by its own checkpoint through `ablate`, the folds' rows pooled
    question by question; the pooled difference is compare's for the pooled records."""
    import functools

    import torch

    from benchmarks import r2ag_effect
    from evaluation.compare import compare_records
    from models.retrieval.r2former_head import R2Former, R2FormerConfig, save_checkpoint

    data, config, fakes = setup
    ids = [json.loads(line)["interaction_id"] for line in data.read_text().splitlines()]
    folds = []
    for fold in range(2):
        torch.manual_seed(fold)
        name = f"r2.fold{fold}.pt"
        save_checkpoint(R2Former(R2FormerConfig(hidden=8, heads=2, max_refs=8)), tmp_path / name,
                        fakes["embedder"].name)
        folds.append({"checkpoint": name, "interaction_ids": ids[fold::2]})
    (tmp_path / "r2.folds.json").write_text(json.dumps({"folds": folds}))
    monkeypatch.setattr(ablation_module, "ablate", functools.partial(ablate, given=fakes))
    out = tmp_path / "effect"
    assert r2ag_effect.main(["--folds", str(tmp_path / "r2.folds.json"), "--data", str(data), "--config",
                             str(config.path), "--overlay", str(ICL), "--edits", "r2ag.threshold=0.99",
                             "--out", str(out)]) == 0
    table = json.loads((out / "ablation.json").read_text())
    pooled = [[json.loads(line) for line in (Path(row["folder"]) / "predictions.jsonl").read_text().splitlines()]
              for row in table["rows"]]
    assert [r["interaction_id"] for r in pooled[0]] == [r["interaction_id"] for r in pooled[1]]
    assert sorted(r["interaction_id"] for r in pooled[0]) == sorted(ids)
    found = compare_records(*pooled)
    for key in ("questions", "score_a", "score_b", "difference", "ci95"):
        assert table["rows"][1]["difference"][key] == found[key], key
    for fold in range(2):  # each fold's R2AG row ran its own checkpoint, on its own questions
        manifest = json.loads((out / f"fold{fold}" / "ablation-manifest.json").read_text())
        assert manifest["rows"][1]["config"]["r2ag"]["checkpoint"] == str(tmp_path / f"r2.fold{fold}.pt")
        assert manifest["data"]["questions"] == len(folds[fold]["interaction_ids"])
    assert "R2AG" in (out / "ablation.md").read_text()


def test_r2ag_s_control_zeroes_only_the_projection_and_rows_after_the_r2ag_row(setup, tmp_path, monkeypatch):
    """--control: a third row per fold with the fold's checkpoint, its projection 0 and its QDM head as trained, so
    in relevance mode (the projection unread) it answers as the R2AG row does; a checkpoint without a projection is
    a one-line error."""
    import functools

    import torch

    from benchmarks import r2ag_effect
    from evaluation.data import DataError
    from models.retrieval.r2former_head import R2Former, R2FormerConfig, load_checkpoint, save_checkpoint

    data, config, fakes = setup
    ids = [json.loads(line)["interaction_id"] for line in data.read_text().splitlines()]
    torch.manual_seed(0)
    trained = R2Former(R2FormerConfig(hidden=8, heads=2, max_refs=8, llm_hidden_size=4))
    save_checkpoint(trained, tmp_path / "r2.fold0.pt", fakes["embedder"].name, trained_with_lm=True)
    (tmp_path / "r2.folds.json").write_text(json.dumps({"folds": [{"checkpoint": "r2.fold0.pt",
                                                                    "interaction_ids": ids}]}))
    monkeypatch.setattr(ablation_module, "ablate", functools.partial(ablate, given=fakes))
    out = tmp_path / "effect"
    assert r2ag_effect.main(["--folds", str(tmp_path / "r2.folds.json"), "--data", str(data), "--config",
                             str(config.path), "--overlay", str(ICL), "--edits", "r2ag.threshold=0.99",
                             "--control", "--out", str(out)]) == 0
    table = json.loads((out / "ablation.json").read_text())
    assert [row["name"] for row in table["rows"]] == ["full system", r2ag_effect.ROW, r2ag_effect.CONTROL]
    verdicts = [[(r["interaction_id"], r["prediction"], r["verdict"])
                 for r in map(json.loads, (Path(row["folder"]) / "predictions.jsonl").read_text().splitlines())]
                for row in table["rows"]]
    assert verdicts[2] == verdicts[1]
    manifest = json.loads((out / "fold0" / "ablation-manifest.json").read_text())
    assert manifest["rows"][2]["config"]["r2ag"]["checkpoint"] == str(out / "fold0" / "zeroed.pt")
    control = load_checkpoint(out / "fold0" / "zeroed.pt").model.state_dict()
    for name, weights in trained.state_dict().items():
        expected = torch.zeros_like(weights) if name.startswith("projection.") else weights
        assert torch.equal(control[name], expected), name

    save_checkpoint(R2Former(R2FormerConfig(hidden=8, heads=2, max_refs=8)), tmp_path / "qdm.pt", "e")
    with pytest.raises(DataError, match="no projection"):
        r2ag_effect.zeroed(tmp_path / "qdm.pt", tmp_path / "zeroed.pt")


def test_a_state_read_from_the_cache_shares_nothing_with_the_entry_the_cache_hands_out_again():
    """The cache hands the same entry to every row that reads it from memory: a row's stages must change neither
    that entry nor the records of a row that read it before."""
    from evaluation.stage_cache import state_from_json, state_to_json
    from models.kg.kg_stage import KG_RESULTS
    from models.state import QueryState
    from utils.cache import JsonCache

    state = QueryState(0, "q0", "what is the code of item 0?", "03/01/2024", [])
    state.signals["kg.hit"] = 1.0
    state[KG_RESULTS] = ["code c0"]
    cache = JsonCache(None)
    cache.put("key", state_to_json(state))
    first = state_from_json(cache.get("key"), [])
    record = first.record()
    second = state_from_json(cache.get("key"), [])
    second.signals["answer.number"] = 3.0
    second[KG_RESULTS].append("code c999")
    assert record["signals"] == {"kg.hit": 1.0} and first[KG_RESULTS] == ["code c0"]
    assert state_from_json(cache.get("key"), []).signals == {"kg.hit": 1.0}
