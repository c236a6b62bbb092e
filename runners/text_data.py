"""Language-modelling data for the LSTM runner: a synthetic first-order Markov text with a known entropy floor,
local PTB files (never downloaded), and the classic word-LM batching."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from runners.data import generator


# --- Synthetic tokens ---


@dataclass
class LMCorpus:
    """A tokenised language-modelling corpus: vocabulary and three 1-D LongTensors."""

    vocab: list[str]
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    word2idx: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.word2idx:
            self.word2idx = {w: i for i, w in enumerate(self.vocab)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


class SyntheticTokenStream:
    """Seeded sparse first-order Markov chain over ``vocab_size`` tokens.

    Every token has ``branching`` successors (drawn uniformly, or with ``zipf`` > 0 by a Zipf law over the
    vocabulary so that word frequencies are skewed as in real text; duplicates merged) with Dirichlet(1)
    probabilities, all from a generator seeded by ``seed``. Because the chain is first order, no model
    can beat the conditional entropy H(next | current): that is the known floor (``entropy_floor``).

    Generation runs k = clamp(num_tokens // 1024, 1, 1024) independent chains in parallel (vectorised),
    each from a uniform start after a 32-step burn-in, and concatenates them; the k - 1 junctions
    are a negligible deviation from the chain (at most 1 transition in 1024).
    """

    BURN_IN = 32

    def __init__(self, vocab_size: int, num_tokens: int, seed: int, branching: int = 4, zipf: float = 0.0) -> None:
        if vocab_size < 2 or num_tokens < 2 or not 1 <= branching <= vocab_size or zipf < 0:
            raise ValueError("SyntheticTokenStream: need vocab_size >= 2, num_tokens >= 2, 1 <= branching <= vocab, "
                             "zipf >= 0")
        self.vocab_size, self.num_tokens, self.seed, self.branching = vocab_size, num_tokens, seed, branching
        g = generator(seed, 0x70C)
        if zipf > 0:   # successors drawn by rank frequency 1/(k+1)^zipf: word frequencies as in real text
            weights = torch.arange(1, vocab_size + 1, dtype=torch.float64).pow(-zipf)
            draw = torch.multinomial(weights, vocab_size * branching, replacement=True, generator=g)
            self.successors = draw.view(vocab_size, branching)
        else:
            self.successors = torch.randint(vocab_size, (vocab_size, branching), generator=g)
        w = -torch.log(torch.rand(vocab_size, branching, generator=g).clamp_min(1e-12))
        self.probs = w / w.sum(dim=1, keepdim=True)
        self.tokens = self._generate(generator(seed, 0x57E))
        self._row_entropy: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return self.num_tokens

    def _generate(self, g: torch.Generator) -> torch.Tensor:
        k = max(1, min(1024, self.num_tokens // 1024))
        steps = -(-self.num_tokens // k)
        cdf = self.probs.cumsum(dim=1)
        cur = torch.randint(self.vocab_size, (k,), generator=g)
        u = torch.rand(self.BURN_IN + steps, k, generator=g)
        out = torch.empty(steps, k, dtype=torch.long)
        for t in range(self.BURN_IN + steps):
            j = (u[t].unsqueeze(1) > cdf[cur]).sum(dim=1).clamp_max(self.branching - 1)
            cur = self.successors[cur, j]
            if t >= self.BURN_IN:
                out[t - self.BURN_IN] = cur
        return out.t().reshape(-1)[: self.num_tokens].contiguous()

    def row_entropies(self) -> torch.Tensor:
        """H(next | current = s) in nats for every state s, merging duplicate successors first."""
        if self._row_entropy is None:
            v = self.vocab_size
            keys = (torch.arange(v).unsqueeze(1) * v + self.successors).reshape(-1)
            uniq, inv = torch.unique(keys, return_inverse=True)
            p = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, self.probs.reshape(-1).double())
            terms = -p * torch.log(p.clamp_min(1e-300))
            self._row_entropy = torch.zeros(v, dtype=torch.float64).index_add_(0, uniq // v, terms)
        return self._row_entropy

    def entropy_floor(self) -> float:
        """Best achievable per-token cross-entropy (nats) on this stream.

        Computed as sum_s pi(s) * H(next | s), where H(next | s) comes from the exact transition
        probabilities and pi is the empirical frequency of s among the predecessor tokens
        ``tokens[:-1]`` (an estimate of the stationary distribution; exact for this very stream up to
        the chain junctions). ``exp(entropy_floor())`` is the perplexity floor.
        """
        counts = torch.bincount(self.tokens[:-1], minlength=self.vocab_size).double()
        return float((counts / counts.sum() * self.row_entropies()).sum())

    def corpus(self, valid_frac: float = 0.05, test_frac: float = 0.05) -> LMCorpus:
        """Contiguous train/valid/test split with a synthetic vocabulary ``t0 … t{V-1}``."""
        n = self.num_tokens
        n_valid, n_test = int(n * valid_frac), int(n * test_frac)
        n_train = n - n_valid - n_test
        if n_train < 2:
            raise ValueError("SyntheticTokenStream.corpus: fractions leave no training tokens")
        t = self.tokens
        vocab = [f"t{i}" for i in range(self.vocab_size)]
        return LMCorpus(vocab, t[:n_train], t[n_train : n_train + n_valid], t[n_train + n_valid :])


# --- Local PTB files ---

PTB_FILES = ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")


def _read_words(path: str) -> list[str]:
    """Words of a PTB file, one ``<eos>`` appended per line (the classic word-LM convention)."""
    words: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            words.extend(line.split())
            words.append("<eos>")
    return words


def _encode(words: Sequence[str], word2idx: dict[str, int]) -> torch.Tensor:
    unk = word2idx.get("<unk>")
    ids = [word2idx.get(w, unk) for w in words]
    return torch.tensor(ids, dtype=torch.long)


def load_ptb(data_dir: str) -> LMCorpus:
    """PTB word-level corpus. The vocabulary is built from the training text in order of first
    appearance; valid/test words unseen in training map to ``<unk>`` (added to the vocabulary if the
    training text lacks it — real PTB already uses ``<unk>`` so nothing changes there)."""
    paths = [os.path.join(str(data_dir), f) for f in PTB_FILES]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(
            f"PTB files not found: expected {', '.join(PTB_FILES)} in {os.path.abspath(str(data_dir))} "
            f"(missing: {', '.join(os.path.basename(p) for p in missing)})."
        )
    train_w, valid_w, test_w = (_read_words(p) for p in paths)
    word2idx: dict[str, int] = {}
    for w in train_w:
        word2idx.setdefault(w, len(word2idx))
    if any(w not in word2idx for w in valid_w + test_w):
        word2idx.setdefault("<unk>", len(word2idx))
    vocab = list(word2idx)
    return LMCorpus(vocab, _encode(train_w, word2idx), _encode(valid_w, word2idx), _encode(test_w, word2idx), word2idx)


# --- LM batching (classic word-language-model layout) ---


def batchify(tokens: torch.Tensor, batch_size: int) -> torch.Tensor:
    """[N] -> [N // B, B]: B contiguous columns, the trailing remainder dropped."""
    n = tokens.numel() // batch_size
    if n < 2:
        raise ValueError(f"batchify: {tokens.numel()} tokens are too few for batch size {batch_size}")
    return tokens[: n * batch_size].view(batch_size, n).t().contiguous()


def get_bptt_batch(source: torch.Tensor, i: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``i .. i+L`` of a batchified ``source`` and the next-token targets, both [L, B] with
    ``L = min(bptt, T - 1 - i)`` (flatten the target for ``cross_entropy``)."""
    seq_len = min(bptt, source.size(0) - 1 - i)
    if seq_len < 1:
        raise IndexError(f"get_bptt_batch: row {i} leaves no target in a source of {source.size(0)} rows")
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len]
