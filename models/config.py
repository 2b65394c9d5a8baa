"""SystemConfig: typed settings with defaults, loaded from configs/*.yaml (CRAG_CONFIG selects the file)."""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "cpu.yaml"
CONFIG_ENV = "CRAG_CONFIG"
MAX_BATCH_SIZE = 16
DOMAINS = ("finance", "sports", "music", "movie", "open")
DYNAMISM = ("static", "slow-changing", "fast-changing", "real-time")
ATTRIBUTE_METHODS = ("svm", "icl", "none")
R2AG_MODES = ("relevance", "prompt")
RETRIEVERS = ("dense", "hash")
HASH_ENGINES = ("numpy", "faiss-flat", "faiss-hnsw")
HASH_UNITS = ("sentence", "llm")
KG_METHODS = ("rules", "functions")


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


@dataclass
class HFConfig:
    """transformers backend; `model` is an HF folder or a .gguf file, None for the embedded SmolLM2."""

    model: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    max_input_tokens: int = 2048
    micro_batch_size: int = 8
    cache_dir: str | None = None


@dataclass
class OpenAIConfig:
    """Any OpenAI-compatible server; the API key is read from the variable named by `api_key_env`."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "default"
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8
    max_retries: int = 3
    backoff_s: float = 0.5
    request_timeout_s: float = 60.0
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


@dataclass
class LLMConfig:
    """`backend` names one of the sections below; only that one is used."""

    backend: str = "hf"
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
    engine: str = "numpy"
    alpha: int = 200
    depth: int = 100
    exact: bool = True
    units: str = "sentence"
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

    workers: int = 0
    cache: bool = True
    cache_dir: str | None = None
    timeout_s: float = 10.0
    chunk_chars: int = 1000
    sentence_chars: int = 400
    group_size: int = 3
    table_chars: int = 4000
    max_table_parts: int = 20
    max_page_chars: int = 2_000_000
    top_k: int = 10
    table_budget_chars: int = 4000
    use_snippets: bool = True
    rerank: RerankConfig = field(default_factory=RerankConfig)
    retriever: str = "dense"
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
    mode: str = "relevance"
    threshold: float = 0.5
    min_keep: int = 3
    device: str = "cpu"


@dataclass
class KGConfig:
    """The knowledge-graph stage, run for `task` 2 and 3. `method`: `rules` (the LLM extracts the domain and
    entities, domain rules choose the calls) or `functions` (the LLM lists the calls, at most `max_calls`, each
    checked against the endpoint table before it is made). `base_url` null: $CRAG_MOCK_API_URL, else
    http://localhost:8000. `max_chars`: the KG text of one query is cut to this length. `price_days`: daily
    prices kept (up to the question's date, or its current time)."""

    method: str = "rules"
    base_url: str | None = None
    connect_timeout_s: float = 1.0
    read_timeout_s: float = 5.0
    retries: int = 2
    backoff_s: float = 0.2
    concurrency: int = 8
    max_calls: int = 6
    max_chars: int = 1000
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

    shots_per_class: int = 5
    n: int = 5
    temperature: float = 0.7
    max_tokens: int = 24
    seed: int = 0


@dataclass
class AttributesConfig:
    """Domain and dynamism prediction. `method`: svm, icl or none. `svm_model`: a file written by
    tools/train_attributes.py. `labelled_file`: where ICL draws its demonstrations. `dynamic_classes`: the
    dynamism classes that count as dynamic (answered "i don't know" when `answer.dynamic_idk` is on)."""

    method: str = "svm"
    svm_model: str = "data/attributes/svm_minilm.pkl"
    labelled_file: str = "data/attributes/questions.jsonl"
    dynamic_classes: list[str] = field(default_factory=lambda: ["real-time", "fast-changing"])
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
    n: int = 5
    temperature: float = 0.7
    max_tokens: int = 192
    max_results: int = 8
    max_reference_chars: int = 3000


@dataclass
class ReasoningConfig:
    """`max_reference_chars`: references enter the prompt best first while they fit this many characters.
    `summariser_max_tokens`: the backup summariser's answer length, used when the output cannot be parsed."""

    max_tokens: int = 96
    temperature: float = 0.0
    max_reference_chars: int = 4000
    summariser_max_tokens: int = 32


@dataclass
class AnswerConfig:
    """`dynamic_idk`: queries predicted dynamic answer "i don't know" without the LLM stages."""

    dynamic_idk: bool = True


@dataclass
class BudgetConfig:
    """Seconds. A stage starts only when the batch deadline leaves at least its `stage_min_s`, and works at most
    its `stage_share` of the batch's seconds."""

    per_query_s: float = 30.0
    safety_margin_s: float = 2.0
    answer_reserve_s: float = 0.5
    stage_min_s: dict[str, float] = field(
        default_factory=lambda: {"references": 0.5, "reasoning": 1.0}
    )
    # The most of the batch's seconds a stage may spend, so that optional stages leave reasoning its time.
    stage_share: dict[str, float] = field(default_factory=lambda: {"knowledge": 0.2, "calculator": 0.25})


@dataclass
class SystemConfig:
    batch_size: int = 4
    task: int = 1  # CRAG task: 1 (pages only), 2 and 3 (pages and the mock KG API)
    strategy: str = "hybrid"
    # hybrid only: questions HANRAG's router calls compound or complex go to this strategy (none, hanrag, dualrag)
    multihop: str = "none"
    log_level: str = "INFO"
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
    source: str = field(default="<defaults>", metadata={"internal": True})

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ConfigError(f"{self.source}: batch_size must be in 1..{MAX_BATCH_SIZE}, got {self.batch_size}")
        backends = [f.name for f in dataclasses.fields(LLMConfig) if f.name != "backend"]
        if self.llm.backend not in backends:
            raise ConfigError(f"{self.source}: llm.backend '{self.llm.backend}' is not one of {backends}")
        if self.attributes.method not in ATTRIBUTE_METHODS:
            raise ConfigError(f"{self.source}: attributes.method '{self.attributes.method}' is not one of "
                              f"{list(ATTRIBUTE_METHODS)}")
        unknown = set(self.attributes.dynamic_classes) - set(DYNAMISM)
        if unknown:
            raise ConfigError(f"{self.source}: attributes.dynamic_classes {sorted(unknown)} not in {list(DYNAMISM)}")
        if self.task not in (1, 2, 3):
            raise ConfigError(f"{self.source}: task must be 1, 2 or 3, got {self.task}")
        if self.multihop not in ("none", "hanrag", "dualrag"):
            raise ConfigError(f"{self.source}: multihop '{self.multihop}' is not one of ['none', 'hanrag', 'dualrag']")
        if self.kg.method not in KG_METHODS:
            raise ConfigError(f"{self.source}: kg.method '{self.kg.method}' is not one of {list(KG_METHODS)}")
        if self.r2ag.mode not in R2AG_MODES:
            raise ConfigError(f"{self.source}: r2ag.mode '{self.r2ag.mode}' is not one of {list(R2AG_MODES)}")
        if self.r2ag.enabled and not self.r2ag.checkpoint:
            raise ConfigError(f"{self.source}: r2ag.enabled needs r2ag.checkpoint (train one with "
                              "tools/train_r2former.py)")
        refs = self.references
        if refs.retriever not in RETRIEVERS:
            raise ConfigError(f"{self.source}: references.retriever '{refs.retriever}' is not one of "
                              f"{list(RETRIEVERS)}")
        if refs.retriever == "hash" and not refs.hash.model:
            raise ConfigError(f"{self.source}: references.retriever hash needs references.hash.model (train one with "
                              "tools/train_hash.py)")
        if refs.hash.engine not in HASH_ENGINES:
            raise ConfigError(f"{self.source}: references.hash.engine '{refs.hash.engine}' is not one of "
                              f"{list(HASH_ENGINES)}")
        if refs.hash.units not in HASH_UNITS:
            raise ConfigError(f"{self.source}: references.hash.units '{refs.hash.units}' is not one of "
                              f"{list(HASH_UNITS)}")
        if self.budget.per_query_s <= self.budget.safety_margin_s / max(self.batch_size, 1):
            raise ConfigError(f"{self.source}: budget.per_query_s is too small for the safety margin")


def resolve_path(path: str) -> Path:
    """A path from a config: absolute, or relative to the repository."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else REPO_ROOT / candidate


def load_config(path: str | os.PathLike | None = None) -> SystemConfig:
    """Load `path`, else $CRAG_CONFIG, else configs/cpu.yaml."""
    chosen = Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    if not chosen.is_file():
        raise ConfigError(f"{chosen}: config file not found (set {CONFIG_ENV} to an existing YAML file)")
    try:
        data = yaml.safe_load(chosen.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{chosen}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{chosen}: the top level must be a mapping")
    return _build(SystemConfig, data, str(chosen), "", {"source": str(chosen)})


def _build(cls: type, data: dict[str, Any], source: str, prefix: str, extra: dict[str, Any] | None = None) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = dict(extra or {})
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in known or known[key].metadata.get("internal"):
            raise ConfigError(f"{source}: unknown key '{where}'")
        kwargs[key] = _coerce(hints[key], value, source, where)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, source: str, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: '{where}' must be a mapping")
        return _build(hint, value, source, f"{where}.")
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
