"""Guard facts: what Dynamo's ShapeEnv knows about each symbolic size of a graph's
inputs (range, divisibility, a pinned size), put on `func.func @main`'s arguments
as `tori.dim_facts` / `tori.int_facts` ops right after import.

The facts come from the fake values of the graph's placeholders (`meta["val"]`):
a symbolic size's expression, simplified by the ShapeEnv's replacements (a size
pinned by a guard such as `Eq(s0, 16)` becomes a number), bounded by
`ShapeEnv.bound_sympy` (the symbols' `var_to_range`), and divisible by what
`ShapeEnv.divisible` records (`Mod(s0, 8)` from a guard `Eq(Mod(s0, 8), 0)`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import Mod
from torch.utils._sympy.numbers import int_oo
from torch_mlir import ir

from tori.dialects.tori import Facts, dim_facts, int_facts


@dataclass(frozen=True)
class ArgumentFacts:
    """The facts about one graph input: per dimension of a tensor (`dims`), or of a
    symbolic int (`value`)."""

    index: int
    dims: tuple[tuple[int, Facts], ...] = ()
    value: Facts | None = None


def graph_facts(graph: torch.fx.Graph) -> list[ArgumentFacts]:
    """The facts about every input of `graph` that has a symbolic size or is a SymInt."""
    found = []
    for index, node in enumerate(graph.find_nodes(op="placeholder")):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            dims = tuple((dim, size_facts(size)) for dim, size in enumerate(value.shape)
                         if isinstance(size, torch.SymInt))
            if dims:
                found.append(ArgumentFacts(index, dims=dims))
        elif isinstance(value, torch.SymInt):
            found.append(ArgumentFacts(index, value=size_facts(value)))
    return found


def size_facts(size: torch.SymInt) -> Facts:
    """Range and divisor of a symbolic size under its ShapeEnv's guards."""
    env = size.node.shape_env
    expr = env.simplify(size.node.expr)
    if expr.is_number:
        return Facts(int(expr), int(expr), 1)
    bounds = env.bound_sympy(expr)
    lower = _integer(bounds.lower, math.ceil)
    return Facts(max(0, lower or 0), _integer(bounds.upper, math.floor), _divisor(env, expr))


def _integer(bound, rounding) -> int | None:
    """A finite sympy bound as an int; None for an infinite one."""
    if bound in (sympy.oo, -sympy.oo, int_oo, -int_oo):
        return None
    return int(rounding(bound))


def _divisor(env, expr: sympy.Expr) -> int:
    """The largest divisor the ShapeEnv guarantees for `expr`: a symbol's from
    `divisible` (`Mod(s, k)` known to be 0), times a numeric coefficient."""
    if isinstance(expr, sympy.Symbol):
        divisor = 1
        for mod in env.divisible:
            if isinstance(mod, (Mod, sympy.Mod)) and mod.args[0] == expr and mod.args[1].is_Integer:
                divisor = math.lcm(divisor, int(mod.args[1]))
        return divisor
    coefficient, rest = expr.as_coeff_Mul()
    if coefficient.is_Integer and coefficient > 0 and rest != expr:
        return int(coefficient) * _divisor(env, rest)
    return 1


def insert_facts(module: ir.Module, facts: list[ArgumentFacts], func_name: str = "main") -> int:
    """Put the facts on the arguments of `func_name` as tori ops at the top of its body;
    every use of an argument then reads it through its facts. Returns the ops added."""
    func = next((op for op in module.body.operations
                 if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == func_name),
                None)
    if func is None or not facts:
        return 0
    block = func.regions[0].blocks[0]
    added = 0
    with module.context, ir.Location.unknown(), ir.InsertionPoint.at_block_begin(block):
        for argument in facts:
            if argument.index >= len(block.arguments):
                continue
            original = block.arguments[argument.index]
            value = original
            first = None
            chain = [(dim, f) for dim, f in argument.dims] if argument.value is None else [(None, argument.value)]
            for dim, fact in chain:
                value = int_facts(value, fact) if dim is None else dim_facts(value, dim, fact)
                first = first or value.owner.operation
                added += 1
            original.replace_all_uses_except(value, first)
    return added
