"""Language-model runner: 2-layer LSTM (GraVAC's LSTM: vocab 10k, 1500 wide) on PTB or a synthetic stream.

    deepspeed --num_gpus 2 runners/train_ptb.py --deepspeed_config ds_configs/bench/lstm_gravac_exp.json --lstm-size medium

Each rank trains on its own contiguous 1/N of the token stream in the classic batchified layout; the hidden state
is carried (detached) across BPTT windows and reset at each epoch start. Evaluation reports perplexity on the
valid split. Synthetic data is a seeded sparse Markov chain, so the achievable perplexity floor is known.
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from runners import data as D
from runners import text_data as T
from runners.common import DistInfo, RunnerError, base_parser, finish_parser
from runners.loop import AllSum, Task, main
from runners.models import LSTM_PRESETS, build_model, detach_hidden
from runners.systems import System

EVAL_BATCH = 10     # columns of the batchified valid split (the classic word-LM value)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", choices=("lstm",), default="lstm")
    p.add_argument("--dataset", choices=("synthetic", "ptb"), default="synthetic")
    p.add_argument("--lstm-size", choices=tuple(LSTM_PRESETS), default="large",
                   help="embedding = hidden width: large 1500 (paper), medium 650, small 200, tiny 32")
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--vocab-size", type=int, default=10000, help="synthetic vocabulary (PTB has 10000)")
    p.add_argument("--synthetic-tokens", type=int, default=1_000_000,
                   help="length of the synthetic stream (about PTB's size); 5%% valid, 5%% test")
    p.add_argument("--synthetic-zipf", type=float, default=0.8,
                   help="Zipf exponent of the synthetic word frequencies (0: uniform successors). 0.8 gives a "
                        "unigram perplexity of about 800 at 10,000 words, near PTB's")
    return finish_parser(p, argv)


class PTBTask(Task):
    name = "train_ptb"

    def __init__(self) -> None:
        self.corpus: Optional[T.LMCorpus] = None
        self.hidden: Any = None

    def check_data(self, args: argparse.Namespace) -> None:
        if args.dataset == "ptb":
            try:
                self.corpus = T.load_ptb(args.data_dir)
            except FileNotFoundError as exc:
                raise RunnerError(f"{exc} Put the PTB text files there or use --dataset synthetic.") from None

    def setup(self, args: argparse.Namespace, dist: DistInfo, micro_batch: int, device: torch.device) -> None:
        self.args, self.device, self.mb = args, device, micro_batch
        if self.corpus is None:
            self.corpus = T.SyntheticTokenStream(args.vocab_size, args.synthetic_tokens, seed=args.seed,
                                                 zipf=args.synthetic_zipf).corpus()
        shard = D.RankShard(dist.rank, dist.world_size)
        try:
            self.train = T.batchify(shard.tokens(self.corpus.train), micro_batch).to(device)
            self.valid = T.batchify(shard.tokens(self.corpus.valid), EVAL_BATCH).to(device)
        except ValueError as exc:
            raise RunnerError(f"token stream too short for {dist.world_size} ranks: {exc}") from None
        self.starts = list(range(0, self.train.size(0) - 1, args.bptt))
        self.samples_per_micro_batch = micro_batch
        self.tokens_per_micro_batch = micro_batch * args.bptt

    def build_model(self, args: argparse.Namespace) -> nn.Module:
        return build_model("lstm", vocab_size=self.corpus.vocab_size, size=args.lstm_size, dropout=args.dropout)

    def micro_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """BPTT window ``index`` of the endless stream; the flag marks an epoch start (fresh hidden state)."""
        epoch, j = divmod(index, len(self.starts))
        data, target = T.get_bptt_batch(self.train, self.starts[j], self.args.bptt)
        return data, target, j == 0

    def loss(self, system: System, batch: tuple[torch.Tensor, torch.Tensor, bool]) -> torch.Tensor:
        data, target, epoch_start = batch
        if epoch_start or self.hidden is None:
            self.hidden = system.module.init_hidden(data.size(1))
        logits, hidden = system.forward(data, self.hidden)
        self.hidden = detach_hidden(hidden)     # truncated BPTT: carry the state, not its graph
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))

    def evaluate(self, module: nn.Module, max_batches: int, all_sum: AllSum) -> dict[str, float]:
        """Token-weighted cross-entropy over this rank's valid shard, summed over ranks; ppl = exp(loss)."""
        hidden = module.init_hidden(EVAL_BATCH)
        sums = torch.zeros(2, dtype=torch.float64)
        starts = range(0, self.valid.size(0) - 1, self.args.bptt)
        for n, i in enumerate(starts):
            if 0 < max_batches <= n:
                break
            data, target = T.get_bptt_batch(self.valid, i, self.args.bptt)
            logits, hidden = module(data, hidden)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1), reduction="sum")
            sums += torch.tensor([loss.item(), target.numel()], dtype=torch.float64)
        sums = all_sum(sums.to(self.device)).cpu()
        mean = sums[0].item() / max(sums[1].item(), 1.0)
        return {"loss": mean, "ppl": math.exp(min(mean, 50.0))}

    def state_dict(self) -> dict[str, Any]:
        return {"hidden": self.hidden}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        hidden = state.get("hidden")
        self.hidden = None if hidden is None else tuple(h.to(self.device) for h in hidden)


if __name__ == "__main__":
    main(PTBTask(), parse_args)
