"""The training stack's reference for the engine's log-probability test (tests/vllm/test_engine_agreement.py):
make eval's reasoning prompts (data/crag_sample.jsonl through configs/cpu.yaml's references stage and reasoning
prompt, in the folder's chat template), each continued greedily by .venv's transformers 5 in float32, and every
continuation token scored by teacher forcing with its top k.

`make test-vllm` runs it in .venv for each folder the suite checks against it:

    python -m tests.engine_reference --model runs/vllm/smollm2 --out runs/vllm/reference-smollm2.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evaluation.engine_agreement import hf_scores

REPO = Path(__file__).resolve().parents[1]
NEW_TOKENS = 32
TOP_K = 5


def reference(model_dir: Path, new_tokens: int = NEW_TOKENS, top_k: int = TOP_K) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evaluation.data import read_examples
    from models.loading import load_config
    from training.examples import reasoning_conversations
    from utils.model_folders import weights_hash

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    examples = list(read_examples(REPO / "data" / "crag_sample.jsonl"))
    prompts = [list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
               for conversation, _ in reasoning_conversations(examples, load_config(REPO / "configs" / "cpu.yaml"))]
    sequences = []
    for ids in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=new_tokens, do_sample=False)
        sequences.append([int(t) for t in out[0]])
    starts = [len(ids) for ids in prompts]
    return {"model": str(model_dir), "weights_sha256": weights_hash(model_dir),
            "transformers": transformers.__version__, "dtype": "float32", "top_k": top_k,
            "sequences": sequences, "starts": starts, "scores": hf_scores(model, sequences, starts, top_k),
            "continuations": [tokenizer.decode(s[n:]) for s, n in zip(sequences, starts)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.write_text(json.dumps(reference(args.model)) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
