"""Resident weights (frontend/resident.py): inference parameters and buffers held by
the module as IREE globals, loaded once; the module reloads when one of them changes."""

import torch
from torch import nn

import tori
from tori.frontend.signature import ArgKind
from tori.testing import assert_matches_eager, count_graphs


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).eval()


def test_parameters_become_module_globals_and_are_not_passed():
    model, x = _mlp(), torch.randn(4, 64)
    with torch.no_grad():
        assert_matches_eager(model, x, options={"cache": False}, calls=3)
    graph = tori.last_compile().graphs[0]
    kinds = graph.compiled.signature.args
    assert kinds.count(ArgKind.RESIDENT) == 4 and kinds.count(ArgKind.TENSOR) == 1
    ir = graph.stages["tori"]
    assert ir.count("#stream.parameter.named") == 4
    assert "func.func @main(%arg0: !torch.vtensor<[4,64],f32>)" in ir  # the input alone


def test_updated_weights_are_seen_in_place_and_replaced():
    model, x = _mlp(), torch.randn(4, 64)
    compiled = torch.compile(model, backend="tori", options={"fallback": "error"})
    with torch.no_grad(), count_graphs() as count:
        torch.testing.assert_close(compiled(x), model(x))
        model[0].weight.mul_(2.0)  # in place: its version changes
        torch.testing.assert_close(compiled(x), model(x))
        model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})
        torch.testing.assert_close(compiled(x), model(x))
        model[2].bias = nn.Parameter(torch.randn(8))  # a new tensor
        torch.testing.assert_close(compiled(x), model(x))
    assert count.compiled_calls == 4 and count.fallback_calls == 0


def test_off_switch_and_training_pass_weights_as_arguments():
    model, x = _mlp(), torch.randn(4, 64)
    with torch.no_grad():
        assert_matches_eager(model, x, options={"resident_weights": False, "cache": False})
    assert ArgKind.RESIDENT not in tori.last_compile().graphs[0].compiled.signature.args
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tori", options={"fallback": "error"})
    compiled(x).sum().backward()  # training: the optimizer changes weights between calls
    assert all(ArgKind.RESIDENT not in g.compiled.signature.args for g in tori.last_compile().graphs)


def test_buffers_that_the_graph_writes_stay_arguments():
    bn = nn.BatchNorm1d(8).train()
    x = torch.randn(16, 8)
    with torch.no_grad():
        assert_matches_eager(bn, x, options={"cache": False})
    kinds = tori.last_compile().graphs[0].compiled.signature.args
    # x, then the written num_batches_tracked, running mean and variance, then weight and bias
    assert ArgKind.RESIDENT not in kinds[:4]
    assert kinds[4:6] == (ArgKind.RESIDENT, ArgKind.RESIDENT)


class _Tied(nn.Module):
    """An embedding whose weight is also the output projection (GPT-2's tied LM head),
    and a scale the graph multiplies by itself."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.scale = nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, ids):
        hidden = self.embed(ids) * (self.scale * self.scale)
        return hidden @ self.embed.weight.t()


def test_a_weight_used_twice_is_resident_and_one_used_twice_by_one_op_is_passed():
    torch.manual_seed(0)
    model, ids = _Tied().eval(), torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        assert_matches_eager(model, ids, options={"cache": False}, rtol=1e-5, atol=1e-5)
    kinds = tori.last_compile().graphs[0].compiled.signature.args
    assert kinds.count(ArgKind.RESIDENT) == 1  # the tied weight; the squared scale stays an argument
    assert tori.last_compile().graphs[0].stages["tori"].count("#stream.parameter.named") == 1


def test_dispatches_count_alike_from_the_recorded_compile_and_from_the_stage_text():
    # A graph served from the compile cache has no recorded input: its `tori` stage, with
    # the resident weights' util.global ops, is compiled to count its dispatches instead.
    from tori.targets.dispatches import graph_dispatch_count

    model, x = _mlp(), torch.randn(4, 64)
    with torch.no_grad():
        assert_matches_eager(model, x, options={"cache": False})
    record = tori.last_compile()
    graph = record.graphs[0]
    recorded = graph_dispatch_count(graph, record.options)
    graph.iree_bytecode = None
    assert graph_dispatch_count(graph, record.options) == recorded >= 1
