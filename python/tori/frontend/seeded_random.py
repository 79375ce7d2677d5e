"""Random ops as pure functions of a seed input, applied to the graph the `torch` stage imports.

IREE lowers random ops through `torch_c.get_next_seed`: a module global that starts at 0
in every loaded module, so every process (and each driver's module) replays one sequence
and `torch.manual_seed` has no effect. Here each random op of an AOT graph is replaced
by a counter-based generator (Widynski's "Squares", 64-bit output) keyed by a new last
graph input, a 0-d int64 seed that the runtime draws from torch's default generator on
every call (ArgKind.SEED, runtime/seed.py). A graph without random ops is left as it is.

Draw d of a graph uses the key splitmix64(seed + (d + 1) * golden ratio) and the element's
flat index as the counter; uniform floats take the top bits (24 for float32, 53 for
float64). The same seed gives the same values: in IREE and when the rewritten graph runs
in eager PyTorch. Equality with eager's own random numbers is not a goal.
"""

from __future__ import annotations

import math
import operator
from typing import Callable

import torch
import torch.fx
import torch.utils._pytree as pytree
from tori.errors import UnsupportedOpError
from tori.frontend.splice import splice_traced
from tori.stages import Stage

aten = torch.ops.aten

SEED = "tori_seed"  # node.meta key marking the seed placeholder

_GOLDEN = 0x9E3779B97F4A7C15
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_BITS = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 that holds it."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift(amount: int) -> torch.Tensor:
    # IREE lowers shifts and `or` by a tensor, not by a scalar (bitwise_*.Tensor_Scalar, .Scalar).
    return torch.scalar_tensor(amount, dtype=torch.int64)


def _lshr(x: torch.Tensor, amount: int) -> torch.Tensor:
    """Logical shift right of int64 bits (torch's >> on int64 is arithmetic)."""
    return torch.bitwise_and(torch.bitwise_right_shift(x, _shift(amount)), (1 << (64 - amount)) - 1)


def _rotate(x: torch.Tensor) -> torch.Tensor:
    return torch.bitwise_or(torch.bitwise_left_shift(x, _shift(32)), _lshr(x, 32))


class _Draws:
    """The keys of one graph's draws, each derived from the seed input and a running count."""

    def __init__(self, seed: torch.Tensor):
        self.seed = seed
        self.count = 0

    def key(self) -> torch.Tensor:
        self.count += 1
        z = self.seed + _signed((self.count * _GOLDEN) % (1 << 64))
        z = torch.bitwise_xor(z, _lshr(z, 30)) * _signed(_MIX[0])
        z = torch.bitwise_xor(z, _lshr(z, 27)) * _signed(_MIX[1])
        return torch.bitwise_or(torch.bitwise_xor(z, _lshr(z, 31)), _shift(1))

    def bits(self, shape, device) -> torch.Tensor:
        """64 random bits (as int64) per element of `shape`: Squares with 5 rounds."""
        key = self.key()
        # prims.iota rather than arange, which tori-fold-constants would turn into a literal
        # of the counters (up to a million of them), stored in the module and unfused.
        counter = torch.ops.prims.iota(math.prod(shape), start=0, step=1, dtype=torch.int64,
                                       device=device or torch.device("cpu"), requires_grad=False).view(shape)
        x = counter * key
        y = x
        z = y + key
        x = _rotate(x * x + y)
        x = _rotate(x * x + z)
        x = _rotate(x * x + y)
        t = x * x + z
        x = _rotate(t)
        return torch.bitwise_xor(t, _lshr(x * x + y, 32))

    def uniform(self, shape, dtype: torch.dtype, device) -> torch.Tensor:
        """Uniform in [0, 1) in `dtype`: as many top bits as its significand holds, so that
        rounding never reaches 1."""
        bits = _BITS.get(dtype)
        if bits is None:
            raise NotImplementedError(f"uniform samples of {dtype}")
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        value = _lshr(self.bits(shape, device), 64 - bits).to(compute) * (2.0 ** -bits)
        return value if compute == dtype else value.to(dtype)

    def normal(self, shape, dtype: torch.dtype, device) -> torch.Tensor:
        """Standard normal by Box-Muller, computed in float32 (float64 for float64)."""
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        u1 = 1 - self.uniform(shape, compute, device)  # (0, 1]: a finite log
        u2 = self.uniform(shape, compute, device)
        value = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2 * math.pi) * u2)
        return value if compute == dtype else value.to(dtype)

    def integers(self, low, high, shape, dtype: torch.dtype, device) -> torch.Tensor:
        """Integers uniform in [low, high) (63 bits modulo the span: a bias below 2^-40 for spans under 2^23)."""
        value = torch.remainder(_lshr(self.bits(shape, device), 1), high - low) + low
        return value if dtype == torch.int64 else value.to(dtype)


def _float_dtype(dtype):
    return dtype if dtype is not None else torch.get_default_dtype()


# One rule per random op: (draws, *the op's arguments) -> its result, from draws of _Draws.
_RULES: dict[torch._ops.OpOverload, Callable] = {}


def _rule(*ops: torch._ops.OpOverload) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for op in ops:
            _RULES[op] = fn
        return fn

    return register


@_rule(aten.rand.default, aten.rand.generator)
def _rand(draws, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return draws.uniform(list(size), _float_dtype(dtype), device)


@_rule(aten.rand_like.default, aten.rand_like.generator)
def _rand_like(draws, x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    return draws.uniform(list(x.shape), dtype or x.dtype, device or x.device)


@_rule(aten.randn.default, aten.randn.generator)
def _randn(draws, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return draws.normal(list(size), _float_dtype(dtype), device)


@_rule(aten.randn_like.default, aten.randn_like.generator)
def _randn_like(draws, x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                memory_format=None):
    return draws.normal(list(x.shape), dtype or x.dtype, device or x.device)


@_rule(aten.uniform.default)
def _uniform(draws, x, low=0.0, high=1.0, *, generator=None):
    return draws.uniform(list(x.shape), x.dtype, x.device) * (high - low) + low


@_rule(aten.normal_functional.default)
def _normal(draws, x, mean=0.0, std=1.0, *, generator=None):
    return draws.normal(list(x.shape), x.dtype, x.device) * std + mean


@_rule(aten.exponential.default)
def _exponential(draws, x, lambd=1.0, *, generator=None):
    u = draws.uniform(list(x.shape), x.dtype, x.device)
    return -torch.log1p(-u) / lambd


@_rule(aten.randint.default, aten.randint.generator)
def _randint(draws, high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return draws.integers(0, high, list(size), dtype or torch.int64, device)


@_rule(aten.randint.low, aten.randint.low_generator)
def _randint_low(draws, low, high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return draws.integers(low, high, list(size), dtype or torch.int64, device)


@_rule(aten.randint_like.default)
def _randint_like(draws, x, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return draws.integers(0, high, list(x.shape), dtype or x.dtype, device or x.device)


@_rule(aten.randint_like.low_dtype)
def _randint_like_low(draws, x, low, high, *, dtype=None, layout=None, device=None, pin_memory=None,
                      memory_format=None):
    return draws.integers(low, high, list(x.shape), dtype or x.dtype, device or x.device)


@_rule(aten.randperm.default, aten.randperm.generator)
def _randperm(draws, n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    order = torch.argsort(draws.bits([n], device))
    return order.to(dtype or torch.int64)


@_rule(aten.bernoulli.default)
def _bernoulli(draws, x, *, generator=None):
    return (draws.uniform(list(x.shape), _sample_dtype(x.dtype), x.device) < x).to(x.dtype)


@_rule(aten.bernoulli.p)
def _bernoulli_p(draws, x, p=0.5, *, generator=None):
    return (draws.uniform(list(x.shape), _sample_dtype(x.dtype), x.device) < p).to(x.dtype)


@_rule(aten.bernoulli.Tensor)
def _bernoulli_tensor(draws, x, p, *, generator=None):
    return (draws.uniform(list(x.shape), _sample_dtype(p.dtype), x.device) < p).to(x.dtype)


def _sample_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@_rule(aten.native_dropout.default)
def _native_dropout(draws, x, p, train):
    # As ATen's CPU kernel: train None means training; p == 1 zeroes everything.
    if train is False:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    keep = draws.uniform(list(x.shape), _sample_dtype(x.dtype), x.device) < 1 - p
    scale = 0.0 if p == 1 else 1 / (1 - p)
    return x * keep * scale, keep


@_rule(aten.rrelu_with_noise_functional.default)
def _rrelu(draws, x, noise, lower=1 / 8, upper=1 / 3, training=False, generator=None):
    if not training:
        return torch.nn.functional.leaky_relu(x, (lower + upper) / 2), noise.clone()
    slope = draws.uniform(list(x.shape), x.dtype, x.device) * (upper - lower) + lower
    negative = x <= 0
    return torch.where(negative, x * slope, x), torch.where(negative, slope, torch.ones_like(slope)).to(noise.dtype)


# Random ops without a rule (tori's decompositions leave them only with a generator
# argument or an unusual shape): rather than IREE's global-seed lowering, which repeats
# its numbers, their graph goes to eager PyTorch.
_UNSEEDED = frozenset({aten.poisson.default, aten._standard_gamma.default, aten.multinomial.default,
                       aten.normal.Tensor_Tensor, aten.normal.Tensor_float, aten.normal.float_Tensor,
                       aten.normal.float_float, aten.cauchy.default, aten.geometric.default,
                       aten.log_normal.default, aten.randint_like.Tensor,
                       aten.alpha_dropout.default, aten.dropout.default, aten._fused_dropout.default,
                       aten.rrelu_with_noise.default})


def _is_random(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and (
        node.target in _RULES or node.target in _UNSEEDED)


def has_random_ops(graph: torch.fx.Graph) -> bool:
    return any(_is_random(node) for node in graph.nodes)


def seed_random_ops(gm: torch.fx.GraphModule, graph_name: str) -> bool:
    """Replace the random ops of `gm`'s graph by draws keyed by a new last placeholder,
    the seed (its meta has SEED); return whether there were any. Raise
    UnsupportedOpError for a random op without a rule, or one in a subgraph."""
    graph = gm.graph
    random = [node for node in graph.nodes if _is_random(node)]
    for attribute in {node.target for node in graph.find_nodes(op="get_attr")}:
        subgraph = getattr(gm, attribute, None)
        if isinstance(subgraph, torch.fx.GraphModule) and has_random_ops(subgraph.graph):
            raise UnsupportedOpError("random ops inside a subgraph (a nested compile region) take no seed in tori",
                                     stage=Stage.TORCH.value, graph=graph_name, op="higher-order op invoke_subgraph")
    if not random:
        return False
    for node in random:
        if node.target not in _RULES or node.kwargs.get("generator") is not None:
            raise UnsupportedOpError(f"tori draws no seeded samples for {node.target} "
                                     "(with an explicit generator, or without a rule in frontend/seeded_random.py)",
                                     stage=Stage.TORCH.value, graph=graph_name, op=f"{node.target}")
    fake_mode = torch._guards.detect_fake_mode([node.meta.get("val") for node in graph.nodes])
    if fake_mode is None:
        fake_mode = torch._subclasses.FakeTensorMode()
    placeholders = graph.find_nodes(op="placeholder")
    if placeholders:
        with graph.inserting_after(placeholders[-1]):
            seed = graph.placeholder(SEED)
    else:
        with graph.inserting_before(next(iter(graph.nodes))):
            seed = graph.placeholder(SEED)
    with fake_mode:
        seed.meta["val"] = torch.empty((), dtype=torch.int64)
    seed.meta[SEED] = True
    count = 0
    for node in random:
        try:
            count = _replace(graph, node, seed, count, fake_mode)
        except UnsupportedOpError:
            raise
        except Exception as error:  # the rule does not cover these arguments (a dtype, a layout)
            raise UnsupportedOpError(f"tori's seeded form of {node.target} failed: {type(error).__name__}: {error}",
                                     stage=Stage.TORCH.value, graph=graph_name, op=f"{node.target}") from error
    graph.lint()
    gm.recompile()
    return True


def _replace(graph: torch.fx.Graph, node: torch.fx.Node, seed: torch.fx.Node, count: int, fake_mode) -> int:
    """Trace `node`'s rule into ATen ops (tori's decompositions applied), splice them in
    place of `node`; return the draw count after it."""
    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    inputs = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.fx.Node)]
    rule = _RULES[node.target]
    after = [count]

    def run(seed_value, *values):
        filled = list(leaves)
        for i, value in zip(inputs, values):
            filled[i] = value
        args, kwargs = pytree.tree_unflatten(filled, spec)
        draws = _Draws(seed_value)
        draws.count = count
        result = rule(draws, *args, **kwargs)
        after[0] = draws.count
        return result

    result = splice_traced(graph, node, run, [seed, *(leaves[i] for i in inputs)], fake_mode,
                           what=f"the seeded rule of {node.target}")
    if isinstance(node.meta.get("val"), (tuple, list)):
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(result[user.args[1]])
                graph.erase_node(user)
        if node.users:
            raise UnsupportedOpError(f"{node.target}'s results are used other than by index",
                                     stage=Stage.TORCH.value, op=f"{node.target}")
    else:
        node.replace_all_uses_with(result)
    graph.erase_node(node)
    return after[0]
