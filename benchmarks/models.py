"""The benchmark models: small, deterministic (seeded weights and inputs), each
sized so that one eager forward takes about 0.1-5 ms on a 2-core CPU.

`MODELS[name].build()` returns the module in eval() mode, with BatchNorm statistics
of its own; `.example_inputs()`
returns a tuple of positional arguments. The same registry serves the benchmark
and the model tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tori.testing import settle_batch_norm


@dataclass(frozen=True)
class BenchModel:
    name: str
    factory: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    seed: int

    def build(self) -> nn.Module:
        """The module in eval mode; BatchNorm statistics from a few training-mode passes
        (tori.testing.settle_batch_norm), so that eval-mode BatchNorm is not the identity."""
        torch.manual_seed(self.seed)
        return settle_batch_norm(self.factory(), *self.example_inputs())

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return self.inputs(torch.Generator().manual_seed(self.seed + 1))


MODELS: dict[str, BenchModel] = {}


def register(name: str, inputs: Callable[[torch.Generator], tuple[torch.Tensor, ...]]):
    """Register a module factory under `name`, with its example-input factory."""

    def add(factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
        MODELS[name] = BenchModel(name, factory, inputs, seed=len(MODELS))
        return factory

    return add


@register("mlp", inputs=lambda g: (torch.randn(64, 256, generator=g),))
def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 10), nn.ReLU(),
    )


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


@register("cnn_bn", inputs=lambda g: (torch.randn(8, 3, 32, 32, generator=g),))
def cnn_bn() -> nn.Module:
    return nn.Sequential(
        *_conv_bn_relu(3, 16), nn.MaxPool2d(2),
        *_conv_bn_relu(16, 32), nn.MaxPool2d(2),
        *_conv_bn_relu(32, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv+BN, a 1x1 projection when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


@register("resnet_blocks", inputs=lambda g: (torch.randn(4, 3, 32, 32, generator=g),))
def resnet_blocks() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )


@register("transformer_layer", inputs=lambda g: (torch.randn(4, 64, 128, generator=g),))
def transformer_layer() -> nn.Module:
    return nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, dropout=0.0, batch_first=True)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, dim))


class DecoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT2Decoder(nn.Module):
    """GPT-2's shape at toy size: pre-LN decoder blocks and an (untied) LM head."""

    def __init__(self, vocab: int = 512, context: int = 64, dim: int = 128, heads: int = 4, layers: int = 2):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


@register("gpt2_decoder", inputs=lambda g: (torch.randint(0, 512, (2, 64), generator=g),))
def gpt2_decoder() -> nn.Module:
    return GPT2Decoder()


@register("tiny_linear", inputs=lambda g: (torch.randn(4, 16, generator=g),))
def tiny_linear() -> nn.Module:
    # Almost no arithmetic: its latency is the per-call overhead of each backend.
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU())


class HandRMSNorm(nn.Module):
    """LLaMA's RMSNorm, written out as its users write it."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class HandAttentionBlock(nn.Module):
    """A pre-norm decoder block with everything written out by hand: RMSNorm,
    separate q/k/v projections, attention as matmul/softmax/matmul under a causal
    mask built in forward, and a tanh-GELU MLP."""

    def __init__(self, dim: int = 128, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = HandRMSNorm(dim), HandRMSNorm(dim)
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.o = nn.Linear(dim, dim, bias=False)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        head_dim = dim // self.heads
        q, k, v = (proj(x).view(batch, seq, self.heads, head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        scores = q @ k.transpose(-2, -1) / head_dim ** 0.5
        causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=x.device), diagonal=1)
        probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        return self.o((probs @ v).transpose(1, 2).reshape(batch, seq, dim))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        h = 0.5 * h * (1 + torch.tanh(0.7978845608028654 * (h + 0.044715 * h.pow(3))))
        return self.down(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


@register("hand_attention", inputs=lambda g: (torch.randn(4, 64, 128, generator=g),))
def hand_attention() -> nn.Module:
    return HandAttentionBlock()


def mel_filterbank(bins: int, bands: int, sample_rate: int) -> torch.Tensor:
    """[bands, bins] triangular filters evenly spaced on the mel scale (HTK's formula),
    over the `bins` frequencies of a one-sided spectrum."""
    def mel(hz):
        return 2595.0 * torch.log10(1.0 + hz / 700.0)

    def hz(m):
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    frequencies = torch.linspace(0, sample_rate / 2, bins, dtype=torch.float64)
    edges = hz(torch.linspace(0.0, float(mel(torch.tensor(sample_rate / 2.0))), bands + 2, dtype=torch.float64))
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (frequencies - low) / (centre - low)
    falling = (high - frequencies) / (high - centre)
    return torch.clamp(torch.minimum(rising, falling), min=0).to(torch.float32)


class SpectrogramClassifier(nn.Module):
    """A keyword-spotting model: the log-mel spectrogram of 1 s of 16 kHz audio (stft
    with a 400-sample Hann window and a hop of 160, power, 64 mel bands, log), then two
    convolutions and a linear classifier over 12 words."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(400))
        self.register_buffer("mel", mel_filterbank(201, 64, 16000))
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(32, 12)

    def forward(self, audio):
        spectrum = torch.stft(audio, 400, hop_length=160, window=self.window, return_complex=True)
        power = spectrum.abs().pow(2)
        features = torch.log(torch.matmul(self.mel, power) + 1e-6)
        return self.classifier(self.features(features.unsqueeze(1)).flatten(1))


@register("spectrogram", inputs=lambda g: (torch.randn(4, 16000, generator=g),))
def spectrogram() -> nn.Module:
    return SpectrogramClassifier()
