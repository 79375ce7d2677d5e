"""The benchmark models as `MODULE:FACTORY` factories for the `tori` command:
each function returns (model, example_inputs), e.g. `tori explore benchmarks/examples.py:mlp`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import MODELS  # noqa: E402


def _example(name: str):
    spec = MODELS[name]
    return spec.build(), spec.example_inputs()


def mlp():
    return _example("mlp")


def cnn_bn():
    return _example("cnn_bn")


def resnet_blocks():
    return _example("resnet_blocks")


def transformer_layer():
    return _example("transformer_layer")


def gpt2_decoder():
    return _example("gpt2_decoder")


def tiny_linear():
    return _example("tiny_linear")


def hand_attention():
    return _example("hand_attention")
