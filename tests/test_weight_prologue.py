"""Weight prologues (frontend/weight_prologue.py): the ops of an inference graph that read
only its resident weights run in PyTorch when the weights are loaded; the module reads
their results from globals of their own."""

import json

import pytest
import torch
from torch import nn

import tori
from tori.frontend.weight_prologue import Prologue
from tori.testing import assert_matches_eager, count_graphs, settle_batch_norm


def _conv_bn():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8))
    x = torch.randn(2, 3, 12, 12)
    return settle_batch_norm(model, x), x


def test_batch_norm_statistics_are_folded_in_the_prologue_not_in_the_module():
    model, x = _conv_bn()
    with torch.no_grad():
        assert_matches_eager(model, x, options={"cache": False}, calls=2, rtol=1e-5, atol=1e-5)
    graph = tori.last_compile().graphs[0]
    prologue = graph.compiled.signature.prologue
    ops = [step.op for step in prologue.steps]
    assert ops.count("aten.rsqrt.default") + ops.count("aten.sqrt.default") == 2, ops  # one per BatchNorm
    ir = graph.stages["tori"]
    assert "sqrt" not in ir  # the statistics never reach IREE
    assert ir.count('::"derived') == len(prologue.outputs) >= 2  # each handed value is a global of its own


def test_batch_norm_reaches_the_module_as_one_scale_and_one_shift_per_channel():
    # As eager's CPU kernel computes it: x * scale + shift, no subtraction of the mean.
    torch.manual_seed(0)
    x = torch.randn(2, 3, 12, 12)
    model = settle_batch_norm(nn.Sequential(nn.Conv2d(3, 16, 1), nn.BatchNorm2d(16), nn.ReLU(),
                                            nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8)), x)
    with torch.no_grad():
        assert_matches_eager(model, x, options={"cache": False}, rtol=1e-5, atol=1e-5)
    graph = tori.last_compile().graphs[0]
    ir = graph.stages["tori"]
    assert (ir.count("torch.aten.mul.Tensor"), ir.count("torch.aten.sub")) == (2, 0), ir
    assert len(graph.compiled.signature.prologue.outputs) == 4  # a scale and a shift per BatchNorm


def test_weights_changed_after_loading_run_the_prologue_again():
    model, x = _conv_bn()
    compiled = torch.compile(model, backend="tori", options={"fallback": "error", "cache": False})
    with torch.no_grad(), count_graphs() as count:
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        model[1].running_var.mul_(4.0)  # in place: the folded scale must follow
        model[4].bias.add_(1.0)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert count.compiled_calls == 2 and count.fallback_calls == 0 and count.iree_compiles == 1


class _SharedWeight(nn.Module):
    """One weight copied for every item of a batched matmul (as a grouped convolution's
    decomposition does per image)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64, 64))

    def forward(self, x):
        return torch.bmm(self.weight.expand(x.shape[0], 64, 64).contiguous(), x).relu()


def test_a_copied_weight_is_derived_up_to_a_size_and_computed_in_the_module_beyond_it():
    torch.manual_seed(0)
    model = _SharedWeight().eval()
    with torch.no_grad():
        assert_matches_eager(model, torch.randn(8, 64, 16), options={"cache": False}, rtol=1e-4, atol=1e-4)
        prologue = tori.last_compile().graphs[0].compiled.signature.prologue
        assert [step.op for step in prologue.steps] == ["aten.expand.default", "aten.clone.default"]
        assert prologue.steps[1].kwargs == (("memory_format", torch.contiguous_format),)
        assert Prologue.from_json(json.loads(json.dumps(prologue.to_json()))) == prologue
        torch._dynamo.reset()
        # 1100 copies of 16 KiB: 17.3 MB, beyond the derived values' limit (16 MiB here).
        assert_matches_eager(model, torch.randn(1100, 64, 2), options={"cache": False}, rtol=1e-4, atol=1e-4)
    graph = tori.last_compile().graphs[0]
    assert graph.compiled.signature.prologue is None
    assert "aten.expand" in graph.stages["tori"] or "broadcast" in graph.stages["tori"]


def test_a_graph_served_by_the_graph_cache_keeps_its_prologue(tmp_path):
    model, x = _conv_bn()
    options = {"fallback": "error", "cache_dir": str(tmp_path)}
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(torch.compile(model, backend="tori", options=options)(x), expected,
                                   rtol=1e-5, atol=1e-5)
        prologue = tori.last_compile().graphs[0].compiled.signature.prologue
        assert Prologue.from_json(json.loads(json.dumps(prologue.to_json()))) == prologue
        torch._dynamo.reset()
        with count_graphs() as count:
            served = torch.compile(model, backend="tori", options=options)(x)
    assert (count.graph_cache_hits, count.iree_compiles, count.compiled_calls) == (1, 0, 1)
    torch.testing.assert_close(served, expected, rtol=1e-5, atol=1e-5)
    assert tori.last_compile().graphs[0].compiled.signature.prologue == prologue


def test_an_entry_naming_an_unknown_op_or_dtype_is_refused_when_read():
    # The graph cache reads a refused entry as unreadable and compiles the graph again.
    step = {"op": "aten.no_such_op.default", "args": [], "kwargs": []}
    with pytest.raises(ValueError, match="unknown ATen op 'aten.no_such_op.default'"):
        Prologue.from_json({"steps": [step], "outputs": [0]})
    step = {"op": "aten._to_copy.default", "args": [{"ref": 0, "input": True}],
            "kwargs": [["dtype", {"torch": "float7"}]]}
    with pytest.raises(ValueError, match="unknown dtype, memory format or layout 'float7'"):
        Prologue.from_json({"steps": [step], "outputs": [0]})
