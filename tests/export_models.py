"""Models of the export tests, importable by path as `tori export` factories."""

from __future__ import annotations

import torch
from torch import nn

import tori

# How often `offsets` ran, and whether its inputs were real tensors: it must run at
# export time, on the model's real weights.
CONSTANT_CALLS: list[bool] = []
EXPORTING_SEEN: list[bool] = []  # tori.compiler.is_exporting() at each forward


@torch.compiler.assume_constant_result
def offsets(width: int) -> torch.Tensor:
    CONSTANT_CALLS.append(True)
    return torch.arange(width, dtype=torch.float32) / width


class Tagger(nn.Module):
    """A small model with an `assume_constant_result` method and function."""

    def __init__(self, dim: int = 16, classes: int = 8):
        super().__init__()
        self.embed = nn.Linear(dim, 32)
        self.head = nn.Linear(32, classes)
        self.register_buffer("temperature", torch.tensor([2.0]))
        self.bias_source = [0.5]  # read by `shift` at export time only

    @torch.compiler.assume_constant_result
    def shift(self) -> torch.Tensor:
        return torch.full((32,), self.bias_source[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.embed(x) + self.shift())
        EXPORTING_SEEN.append(tori.compiler.is_exporting())
        return self.head(h) / self.temperature + offsets(self.head.out_features)

    def score(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A second entry point: two inputs, two outputs."""
        logits = self.head(torch.relu(self.embed(x)))
        return logits.softmax(-1), (logits * y).sum(-1)


def tagger() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Tagger().eval(), (torch.randn(4, 16),)
