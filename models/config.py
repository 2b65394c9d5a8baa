"""SystemConfig: typed settings with defaults, loaded from configs/*.yaml (CRAG_CONFIG selects the file)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from utils.names import closest

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "cpu.yaml"
CONFIG_ENV = "CRAG_CONFIG"
MAX_BATCH_SIZE = 16
DOMAINS = ("finance", "sports", "music", "movie", "open")
DYNAMISM = ("static", "slow-changing", "fast-changing", "real-time")
Dynamism = Literal["static", "slow-changing", "fast-changing", "real-time"]
HashEngine = Literal["numpy", "faiss-flat", "faiss-hnsw"]
HASH_ENGINES = typing.get_args(HashEngine)

# Strategies: ordered lists of stage names (models/stages/). The stages every built-in strategy starts with
# gather the evidence; a stage whose switch is off in the config (`knowledge.enabled: false`, `r2ag.enabled:
# false`, task 1 for `kg`) is left out of the pipeline, so one list serves every setting. The KG runs before the
# pages so that the dynamic pre-check, which needs its results, spares the queries it answers "i don't know" the
# page processing.
GATHER = ["attributes", "kg", "precheck", "references", "r2ag", "evidence"]
DEFAULT_STRATEGIES = {
    "hybrid": [*GATHER, "multihop", "knowledge", "calculator", "reasoning"],  # the seed system
    "hanrag": [*GATHER, "hanrag"],
    "dualrag": [*GATHER, "dualrag"],
}


def at_least(low: float) -> dict[str, Any]:
    """Field metadata: the smallest value the key accepts."""
    return {"range": (low, None)}


def between(low: float, high: float) -> dict[str, Any]:
    """Field metadata: the range of values the key accepts (both ends included)."""
    return {"range": (low, high)}


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


@dataclass
class HFConfig:
    """transformers backend; `model` is an HF folder or a .gguf file, None for the embedded SmolLM2."""

    model: str | None = None
    device: str = "cpu"
    dtype: Literal["float32", "float16", "bfloat16", "auto"] = "float32"
    max_input_tokens: int = field(default=2048, metadata=at_least(64))
    micro_batch_size: int = field(default=8, metadata=at_least(1))
    cache_dir: str | None = None


@dataclass
class OpenAIConfig:
    """Any OpenAI-compatible server; the API key is read from the variable named by `api_key_env`."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "default"
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = field(default=8, metadata=at_least(1))
    max_retries: int = field(default=3, metadata=at_least(0))
    backoff_s: float = field(default=0.5, metadata=at_least(0))
    request_timeout_s: float = field(default=60.0, metadata=at_least(0.1))  # a whole request, not one read
    max_reply_bytes: int = field(default=2_000_000, metadata=at_least(1024))  # a longer reply is dropped unread
    native_n: bool = False


@dataclass
class VLLMConfig:
    """In-process vLLM (the competition path)."""

    model: str = ""
    tensor_parallel_size: int = 1
    quantization: str | None = None
    dtype: str = "auto"
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    seed: int = 0
    # The KV cache's element type. "auto" stores it in the model's dtype (float16 on T4s). Keep "auto" on T4s
    # (compute capability 7.5): an fp8 KV cache is not usable there in the pinned release (fp8 KV crashes on
    # compute capability < 8.9: vllm-project/vllm PR 35720, reported on 0.16.0; Triton attention has no fp8
    # KV on SM75 before the open PRs 45829/49077; issue 47549: FlashInfer, the other way, gone on SM75 in 0.24).
    kv_cache_dtype: str = "auto"
    # R2AG prompt mode through vLLM: whole prompts go to the engine as input embeddings (vLLM's EmbedsPrompt), built
    # from the model folder's model.embed_tokens.weight, read into host memory (vocabulary x hidden x 2 bytes: 2.1 GB
    # for Llama-3-70B, 1.05 GB for 8B). Turn it on only with r2ag.enabled and r2ag.mode prompt: with it on, vLLM
    # runs the embedding layer outside its CUDA graphs for every batch (tools/check_submission.py checks the pair).
    enable_prompt_embeds: bool = False


@dataclass
class LLMConfig:
    """`backend` names one of the sections below; only that one is used."""

    backend: Literal["hf", "openai", "vllm"] = "hf"
    hf: HFConfig = field(default_factory=HFConfig)
    openai: OpenAIConfig = field(default_factory=OpenAIConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class EmbedderConfig:
    """sentence-transformers model folder; None for the packaged all-MiniLM-L6-v2."""

    model: str | None = None
    device: str = "cpu"
    batch_size: int = 64


@dataclass
class RerankConfig:
    """Optional cross-encoder re-ranking of the best `candidates` by cosine; `model` None turns it off."""

    model: str | None = None
    candidates: int = 30
    batch_size: int = 32
    device: str = "cpu"


@dataclass
class HashConfig:
    """HASH-RAG retrieval (`references.retriever: hash`). `model`: an index file from tools/train_hash.py (its
    hash layer; its embedder must be this config's). Candidates are split into propositions (`units`: sentence);
    a search takes the `alpha` nearest by Hamming distance, keeps the `depth` best by <v_q, h_p> and, with
    `exact`, orders those by cosine; each source chunk keeps its best proposition. `engine`: numpy, faiss-flat
    or faiss-hnsw. `propositions`: the most propositions per query kept for the PGCC prompt. `units: llm`: the
    LLM rewrites the `llm_chunks` best chunks of each query (by cosine) as propositions (prompts/propositions.yaml,
    at most `llm_max_tokens` each); other chunks, and chunks without usable output, are split into sentences."""

    model: str | None = None
    engine: HashEngine = "numpy"
    alpha: int = field(default=200, metadata=at_least(1))
    depth: int = field(default=100, metadata=at_least(1))
    exact: bool = True
    units: Literal["sentence", "llm"] = "sentence"
    min_unit_chars: int = 30
    propositions: int = 10
    llm_chunks: int = 10
    llm_max_tokens: int = 160


@dataclass
class ReferencesConfig:
    """Web page processing and ranking. Page settings are those of utils.pages.PageSettings.

    `workers`: processes for pages (0: one per CPU, 1: in this process). `cache`: keep processed pages by content
    hash under `cache_dir` (null: $CRAG_CACHE_DIR, else ~/.cache/crag-harness). `timeout_s`: the longest the pages
    of one batch may take (the batch deadline also applies). `table_budget_chars`: the best tables of a query are
    kept while their total length fits. `retriever`: dense (cosine over chunks) or hash (HASH-RAG, see `hash`).
    """

    workers: int = field(default=0, metadata=at_least(0))
    cache: bool = True
    cache_dir: str | None = None
    timeout_s: float = field(default=10.0, metadata=at_least(0))
    chunk_chars: int = 1000
    sentence_chars: int = 400
    group_size: int = 3
    table_chars: int = 4000
    max_table_parts: int = 20
    max_page_chars: int = 2_000_000
    # A query's candidates (chunks, tables, snippets) beyond this are shortlisted by BM25 before embedding.
    max_candidates: int = field(default=500, metadata=at_least(1))
    top_k: int = field(default=10, metadata=at_least(1))
    table_budget_chars: int = field(default=4000, metadata=at_least(0))
    use_snippets: bool = True
    rerank: RerankConfig = field(default_factory=RerankConfig)
    retriever: Literal["dense", "hash"] = "dense"
    hash: HashConfig = field(default_factory=HashConfig)


@dataclass
class R2AGConfig:
    """R2AG: an R2-Former (`checkpoint`, written by tools/train_r2former.py) reads the retrieval features of each
    query's ranked references. `mode`: `relevance` re-orders them by its query-document-matching probability and
    drops those under `threshold` (the best `min_keep` always stay), with any backend; `prompt` keeps the
    retriever's list and injects a projected retrieval embedding before each reference in the reasoning prompt
    (hf backend; a backend that cannot take embeddings falls back to `relevance`, logged)."""

    enabled: bool = False
    checkpoint: str | None = None
    mode: Literal["relevance", "prompt"] = "relevance"
    threshold: float = field(default=0.5, metadata=between(0, 1))
    min_keep: int = field(default=3, metadata=at_least(0))
    device: str = "cpu"


@dataclass
class KGConfig:
    """The knowledge-graph stage, run for `task` 2 and 3. `method`: `rules` (the LLM extracts the domain and
    entities, domain rules choose the calls) or `functions` (the LLM lists the calls, at most `max_calls`, each
    checked against the endpoint table before it is made). `base_url` null: $CRAG_MOCK_API_URL, else
    http://localhost:8000. `max_chars`: the KG text of one query is cut to this length. `price_days`: daily
    prices kept (up to the question's date, or its current time).

    `down_after` failures in a row without an answer (a call that cannot connect, an attempt that waits its
    whole `read_timeout_s`) mark the server down: calls answer nothing at once for `down_s` seconds, then resume
    only once a probe (`GET /`) answers. `max_reply_bytes`: a longer reply is refused as it arrives (no result).
    The largest real mock API replies are a few MB (an open entity's raw_mediawiki, up to Wikipedia's 2 MB page
    limit; a calendar year of soccer games of every team, its ~85-character row key repeated in each column,
    about 3-6 MB; a year of NBA games about 1.5 MB); 16 MB leaves a factor of about 3, and a 15 MB reply peaks at
    45-80 MB of Python memory during the call."""

    method: Literal["rules", "functions"] = "rules"
    base_url: str | None = None
    connect_timeout_s: float = field(default=1.0, metadata=at_least(0.01))
    read_timeout_s: float = field(default=5.0, metadata=at_least(0.01))
    retries: int = field(default=2, metadata=at_least(0))
    backoff_s: float = field(default=0.2, metadata=at_least(0))
    down_after: int = field(default=3, metadata=at_least(1))
    down_s: float = field(default=30.0, metadata=at_least(0))
    max_reply_bytes: int = field(default=16_000_000, metadata=at_least(1024))
    concurrency: int = field(default=8, metadata=at_least(1))
    max_calls: int = field(default=6, metadata=at_least(1))
    max_chars: int = field(default=1000, metadata=at_least(0))
    max_tokens: int = 160
    price_days: int = 5


@dataclass
class HANRAGConfig:
    """HANRAG: the router's four routes; `max_steps` bounds the complex route's refine-answer-check loop,
    `max_sub_queries` a decomposition, `top_k` the references retrieved per (sub-)question before the
    relevance filter. `max_tokens`: router, decomposer, refiner, checker and relevance replies."""

    max_steps: int = 4
    max_sub_queries: int = 4
    top_k: int = 5
    max_tokens: int = 96
    answer_max_tokens: int = 96


@dataclass
class DualRAGConfig:
    """DualRAG: up to `max_iter` reason-identify-retrieve-summarise rounds; `top_k` references per keyword."""

    max_iter: int = 5
    top_k: int = 3
    max_entities: int = 3
    max_keywords: int = 3
    max_tokens: int = 128
    summary_max_tokens: int = 96
    answer_max_tokens: int = 96


@dataclass
class ICLConfig:
    """Few-shot attribute prediction: `shots_per_class` demonstrations per domain and per dynamism class."""

    shots_per_class: int = field(default=5, metadata=at_least(0))
    n: int = field(default=5, metadata=at_least(1))
    temperature: float = field(default=0.7, metadata=at_least(0))
    max_tokens: int = 24
    seed: int = 0


@dataclass
class AttributesConfig:
    """Domain and dynamism prediction. `method`: svm, icl or none. `svm_model`: a file written by
    tools/train_attributes.py. `labelled_file`: where ICL draws its demonstrations. `dynamic_classes`: the
    dynamism classes that count as dynamic (answered "i don't know" when `answer.dynamic_idk` is on)."""

    method: Literal["svm", "icl", "none"] = "svm"
    svm_model: str = "data/attributes/svm_minilm.pkl"
    labelled_file: str = "data/attributes/questions.jsonl"
    dynamic_classes: list[Dynamism] = field(default_factory=lambda: ["real-time", "fast-changing"])
    icl: ICLConfig = field(default_factory=ICLConfig)


@dataclass
class KnowledgeConfig:
    """The LLM knowledge extractor (no references)."""

    enabled: bool = True
    max_tokens: int = 192
    temperature: float = 0.0


@dataclass
class CalculatorConfig:
    """The LLM writes `n` samples of expressions; at most `max_results` distinct results reach the prompt."""

    enabled: bool = True
    n: int = field(default=5, metadata=at_least(1))
    temperature: float = field(default=0.7, metadata=at_least(0))
    max_tokens: int = 192
    max_results: int = 8
    max_reference_chars: int = 3000


@dataclass
class ReasoningConfig:
    """`max_reference_chars`: references enter the prompt best first while they fit this many characters.
    `summariser_max_tokens`: the backup summariser's answer length, used when the output cannot be parsed.
    `samples`: that many extra answers sampled at `sample_temperature` beside the answer, which stays the answer;
    the share that agree with it is the `reasoning.agreement` signal (self-consistency). 0: none, no extra call."""

    max_tokens: int = 96
    temperature: float = 0.0
    max_reference_chars: int = 4000
    summariser_max_tokens: int = 32
    samples: int = field(default=0, metadata=at_least(0))
    sample_temperature: float = field(default=0.7, metadata=at_least(0.01))


@dataclass
class AnswerConfig:
    """`dynamic_idk`: queries predicted dynamic answer "i don't know" without the LLM stages. `gate`: an answer
    gate file (`local_evaluation.py gate fit`); an answer whose P(correct) is under its threshold becomes
    "i don't know". A gate fit on another LLM, other reasoning settings or prompts is refused at start-up unless
    `gate_strict` is false (then it runs, with a warning naming the difference)."""

    dynamic_idk: bool = True
    gate: str | None = None
    gate_strict: bool = True


@dataclass
class BudgetConfig:
    """Seconds. A stage starts only when the batch deadline leaves at least its `stage_min_s`, and works at most
    its `stage_share` of the batch's seconds."""

    per_query_s: float = field(default=30.0, metadata=at_least(0.1))
    safety_margin_s: float = field(default=2.0, metadata=at_least(0))
    answer_reserve_s: float = field(default=0.5, metadata=at_least(0))
    stage_min_s: dict[str, float] = field(
        default_factory=lambda: {"references": 0.5, "reasoning": 1.0}
    )
    # The most of the batch's seconds a stage may spend, so that optional stages leave reasoning its time; the
    # shipped configs give the same shares (a config's `stage_share` replaces this whole table).
    stage_share: dict[str, float] = field(default_factory=lambda: {"references": 0.4, "kg": 0.2, "knowledge": 0.2,
                                                                   "calculator": 0.25})


@dataclass
class SystemConfig:
    batch_size: int = field(default=4, metadata=between(1, MAX_BATCH_SIZE))
    task: Literal[1, 2, 3] = 1  # CRAG task: 1 (pages only), 2 and 3 (pages and the mock KG API)
    strategy: str = "hybrid"  # a name in `strategies`
    # Ordered lists of stage names by strategy name; the config's entries are added to DEFAULT_STRATEGIES (an
    # entry of the same name replaces the default). A list inside a list is spliced in, so YAML anchors share a
    # prefix: `mine: [*gather, my_stage, reasoning]`.
    strategies: dict[str, list[str]] = field(default_factory=lambda: copy.deepcopy(DEFAULT_STRATEGIES),
                                             metadata={"merge": True})
    # Modules imported before the pipeline is built, so that the stages they register can be named above.
    stage_modules: list[str] = field(default_factory=list)
    # hybrid only: questions HANRAG's router calls compound or complex go to this method (the multihop stage)
    multihop: Literal["none", "hanrag", "dualrag"] = "none"
    llm: LLMConfig = field(default_factory=LLMConfig)
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    attributes: AttributesConfig = field(default_factory=AttributesConfig)
    references: ReferencesConfig = field(default_factory=ReferencesConfig)
    r2ag: R2AGConfig = field(default_factory=R2AGConfig)
    kg: KGConfig = field(default_factory=KGConfig)
    hanrag: HANRAGConfig = field(default_factory=HANRAGConfig)
    dualrag: DualRAGConfig = field(default_factory=DualRAGConfig)
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    calculator: CalculatorConfig = field(default_factory=CalculatorConfig)
    reasoning: ReasoningConfig = field(default_factory=ReasoningConfig)
    answer: AnswerConfig = field(default_factory=AnswerConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    prompts: dict[str, str] = field(default_factory=dict)
    # Every LLM conversation of a query and its replies go into its record (`prompts` in the trace of
    # predictions.jsonl). Off by default: prompts are large. It changes no answer, so the run manifest leaves it out.
    record_prompts: bool = False
    source: str = field(default="<defaults>", metadata={"internal": True})

    def __post_init__(self) -> None:
        """The checks that span keys; each key's own type, choices and range are checked as it loads."""
        self.strategy_names()  # an unknown strategy fails at load
        if self.r2ag.enabled and not self.r2ag.checkpoint:
            raise ConfigError(f"{self.source}: r2ag.enabled needs r2ag.checkpoint (train one with "
                              "tools/train_r2former.py)")
        if self.references.retriever == "hash" and not self.references.hash.model:
            raise ConfigError(f"{self.source}: references.retriever hash needs references.hash.model (train one with "
                              "tools/train_hash.py)")
        if self.budget.per_query_s <= self.budget.safety_margin_s / max(self.batch_size, 1):
            raise ConfigError(f"{self.source}: budget.per_query_s is too small for the safety margin")

    def strategy_names(self) -> list[str]:
        """The stage names of the chosen strategy, in order."""
        if self.strategy not in self.strategies:
            raise ConfigError(f"{self.source}: strategy {self.strategy!r} is not in strategies"
                              f"{did_you_mean(self.strategy, self.strategies)}")
        return self.strategies[self.strategy]


def did_you_mean(name: str, choices: typing.Iterable[str]) -> str:
    """"; did you mean 'x'?" for the closest choice, else "; one of [...]"."""
    choices = [str(c) for c in choices]
    close = closest(name, choices)
    return f"; did you mean {close!r}?" if close else f"; one of {choices}"


def resolve_path(path: str) -> Path:
    """A path from a config: absolute, or relative to the repository."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else REPO_ROOT / candidate


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config, --overlay and --set, the same in every command that builds the system."""
    parser.add_argument("--config", type=Path, default=None,
                        help=f"system config YAML (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG.name})")
    parser.add_argument("--overlay", type=Path, action="append", default=[], metavar="YAML",
                        help="a partial config merged over --config key by key (repeatable; configs/overlays/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                        help="one setting over the config, e.g. --set kg.method=functions (repeatable; YAML value)")


def config_from_args(args: argparse.Namespace) -> SystemConfig:
    return load_config(args.config, args.overlay, args.sets)


def config_label(args: argparse.Namespace) -> str:
    """A short name for the config the arguments chose: the file's stem, the overlays' stems, "set" for --set."""
    first = config_path(args.config).stem
    return "+".join([first, *(Path(o).stem for o in args.overlay), *(["set"] if args.sets else [])])


def config_path(path: str | os.PathLike | None = None) -> Path:
    """`path`, else $CRAG_CONFIG, else configs/cpu.yaml."""
    return Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def load_config(path: str | os.PathLike | None = None, overlays: Sequence[str | os.PathLike] = (),
                sets: Sequence[str] = ()) -> SystemConfig:
    """Load `path` (else $CRAG_CONFIG, else configs/cpu.yaml), then each overlay file in order (a partial config
    merged key by key), then each `--set` assignment ("kg.method=functions", the value read as YAML)."""
    chosen = config_path(path)
    data = _read_yaml(chosen, f"set {CONFIG_ENV} or --config to an existing YAML file")
    source = str(chosen)
    for overlay in overlays:
        data = _merge(data, _read_yaml(Path(overlay), "--overlay takes a partial config YAML file"))
        source += f" + {overlay}"
    for assignment in sets:
        key, sep, text = assignment.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {assignment!r}: write KEY=VALUE, e.g. --set kg.method=functions")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {assignment!r}: the value is not YAML: {err}") from err
        for part in reversed(key.strip().split(".")):
            value = {part: value}
        data = _merge(data, value)
        source += f" --set {key.strip()}"
    return _build(SystemConfig, data, source, "", {"source": source})


def _read_yaml(path: Path, fix: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found ({fix})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in: mappings key by key, anything else replaced."""
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = (_merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict)
                       else value)
    return merged


def _build(cls: type, data: dict[str, Any], source: str, prefix: str, extra: dict[str, Any] | None = None) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = dict(extra or {})
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in known or known[key].metadata.get("internal"):
            public = [name for name, f in known.items() if not f.metadata.get("internal")]
            raise ConfigError(f"{source}: unknown key '{where}'{did_you_mean(key, public)}")
        meta = known[key].metadata
        if meta.get("merge") and isinstance(value, dict):  # a table added to its defaults (strategies)
            value = {**known[key].default_factory(), **{k: _splice(v) for k, v in value.items()}}
        kwargs[key] = _coerce(hints[key], value, source, where)
        low, high = meta.get("range", (None, None))
        if (low is not None and kwargs[key] < low) or (high is not None and kwargs[key] > high):
            allowed = f"at least {low}" if high is None else f"in {low}..{high}"
            raise ConfigError(f"{source}: '{where}' must be {allowed}, got {kwargs[key]!r}")
    return cls(**kwargs)


def _splice(value: Any) -> Any:
    """A list with the lists inside it spliced in (YAML aliases of shared stage lists)."""
    if not isinstance(value, list):
        return value
    return [item for part in value for item in (part if isinstance(part, list) else [part])]


def _coerce(hint: Any, value: Any, source: str, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: '{where}' must be a mapping")
        return _build(hint, value, source, f"{where}.")
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices or isinstance(value, bool):
            raise ConfigError(f"{source}: '{where}' is {value!r}{did_you_mean(value, choices)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(inner, value, source, where)
    if origin is list:
        (item_t,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{source}: '{where}' must be a list")
        return [_coerce(item_t, item, source, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        key_t, val_t = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: '{where}' must be a mapping")
        return {_coerce(key_t, k, source, f"{where}.{k}"): _coerce(val_t, v, source, f"{where}.{k}") for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{source}: '{where}' must be {hint.__name__}, got {value!r}")
    return value
