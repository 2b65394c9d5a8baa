import pytest

import models.loading  # noqa: F401  (registers the stages' fields)
from evaluation.choices import check_variant
from models.config import ConfigError
from models.prompting import PROMPT_DIR, PromptError, PromptLibrary, load_prompt, render_with_evidence
from models.state import QueryState
from tests.conftest import write

GOOD = "variables: [query]\nsystem: Be brief.\nuser: 'Q: {{ query }}'\n"


def test_render_gives_system_and_user_messages(tmp_path):
    prompt = load_prompt(write(tmp_path / "p.yaml", GOOD))
    assert prompt.render(query="why?") == [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "Q: why?"}]


def test_missing_variable_is_an_error_not_a_blank(tmp_path):
    prompt = load_prompt(write(tmp_path / "p.yaml", GOOD))
    with pytest.raises(PromptError, match="missing \\['query'\\]"):
        prompt.render()


def test_missing_attribute_is_an_error(tmp_path):
    prompt = load_prompt(write(tmp_path / "p.yaml", "variables: [ref]\nsystem: s\nuser: '{{ ref.title }}'\n"))
    with pytest.raises(PromptError, match="title"):
        prompt.render(ref={})


def test_undeclared_variable_fails_at_load(tmp_path):
    with pytest.raises(PromptError, match="undeclared \\['context'\\]"):
        load_prompt(write(tmp_path / "p.yaml", "variables: [query]\nsystem: s\nuser: '{{ context }}'\n"))


def test_syntax_error_names_file_and_line(tmp_path):
    with pytest.raises(PromptError, match="p.yaml: user template, line 1"):
        load_prompt(write(tmp_path / "p.yaml", "variables: []\nsystem: s\nuser: '{% for %}'\n"))


def test_config_override_points_at_variant(tmp_path):
    variant = write(tmp_path / "variant.yaml", GOOD.replace("Be brief.", "Variant."))
    library = PromptLibrary({"reasoning": str(variant)})
    assert library.get("reasoning").render(query="q")[0]["content"] == "Variant."
    with pytest.raises(PromptError, match="prompt 'nonexistent' not found"):
        library.get("nonexistent")


def _state(**fields):
    from models.kg.kg_stage import KG_RESULTS
    from models.stages.calculator import CALCULATIONS
    from models.stages.knowledge import KNOWLEDGE

    state = QueryState(0, "id", "who?", "03/01/2024", [])
    for spec, value in ((KG_RESULTS, fields.get("kg")), (CALCULATIONS, fields.get("calculations")),
                        (KNOWLEDGE, fields.get("knowledge"))):
        if value is not None:
            state[spec] = value
    return state


def test_shipped_reasoning_prompt_renders_every_section():
    state = _state(kg=["movie: Inception, director: Nolan"], calculations=["2024 - 2010 = 14"],
                   knowledge="christopher nolan")
    messages = render_with_evidence(
        PromptLibrary().get("reasoning"), state, query="who?", query_time="03/01/2024",
        references=[{"text": "Nolan directed it.", "page_name": "Inception", "page_last_modified": "2024",
                     "retrieval_marker": ""}],
        tables=[{"text": "Page name: T\n| a | b |", "retrieval_marker": ""}])
    user = messages[1]["content"]
    assert "[1] Inception (updated 2024)" in user and "Nolan directed it." in user and "who?" in user
    for section in ("### Tables", "| a | b |", "### Knowledge graph", "director: Nolan", "### Calculation results",
                    "2024 - 2010 = 14", "### Answer from another agent", "christopher nolan",
                    "Current time: 03/01/2024"):
        assert section in user
    assert "## False Premise:" in messages[0]["content"]
    assert not state.unshown


def test_reasoning_prompt_leaves_out_empty_sections():
    # the evidence variables no stage fed are optional: rendered as none, not refused
    user = render_with_evidence(PromptLibrary().get("reasoning"), _state(), query="q", query_time="t", references=[],
                                tables=[])[1]["content"]
    assert "(none)" in user
    assert not any(s in user for s in ("### Tables", "### Knowledge graph", "### Calculation", "another agent"))


def test_evidence_a_prompt_does_not_show_is_in_the_record():
    # the summariser lists every listed block (the KG's rows), not another agent's answer (listed=False): that
    # block is named on the query's record
    state = _state(kg=["movie: Inception, director: Nolan"], knowledge="nolan")
    user = render_with_evidence(PromptLibrary().get("summariser"), state, query="q", query_time="t",
                                references=[])[1]["content"]
    assert "Knowledge graph:\n- movie: Inception, director: Nolan" in user
    assert state.unshown == ["summariser: knowledge"]
    assert state.record()["unshown"] == state.unshown


@pytest.mark.parametrize("name", ["reasoning", "summariser", "knowledge", "calculator", "attributes"])
def test_every_shipped_prompt_loads(name):
    assert PromptLibrary().get(name).variables


@pytest.mark.parametrize("path", sorted((PROMPT_DIR / "variants").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_variant_fits_the_prompt_it_replaces(path):
    # a variant named <prompt>_<what> is rendered by <prompt>'s stage: its variables, and evidence blocks where that
    # stage fills each block a prompt names
    name = next(stem for stem in sorted(p.stem for p in PROMPT_DIR.glob("*.yaml")) if path.stem.startswith(f"{stem}_"))
    check_variant(name, path, str(path))


def test_a_variant_names_evidence_blocks_only_where_its_stage_fills_every_block(tmp_path):
    state = _state(kg=["Spirited Away original language: ja"])
    shows_kg = load_prompt(PROMPT_DIR / "variants" / "summariser_kg.yaml", "summariser")
    user = render_with_evidence(shows_kg, state, query="q", query_time="t", references=[])[1]["content"]
    assert "- Spirited Away original language: ja" in user and state.unshown == []
    # the KG stage renders its extraction prompt with its own values: a block named there would never be filled
    extraction = (PROMPT_DIR / "kg_entities.yaml").read_text().replace("domain]", "domain, kg_results]", 1)
    with pytest.raises(ConfigError, match="a prompt of another stage"):
        check_variant("kg_entities", write(tmp_path / "kg_entities_kg.yaml", extraction), "--variant")


def test_the_one_line_variants_reply_is_read_by_the_reasoning_stage():
    from models.stages.reasoning import parse_structured

    system = load_prompt(PROMPT_DIR / "variants" / "reasoning_one_line.yaml", "reasoning").system.render()
    assert "Answer: " in system  # the label the stage's parser reads, when no ===START=== block comes
    assert parse_structured("Answer: 1989").answer == "1989"


LOOPED = """# a comment line
variables: [query, items]
system: Be brief.
user: |
  {% for item in items %}
  - {{ item.text }}
  {% else %}
  (none)
  {% endfor %}
  Q: {{ query }}
"""


def test_a_prompt_s_digest_follows_what_it_can_render_not_its_comments(tmp_path):
    digest = load_prompt(write(tmp_path / "p.yaml", LOOPED)).digest
    assert digest.startswith("template-sha256:")
    unchanged = [LOOPED.replace("a comment line", "another comment"),  # a YAML comment
                 LOOPED.replace("Q: {{ query }}", "Q: {{query}}{# a template comment #}"),  # spaces in a tag
                 LOOPED.replace("system: Be brief.", "system: 'Be brief.'")]  # the same string, quoted
    changed = [LOOPED.replace("Be brief.", "Be short."), LOOPED.replace("item.text", "item.title"),
               LOOPED.replace("(none)", "(nothing)"), LOOPED.replace("[query, items]", "[query, items, other]")]
    for i, text in enumerate(unchanged + changed):
        assert (load_prompt(write(tmp_path / f"v{i}.yaml", text)).digest == digest) == (text in unchanged), text


def test_the_budget_planner_counts_what_a_prompt_renders_for_every_query(tmp_path):
    from models.estimates import QUERY_TOKENS, template_tokens, tokens

    prompt = load_prompt(write(tmp_path / "p.yaml", LOOPED))
    assert prompt.fixed_text() == "Be brief.\n(none)\nQ:"
    library = PromptLibrary({"p": str(tmp_path / "p.yaml")})
    assert template_tokens(library, "p") == tokens(len("Be brief.\n(none)\nQ:")) + QUERY_TOKENS
    # a comment, or a block that renders only with its evidence, costs no token of the plan
    write(tmp_path / "p.yaml", "# a longer comment\n" + LOOPED.replace(
        "  Q:", "  {% for block in items %}\n  ### {{ block.title }}\n  {% endfor %}\n  Q:"))
    assert template_tokens(PromptLibrary({"p": str(tmp_path / "p.yaml")}), "p") == tokens(19) + QUERY_TOKENS


@pytest.mark.parametrize("path", sorted(PROMPT_DIR.rglob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_prompt_has_a_fixed_text(path):
    # every construct of the shipped templates (sums of lists, calls, attributes) renders with its variables empty
    prompt = load_prompt(path)
    assert prompt.fixed_text() and "{{" not in prompt.fixed_text() and "{%" not in prompt.fixed_text()


def test_a_record_of_a_prompt_file_s_sha256_reads_as_that_file_s_digest(tmp_path):
    import hashlib

    shipped = PROMPT_DIR / "summariser.yaml"
    variant = write(tmp_path / "variant.yaml", LOOPED)
    library = PromptLibrary({"reasoning": str(variant)})
    old = {name: hashlib.sha256(path.read_bytes()).hexdigest()
           for name, path in (("summariser", shipped), ("reasoning", variant))}
    old["judge"] = "0" * 64  # a file changed since: no file has those bytes, so it stays and compares unequal
    upgraded = library.upgrade(old)
    assert upgraded == {"summariser": library.get("summariser").digest, "reasoning": library.get("reasoning").digest,
                        "judge": "0" * 64}
    assert library.upgrade(upgraded) == upgraded
