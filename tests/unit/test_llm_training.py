"""training/llm_training.py on a tiny Llama initialised at random from a config (SmolLM2's tokenizer, from the packaged
GGUF; nothing from a hub): SFT's loss on the completion only, a resumed run equal to an uninterrupted one, DPO, and
the merged folder equal to base plus adapter."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, TrainerCallback

from models.llm.hf import resolve_model_folder
from training.llm_training import ADAPTER, MANIFEST, TrainSettings, fitting_rows, merge, train
from utils.errors import ConfigError
from utils.model_folders import weights_hash

SETTINGS = TrainSettings(lora_rank=4, lora_alpha=8, max_steps=4, batch_size=2, save_steps=2, bf16=False,
                         learning_rate=1e-2, max_length=256)


def row(question: str, answer: str) -> dict:
    return {"prompt": [{"role": "system", "content": "Answer in as few words as possible."},
                       {"role": "user", "content": f"Question: {question}\nAnswer:"}],
            "completion": [{"role": "assistant", "content": answer}]}


ROWS = [row("who directed the godfather?", "francis ford coppola"), row("capital of italy?", "rome"),
        row("who won the 1950 world cup?", "i don't know"), row("when did paris win the world cup?",
                                                                "invalid question")] * 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_folder())
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def adapter_tensors(out):
    from safetensors.torch import load_file
    return load_file(out / ADAPTER / "adapter_model.safetensors")


class CrashAfterSave(TrainerCallback):
    """Stops the run the way a killed process would, right after the checkpoint of `step` is written."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tiny, tmp_path):
    whole = train(tiny, ROWS, tmp_path / "whole", SETTINGS)
    with pytest.raises(KeyboardInterrupt):
        train(tiny, ROWS, tmp_path / "cut", SETTINGS, callbacks=[CrashAfterSave(2)])
    assert not (tmp_path / "cut" / ADAPTER).exists()
    resumed = train(tiny, ROWS, tmp_path / "cut", SETTINGS, resume=True)
    assert resumed["resumed"] and not whole["resumed"] and whole["steps"] == resumed["steps"] == 4
    a, b = adapter_tensors(tmp_path / "whole"), adapter_tensors(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the adapter moved off its initialisation (LoRA's B starts at zero); the curve has a loss per step
    assert any(k.endswith("lora_B.weight") and a[k].abs().sum() > 0 for k in a)
    assert [e["step"] for e in whole["loss"]] == [1, 2, 3, 4]
    manifest = json.loads((tmp_path / "whole" / MANIFEST).read_text())
    assert manifest["base_weights_sha256"] == weights_hash(tiny)
    assert manifest["settings"]["lora_rank"] == 4 and manifest["versions"]["trl"]


def test_sft_puts_the_loss_on_the_completion_only(tiny):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(tiny), train_dataset=Dataset.from_list(ROWS[:1]),
                         args=SFTConfig(output_dir="/tmp/unused", completion_only_loss=True, report_to=[],
                                        use_cpu=True), processing_class=tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[0]])
    learned = [t for t, label in zip(batch["input_ids"][0].tolist(), batch["labels"][0].tolist()) if label != -100]
    assert tokenizer.decode(learned).strip().startswith("francis ford coppola")
    assert "Question" not in tokenizer.decode(learned)


def test_the_merged_folder_computes_what_base_and_adapter_compute(tiny, tmp_path):
    from peft import PeftModel

    train(tiny, ROWS, tmp_path / "run", SETTINGS)
    merged = merge(tiny, tmp_path / "run" / ADAPTER, tmp_path / "merged")
    tokenizer_config = json.loads((merged / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"  # transformers 4.x knows it
    config = json.loads((merged / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]  # and reads this RoPE base
    assert json.loads((merged / "merged_from.json").read_text())["base_weights_sha256"] == weights_hash(tiny)
    ids = torch.tensor([[1, 200, 300, 400]])
    with torch.no_grad():
        expected = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny),
                                             tmp_path / "run" / ADAPTER).eval()(ids).logits
        got = AutoModelForCausalLM.from_pretrained(merged).eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny).eval()(ids).logits
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(got, base, atol=1e-3)


def test_dpo_trains_an_adapter_on_preference_pairs(tiny, tmp_path):
    pairs = [{"prompt": r["prompt"], "chosen": r["completion"],
              "rejected": [{"role": "assistant", "content": "i don't know"}]} for r in ROWS[:2]] * 2
    found = train(tiny, pairs, tmp_path / "dpo", TrainSettings(method="dpo", lora_rank=4, max_steps=2, batch_size=2,
                                                               bf16=False, max_length=256))
    assert found["steps"] == 2 and found["loss"] and (tmp_path / "dpo" / ADAPTER / "adapter_config.json").is_file()


def test_rows_longer_than_max_length_are_dropped_not_cut(tiny):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    long = row("word " * 300, "rome")
    kept, dropped, _ = fitting_rows([ROWS[0], long], tokenizer, "sft", 256)
    assert dropped == 1 and kept == [{"prompt": ROWS[0]["prompt"], "completion": ROWS[0]["completion"]}]
    with pytest.raises(ConfigError, match=r"no training row fits max_length \d+ \(1 dropped\): raise --max-length"):
        train(tiny, [long], tiny.parent / "never", SETTINGS)


def test_the_probe_reads_answers_as_the_serving_stage_does(tiny, monkeypatch):
    """A model that writes the reasoning block's answer is scored by the answer inside it."""
    from training import llm_training

    block = "===START===\n## Answer: {}\n## False Premise: no\n===END==="
    rows = [dict(row("capital of italy?", block.format("rome")), kind="extraction", prompt_name="reasoning"),
            dict(row("who won in 1950?", block.format("i don't know")), kind="refusal", prompt_name="reasoning"),
            dict(row("who directed it?", "francis ford coppola"), kind="own", prompt_name="summariser")]
    replies = iter(["Thinking...\n" + block.format("Rome, Italy"), block.format("Uruguay"), "I don't know."])

    def decoded(self, ids, skip_special_tokens=False):
        return next(replies)

    monkeypatch.setattr(type(AutoTokenizer.from_pretrained(tiny)), "decode", decoded)
    found = llm_training.probe(tiny, rows, max_new_tokens=2)
    assert found == {"extraction": {"target": 1}, "refusal": {"other": 1}, "own": {"idk": 1}}
