"""tori-fold-constants end to end: constants built in a model's forward fold into
literals at the `tori` stage, results match eager, and the benchmark models still do.
"""

import sys
from pathlib import Path

import pytest
import torch

import tori
from tori.config import DEFAULT_PIPELINE, Options
from tori.testing import assert_matches_eager, count_graphs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from models import MODELS  # noqa: E402

FOLD = {"pipeline": "tori-fold-constants"}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


@torch.compiler.assume_constant_result
def lookup_table() -> torch.Tensor:
    return torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10


def scaled_by_table(x):
    return x + lookup_table().softmax(0) * 2


def test_fold_constants_is_in_the_default_pipeline_and_it_can_be_emptied():
    assert Options().tori_pipeline == DEFAULT_PIPELINE == "tori-fold-empty-tensors, tori-fold-constants, tori-specialize-guards"
    assert Options.from_mapping({"pipeline": ""}, base=Options()).pipeline == ""


def test_an_assume_constant_result_tensor_matches_eager():
    assert_matches_eager(scaled_by_table, torch.randn(3, 4), options=FOLD)


def test_an_assume_constant_result_tensor_folds_into_a_literal():
    assert_matches_eager(scaled_by_table, torch.randn(3, 4), options=FOLD)
    stages = tori.last_compile().stages
    assert "torch.aten._softmax" in stages["torch"]
    assert "torch.aten._softmax" not in stages["tori"] and "torch.vtensor.literal" in stages["tori"]


class ConstantsInForward(torch.nn.Module):
    def forward(self, x):
        offsets = torch.arange(x.shape[-1], dtype=x.dtype)
        weights = torch.ones(x.shape[-1]) * 3
        return x * weights + offsets.softmax(0)


def test_constants_created_in_forward_fold():
    assert_matches_eager(ConstantsInForward(), torch.randn(2, 8), options=FOLD)
    stages = tori.last_compile().stages
    for op in ("torch.aten.arange", "torch.aten.empty_strided", "torch.aten.full_like", "torch.aten._softmax"):
        assert op in stages["torch"], op
        assert op not in stages["tori"], op
    # What is left computes with the input: one mul and one add on %arg0, two literals.
    assert stages["tori"].count("torch.vtensor.literal") == 2
    assert stages["tori"].count("torch.aten.") == 2


def test_an_empty_pipeline_leaves_the_constants():
    assert_matches_eager(ConstantsInForward(), torch.randn(2, 8), options={"pipeline": ""})
    stages = tori.last_compile().stages
    assert stages["tori"] == stages["torch"]


def test_random_ops_in_forward_are_not_folded():
    def noisy(x):
        return x + torch.rand(4) * 0  # rand must stay: folding would fix its values

    assert_matches_eager(noisy, torch.randn(4), options=FOLD)
    # rand is computed from the per-call seed, the last argument: still read after folding
    tori_stage = tori.last_compile().stages["tori"]
    assert "%arg1: !torch.vtensor<[],si64>" in tori_stage and tori_stage.count("%arg1") >= 2


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[pytest.mark.slow] if n in ("resnet_blocks", "gpt2_decoder") else []) for n in MODELS])
def test_benchmark_models_match_eager_with_folding(name):
    spec = MODELS[name]
    with torch.no_grad():
        assert_matches_eager(spec.build(), *spec.example_inputs(), options=FOLD, **TOLERANCE)
    assert "func.func @main" in tori.last_compile().stages["tori"]


def test_an_assume_constant_result_tensor_folds_in_training_too():
    linear = torch.nn.Linear(4, 4)
    reference = torch.nn.Linear(4, 4)
    reference.load_state_dict(linear.state_dict())
    x = torch.randn(3, 4)
    compiled = tori.compiler.compile(lambda t: linear(t) + scaled_by_table(t), options={"fallback": "error", **FOLD})
    with count_graphs() as count:
        compiled(x).sum().backward()
    (reference(x) + scaled_by_table(x)).sum().backward()
    torch.testing.assert_close(linear.weight.grad, reference.weight.grad)
    assert count.compiled_graphs == 2 and count.fallback_graphs == 0
    forward = tori.last_compile().forward.stages["tori"]
    assert "torch.aten._softmax" not in forward and "torch.vtensor.literal" in forward
