"""tori's fusion passes end to end: models compiled by torch.compile(backend="tori")
with each pass match eager, the pass really rewrote the graph, and IREE forms fewer
dispatches; and the dispatch counter itself on modules of known dispatches."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch_mlir import ir

import tori
from tori.frontend.importer import new_context
from tori.stages import Stage
from tori.targets.dispatches import count_dispatches
from tori.testing import assert_matches_eager

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from models import MODELS  # noqa: E402

BASE = "tori-fold-constants"


def _dispatches(stage_ir: str) -> int:
    return count_dispatches(ir.Module.parse(stage_ir, context=new_context())).count


def _compile(fn, *args, pipeline: str, **kwargs) -> str:
    """The tori-stage IR of `fn` compiled with `pipeline`, checked against eager; weights
    as arguments, so that the IR parses without IREE's dialects (util.global)."""
    with torch.no_grad():
        assert_matches_eager(fn, *args, options={"pipeline": pipeline, "resident_weights": False}, **kwargs)
    return tori.last_compile().stages[Stage.TORI]


def test_dispatch_count_of_one_matmul_with_its_epilogue():
    module = ir.Module.parse("""
        func.func @main(%a: !torch.vtensor<[16,32],f32>, %b: !torch.vtensor<[32,8],f32>) -> !torch.vtensor<[16,8],f32> {
          %0 = torch.aten.mm %a, %b : !torch.vtensor<[16,32],f32>, !torch.vtensor<[32,8],f32> -> !torch.vtensor<[16,8],f32>
          %1 = torch.aten.relu %0 : !torch.vtensor<[16,8],f32> -> !torch.vtensor<[16,8],f32>
          return %1 : !torch.vtensor<[16,8],f32>
        }
    """, context=new_context())
    dispatches = count_dispatches(module)
    assert dispatches.count == 1
    assert dict(dispatches.by_kind()) == {"matmul": 1}


def test_dispatch_count_of_sdpa_is_one_attention():
    t = "!torch.vtensor<[2,4,16,8],f32>"
    module = ir.Module.parse(f"""
        func.func @main(%q: {t}, %k: {t}, %v: {t}) -> {t} {{
          %none = torch.constant.none
          %f0 = torch.constant.float 0.0
          %false = torch.constant.bool false
          %0 = torch.aten.scaled_dot_product_attention %q, %k, %v, %none, %f0, %false, %none, %false : {t}, {t}, {t}, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> {t}
          return %0 : {t}
        }}
    """, context=new_context())
    dispatches = count_dispatches(module)
    assert dispatches.count == 1
    assert dict(dispatches.by_kind()) == {"attention": 1}


def test_hand_written_attention_block_fuses_to_sdpa_with_fewer_dispatches():
    spec = MODELS["hand_attention"]
    model, inputs = spec.build(), spec.example_inputs()
    without = _compile(model, *inputs, pipeline=BASE, rtol=1e-4, atol=1e-4)
    fused = _compile(model, *inputs, pipeline=f"{BASE}, tori-fuse-attention", rtol=1e-4, atol=1e-4)
    assert "scaled_dot_product_attention" not in without
    assert fused.count("torch.aten.scaled_dot_product_attention") == 1
    assert "torch.aten._softmax" not in fused
    assert _dispatches(fused) < _dispatches(without)


@pytest.mark.parametrize("name, sdpa", [("gpt2_decoder", 2), ("transformer_layer", 1)])
def test_sdpa_decomposed_by_aotautograd_fuses_back(name, sdpa):
    spec = MODELS[name]
    fused = _compile(spec.build(), *spec.example_inputs(), pipeline=f"{BASE}, tori-fuse-attention", rtol=1e-4, atol=1e-4)
    assert fused.count("torch.aten.scaled_dot_product_attention") == sdpa


def test_runtime_mask_that_removes_whole_rows_is_not_fused():
    # SDPA zeroes fully masked rows (safe softmax); IREE's attention kernel would not.
    def attend(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    mask = torch.ones(8, 8, dtype=torch.bool)
    mask[3] = False
    fused = _compile(attend, q, k, v, mask, pipeline=f"{BASE}, tori-fuse-attention")
    assert "scaled_dot_product_attention" not in fused


def test_hand_written_scaled_attention_with_additive_runtime_mask_matches_eager():
    def attend(q, k, v, bias):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25 + bias, dim=-1) @ v

    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    bias = torch.randn(8, 8)
    fused = _compile(attend, q, k, v, bias, pipeline=f"{BASE}, tori-fuse-attention", rtol=1e-5, atol=1e-5)
    assert "torch.aten.scaled_dot_product_attention" in fused


def test_layer_norm_fuses_with_fewer_dispatches():
    spec = MODELS["gpt2_decoder"]
    model, inputs = spec.build(), spec.example_inputs()
    without = _compile(model, *inputs, pipeline=BASE, rtol=1e-4, atol=1e-4)
    fused = _compile(model, *inputs, pipeline=f"{BASE}, tori-fuse-layer-norm", rtol=1e-4, atol=1e-4)
    assert fused.count("torch.aten.native_layer_norm") == 5
    # tori's float32 decomposition of layer_norm (two means, no float64 var_mean) already
    # forms the dispatches the fused op does: 44 in both (45 before the attention's row
    # sums came out of its second matmul, whose column of ones adds one per layer; 47 with
    # them until the token and position ids' bounds checks ran before the call,
    # frontend/input_checks.py).
    assert "var_mean" not in without and without.count("torch.aten.mean.dim") == 10
    assert _dispatches(fused) == _dispatches(without) == 44
