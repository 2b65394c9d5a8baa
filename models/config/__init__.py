"""The system's configuration: the schema (schema.py, with its sections in sections.py), reading and checking a
config (loader.py) and the reference of every key (reference.py). What other modules use is imported from here;
loading a config, which imports the stages first, is models/loading.py's `load_config`."""

from models.config.loader import (
    CONFIG_ENV,
    DEFAULT_CONFIG,
    add_config_arguments,
    config_path,
)
from models.config.reference import ConfigKey, yaml_text
from models.config.schema import (
    DEFAULT_STRATEGIES,
    REPO_ROOT,
    STAGE_SECTIONS,
    SystemConfig,
    add_section,
    resolve_path,
)
from models.config.sections import (
    DOMAINS,
    DYNAMISM,
    AttributesConfig,
    BudgetConfig,
    CalculatorConfig,
    Dynamism,
    EmbedderConfig,
    HFConfig,
    ICLConfig,
    KnowledgeConfig,
    LLMConfig,
    OpenAIConfig,
    ReasoningConfig,
    ReferencesConfig,
    RerankConfig,
    VLLMConfig,
)
from models.config.validation import CHOICES, Choice, add_choice, field_docs
from utils.errors import ConfigError

__all__ = [
    "CHOICES", "CONFIG_ENV", "DEFAULT_CONFIG", "DEFAULT_STRATEGIES", "DOMAINS", "DYNAMISM",
    "REPO_ROOT", "STAGE_SECTIONS", "AttributesConfig", "BudgetConfig", "CalculatorConfig",
    "Choice", "ConfigError", "ConfigKey", "Dynamism", "EmbedderConfig", "HFConfig",
    "ICLConfig", "KnowledgeConfig", "LLMConfig", "OpenAIConfig",
    "ReasoningConfig", "ReferencesConfig", "RerankConfig", "SystemConfig", "VLLMConfig",
    "add_choice", "add_config_arguments", "add_section", "config_path", "field_docs", "resolve_path",
    "yaml_text",
]
