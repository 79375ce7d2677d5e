"""Hypothesis strategies for fuzzed programs: shapes (size-0 and size-1 dims
included), dtypes, values (NaN, Inf, -0.0, huge and tiny), and op choice.
Shrinking makes fewer inputs, fewer nodes, smaller shapes and plainer values.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from tori.fuzz.ops import OPS
from tori.fuzz.program import InputSpec, Node, Program, namespace

DTYPES = [torch.float32, torch.int64, torch.float16, torch.bool]

# float16's largest finite value is 65504. Subnormal numbers are left out: IREE's CPU
# code flushes them to zero (docs/limitations.md); the tiny values are the smallest normal ones.
_SPECIALS = {
    torch.float32: [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 3e38, -3e38, 1.2e-38, 1e-30, 1e20],
    torch.float16: [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 65504.0, -65504.0, 6.2e-5, 1e-4, 1e4],
    torch.int64: [0, -1, 1, 2**31, -(2**31) - 1, 2**40, -(2**62)],
    torch.bool: [True, False],
}
_SCALES = {torch.float32: [1.0, 1e-3, 1e4], torch.float16: [1.0, 1e-2, 1e3]}


# Gradients need float32 inputs: most of a gradient run's inputs are.
GRADIENT_DTYPES = [torch.float32, torch.float32, torch.float32, torch.int64, torch.bool]


@st.composite
def input_specs(draw, base_shape: tuple[int, ...], dtypes=DTYPES) -> InputSpec:
    """An input whose shape broadcasts with `base_shape`: leading dims dropped, some dims 1."""
    keep = draw(st.integers(0, len(base_shape)))
    shape = tuple(1 if draw(st.integers(0, 3)) == 0 else size for size in base_shape[len(base_shape) - keep:])
    dtype = draw(st.sampled_from(dtypes))
    specials = tuple(draw(st.lists(st.sampled_from(_SPECIALS[dtype]), max_size=3)))
    scale = draw(st.sampled_from(_SCALES[dtype])) if dtype in _SCALES else 1.0
    return InputSpec(shape, dtype, draw(st.integers(0, 255)), scale, specials)


@st.composite
def programs(draw, max_inputs: int = 3, max_nodes: int = 5, dtypes=DTYPES, min_rank: int = 0) -> Program:
    """A program; `min_rank` 1 for dynamic shapes (a 0-d program has no size to change)."""
    rank = draw(st.integers(min_rank, 3))
    base_shape = tuple(draw(st.sampled_from([2, 3, 1, 5, 0, 4])) for _ in range(rank))
    inputs = [draw(input_specs(base_shape, dtypes)) for _ in range(draw(st.integers(1, max_inputs)))]
    scope = namespace()
    values: list[tuple[str, torch.Tensor]] = []
    for i, spec in enumerate(inputs):
        values.append((f"x{i}", torch.empty(spec.shape, dtype=spec.dtype, device="meta")))
    nodes: list[Node] = []
    target = draw(st.integers(1, max_nodes))
    for _ in range(4 * target):  # ops that do not fit their operands are skipped
        if len(nodes) == target:
            break
        # Later values are likelier operands: chains more than wide fans.
        operands = [values[draw(st.integers(0, len(values) - 1).map(lambda k, n=len(values): n - 1 - k))]]
        spec = draw(st.sampled_from(OPS))
        operands += [values[draw(st.integers(0, len(values) - 1))] for _ in range(spec.arity - 1)]
        template = spec.make(draw, *(t for _, t in operands))
        if template is None:
            continue
        expression = template
        for placeholder, (name, _) in zip(("{a}", "{b}", "{c}"), operands):
            expression = expression.replace(placeholder, name)
        name = f"v{len(nodes)}"
        try:
            with torch.device("meta"):  # factories in the expression make meta tensors too
                result = eval(expression, scope, {n: t for n, t in values})
        except Exception:
            continue  # shapes or dtypes that do not fit this op
        if not isinstance(result, torch.Tensor) or result.dtype not in DTYPES:
            continue
        nodes.append(Node(name, spec.name, expression))
        values.append((name, result))
    if not nodes:
        nodes.append(Node("v0", "identity", "x0.clone()"))
    return Program(tuple(inputs), tuple(nodes))


def batches(size: int = 8, mode: str = "values", **kwargs) -> st.SearchStrategy[list[Program]]:
    """Several independent programs, compiled as one function, drawn for `mode`
    (tori.fuzz.modes.Mode): float32 inputs for gradients, no 0-d programs for dynamic
    shapes."""
    if mode == "gradients":
        kwargs.setdefault("dtypes", GRADIENT_DTYPES)
    if mode == "dynamic":
        kwargs.setdefault("min_rank", 1)
    return st.lists(programs(**kwargs), min_size=1, max_size=size)
