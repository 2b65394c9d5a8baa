"""report.html and compare.html: one static page each, readable with no server and no network.

Everything is inside the file: the stylesheet and script of evaluation/assets/ inlined, the charts drawn as SVG
here, and the questions' records as JSON for the record panel. The question table is written here and the
script only filters it and opens a record, so the page shows its numbers even with scripts off. Every text of
the data reaches the page escaped (html.escape here, textContent in the script).

A record's references and lines of evidence (the KG's rows, the calculations: each field a stage declares as
`Evidence`, under its title) that hold a gold answer are marked the way error
attribution finds it (evaluation/attribution.py: case, accents, thousands separators and punctuation folded);
the script highlights the literal occurrences inside them.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from evaluation.attribution import CLASSES, gold_answers, holds
from evaluation.deadline_cuts import deadline_cell, flips_cut_cell, flips_cut_line
from evaluation.judge import contains_note, corrected_lines
from evaluation.metrics import MIN_FOR_INTERVAL
from evaluation.record import OVER_LIMIT, Record, as_record, records_of
from models.kg.kg_stage import KG_CALLS
from models.stages.hanrag import ROUTE, SUB_QUERIES
from utils.durable_io import write_atomic

ASSETS = Path(__file__).resolve().parent / "assets"
BREAKDOWNS = (("by_domain", "domain"), ("by_question_type", "question type"))
LEGEND = ('<span class="key correct"></span> correct <span class="key miss"></span> i don\'t know '
          '<span class="key wrong"></span> wrong <span class="key unjudged"></span> unjudged · grey scores: fewer '
          f"than {MIN_FOR_INTERVAL} questions, no interval")
FILTERS = (("domain", "domain"), ("type", "question type"), ("verdict", "verdict"), ("attribution", "lost at"))


def _page(title: str, body: str, records: list[dict[str, Any]]) -> str:
    # Every "<" escaped: no "</script>" ends the block early, and no "<!--" opens HTML's escaped script state, in
    # which the real "</script>" no longer closes it
    payload = json.dumps(records, ensure_ascii=False).replace("<", "\\u003c")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{escape(title)}</title>\n'
            f'<style>\n{(ASSETS / "report.css").read_text(encoding="utf-8")}</style>\n</head>\n<body>\n{body}\n'
            f'<dialog id="record" aria-label="question record"></dialog>\n'
            f'<script type="application/json" id="records">{payload}</script>\n'
            f'<script>\n{(ASSETS / "report.js").read_text(encoding="utf-8")}</script>\n</body>\n</html>\n')


def _pct(value: float) -> str:
    return f"{value:.1%}"


def _card(label: str, value: str, note: str = "") -> str:
    return (f'<div class="card"><div class="label">{escape(label)}</div><div class="value">{escape(value)}</div>'
            f'<div class="ci">{escape(note)}</div></div>')


def _ci(scores: dict[str, Any], key: str, signed: bool = False) -> str:
    ci = (scores.get("ci95") or {}).get(key)
    if not ci:
        return f"n<{MIN_FOR_INTERVAL}: no interval"
    form = "{:+.3f}" if signed else "{:.1%}"
    return f"95% CI [{form.format(ci[0])}, {form.format(ci[1])}]"


def score_chart(title: str, rows: dict[str, dict[str, Any]]) -> str:
    """Per group: its verdicts as a stacked bar (correct, "i don't know", wrong, unjudged) and its score on
    -1..1 with the 95% interval as a whisker; a group under MIN_FOR_INTERVAL questions is drawn grey, without
    a whisker."""
    label_w, bar_w, gap, score_w, row_h = 150, 220, 30, 260, 26
    width, height = label_w + bar_w + gap + score_w + 50, 40 + row_h * len(rows)
    zero = label_w + bar_w + gap + score_w / 2
    parts = [f'<svg class="chart" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             f'<title>{escape(title)}</title>',
             f'<text x="0" y="14" font-weight="600">{escape(title)}</text>',
             f'<text x="{label_w}" y="32">verdicts</text>',
             f'<text x="{label_w + bar_w + gap}" y="32">score (-1 .. +1) and its 95% CI</text>',
             f'<line class="axis" x1="{zero}" y1="38" x2="{zero}" y2="{height}"/>']
    for index, (name, s) in enumerate(rows.items()):
        y = 40 + index * row_h
        parts.append(f'<text x="0" y="{y + 16}">{escape(str(name))} ({s["total"]})</text>')
        x = float(label_w)
        for css, share in (("correct", s["accuracy"]), ("miss", s["missing"]), ("wrong", s["hallucination"]),
                           ("unjudged", s["unjudged"])):
            parts.append(f'<rect class="{css}" x="{x:.1f}" y="{y + 4}" width="{share * bar_w:.1f}" height="16">'
                         f'<title>{css}: {_pct(share)}</title></rect>')
            x += share * bar_w
        half, few = score_w / 2, s["total"] < MIN_FOR_INTERVAL
        left, right = sorted((zero, zero + s["score"] * half))
        parts.append(f'<rect class="{"few" if few else "score"}" x="{left:.1f}" y="{y + 6}" '
                     f'width="{max(right - left, 1):.1f}" height="12"><title>score {s["score"]:+.3f}'
                     f'{f" (n<{MIN_FOR_INTERVAL})" if few else ""}</title></rect>')
        ci = (s.get("ci95") or {}).get("score")
        if ci and not few:
            lo, hi = (zero + c * half for c in ci)
            parts.append(f'<line class="whisker" x1="{lo:.1f}" y1="{y + 12}" x2="{hi:.1f}" y2="{y + 12}"/>'
                         f'<line class="whisker" x1="{lo:.1f}" y1="{y + 7}" x2="{lo:.1f}" y2="{y + 17}"/>'
                         f'<line class="whisker" x1="{hi:.1f}" y1="{y + 7}" x2="{hi:.1f}" y2="{y + 17}"/>')
        parts.append(f'<text x="{label_w + bar_w + gap + score_w + 8}" y="{y + 16}">{s["score"]:+.2f}</text>')
    parts.append("</svg>")
    return "".join(parts)


def risk_coverage_chart(curve: dict[str, Any]) -> str:
    """Accuracy of the answered (line) and the score of answering only them (dashed) against the share answered,
    answers best first by P(correct)."""
    w, h, left, top = 420, 240, 48, 20
    plot_w, plot_h = w - left - 20, h - top - 40
    points = curve["points"]

    def x(share: float) -> float:
        return left + share * plot_w

    def y(value: float) -> float:  # -1 .. 1, bottom to top
        return top + (1 - (value + 1) / 2) * plot_h

    accuracy = " ".join(f"{x(p['coverage']):.1f},{y(p['accuracy']):.1f}" for p in points)
    score = " ".join(f"{x(p['coverage']):.1f},{y(p['score']):.1f}" for p in points)
    title = f"risk-coverage, ordered by {curve['ordered_by']}"
    parts = [f'<svg class="chart" id="risk-coverage" role="img" width="{w}" height="{h}" viewBox="0 0 {w} {h}">',
             f"<title>{escape(title)}</title>",
             f'<line class="axis" x1="{left}" y1="{y(0):.1f}" x2="{left + plot_w}" y2="{y(0):.1f}"/>',
             f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}"/>',
             f'<text x="{left - 6}" y="{y(1) + 4:.1f}" text-anchor="end">1</text>',
             f'<text x="{left - 6}" y="{y(0) + 4:.1f}" text-anchor="end">0</text>',
             f'<text x="{left - 6}" y="{y(-1) + 4:.1f}" text-anchor="end">-1</text>',
             f'<text x="{left + plot_w / 2}" y="{h - 8}" text-anchor="middle">share of the questions answered</text>',
             f'<polyline class="curve accuracy" fill="none" points="{accuracy}"><title>accuracy of the answered'
             "</title></polyline>",
             f'<polyline class="curve score" fill="none" stroke-dasharray="4 3" points="{score}"><title>score if '
             "only these were answered</title></polyline>"]
    parts += [f'<circle class="point" cx="{x(p["coverage"]):.1f}" cy="{y(p["accuracy"]):.1f}" r="2.5"><title>'
              f'{_pct(p["coverage"])} answered (p &gt;= {p["p"]:.3f}): accuracy {_pct(p["accuracy"])}, score '
              f'{p["score"]:+.3f}</title></circle>' for p in points]
    parts.append("</svg>")
    return "".join(parts)


def gate_section(summary: dict[str, Any]) -> str:
    """The answer gate's cards (its score without the gate, what it withheld, the paired difference) and the
    risk-coverage curve; empty for a run without signals."""
    gate, curve = summary.get("gate"), summary.get("risk_coverage")
    if not gate and not curve:
        return ""
    parts = ['<section id="gate"><h2>Answer gate and risk-coverage</h2>']
    if gate:
        paired = gate["paired_ci"]
        ci = paired.get("ci95")
        parts.append('<div class="cards">'
                     + _card("score without the gate", f"{gate['ungated']['score']:+.3f}",
                             _ci(gate["ungated"], "score", signed=True))
                     + _card("withheld", f"{gate['withheld']} of {gate['scored']}",
                             f"threshold P(correct) {gate['threshold']:.3f}")
                     + _card("with - without", f"{paired['difference']:+.3f}",
                             f"paired 95% CI [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else
                             f"n<{MIN_FOR_INTERVAL}: no interval") + "</div>")
    if curve and curve.get("points"):
        parts.append(risk_coverage_chart(curve))
        parts.append(f'<p class="note">Answers best first by {escape(curve["ordered_by"])}: the accuracy of those '
                     "answered (line) and the score of answering only them (dashed). Where the dashed line falls, "
                     "answers start to cost points.</p>")
    elif curve:
        parts.append(f'<p class="note">Risk-coverage: {escape(curve["note"])}</p>')
    parts.append("</section>")
    return "".join(parts)


def _attribution_table(table: dict[str, dict[str, int]]) -> str:
    groups = ["overall", *sorted(g for g in table if g != "overall")]
    head = "".join(f'<th class="num">{escape(c)}</th>' for c in CLASSES)
    body = "".join(f'<tr><td>{escape(g)}</td>' + "".join(f'<td class="num">{table[g][c]}</td>' for c in CLASSES)
                   + "</tr>" for g in groups)
    return (f'<table id="attribution-table"><thead><tr><th>domain</th>{head}</tr></thead><tbody>{body}</tbody>'
            '</table>')


def _filters(rows: list[dict[str, str]], fields: tuple[tuple[str, str], ...]) -> str:
    controls = []
    for field, label in fields:
        values = sorted({row[field] for row in rows if row[field]})
        options = "".join(f'<option value="{escape(v)}">{escape(v)}</option>' for v in values)
        controls.append(f'<label>{escape(label)}<select id="filter-{field}" data-field="{field}">'
                        f'<option value="">all</option>{options}</select></label>')
    controls.append('<label>text<input id="filter-text" type="search" placeholder="question, answer, id"></label>')
    return f'<div class="filters">{"".join(controls)}<span id="shown" class="note"></span></div>'


def _row(data: dict[str, str], cells: list[tuple[str, str]]) -> str:
    attributes = " ".join(f'data-{k}="{escape(v)}"' for k, v in data.items())
    return (f'<tr tabindex="0" {attributes}>'
            + "".join(f'<td class="{css}">{escape(text)}</td>' for css, text in cells) + "</tr>")


def _golds(record: Record) -> list[str]:
    """The gold answers as written, for the script's literal highlighting."""
    return [str(a) for a in record.golds if a]


def _facts(record: Record) -> list[list[Any]]:
    facts = [["gold answer", record.answer, True]]
    if record.alt_answers:
        facts.append(["alternatives", "; ".join(map(str, record.alt_answers)), True])
    facts.append(["prediction", record.prediction, True])
    return facts


def record_panel(line: Record | dict[str, Any]) -> dict[str, Any]:
    """What the record panel of report.html shows for one question: the facts, then the references and each
    recorded block of evidence (marked where they hold a gold answer), the KG calls, the multi-hop route, the
    stages, and the prompts if the run recorded them (--record-prompts)."""
    record = as_record(line)
    trace = record.trace or {}
    golds = gold_answers(record)
    verdict = str(record.verdict or "")
    if record.judge_confidence is not None:
        verdict += f" (judge's P = {record.judge_confidence:.2f})"
    facts = _facts(record) + [
        ["verdict", verdict, False], ["judged by", record.judged_by, False],
        ["judge's reason", record.judge_reason or "", False],
        ["organisers' verdict", record.organisers_verdict, False],
        ["lost at", record.attribution or "", False],
        ["pipeline's reason", record.reason or "", False],
        ["domain / type / dynamism", f"{record.domain} / {record.question_type} / {record.static_or_dynamic}",
         False],
        ["predicted domain / dynamism", f"{(trace.get('predicted') or {}).get('domain')} / "
                                        f"{(trace.get('predicted') or {}).get('dynamism')}", False],
        ["id", record.interaction_id, False]]
    if record.timed_out:
        facts.append(["timed out", "the batch ran over its time limit", False])
    if cuts := [c for c in record.deadline_cuts or [] if c != OVER_LIMIT]:
        facts.append(["cut by the deadline", ", ".join(cuts), False])
    sections: list[dict[str, Any]] = []
    references = record.references
    if references:
        sections.append({"title": f"references that reached the prompt ({len(references)}, best first)",
                         "kind": "list", "items": [
                             {"head": f"{r.get('page')} · {r.get('kind')} · score {r.get('score')}"
                                      f"{' · ' + str(r.get('url')) if r.get('url') else ''}",
                              "text": r.get("text") or "", "gold": bool(golds) and holds([r.get("text") or ""], golds)}
                             for r in references]})
    for spec, lines in record.evidence(listed=False):  # every block of evidence the stages declare, by its title
        sections.append({"title": spec.evidence.title if spec.evidence else spec.name, "kind": "list", "items": [
            {"text": str(line), "gold": bool(golds) and holds([str(line)], golds)} for line in lines]})
    if calls := record.value(KG_CALLS):
        sections.append({"title": "KG calls", "kind": "table", "columns": ["call", "arguments", "answered"],
                         "rows": [[c.get("call"), json.dumps(c.get("args"), ensure_ascii=False),
                                   "yes" if c.get("answered") else "no"] for c in calls]})
    if (route := record.value(ROUTE)) or record.value(SUB_QUERIES):
        sections.append({"title": f"multi-hop route: {route} ({trace.get('steps')} LLM steps)",
                         "kind": "list", "items": [{"text": str(q)} for q in record.value(SUB_QUERIES) or []]})
    if trace.get("stages"):
        sections.append({"title": "stages", "kind": "table", "columns": ["stage", "status", "seconds", "note"],
                         "rows": [[s.get("stage"), s.get("status"), f"{float(s.get('seconds') or 0):.2f}",
                                   s.get("note") or ""] for s in trace["stages"]]})
    for prompt in trace.get("prompts") or []:
        messages = "\n\n".join(f"[{m.get('role')}]\n{m.get('content')}" for m in prompt.get("messages") or [])
        replies = "\n---\n".join(map(str, prompt.get("replies") or []))
        sections.append({"title": f"prompt {prompt.get('prompt')} ({prompt.get('stage')})", "kind": "pre",
                         "text": f"{messages}\n\n[reply]\n{replies}"})
    return {"id": str(record.interaction_id), "title": record.query or "", "golds": _golds(record),
            "facts": [fact for fact in facts if fact[1] not in (None, "")], "sections": sections}


def report_html(summary: dict[str, Any], lines: list[dict[str, Any]], title: str) -> str:
    """The page of one run: the summary with intervals, charts by domain and question type, the attribution
    table, and every question in a table that filters and opens its record."""
    overall = summary["overall"]
    cards = [_card("score", f"{overall['score']:+.3f}", _ci(overall, "score", signed=True)),
             _card("accuracy", _pct(overall["accuracy"]), _ci(overall, "accuracy")),
             _card("hallucination", _pct(overall["hallucination"]), _ci(overall, "hallucination")),
             _card("i don't know", _pct(overall["missing"])),
             _card("unjudged", _pct(overall["unjudged"]),
                   f"score between {overall['score_range'][0]:+.3f} and {overall['score_range'][1]:+.3f}"
                   if overall["unjudged"] else "")]
    if fixed := summary.get("corrected"):  # beside the judged score: the same run, the judge's errors taken out
        cards.insert(1, _card("corrected score", f"{fixed['score']:+.3f}", _ci(fixed, "score", signed=True)))
    if theirs := summary.get("organisers"):
        cards.append(_card("organisers' score", f"{theirs['overall']['score']:+.3f}",
                           f"unjudged {_pct(theirs['overall']['unjudged'])}"))
    charts = "".join(score_chart(f"by {label}", summary[key]) for key, label in BREAKDOWNS if summary.get(key))
    records = records_of(lines)
    rows = [{"id": str(r.interaction_id), "domain": str(r.domain or ""), "type": str(r.question_type or ""),
             "verdict": str(r.verdict or ""), "attribution": str(r.attribution or "")} for r in records]
    table = "".join(_row(row, [("", row["domain"]), ("", row["type"]),
                               (f"verdict verdict-{row['verdict']}", row["verdict"]), ("", row["attribution"]),
                               ("", str(r.query or "")), ("", str(r.prediction)),
                               ("", str(r.answer or ""))]) for row, r in zip(rows, records))
    confidence = summary.get("judge_confidence")
    body = [f"<header><h1>{escape(title)}</h1>",
            f'<p class="meta">{overall["total"]} questions · judge {escape(str(summary.get("judge", "rules")))} · '
            f"judged by {escape(', '.join(f'{k}: {v}' for k, v in summary['judged_by'].items()))}</p></header>",
            f'<section id="summary"><div class="cards">{"".join(cards)}</div>',
            f'<p class="note">Score = accuracy - hallucination. Intervals: bootstrap 95%; none under '
            f"{MIN_FOR_INTERVAL} questions.{' ' + escape(_confidence_note(confidence)) if confidence else ''}"
            f"{' ' + escape(note[0].upper() + note[1:]) + '.' if (note := contains_note(summary['judged_by'])) else ''}"
            f"{''.join(' ' + escape(line) + '.' for line in corrected_lines(summary))}"
            "</p>"
            "</section>",
            f'<section id="charts"><h2>Scores by group</h2><div class="charts">{charts}</div>'
            f'<p class="note legend">{LEGEND}</p></section>']
    if section := gate_section(summary):
        body.append(section)
    if summary.get("attribution"):
        body.append('<section id="attribution"><h2>Where the misses were lost</h2><p class="note">Wrong and '
                    "\"i don't know\" answers by the first place the gold answer went missing "
                    f"(evaluation/attribution.py).</p>{_attribution_table(summary['attribution'])}</section>")
    body.append(f'<section id="questions"><h2>Questions</h2>{_filters(rows, FILTERS)}'
                '<table id="question-table"><thead><tr><th>domain</th><th>type</th><th>verdict</th>'
                "<th>lost at</th><th>question</th><th>prediction</th><th>gold</th></tr></thead>"
                f"<tbody>{table}</tbody></table></section>")
    return _page(title, "\n".join(body), [record_panel(r) for r in records])


def _confidence_note(confidence: dict[str, Any]) -> str:
    return (f"{confidence['uncertain']} of {confidence['verdicts']} LLM verdicts are uncertain (the judge's "
            f"P(verdict) < {confidence['below']}).")


def compare_html(result: dict[str, Any], name_a: str, name_b: str) -> str:
    """The page of `compare A B`: the paired difference and every flipped question, filterable by how it
    flipped and by domain, each opening both predictions and both runs' reasons."""
    ci = result["ci95"]
    interval = f"95% CI [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else f"n<{MIN_FOR_INTERVAL}: no interval"
    reading = ("" if not ci else "the interval holds 0: no difference shown" if ci[0] <= 0 <= ci[1]
               else "the interval excludes 0")
    cards = [_card("B - A", f"{result['difference']:+.3f}", interval), _card("score A", f"{result['score_a']:+.3f}"),
             _card("score B", f"{result['score_b']:+.3f}"), _card("questions", str(result["questions"]),
                                                                  f"{result['unjudged_left_out']} unjudged left out")]
    flips = [(kind, row) for kind, rows in result["flipped"].items() for row in rows]
    rows = [{"id": str(row["interaction_id"]), "kind": kind, "domain": str(row.get("domain") or ""),
             "type": str(row.get("question_type") or "")} for kind, row in flips]
    table = "".join(_row(data, [("", data["kind"]), ("", data["domain"]), ("", str(row.get("query") or "")),
                                ("", str(row.get("a"))), ("", str(row.get("b"))), ("", str(row.get("answer") or ""))])
                    for data, (_, row) in zip(rows, flips))
    panels = []
    for data, (kind, row) in zip(rows, flips):
        facts = _facts(Record({**row, "prediction": None}))[:-1] + [
            ["A", row.get("a"), True], ["A's verdict", row["verdicts"][0], False],
            ["A's reason", (row.get("reasons") or ["", ""])[0] or "", False],
            ["B", row.get("b"), True], ["B's verdict", row["verdicts"][1], False],
            ["B's reason", (row.get("reasons") or ["", ""])[1] or "", False],
            *[[f"{side}'s deadline cuts", ", ".join(cuts) or "none", False]
              for side, cuts in zip("AB", row.get("deadline_cuts") or [None, None]) if cuts is not None],
            ["flipped", kind, False], ["id", row["interaction_id"], False]]
        panels.append({"id": data["id"], "title": row.get("query") or "", "golds": _golds(Record(row)), "facts": facts,
                       "sections": []})
    cut = f'<p class="note">{escape(line)}</p>' if (line := flips_cut_line(result)) else ""
    body = (f"<header><h1>{escape(name_b)} against {escape(name_a)}</h1>"
            f'<p class="meta">A: {escape(name_a)} · B: {escape(name_b)} · {result["only_in_a"]} questions only in A, '
            f'{result["only_in_b"]} only in B</p></header>'
            f'<section id="summary"><div class="cards">{"".join(cards)}</div><p class="note">Paired bootstrap: '
            f"questions resampled with both verdicts. {escape(reading)}</p>{cut}</section>"
            f'<section id="questions"><h2>Flipped questions ({len(flips)})</h2>'
            f'{_filters(rows, (("kind", "flipped"), ("domain", "domain"), ("type", "question type")))}'
            '<table id="question-table"><thead><tr><th>flipped</th><th>domain</th><th>question</th><th>A</th>'
            f"<th>B</th><th>gold</th></tr></thead><tbody>{table}</tbody></table></section>")
    return _page(f"compare {name_b} against {name_a}", body, panels)


def ablation_html(table: dict[str, Any], title: str) -> str:
    """The page of `ablate`: each row's verdicts and score (with its interval), and the table of rows with each
    one's paired difference against the row it is set against."""
    chart = score_chart("each row's verdicts and score", {row["name"]: row["overall"] for row in table["rows"]})
    head = ("<tr><th>row</th><th>edits</th><th>correct</th><th>missing</th><th>hallucination</th><th>score</th>"
            "<th>Δ score</th><th>95% CI</th><th>against</th><th>LLM calls / q</th><th>s / q</th>"
            "<th>cut by the deadline</th><th>flips the deadline cut</th></tr>")
    lines = []
    for row in table["rows"]:
        s, diff = row["overall"], row.get("difference") or {}
        ci = diff.get("ci95")
        calls = row.get("llm_calls_per_question")
        cells = [row["name"], " ".join(row["edits"]) or "-", _pct(s["accuracy"]), _pct(s["missing"]),
                 _pct(s["hallucination"]), f"{s['score']:+.3f}",
                 f"{diff['difference']:+.3f}" if diff else "-",
                 f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "-", str(row.get("against") or "-"),
                 "-" if calls is None else f"{calls:.2f}", f"{row['seconds_per_question']:.2f}",
                 deadline_cell(row), flips_cut_cell(diff)]
        lines.append("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>")
    shown = table.get("smallest_shown")
    note = (f"On these {table['questions']} questions a difference within ±{shown:.3f} is not shown (the median "
            "half-width of the intervals of the rows that changed a verdict)." if shown is not None
            else "No interval: too few questions, or no row changed a verdict.")
    body = (f"<header><h1>{escape(title)}</h1><p class=\"meta\">{escape(table['mode'])} · {table['questions']} "
            f"questions · judge {escape(str(table['judge']))} · every row answered with the answer gate off</p>"
            f"</header><section id=\"summary\">{chart}<p class=\"note\">{escape(note)}</p></section>"
            f"<section id=\"rows\"><h2>Rows</h2><table><thead>{head}</thead><tbody>{''.join(lines)}</tbody></table>"
            "</section>")
    return _page(title, body, [])


def write_html(page: str, path: Path) -> Path:
    return write_atomic(path, page)

