"""Real architectures, random weights: timm classification models and Hugging Face
`transformers` models, built from their code and configs (nothing is downloaded).

`REAL_MODELS[name].build()` returns the module in eval() mode (BatchNorm statistics
from a few training-mode passes: tori.testing.settle_batch_norm) and
`.inputs(batch)` its positional arguments. Vision models take 224x224 images; text
models 128 tokens. The transformers configs keep each architecture's widths and
heads but fewer layers than the published checkpoints, so that a compile fits the
benchmark's time on two cores (the per-layer work is that of the real model).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from tori.testing import allow_torchvision_import, settle_batch_norm  # noqa: E402

allow_torchvision_import()  # transformers imports torchvision too

IMAGE = 224
TOKENS = 128
VOCAB = 32000


@dataclass(frozen=True)
class RealModel:
    name: str
    family: str  # "timm", "transformers" or "decode"
    factory: Callable[[], nn.Module]
    make_inputs: Callable[[int, torch.Generator], tuple]

    def build(self) -> nn.Module:
        torch.manual_seed(0)
        return settle_batch_norm(self.factory(), *self.inputs(1))

    def inputs(self, batch: int) -> tuple:
        return self.make_inputs(batch, torch.Generator().manual_seed(1))


REAL_MODELS: dict[str, RealModel] = {}


def _images(batch: int, generator: torch.Generator) -> tuple:
    return (torch.randn(batch, 3, IMAGE, IMAGE, generator=generator),)


def _tokens(batch: int, generator: torch.Generator) -> tuple:
    return (torch.randint(0, VOCAB, (batch, TOKENS), generator=generator),)


def _timm(name: str, architecture: str) -> None:
    def build() -> nn.Module:
        from tori.testing import import_timm

        return import_timm().create_model(architecture, pretrained=False)

    REAL_MODELS[name] = RealModel(name, "timm", build, _images)


for _name, _architecture in (
    ("resnet18", "resnet18"), ("resnet50", "resnet50"), ("mobilenetv3", "mobilenetv3_large_100"),
    ("efficientnet_b0", "efficientnet_b0"), ("convnext_tiny", "convnext_tiny"), ("regnety_016", "regnety_016"),
    ("deit_small", "deit_small_patch16_224"),
):
    _timm(_name, _architecture)


class _Logits(nn.Module):
    """A transformers model called with positional tensors, returning one tensor."""

    def __init__(self, model: nn.Module, output: str = "logits"):
        super().__init__()
        self.model = model
        self.output = output

    def forward(self, *args):
        keys = ("input_ids",) if self.output != "pixels" else ("pixel_values",)
        result = self.model(**dict(zip(keys, args)), **({"use_cache": False} if hasattr(self.model.config, "use_cache") else {}))
        return result.logits if self.output in ("logits", "pixels") else result.last_hidden_state


def _transformers(name: str, make: Callable[[], nn.Module], inputs=_tokens) -> None:
    REAL_MODELS[name] = RealModel(name, "transformers", make, inputs)


def _bert() -> nn.Module:
    import transformers

    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=768, num_hidden_layers=4, num_attention_heads=12,
                                     intermediate_size=3072)
    return _Logits(transformers.BertForSequenceClassification(config))


def _gpt2() -> nn.Module:
    import transformers

    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=768, n_layer=4, n_head=12, n_positions=TOKENS)
    return _Logits(transformers.GPT2LMHeadModel(config))


def _t5_encoder() -> nn.Module:
    import transformers

    config = transformers.T5Config(vocab_size=VOCAB, d_model=512, d_kv=64, d_ff=2048, num_layers=4, num_heads=8)
    return _Logits(transformers.T5EncoderModel(config), output="hidden")


def _vit() -> nn.Module:
    import transformers

    config = transformers.ViTConfig(hidden_size=768, num_hidden_layers=4, num_attention_heads=12,
                                    intermediate_size=3072, image_size=IMAGE, patch_size=16, num_labels=1000)
    return _Logits(transformers.ViTForImageClassification(config), output="pixels")


def _llama() -> nn.Module:
    import transformers

    return _Logits(transformers.LlamaForCausalLM(llama_config()))


def llama_config():
    import transformers

    return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                                    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)


_transformers("bert", _bert)
_transformers("gpt2", _gpt2)
_transformers("t5_encoder", _t5_encoder)
_transformers("vit", _vit, _images)
_transformers("llama_prefill", _llama)
