"""The report of a run: scores overall and by breakdown, who judged, latency; report.json, report.md, PNG charts."""

from __future__ import annotations

import io
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from evaluation.attribution import CLASSES, attribution_table
from evaluation.deadline_cuts import deadline_lines, run_cuts
from evaluation.gate_command import format_gate, gate_summary
from evaluation.html_report import report_html, write_html
from evaluation.judge import UNCERTAIN, contains_note, corrected_lines, interval
from evaluation.metrics import MIN_FOR_INTERVAL, RESAMPLES, Scores, intervals, latency
from evaluation.record import Record, records_of
from evaluation.verdicts import MISS
from models.stages.hanrag import ROUTE
from utils.durable_io import write_atomic

BREAKDOWNS = ("domain", "question_type", "static_or_dynamic", "popularity")


def _by_breakdown(records: list[Record], verdict_key: str) -> dict[str, Any]:
    """Scores of the records' `verdict_key` overall and by each breakdown that some record has."""
    groups: dict[str, dict[str, list[str]]] = {key: defaultdict(list) for key in BREAKDOWNS}
    for record in records:
        for key, buckets in groups.items():
            if record[key] not in (None, ""):
                buckets[str(record[key])].append(record[verdict_key])
    def scored(verdicts: list[str]) -> dict[str, Any]:
        return {**Scores.of(verdicts).as_dict(), "ci95": intervals(verdicts)}

    return {"overall": scored([r[verdict_key] for r in records]),
            **{f"by_{key}": {name: scored(v) for name, v in sorted(buckets.items())}
               for key, buckets in groups.items() if buckets}}


def _cause(failure: str) -> str:
    """A failure's kind, to count alike ones together: its stage and the error's name, without the message (which
    may hold a request id or a byte count)."""
    stage, _, why = failure.partition(": ")
    return f"{stage}: {why.split(':', 1)[0].split(' (', 1)[0][:80]}"


def failed_lines(summary: dict[str, Any]) -> list[str]:
    """The report's lines on answers that are not final (an LLM call or a stage failed), by cause."""
    failed = summary.get("failed")
    if not failed:
        return []
    return [f"answers with a failed LLM call or stage, not final (a resumed run answers them again): "
            f"{failed['answers']} of {summary['overall']['total']}",
            *(f"  {count:>5}  {cause}" for cause, count in failed["by_cause"].items())]


def score_records(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Scores of judged records (each has "verdict"), by breakdown; latency per query and per stage; the LLM calls per
    question where the records hold them.

    A breakdown whose field no record has (popularity outside Task 1/2 data) is left out. Records judged by
    the organisers' rules too ("organisers_verdict") get the same scores under "organisers". Latency is each
    query's share of its batch: batch seconds / batch size, and the same for every stage of the trace. With an
    answer gate, the scores are the gated ones and `gate` holds the ungated score and the paired difference;
    records with confidence signals get a `risk_coverage` curve (evaluation/gate_command.py).
    """
    records = records_of(lines)
    per_query: list[float] = []
    per_stage: dict[str, list[float]] = defaultdict(list)
    steps: dict[str, list[int]] = defaultdict(list)  # multi-hop strategies: LLM steps per query, by question type
    routes: Counter = Counter()
    for record in records:
        if route := record.value(ROUTE):
            routes[route] += 1
            steps[str(record.question_type or "unknown")].append(record.llm_steps)
        size = max(int(record.batch_size or 1), 1)
        if isinstance(record.batch_seconds, (int, float)):
            per_query.append(record.batch_seconds / size)
        for stage in record.stages:
            if stage.get("status") == "ok":
                per_stage[stage["stage"]].append(float(stage.get("seconds", 0.0)) / size)
    calls = [c for r in records if (c := r.llm_calls) is not None]
    organisers = records and all(r.has("organisers_verdict") for r in records)
    confidences = [r.judge_confidence for r in records if isinstance(r.judge_confidence, float)]
    # Why the pipeline said "i don't know": a backend or a stage that started failing mid-run shows up here.
    declined = Counter(_reason(r) for r in records if r.verdict == MISS)
    failed = [r for r in records if r.failures]
    attributed = any(r.attribution for r in records)
    return {
        **_by_breakdown(records, "verdict"),
        "judged_by": dict(Counter(r.judged_by if r.has("judged_by") else "rules" for r in records)),
        **({"organisers": {**_by_breakdown(records, "organisers_verdict"),
                           "judged_by": dict(Counter(r.organisers_judged_by for r in records))}}
           if organisers else {}),
        **({"attribution": attribution_table(lines)} if attributed else {}),
        **({"judge_confidence": {"verdicts": len(confidences), "uncertain": sum(c < UNCERTAIN for c in confidences),
                                 "below": UNCERTAIN}} if confidences else {}),
        **({"idk_reasons": dict(declined.most_common())} if declined else {}),
        **({"failed": {"answers": len(failed), "by_cause": dict(Counter(
            _cause(f) for r in failed for f in dict.fromkeys(r.failures)).most_common())}} if failed else {}),
        **(gate_summary(lines) or {}),
        "cut_by_grader": sum(bool(r.cut_by_grader) for r in records),
        "timed_out": sum(bool(r.timed_out) for r in records),
        **({"deadline_cuts": cuts} if (cuts := run_cuts(records)) else {}),
        "latency_s": {"per_query": latency(per_query), "per_stage": {k: latency(v) for k, v in per_stage.items()}},
        **({"llm_calls_per_query": sum(calls) / len(calls)} if calls else {}),
        **({"routes": dict(routes), "steps_by_question_type": {
            k: {"queries": len(v), "mean": sum(v) / len(v), "max": max(v)} for k, v in sorted(steps.items())}}
           if steps else {}),
    }


COLUMNS = ("total", "score", "accuracy", "hallucination", "missing", "unjudged")


def _sections(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(key, summary[key]) for key in summary if key.startswith("by_")]


def unjudged_range(scores: dict[str, Any]) -> str:
    """How many predictions are unjudged and the score range they allow."""
    low, high = scores["score_range"]
    return (f"{scores['unjudged']:.1%} unjudged; the score lies between {low:.3f} (all of them wrong) and "
            f"{high:.3f} (all correct)")


def _reason(record: Record) -> str:
    """The pipeline's reason for an "i don't know", without the query-specific detail after a colon's second
    part (so that "reasoning failed: ValueError: ..." groups by stage and error type)."""
    if record.timed_out:
        return "the batch ran over its time limit"
    reason = str(record.reason or "no reason recorded")
    return ":".join(reason.split(":")[:2]).strip()


def _idk_lines(reasons: dict[str, int], show: int = 5) -> list[str]:
    top = list(reasons.items())[:show]
    more = sum(reasons.values()) - sum(count for _, count in top)
    return [f"  {count:>5}  {reason}" for reason, count in top] + ([f"  {more:>5}  (other reasons)"] if more else [])


def judge_confidence(confidence: dict[str, Any]) -> str:
    return (f"verdicts with the judge's own probability: {confidence['verdicts']}, of which "
            f"{confidence['uncertain']} uncertain (P(verdict) < {confidence['below']}; their records' "
            "judge_confidence says which): read those before trusting a difference they could make")


def format_table(summary: dict[str, Any]) -> str:
    """Our scores, and beside them the organisers' rules' score, accuracy and hallucination ("org." columns)."""
    theirs = summary.get("organisers")
    header = (f"{'':<24}{'n':>5}{'score':>9}{'score 95% CI':>17}{'accuracy':>10}{'halluc.':>9}{'missing':>9}"
              f"{'unjudged':>10}")
    if theirs:
        header += f"{'org.score':>11}{'org.acc.':>10}{'org.hal.':>10}{'org.unj.':>10}"
    lines = [header, "-" * len(header)]

    def row(name: str, s: dict[str, Any], t: dict[str, Any] | None) -> str:
        line = (f"{name:<24}{s['total']:>5}{s['score']:>9.3f}{interval(s):>17}{s['accuracy']:>10.3f}"
                f"{s['hallucination']:>9.3f}{s['missing']:>9.3f}{s['unjudged']:>10.3f}")
        if t:
            line += f"{t['score']:>11.3f}{t['accuracy']:>10.3f}{t['hallucination']:>10.3f}{t['unjudged']:>10.3f}"
        return line

    lines.append(row("overall", summary["overall"], theirs and theirs["overall"]))
    for section, rows in _sections(summary):
        lines.append(f"{section.replace('_', ' ')}:")
        lines.extend(row(f"  {name}", s, theirs and theirs[section][name]) for name, s in rows.items())
    for label, scores in (("ours", summary["overall"]), ("organisers'", theirs and theirs["overall"])):
        if scores and scores["unjudged"]:
            lines.append(f"{label}: {unjudged_range(scores)}")
    if theirs:
        lines.append("org.: the organisers' rules (gold answer only, their \"i don't know\" and \"invalid\" rules; "
                     "unjudged where they would ask their LLM judge and ours gave no verdict)")
    lines.extend(corrected_lines(summary))
    if confidence := summary.get("judge_confidence"):
        lines.append(judge_confidence(confidence))
    if note := contains_note(summary["judged_by"]):
        lines.append(note)
    lines.extend(format_gate(summary))
    if summary.get("attribution"):
        lines.append("where the misses were lost (wrong and \"i don't know\" answers; evaluation/attribution.py):")
        lines.extend(_attribution_rows(summary["attribution"], "  {:<14}" + "{:>15}" * len(CLASSES)))
    if summary.get("idk_reasons"):
        lines.append("why the system said \"i don't know\" (the trace's reason; a failing backend shows here):")
        lines.extend(_idk_lines(summary["idk_reasons"]))
    lines.extend(failed_lines(summary))
    lines.extend(deadline_lines(summary))
    if summary.get("cut_by_grader"):
        lines.append(f"answers the grader cuts at 75 Llama-2 tokens: {summary['cut_by_grader']}")
    if summary.get("steps_by_question_type"):
        lines.append("multi-hop steps by question type (mean / max LLM calls per query):")
        lines.extend(f"  {k:<22}{v['mean']:>6.1f} / {v['max']}" for k, v in summary["steps_by_question_type"].items())
    return "\n".join(lines)


def _attribution_rows(table: dict[str, dict[str, int]], row: str, rule: str | None = None) -> list[str]:
    """The header (and `rule` under it) and one line per group, overall first, each formatted by `row`."""
    groups = ["overall", *sorted(g for g in table if g != "overall")]
    return [row.format("", *CLASSES), *([rule] if rule else []),
            *(row.format(g, *(table[g][c] for c in CLASSES)) for g in groups)]


def format_markdown(summary: dict[str, Any], title: str) -> str:
    def table(rows: dict[str, dict[str, Any]], first: str) -> list[str]:
        out = [f"| {first} | n | score | score 95% CI | accuracy | hallucination | missing | unjudged |",
               "|---|---|---|---|---|---|---|---|"]
        for name, s in rows.items():
            out.append(f"| {name} | {s['total']} | {s['score']:.3f} | {interval(s)} | "
                       + " | ".join(f"{s[c]:.3f}" for c in COLUMNS[2:]) + " |")
        return out

    lines = [f"# {title}", "", "## Overall", "", *table({"all": summary["overall"]}, ""), ""]
    if summary["overall"]["unjudged"]:
        lines += [f"Predictions: {unjudged_range(summary['overall'])}.", ""]
    lines += [f"Intervals: bootstrap 95% (percentile, {RESAMPLES} resamples, fixed seed); none under "
              f"{MIN_FOR_INTERVAL} questions.", ""]
    if corrected := corrected_lines(summary):
        lines += ["## Corrected for the judge's errors", "", *(f"{line}." for line in corrected), ""]
    for section, rows in _sections(summary):
        lines += [f"## {section.replace('by_', 'By ').replace('_', ' ')}", "", *table(rows, section[3:]), ""]
    lines += ["## Judged by", "", ", ".join(f"{k}: {v}" for k, v in summary["judged_by"].items()), ""]
    if note := contains_note(summary["judged_by"]):
        lines += [note[0].upper() + note[1:] + ".", ""]
    if confidence := summary.get("judge_confidence"):
        lines += [judge_confidence(confidence), ""]
    if theirs := summary.get("organisers"):
        lines += ["## By the organisers' rules", "", "The same predictions read as the organisers' evaluation reads "
                  "them: gold answer only, their \"i don't know\" and \"invalid\" rules, unjudged where they would "
                  "ask their LLM judge and ours gave no verdict (or none was given).", "",
                  *table({"all": theirs["overall"]}, ""), ""]
        for section, rows in _sections(theirs):
            lines += [*table(rows, section[3:]), ""]
        lines += ["Judged by: " + ", ".join(f"{k}: {v}" for k, v in theirs["judged_by"].items()), ""]
    if gate_lines := format_gate(summary):
        lines += ["## Answer gate and risk-coverage", "", "```", *gate_lines, "```", ""]
    if summary.get("attribution"):
        lines += ["## Where the misses were lost", "", "Wrong and \"i don't know\" answers by the first place the gold "
                  "answer went missing (evaluation/attribution.py defines each class).", "",
                  *_attribution_rows(summary["attribution"], "| {} |" + " {} |" * len(CLASSES),
                                     "|---|" + "---|" * len(CLASSES)), ""]
    if summary.get("idk_reasons"):
        lines += ["## Why \"i don't know\"", "", "| reason | answers |", "|---|---|",
                  *(f"| {reason} | {count} |" for reason, count in summary["idk_reasons"].items()), ""]
    if summary.get("failed"):
        lines += ["## Failed calls", "", "```", *failed_lines(summary), "```", ""]
    if cut := deadline_lines(summary):
        lines += ["## Cut by the batch deadline", "", "```", *cut, "```", ""]
    lines += [f"Answers the grader cuts at 75 Llama-2 tokens: {summary.get('cut_by_grader', 0)}", ""]
    lines += [f"Queries in batches over the time limit (answered \"i don't know\"): {summary['timed_out']}", ""]
    lat = summary["latency_s"]
    lines += [
        "## Latency (seconds per query)",
        "",
        "| | p50 | p95 | max |",
        "|---|---|---|---|",
        f"| query | {lat['per_query']['p50']:.2f} | {lat['per_query']['p95']:.2f} | {lat['per_query']['max']:.2f} |",
    ]
    lines += [f"| {name} | {v['p50']:.2f} | {v['p95']:.2f} | {v['max']:.2f} |" for name, v in lat["per_stage"].items()]
    if summary.get("steps_by_question_type"):
        lines += ["", "## Multi-hop steps (LLM calls per query)", "",
                  "Routes: " + ", ".join(f"{k}: {v}" for k, v in summary["routes"].items()), "",
                  "| question type | queries | mean steps | max steps |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['queries']} | {v['mean']:.1f} | {v['max']} |"
                  for k, v in summary["steps_by_question_type"].items()]
    if summary.get("skipped_lines"):
        lines += ["", f"Skipped malformed data lines: {summary['skipped_lines']}"]
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], out_dir: Path) -> list[Path]:
    """One bar chart per breakdown (score, accuracy, hallucination, missing per group), as PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    metrics = ("score", "accuracy", "hallucination", "missing")
    for section, rows in [("overall", {"all": summary["overall"]}), *_sections(summary)]:
        names = list(rows)
        figure, axis = plt.subplots(figsize=(max(4.0, 1.2 * len(names) + 2), 3.2))
        width = 0.8 / len(metrics)
        for offset, metric in enumerate(metrics):
            axis.bar([i + offset * width for i in range(len(names))], [rows[n][metric] for n in names], width,
                     label=metric)
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=30, ha="right")
        axis.axhline(0, color="black", linewidth=0.6)
        axis.set_ylim(-1, 1)
        axis.set_title(section.replace("_", " "))
        axis.legend(fontsize=7, ncols=4, loc="lower left")
        figure.tight_layout()
        image = io.BytesIO()
        figure.savefig(image, format="png", dpi=100)
        plt.close(figure)
        path = write_atomic(out_dir / f"chart_{section}.png", image.getvalue())
        paths.append(path)
    return paths


def write_report(summary: dict[str, Any], records: list[dict[str, Any]], out_dir: Path, title: str) -> list[Path]:
    """report.json, report.md, report.html (with every record) and the charts in out_dir; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = write_atomic(out_dir / "report.json", json.dumps(summary, indent=2) + "\n")
    md_path = write_atomic(out_dir / "report.md", format_markdown(summary, title))
    html_path = write_html(report_html(summary, records, title), out_dir / "report.html")
    return [json_path, md_path, html_path, *plot(summary, out_dir)]
