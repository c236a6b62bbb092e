"""Models for the training runners.

All randomly initialised (torchvision ``weights=None``; nothing is downloaded). The CIFAR models are
torchvision's stock definitions, so parameter counts are the usual ones: ResNet101 with 10 classes has
42.5M parameters, VGG16-bn with 100 classes 134.7M (on 32x32 inputs the adaptive average pool
replicates the 1x1 feature map to 7x7, so the 4096-wide classifier is kept). The LSTM LM follows the
classic word-language-model example; the paper's configuration (2 layers, 1500, vocab 10k) has 66.0M.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

LSTM_PRESETS: dict[str, int] = {"large": 1500, "medium": 650, "small": 200, "tiny": 32}

Hidden = tuple[torch.Tensor, torch.Tensor]


class TinyCNN(nn.Module):
    """A few-thousand-parameter conv net for tests and smoke runs (keeps a 4x4 spatial map so
    position-dependent templates stay separable)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(4),
        )
        self.classifier = nn.Linear(2 * width * 16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class MLP(nn.Module):
    """A plain multi-layer perceptron on flattened images (3·32·32 → width → width → classes, 4.2M parameters at
    width 1024): the fidelity benchmark's fast task, where a convergence comparison takes seconds per system."""

    def __init__(self, num_classes: int = 10, in_features: int = 3 * 32 * 32, width: int = 1024, depth: int = 2
                 ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        for i in range(depth):
            layers += [nn.Linear(in_features if i == 0 else width, width), nn.ReLU(inplace=True)]
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LSTMLanguageModel(nn.Module):
    """Embedding -> multi-layer LSTM -> linear decoder, inputs laid out [T, B] (batchify layout).

    The hidden state is returned so runners can carry it across BPTT batches (after
    ``detach_hidden``, which truncates backpropagation at the batch boundary).
    """

    def __init__(
        self,
        vocab_size: int,
        emb_size: int,
        hidden_size: int,
        num_layers: int = 2,
        dropout: float = 0.5,
        tie_weights: bool = False,
    ) -> None:
        super().__init__()
        if tie_weights and emb_size != hidden_size:
            raise ValueError("LSTMLanguageModel: tie_weights needs emb_size == hidden_size")
        self.vocab_size, self.emb_size, self.hidden_size, self.num_layers = vocab_size, emb_size, hidden_size, num_layers
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, emb_size)
        self.rnn = nn.LSTM(emb_size, hidden_size, num_layers, dropout=dropout if num_layers > 1 else 0.0)
        self.decoder = nn.Linear(hidden_size, vocab_size)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        self._init_weights()

    def _init_weights(self, r: float = 0.1) -> None:
        """Uniform(-0.1, 0.1) embedding/decoder and zero decoder bias, as in the classic example."""
        nn.init.uniform_(self.encoder.weight, -r, r)
        nn.init.zeros_(self.decoder.bias)
        if self.decoder.weight is not self.encoder.weight:
            nn.init.uniform_(self.decoder.weight, -r, r)

    def forward(self, tokens: torch.Tensor, hidden: Hidden) -> tuple[torch.Tensor, Hidden]:
        """tokens [T, B] -> logits [T, B, V] and the new hidden state."""
        emb = self.drop(self.encoder(tokens))
        out, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(out)), hidden

    def init_hidden(self, batch_size: int) -> Hidden:
        """Zero (h, c) of shape [num_layers, B, hidden] on the model's device and dtype."""
        w = self.decoder.weight
        shape = (self.num_layers, batch_size, self.hidden_size)
        return w.new_zeros(shape), w.new_zeros(shape)

    @staticmethod
    def detach_hidden(hidden: Hidden) -> Hidden:
        return detach_hidden(hidden)


def detach_hidden(hidden: Any) -> Any:
    """Detach a hidden state (tensor or nested tuple) from its graph so BPTT stops at the boundary."""
    if isinstance(hidden, torch.Tensor):
        return hidden.detach()
    return tuple(detach_hidden(h) for h in hidden)


def build_lstm(vocab_size: int = 10000, size: str = "large", **kw: Any) -> LSTMLanguageModel:
    """LSTM LM from a size preset (embedding = hidden = LSTM_PRESETS[size]); ``kw`` go to the class."""
    if size not in LSTM_PRESETS:
        raise ValueError(f"unknown LSTM size {size!r}; choose one of {sorted(LSTM_PRESETS)}")
    width = LSTM_PRESETS[size]
    kw.setdefault("emb_size", width)
    kw.setdefault("hidden_size", width)
    return LSTMLanguageModel(vocab_size, **kw)


def _torchvision(name: str, num_classes: int, **kw: Any) -> nn.Module:
    from torchvision import models

    return getattr(models, name)(weights=None, num_classes=num_classes, **kw)


MODEL_NAMES = ("resnet101", "resnet18", "vgg16", "tiny_cnn", "mlp", "lstm")


def build_model(name: str, num_classes: int = 10, **kw: Any) -> nn.Module:
    """Build a runner model by name.

    ``resnet101``, ``resnet18``, ``vgg16`` (torchvision ``vgg16_bn``), ``tiny_cnn`` and ``mlp`` take
    ``num_classes``; ``lstm`` takes ``vocab_size`` (default 10000), ``size`` (a ``LSTM_PRESETS`` key)
    and ``LSTMLanguageModel`` keywords, and ignores ``num_classes``.
    """
    if name in ("resnet101", "resnet18"):
        return _torchvision(name, num_classes, **kw)
    if name in ("vgg16", "vgg16_bn"):
        return _torchvision("vgg16_bn", num_classes, **kw)
    if name == "tiny_cnn":
        return TinyCNN(num_classes, **kw)
    if name == "mlp":
        return MLP(num_classes, **kw)
    if name == "lstm":
        return build_lstm(**kw)
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameter elements (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())
