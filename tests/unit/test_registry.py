"""Stages by name: the registry, strategies as lists in config, declared reads, writes, prompts and resources."""

import pytest

from models.config import ConfigError
from models.registry import Registry, RegistryError
from models.stages import STAGES, Stage, StageContext
from models.state import QueryState
from tests.conftest import to_batch, write
from tests.fakes import SEED_REPLY, ScriptedLLM, prompt_name
from utils.answers import IDK


# The docs' example (docs/how-to/add-a-stage.md): a stage added by this module, named in a strategy by the config alone.
@STAGES.register("support_check")
class SupportCheck(Stage):
    """Answers the references do not support become "i don't know": a wrong answer costs a point."""

    prompts = ("support_check",)
    reads = frozenset({"answer", "references"})
    writes = frozenset({"answer"})
    needs = frozenset({"llm"})

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        answered = [s for s in states if s.answer and s.answer != IDK]
        prompt = ctx.prompt("support_check")
        conversations = [prompt.render(question=s.query, answer=s.answer, references=[r.text for r in s.references])
                         for s in answered]
        for state, samples in zip(answered, ctx.generate(conversations, owners=answered, max_tokens=4)):
            if not samples or not samples[0].text.strip().lower().startswith("yes"):
                state.finish(IDK, "support_check: the references do not support the answer")


PROMPT = """variables: [question, answer, references]
system: Answer yes or no.
user: |
  {% for text in references %}{{ text }}
  {% endfor %}Do these references support "{{ answer }}" as the answer to "{{ question }}"?
"""


def plugin_config(cpu_config, tmp_path, reply_to_check: str):
    """cpu_config with the support check after reasoning, through config keys only."""
    cpu_config.stage_modules = [__name__]
    cpu_config.strategies["checked"] = ["references", "reasoning", "support_check"]
    cpu_config.strategy = "checked"
    cpu_config.prompts = {"support_check": str(write(tmp_path / "support_check.yaml", PROMPT))}
    return ScriptedLLM(lambda c: reply_to_check if prompt_name(c) == "support_check" else SEED_REPLY)


@pytest.mark.parametrize("reply, answer", [("yes", "paris"), ("no", "i don't know")])
def test_a_stage_from_a_test_module_runs_where_the_config_puts_it(make_system, cpu_config, tmp_path,
                                                                 sample_examples, reply, answer):
    llm = plugin_config(cpu_config, tmp_path, reply)
    system = make_system(llm)
    assert [stage.name for stage in system.pipeline] == ["references", "reasoning", "support_check"]
    result = system.answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == [answer]
    trace = result.trace[0]
    assert [r["stage"] for r in trace["stages"]] == ["references", "reasoning", "support_check", "answer"]
    assert [prompt_name(c) for convs, _ in llm.calls for c in convs] == ["reasoning", "support_check"]
    check = llm.calls[1][0][0][1]["content"]
    assert 'support "paris" as the answer' in check and sample_examples[0]["query"] in check


@pytest.mark.parametrize("stages, message", [
    (["references", "reasonng"], r"strategies\.mine\[1\]: unknown stage 'reasonng'; did you mean 'reasoning'\?"),
    (["reasoning", "references"], r"stage 'reasoning' reads \['references'\], which no earlier stage writes"),
], ids=["unknown name", "read before written"])
def test_a_strategy_that_cannot_run_is_refused_at_start_up(make_system, cpu_config, stages, message):
    cpu_config.strategies["mine"] = stages
    cpu_config.strategy = "mine"
    with pytest.raises(ConfigError, match=message):
        make_system()


def test_a_switched_off_stage_leaves_the_list_and_the_check_sees_it(make_system, cpu_config):
    cpu_config.strategies["mine"] = ["references", "r2ag", "reasoning"]  # r2ag.enabled is false
    cpu_config.strategy = "mine"
    assert [stage.name for stage in make_system().pipeline] == ["references", "reasoning"]


@STAGES.register("stamp")
class Stamp(Stage):
    """Needs nothing: every query is answered "stamped"."""

    writes = frozenset({"answer"})

    def run(self, states, ctx):
        for state in states:
            state.answer = "stamped"


def test_only_the_resources_the_stages_declare_are_built(make_system, cpu_config, sample_examples):
    cpu_config.task = 2  # the kg stage would need a server: this strategy has none, so nothing probes one
    cpu_config.section("kg").base_url = "http://127.0.0.1:9"
    cpu_config.stage_modules = [__name__]
    cpu_config.strategies["mine"] = ["stamp"]
    cpu_config.strategy = "mine"
    system = make_system()
    assert system.batch_generate_answer(to_batch(sample_examples[:2])) == ["stamped", "stamped"]
    assert system.resources == {}  # not even the LLM and embedder the fixture offers
    assert system.resource("pages") is None and system.resource("kg") is None and system.resource("llm") is None


def test_a_stage_module_that_does_not_import_is_named(make_system, cpu_config):
    cpu_config.stage_modules = ["my_stages.nowhere"]
    with pytest.raises(ConfigError, match="stage_modules: cannot import 'my_stages.nowhere'"):
        make_system()


def test_budget_keys_must_name_stages(make_system, cpu_config):
    cpu_config.budget.stage_min_s["reasonig"] = 1.0
    with pytest.raises(ConfigError, match=r"budget\.stage_min_s\.reasonig: no such stage; did you mean "
                                          r"'reasoning'\?"):
        make_system()


class Sneaky(Stage):
    """Uses what it did not declare."""

    def __init__(self, use: str) -> None:
        self.use = use

    def run(self, states, ctx):
        if self.use == "prompt":
            ctx.prompt("reasoning")
        elif self.use == "resource":
            ctx.resource("llm").generate([], None)
        else:
            ctx.section("kg")


@pytest.mark.parametrize("use, message", [
    ("prompt", "renders prompt 'reasoning' without declaring it"),
    ("resource", "uses resource 'llm' without declaring it in `needs`"),
    ("section", "reads config section 'kg' without declaring it"),
])
def test_undeclared_prompts_resources_and_sections_fail_the_stage(make_system, sample_examples, use, message):
    from models.stages.stage import run_stage

    system = make_system()
    states = [QueryState(0, "q0", "who?", "", [])]
    stage = Sneaky(use)
    stage.name = "sneaky"
    run_stage(stage, states, system.batch(1))
    assert states[0].answer == IDK and message in states[0].trace[-1].note


def test_registrations_are_checked_where_they_are_written():
    with pytest.raises(RegistryError, match="reads/may_read/writes name no QueryState field: \\['refs'\\]"):
        STAGES.register("bad_fields")(type("Bad", (Stage,), {"reads": frozenset({"refs"})}))
    with pytest.raises(RegistryError, match="needs unknown resources \\['gpu'\\]"):
        STAGES.register("bad_needs")(type("Bad", (Stage,), {"needs": frozenset({"gpu"})}))
    with pytest.raises(RegistryError, match="no config section \\['reasonning'\\]"):
        STAGES.register("bad_section")(type("Bad", (Stage,), {"sections": ("reasonning",)}))
    with pytest.raises(RegistryError, match="stage 'reasoning' is already registered by "
                                            "models.stages.reasoning.ReasoningStage"):
        STAGES.register("reasoning")(type("Other", (Stage,), {}))
    with pytest.raises(RegistryError, match="is not a subclass of Stage"):
        STAGES.register("plain")(object)
    assert "bad_fields" not in STAGES and "plain" not in STAGES


@pytest.fixture
def registries_restored():
    """The registries as they were before the test: what it registers does not reach the generated reference."""
    from models.config import STAGE_SECTIONS
    from models.resources import RESOURCES
    from models.state import ADDED_FIELDS

    tables = (STAGE_SECTIONS, RESOURCES, ADDED_FIELDS, STAGES._entries)
    saved = [dict(table) for table in tables]
    yield
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)


def test_what_a_stage_adds_is_refused_where_it_clashes_or_names_nothing(registries_restored):
    from dataclasses import dataclass

    from models.resources import Resource
    from models.state import StateField

    @dataclass
    class Settings:
        level: int = 1

    def stage(**declared):
        return type("Adds", (Stage,), declared)

    with pytest.raises(RegistryError, match="stage 'budget' declares settings, but 'budget' is already a config key"):
        STAGES.register("budget")(stage(settings=Settings))
    STAGES.register("adds_settings")(stage(settings=Settings))
    assert STAGES.get("adds_settings").sections == ("adds_settings",)
    with pytest.raises(RegistryError, match="field 'answer' is already a QueryState field"):
        STAGES.register("adds_answer")(stage(fields=(StateField("answer", str),)))
    with pytest.raises(RegistryError, match="field 'reason' is already a QueryState field or a key of its record"):
        STAGES.register("adds_reason")(stage(fields=(StateField("reason", str),)))
    with pytest.raises(RegistryError, match="resource 'llm' is already declared by models.resources"):
        STAGES.register("adds_llm")(stage(resources={"llm": Resource(lambda *a: None)}))
    with pytest.raises(RegistryError, match="needs unknown resources \\['gpu'\\]"):  # after its settings registered
        STAGES.register("half_added")(stage(settings=Settings, needs=frozenset({"gpu"})))
    from models.config import STAGE_SECTIONS

    assert "half_added" not in STAGE_SECTIONS and "half_added" not in STAGES  # a refused stage leaves nothing


def test_resources_are_built_after_what_they_depend_on_in_registration_order(registries_restored):
    from models.resources import RESOURCES, Resource, add_resource, build_order

    assert build_order(["r2former"]) == ["llm", "embedder", "r2former"]
    assert build_order(["kg", "gate", "pages"]) == ["gate", "pages", "kg"]  # the gate (first) before all
    # a resource may depend on one registered after it (a later stage module's): built after it all the same
    add_resource("index", Resource(lambda *a: None, depends=("shards",)), "early")
    add_resource("shards", Resource(lambda *a: None, depends=("embedder",)), "late")
    assert build_order(["index", "pages"]) == ["pages", "embedder", "shards", "index"]
    add_resource("gpu_index", Resource(lambda *a: None, depends=("gpu",)), "typo")
    with pytest.raises(RegistryError, match="typo: resource 'gpu_index' depends on unknown resource 'gpu'"):
        build_order(["gpu_index"])
    RESOURCES["shards"] = ("late", Resource(lambda *a: None, depends=("index",)))
    with pytest.raises(RegistryError, match="resources depend on each other in a cycle: index, shards"):
        build_order(["index"])


def test_a_shared_section_takes_keys_from_several_stages_and_each_reads_its_own(registries_restored, tmp_path):
    from dataclasses import dataclass

    from models.config import STAGE_SECTIONS
    from models.loading import load_config
    from models.prompting import PromptLibrary
    from models.stages.stage import Batch
    from utils.time_budget import Deadline

    @dataclass
    class Low:
        """The low keys."""

        low: int = 1
        """A low key."""

    @dataclass
    class High:
        """The high keys."""

        high: float = 0.5
        """A high key."""

    low_stage = STAGES.register("low_keys")(type("LowKeys", (Stage,), {"section_keys": {"mixed": Low}}))
    STAGES.register("high_keys")(type("HighKeys", (Stage,), {"section_keys": {"mixed": High}}))
    assert [settings for _, settings in STAGE_SECTIONS["mixed"]] == [Low, High]

    @dataclass
    class LowToo:
        low: int = 2

    with pytest.raises(RegistryError, match="config key mixed.low is already declared by"):
        STAGES.register("low_again")(type("LowAgain", (Stage,), {"section_keys": {"mixed": LowToo}}))

    config = load_config(write(tmp_path / "c.yaml", "mixed:\n  low: 3\n  high: 0.25\n"))
    assert (config.section("mixed", Low).low, config.section("mixed", High).high) == (3, 0.25)
    assert config.resolved()["mixed"] == {"low": 3, "high": 0.25}
    with pytest.raises(KeyError, match="holds the keys of 2 features: read it by part \\(Low, High\\)"):
        config.section("mixed")
    context = Batch(config, Deadline(60), PromptLibrary({}), {}).context(low_stage())
    assert context.section("mixed") == Low(3)  # a stage reads the part it declares
    changed = config.with_keys("mixed", High, high=0.75)
    assert (changed.section("mixed", High).high, config.section("mixed", High).high) == (0.75, 0.25)
    with pytest.raises(ConfigError, match="unknown key 'mixed.hihg'; did you mean 'high'"):
        load_config(write(tmp_path / "typo.yaml", "mixed:\n  hihg: 1.0\n"))
    with pytest.raises(ConfigError, match="'mixed.low' must be int, got True"):
        load_config(write(tmp_path / "bool.yaml", "mixed:\n  low: true\n"))


def test_every_built_in_stage_module_is_listed_once_and_registers_what_the_list_says():
    """The stages are not found by importing every file: a stage file missing from STAGE_MODULES is a stage no
    strategy can name, so the list is checked against the files that register stages."""
    import ast

    from models.config import REPO_ROOT
    from models.loading import STAGE_MODULES

    def registers_a_stage(path) -> bool:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for decorator in node.decorator_list:
                    if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "STAGES.register":
                        return True
        return False

    files = {".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
             for path in (REPO_ROOT / "models").rglob("*.py") if registers_a_stage(path)}
    assert len(STAGE_MODULES) == len(set(STAGE_MODULES)) and set(STAGE_MODULES) == files
    assert {STAGES.get(name).__module__ for name in STAGES} >= set(STAGE_MODULES)


def test_the_core_modules_name_no_feature():
    """What a feature adds (its config section, QueryState fields, resources, signals) is declared in its own stage
    file; the modules every feature passes through name none of it in code (docstrings and comments aside)."""
    import ast
    import dataclasses

    from models.config import REPO_ROOT, STAGE_SECTIONS, SystemConfig
    from models.loading import STAGE_MODULES
    from models.resources import RESOURCES
    from models.state import ADDED_FIELDS, QUERY_STATE_FIELDS

    ours = {owner for table in (ADDED_FIELDS, RESOURCES) for owner, _ in table.values()
            if owner.startswith("models.") and owner != "models.resources"} | set(STAGE_MODULES)
    core = ({f.name for f in dataclasses.fields(SystemConfig)} | QUERY_STATE_FIELDS
            | {name for name, (owner, _) in RESOURCES.items() if owner == "models.resources"})
    declared = ({name for name, parts in STAGE_SECTIONS.items() if any(owner in ours for owner, _ in parts)}
                | {name for name, (owner, _) in ADDED_FIELDS.items() if owner in ours}
                | {name for name, (owner, _) in RESOURCES.items() if owner in ours}
                | {part for name in STAGES if STAGES.get(name).__module__ in ours
                   for signal in STAGES.get(name).signals for part in (signal, signal.split(".")[0])}) - core
    # the budget's default tables and the built-in strategies name stages, as a config writes them
    allowed = {"models/config/sections.py": {"kg"}, "models/config/schema.py": {"kg", "r2ag", "hanrag", "dualrag"}}
    for module in ("models/config/sections.py", "models/config/schema.py", "models/state.py", "models/resources.py",
                   "models/system.py", "models/stages/answer.py", "models/stages/stage.py"):
        tree = ast.parse((REPO_ROOT / module).read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        named = {value for node in ast.walk(tree) if id(node) not in docstrings
                 for value in ([node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str)
                               else [node.attr] if isinstance(node, ast.Attribute)
                               else [node.id] if isinstance(node, ast.Name) else [])}
        assert sorted(named & declared - allowed.get(module, set())) == [], module


def test_a_retriever_declares_what_it_needs_and_becomes_a_choice(registries_restored, tmp_path):
    from dataclasses import dataclass

    from models.config import CHOICES
    from models.loading import load_config
    from models.resources import RESOURCES
    from models.stages.references import ReferencesStage
    from models.stages.retrievers import RETRIEVERS, Retriever

    @dataclass
    class SparseKeys:
        sparse_k1: float = 1.2
        """BM25's k1."""

    saved = list(CHOICES["retriever"])
    try:
        RETRIEVERS.register("sparse")(type("Sparse", (Retriever,), {"settings": SparseKeys}))
        config = load_config(write(tmp_path / "c.yaml", "references:\n  retriever: sparse\n  sparse_k1: 2.0\n"))
        assert config.references.retriever == "sparse" and config.section("references", SparseKeys).sparse_k1 == 2.0
        assert config.resolved()["references"]["sparse_k1"] == 2.0 and config.references.top_k == 10
        fewer = config.with_keys("references", top_k=3)  # SystemConfig's own key of a section stages add keys to
        assert (fewer.references.top_k, fewer.section("references", SparseKeys).sparse_k1) == (3, 2.0)
        with pytest.raises(ConfigError, match="unknown key 'references.sparse_k2'; did you mean 'sparse_k1'"):
            load_config(write(tmp_path / "typo.yaml", "references:\n  sparse_k2: 2.0\n"))

        @dataclass
        class TopK:
            top_k: int = 3

        with pytest.raises(RegistryError, match="config key references.top_k is already a key of SystemConfig's"):
            RETRIEVERS.register("clash")(type("Clash", (Retriever,), {"settings": TopK}))
        assert "clash" not in RETRIEVERS and "clash" not in CHOICES["retriever"]  # taken back with the rest
    finally:
        CHOICES["retriever"] = saved
        RETRIEVERS._entries.pop("sparse", None)
    # the hash retriever's declarations are the references stage's
    assert {"hash_model", "llm"} <= ReferencesStage.needs and "propositions" in ReferencesStage.writes
    assert RESOURCES["hash_model"][0] == "models.stages.hash_retriever" and "propositions" in ReferencesStage.prompts
    with pytest.raises(ConfigError, match="'references.retriever' is 'sparse'; one of \\['dense', 'hash'\\]"):
        load_config(write(tmp_path / "gone.yaml", "references:\n  retriever: sparse\n"))


def test_a_retriever_registered_after_the_references_stage_gives_it_what_it_declares(registries_restored):
    """A retriever of a config's `stage_modules` registers after the built-in stages: its fields, needs, prompts
    and signals still become the references stage's, so the pipeline builds its resources and lets it write."""
    from models.config import CHOICES
    from models.stages.references import ReferencesStage
    from models.stages.retrievers import RETRIEVERS, Retriever
    from models.state import StateField

    saved = {key: getattr(ReferencesStage, key) for key in ("prompts", "writes", "needs", "signals")}
    choices = list(CHOICES["retriever"])
    declared = {"fields": (StateField[float]("late_score", 0.0),), "needs": frozenset({"llm"}),
                "prompts": ("summariser",), "signals": {"late.score": "the late retriever's best score"}}
    try:
        RETRIEVERS.register("late")(type("Late", (Retriever,), declared))
        assert "late_score" in ReferencesStage.writes and "llm" in ReferencesStage.needs
        assert "summariser" in ReferencesStage.prompts and "late.score" in ReferencesStage().declared_signals()
    finally:
        for key, value in saved.items():
            setattr(ReferencesStage, key, value)
        CHOICES["retriever"] = choices
        RETRIEVERS._entries.pop("late", None)


class Unsigned(Stage):
    """Writes a gate signal it does not declare."""

    writes = frozenset({"answer"})
    signals = {"unsigned.declared": "a declared one"}

    def run(self, states, ctx):
        for state in states:
            state.signals["unsigned.declared"] = 1.0
            state.signals["unsigned.other"] = 2.0


def test_a_signal_the_stage_does_not_declare_fails_the_stage(make_system):
    from models.stages.stage import run_stage

    states = [QueryState(0, "q0", "who?", "", [])]
    stage = Unsigned()
    stage.name = "unsigned"
    run_stage(stage, states, make_system().batch(1))
    assert states[0].answer == IDK and "wrote signals it does not declare in `signals`: ['unsigned.other']" in \
        states[0].trace[-1].note
    assert states[0].signals == {}  # put back as it was


def test_a_registry_suggests_the_closest_name_on_a_miss():
    registry = Registry("widget", object)
    registry.register("reranker")(type("R", (), {}))
    with pytest.raises(RegistryError, match="unknown widget 'rerankr'; did you mean 'reranker'\\?"):
        registry.get("rerankr")
    with pytest.raises(RegistryError, match=r"unknown widget 'zzz'; one of \['reranker'\]"):
        registry.get("zzz")
