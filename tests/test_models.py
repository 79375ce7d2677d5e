"""The benchmark models through tori, against eager PyTorch: all six in inference,
and two (one with BatchNorm) for several training steps with an optimizer.
"""

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from models import MODELS  # noqa: E402
from tori.testing import assert_matches_eager, assert_same_training_state, count_graphs  # noqa: E402

# Compiled kernels reorder float reductions (convolutions, attention, LayerNorm).
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
SLOW = {"resnet_blocks", "gpt2_decoder"}


def _inference_case(name: str):
    marks = [pytest.mark.slow] if name in SLOW else []
    return pytest.param(name, marks=marks)


@pytest.mark.parametrize("name", [_inference_case(n) for n in MODELS])
def test_inference_matches_eager(name):
    spec = MODELS[name]
    with torch.no_grad():
        assert_matches_eager(spec.build(), *spec.example_inputs(), calls=2, **TOLERANCE)


def test_batch_norm_of_the_models_is_not_the_identity():
    # Eval-mode BatchNorm with fresh statistics (mean 0, variance 1) and affine terms
    # (1, 0) passes its input through: a lowering that ignored them would go unseen.
    norms = {name: [m for m in spec.build().modules() if isinstance(m, torch.nn.BatchNorm2d)]
             for name, spec in MODELS.items()}
    assert sum(map(len, norms.values())) >= 10
    for name, found in norms.items():
        for norm in found:
            assert norm.running_mean.abs().max() > 0.05 and (norm.running_var - 1).abs().max() > 0.05, name
            assert (norm.weight - 1).abs().max() > 0.05 and norm.bias.abs().max() > 0.05, name
    spec = MODELS["cnn_bn"]
    model, (x,) = spec.build(), spec.example_inputs()
    with torch.no_grad():
        convolved = model[0](x)
        assert (model[1](convolved) - convolved).abs().max() > 0.1


def test_transformer_layer_without_fast_path_matches_eager():
    # The layer as separate attention, LayerNorm and feed-forward ops; the case above
    # takes the fused fast path, which tori decomposes into the same ops.
    spec = MODELS["transformer_layer"]
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            assert_matches_eager(spec.build(), *spec.example_inputs(), calls=2, **TOLERANCE)
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)


def _train(model: torch.nn.Module, inputs: tuple, targets: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """SGD steps on `model`; returns the losses and leaves the last step's gradients."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(*inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("name", ["mlp", pytest.param("cnn_bn", marks=pytest.mark.slow)])
def test_training_steps_match_eager(name):
    spec = MODELS[name]
    eager = spec.build().train()
    model = copy.deepcopy(eager)
    inputs = spec.example_inputs()
    targets = torch.randint(0, 10, (inputs[0].shape[0],), generator=torch.Generator().manual_seed(7))
    compiled = torch.compile(model, backend="tori", options={"fallback": "error"})

    expected_losses = _train(eager, inputs, targets, steps=3)
    with count_graphs() as count:
        losses = _train(compiled, inputs, targets, steps=3)

    assert count.compiled_graphs >= 2, f"forward and backward should both compile: {count.delta}"
    assert count.fallback_graphs == 0 and count.fallback_calls == 0, f"a graph fell back to eager: {count.delta}"
    assert count.compiled_calls >= 6, f"every forward and backward should run compiled: {count.delta}"
    torch.testing.assert_close(losses, expected_losses, **TOLERANCE)
    assert_same_training_state(model, eager, **TOLERANCE)
