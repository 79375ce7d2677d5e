"""Grouped-query attention without copies of the keys and values.

transformers repeats each key/value head for the query heads that share it
(`repeat_kv`: unsqueeze, expand, then a contiguous copy viewed as [B, H*g, S, D])
before the attention's two batched matmuls. Compiled as it is, that copy is a
dispatch per layer, per call, the size of the whole cache times the group: in a
static-cache decoding step of a 4-layer Llama (8 query heads, 4 key/value heads,
512 cached positions) the two copies took 1.33 of the step's 4.76 ms of dispatches,
more than all its projections but the LM head.

Rewrites, where g query heads share each of Hkv key/value heads:

    bmm(view(expand(A, [B, Hkv*g, L, K]), [B*Hkv*g, L, K]),
        view(expand(R, [B, Hkv*g, K, N]), [B*Hkv*g, K, N]))
    with R = c times the repeat of Y [B, Hkv, K, N], reached through a transpose of
    its last two dims and multiplications by scalars c (applied to A instead: the
    scaled keys were another copy of the cache per call)

into view(bmm(view(c*A, [B*Hkv, g*L, K]), view(Y, [B*Hkv, K, N])), [B*Hkv*g, L, N]):
the g query heads of a key/value head are consecutive, so their rows stack into one
matrix that multiplies the shared keys (or values) once.

Never changes: a chain whose values have other users (a training graph keeps the
repeat for its backward), shapes that are not static, a repeat along another dim.
"""

from __future__ import annotations

import logging

import torch
import torch.fx

from tori.frontend.splice import add_node, is_call, static_shape, value_of

aten = torch.ops.aten
log = logging.getLogger("tori.frontend.shared_heads")

_LAST_TWO = [0, 1, 3, 2]


def _only_user(node, user) -> bool:
    return list(node.users) == [user]


def _repeat(node) -> tuple[torch.fx.Node, int] | None:
    """(Y, g) where `node` is view(clone(expand(unsqueeze(Y, 2), [B, H, g, S, D])), [B, H*g, S, D])."""
    if not is_call(node, aten.view.default) and not is_call(node, aten._unsafe_view.default):
        return None
    copy = node.args[0]
    expand = copy.args[0] if is_call(copy, aten.clone.default) and _only_user(copy, node) else copy
    # With one key/value head the view needs no copy: view(expand(unsqueeze(Y, 2))).
    if not is_call(expand, aten.expand.default) or not _only_user(expand, node if expand is copy else copy):
        return None
    unsqueeze = expand.args[0]
    if not is_call(unsqueeze, aten.unsqueeze.default) or unsqueeze.args[1] != 2 or not _only_user(unsqueeze, expand):
        return None
    source, expanded, result = static_shape(unsqueeze.args[0]), static_shape(expand), static_shape(node)
    if source is None or expanded is None or result is None or len(source) != 4:
        return None
    b, h, s, d = source
    g = expanded[2]
    if expanded != [b, h, g, s, d] or result != [b, h * g, s, d] or g < 2:
        return None
    return unsqueeze.args[0], g


def _swaps_last_two(node) -> bool:
    if is_call(node, aten.permute.default):
        return list(node.args[1]) == _LAST_TWO
    return is_call(node, aten.transpose.int) and sorted(d % 4 for d in node.args[1:3]) == [2, 3]


def _shared(graph: torch.fx.Graph, node, user) -> tuple[torch.fx.Node, int, float] | None:
    """(Y, g, c) where `node`, read only by `user`, is c times the head repeat of Y; a
    transpose of the last two dims on the way is applied to Y (IREE reads it in place
    in the matmul), the multiplications by scalars are gathered into c."""
    if not _only_user(node, user):
        return None
    found = _repeat(node)
    if found is not None:
        return found[0], found[1], 1.0
    if _swaps_last_two(node):
        inner = _shared(graph, node.args[0], node)
        if inner is None:
            return None
        with graph.inserting_before(node):
            return add_node(graph, aten.permute.default, (inner[0], _LAST_TWO), {}, node), inner[1], inner[2]
    if (is_call(node, aten.mul.Scalar) or is_call(node, aten.mul.Tensor)) and isinstance(node.args[1], (int, float)):
        inner = _shared(graph, node.args[0], node)
        return None if inner is None else (inner[0], inner[1], inner[2] * node.args[1])
    return None


def _batched(node, user) -> tuple[torch.fx.Node, list[int], torch.fx.Node] | None:
    """(X, shape of X, the expand) where `node`, read only by `user`, is view(expand(X, shape of X), [B*H, m, n]),
    or _unsafe_view(clone(expand(...))), `aten.matmul`'s form where X is not laid out for a view."""
    if not (is_call(node, aten.view.default) or is_call(node, aten._unsafe_view.default)) or not _only_user(node, user):
        return None
    reader, expand = node, node.args[0]
    if is_call(expand, aten.clone.default) and _only_user(expand, node):
        reader, expand = expand, expand.args[0]
    if not is_call(expand, aten.expand.default) or not _only_user(expand, reader):
        return None
    shape, result = static_shape(expand.args[0]), static_shape(node)
    if shape is None or result is None or len(shape) != 4 or static_shape(expand) != shape \
            or result != [shape[0] * shape[1], shape[2], shape[3]]:
        return None
    return expand.args[0], shape, expand


def _flat(graph: torch.fx.Graph, node, shape: list[int], like) -> torch.fx.Node:
    """`node` viewed as `shape`, through a contiguous copy where its layout needs one."""
    if not value_of(node).is_contiguous():
        node = add_node(graph, aten.clone.default, (node,), {"memory_format": torch.contiguous_format}, like)
    return add_node(graph, aten.view.default, (node, shape), {}, like)


def _flat_transposed(graph: torch.fx.Graph, node, shape: list[int], like) -> torch.fx.Node:
    """`node` viewed as `shape`: where it is a transpose of the last two dims of a
    contiguous tensor, that tensor viewed and transposed (no copy: the matmul reads it
    transposed)."""
    if is_call(node, aten.permute.default) and list(node.args[1]) == _LAST_TWO \
            and value_of(node.args[0]).is_contiguous():
        rows = add_node(graph, aten.view.default, (node.args[0], [shape[0], shape[2], shape[1]]), {}, like)
        return add_node(graph, aten.permute.default, (rows, [0, 2, 1]), {}, like)
    return _flat(graph, node, shape, like)


def _rewrite(graph: torch.fx.Graph, bmm: torch.fx.Node) -> bool:
    lhs, rhs = bmm.args[0], bmm.args[1]
    left, right = _batched(lhs, bmm), _batched(rhs, bmm)
    if left is None or right is None:
        return False
    (a, (b, heads, rows, inner), _), (r, (images, repeated_heads, _, cols), expand) = left, right
    if (images, repeated_heads) != (b, heads):  # the same batch split into images and heads on both sides
        return False
    shared = _shared(graph, r, expand)
    if shared is None:
        return False
    y, g, scale = shared
    with graph.inserting_before(bmm):
        if scale != 1.0:  # the product is linear in each operand: the scale goes to the smaller one
            a = add_node(graph, aten.mul.Scalar, (a, scale), {}, bmm)
        groups = b * heads // g
        stacked = add_node(graph, aten.bmm.default, (_flat(graph, a, [groups, g * rows, inner], bmm),
                                                     _flat_transposed(graph, y, [groups, inner, cols], bmm)), {},
                           bmm)
        result = add_node(graph, aten.view.default, (stacked, [b * heads, rows, cols]), {}, bmm)
    bmm.replace_all_uses_with(result)
    return True


def share_repeated_heads(gm: torch.fx.GraphModule) -> int:
    """Rewrite the batched matmuls that read repeated key/value heads (above); the
    number rewritten."""
    graph = gm.graph
    rewritten = sum(_rewrite(graph, node) for node in list(graph.nodes) if is_call(node, aten.bmm.default))
    if rewritten:
        for node in reversed(list(graph.nodes)):  # the replaced matmuls and the repeats behind them
            if node.op == "call_function" and not node.users and not node.is_impure():
                graph.erase_node(node)
        gm.recompile()
        log.debug("%d batched matmul(s) read shared key/value heads", rewritten)
    return rewritten
