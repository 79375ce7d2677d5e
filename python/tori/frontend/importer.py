"""The `torch` stage: a functional ATen FX graph imported into Torch-MLIR's
`torch` dialect by FxImporter.
"""

from __future__ import annotations

import io
import operator
import re
from copy import deepcopy
from dataclasses import replace

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d
from torch_mlir.extras.fx_importer import ContextCache, FxImporter, FxImporterHooks

from tori.dialects import tori as tori_dialect
from tori.errors import CompileError, UnsupportedOpError
from tori.frontend import dialect_modules
from tori.frontend.constant_origins import wrap_literal
from tori.frontend.guard_facts import graph_facts, insert_facts
from tori.frontend.higher_order import NodeImporter
from tori.frontend.import_copies import import_copy
from tori.frontend.seeded_random import seed_random_ops
from tori.frontend.signature import ArgKind, GraphSignature, split_outputs
from tori.stages import Stage

FUNC_NAME = "main"


def new_context() -> ir.Context:
    dialect_modules.install()
    context = ir.Context()
    torch_d.register_dialect(context)
    tori_dialect.load(context)
    return context


class _NodeImporter(NodeImporter):
    """tori's node importer: the literal of an `assume_constant_result` value is
    wrapped in its `tori.assumed_constant` origin op as it is imported."""

    __slots__ = ()

    def bind_node_value(self, node, value, result_index: int = 0):
        if node.op == "get_attr":
            value = wrap_literal(node, value)
        super().bind_node_value(node, value, result_index)


def _computed_graph(gm: torch.fx.GraphModule, computed: list[torch.fx.Node]) -> torch.fx.GraphModule:
    """A copy of `gm` whose output is only the values IREE computes.

    The copy is owned by a GraphModule over `gm`'s attributes: FxImporter reads
    get_attr constants from the owning module, and its `as_strided` rewrite
    registers the index tensors it generates there.
    """
    copy = torch.fx.Graph()
    value_map: dict[torch.fx.Node, torch.fx.Node] = {}
    copy.graph_copy(gm.graph, value_map, return_output_node=False)
    copy.output(tuple(value_map[n] for n in computed))
    return import_copy(gm, copy)


def _copy_subgraphs(owner: torch.fx.GraphModule, copies: dict[int, torch.fx.GraphModule]) -> None:
    """Point `owner` at prepared copies of the subgraphs that its higher-order ops
    call (invoke_subgraph), recursively: FxImporter rewrites the graphs it imports,
    and AOTAutograd's subgraphs also serve the eager fallback. `copies` holds one copy
    per subgraph module, however many attributes name it, so each is imported once."""
    targets = {node.target for node in owner.graph.find_nodes(op="get_attr")}
    for target in targets:
        subgraph = getattr(owner, target)
        if not isinstance(subgraph, torch.fx.GraphModule):
            continue
        if id(subgraph) not in copies:
            copy = import_copy(subgraph, deepcopy(subgraph.graph))
            _expand_sym_sums(copy.graph)
            _drop_size_one_restrides(copy.graph)
            _copy_subgraphs(copy, copies)
            copies[id(subgraph)] = copy
        setattr(owner, target, copies[id(subgraph)])


def _expand_sym_sums(graph: torch.fx.Graph) -> None:
    """Rewrite `torch.sym_sum(terms)` (how symbolic shapes add up several sizes) as
    a chain of `operator.add`, the form FxImporter imports for SymInts."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.sym_sum:
            continue
        total, *terms = node.args[0]
        with graph.inserting_before(node):
            for term in terms:
                partial = graph.call_function(operator.add, (total, term))
                partial.meta["val"] = _meta_value(total) + _meta_value(term)
                total = partial
        node.replace_all_uses_with(total)
        graph.erase_node(node)


def _single_use_constants(graph: torch.fx.Graph) -> None:
    """Route the uses of a tensor constant (get_attr) read more than once through one
    `aten.alias` of it. FxImporter imports a get_attr's literal at each use it meets
    but looks for an earlier one under another key (`(node.target, 0)` against the
    `(node, 0)` it binds): a second use fails with "Node already has a value"."""
    for node in list(graph.find_nodes(op="get_attr")):
        tensor = getattr(graph.owning_module, node.target, None)
        if not isinstance(tensor, torch.Tensor) or sum(_occurrences(user, node) for user in node.users) < 2:
            continue
        with graph.inserting_after(node):
            alias = graph.call_function(torch.ops.aten.alias.default, (node,))
        alias.meta = {**node.meta, "val": node.meta.get("val", tensor)}
        node.replace_all_uses_with(alias, delete_user_cb=lambda user: user is not alias)


def _occurrences(user: torch.fx.Node, node: torch.fx.Node) -> int:
    found = []
    torch.fx.node.map_arg((user.args, user.kwargs), lambda n: found.append(n) or n)
    return sum(1 for n in found if n is node)


def _drop_size_one_restrides(graph: torch.fx.Graph) -> None:
    """Replace by its input an `as_strided` that keeps the input's sizes, offset and
    strides except those of size-1 dims, which address no other element: the same
    values. ATen's 1x1 adaptive average pool restrides its mean that way (to
    channels-last), and FxImporter refuses `as_strided` with symbolic sizes."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.as_strided.default:
            continue
        source, size, stride, *offset = node.args
        value = _meta_value(source)
        sizes = [_meta_value(s) for s in size]
        if not isinstance(value, torch.Tensor) or len(sizes) != value.dim() or not all(
            statically_known_true(s == own) for s, own in zip(sizes, value.shape)
        ):
            continue
        if not all(
            statically_known_true(s == 1) or statically_known_true(_meta_value(step) == own)
            for s, step, own in zip(sizes, stride, value.stride())
        ):
            continue
        if offset and offset[0] is not None and not statically_known_true(
            _meta_value(offset[0]) == value.storage_offset()
        ):
            continue
        node.replace_all_uses_with(source)
        graph.erase_node(node)


_aten = torch.ops.aten
# Ops whose number operands (and `alpha`) Torch-MLIR's folders read.
_ARITHMETIC = frozenset({
    _aten.add.Tensor, _aten.add.Scalar, _aten.sub.Tensor, _aten.sub.Scalar, _aten.rsub.Tensor,
    _aten.rsub.Scalar, _aten.mul.Tensor, _aten.mul.Scalar, _aten.div.Tensor, _aten.div.Scalar,
    _aten.clamp.default, _aten.clamp_min.default, _aten.clamp_max.default, _aten.lt.Scalar, _aten.le.Scalar,
    _aten.gt.Scalar, _aten.ge.Scalar, _aten.eq.Scalar, _aten.ne.Scalar, _aten.full_like.default,
    _aten.full.default, _aten.fill.Scalar,
})


def _float_numbers(graph: torch.fx.Graph) -> None:
    """Write the Python int operands of floating-point arithmetic as floats (the same
    value and type promotion). Torch-MLIR's folders, which IREE runs on constant
    operands, read a negative `torch.constant.int` as unsigned:
    `torch.full((2,), 3.0) * -2` compiled to 5.5e19, and a clamp to [-2, -1] gave -2
    (its comparisons with -2 and -1 folded wrongly)."""
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _ARITHMETIC:
            continue
        values = (node.meta.get("val"), _meta_value(node.args[0]) if node.args else None)
        if not any(isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in values):
            continue
        node.args = tuple(float(a) if type(a) is int else a for a in node.args)
        node.kwargs = {k: float(v) if type(v) is int else v for k, v in node.kwargs.items()}


def _meta_value(arg):
    return arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg


_OP_IN_MESSAGE = re.compile(r"((?:aten|prims|torch\.ops|higher_order)[\w.:]*)")


def _failing_op(graph: torch.fx.Graph, error: Exception) -> str | None:
    match = _OP_IN_MESSAGE.search(str(error))
    if match:
        return match.group(1)
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            return f"higher-order op {node.target.name()}"
    return None


class _ContextCache(ContextCache):
    """Locations that name the ATen op of each node around its source line, or where
    the graph has no stack traces (AOTAutograd drops Dynamo's) the module it came from:
    `loc("aten.convolution.default"("model.py":12:0))`,
    `loc("aten.convolution.default"("module layer1.0.conv1 (Conv2d)"))`. IREE's
    dispatches keep the locations of the ops fused into them, so they tell which torch
    ops they compute (tori.tools.profile)."""

    __slots__ = ()

    def get_node_location(self, node: torch.fx.Node) -> ir.Location | None:
        location = super().get_node_location(node)
        if node.op != "call_function":
            return location
        if location is None or str(location) == "loc(unknown)":
            module = module_path(node)
            if module is None:
                return location
            location = ir.Location.name(f"module {module}", context=self._c)
        return ir.Location.name(op_name(node.target), childLoc=location, context=self._c)


_DYNAMO_ROOT = re.compile(r"^L\[['\"]\w+['\"]\]\.?")
_MODULES_ITEM = re.compile(r"\._modules\[['\"]([^'\"]+)['\"]\]|\[(\d+)\]")


def module_path(node: torch.fx.Node) -> str | None:
    """The innermost nn.Module a node was traced in, as `layer1.0.conv1 (Conv2d)`."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    path = _MODULES_ITEM.sub(lambda m: f".{m.group(1) or m.group(2)}", _DYNAMO_ROOT.sub("", str(path)))
    name = getattr(cls, "__name__", str(cls))
    return f"{path.strip('.') or 'model'} ({name})"


def op_name(target) -> str:
    """An FX node target as profiles and reports name it: `aten.convolution.default`."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def new_importer(hooks: FxImporterHooks | None = None) -> FxImporter:
    """An FxImporter with tori's node importer in a fresh context. `hooks` may build ops
    of IREE's dialects (util.global for parameters), which torch-mlir does not register:
    the context then allows unregistered dialects."""
    context = new_context()
    if hooks is not None:
        context.allow_unregistered_dialects = True
    importer = FxImporter(context=context, hooks=hooks, graph_node_importer_cls=_NodeImporter)
    # FxImporter takes no ContextCache argument; its own is replaced before any import.
    importer._cc = _ContextCache(context, py_attr_tracker=importer._py_attr_tracker)
    return importer


def import_graph(gm: torch.fx.GraphModule, *, graph_name: str, importer: FxImporter | None = None,
                 func_name: str = FUNC_NAME) -> tuple[ir.Module, GraphSignature]:
    """Import a functional ATen graph as `func.func @main` in a fresh MLIR context, or as
    `func_name` into `importer`'s module (several functions in one module). A graph with
    random ops gets one more argument, last: the seed (ArgKind.SEED)."""
    signature, computed = split_outputs(gm.graph)
    owner = _computed_graph(gm, computed)
    _copy_subgraphs(owner, {})
    if seed_random_ops(owner, graph_name):
        signature = replace(signature, args=(*signature.args, ArgKind.SEED))
    graph = owner.graph
    _single_use_constants(graph)
    _expand_sym_sums(graph)
    _drop_size_one_restrides(graph)
    _float_numbers(graph)
    importer = importer or new_importer()
    try:
        importer.import_stateless_graph(graph, func_name=func_name)
    except NotImplementedError as error:
        raise UnsupportedOpError(
            f"Torch-MLIR's FxImporter cannot import it: {error}",
            stage=Stage.TORCH.value, graph=graph_name, op=_failing_op(graph, error),
        ) from error
    except Exception as error:
        raise CompileError(
            f"Torch-MLIR's FxImporter failed: {type(error).__name__}: {error}",
            stage=Stage.TORCH.value, graph=graph_name, op=_failing_op(graph, error),
        ) from error
    module = importer.module
    insert_facts(module, graph_facts(graph), func_name)
    if not module.operation.verify():
        raise CompileError("the imported torch-dialect module does not verify", stage=Stage.TORCH.value, graph=graph_name)
    return module, signature


def to_bytecode(module: ir.Module) -> bytes:
    buffer = io.BytesIO()
    module.operation.write_bytecode(buffer)
    return buffer.getvalue()
