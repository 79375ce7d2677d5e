"""Partial fallback: a graph with ops tori cannot compile runs split around them, its
other regions compiled by IREE, those ops in eager PyTorch (frontend/partition.py).

The unsupported ops are real ops, not mocks: custom ops defined with torch.library,
whose CPU implementations Torch-MLIR imports as `torch.operator` and IREE cannot
lower (they count their calls, which proves that they ran in eager PyTorch; being
tori's own, no decomposition will ever make them compile), and ATen's general
eigenvalues (linalg_eig), which tori refuses.
"""

import json
import logging

import pytest
import torch

import tori
from tori.config import Options, from_environment
from tori.errors import CompileError, OptionsError
from tori.frontend.partition import nodes_of_op, split_graph
from tori.testing import count_graphs
from tori.tools.report import render

_eager_calls = []


@torch.library.custom_op("tori_test::soft_clip", mutates_args=())
def soft_clip(x: torch.Tensor) -> torch.Tensor:
    _eager_calls.append(("soft_clip", tuple(x.shape)))
    return torch.tanh(x) * 2


@soft_clip.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("tori_test::soft_clip_slope", mutates_args=())
def soft_clip_slope(x: torch.Tensor) -> torch.Tensor:
    _eager_calls.append(("soft_clip_slope", tuple(x.shape)))
    return 2 * (1 - torch.tanh(x) ** 2)


@soft_clip_slope.register_fake
def _(x):
    return torch.empty_like(x)


def _soft_clip_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * soft_clip_slope(x)


soft_clip.register_autograd(_soft_clip_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))


@torch.library.custom_op("tori_test::running_max", mutates_args=())
def running_max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two results, as cummax has: the running maximum along dim 1 and where it is."""
    _eager_calls.append(("running_max", tuple(x.shape)))
    values, indices = torch.cummax(x, dim=1)
    return values, indices


@running_max.register_fake
def _(x):
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.long)


class Sandwich(torch.nn.Module):
    """linear -> an op tori cannot compile -> linear -> relu."""

    def __init__(self, middle, features=8):
        super().__init__()
        self.first = torch.nn.Linear(features, 16)
        self.second = torch.nn.Linear(16, 4)
        self.middle = middle

    def forward(self, x):
        return torch.relu(self.second(self.middle(self.first(x))))


def test_custom_op_between_linears_runs_in_two_compiled_parts(caplog):
    model = Sandwich(soft_clip)
    x = torch.randn(3, 8)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tori"):
        expected = model(x)
        compiled = torch.compile(model, backend="tori")
        _eager_calls.clear()
        with count_graphs() as count:
            for _ in range(3):
                torch.testing.assert_close(compiled(x), expected)
    # The one warning says how the graph runs and where the repro of its failure is.
    (warning,) = [r.getMessage() for r in caplog.records if "runs partitioned" in r.getMessage()]
    assert "; repro: " in warning and tori.last_compile().graph("inference").error.command in warning
    assert count.partitioned_graphs == 1 and count.compiled_parts == 2 and count.eager_ops == 1, count.delta
    assert count.compiled_graphs == 0 and count.fallback_graphs == 0 and count.fallback_calls == 0, count.delta
    # Every call ran both parts in IREE and the custom op in eager PyTorch.
    assert count.partitioned_calls == 3 and count.compiled_calls == 6, count.delta
    assert _eager_calls == [("soft_clip", (3, 16))] * 3
    graph = tori.last_compile().graph("inference")
    assert graph.partitioned and graph.fell_back
    assert [part.name for part in graph.parts] == [f"{graph.name}_part0", f"{graph.name}_part1"]
    assert all(part.compiled is not None for part in graph.parts)
    assert graph.eager_ops == ("tori_test.soft_clip.default",)
    assert graph.error.op == "torch.tori_test.soft_clip"
    # The compile summary and the report say how the graph runs.
    assert graph.status == "partitioned: 2 compiled part(s), 1 op(s) in eager PyTorch (tori_test.soft_clip.default)"
    page = render([tori.last_compile()])
    assert "1 partitioned, 0 fell back" in page and graph.status in page
    assert all(f'id="{part.name}"' in page for part in graph.parts)


def test_training_through_partitioned_graphs_matches_eager():
    # soft_clip's derivative is another custom op, soft_clip_slope: forward and
    # backward both run split. BatchNorm's running statistics are updated in place.
    def make():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), Lambda(soft_clip),
                                   torch.nn.Linear(16, 4))

    model, reference = make(), make()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(6, 8)
    compiled = torch.compile(model, backend="tori")
    _eager_calls.clear()
    with count_graphs() as count:
        for _ in range(2):
            compiled(x).square().sum().backward()
            reference(x).square().sum().backward()
    for (name, actual), expected in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(actual.grad, expected.grad, msg=name)
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)
    torch.testing.assert_close(model[1].running_var, reference[1].running_var)
    # The forward runs in two parts; the backward computes the slope from the saved
    # input first, then the rest in one part.
    assert count.partitioned_graphs == 2 and count.compiled_parts == 3 and count.fallback_graphs == 0, count.delta
    assert count.partitioned_calls == 4 and count.compiled_calls == 6, count.delta
    record = tori.last_compile()
    assert record.forward.eager_ops == ("tori_test.soft_clip.default",)
    assert record.backward.eager_ops == ("tori_test.soft_clip_slope.default",)
    # Two backward passes each of the compiled model and of the reference, all eager.
    assert [name for name, _ in _eager_calls].count("soft_clip_slope") == 4


def test_each_failing_op_found_in_turn(tmp_path):
    # Two unsupported ops: the first round splits around the one iree-compile names
    # first, a part then fails on the other, and the second round splits around both.
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), Lambda(soft_clip), torch.nn.Linear(16, 16),
                                Lambda(lambda t: running_max(t)[0]), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    with torch.no_grad(), count_graphs() as count:
        compiled = torch.compile(model, backend="tori", options={"dump_dir": str(tmp_path)})
        torch.testing.assert_close(compiled(x), model(x))
    assert count.partitioned_graphs == 1 and count.compiled_parts == 3 and count.fallback_graphs == 0, count.delta
    graph = tori.last_compile().forward
    assert graph.eager_ops == ("tori_test.soft_clip.default", "tori_test.running_max.default")
    # The graph's dump names its parts, each dumped as a graph of its own.
    index = json.loads((tmp_path / graph.name / "index.json").read_text())
    assert index["parts"] == [part.name for part in graph.parts] and index["status"] == graph.status
    assert all(json.loads((tmp_path / part / "index.json").read_text())["compiled"] for part in index["parts"])


def test_a_refused_op_on_complex_values_stays_eager_and_parts_keep_their_constants():
    # General eigenvalues are refused by tori: linalg_eig runs eagerly, and the parts on
    # either side take and give complex values (as real pairs). The constant of
    # assume_constant_result is read inside the part that uses it, as a literal, not
    # passed in.
    linear = torch.nn.Linear(8, 8)

    def spectrum(x):
        matrices = (linear(x) + _table()).reshape(3, 2, 2, 2)
        return linear((torch.linalg.eigvals(matrices) * (1 - 2j)).abs().reshape(3, 4).repeat(1, 2))

    x = torch.randn(3, 8)
    with torch.no_grad(), count_graphs() as count:
        torch.testing.assert_close(torch.compile(spectrum, backend="tori")(x), spectrum(x))
    assert count.partitioned_graphs == 1 and count.compiled_parts == 2 and count.fallback_graphs == 0, count.delta
    graph = tori.last_compile().forward
    assert graph.eager_ops == ("aten.linalg_eig.default",)
    assert "tori.assumed_constant" in graph.parts[0].stages["torch"]


@torch.compiler.assume_constant_result
def _table():
    return torch.arange(8.0)


def test_higher_order_ops_go_into_parts_with_their_subgraphs():
    # Both uses of a nested_compile_region (invoke_subgraph) are compiled, one in each
    # part, each part holding the region's subgraph; the op between them runs eagerly.
    linear = torch.nn.Linear(8, 8)

    @torch.compiler.nested_compile_region
    def block(x):
        return torch.relu(linear(x))

    def twice(x):
        return block(soft_clip(block(x)))

    x = torch.randn(3, 8)
    with torch.no_grad(), count_graphs() as count:
        torch.testing.assert_close(torch.compile(twice, backend="tori")(x), twice(x))
    assert count.partitioned_graphs == 1 and count.compiled_parts == 2 and count.fallback_graphs == 0, count.delta
    graph = tori.last_compile().forward
    assert graph.eager_ops == ("tori_test.soft_clip.default",)
    assert all("func.func private" in part.stages["torch"] for part in graph.parts)  # the region, called


def test_multi_output_op_with_dynamic_shapes():
    # running_max returns (values, indices): its getitems stay eager with it; the parts take
    # the batch size as a symbolic size and serve every batch without recompiling.
    model = Sandwich(Lambda(lambda t: running_max(t)[0]))
    compiled = torch.compile(model, backend="tori", dynamic=True)
    with torch.no_grad(), count_graphs() as count:
        for batch in (3, 5, 7):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x), model(x))
    assert count.partitioned_graphs == 1 and count.compiled_parts == 2, count.delta
    assert count.partitioned_calls == 3 and count.compiled_calls == 6, count.delta
    assert tori.last_compile().forward.eager_ops == ("tori_test.running_max.default",)


def test_a_part_refused_by_iree_runtime_runs_that_call_eagerly():
    # With guards skipped, a float64 input reaches parts compiled for float32: IREE's
    # runtime refuses it, each part serves that call eagerly, and float32 calls still
    # run compiled.
    scale = torch.full((8,), 0.5)

    def clipped(x):
        return soft_clip(x * scale) + x

    compiled = torch.compile(clipped, backend="tori", options={"guard_filter_fn": tori.compiler.skip_all_guards_unsafe})
    x = torch.randn(3, 8)
    torch.testing.assert_close(compiled(x), clipped(x))
    wide = x.double()
    with count_graphs() as count:
        torch.testing.assert_close(compiled(wide), soft_clip(wide * scale) + wide)
        torch.testing.assert_close(compiled(x), clipped(x))
    # compiled_calls counts IREE's refused calls too, as for whole graphs.
    assert count.fallback_calls == 2 and count.compiled_calls == 4 and count.partitioned_calls == 2, count.delta


def test_fallback_error_still_raises():
    model = Sandwich(soft_clip)
    with torch.no_grad(), count_graphs() as count, pytest.raises(CompileError, match="soft_clip"):
        torch.compile(model, backend="tori", options={"fallback": "error"})(torch.randn(3, 8))
    assert count.partitioned_graphs == 0 and count.compiled_parts == 0, count.delta


def test_partition_off_runs_the_whole_graph_eagerly():
    model = Sandwich(soft_clip)
    x = torch.randn(3, 8)
    with torch.no_grad(), count_graphs() as count:
        torch.testing.assert_close(torch.compile(model, backend="tori", options={"partition": False})(x), model(x))
    assert count.fallback_graphs == 1 and count.partitioned_graphs == 0 and count.compiled_parts == 0, count.delta


def test_partition_option_reads_its_environment_variable():
    assert from_environment({"TORI_PARTITION": "0"}).partition is False
    assert from_environment({}).partition is True
    with pytest.raises(OptionsError):
        Options.from_mapping({"partition": "sometimes"})


@pytest.mark.parametrize("copy_last", [True, False])
def test_a_part_never_moves_across_a_mutation(copy_last):
    # copy_ into an input stays eager. Where a part would hold nodes from both sides
    # of it (sin before, cos of the written buffer after), the graph is not split.
    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x, buffer = graph.placeholder("x"), graph.placeholder("buffer")
    sine = graph.call_function(aten.sin.default, (x,))
    if not copy_last:
        graph.call_function(aten.copy_.default, (buffer, sine))
    eager = graph.call_function(aten.special_i1e.default, (x,))
    product = graph.call_function(aten.mul.Tensor, (graph.call_function(aten.cos.default, (buffer,)), eager))
    if copy_last:
        graph.call_function(aten.copy_.default, (buffer, sine))
    graph.output((product,))
    split = split_graph(torch.fx.GraphModule({}, graph), {eager.name})
    if not copy_last:
        assert split is None
        return
    order = [node.target for node in split.graph.nodes if node.op in ("call_function", "call_module")]
    assert order[0] is aten.special_i1e.default and order[1] == "part0" and order[-1] is aten.copy_.default


def test_unattributable_failure_falls_back_whole():
    # A failure naming no op of the graph cannot be split around.
    graph = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    assert nodes_of_op(graph, None) == []
    assert nodes_of_op(graph, "torch.prim.ListConstruct") == []


@pytest.mark.parametrize("op, expected", [
    ("torch.aten.median.dim", ["median_dim"]),  # iree-compile's name of the op
    ("aten.median.dim", ["median_dim"]),  # the importer's
    ("aten median.dim", ["median_dim"]),
    ("torch.ops.aten.median.dim", ["median_dim"]),
    ("torch.aten.median", ["median_default"]),  # Torch-MLIR leaves out ".default"
    ("torch.aten.median.out", ["median_dim", "median_default"]),  # no node of it: every overload
    ("torch.aten.mode", []),
])
def test_op_names_from_errors_map_to_nodes(op, expected):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    by_dim = graph.call_function(torch.ops.aten.median.dim, (x, 0))
    by_dim.name = "median_dim"
    whole = graph.call_function(torch.ops.aten.median.default, (x,))
    whole.name = "median_default"
    graph.output((by_dim, whole))
    assert [node.name for node in nodes_of_op(torch.fx.GraphModule({}, graph), op)] == expected


class Lambda(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)

