"""MODULE:FACTORY factories for the tests of the `tori` command."""

import torch
from torch import nn


class WithGraphBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.second = nn.Linear(16, 4)

    def forward(self, x):
        y = torch.relu(self.first(x)) + torch.arange(16.0) * 0.5
        print("a graph break")
        return self.second(y).sin()


def with_graph_break():
    torch.manual_seed(0)
    return WithGraphBreak().eval(), (torch.randn(2, 8),)


def small_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval(), (torch.randn(4, 16),)
