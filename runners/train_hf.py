"""Hugging Face ``Trainer`` + DeepSpeed + ``ds_gravac.GravacCallback`` on a small causal LM built from a config.

    deepspeed --num_gpus 2 runners/train_hf.py --deepspeed_config ds_configs/hf.json --steps 20

No downloaded weights or tokenizers: the vocabulary is built from the training text (a local file given with
``--text-file``, else a deterministic synthetic Markov-chain text from ``runners.text_data``).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Optional, Sequence

import torch


def word_vocab(text: str) -> dict[str, int]:
    """Vocabulary from the training text, in order of first appearance (index 0 is padding/unknown)."""
    vocab = {"<unk>": 0}
    for word in text.split():
        vocab.setdefault(word, len(vocab))
    return vocab


def synthetic_text(num_tokens: int, seed: int) -> str:
    from runners.text_data import SyntheticTokenStream
    stream = SyntheticTokenStream(vocab_size=200, num_tokens=num_tokens, seed=seed)
    return " ".join(f"w{int(t)}" for t in stream.tokens)


class BlockDataset(torch.utils.data.Dataset):
    """Fixed-length blocks of token ids; labels = inputs (the model shifts them)."""

    def __init__(self, ids: torch.Tensor, block: int) -> None:
        usable = (ids.numel() // block) * block
        self.blocks = ids[:usable].view(-1, block)

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def tiny_model(vocab_size: int = 197, block: int = 32) -> Any:
    """The 2-layer GPT-2-style model the Trainer trains (the default vocabulary: the synthetic text's at seed 0),
    e.g. for ``python -m ds_gravac.plan ds_configs/hf.json --model runners.train_hf:tiny_model``."""
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_positions=block, n_embd=32, n_layer=2, n_head=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def tiny_bert(vocab_size: int = 1000, num_labels: int = 2) -> Any:
    """A 2-layer BERT classifier (randomly initialised, nothing downloaded), the encoder shape Hugging Face users
    fine-tune: ``python -m ds_gravac.plan ds_configs/hf.json --model runners.train_hf:tiny_bert``."""
    from transformers import BertConfig, BertForSequenceClassification
    return BertForSequenceClassification(BertConfig(vocab_size=vocab_size, hidden_size=128, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=512,
                                                    num_labels=num_labels))


def build_trainer(ds_config: dict, output_dir: str, steps: int, seed: int = 0, callback: bool = True,
                  text: Optional[str] = None, block: int = 32, save_steps: int = 0) -> Any:
    """A Trainer on a 2-layer GPT-2-style model; with ``callback`` ds_gravac takes over gradient sync."""
    from transformers import Trainer, TrainingArguments

    import ds_gravac
    text = text if text is not None else synthetic_text(20000, seed)
    vocab = word_vocab(text)
    ids = torch.tensor([vocab[w] for w in text.split()], dtype=torch.long)
    torch.manual_seed(seed)
    model = tiny_model(len(vocab), block)
    micro = int(ds_config.get("train_micro_batch_size_per_gpu", 4))
    gas = int(ds_config.get("gradient_accumulation_steps", 1))
    args = TrainingArguments(output_dir=output_dir, use_cpu=True, deepspeed=ds_config, max_steps=steps,
                             per_device_train_batch_size=micro, gradient_accumulation_steps=gas,
                             learning_rate=float(ds_config.get("optimizer", {}).get("params", {}).get("lr", 1e-3)),
                             max_grad_norm=0.0, report_to=[], logging_steps=1, seed=seed, data_seed=seed,
                             save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
                             dataloader_drop_last=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=BlockDataset(ids, block))
    if callback:
        trainer.add_callback(ds_gravac.GravacCallback(trainer))
    return trainer


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed_config", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/hf")
    parser.add_argument("--text-file", default=None, help="training text (words separated by spaces)")
    parser.add_argument("--no-gravac", action="store_true", help="plain Trainer + DeepSpeed, for comparison")
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    with open(args.deepspeed_config, encoding="utf-8") as fh:
        ds_config = json.load(fh)
    text = open(args.text_file, encoding="utf-8").read() if args.text_file else None
    trainer = build_trainer(ds_config, args.output_dir, args.steps, args.seed, callback=not args.no_gravac,
                            text=text)
    result = trainer.train()
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"train_hf summary: {result.global_step} steps, training loss {result.training_loss:.4f}")


if __name__ == "__main__":
    main()
