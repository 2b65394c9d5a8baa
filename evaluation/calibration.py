"""Judge calibration: how often a judge agrees with a person on data/judge/calibration.jsonl (45 triples written
for it) and data/judge/gate_verdicts.jsonl (a person's verdicts on SmolLM2's sentence answers to the gate sets,
joined with their gold answers by `join_verdicts`), so a user can see whether a judge is good enough before
trusting its scores. Beside the agreement: the recall on the person's "correct" and on the person's "incorrect"
(a judge that always says "incorrect" agrees on most of the gate verdicts) and Cohen's kappa, on the held-back part
of each set (`held_back`: half of the questions, by a hash) and on all of it. Rules are tuned on the other part.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evaluation.correction import Calibration
from evaluation.data import DataError, alternative_answers
from evaluation.judge import UNCERTAIN, Judge, build_judge, judge_records
from evaluation.verdicts import CORRECT, FACTS, MISS, UNJUDGED, VERDICTS, WRONG
from models.config import REPO_ROOT, ConfigError
from utils.durable_io import jsonl_lines

CALIBRATION_SET = REPO_ROOT / "data" / "judge" / "calibration.jsonl"
GATE_SET = REPO_ROOT / "data" / "judge" / "gate_verdicts.jsonl"  # written by tools/join_verdicts.py
SETS = (CALIBRATION_SET, GATE_SET)
# Real models' answers to real CRAG questions with two annotators' verdicts, kept beside the repository where a
# maintainer has it (CC BY-NC: never shipped); `calibrate` reads it when it is there.
REAL_SET = REPO_ROOT.parent / "shared" / "judge_real" / "answers.jsonl"
GATE_VERDICTS = REPO_ROOT / "data" / "gate_dev" / "verdicts.jsonl"
GOLD_SOURCES = (REPO_ROOT / "data" / "gate_dev.jsonl", REPO_ROOT / "benchmarks" / "kg_reach" / "questions.jsonl")
HUMAN = {"correct": CORRECT, "incorrect": WRONG, "miss": MISS}


def _question(query: str) -> str:
    return " ".join(query.lower().split())


def held_back(query: str) -> bool:
    """Whether a row is in the held-back part: its question's SHA-256 (lower case, whitespace folded) is even. By
    question, so every prediction of one question is in the same part; by hash, so the split never changes."""
    return int(hashlib.sha256(_question(query).encode("utf-8")).hexdigest(), 16) % 2 == 0


def _lines(path: Path) -> list[str]:
    try:
        return jsonl_lines(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err})") from None


def join_verdicts(verdicts: Path = GATE_VERDICTS, sources: Sequence[Path] = GOLD_SOURCES) -> list[dict[str, Any]]:
    """The person's verdicts of `verdicts` ({query, prediction, human} lines) as calibration rows: each with an
    id, its question's type as its kind and the gold answer and alternatives from the CRAG-format `sources` (found
    by the question, lower case, whitespace folded). A DataError names a verdict whose question no source holds,
    one two sources answer differently, or a line that is not a verdict."""
    gold: dict[str, dict[str, Any]] = {}
    for source in sources:
        for number, line in enumerate(_lines(source), start=1):
            if not line.strip():
                continue
            try:
                example = json.loads(line)
                key = _question(example["query"])
                found = {"kind": str(example.get("question_type") or "other"), "answer": str(example["answer"]),
                         "alt_answers": alternative_answers(example),
                         "source": source.relative_to(REPO_ROOT).as_posix() if source.is_relative_to(REPO_ROOT)
                         else source.name}
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
                raise DataError(f"{source}:{number}: not a CRAG example ({err})") from None
            if key in gold and (gold[key]["answer"], gold[key]["alt_answers"]) != (found["answer"],
                                                                                   found["alt_answers"]):
                raise DataError(f"{source}:{number}: {example['query']!r} is in {gold[key]['source']} too, with "
                                "other gold answers")
            gold.setdefault(key, found)
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(_lines(verdicts), start=1):
        if not line.strip():
            continue
        try:
            verdict = json.loads(line)
            query, prediction, human = verdict["query"], verdict["prediction"], verdict["human"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(f"{verdicts}:{number}: not a {{query, prediction, human}} verdict ({err})") from None
        if human not in HUMAN:
            raise DataError(f"{verdicts}:{number}: human must be one of {', '.join(HUMAN)}")
        if _question(query) not in gold:
            raise DataError(f"{verdicts}:{number}: {query!r} is in none of {', '.join(s.name for s in sources)}")
        found = gold[_question(query)]
        rows.append({"id": f"gate-{len(rows) + 1:02d}", "kind": found["kind"], "query": query,
                     "answer": found["answer"], "alt_answers": found["alt_answers"], "prediction": prediction,
                     "human": human, "source": found["source"]})
    return rows


def load_set(path: Path = CALIBRATION_SET) -> list[dict[str, Any]]:
    """The rows with their person verdict, without those whose annotators disagree (`human: null`: `disagreed`
    counts them); a DataError naming the line of one that is not usable."""
    rows = []
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if row["human"] is None:
                continue
            if not all(isinstance(row[key], str) for key in ("query", "answer", "prediction")):
                raise TypeError("query, answer and prediction must be strings")
            rows.append({**row, "human": HUMAN[row["human"]], "alt_answers": row.get("alt_answers") or []})
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(f"{path}:{number}: not a calibration row ({err}); each line needs query, answer, "
                             f"prediction and human ({', '.join(HUMAN)}, or null where annotators disagree)") from None
    return rows


def disagreed(path: Path) -> int:
    """How many rows of `path` have no agreed verdict (`human: null`)."""
    return sum(1 for line in _lines(path) if line.strip() and json.loads(line).get("human") is None)


def annotator_agreement(path: Path) -> float | None:
    """The share of rows on which the two annotators (human_1, human_2) agree, None where a set has one verdict."""
    pairs = [(row.get("human_1"), row.get("human_2")) for row in map(json.loads, filter(str.strip, _lines(path)))]
    pairs = [(a, b) for a, b in pairs if a and b]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else None


def gold_form(row: dict[str, Any]) -> str:
    """"sentence" where the gold answer has more than LONG_GOLD words, else "short"."""
    from evaluation.keyfact import LONG_GOLD

    return "sentence" if len(str(row["answer"]).split()) > LONG_GOLD else "short"


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Of judged rows: how many, the agreement with the person, the recall on the person's "correct" and on the
    person's "incorrect" (None where the person said none is) and Cohen's kappa over all verdicts (None where it
    is undefined: one verdict only, on both sides)."""
    from sklearn.metrics import cohen_kappa_score

    def recall(human: str) -> float | None:
        theirs = [r["verdict"] == human for r in rows if r["human"] == human]
        return sum(theirs) / len(theirs) if theirs else None

    people, judged = [r["human"] for r in rows], [r["verdict"] for r in rows]
    kappa = float(cohen_kappa_score(people, judged)) if len(set(people) | set(judged)) > 1 else math.nan
    return {"n": len(rows), "agreement": sum(p == j for p, j in zip(people, judged)) / len(rows) if rows else None,
            "recall_correct": recall(CORRECT), "recall_incorrect": recall(WRONG),
            "kappa": None if math.isnan(kappa) else kappa,
            "always_incorrect": sum(p == WRONG for p in people) / len(rows) if rows else None}


def confusion(rows: Sequence[dict[str, Any]], verdicts: Sequence[str], judged: Sequence[bool]) -> dict[str, int]:
    """The counts that correct a score (evaluation/correction.py): the person's verdict against the judge's, on the
    rows the judge decided (`judged`), not the exact rules."""
    counts = {"correct_correct": 0, "correct_wrong": 0, "wrong_correct": 0, "wrong_wrong": 0}
    for row, verdict, own in zip(rows, verdicts, judged):
        if own and row["human"] in (CORRECT, WRONG) and verdict in (CORRECT, WRONG):
            counts[f"{row['human']}_{verdict}"] += 1
    return counts


def sentence_share(rows: Sequence[dict[str, Any]]) -> float:
    """The share of rows whose gold answer is a sentence (`gold_form`)."""
    return sum(gold_form(r) == "sentence" for r in rows) / len(rows) if rows else 0.0


def by_part(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`figures` of the held-back part (`held_back`) and of all the judged rows."""
    return {"held back": figures([r for r in rows if held_back(str(r["query"]))]), "all": figures(rows)}


def by_group(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`figures` by the gold's form (short or sentence) and, where rows name one, by model."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[f"gold {gold_form(row)}"].append(row)
        if row.get("model"):
            groups[f"model {row['model']}"].append(row)
    return {name: figures(group) for name, group in sorted(groups.items())}


def calibrate(judge: Judge | None, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Agreement with the human verdicts, overall and by kind, for our column and the organisers', the
    confusion matrix of ours (human verdict -> judge verdict -> count), and ours' `figures` by part."""
    judge_records(rows, judge)
    result: dict[str, Any] = {"n": len(rows), "parts": by_part(rows),
                              "for_organisers": bool(judge is not None and judge.for_organisers)}
    for column in ("verdict", "organisers_verdict"):
        agree = [r[column] == r["human"] for r in rows]
        by_kind: dict[str, list[bool]] = defaultdict(list)
        for row, same in zip(rows, agree):
            by_kind[str(row.get("kind") or "other")].append(same)
        result[column] = {"agreement": sum(agree) / len(rows) if rows else 0.0,
                          "by_kind": {k: sum(v) / len(v) for k, v in sorted(by_kind.items())},
                          "unjudged": sum(r[column] == UNJUDGED for r in rows)}
    matrix = Counter((r["human"], r["verdict"]) for r in rows)
    result["confusion"] = {h: {v: matrix[(h, v)] for v in VERDICTS} for h in HUMAN.values()}
    result["disagreements"] = [r.get("id") for r in rows if r["verdict"] != r["human"]]
    rated = [r for r in rows if isinstance(r.get("judge_confidence"), float)]
    if rated:  # does the judge's own probability tell its right verdicts from its wrong ones?
        result["by_confidence"] = {
            band: {"n": len(group), "agreement": sum(r["verdict"] == r["human"] for r in group) / len(group)}
            for band, group in (("confident", [r for r in rated if r["judge_confidence"] >= UNCERTAIN]),
                                ("uncertain", [r for r in rated if r["judge_confidence"] < UNCERTAIN])) if group}
    return result


def format_calibration(result: dict[str, Any], judge_name: str, set_name: str = CALIBRATION_SET.name) -> str:
    ours, theirs = result["verdict"], result["organisers_verdict"]
    how = "with this judge" if result["for_organisers"] else "without an LLM judge"
    lines = [f"judge {judge_name} on {result['n']} calibration triples of {set_name}: agreement with the person "
             f"{ours['agreement']:.0%} (organisers' rules {how}: {theirs['agreement']:.0%}; "
             f"unjudged: {ours['unjudged']})",
             "by kind:" + "".join(f"  {k} {v:.0%}" for k, v in ours["by_kind"].items()),
             "confusion (rows: the person, columns: the judge):",
             f"  {'':<10}" + "".join(f"{v:>10}" for v in VERDICTS)]
    lines += [f"  {human:<10}" + "".join(f"{row[v]:>10}" for v in VERDICTS)
              for human, row in result["confusion"].items()]
    if result.get("by_confidence"):
        lines.append(f"by the judge's own probability (P(verdict) >= {UNCERTAIN}: confident):" + "".join(
            f"  {band} {v['agreement']:.0%} of {v['n']}" for band, v in result["by_confidence"].items()))
    if result["disagreements"]:
        lines.append("disagreements: " + ", ".join(map(str, result["disagreements"])))
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def format_figures(table: list[tuple[str, dict[str, dict[str, Any]]]], judge_name: str) -> str:
    """One line per set and part (or group): n, agreement, the base rate ("always incorrect" agrees this often), the
    two recalls and kappa ("-" where undefined). The first column is as wide as its longest name."""
    width = max([len("set"), *(len(name) for name, _ in table)]) + 2
    part_width = max([len("part"), *(len(part) for _, parts in table for part in parts)]) + 2
    lines = [f"judge {judge_name} against the person (recall: the share of the person's \"correct\" the judge calls "
             "correct, and of the person's \"incorrect\" it calls wrong; base: how often always \"incorrect\" "
             "would agree):",
             f"  {'set':<{width}}{'part':<{part_width}}{'n':>5}{'agreement':>11}{'base':>6}{'recall correct':>16}"
             f"{'recall incorrect':>18}{'kappa':>7}"]
    for name, parts in table:
        for part, f in parts.items():
            kappa = "-" if f["kappa"] is None else f"{f['kappa']:.2f}"
            lines.append(f"  {name:<{width}}{part:<{part_width}}{f['n']:>5}{_percent(f['agreement']):>11}"
                         f"{_percent(f.get('always_incorrect')):>6}{_percent(f['recall_correct']):>16}"
                         f"{_percent(f['recall_incorrect']):>18}{kappa:>7}")
    lines.append("held back: the questions whose SHA-256 is even (evaluation/calibration.py held_back); the facts "
                 "judge is fit and its rules written on the others")
    return "\n".join(lines)


EXACT = ("rules", "person", "none")  # judged_by values whose verdicts need no correction (or cannot have one)
SENTENCE_DRIFT = 0.25  # a run's share of sentence golds this far from the calibration set's gets a warning


def judged_by_judge(records: list[dict[str, Any]]) -> list[bool]:
    """Whether each judged record's verdict is the judge's own reading (not the exact rules', a person's or none)."""
    return [str(r.get("judged_by") or "rules") not in EXACT for r in records]


def check_calibration(option: str | None) -> None:
    """A ConfigError naming --calibration where it names no readable set of person verdicts."""
    if option in (None, "none"):
        return
    path = Path(str(option))
    if not path.is_file():
        raise ConfigError(f"--calibration {option}: no such file; give person verdicts (.jsonl with query, answer, "
                          "prediction and human, as data/judge/calibration.jsonl), or none")
    try:
        load_set(path)
    except DataError as err:
        raise ConfigError(f"--calibration {err}") from None


def calibration_for(spec: str, model_name: str | None, option: str | None) -> tuple[Calibration | None, str]:
    """(the calibration that corrects judge `spec`'s score, the line that names it), or (None, why there is none):
    --calibration FILE judged by that judge, else the facts judge's own counts (data/judge/facts.json); none where
    the one named cannot correct (`Calibration.usable`)."""
    calibration, note = _calibration(spec, model_name, option)
    if calibration is not None and (why := calibration.usable()) is not None:
        return None, f"score not corrected: {why}"
    return calibration, note


def _calibration(spec: str, model_name: str | None, option: str | None) -> tuple[Calibration | None, str]:
    if option == "none":
        return None, "score not corrected for the judge's errors (--calibration none)"
    if option:
        rows = load_set(Path(option))
        judge_records(rows, build_judge(spec, model_name))
        counts = confusion(rows, [r["verdict"] for r in rows], judged_by_judge(rows))
        name = f"{Path(option).name} ({sum(counts.values())} person verdicts on answers the judge decided)"
        return Calibration(name, counts, sentence_share(rows), tuple(sorted({str(r["model"]) for r in rows
                                                                             if r.get("model")}))), name
    if spec == FACTS:
        from evaluation.facts_judge import MODEL_FILE, load_model

        data = load_model()["calibration"]
        name = (f"the facts judge's own: {sum(data['counts'].values())} person verdicts on real models' answers it "
                f"was not fit on ({data['from']}; {MODEL_FILE.name})")
        return Calibration.of(data, name), name
    return None, (f"score not corrected for judge {spec}'s errors: no calibration set for it (--calibration FILE, "
                  "person verdicts on answers it was not fit on)")


def drift_warnings(records: list[dict[str, Any]], calibration: Calibration, model: str | None) -> list[str]:
    """Lines saying where a run's answers differ in kind from the calibration set's: its share of sentence golds,
    or a model none of whose name the set's models share."""
    warnings = []
    share = sentence_share(records)
    if calibration.sentence_share is not None and abs(share - calibration.sentence_share) > SENTENCE_DRIFT:
        warnings.append(f"warning: {share:.0%} of this run's gold answers are sentences against "
                        f"{calibration.sentence_share:.0%} of the calibration set's: the judge may err otherwise here, "
                        "and the correction assumes it does not")
    families = {word for name in calibration.models for word in re.findall(r"[a-z]+", name.lower())} - {"instruct"}
    if model and families and not families & set(re.findall(r"[a-z]+", model.lower())):
        warnings.append(f"warning: this run's model ({model}) is of no family the calibration set's answers come from "
                        f"({', '.join(calibration.models)}): the correction assumes the judge errs on it as on those")
    return warnings
