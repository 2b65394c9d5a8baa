"""KG reach benchmark: how often the facts a knowledge-graph question needs reach the final reasoning prompt.

Questions: benchmarks/kg_reach/questions.jsonl, CRAG format plus two fields of ours: `facts` (strings that must
all appear in the reasoning prompt, as the KG renders them) and `script` (what a competent LLM replies:
`{"entities": {...}}` for the rules method's extraction, `{"calls": [...]}` for the functions method). A
question with `absent` counts as reached when none of those strings reaches the prompt (an entity the KG does
not hold: nothing false may reach the prompt). Entity names in `script` are copied from the query as the user
wrote it; resolving them is the KG stage's job.

The fixture KG server (evaluation/kg_fixture over data/kg) runs on a free loopback port. Each run variant builds a
CragSystem on configs/cpu.yaml (task 2, attributes by ICL, pages in this process) over a scripted LLM: the
attributes prompt answers the question's true domain and dynamism (so `answer.dynamic_idk` acts as a perfect
classifier would), kg_entities / kg_functions answer the question's script, the reasoning prompt is recorded and
answered from the facts it shows, every other prompt answers "i don't know". Facts are looked for in the
knowledge-graph section of the recorded reasoning prompt, case-insensitively (numbers and short words as whole
tokens), so neither the question's own words nor the pages can count as a reached fact.

Variants: kg.method rules / functions (spans with --method: names from the question's words, no LLM) x
answer.dynamic_idk on / off x pages: none (the questions' empty search results) / 5 unrelated real pages of
data/crag_sample.jsonl (so the references stage has work). Every variant
embeds with the system's own embedder, the packaged all-MiniLM-L6-v2, as `make eval` and the grader's run do (the
KG stage ranks rows by meaning with it); `--embedder bag` swaps in the bag-of-words test embedder, which knows no
synonyms, to see what ranking by shared words alone reaches. Per variant: a
table of domain -> reached/total, the total, and the missed questions grouped by why (`no prompt: <the reason
the system gave>`, `no KG` section in the prompt, or in the KG section a `-fact` missing / an `+absent` string).
Last, the longest answer any run returned, in Llama-2 grader tokens.

It reports and never gates: exit 0; a broken question file is a one-line error and exit 2.

    .venv/bin/python -m benchmarks.kg_reach                 # all 8 variants, MiniLM
    .venv/bin/python -m benchmarks.kg_reach --show ID       # also print the KG lines each variant gave ID
    .venv/bin/python -m benchmarks.kg_reach --embedder bag  # the bag-of-words embedder instead of MiniLM
    .venv/bin/python -m benchmarks.kg_reach --method spans  # names from the question's spans, no LLM (kg.method)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.config import REPO_ROOT
from models.gate.answer_gate import gate_settings
from models.llm.backend import Sample
from models.stages.precheck import DynamicIDKSettings
from utils.cli import command
from utils.errors import HarnessError

QUESTIONS = REPO_ROOT / "benchmarks" / "kg_reach" / "questions.jsonl"
SAMPLE = REPO_ROOT / "data" / "crag_sample.jsonl"
DOMAINS = ("finance", "movie", "music", "sports", "open")
DYNAMISM = ("static", "slow-changing", "fast-changing", "real-time")
QUESTION_TYPES = ("simple", "simple_w_condition", "comparison", "aggregation", "set", "multi-hop",
                  "post-processing", "false_premise")
CRAG_FIELDS = ("interaction_id", "query", "query_time", "domain", "question_type", "static_or_dynamic", "answer",
               "alt_ans", "search_results")
QUERY_TIME = re.compile(r"^\d{2}/\d{2}/\d{4}, \d{2}:\d{2}:\d{2} PT$")
# Script values that name something (an entity, a company, a ticker): each must be copied from the query.
ENTITY_NAMES = frozenset({"company_name", "ticker", "movie_name", "person", "artist_name", "band_name", "song_name",
                          "team", "main_entity"})
CALL_NAMES = frozenset({"query", "entity", "person_name", "movie_name", "company_name", "ticker_name",
                        "artist_name", "song_name", "band_name", "team_name"})
PAGES_PER_QUESTION = 5
IDK_REPLY = "===START===\n## Answer: i don't know\n## False Premise: no\n===END==="


class QuestionError(HarnessError, ValueError):
    """A question file the benchmark cannot use; the message names the line and the problem."""


# --- the question file ---

def named_values(question: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, value) for every script value that names something: entity names and name arguments of calls."""
    script = question.get("script") or {}
    found = [(f"entities.{key}", value) for key, value in (script.get("entities") or {}).items()
             if key in ENTITY_NAMES]
    for number, call in enumerate(script.get("calls") or []):
        args = call.get("args") if isinstance(call, dict) else None
        found += [(f"calls[{number}].{key}", value) for key, value in (args or {}).items() if key in CALL_NAMES]
    return found


def question_problem(question: Any) -> str | None:
    """Why a question cannot be used, or None."""
    if not isinstance(question, dict):
        return "not a JSON object"
    missing = [key for key in (*CRAG_FIELDS, "facts", "script") if key not in question]
    if missing:
        return f"missing field(s) {missing}"
    query = question["query"]
    if not isinstance(query, str) or not query.strip() or query != query.lower():
        return "query must be a non-empty lower-case string"
    if question["domain"] not in DOMAINS:
        return f"domain {question['domain']!r} is not one of {DOMAINS}"
    if question["static_or_dynamic"] not in DYNAMISM:
        return f"static_or_dynamic {question['static_or_dynamic']!r} is not one of {DYNAMISM}"
    if question["question_type"] not in QUESTION_TYPES:
        return f"question_type {question['question_type']!r} is not one of {QUESTION_TYPES}"
    if not isinstance(question["query_time"], str) or not QUERY_TIME.match(question["query_time"]):
        return f"query_time {question['query_time']!r} is not like '03/05/2024, 23:18:31 PT'"
    if not isinstance(question["answer"], str) or not isinstance(question["alt_ans"], list):
        return "answer must be a string and alt_ans a list"
    if question["search_results"] != []:
        return "search_results must be []"
    facts, absent = question["facts"], question.get("absent", [])
    for key, value in (("facts", facts), ("absent", absent)):
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            return f"{key} must be a list of non-empty strings"
    if not facts and not absent:
        return "facts is empty and no absent strings are given"
    script = question["script"]
    if not isinstance(script, dict) or not isinstance(script.get("entities"), dict) \
            or not isinstance(script.get("calls"), list):
        return "script must be {\"entities\": {...}, \"calls\": [...]}"
    for call in script["calls"]:
        if not isinstance(call, dict) or not isinstance(call.get("function_name"), str) \
                or not isinstance(call.get("args"), dict):
            return f"script call {call!r} is not {{\"function_name\": ..., \"args\": {{...}}}}"
    for where, value in named_values(question):
        if not isinstance(value, str) or value not in query:
            return f"script {where} = {value!r} is not written in the query {query!r}"
    return None


def check_questions(questions: list[Any]) -> None:
    """Raise QuestionError (one line) on the first unusable question or a repeated id or query."""
    seen: dict[str, set[str]] = {"interaction_id": set(), "query": set()}
    for number, question in enumerate(questions, start=1):
        problem = question_problem(question)
        if problem:
            name = question.get("interaction_id", "?") if isinstance(question, dict) else "?"
            raise QuestionError(f"question {number} ({name}): {problem}")
        for key, values in seen.items():
            if question[key] in values:
                raise QuestionError(f"question {number}: {key} {question[key]!r} is repeated")
            values.add(question[key])


def load_questions(path: Path = QUESTIONS) -> list[dict[str, Any]]:
    """The questions of a .jsonl file, checked; QuestionError when the file cannot be used."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise QuestionError(f"{path}: {err}") from err
    questions = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                questions.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise QuestionError(f"{path}:{number}: not JSON ({err})") from err
    if not questions:
        raise QuestionError(f"{path}: no questions")
    check_questions(questions)
    return questions


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


# --- the scripted LLM ---

def prompt_marker(path: Path) -> str:
    """How a prompt file's system message starts (up to its first template tag), to tell prompts apart."""
    import yaml

    system = yaml.safe_load(path.read_text(encoding="utf-8"))["system"]
    return system.split("{")[0].strip()[:60]


class ReachLLM:
    """Answers each prompt as a competent LLM would for the benchmark's questions, and records the reasoning
    prompts (the user message, by query). Questions are recognised by the last "Question: " line."""

    SCRIPTED = ("attributes", "kg_entities", "kg_functions", "reasoning")

    def __init__(self, questions: list[dict[str, Any]], prompts: Any) -> None:
        self.by_query = {q["query"]: q for q in questions}
        self.markers = {name: prompt_marker(prompts.get(name).path) for name in self.SCRIPTED}
        self.reasoning: dict[str, str] = {}

    def prompt_name(self, conversation: list[dict[str, str]]) -> str | None:
        system = conversation[0]["content"] if conversation and conversation[0]["role"] == "system" else ""
        return next((name for name, marker in self.markers.items() if system.startswith(marker)), None)

    def question(self, conversation: list[dict[str, str]]) -> dict[str, Any] | None:
        text = conversation[-1]["content"] if conversation else ""
        asked = re.findall(r"^Question: (.*)$", text, re.MULTILINE)
        return self.by_query.get(asked[-1].strip()) if asked else None

    def generate(self, conversations: list[list[dict[str, str]]], params: Any) -> list[list[Sample]]:
        return [[Sample(self.reply(c))] * max(params.n, 1) for c in conversations]

    def reply(self, conversation: list[dict[str, str]]) -> str:
        name, question = self.prompt_name(conversation), self.question(conversation)
        if name is None or question is None:
            return IDK_REPLY
        script = question["script"]
        if name == "attributes":
            return f"domain: {question['domain']}\ndynamism: {question['static_or_dynamic']}"
        if name == "kg_entities":
            return json.dumps({"domain": question["domain"], "entities": script["entities"]})
        if name == "kg_functions":
            return json.dumps(script["calls"])
        prompt = conversation[-1]["content"]
        self.reasoning[question["query"]] = prompt
        seen = evidence(prompt)
        shown = [fact for fact in question["facts"] if contains(seen, fact)]
        answer = question["answer"] if reached(prompt, question) else ", ".join(shown) or "i don't know"
        return f"From the knowledge graph.\n===START===\n## Answer: {answer}\n## False Premise: no\n===END==="


def contains(text: str, fact: str) -> bool:
    """Whether normalised `text` holds `fact`: numbers and dates not as part of a longer number ("405" is not in
    "405.8"), words of 3 letters or fewer as whole words ("ja" is not in "japan"), anything else as a substring."""
    wanted = normalise(fact)
    if re.fullmatch(r"[\d.,:\-]+", wanted) or len(wanted) <= 3:
        return re.search(rf"(?<![\w.]){re.escape(wanted)}(?!\w|\.\d)", text) is not None
    return wanted in text


def evidence(prompt: str | None) -> str:
    """The knowledge-graph section of a reasoning prompt, normalised ("" when it has none)."""
    return normalise("\n".join(kg_lines(prompt))) if prompt else ""


def reached(prompt: str | None, question: dict[str, Any]) -> bool:
    """All facts in the prompt's KG section and no absent string there; a question with no facts (an entity the KG
    does not hold) is also reached when no reasoning prompt was written (nothing false reached the LLM)."""
    if prompt is None:
        return not question["facts"]
    seen = evidence(prompt)
    return (all(contains(seen, fact) for fact in question["facts"])
            and not any(contains(seen, text) for text in question.get("absent", [])))


def kg_lines(prompt: str) -> list[str]:
    """The knowledge-graph lines of a rendered reasoning prompt."""
    match = re.search(r"### Knowledge graph\n(.*?)(?:\n### |\Z)", prompt, re.DOTALL)
    return [line[2:] for line in match.group(1).splitlines() if line.startswith("- ")] if match else []


def why_missed(prompt: str | None, question: dict[str, Any], reason: str) -> str:
    if prompt is None:
        return f"no prompt: {reason}"
    if not kg_lines(prompt):
        return "no KG"
    seen = evidence(prompt)
    missing = [f"-{fact}" for fact in question["facts"] if not contains(seen, fact)]
    present = [f"+{text}" for text in question.get("absent", []) if contains(seen, text)]
    return " ".join(missing + present)


# --- pages ---

def page_pool() -> list[tuple[str, dict[str, Any]]]:
    """(domain of its question, page) for the distinct non-empty pages of data/crag_sample.jsonl, in file order."""
    pages: dict[str, tuple[str, dict[str, Any]]] = {}
    for line in SAMPLE.read_text(encoding="utf-8").splitlines():
        example = json.loads(line) if line.strip() else {}
        for page in example.get("search_results", []):
            if page.get("page_result"):
                pages.setdefault(page["page_url"], (example.get("domain", ""), page))
    return list(pages.values())


def unrelated_pages(question: dict[str, Any], pool: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Pages of other domains whose name and snippet share no word of 4+ letters with the question, its answer or
    its facts: PAGES_PER_QUESTION of them, from a place in the pool that depends on the question's id."""
    words = set(re.findall(r"[a-z]{4,}", " ".join([question["query"], question["answer"], *question["facts"]])
                           .lower()))
    chosen = [page for domain, page in pool if domain != question["domain"] and not words & set(
        re.findall(r"[a-z]{4,}", f"{page['page_name']} {page.get('page_snippet', '')}".lower()))]
    start = sum(map(ord, question["interaction_id"])) % max(len(chosen), 1)
    return (chosen[start:] + chosen[:start])[:PAGES_PER_QUESTION]


# --- the runs ---

@dataclass
class Variant:
    method: str
    dynamic_idk: bool
    pages: bool

    def __str__(self) -> str:
        return (f"{self.method}, dynamic_idk {'on' if self.dynamic_idk else 'off'}, "
                f"{'5 unrelated pages' if self.pages else 'no pages'}")


@dataclass
class Outcome:
    variant: Variant
    seconds: float
    reached: dict[str, bool] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    answers: dict[str, str] = field(default_factory=dict)
    kg: dict[str, list[str]] = field(default_factory=dict)


def build_config(variant: Variant, base_url: str, cache_dir: str) -> Any:
    from models.config import SystemConfig
    from models.loading import load_config

    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    # reach is measured in the reasoning prompt, which cpu.yaml turns off for SmolLM2 (its summariser sees no KG lines)
    config.reasoning.max_tokens = SystemConfig().reasoning.max_tokens
    config.task = 2
    config.strategy, config.multihop = "hybrid", "none"
    config.attributes.method = "icl"
    config.attributes.icl.n = 1
    config.section("answer", DynamicIDKSettings).dynamic_idk = variant.dynamic_idk
    # the scripted LLM gives no log-probabilities; what reaches the prompt is measured
    gate_settings(config).gate = None
    config.references.workers = 1
    config.references.cache_dir = cache_dir
    config.section("kg").method = variant.method
    config.section("kg").base_url = base_url
    return config


def run_variant(variant: Variant, questions: list[dict[str, Any]], base_url: str, cache_dir: str,
                pool: list[tuple[str, dict[str, Any]]], embedder: Any) -> Outcome:
    from models.prompting import PromptLibrary
    from models.system import CragSystem

    config = build_config(variant, base_url, cache_dir)
    llm = ReachLLM(questions, PromptLibrary(config.prompts))
    system = CragSystem(config, llm=llm, embedder=embedder)
    outcome = Outcome(variant, 0.0)
    started = time.perf_counter()
    try:
        size = system.get_batch_size()
        for start in range(0, len(questions), size):
            chunk = questions[start:start + size]
            batch = {key: [q[key] for q in chunk] for key in ("interaction_id", "query", "query_time")}
            batch["search_results"] = [unrelated_pages(q, pool) if variant.pages else q["search_results"]
                                       for q in chunk]
            result = system.answer_batch(batch)
            answers = result.answers
            reasons = {t["interaction_id"]: t["reason"] for t in result.trace}
            for question, answer in zip(chunk, answers):
                qid, prompt = question["interaction_id"], llm.reasoning.get(question["query"])
                outcome.answers[qid] = answer
                outcome.reached[qid] = reached(prompt, question)
                outcome.kg[qid] = kg_lines(prompt) if prompt else []
                if not outcome.reached[qid]:
                    outcome.why[qid] = why_missed(prompt, question, str(reasons.get(qid) or ""))
    finally:
        system.close()
    outcome.seconds = time.perf_counter() - started
    return outcome


def print_table(outcome: Outcome, questions: list[dict[str, Any]]) -> None:
    print(f"\n{outcome.variant} ({outcome.seconds:.1f} s)")
    totals = defaultdict(lambda: [0, 0])
    for question in questions:
        for key in (question["domain"], "total"):
            totals[key][0] += outcome.reached[question["interaction_id"]]
            totals[key][1] += 1
    for key in (*DOMAINS, "total"):
        hit, count = totals[key]
        print(f"  {key:<8} {hit:>3}/{count:<3} {100 * hit / max(count, 1):5.1f}%")
    groups: dict[str, list[str]] = defaultdict(list)
    for qid, why in outcome.why.items():
        if why.startswith(("no prompt", "no KG")):
            groups[why].append(qid)
        else:
            groups["KG section (-fact missing, +absent string there)"].append(f"{qid} ({why})")
    print(f"  missed ({len(outcome.why)}):" + ("" if outcome.why else " none"))
    for why, items in groups.items():
        print(textwrap.fill(", ".join(items), width=118, initial_indent=f"    {why}: ", subsequent_indent=" " * 6,
                            break_on_hyphens=False, break_long_words=False))


def longest_answer(outcomes: list[Outcome]) -> str:
    """The longest answer any run returned, in the grader's Llama-2 tokens (the grader reads the first 75)."""
    from utils.grader_tokens import GRADER_MAX_TOKENS, grader_token_count

    counted = [(grader_token_count(answer), qid, str(o.variant), answer) for o in outcomes
               for qid, answer in o.answers.items()]
    if not counted:
        return "longest answer: no answers"
    tokens, qid, variant, answer = max(counted)
    shown = answer if len(answer) <= 120 else answer[:117] + "..."
    return (f"longest answer: {tokens} Llama-2 grader tokens (the grader reads {GRADER_MAX_TOKENS}), "
            f"{qid} ({variant}): {shown}")


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument("--method", choices=("rules", "functions", "spans"), nargs="+", default=["rules", "functions"],
                        help="spans asks the scripted LLM nothing (left out by default: make bench's time)")
    parser.add_argument("--embedder", choices=("minilm", "bag"), default="minilm",
                        help="minilm: the packaged all-MiniLM-L6-v2 (the system's own); bag: bag-of-words")
    parser.add_argument("--show", nargs="*", default=[], metavar="ID",
                        help="print the KG lines that reached the prompt of these questions, per variant")
    args = parser.parse_args(argv)
    questions = load_questions(args.questions)

    from loguru import logger

    from evaluation.kg_fixture.launch import fixture_kg

    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    if args.embedder == "bag":
        from utils.bag_embedder import BagOfWordsEmbedder

        embedder: Any = BagOfWordsEmbedder()
    else:
        from models.config import EmbedderConfig
        from models.retrieval.embedder import Embedder

        embedder = Embedder(EmbedderConfig())
    counts = ", ".join(f"{d} {sum(q['domain'] == d for q in questions)}" for d in DOMAINS)
    print(f"KG reach: {len(questions)} questions ({counts}), embedder {embedder.name}; a question is reached when "
          "all its facts (and none of its absent strings) are in the reasoning prompt")
    pool = page_pool()
    variants = [Variant(m, idk, pages) for m in args.method for idk in (True, False) for pages in (False, True)]
    outcomes = []
    with fixture_kg() as base_url, tempfile.TemporaryDirectory(prefix="kg-reach-") as cache_dir:
        for variant in variants:
            outcome = run_variant(variant, questions, base_url, cache_dir, pool, embedder)
            outcomes.append(outcome)
            print_table(outcome, questions)
            for qid in args.show:
                print(f"  KG lines of {qid}:" + "".join(f"\n    {line}" for line in outcome.kg.get(qid, []))
                      + (" none" if not outcome.kg.get(qid) else ""))
    print("\nsummary (reached/total):")
    for outcome in outcomes:
        print(f"  {str(outcome.variant):<48} {sum(outcome.reached.values()):>3}/{len(questions)}")
    print(longest_answer(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
