"""The language model that the benchmarks train: a small transformer, in sizes from tiny to 100M."""

import dataclasses

import torch.nn as nn

VOCAB = 1024
SEQUENCE = 32


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """A TransformerEncoder language model; every size has the same graph, only wider."""

    name: str
    dim: int
    layers: int = 4
    heads: int = 8


# About 1M, 10M and 100M parameters; "tiny" is for the benchmark's own test.
SIZES = {
    s.name: s
    for s in (
        ModelSize("tiny", dim=32, layers=1, heads=4),
        ModelSize("1M", dim=128),
        ModelSize("10M", dim=448),
        ModelSize("100M", dim=1408),
    )
}


class LanguageModel(nn.Module):
    def __init__(self, size: ModelSize):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, size.dim)
        layer = nn.TransformerEncoderLayer(
            size.dim,
            size.heads,
            dim_feedforward=4 * size.dim,
            dropout=0.0,
            batch_first=True,
        )
        self.blocks = nn.TransformerEncoder(
            layer, num_layers=size.layers, enable_nested_tensor=False
        )
        self.head = nn.Linear(size.dim, VOCAB)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))
