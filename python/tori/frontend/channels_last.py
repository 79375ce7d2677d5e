"""Channels-last activations between the convolutions that tori's quantized rewrite
makes (frontend/quantized.py). Each of them computes on channels-last rows and gives
its NCHW result as `permute(nhwc, [0, 3, 1, 2])`; the next one reads its input as
`permute(nchw, [0, 2, 3, 1])`. Between them lie elementwise ops (bias, activation,
requantization, a residual add, a squeeze-excitation gate). IREE propagated such
transposes for float32 convolutions but not through these chains: an int8
EfficientNet-B0 wrote every activation back to NCHW and read it again transposed (16
epilogue dispatches with a transpose, 1.3 ms of its 6.6 ms of dispatches, and the
transposes before its depthwise convolutions; docs/quantization.md).

`sink_channel_permutes` moves each NHWC -> NCHW permute below the elementwise ops
(and spatial means) that read it, their broadcast operands ([N, C, 1, 1] and
one-element tensors) permuted to match, and removes a permute back to NHWC that meets
it; a whole tensor's range (a dynamic activation's) reads the NHWC values. A value
some other op reads in NCHW keeps one permute, shared by those readers.
"""

from __future__ import annotations

import torch
import torch.fx

from tori.frontend.splice import add_node, value_of

aten = torch.ops.aten

TO_NCHW = [0, 3, 1, 2]
TO_NHWC = [0, 2, 3, 1]

_ELEMENTWISE = {
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.sigmoid.default, aten.relu.default,
    aten.silu.default, aten.hardswish.default, aten.hardsigmoid.default, aten.hardtanh.default, aten.clamp.default,
    aten.clamp_min.default, aten.clamp_max.default, aten.round.default, aten.neg.default, aten.exp.default,
    aten.tanh.default, aten.gelu.default, aten.minimum.default, aten.maximum.default, aten.where.self,
    aten.alias.default, aten.clone.default, aten._to_copy.default,
}
# quantized_decomposed's per-tensor ops, elementwise with number parameters
_QUANTIZE_OPS = (("quantize_per_tensor", "default"), ("dequantize_per_tensor", "default"))
# keyword arguments that keep an op elementwise and layout-free
_LAYOUT_FREE_KWARGS = {"dtype", "alpha", "approximate", "min", "max", "rounding_mode"}


def _is_permute(node, dims: list[int]) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is aten.permute.default
            and list(node.args[1]) == dims)


def _elementwise(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or set(node.kwargs) - _LAYOUT_FREE_KWARGS:
        return False
    if node.target in _ELEMENTWISE:
        return True
    namespace, name = getattr(node.target, "namespace", None), getattr(node.target, "_overloadname", None)
    return namespace == "quantized_decomposed" and (node.target._opname, name) in _QUANTIZE_OPS


def _rank4(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 4


def _nhwc_operand(graph: torch.fx.Graph, arg, node: torch.fx.Node):
    """`arg` of an elementwise op whose NCHW operands become NHWC: the NHWC value of a
    permuted one, a broadcast one ([N, C, 1, 1]) permuted, numbers and one-element
    tensors as they are; None where the op cannot move (a full NCHW operand)."""
    if not isinstance(arg, torch.fx.Node):
        return arg
    if _is_permute(arg, TO_NCHW):
        return arg.args[0]
    value = value_of(arg)
    if not isinstance(value, torch.Tensor):
        return None
    if value.dim() == 0 or (value.dim() == 1 and value.shape[0] == 1):
        return arg
    if value.dim() == 4 and value.shape[2] == 1 and value.shape[3] == 1:
        with graph.inserting_before(node):
            return add_node(graph, aten.permute.default, (arg, TO_NHWC), {}, node)
    return None


def _sink_through(graph: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node | None:
    """`node` (elementwise, or a mean over H and W) computed on NHWC operands, with its
    NCHW value as a permute of that; None where it cannot be."""
    if node.op != "call_function" or not _rank4(value_of(node)):
        return None
    if node.target is aten.mean.dim:
        source, dims, *rest = node.args
        keepdim = rest[0] if rest else node.kwargs.get("keepdim", False)
        if not _is_permute(source, TO_NCHW) or sorted(d % 4 for d in dims) != [2, 3] or not keepdim \
                or set(node.kwargs) - {"keepdim", "dtype"}:
            return None
        args, kwargs = (source.args[0], [1, 2], True), {k: v for k, v in node.kwargs.items() if k == "dtype"}
    elif _elementwise(node):
        if not any(_is_permute(a, TO_NCHW) for a in node.args):
            return None
        if tuple(value_of(node).shape) != tuple(value_of(next(a for a in node.args if _is_permute(a, TO_NCHW))).shape):
            return None  # the permuted operand is the one broadcast
        args = tuple(_nhwc_operand(graph, a, node) for a in node.args)
        if any(a is None for a in args):
            return None
        kwargs = dict(node.kwargs)
    else:
        return None
    with graph.inserting_before(node):
        nhwc = add_node(graph, node.target, args, kwargs, node)
        return add_node(graph, aten.permute.default, (nhwc, TO_NCHW), {}, node)


def sink_channel_permutes(gm: torch.fx.GraphModule) -> int:
    """Move NHWC -> NCHW permutes below the elementwise ops that read them, and remove
    the NCHW -> NHWC permutes they meet; the number of permutes removed."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.target is aten.aminmax.default and not node.kwargs and len(node.args) == 1 \
                and _is_permute(node.args[0], TO_NCHW):  # a dynamic activation's range: any layout
            node.replace_input_with(node.args[0], node.args[0].args[0])
            continue
        moved = _sink_through(graph, node)
        if moved is not None:
            node.replace_all_uses_with(moved)
            graph.erase_node(node)
    removed = 0
    for node in list(graph.nodes):
        if _is_permute(node, TO_NHWC) and _is_permute(node.args[0], TO_NCHW):
            node.replace_all_uses_with(node.args[0].args[0])
            graph.erase_node(node)
            removed += 1
    for node in reversed(list(graph.nodes)):  # permutes left unread (a move given up included)
        if node.op == "call_function" and node.target is aten.permute.default and not node.users:
            graph.erase_node(node)
    return removed
