"""Complex tensors as pairs of real ones: a rewrite of the functional ATen graph before
import, since neither Torch-MLIR's lowering nor IREE's input handles complex types.

Inside the graph, a complex tensor of shape S becomes a real tensor of shape S + [2]
holding (real, imaginary) in its last dim: `view_as_real`'s layout. The graph's
inputs and results stay complex, taken apart by `view_as_real` after the inputs and
put together by `view_as_complex` before the output, which IREE's torch input lowers:
the module's own arguments and results are `complex<f32>` buffers, exchanged by
DLPack and numpy like any other. Each op on complex values is replaced by its rule
(`_RULES`), traced to ATen ops on the real parts (make_fx) and spliced in. The rules:

- views, slices, indexing and copies: the op on the pairs whole, its dims counted
  from the front (`_WHOLE`, and permute, view, expand, unsqueeze, repeat);
- other ops linear in each complex operand and acting on positions only
  (concatenation, sums, padding, `where`, additions, factories): the op applied to the
  real parts and to the imaginary parts (`_PARTWISE`); a real operand's imaginary part
  is zero, a complex scalar splits into its parts;
- products (`mul`, `mm`, `bmm`, division): four real products;
- conjugation, magnitude, phase, `exp`/`log`/`sqrt`, comparisons, conversions;
- the FFT family (`_fft_r2c`, `_fft_c2c`, `_fft_c2r`): frontend/decomp/fourier.py.

An op on complex values without a rule is refused with its name (UnsupportedOpError).
Never changes a graph without complex values; the caller's graph is left as it was
(eager fallback runs it), the rewrite is a copy.

    view_as_complex(x: f32[4, 2]) * (1+2j)          ->  stack([x0 - 2 x1, 2 x0 + x1], -1)
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

from tori.errors import UnsupportedOpError
from tori.frontend.decomp import fourier
from tori.frontend.splice import splice_traced, value_of
from tori.stages import Stage

aten = torch.ops.aten
prims = torch.ops.prims

def real_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype.to_real() if dtype.is_complex else dtype


def as_pairs(value: torch.Tensor) -> torch.Tensor:
    """A complex tensor as its real pairs (a view where it can be)."""
    return torch.view_as_real(value.resolve_conj())


class Complex:
    """A complex tensor inside a rule: its real pair, shape S + [2]."""

    __slots__ = ("pair",)

    def __init__(self, pair: torch.Tensor):
        self.pair = pair

    @classmethod
    def of(cls, re, im) -> "Complex":
        if not isinstance(re, torch.Tensor):
            re = torch.full_like(im, re)
        elif not isinstance(im, torch.Tensor):
            im = torch.full_like(re, im)
        re, im = torch.broadcast_tensors(re, im)
        return cls(torch.stack([re, im], -1))

    @property
    def re(self) -> torch.Tensor:
        return self.pair[..., 0]

    @property
    def im(self) -> torch.Tensor:
        return self.pair[..., 1]


def _real_part(value):
    if isinstance(value, Complex):
        return value.re
    if isinstance(value, complex):
        return value.real
    return value


def _imaginary_part(value):
    """The imaginary part of a value operand: zero for real numbers and real floating
    tensors; integer and boolean tensors (indices, masks) stay."""
    if isinstance(value, Complex):
        return value.im
    if isinstance(value, complex):
        return value.imag
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return torch.zeros_like(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return type(value)(0)
    return value


def _real_dtype_kwargs(kwargs: dict) -> dict:
    return {k: real_dtype(v) if isinstance(v, torch.dtype) else v for k, v in kwargs.items()}


def _parts(value) -> tuple[Any, Any]:
    """(re, im) of an operand of a product: real tensors and scalars have im None."""
    if isinstance(value, Complex):
        return value.re, value.im
    if isinstance(value, complex):
        return value.real, value.imag
    return value, None


# ---------------------------------------------------------------------------------
# Rules: rule(op, *args, **kwargs) with complex tensors as Complex; returns Complex,
# real tensors, or lists of them.

_RULES: dict[Any, Callable] = {}


def _rule(*ops):
    def register(fn):
        for op in ops:
            _RULES[op] = fn
        return fn
    return register


def _partwise(op, *args, **kwargs):
    """op on the real parts and on the imaginary parts. Value operands (the schema's
    tensors and scalars) split into their parts; sizes, dims and `alpha` (a factor,
    not a term) go to both alike."""
    arguments = op._schema.arguments
    kinds = {a.name: str(a.type) for a in arguments}
    named = [(arguments[i].name, v) for i, v in enumerate(args)] + list(_real_dtype_kwargs(kwargs).items())

    def split(name, value, part):
        kind = kinds.get(name, "")
        if name == "alpha" or ("Tensor" not in kind and "number" not in kind):  # number: a Scalar
            return value
        return pytree.tree_map(part, value, is_leaf=lambda v: isinstance(v, Complex))

    results = []
    for part in (_real_part, _imaginary_part):
        values = [split(name, value, part) for name, value in named]
        results.append(op(*values[:len(args)], **dict(zip(kwargs, values[len(args):]))))
    re, im = results
    if isinstance(re, (list, tuple)):
        return [Complex.of(r, i) for r, i in zip(re, im)]
    return Complex.of(re, im)


_PARTWISE = [
    # views and copies
    aten.t, aten.unfold, aten.diagonal, aten.diag_embed, aten.tril, aten.triu, aten.gather, aten.take_along_dim,
    prims.broadcast_in_dim, prims.collapse_view, prims.split_dim,
    # writes of one tensor into another, selections between values
    aten.cat, aten.stack, aten.where, aten.slice_scatter, aten.select_scatter, aten.index_put, aten.masked_fill,
    aten.constant_pad_nd, aten.copy, aten.index_copy, aten.index_add, aten.scatter, aten.scatter_add,
    aten.masked_scatter, aten.diagonal_scatter,
    # factories and fills (the fill value splits)
    aten.full, aten.full_like, aten.zeros, aten.zeros_like, aten.ones_like, aten.empty, aten.empty_like,
    aten.empty_strided, aten.new_zeros, aten.new_empty, aten.new_full, aten.fill, aten.scalar_tensor,
    prims.full,
    # linear arithmetic
    aten.add, aten.sub, aten.neg, aten.sum, aten.mean, aten.cumsum, aten.trace, aten.rsub,
]
for _op in _PARTWISE:
    _RULES[_op] = _partwise


# Ops on the pairs whole, one op instead of one per part: their dims count from the
# front (a negative dim would count the pair dim). Per-part copies of an index
# computation made IREE's CPU codegen fail (its i64 splat builtin), and of a flip too.
_DIM_ARGUMENTS = frozenset({"dim", "dims", "dim0", "dim1", "dimensions", "source", "destination"})


def _from_front(dims, rank: int):
    if isinstance(dims, int):
        return dims if dims >= 0 else dims + rank
    return [d if d >= 0 else d + rank for d in dims]


def _whole(op, z, *args, **kwargs):
    rank = z.pair.dim() - 1
    names = [a.name for a in op._schema.arguments[1:]]
    args = [_from_front(v, rank) if name in _DIM_ARGUMENTS and v is not None else v for name, v in zip(names, args)]
    kwargs = {k: _from_front(v, rank) if k in _DIM_ARGUMENTS and v is not None else v
              for k, v in _real_dtype_kwargs(kwargs).items()}
    result = op(z.pair, *args, **kwargs)
    return [Complex(r) for r in result] if isinstance(result, (list, tuple)) else Complex(result)


_WHOLE = [aten.index, aten._unsafe_index, aten.index_select, aten.flip, aten.select, aten.slice, aten.narrow,
          aten.transpose, aten.squeeze, prims.squeeze, aten.split, aten.split_with_sizes, aten.chunk, aten.unbind,
          aten.clone, aten.alias, aten.contiguous, aten.detach, aten.lift_fresh_copy, aten.movedim,
          aten.select_copy, aten.slice_copy, aten.transpose_copy, aten.squeeze_copy]
for _op in _WHOLE:
    _RULES[_op] = _whole


@_rule(aten.roll)
def _roll(op, z, shifts, dims=()):
    # Without dims, roll runs over the flattened tensor: part by part then.
    return _whole(op, z, shifts, dims) if len(dims) else _partwise(op, z, shifts, dims)


@_rule(aten.permute, aten.permute_copy)
def _permute(op, z, dims):
    rank = z.pair.dim() - 1
    return Complex(op(z.pair, [*_from_front(dims, rank), rank]))


@_rule(aten.view, aten._unsafe_view, aten.reshape, aten.expand, aten.view_copy, aten.expand_copy)
def _resized(op, z, size, **kwargs):
    return Complex(op(z.pair, [*size, 2], **kwargs))


@_rule(aten.unsqueeze, aten.unsqueeze_copy)
def _unsqueeze(op, z, dim):
    return Complex(op(z.pair, _from_front(dim, z.pair.dim())))


@_rule(aten.repeat)
def _repeat(op, z, repeats):
    return Complex(op(z.pair, [*repeats, 1]))


@_rule(aten.ones, aten.new_ones)
def _ones(op, *args, **kwargs):
    one = op(*args, **_real_dtype_kwargs(kwargs))
    return Complex.of(one, torch.zeros_like(one))


def _product(op, a, b, **kwargs):
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    if ai is None:
        return Complex.of(op(ar, br, **kwargs), op(ar, bi, **kwargs))
    if bi is None:
        return Complex.of(op(ar, br, **kwargs), op(ai, br, **kwargs))
    return Complex.of(op(ar, br, **kwargs) - op(ai, bi, **kwargs), op(ar, bi, **kwargs) + op(ai, br, **kwargs))


_rule(aten.mul, aten.mm, aten.bmm, aten.matmul, aten.mv, aten.dot, aten.outer, aten.kron)(_product)


@_rule(aten.addmm, aten.baddbmm)
def _add_product(op, bias, a, b, *, beta=1, alpha=1):
    product = _product(aten.bmm if op is aten.baddbmm.default else aten.mm, a, b)
    scaled = _product(aten.mul, product, alpha)
    return _partwise(aten.add, scaled, _product(aten.mul, bias, beta) if bias is not None else 0.0)


@_rule(aten.div)
def _divide(op, a, b, *, rounding_mode=None):
    if rounding_mode is not None:
        raise NotImplementedError("complex division with a rounding mode")
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    if bi is None:
        return Complex.of(ar / br, (ai if ai is not None else torch.zeros_like(ar)) / br)
    denominator = br * br + bi * bi
    if ai is None:
        return Complex.of(ar * br / denominator, -ar * bi / denominator)
    return Complex.of((ar * br + ai * bi) / denominator, (ai * br - ar * bi) / denominator)


@_rule(aten.reciprocal)
def _reciprocal(op, z):
    return _divide(aten.div, 1.0, z)


@_rule(aten._conj, aten.conj, aten.conj_physical, aten._conj_physical, aten._conj_copy)
def _conjugate(op, z):
    return Complex.of(z.re, -z.im)


@_rule(aten.resolve_conj, aten.resolve_neg, aten._neg_view)
def _resolved(op, z):
    # Graphs hold values, not the conjugation bit: resolving changes nothing (_neg_view negates).
    return Complex.of(-z.re, -z.im) if op is aten._neg_view.default else z


@_rule(aten.view_as_complex)
def _view_as_complex(op, x):
    # A constant read by both parts goes through one alias at import (importer._single_use_constants).
    return Complex(x)


@_rule(aten.view_as_real, aten.view_as_real_copy)
def _view_as_real(op, z):
    return z.pair


@_rule(aten.real)
def _real(op, z):
    return z.re


@_rule(aten.imag)
def _imag(op, z):
    return z.im


@_rule(aten.complex)
def _complex(op, re, im):
    return Complex.of(re, im)


@_rule(aten.polar)
def _polar(op, magnitude, angle):
    return Complex.of(magnitude * torch.cos(angle), magnitude * torch.sin(angle))


def _magnitude(z: Complex) -> torch.Tensor:
    """|z| without overflow or underflow in the squares (IREE lowers no float64 hypot)."""
    a, b = torch.abs(z.re), torch.abs(z.im)
    big, small = torch.maximum(a, b), torch.minimum(a, b)
    ratio = small / torch.where(big == 0, 1.0, big)
    return torch.where(torch.isinf(big), big, big * torch.sqrt(1 + ratio * ratio))


@_rule(aten.abs)
def _abs(op, z):
    return _magnitude(z)


@_rule(aten.angle)
def _angle(op, z):
    return torch.atan2(z.im, z.re)


@_rule(aten.sgn)
def _sgn(op, z):
    magnitude = _magnitude(z)
    safe = torch.where(magnitude == 0, 1.0, magnitude)
    return Complex.of(torch.where(magnitude == 0, 0.0, z.re / safe), torch.where(magnitude == 0, 0.0, z.im / safe))


@_rule(aten.exp)
def _exp(op, z):
    scale = torch.exp(z.re)
    return Complex.of(scale * torch.cos(z.im), scale * torch.sin(z.im))


@_rule(aten.log)
def _log(op, z):
    return Complex.of(torch.log(_magnitude(z)), torch.atan2(z.im, z.re))


@_rule(aten.sqrt)
def _sqrt(op, z):
    # The principal root: re = sqrt((|z| + x) / 2), im = sign(y) sqrt((|z| - x) / 2).
    magnitude = _magnitude(z)
    re = torch.sqrt(torch.clamp((magnitude + z.re) / 2, min=0))
    im = torch.sqrt(torch.clamp((magnitude - z.re) / 2, min=0))
    return Complex.of(re, torch.where(torch.signbit(z.im), -im, im))


@_rule(aten.sin, aten.cos, aten.sinh, aten.cosh)
def _trigonometric(op, z):
    x, y = z.re, z.im
    name = op.overloadpacket
    if name is aten.sin:  # sin(x + iy) = sin x cosh y + i cos x sinh y
        return Complex.of(torch.sin(x) * torch.cosh(y), torch.cos(x) * torch.sinh(y))
    if name is aten.cos:
        return Complex.of(torch.cos(x) * torch.cosh(y), -torch.sin(x) * torch.sinh(y))
    if name is aten.sinh:
        return Complex.of(torch.sinh(x) * torch.cos(y), torch.cosh(x) * torch.sin(y))
    return Complex.of(torch.cosh(x) * torch.cos(y), torch.sinh(x) * torch.sin(y))


@_rule(aten.pow)
def _pow(op, base, exponent):
    if isinstance(exponent, int) and 0 <= exponent <= 8 and not isinstance(base, (int, float, complex)):
        result = Complex.of(torch.ones_like(_parts(base)[0]), torch.zeros_like(_parts(base)[0]))
        for _ in range(exponent):
            result = _product(aten.mul, result, base)
        return result
    if not isinstance(base, Complex):
        raise NotImplementedError("a complex exponent")
    return _exp(aten.exp, _product(aten.mul, _log(aten.log, base), exponent))


@_rule(aten.eq, aten.ne)
def _equal(op, a, b):
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    if ai is None:
        (ar, ai), (br, bi) = (br, bi), (ar, ai)  # the complex operand first
    same = torch.eq(ar, br) & torch.eq(ai, bi if bi is not None else 0.0)
    return same if op.overloadpacket is aten.eq else ~same


@_rule(aten.isnan)
def _isnan(op, z):
    return torch.isnan(z.re) | torch.isnan(z.im)


@_rule(aten.isinf)
def _isinf(op, z):
    return torch.isinf(z.re) | torch.isinf(z.im)


@_rule(aten.isfinite)
def _isfinite(op, z):
    return torch.isfinite(z.re) & torch.isfinite(z.im)


def _convert(x, dtype: torch.dtype):
    if not dtype.is_complex:
        return (x.re if isinstance(x, Complex) else x).to(dtype)
    if isinstance(x, Complex):
        return Complex(x.pair.to(real_dtype(dtype)))
    x = x.to(real_dtype(dtype))
    return Complex.of(x, torch.zeros_like(x))


@_rule(prims.convert_element_type)
def _convert_element_type(op, x, dtype):
    return _convert(x, dtype)


@_rule(aten._to_copy)
def _to_copy(op, x, *, dtype=None, **kwargs):
    if dtype is None:
        return Complex(x.pair.clone())
    return _convert(x, dtype)


@_rule(aten._fft_c2c)
def _fft_c2c(op, z, dim, normalization, forward):
    return Complex.of(*fourier.c2c((z.re, z.im), list(dim), normalization, forward))


@_rule(aten._fft_r2c)
def _fft_r2c(op, x, dim, normalization, onesided):
    return Complex(fourier.r2c(x, list(dim), normalization, onesided))


@_rule(aten._fft_c2r)
def _fft_c2r(op, z, dim, normalization, last_dim_size):
    return fourier.c2r((z.re, z.im), list(dim), normalization, last_dim_size)


# Ops on complex values refused on purpose, with what to do instead.
_REFUSED = {
    aten.linalg_eig: "eigenvalues of a general (non-symmetric) matrix have no formulation in tori: their "
                     "order and the phases of the eigenvectors are LAPACK's choices, which a QR iteration "
                     "traced in torch ops does not reproduce. For a symmetric matrix use torch.linalg.eigh; "
                     "otherwise let the op run eagerly (the default fallback)",
}


# ---------------------------------------------------------------------------------
# The rewrite.

def _complex_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_complex()


def _involves_complex(node: torch.fx.Node, pairs: dict) -> bool:
    value = value_of(node)
    values = value if isinstance(value, (list, tuple)) else (value,)
    if any(_complex_tensor(v) for v in values):
        return True
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    return any(isinstance(leaf, torch.fx.Node) and leaf in pairs for leaf in leaves) or \
        any(isinstance(leaf, torch.dtype) and leaf.is_complex for leaf in leaves)


def has_complex(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        value = value_of(node)
        if any(_complex_tensor(v) for v in (value if isinstance(value, (list, tuple)) else (value,))):
            return True
    return False


def rewrite_complex(gm: torch.fx.GraphModule, graph_name: str = "") -> torch.fx.GraphModule:
    """`gm` with its complex values as real pairs (a new GraphModule), or `gm` itself
    when it has none. Raise UnsupportedOpError for an op on complex values without a
    rule, or one its rule does not cover (its arguments)."""
    if not has_complex(gm):
        return gm
    from torch._guards import detect_fake_mode

    new = torch.fx.GraphModule(gm, _copied(gm.graph))
    graph = new.graph
    fake_mode = detect_fake_mode([value_of(n) for n in graph.nodes]) or torch._subclasses.FakeTensorMode()
    pairs: dict[torch.fx.Node, Any] = {}  # complex node -> its pair node (or list of them)
    replaced: list[torch.fx.Node] = []
    original = list(graph.nodes)
    for node in graph.find_nodes(op="placeholder"):
        if _complex_tensor(value_of(node)):
            with graph.inserting_after(node):  # placeholders may come after other nodes (partition's parts)
                pairs[node] = graph.call_function(aten.view_as_real.default, (node,))
            with fake_mode:
                pairs[node].meta["val"] = as_pairs(value_of(node))
    for node in original:
        if node.op == "placeholder":
            continue
        elif node.op == "get_attr" and _complex_tensor(getattr(new, node.target, None)):
            # A constant becomes its pairs (IREE's torch input takes no complex literal).
            setattr(new, node.target, as_pairs(getattr(new, node.target)).clone())
            with fake_mode:
                node.meta["val"] = as_pairs(value_of(node))
            node.meta.pop("tensor_meta", None)  # the importer reads it before `val`
            with graph.inserting_after(node):  # read once (see _view_as_complex)
                pairs[node] = graph.call_function(aten.alias.default, (node,))
            pairs[node].meta["val"] = node.meta["val"]
        elif node.op == "call_function" and _involves_complex(node, pairs):
            if node.target is operator.getitem and node.args[0] in pairs:
                pairs[node] = pairs[node.args[0]][node.args[1]]
                replaced.append(node)
                continue
            _splice(graph, node, pairs, fake_mode, graph_name)
            replaced.append(node)
        elif node.op == "output":
            node.args = (pytree.tree_map(lambda o: _as_complex(graph, o, pairs, fake_mode) if o in pairs else o,
                                         node.args[0], is_leaf=lambda o: isinstance(o, torch.fx.Node)),)
        elif node.op not in ("get_attr", "call_function", "output") and _involves_complex(node, pairs):
            raise UnsupportedOpError(f"complex values in a {node.op} node", stage=Stage.TORCH.value,
                                     graph=graph_name, op=str(node.target))
    for node in reversed(replaced):
        graph.erase_node(node)
    graph.lint()
    new.recompile()
    return new


def _copied(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of `graph` (each node's meta a copy too: the rewrite retypes nodes)."""
    copied = torch.fx.Graph()
    copied.output(copied.graph_copy(graph, {}))
    return copied


def _as_complex(graph: torch.fx.Graph, node: torch.fx.Node, pairs: dict, fake_mode) -> torch.fx.Node:
    """A complex result: its pair viewed as complex, before the output."""
    with graph.inserting_before(graph.output_node()):
        result = graph.call_function(aten.view_as_complex.default, (pairs[node],))
    value = value_of(node)
    with fake_mode:
        result.meta["val"] = torch.empty(value.shape, dtype=value.dtype, device=value.device)
    return result


def _op_name(node: torch.fx.Node) -> str:
    return f"aten {getattr(node.target, '__name__', node.target)}"


def _splice(graph: torch.fx.Graph, node: torch.fx.Node, pairs: dict, fake_mode, graph_name: str) -> None:
    """Replace `node` by its rule traced to ATen ops on real parts."""
    op = node.target
    packet = getattr(op, "overloadpacket", None)
    if packet in _REFUSED:
        raise UnsupportedOpError(f"{_op_name(node)}: {_REFUSED[packet]}", stage=Stage.TORCH.value,
                                 graph=graph_name, op=_op_name(node))
    rule = _RULES.get(op) or (_RULES.get(packet) if packet is not None else None)
    if rule is None:
        raise UnsupportedOpError(f"{_op_name(node)} on complex values has no rule in tori "
                                 "(frontend/complex_values.py)", stage=Stage.TORCH.value, graph=graph_name,
                                 op=_op_name(node))
    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    inputs = []  # (leaf index, graph node, whether complex)
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.fx.Node):
            mapped = pairs.get(leaf, leaf)
            if isinstance(mapped, list):
                raise UnsupportedOpError(f"{_op_name(node)} takes a list of complex values whole",
                                         stage=Stage.TORCH.value, graph=graph_name, op=_op_name(node))
            inputs.append((i, mapped, leaf in pairs))

    def run(*values):
        filled = list(leaves)
        for (i, _, is_complex), value in zip(inputs, values):
            filled[i] = Complex(value) if is_complex else value
        args, kwargs = pytree.tree_unflatten(filled, spec)
        result = rule(op, *args, **kwargs)
        return pytree.tree_map(lambda v: v.pair if isinstance(v, Complex) else v, result,
                               is_leaf=lambda v: isinstance(v, Complex))

    expected = value_of(node)
    try:
        result = splice_traced(graph, node, run, [source for _, source, _ in inputs], fake_mode,
                               what=f"tori's rule for {_op_name(node)} on complex values")
    except UnsupportedOpError:
        raise
    except Exception as error:
        raise UnsupportedOpError(f"tori's rule for {_op_name(node)} on complex values does not cover these "
                                 f"arguments: {type(error).__name__}: {error}", stage=Stage.TORCH.value,
                                 graph=graph_name, op=_op_name(node)) from error
    _check_shape(node, expected, result, graph_name)
    if isinstance(expected, (list, tuple)):
        if any(_complex_tensor(v) for v in expected):
            pairs[node] = list(result)
        else:
            for user in list(node.users):
                user.replace_all_uses_with(result[user.args[1]])
        return
    if _complex_tensor(expected):
        pairs[node] = result
        return
    node.replace_all_uses_with(result)


def _check_shape(node: torch.fx.Node, expected, result, graph_name: str) -> None:
    """The spliced values must have the shapes of the node's (plus the pair dim)."""
    expected_values = expected if isinstance(expected, (list, tuple)) else [expected]
    results = result if isinstance(result, (list, tuple)) else [result]
    for want, got in zip(expected_values, results):
        if not isinstance(want, torch.Tensor):
            continue
        got_value = value_of(got)
        shape = (*want.shape, 2) if want.is_complex() else tuple(want.shape)
        if not isinstance(got_value, torch.Tensor) or tuple(got_value.shape) != shape or \
                got_value.dtype != real_dtype(want.dtype):
            raise UnsupportedOpError(
                f"tori's rule for {_op_name(node)} on complex values gave "
                f"{getattr(got_value, 'dtype', None)}{list(getattr(got_value, 'shape', []))}, "
                f"expected {real_dtype(want.dtype)}{list(shape)}", stage=Stage.TORCH.value, graph=graph_name,
                op=_op_name(node))

