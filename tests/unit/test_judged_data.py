"""training/judged_data.py on hand-made judged run folders: each target kind, the forms per prompt, the RAFT
variants, the preference order, folds and the held-out sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.record import Record
from evaluation.verdicts import CORRECT, MISS, WRONG
from models.config import ConfigError
from models.prompting import PromptLibrary
from models.stages.reasoning import reasoning_conversation, summariser_conversation
from training import judged_data
from training.examples import answer_block
from training.judged_data import build, fold_of, write
from utils.answers import IDK, INVALID

CHARS = 3000
PAGES = {"coppola": "The Godfather is a 1972 film directed by Francis Ford Coppola.",
         "weather": "It rained in Paris on Tuesday.",
         "rome": "Rome is the capital of Italy."}


def recorded(query: str, texts: list[str], prompt: str = "reasoning") -> tuple[dict, list[dict]]:
    """A trace and its references as a run with record_prompts writes them, rendered by the real prompts."""
    refs = [{"page": f"page {i}", "url": "", "updated": "", "kind": "chunk", "score": 1.0, "relevance": None,
             "text": text} for i, text in enumerate(texts)]
    state = judged_data.state_of(_record(query, refs), refs)
    library = PromptLibrary()
    messages = (reasoning_conversation(library.get("reasoning"), state, CHARS) if prompt == "reasoning" else
                summariser_conversation(library.get("summariser"), state, CHARS))
    return {"references": refs, "prompts": [{"stage": "reasoning", "prompt": prompt, "messages": list(messages),
                                             "replies": ["..."]}]}, refs


def _record(query: str, refs: list[dict]):
    return Record({"interaction_id": "x", "query": query, "query_time": "03/01/2024, 10:00:00 PT",
                   "trace": {"references": refs}})


def line(iid: str, query: str, gold: str, prediction: str, verdict: str, texts: list[str],
         prompt: str = "reasoning") -> dict:
    trace, _ = recorded(query, texts, prompt)
    return {"interaction_id": iid, "query": query, "query_time": "03/01/2024, 10:00:00 PT", "answer": gold,
            "alt_answers": [], "prediction": prediction, "verdict": verdict, "trace": trace}


def run_folder(path: Path, lines: list[dict], prompts: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "predictions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    (path / "manifest.json").write_text(json.dumps(
        {"answers": {"config": {"reasoning": {"max_reference_chars": CHARS}, "prompts": prompts or {}}}}),
        encoding="utf-8")
    return path


@pytest.fixture
def folder(tmp_path):
    return run_folder(tmp_path / "run", [
        line("right", "who directed the godfather?", "francis ford coppola", "Francis Ford Coppola", CORRECT,
             [PAGES["coppola"], PAGES["weather"]]),
        line("long", "who directed the godfather in 1972?", "francis ford coppola",
             "The Godfather of 1972 was directed by the American film maker Francis Ford Coppola", CORRECT,
             [PAGES["coppola"]], prompt="summariser"),
        line("missed", "what is the capital of italy?", "rome", "Milan", WRONG, [PAGES["rome"], PAGES["weather"]]),
        line("declined", "what is the capital of italy today?", "rome", IDK, MISS, [PAGES["rome"]]),
        line("absent", "who won the 1950 world cup?", "uruguay", "Brazil", WRONG, [PAGES["weather"]]),
        line("premise", "when did paris win the world cup?", INVALID, "1998", WRONG, [PAGES["weather"]]),
        line("open", "who painted the mona lisa?", "leonardo da vinci", "Leonardo", "unjudged", [PAGES["weather"]]),
    ])


def by_id(rows: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for row in rows:
        found.setdefault(row["interaction_id"], []).append(row)
    return found


def test_each_verdict_gets_its_target_in_its_prompts_form(folder, tmp_path):
    built, _ = build([folder], folds=2, raft=False, held_out=tmp_path / "none.jsonl")
    rows = {iid: [(r["kind"], r["completion"][0]["content"]) for r in found]
            for iid, found in by_id(built.sft).items()}
    assert rows["right"] == [("own", answer_block("Francis Ford Coppola"))]
    # a right answer that runs long is replaced by the gold; the summariser's form is the bare line
    assert rows["long"] == [("own", "francis ford coppola")]
    assert rows["missed"] == [("extraction", answer_block("rome"))]
    assert rows["declined"] == [("extraction", answer_block("rome"))]
    assert rows["absent"] == [("refusal", answer_block(IDK))]
    assert rows["premise"] == [("invalid", answer_block(INVALID))]
    assert "## False Premise: yes" in rows["premise"][0][1]
    assert "open" not in rows and built.skipped["unjudged answer"] == 1
    # the prompt is the recorded conversation, exactly
    source = json.loads((folder / "predictions.jsonl").read_text().splitlines()[0])
    assert by_id(built.sft)["right"][0]["prompt"] == source["trace"]["prompts"][0]["messages"]


def test_preferences_follow_right_over_idk_over_wrong(folder, tmp_path):
    built, _ = build([folder], folds=2, raft=False, held_out=tmp_path / "none.jsonl")
    pairs = {iid: [(p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in found]
             for iid, found in by_id(built.pairs).items()}
    assert pairs["right"] == [(answer_block("Francis Ford Coppola"), answer_block(IDK))]  # against over-refusal
    assert pairs["missed"] == [(answer_block("rome"), answer_block(IDK)), (answer_block("rome"), answer_block("Milan"))]
    assert pairs["declined"] == [(answer_block("rome"), answer_block(IDK))]
    assert pairs["absent"] == [(answer_block(IDK), answer_block("Brazil"))]
    assert pairs["premise"] == [(answer_block(INVALID), answer_block("1998"))]


def test_raft_variants_remove_the_answer_or_add_distractors(folder, tmp_path):
    built, _ = build([folder], folds=1, raft=True, held_out=tmp_path / "none.jsonl")
    missed = {r["kind"]: r for r in by_id(built.sft)["missed"]}
    removed, mixed = missed["raft-removed"], missed["raft-distractors"]
    assert removed["completion"][0]["content"] == answer_block(IDK)
    assert "Rome is the capital" not in removed["prompt"][1]["content"]
    assert "It rained in Paris" in removed["prompt"][1]["content"]
    assert mixed["completion"][0]["content"] == answer_block("rome")
    assert "Rome is the capital" in mixed["prompt"][1]["content"]
    assert mixed["prompt"] != missed["extraction"]["prompt"]
    # no variant for an answer with no gold in its prompt, nor for a false premise
    assert {r["kind"] for r in by_id(built.sft)["absent"]} == {"refusal"}
    assert {r["kind"] for r in by_id(built.sft)["premise"]} == {"invalid"}


def test_a_conversation_the_prompts_do_not_reproduce_gets_no_raft_variant(tmp_path):
    edited = line("missed", "what is the capital of italy?", "rome", "Milan", WRONG, [PAGES["rome"]])
    edited["trace"]["prompts"][0]["messages"][1]["content"] += " (edited)"
    built, _ = build([run_folder(tmp_path / "run", [edited])], folds=1, held_out=tmp_path / "none.jsonl")
    assert [r["kind"] for r in built.sft] == ["extraction"]
    assert built.skipped == {"raft: re-rendering does not reproduce the recorded conversation": 1}


def test_the_kg_summariser_s_conversation_is_reproduced_and_its_row_holding_the_gold_removed(tmp_path):
    # the CPU default's summariser shows the KG stage's rows (configs/cpu.yaml): the data builder renders it as the
    # stage does, rows included, or every such conversation would get no RAFT variant
    overrides = {"summariser": "prompts/variants/summariser_kg.yaml"}
    refs = [{"page": "page 0", "url": "", "updated": "", "kind": "chunk", "score": 1.0, "relevance": None,
             "text": PAGES["weather"]}]
    kg = ["italy capital: Rome", "france capital: Paris"]
    trace = {"references": refs, "kg_results": kg}
    state = judged_data.state_of(Record({"interaction_id": "kg", "query": "what is the capital of italy?",
                                         "query_time": "03/01/2024, 10:00:00 PT", "trace": trace}), refs)
    messages = summariser_conversation(PromptLibrary(overrides).get("summariser"), state, CHARS)
    assert "italy capital: Rome" in messages[1]["content"]
    recorded_line = {"interaction_id": "kg", "query": "what is the capital of italy?",
                     "query_time": "03/01/2024, 10:00:00 PT", "answer": "rome", "alt_answers": [],
                     "prediction": "Milan", "verdict": WRONG,
                     "trace": dict(trace, prompts=[{"stage": "reasoning", "prompt": "summariser",
                                                    "messages": list(messages), "replies": ["Milan"]}])}
    built, _ = build([run_folder(tmp_path / "run", [recorded_line], overrides)], folds=1, raft=True,
                     held_out=tmp_path / "none.jsonl")
    assert not built.skipped
    rows = {r["kind"]: r for r in built.sft}
    assert rows["extraction"]["prompt"] == list(messages)
    removed = rows["raft-removed"]["prompt"][1]["content"]
    assert "italy capital: Rome" not in removed and "france capital: Paris" in removed


def test_folds_are_by_question_and_the_manifest_counts_them(folder, tmp_path):
    built, sources = build([folder], folds=2, held_out=tmp_path / "none.jsonl")
    for row in built.sft + built.pairs:
        assert row["fold"] == fold_of(row["interaction_id"], 2)
    folds_of = {}
    for row in built.sft + built.pairs:
        folds_of.setdefault(row["interaction_id"], set()).add(row["fold"])
    assert all(len(f) == 1 for f in folds_of.values())
    manifest = write(built, sources, tmp_path / "data", 2, True, 0)
    assert manifest["kinds"]["extraction"] == 2 and manifest["kinds"]["refusal"] == 1
    assert sum(sum(c.values()) for c in manifest["kinds_by_fold"].values()) == len(built.sft)
    assert manifest["files"]["sft.jsonl"]["rows"] == len(built.sft)
    assert manifest["sources"][0]["records"] == 7


def test_a_question_of_the_held_out_sample_is_refused(folder, tmp_path):
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"interaction_id": "elsewhere", "query": "What is the capital of  Italy?"}) + "\n")
    with pytest.raises(ConfigError, match="never enters training"):
        build([folder], folds=2, held_out=held)


def test_a_run_without_recorded_prompts_says_so(tmp_path):
    plain = line("right", "who directed the godfather?", "francis ford coppola", "Coppola", CORRECT, [])
    plain["trace"] = {"references": []}
    built, _ = build([run_folder(tmp_path / "run", [plain])], folds=2, held_out=tmp_path / "none.jsonl")
    assert not built.sft
    assert built.skipped == {"no recorded answering conversation (run with --record-prompts)": 1}


def test_the_command_writes_the_data_and_its_manifest(folder, tmp_path, capsys):
    from tools.train_llm import main

    assert main(["data", "--run", str(folder), "--out", str(tmp_path / "data"), "--folds", "2"]) == 0
    manifest = json.loads((tmp_path / "data" / judged_data.MANIFEST_FILE).read_text())
    rows = judged_data.read_rows(tmp_path / "data" / judged_data.SFT_FILE)
    assert manifest["files"][judged_data.SFT_FILE]["rows"] == len(rows) > 0
    assert manifest["sources"][0]["folder"] == str(folder)
    assert f"{len(rows)} SFT examples" in capsys.readouterr().out
    assert {r["fold"] for r in judged_data.read_rows(tmp_path / "data" / judged_data.SFT_FILE, {1})} <= {1}


def test_sentence_targets_copy_the_references_sentence_and_keep_a_right_answer_whole(folder, tmp_path):
    built, _ = build([folder], folds=2, raft=False, held_out=tmp_path / "none.jsonl", form="sentence")
    rows = {iid: [r["completion"][0]["content"] for r in found] for iid, found in by_id(built.sft).items()}
    assert rows["missed"] == [answer_block("Rome is the capital of Italy.")]
    assert rows["long"] == ["The Godfather of 1972 was directed by the American film maker Francis Ford Coppola"]
    assert rows["absent"] == [answer_block(IDK)]  # refusals and false premises as before
    assert rows["premise"] == [answer_block(INVALID)]


def test_a_sentence_target_is_prose_never_the_question_or_a_reference_header():
    text = ("### References\n[1] Rome | Wiki (updated 2024-01-01)\n\nRome is the capital of Italy.\n"
            "| capital | Rome |\n### Question\nwhat is the capital of italy, rome or milan?")
    assert judged_data.answer_sentence(text, ["rome"], "what is the capital of italy, rome or milan?") == (
        "Rome is the capital of Italy.")
    assert judged_data.answer_sentence(text, ["milan"], "what is the capital of italy, rome or milan?") is None
    with pytest.raises(ConfigError, match="target form 'long'"):
        build([], folds=2, form="long")
