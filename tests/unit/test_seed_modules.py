"""The seed's reasoning modules with a scripted LLM: attributes, pre-check, knowledge, calculator, reasoning
prompt, summariser and corner cases."""

import pickle

import pytest

from models.config import DOMAINS, DYNAMISM, REPO_ROOT
from models.llm.backend import DEADLINE, LENGTH, BackendUnavailable, Sample
from models.loading import load_config
from models.stages.attributes import SVMAttributes, demonstrations, parse_icl, read_labelled, vote
from models.stages.calculator import calculations, candidate_expressions
from models.stages.precheck import DynamicIDKSettings
from tests.conftest import to_batch
from tests.fakes import SEED_REPLY, HashEmbedder, ScriptedLLM, by_prompt, prompt_name
from utils.errors import ConfigError
from utils.grader_tokens import grader_token_count

LABELLED = REPO_ROOT / "data" / "attributes" / "questions.jsonl"


def block(answer, premise="no"):
    return f"Let me think.\n===START===\n## Answer: {answer}\n## False Premise: {premise}\n===END==="


def prompts_sent(llm, name):
    return [conv for conversations, _ in llm.calls for conv in conversations if prompt_name(conv) == name]


# --- reasoning output, summariser, false premise -------------------------------------------------------------

def test_unparsable_reasoning_goes_to_the_summariser(make_system, sample_examples):
    llm = ScriptedLLM(by_prompt(reasoning=lambda c: "I think it is Nolan" if "inception" in c[1]["content"]
                                else block("1989"), summariser="Answer: [8][2] Christopher Nolan\nextra"))
    answers = make_system(llm).batch_generate_answer(to_batch(sample_examples[:2]))
    assert answers == ["Christopher Nolan", "1989"]
    assert len(prompts_sent(llm, "summariser")) == 1  # only the query whose output had no answer


def test_summariser_with_nothing_to_say_gives_idk(make_system, sample_examples):
    llm = ScriptedLLM(by_prompt(reasoning="no block here", summariser="   "))
    system = make_system(llm)
    result = system.answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == ["i don't know"]
    assert "summariser returned nothing" in result.trace[0]["reason"]


def test_a_summariser_call_the_deadline_ended_before_any_text_says_so(make_system, sample_examples):
    """What the openai backend gives for a request the batch deadline ended: no text, DEADLINE; not a failed call."""
    llm = ScriptedLLM(by_prompt(reasoning="no block here", summariser=Sample("", DEADLINE)))
    result = make_system(llm).answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == ["i don't know"]
    assert result.trace[0]["reason"] == "the summariser's generation was cut short (deadline)"
    assert not result.trace[0].get("llm_failures")
    assert result.trace[0]["deadline_cuts"] == ["reasoning: call cut"]


def test_summariser_off_declines_an_unparsable_output_without_a_call(make_system, sample_examples, cpu_config):
    cpu_config.reasoning.summariser_max_tokens = 0
    llm = ScriptedLLM(by_prompt(reasoning=lambda c: "I think it is Nolan" if "inception" in c[1]["content"]
                                else block("1989"), summariser="Christopher Nolan"))
    result = make_system(llm).answer_batch(to_batch(sample_examples[:2]))
    assert result.answers == ["i don't know", "1989"] and not prompts_sent(llm, "summariser")
    assert "the summariser is off" in result.trace[0]["reason"]


def test_shipped_cpu_config_answers_through_the_summariser_alone(make_system, sample_examples, cpu_config):
    shipped = load_config(REPO_ROOT / "configs" / "cpu.yaml").reasoning
    cpu_config.reasoning.max_tokens = shipped.max_tokens
    assert shipped.max_tokens == 0 and shipped.summariser_max_tokens > 0
    llm = ScriptedLLM(by_prompt(reasoning=block("1989"), summariser="Christopher Nolan"))
    result = make_system(llm).answer_batch(to_batch(sample_examples[:2]))
    assert result.answers == ["Christopher Nolan"] * 2 and not prompts_sent(llm, "reasoning")
    assert len(prompts_sent(llm, "summariser")) == 2
    assert all(t["signals"]["reasoning.summariser"] for t in result.trace)
    assert [t["deadline_cuts"] for t in result.trace] == [[], []]  # recorded, and none: not a record from before

    llm = ScriptedLLM(by_prompt(summariser="   "))
    result = make_system(llm).answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == ["i don't know"]
    assert result.trace[0]["reason"] == "the reasoning prompt is off and the summariser returned nothing"


def test_a_config_where_nothing_answers_is_refused(tmp_path):
    path = tmp_path / "silent.yaml"
    path.write_text("reasoning:\n  max_tokens: 0\n  summariser_max_tokens: 0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="max_tokens and summariser_max_tokens are both 0"):
        load_config(path)


def test_false_premise_gives_invalid_question(make_system, sample_examples):
    llm = ScriptedLLM(by_prompt(reasoning=block("he never won a second one", premise="yes")))
    assert make_system(llm).batch_generate_answer(to_batch(sample_examples[:1])) == ["invalid question"]


@pytest.mark.parametrize("answer", ["I don\u2019t know", "Sorry, i dont know.", "I do not know the answer"])
def test_idk_phrases_become_exactly_idk(make_system, sample_examples, answer):
    llm = ScriptedLLM(by_prompt(reasoning=block(answer)))
    assert make_system(llm).batch_generate_answer(to_batch(sample_examples[:1])) == ["i don't know"]


def test_answers_over_the_grader_limit_are_cut_at_a_clause_boundary(make_system, cpu_config, sample_examples):
    cpu_config.reasoning.max_tokens = 512  # the long answer is generated whole; the answer step trims it
    items = ", ".join(f"film number {i} of the year" for i in range(1, 30))
    llm = ScriptedLLM(by_prompt(reasoning=block(items)))
    system = make_system(llm)
    result = system.answer_batch(to_batch(sample_examples[:1]))
    (answer,) = result.answers
    assert grader_token_count(answer) <= 75 and items.startswith(answer) and answer.endswith("of the year")
    assert "cut at a clause boundary" in result.trace[0]["reason"]


@pytest.mark.parametrize("reason", [LENGTH, DEADLINE])
def test_a_generation_cut_short_is_never_an_answer(make_system, sample_examples, reason):
    cut = Sample("Thinking.\n===START===\n## Answer: christopher nol", reason)
    llm = ScriptedLLM(by_prompt(reasoning=cut, summariser=Sample("Christopher", reason)))
    system = make_system(llm)
    result = system.answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == ["i don't know"]
    assert f"cut short ({reason})" in result.trace[0]["reason"]


def test_a_whole_answer_line_before_the_cut_is_an_answer(make_system, sample_examples):
    llm = ScriptedLLM(by_prompt(reasoning=Sample("===START===\n## Answer: Christopher Nolan\n## False Prem", LENGTH)))
    assert make_system(llm).batch_generate_answer(to_batch(sample_examples[:1])) == ["Christopher Nolan"]
    cut = Sample("Christopher Nolan\nHe also dir", LENGTH)
    llm = ScriptedLLM(by_prompt(reasoning="no answer here", summariser=cut))
    assert make_system(llm).batch_generate_answer(to_batch(sample_examples[:1])) == ["Christopher Nolan"]


def test_the_summariser_s_whole_reply_answers_as_the_organisers_baseline_reads_it(make_system, sample_examples,
                                                                                 cpu_config):
    """`summariser_answer: reply`: every line, the budget's cut kept; a reply the deadline cut is still declined."""
    cpu_config.reasoning.summariser_answer = "reply"
    reply = Sample("The director of Inception\nis Christopher Nol", LENGTH, tokens=("The director of Inception\n",
                   "is Christopher", " Nol"), token_logprobs=(-0.5, -1.0, -3.0))
    llm = ScriptedLLM(by_prompt(reasoning="no answer here", summariser=reply))
    result = make_system(llm).answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == ["The director of Inception is Christopher Nol"]
    assert result.trace[0]["signals"]["reasoning.answer_logprob_min"] == -3.0  # the whole reply's tokens

    llm = ScriptedLLM(by_prompt(reasoning="no answer here", summariser=Sample("Christopher", DEADLINE)))
    result = make_system(llm).answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == ["i don't know"] and "cut short (deadline)" in result.trace[0]["reason"]


def test_a_cut_short_reasoning_output_falls_back_to_the_summariser(make_system, sample_examples):
    llm = ScriptedLLM(by_prompt(reasoning=Sample("===START===\n## Answer: christopher nol", LENGTH),
                                summariser="Christopher Nolan"))
    assert make_system(llm).batch_generate_answer(to_batch(sample_examples[:1])) == ["Christopher Nolan"]


# --- knowledge -------------------------------------------------------------------------------------------------

def test_knowledge_answer_reaches_reasoning_as_another_agents(make_system, sample_examples, cpu_config):
    cpu_config.knowledge.enabled = True
    llm = ScriptedLLM(by_prompt(knowledge=block("Christopher Nolan (from memory)")))
    make_system(llm).batch_generate_answer(to_batch(sample_examples[:1]))
    (reasoning,) = prompts_sent(llm, "reasoning")
    assert (
        "### Answer from another agent (without references)\nChristopher Nolan (from memory)" in reasoning[1]["content"]
    )
    assert "### References" not in prompts_sent(llm, "knowledge")[0][1]["content"]  # knowledge sees no pages


def test_knowledge_false_premise_and_unparsable_output(make_system, sample_examples, cpu_config):
    cpu_config.knowledge.enabled = True
    llm = ScriptedLLM(by_prompt(knowledge=lambda c: block("x", "yes") if "inception" in c[1]["content"]
                                else "rambling"))
    make_system(llm).batch_generate_answer(to_batch(sample_examples[:2]))
    first, second = prompts_sent(llm, "reasoning")
    assert "another agent (without references)\ninvalid question" in first[1]["content"]
    assert "another agent" not in second[1]["content"]


# --- calculator ------------------------------------------------------------------------------------------------

def test_calculator_results_reach_the_reasoning_prompt(make_system, sample_examples, cpu_config):
    cpu_config.calculator.enabled = True
    cpu_config.calculator.n = 3
    code = ("```python\n(60922 - 26974) / 26974 * 100  # growth in percent\ngrowth = 60922 / 26974\n"
            "__import__('os').getcwd()\n9**9**9\n```")
    llm = ScriptedLLM(by_prompt(calculator=code))
    make_system(llm).batch_generate_answer(to_batch(sample_examples[5:6]))
    (reasoning,) = prompts_sent(llm, "reasoning")
    user = reasoning[1]["content"]
    assert "### Calculation results\n- (60922 - 26974) / 26974 * 100 = 125.8545266  (growth in percent)" in user
    assert "- 60922 / 26974 = 2.258545266  (growth)" in user
    assert "__import__" not in user and "9**9**9" not in user
    assert user.count("(growth in percent)") == 1  # three identical samples, one result
    (calculator_call,) = [params for conversations, params in llm.calls
                          if prompt_name(conversations[0]) == "calculator"]
    assert calculator_call.n == 3


HEADED = "Calculation results of 2023: 125.9%"  # a reply that starts like the heading and goes on: an answer


@pytest.mark.parametrize("reply, answer", [("Calculation results:", "i don't know"),
                                           ("calculation results", "i don't know"), (HEADED, HEADED)])
def test_a_summariser_reply_that_is_an_evidence_heading_is_not_an_answer(make_system, sample_examples, cpu_config,
                                                                        reply, answer):
    """SmolLM2 sometimes copies the summariser prompt's "Calculation results:" line: the heading alone declines."""
    cpu_config.calculator.enabled = True
    llm = ScriptedLLM(by_prompt(calculator="```python\n(60922 - 26974) / 26974 * 100\n```", reasoning="no block",
                                summariser=reply))
    result = make_system(llm).answer_batch(to_batch(sample_examples[5:6]))
    (summariser,) = prompts_sent(llm, "summariser")
    assert "Calculation results:\n- (60922 - 26974) / 26974 * 100 = 125.8545266" in summariser[1]["content"]
    assert result.answers == [answer]
    if answer == "i don't know":
        assert result.trace[0]["reason"] == ("the summariser repeated the prompt's heading 'Calculation results:', "
                                             "not an answer")


def test_expressions_are_read_from_code_blocks_or_lines():
    assert candidate_expressions("```py\nx = 2 + 2\n3 * 4  # twelve\nprint('hi')\n```\n1 + 1") == [
        ("2 + 2", "x"), ("3 * 4", "twelve")]
    assert candidate_expressions("Revenue: 10\n10 * 1.5\n") == [("Revenue: 10", ""), ("10 * 1.5", "")]
    assert calculations(["1 + 1\n2 * 1\n1+1", "max(1, 2)"], max_results=5) == ["1 + 1 = 2"]  # same value once
    assert calculations(["1\n2\n3\n4"], max_results=2) == ["1 = 1", "2 = 2"]


# --- attributes ------------------------------------------------------------------------------------------------

def test_votes_and_ties():
    assert vote(["static", "static", "real-time"], DYNAMISM, prefer_last=True) == "static"
    assert vote(["static", "fast-changing"], DYNAMISM, prefer_last=True) == "fast-changing"  # tie: the dynamic one
    votes = ["slow-changing", "static", "real-time", "real-time", "static"]
    assert vote(votes, DYNAMISM, prefer_last=True) == "real-time"
    assert vote(["music", "finance"], DOMAINS, prefer_last=False) == "finance"  # tie: first in the label order
    assert vote(["nonsense"], DYNAMISM, prefer_last=True) is None


@pytest.mark.parametrize("reply, expected", [
    ("domain: finance\ndynamism: real-time", ("finance", "real-time")),
    ("Domain: Movie\nDynamism: Fast changing", ("movie", "fast-changing")),
    ("domain: cooking\nstatic_or_dynamic: static", (None, "static")),
    ("no idea", (None, None)),
])
def test_parse_icl(reply, expected):
    assert parse_icl(reply) == expected


def test_icl_votes_and_dynamic_queries_answer_idk_without_llm_stages(make_system, sample_examples, cpu_config):
    cpu_config.attributes.method = "icl"
    cpu_config.attributes.icl.n = 4
    cpu_config.knowledge.enabled = True

    def attributes(conversation):  # the inception question is voted dynamic by a 2-2 tie
        if "inception" in conversation[1]["content"].rsplit("Question:", 1)[1]:
            attributes.calls += 1
            return "domain: movie\ndynamism: " + ("static" if attributes.calls % 2 else "real-time")
        return "domain: music\ndynamism: static"
    attributes.calls = 0

    llm = ScriptedLLM(by_prompt(attributes=attributes))
    system = make_system(llm)
    result = system.answer_batch(to_batch(sample_examples[:2]))
    answers = result.answers
    assert answers == ["i don't know", "paris"]
    assert "predicted real-time" in result.trace[0]["reason"]
    # the vote's shares are the method's probabilities (signals for the answer gate)
    inception, other = (trace["signals"] for trace in result.trace)
    assert (inception["attributes.domain_share"], inception["attributes.dynamism_share"]) == (1.0, 0.5)
    assert (other["attributes.domain_share"], other["attributes.dynamism_share"]) == (1.0, 1.0)
    sent = prompts_sent(llm, "reasoning") + prompts_sent(llm, "knowledge")
    assert all("inception" not in conv[1]["content"] for conv in sent)
    (attribute_params,) = [p for convs, p in llm.calls if prompt_name(convs[0]) == "attributes"]
    assert attribute_params.n == 4
    demos = prompts_sent(llm, "attributes")[0][1]["content"].count("dynamism:")
    assert demos >= 5 * len(DYNAMISM)  # demonstrations of every class


def test_dynamic_idk_switch_off_answers_dynamic_queries(make_system, sample_examples, cpu_config):
    cpu_config.attributes.method = "icl"
    cpu_config.section("answer", DynamicIDKSettings).dynamic_idk = False
    llm = ScriptedLLM(by_prompt(attributes="domain: movie\ndynamism: real-time"))
    assert make_system(llm).batch_generate_answer(to_batch(sample_examples[:1])) == ["paris"]


def test_demonstrations_cover_every_class():
    rows = read_labelled(LABELLED)
    assert len(rows) >= 300
    assert {r["domain"] for r in rows} == set(DOMAINS) and {r["static_or_dynamic"] for r in rows} == set(DYNAMISM)
    demos = demonstrations(rows, per_class=5, seed=0)
    for key, labels in (("domain", DOMAINS), ("static_or_dynamic", DYNAMISM)):
        assert all(sum(d[key] == label for d in demos) >= 5 for label in labels)
    assert demos == demonstrations(rows, per_class=5, seed=0)  # reproducible


def test_svm_trains_saves_loads_and_predicts_in_the_pipeline(make_system, sample_examples, cpu_config, tmp_path):
    rows = read_labelled(LABELLED)[::3]  # a slice: 100 questions
    embedder = HashEmbedder()
    model = SVMAttributes.train(embedder.encode([r["query"] for r in rows]), [r["domain"] for r in rows],
                                [r["static_or_dynamic"] for r in rows], embedder.name)
    path = tmp_path / "svm.pkl"
    model.save(path)
    loaded = SVMAttributes.load(path)
    assert loaded.embedder == "hash-512"
    vectors = embedder.encode(["what is the stock price of apple right now?", "who wrote pride and prejudice?"])
    assert loaded.predict(vectors) == model.predict(vectors)

    cpu_config.attributes.method = "svm"
    cpu_config.attributes.svm_model = str(path)
    system = make_system(ScriptedLLM())
    result = system.answer_batch(to_batch(sample_examples[:2]))
    assert system.pipeline[0].name == "attributes"
    assert all(r["status"] == "ok" for r in result.trace[0]["stages"])


def test_svm_model_file_problems_are_clear(tmp_path):
    with pytest.raises(BackendUnavailable, match="train one with tools/train_attributes.py"):
        SVMAttributes.load(tmp_path / "missing.pkl")
    (tmp_path / "junk.pkl").write_bytes(b"not a pickle")
    with pytest.raises(BackendUnavailable, match="unreadable"):
        SVMAttributes.load(tmp_path / "junk.pkl")
    (tmp_path / "other.pkl").write_bytes(pickle.dumps({"format": "something else"}))
    with pytest.raises(BackendUnavailable, match="not an attributes SVM model"):
        SVMAttributes.load(tmp_path / "other.pkl")


# --- deadline --------------------------------------------------------------------------------------------------

def test_optional_stages_are_skipped_first_when_time_is_short(make_system, sample_examples, cpu_config):
    cpu_config.knowledge.enabled = True
    cpu_config.calculator.enabled = True
    llm = ScriptedLLM()
    system = make_system(llm, per_query_s=3.0, safety_margin_s=0.0)  # 3 s: knowledge needs 3.5, reasoning 1.5
    result = system.answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == ["paris"]
    statuses = {r["stage"]: r["status"] for r in result.trace[0]["stages"]}
    assert statuses == {"references": "ok", "evidence": "ok", "knowledge": "skipped", "calculator": "skipped",
                        "reasoning": "ok", "answer": "ok"}
    assert SEED_REPLY in llm.reply(prompts_sent(llm, "reasoning")[0])


def test_r2ag_prompt_mode_without_the_reasoning_prompt_is_refused(tmp_path):
    path = tmp_path / "r2ag.yaml"
    path.write_text("reasoning:\n  max_tokens: 0\nr2ag:\n  enabled: true\n  checkpoint: x.pt\n  mode: prompt\n",
                    encoding="utf-8")
    with pytest.raises(ConfigError, match="r2ag.mode prompt puts its embeddings into the reasoning prompt"):
        load_config(path)
